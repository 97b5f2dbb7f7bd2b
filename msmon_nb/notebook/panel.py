"""The panel: charts, counters, alerts and controls for one run, drawn by the browser.

The kernel does not draw while a cell trains. At step boundaries (``on_boundary``) it
handles pending widget messages (the controls of ``monitor.controls``, which the page
builds from the ``commands`` trait: the kernel is busy running the cell, see
``kernel_events``) at most every ``pump_secs``, and at most every ``refresh``
seconds sends one comm message holding the status numbers and, per chart, the points
recorded since the previous message (``PointStream``: min/max-decimated, bounded). The
browser (``static/panel.js``) keeps and draws them; smoothing, log/linear, hover and zoom
never reach the kernel.

matplotlib keeps three jobs: the picture written into the cell's output when the cell
ends (saved notebooks, nbconvert and GitHub show it), the picture of ``mm.show(run)``,
and the fallback when the front end did not load our widget code: its first render says
"hello" over the comm; without that within ``ack_timeout`` seconds of display the panel
says so once and draws PNGs in the kernel instead, at most ``budget`` of wall time.

In VS Code a busy kernel reads the hello at the next step boundary (VS Code posts page
messages to the shell channel whatever the kernel's state; ``kernel_events`` reads them),
and only after the cell on ipykernel < 7: in a kernel VS Code started (``vscode_kernel``)
there is no fallback, and until a hello arrives the panel also keeps its whole view in
the widget's synced state (``keep_state``, every ``STATE_SECS``): kernel -> page updates
of state do flow, and a view drawn at any time starts from them (``panel.js`` skips the
updates the state already holds by their ``seq``). A remote Jupyter server's kernel does
not have VS Code's variable: there the hello, read at the first step boundary before the
fallback's deadline is checked, keeps the live panel. The clock is injectable so tests
are deterministic.
"""

from __future__ import annotations

import base64
import logging
import os
import threading
import time
from collections.abc import Callable, Mapping
from typing import TYPE_CHECKING, Any

from msmon_nb.diagnose.alert import with_chart
from msmon_nb.metrics.charts import plan_charts, replaced_by_optimizers
from msmon_nb.metrics.jsonsafe import jsonable
from msmon_nb.monitor.controls import COMMANDS, command_list, interpret, state_of
from msmon_nb.notebook.reopen import final, placeholder
from msmon_nb.notebook.updates import MAX_STATE_BYTES, Chunk, PointStream

if TYPE_CHECKING:
    from msmon_nb.monitor import Monitor

log = logging.getLogger(__name__)

ACK_TIMEOUT = 3.0  # seconds without the page's hello before falling back to PNGs
STATE_SECS = 2.0  # while no hello came, the synced state follows the run this often
MAX_SNAPSHOT_ROWS = 50  # the newest snapshots the panel's table lists


def vscode_kernel(environ: Mapping[str, str] = os.environ) -> bool:
    """True in a Python kernel that VS Code's Jupyter extension launched: it sets
    ``PYDEVD_IPYTHON_COMPATIBLE_DEBUGGING`` for those (kernelEnvVarsService.node.ts)."""
    return environ.get("PYDEVD_IPYTHON_COMPATIBLE_DEBUGGING") == "1"


def alert_dict(alert: Any) -> dict[str, Any]:
    """An alert (object or dict read from disk) as the plain dict the page shows."""
    data = alert.to_dict() if hasattr(alert, "to_dict") else dict(alert)
    return with_chart(
        {
            key: data.get(key)
            for key in ("kind", "severity", "message", "step", "since_step", "tag", "rank")
        }
    )


class Panel:
    """One panel: a live one follows a Monitor, a static one shows series it is given."""

    def __init__(
        self,
        title: str,
        run_dir: str | None = None,
        *,
        refresh: float = 0.4,
        budget: float = 0.01,
        pump_secs: float = 0.1,
        ack_timeout: float = ACK_TIMEOUT,
        hello_held: bool | None = None,
        live: bool = True,
        threaded: bool = False,
        clock: Callable[[], float] = time.perf_counter,
    ) -> None:
        from msmon_nb.notebook.widget import Outbox, PanelWidget

        self.refresh = refresh
        self.budget = budget
        self.pump_secs = pump_secs
        self.ack_timeout = ack_timeout
        # the page's hello may wait for a step boundary, or the cell's end (VS Code): no fallback
        self.hello_held = vscode_kernel() if hello_held is None else hello_held
        self.clock = clock
        self.live = live
        self.widget = PanelWidget(
            self._on_page,
            title=title,
            run_dir=str(run_dir or ""),
            live=live,
            commands=command_list() if live else [],
        )
        self.stream = PointStream()
        # live panels in a kernel send from a thread of their own (see Outbox)
        self.outbox = Outbox(self.widget) if threaded else None
        self.monitor: Monitor | None = None
        self.pump: Any = None
        self.handle: Any = None
        self.reopen: Any = None  # the picture for a notebook reopened without widget state
        self._state = "running" if live else "finished"
        self.note = ""  # extra status text (a static run's point count...)
        self.acked = False
        self.fallback = False
        self.messages = 0
        self.bytes_sent = 0
        self.kernel_time = 0.0  # seconds spent in on_boundary, pump and drawing included
        self.png_time = 0.0
        self.finish_secs = 0.0
        self._renderer: Any = None  # the fallback's ChartRenderer, made on first use
        self.costs = {"pump": 0.0, "send": 0.0}  # parts of kernel_time, for bench/panel.py
        self._series: Mapping[str, Any] = {}
        self._alerts: list[Any] = []
        self._interventions: list[dict[str, Any]] = []  # drawn as marks on every chart
        self._snapshots: list[Any] = []
        self._charts: list[dict[str, Any]] = []
        self._chart_keys: list[str] = []
        self._planned_for: tuple[int, int] = (-1, -1)
        self._charts_changed = False
        self._must_reset = False
        self._alerts_sent = -1
        self._interventions_sent = -1
        self._snapshots_sent = -1
        self._started = clock()
        self._displayed_at: float | None = None
        self._last_pump = -1e9
        self._next_send = 0.0
        self._next_png = 0.0
        self._next_state = 0.0
        self._state_charts: list[dict[str, Any]] | None = None
        self._rate_mark: tuple[float, int] | None = None
        self._rate = 0.0
        self._lock = threading.RLock()

    @property
    def state(self) -> str:
        """What the status line says: while live, a paused or stopping monitor says so
        (whoever asked: this page, ``msmon ctl``, the viewer, ``%msmonitor``), the one
        state being the monitor's; otherwise the state set here (``running``, the end
        status, a static run's status, ``following``...)."""
        monitor = self.monitor
        if self.live and monitor is not None and (monitor.paused or monitor.stop_requested):
            return state_of(monitor)
        return self._state

    @state.setter
    def state(self, value: str) -> None:
        self._state = value

    # --- data sources -----------------------------------------------------------------

    def set_data(
        self,
        series: Mapping[str, Any],
        alerts: list[Any] | None = None,
        snapshots: list[Any] | None = None,
        interventions: list[dict[str, Any]] | None = None,
    ) -> None:
        """Show ``series`` (key -> object with ``steps``/``values``), alerts, snapshots
        and interventions (``Run.interventions``)."""
        with self._lock:
            if self.stream.shrank(series):  # re-read after its steps restarted
                self._must_reset = True
            self._series = series
            self._alerts = list(alerts or [])
            self._snapshots = list(snapshots or [])
            self._interventions = list(interventions or [])

    def attach(self, monitor: Monitor, pump: Any = None) -> None:
        """Follow ``monitor``: send updates and handle page messages at its step boundaries."""
        self.monitor = monitor
        self.pump = pump
        self._series = monitor.series
        monitor.add_boundary_hook(self.on_boundary)

    def detach(self) -> None:
        """Stop following the monitor (the cell ended)."""
        if self.monitor is not None:
            self.monitor.remove_boundary_hook(self.on_boundary)

    def display(self) -> None:
        """Put the panel in the cell's output (its display can be updated later)."""
        from IPython.display import display

        self.handle = display(self.widget.bundle(), raw=True, display_id=True)
        if self.live and not self.hello_held:  # VS Code keeps no widget state: not there
            self.reopen = display(placeholder(self.widget.model_id), raw=True, display_id=True)
        self._displayed_at = self.clock()
        self.send(reset=True)

    # --- page messages ------------------------------------------------------------------

    def _on_page(self, content: dict[str, Any]) -> None:
        kind = content.get("type")
        monitor = self.monitor
        if kind == "hello":
            self.acked = True
            if self.fallback:  # the page did load after all: back to the live view
                self.fallback = False
                if self.handle is not None:
                    self.handle.update(self.widget.bundle(), raw=True)
            self.send(reset=True)
            return
        if monitor is None or not self.live or kind not in COMMANDS:
            return
        # the one interpreter (monitor.controls), as msmon ctl and the viewer use
        result = interpret(monitor, kind, content.get("value"), source="panel")
        if content.get("id") is not None:  # the page shows the msmon ctl line without it
            with self._lock:
                status = self._status()  # the monitor's state now: paused, stopping...
            ack = {"type": "ack", "id": content["id"], "ok": result.ok, "message": result.message}
            self._post({**ack, "status": status})
        self._next_send = 0.0  # the user waits for the answer

    def _post(self, msg: dict[str, Any], buffers: list[bytes] | None = None) -> None:
        """A message to the page, in order with the others: through the outbox thread
        when there is one, else straight to the widget."""
        if self.outbox is not None:
            self.outbox.put(msg, buffers)
        else:
            self.widget.send(msg, buffers)

    # --- step boundaries ------------------------------------------------------------------

    def on_boundary(self, monitor: Monitor) -> None:
        """Step-boundary hook: page messages first, then an update if one is due.

        Every call is timed (two clock reads, ~0.1 us) so ``kernel_fraction`` is honest.
        """
        began = now = self.clock()
        if self.pump is not None and now - self._last_pump >= self.pump_secs:
            self._last_pump = now
            self.pump.pump()
            now = self.clock()
            self.costs["pump"] += now - began
        if now >= self._next_send:
            if self._ack_overdue(now):
                self._start_fallback()
            self._alerts = monitor.alerts
            self._interventions = monitor.interventions
            self._snapshots = monitor.snapshots
            self.send()
            if not self.acked and (now >= self._next_state or self._state_charts != self._charts):
                self.keep_state()  # a view drawn now, or one whose hello is held, starts here
                self._next_state = now + STATE_SECS
            if self.fallback and now >= self._next_png:
                self._draw_png()
            self._next_send = now + self.refresh
            self.costs["send"] += self.clock() - now
        self.kernel_time += self.clock() - began

    def _ack_overdue(self, now: float) -> bool:
        shown = self._displayed_at
        if self.acked or self.fallback or self.hello_held or shown is None:
            return False
        return now - shown >= self.ack_timeout

    def _status(self) -> dict[str, Any]:
        monitor = self.monitor
        now = self.clock()
        status: dict[str, Any] = {"state": self.state, "live": self.live, "note": self.note}
        if monitor is None:
            status["step"] = _last_step(self._series)
            return status
        count = monitor.step_count
        mark = self._rate_mark
        if mark is None or count < mark[1]:
            self._rate_mark = (now, count)
        elif now - mark[0] >= 1.0:  # steps/s over the last second or more
            self._rate = (count - mark[1]) / (now - mark[0])
            self._rate_mark = (now, count)
        elapsed = now - self._started
        status.update(
            step=monitor.last_step,
            elapsed=elapsed,
            rate=self._rate,
            freq=monitor.collect_freq,
            paused=monitor.paused,
        )
        if not self.live and elapsed > 0:
            # a finished run is described by its own rate; ``rate`` (its last second or
            # so) is shown beside it, named, not in its place
            status["mean_rate"] = count / elapsed
        return status

    def _plan(self) -> None:
        series = self._series
        sizes = (len(series), id(series))
        if sizes == self._planned_for:
            return
        self._planned_for = sizes
        tags = list(series)
        if self.monitor is not None:
            # a whole-step tag that optimizers' own series stand for will not come: no
            # placeholder line waits for it
            gone = replaced_by_optimizers(series)
            tags += [t for t in self.monitor.expected_tags() if t not in series and t not in gone]
        # the shape /api/charts serves ({title, tags, labels, note, log, group}): one
        # chart spec for both pages; here ``tags`` are series keys (tag@rank1...)
        charts = [chart.as_json() for chart in plan_charts(tags)]
        if charts != self._charts:
            self._charts = charts
            self._chart_keys = [k for c in charts for k in c["tags"]]
            self._charts_changed = True

    def send(self, reset: bool = False) -> None:
        """One message with everything new (everything, when ``reset``); thread-safe
        (a follower thread and the kernel's main thread both send)."""
        with self._lock:
            self._send(reset)

    def _send(self, reset: bool) -> None:
        reset, self._must_reset = reset or self._must_reset, False
        for msg, buffers in self._messages(reset):
            self.messages += 1
            msg["seq"] = self.messages  # a view that drew the synced state skips seq <= its
            self._post(msg, buffers)
            self.bytes_sent += sum(len(b) for b in buffers or ())

    def _messages(self, reset: bool) -> list[tuple[dict[str, Any], list[bytes] | None]]:
        """The next update as messages of at most ``updates.MAX_MESSAGE_BYTES`` of points each
        (a reset of many series is several): the first carries the status, charts,
        alerts and snapshots, the others only points, as ``append``."""
        msg, chunk = self._message(reset)
        parts = chunk.split()
        out = [(self._with_points(msg, parts[0]), [parts[0].buffer] if parts[0].keys else None)]
        for part in parts[1:]:
            extra = {"type": "append", "status": msg["status"]}
            out.append((self._with_points(extra, part), [part.buffer]))
        return out

    @staticmethod
    def _with_points(msg: dict[str, Any], chunk: Chunk) -> dict[str, Any]:
        return {**msg, "keys": chunk.keys, "counts": chunk.counts, "nonfinite": chunk.nonfinite}

    def _message(
        self, reset: bool, stream: PointStream | None = None
    ) -> tuple[dict[str, Any], Chunk]:
        """The next update: what is new since the last one (all of it when ``reset``), as
        the message's fields and its points."""
        self._charts_changed = False
        self._plan()
        stream = stream or self.stream
        if reset:
            stream.reset()
        chunk = stream.take(self._series, self._chart_keys)
        msg: dict[str, Any] = {"type": "reset" if reset else "append", "status": self._status()}
        if reset or self._charts_changed:
            msg["charts"] = self._charts
        if reset or len(self._alerts) != self._alerts_sent:
            self._alerts_sent = len(self._alerts)
            msg["alerts"] = [alert_dict(a) for a in self._alerts]
        if reset or len(self._interventions) != self._interventions_sent:
            self._interventions_sent = len(self._interventions)
            msg["interventions"] = jsonable([dict(i) for i in self._interventions])
        if reset or len(self._snapshots) != self._snapshots_sent:
            self._snapshots_sent = len(self._snapshots)
            # the page draws the table and its histograms (chart.js's histogramSVG)
            msg["snapshots"] = jsonable([dict(e) for e in self._snapshots[-MAX_SNAPSHOT_ROWS:]])
        return msg, chunk

    def keep_state(self) -> None:
        """Store the whole panel in the widget's synced state, so a view that renders
        later (a reopened notebook, a second view, a kernel busy in another cell, a page
        whose hello waits for a step boundary) draws it at once, without asking the kernel. ``seq``
        says which updates it holds already."""
        with self._lock:
            self._plan()
            # the state travels in one message too (VS Code's relay): at most
            # MAX_STATE_BYTES of points, shared by the series (at least 64 points each)
            points = max(64, MAX_STATE_BYTES // 16 // max(1, len(self._chart_keys)))
            # what the live updates have yet to carry stays theirs to carry
            sent = (
                self._charts_changed,
                self._alerts_sent,
                self._interventions_sent,
                self._snapshots_sent,
            )
            msg, chunk = self._message(reset=True, stream=PointStream(points, points))
            (
                self._charts_changed,
                self._alerts_sent,
                self._interventions_sent,
                self._snapshots_sent,
            ) = sent
            state = {**self._with_points(msg, chunk), "seq": self.messages}
            self._state_charts = self._charts
        with self.widget.hold_sync():  # one update message: the fields with their points
            self.widget.initial = state
            self.widget.initial_data = chunk.buffer

    # --- matplotlib: fallback and the final picture -------------------------------------

    def _start_fallback(self) -> None:
        self.fallback = True
        print(
            f"msmon: the front end did not load the panel's widget code within "
            f"{self.ack_timeout:g} s (no widget support here, or anywidget is missing "
            "from the front end); drawing the charts as images in the kernel instead"
        )

    def render_png(self, final: bool = False) -> bytes | None:
        """The charts as a PNG (matplotlib), or None when there is nothing to draw."""
        if not self._series:
            return None
        from msmon_nb.notebook.render import ChartRenderer, RenderOptions  # matplotlib: lazily

        self._plan()
        if final:
            renderer = ChartRenderer(RenderOptions(headroom=1.0))
        else:  # the fallback's live pictures: one figure, later draws only blit new lines
            if self._renderer is None:
                self._renderer = ChartRenderer(RenderOptions(headroom=1.5))
            renderer = self._renderer
        tags = {k: self._series[k] for k in self._chart_keys if k in self._series}
        return renderer.render(tags or dict(self._series))

    def _draw_png(self) -> None:
        t0 = self.clock()
        png = self.render_png()
        if png is not None and self.handle is not None:
            self.handle.update(_png_bundle(png, self.widget.title), raw=True)
        cost = self.clock() - t0
        self.png_time += cost
        # spend at most ``budget`` of wall time on kernel-side drawing
        self._next_png = self.clock() + max(self.refresh, cost / self.budget)

    def finish(self, status: str) -> None:
        """Final update with the run's end status and the static picture in the output.

        Its cost (``finish_secs``, mostly the matplotlib picture) is paid once, after the
        training ended, and kept apart from ``kernel_time``."""
        began = self.clock()
        self.state = status
        self.live = False
        self.detach()
        if self.monitor is not None:
            self._alerts = self.monitor.alerts
            self._interventions = self.monitor.interventions
            self._snapshots = self.monitor.snapshots
        self.send()
        if self.outbox is not None:
            self.outbox.close()  # every update reaches the page before the picture
        self.widget.live = False
        self.keep_state()
        try:
            self.widget.static_png = self.render_png(final=True)
        except Exception:  # the picture is a courtesy; the training is done
            log.warning("msmon: could not draw the final panel picture", exc_info=True)
        if self.handle is not None:
            if self.fallback and self.widget.static_png is not None:
                self.handle.update(_png_bundle(self.widget.static_png, self.widget.title), raw=True)
            else:
                self.handle.update(self.widget.bundle(), raw=True)
                if self.reopen is not None:
                    picture = final(
                        self.widget.model_id,
                        self.widget.static_png,
                        self.widget.title,
                        self.widget.run_dir,
                    )
                    self.reopen.update(picture, raw=True)
        self.finish_secs = self.clock() - began

    @property
    def kernel_fraction(self) -> float:
        """Share of wall time the kernel spent on this panel since it was made."""
        elapsed = self.clock() - self._started
        return self.kernel_time / elapsed if elapsed > 0 else 0.0


def _last_step(series: Mapping[str, Any]) -> int | None:
    last = None
    for s in series.values():
        steps = s.steps
        if len(steps):
            last = int(steps[-1]) if last is None else max(last, int(steps[-1]))
    return last


def _png_bundle(png: bytes, title: str) -> dict[str, Any]:
    return {
        "text/plain": f"msmon panel: {title}",
        "image/png": base64.b64encode(png).decode("ascii"),
    }
