"""The snapshot table of the panel: one row per tensor summary, with its histogram.

Plain HTML with an inline SVG bar chart per row, so it renders the same in JupyterLab,
Notebook 7 and VSCode without a JavaScript widget of its own.
"""

from __future__ import annotations

import html
import math
from collections.abc import Iterable, Mapping
from typing import Any

MAX_ROWS = 50


def _num(value: Any) -> str:
    if value is None:
        return "-"
    value = float(value)
    if math.isnan(value):
        return "nan"
    return f"{value:.4g}"


def histogram_svg(hist: Any, width: int = 120, height: int = 28) -> str:
    """A small bar chart of a ``Histogram`` (edges/counts), or an empty cell."""
    if hist is None or not getattr(hist, "buckets", None):
        return ""
    counts = [b[2] for b in hist.buckets]
    top = max(counts) or 1
    bar = width / len(counts)
    step = max(bar - 0.5, 0.5)
    rects = "".join(
        f"<rect x='{i * bar:.1f}' y='{height - height * c / top:.1f}' width='{step:.1f}' "
        f"height='{height * c / top:.1f}' fill='#1f77b4'/>"
        for i, c in enumerate(counts)
    )
    return f"<svg width='{width}' height='{height}' style='vertical-align:middle'>{rects}</svg>"


def snapshots_html(entries: Iterable[Mapping[str, Any]]) -> str:
    """The table for ``run.snapshots`` / ``mon.snapshots`` entries (newest last)."""
    rows = list(entries)[-MAX_ROWS:]
    if not rows:
        return ""
    head = (
        "<tr><th>step</th><th>tensor</th><th>reason</th><th>shape</th><th>dtype</th>"
        "<th>min</th><th>max</th><th>mean</th><th>std</th><th>NaN/Inf</th><th>histogram</th></tr>"
    )
    body = []
    for entry in rows:
        stats = entry.get("stats", {})
        nan = int(stats.get("nan_count", 0) or 0)
        inf = int(stats.get("inf_count", 0) or 0)
        style = " style='color:#b71c1c'" if nan + inf else ""
        name = html.escape(str(entry.get("name")))
        label = html.escape(str(entry.get("label", entry.get("name"))))
        cells = [
            str(entry.get("step")),
            f"<code>{label}</code>",
            html.escape(str(entry.get("reason", ""))),
            str(tuple(entry.get("shape", ()))),
            html.escape(str(entry.get("dtype", ""))),
            *(_num(stats.get(k)) for k in ("min", "max", "mean", "std")),
            f"{nan}/{inf}",
            histogram_svg(entry.get("histogram")),
        ]
        body.append(
            f"<tr data-snapshot='{name}'{style}>"
            + "".join(f"<td>{c}</td>" for c in cells)
            + "</tr>"
        )
    return (
        "<details open><summary><b>snapshots</b> "
        f"({len(rows)} shown)</summary><table style='font-size:85%;border-collapse:collapse'>"
        f"{head}{''.join(body)}</table></details>"
    )
