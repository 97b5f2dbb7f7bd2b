"""Which charts a run's series make, in which order: the one chart plan of every page.

The core charts (loss, grad_norm, learning_rate, throughput, step time), then the rest
grouped by prefix: the other ``train/`` tags, ``val/``, ``param/`` (one chart per kind),
``sys/``, then user prefixes, alphabetical inside a group. Counters (``train/global_step``)
and snapshot stats are not charted. Pure (no matplotlib, no numpy): the notebook panel,
its matplotlib pictures and ``msmon view`` (``/api/charts``) all plan with it, so the
same run shows the same charts with the same titles in the same order everywhere.

``CHART_ASSETS`` is where the chart component both pages draw with lives (uPlot and
``chart.js``, package data beside this package).
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

CHART_ASSETS = Path(__file__).resolve().parents[1] / "static"
CORE_CHARTS = (
    # "loss": what MindSpore's SummaryCollector and SummaryRecord users write
    ("loss", ("train/loss", "loss")),
    # before clipping, what the optimizer got after it, and the largest micro-batch
    ("grad_norm", ("train/grad_norm", "train/grad_norm_clipped", "train/micro_grad_norm")),
    ("learning_rate", ("train/learning_rate",)),
    ("throughput (samples/s)", ("train/throughput",)),
    # the whole step, and its two parts where the monitor can tell them apart
    ("step time (s)", ("train/step_time", "train/data_time", "train/compute_time")),
)
PLACEHOLDERS = 4  # core charts a live panel shows before their data arrives
LOG_BY_DEFAULT = frozenset({"train/grad_norm", "train/loss_scale"})
MAX_RANK_LINES = 8  # beyond that, a distributed run is drawn as its band only
# counters: shown as numbers elsewhere, a diagonal line as a chart
_NOT_CHARTED = frozenset({"train/global_step", "train/epoch"})
# prefixes in chart order after the core charts; any other prefix follows, alphabetical
_GROUP_ORDER = ("train", "val", "param", "sys")
MAX_LINES = 6
# tags drawn alone under their own title (another unit than their group's)
_OWN_CHART = {
    "train/linearity": "throughput linearity (throughput / baseline)",
    "train/loss_scale": "loss scale",
    "train/overflow": "loss-scale overflow (1: update skipped)",
}


@dataclass
class Chart:
    """One axes: a title, the tags (or series keys) drawn in it, its prefix group."""

    title: str
    tags: tuple[str, ...]
    group: str = "train"

    @property
    def log(self) -> bool:
        """Drawn on a log y axis unless the user picks linear (grad_norm, loss scale)."""
        return any(base_tag(k) in LOG_BY_DEFAULT for k in self.tags)

    def as_json(self) -> dict[str, Any]:
        return {"title": self.title, "tags": list(self.tags), "log": self.log, "group": self.group}


def base_tag(key: str) -> str:
    """The tag of a series key: ``train/loss@rank1`` and ``train/loss@max`` -> ``train/loss``."""
    return key.split("@", 1)[0]


def _group_of(tag: str) -> str:
    if tag.startswith("param/"):
        return "param"
    return tag.split("/", 1)[0] if "/" in tag else ""


def _group_rank(group: str) -> tuple[int, str]:
    if group in _GROUP_ORDER:
        return _GROUP_ORDER.index(group), ""
    return len(_GROUP_ORDER) + (group == ""), group


def plan_charts(tags: list[str], placeholders: bool = True) -> list[Chart]:
    """The core charts, then one chart per tag group (see the module docstring).

    Keys may carry a suffix (``train/loss@rank1``, ``@min``, ``@max``): a distributed
    run's ranks and band are drawn together in the chart of their tag. ``placeholders``:
    the first ``PLACEHOLDERS`` core charts stand before their data arrives (a live panel);
    without it (the viewer, a finished run) a chart is planned only for tags present.
    """
    by_base: dict[str, list[str]] = {}
    for key in sorted(tags):
        by_base.setdefault(base_tag(key), []).append(key)
    charts = []
    for i, (title, core_tags) in enumerate(CORE_CHARTS):
        keys = [k for t in core_tags for k in by_base.get(t, [])]
        if not keys and placeholders and i < PLACEHOLDERS:
            keys = [core_tags[0]]
        if keys:
            charts.append(Chart(title, tuple(keys)))
    core = {t for _, ts in CORE_CHARTS for t in ts}
    groups: dict[str, list[str]] = {}
    for tag in sorted(by_base, key=lambda t: (_group_rank(_group_of(t)), t)):
        if tag in core or tag in _NOT_CHARTED or tag.startswith("snap/"):
            continue
        if tag in _OWN_CHART:
            key = _OWN_CHART[tag]
        elif tag.startswith("param/"):
            # param grad_norm / weight_norm / moment1_norm...: one chart per kind
            key = "param " + tag.rsplit("/", 1)[-1]
        else:
            key = tag.split("/", 1)[0] + "/" if "/" in tag else tag
        groups.setdefault(key, []).append(tag)
    for key, members in groups.items():
        keys = [k for tag in members for k in by_base[tag]]
        title = key
        if len(members) > MAX_LINES:
            # per-parameter groups (param_stats, optimizer_state) can hold hundreds of
            # tags: one chart per kind, its first lines, and the title says so; every
            # series is still recorded (viewer, load_run)
            shown = {base_tag(k) for k in keys[:MAX_LINES]}
            title = f"{title} (first {len(shown)} of {len(members)})"
        charts.append(Chart(title, tuple(keys[:MAX_LINES]), _group_of(members[0])))
    return charts
