"""The panel's picture in a notebook reopened without its widget state.

JupyterLab and Notebook 7 render a display's richest type, the widget view, even when
the widget's state was not saved with the notebook (their default: "Save Widget State
Automatically" is off); the widget renderer then writes "Error displaying widget: model
not found" where the panel was, although the final picture is in the same output
(jupyterlab-manager's ``WidgetRenderer.renderModel`` has no fallback to the bundle's
other types).

So a second output sits right below the panel: empty and hidden while the cell runs, it
holds the final picture from the end of the cell, with a style that shows it only when
the output above it is a widget the front end could not find (the renderer node
classed ``.jupyter-widgets``, which it is only on that error) and then hides that
error. A live or state-restored panel, nbconvert and GitHub (which drops the style and
keeps the ``hidden`` attribute) show only the panel's own output; so does VS Code,
whose outputs are not laid out by these classes (and where it is not emitted at all).
Untrusted notebooks have their styles sanitized away and show the error as before.
"""

from __future__ import annotations

import base64
import html
import re
from typing import Any

_SAFE = re.compile(r"[^A-Za-z0-9_-]")


def _key(model_id: str) -> str:
    return "msmon-reopen-" + _SAFE.sub("", model_id)


def placeholder(model_id: str) -> dict[str, Any]:
    """The empty output displayed right after the panel (its final content comes with
    ``final``, through the display's id). It hides its own output area in JupyterLab."""
    key = _key(model_id)
    return {
        "text/plain": "",
        "text/html": (
            f'<div class="msmon-reopen {key}" hidden></div>'
            f"<style>.jp-OutputArea-child:has(.{key}) {{ display: none; }}</style>"
        ),
    }


def final(model_id: str, png: bytes | None, title: str, run_dir: str) -> dict[str, Any]:
    """The placeholder's content once the cell ended: the final picture and a line saying
    why it shows, visible only in place of a "model not found" panel."""
    key = _key(model_id)
    where = f" (the run: <code>msmon view {html.escape(run_dir)}</code>)" if run_dir else ""
    picture = (
        f'<img alt="msmon panel: {html.escape(title)}" '
        f'src="data:image/png;base64,{base64.b64encode(png).decode("ascii")}">'
        if png is not None
        else ""
    )
    # the renderer node itself gets .jupyter-widgets only when it gives up (a live view
    # is a child of it); :has() cannot nest, so that class is the whole test
    failed = ".jp-OutputArea-child:has(> .jp-OutputArea-output.jupyter-widgets)"
    style = (
        f".jp-OutputArea-child:has(.{key}) {{ display: none; }}"
        f"{failed} + .jp-OutputArea-child:has(.{key}) {{ display: flex; }}"
        f"{failed} + .jp-OutputArea-child .{key} {{ display: block; }}"
        f"{failed}:has(+ .jp-OutputArea-child .{key}) {{ display: none; }}"
        f".{key} p {{ margin: 0 0 4px; color: #656d76; }}"
        f".{key} img {{ max-width: 100%; }}"
    )
    return {
        "text/plain": "",
        "text/html": (
            f'<div class="msmon-reopen {key}" hidden><p>msmon: the live panel\'s widget state '
            f"was not saved with this notebook; this is its final picture{where}.</p>"
            f"{picture}</div><style>{style}</style>"
        ),
    }
