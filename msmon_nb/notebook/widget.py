"""The panel's widget: an anywidget whose ES module (``static/panel.js``) draws the charts.

The module ships inside this package with uPlot (MIT, ``msmon_nb/static/uPlot.LICENSE``,
version ``UPLOT_VERSION``, taken unchanged from the npm package's ``dist/``) and the chart
component ``msmon_nb/static/chart.js`` (the one ``msmon view`` draws with) prepended to it, so
the panel works offline and needs no JupyterLab extension build: anywidget loads it in
JupyterLab 4, Notebook 7 and VSCode alike. Data travels as custom comm messages with
binary buffers (see ``panel.js`` for the protocol); this class only moves them.
"""

from __future__ import annotations

import base64
import contextvars
import logging
import queue
import threading
from collections.abc import Callable
from pathlib import Path
from typing import Any

import anywidget
import traitlets

from msmon_nb.metrics.charts import CHART_ASSETS

log = logging.getLogger(__name__)

STATIC = Path(__file__).resolve().parent / "static"
UPLOT_VERSION = "1.6.32"
WIDGET_MIME = "application/vnd.jupyter.widget-view+json"


def _joined(*paths: Path) -> str:
    # multi-line text, so anywidget takes it as code, not as a file path to watch
    return "\n".join(path.read_text() for path in paths)


class PanelWidget(anywidget.AnyWidget):
    """Front end of one panel. ``handler(content)`` receives the page's messages."""

    # uPlot's IIFE build defines a module-scoped ``var uPlot``, chart.js and heatmap.js
    # their top-level classes and functions: one module, no import map, no CDN
    _esm = _joined(
        CHART_ASSETS / "uPlot.iife.min.js",
        CHART_ASSETS / "chart.js",
        CHART_ASSETS / "heatmap.js",
        STATIC / "panel.js",
    )
    _css = _joined(CHART_ASSETS / "uPlot.min.css", CHART_ASSETS / "chart.css", STATIC / "panel.css")
    title = traitlets.Unicode("").tag(sync=True)
    run_dir = traitlets.Unicode("").tag(sync=True)
    live = traitlets.Bool(True).tag(sync=True)
    # the controls the page builds, as ``monitor.controls.command_list()`` gives them
    # (name, label, argument, when): the page holds no copy of the command table
    commands = traitlets.List().tag(sync=True)
    # a whole "reset" message and its packed points (binary state, not JSON), drawn by a
    # view as soon as it renders: see Panel.keep_state
    initial = traitlets.Dict().tag(sync=True)
    initial_data = traitlets.Bytes(b"").tag(sync=True)

    def __init__(self, handler: Callable[[dict[str, Any]], None], **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self.static_png: bytes | None = None
        self._handler = handler
        self.on_msg(self._on_page_msg)

    def _on_page_msg(self, _widget: Any, content: Any, _buffers: Any) -> None:
        if isinstance(content, dict):
            self._handler(content)

    def bundle(self) -> dict[str, Any]:
        """The display bundle: the live view, and the last static picture when there is
        one (saved notebooks, nbconvert and GitHub show that)."""
        data: dict[str, Any] = {
            "text/plain": f"msmon panel: {self.title}",
            WIDGET_MIME: {"version_major": 2, "version_minor": 1, "model_id": self.model_id},
        }
        if self.static_png is not None:
            data["image/png"] = base64.b64encode(self.static_png).decode("ascii")
        return data

    def _repr_mimebundle_(self, **_kwargs: Any) -> dict[str, Any]:
        return self.bundle()


class Outbox:
    """Sends a widget's messages from a thread of its own, in order.

    Sending a comm message costs the kernel ~0.2 ms of JSON and ZMQ work, and more while
    MindSpore's threads compete for the GIL (each ZMQ call gives it up and must win it
    back): measured at ~0.6 ms per message on the training thread. Here the training
    thread only queues the message; this thread sends it. It runs in a copy of the
    starting thread's context, so the messages keep the running cell as their parent.
    """

    def __init__(self, widget: Any) -> None:
        self.widget = widget
        self._queue: queue.SimpleQueue[tuple[dict[str, Any], list[bytes] | None] | None]
        self._queue = queue.SimpleQueue()
        self._thread: threading.Thread | None = None

    def put(self, msg: dict[str, Any], buffers: list[bytes] | None) -> None:
        """Queue one message (starts the sending thread on first use)."""
        if self._thread is None:
            context = contextvars.copy_context()
            self._thread = threading.Thread(
                target=context.run, args=(self._run,), name="msmon-panel-send", daemon=True
            )
            self._thread.start()
        self._queue.put((msg, buffers))

    def _run(self) -> None:
        warned = False
        while (item := self._queue.get()) is not None:
            try:
                self.widget.send(*item)
            except Exception:  # a thread boundary: log once, keep the training going
                if not warned:
                    log.warning("msmon: the panel could not send an update", exc_info=True)
                    warned = True

    def close(self, timeout: float = 5.0) -> None:
        """Send what is queued, then stop the thread."""
        if self._thread is not None:
            self._queue.put(None)
            self._thread.join(timeout)
            self._thread = None
