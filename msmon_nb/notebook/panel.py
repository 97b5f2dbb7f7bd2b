"""The live panel: an ipywidgets box drawn by the kernel itself while the cell trains.

Built once; afterwards only widget values change (no clear_output, so nothing flickers
in VSCode). It hooks the Monitor's step boundaries: there it processes pending widget
messages (pause, stop, frequency, display options) at most every ``pump_secs``, updates
the counters (cheap HTML) at most every ``refresh`` seconds, and redraws the charts at
most every ``refresh`` seconds, backing off so drawing takes at most ``budget`` (1 %) of
wall time: after a draw of ``d`` seconds the next one waits ``d / budget``. The figure
is built before training starts (``warm_up``), outside that budget. The clock is
injectable so tests are deterministic.
"""

from __future__ import annotations

import html
import time
from collections.abc import Callable, Mapping
from typing import TYPE_CHECKING, Any

from msmon_nb.notebook.render import ChartRenderer, RenderOptions
from msmon_nb.notebook.snapshots_view import snapshots_html

if TYPE_CHECKING:
    from msmon_nb.monitor import Monitor

_SEVERITY_COLORS = {"critical": "#b71c1c", "warning": "#e65100", "info": "#1565c0"}


def _fmt_secs(secs: float) -> str:
    secs = int(secs)
    return f"{secs // 3600}:{secs // 60 % 60:02d}:{secs % 60:02d}"


class Panel:
    """Charts, counters, alerts and controls for one run (live or finished)."""

    def __init__(
        self,
        title: str,
        run_dir: str | None = None,
        *,
        refresh: float = 0.5,
        budget: float = 0.01,
        pump_secs: float = 0.05,
        live: bool = True,
        clock: Callable[[], float] = time.perf_counter,
    ) -> None:
        import ipywidgets as w

        self.refresh = refresh
        self.budget = budget
        self.pump_secs = pump_secs
        self.clock = clock
        self.live = live
        self.renderer = ChartRenderer(RenderOptions(headroom=1.5 if live else 1.0))
        self.monitor: Monitor | None = None
        self.pump: Any = None
        self.draw_time = 0.0
        self.draws = 0
        self._started = clock()
        self._next_draw = 0.0
        self._next_status = 0.0
        self._last_pump = -1e9
        self._drawn_version = -1
        self._dirty = True
        self._status = "running" if live else "finished"
        self._snapshots_shown = 0

        self.title = w.HTML(f"<b>msmon</b> &middot; {html.escape(title)}")
        self.status = w.HTML()
        self.image = w.Image(format="png", layout=w.Layout(width="100%", max_width="900px"))
        self.alerts = w.HTML()
        self.snapshots = w.HTML()
        where = html.escape(str(run_dir)) if run_dir else ""
        self.footer = w.HTML(
            f"<span style='color:#666;font-size:90%'>run dir: <code>{where}</code></span>"
            if run_dir
            else ""
        )
        self.pause_button = w.ToggleButton(
            description="Pause", icon="pause", tooltip="pause at the next step"
        )
        self.stop_button = w.Button(
            description="Stop",
            icon="stop",
            button_style="danger",
            tooltip="end the loop at the next step",
        )
        self.freq = w.BoundedIntText(
            value=1,
            min=1,
            max=10**9,
            description="collect every",
            layout=w.Layout(width="190px"),
            style={"description_width": "initial"},
        )
        self.smooth = w.FloatSlider(
            value=0.0,
            min=0.0,
            max=0.99,
            step=0.01,
            description="smoothing",
            readout_format=".2f",
            layout=w.Layout(width="260px"),
        )
        self.scale = w.Dropdown(
            options=["auto", "log", "linear"],
            value="auto",
            description="y axis",
            layout=w.Layout(width="150px"),
            style={"description_width": "initial"},
        )
        controls = [self.pause_button, self.stop_button, self.freq] if live else []
        self.pause_button.observe(self._on_pause, names="value")
        self.stop_button.on_click(self._on_stop)
        self.freq.observe(self._on_freq, names="value")
        self.smooth.observe(self._on_display, names="value")
        self.scale.observe(self._on_display, names="value")
        self.widget = w.VBox(
            [
                w.HBox([self.title, self.status]),
                w.HBox([*controls, self.smooth, self.scale]),
                self.image,
                self.alerts,
                self.snapshots,
                self.footer,
            ]
        )

    # --- wiring to a Monitor --------------------------------------------------------------

    def attach(self, monitor: Monitor, pump: Any = None) -> None:
        """Follow ``monitor``: redraw and process widget events at its step boundaries."""
        self.monitor = monitor
        self.pump = pump
        self.freq.value = monitor.collect_freq
        monitor.add_boundary_hook(self.on_boundary)

    def detach(self) -> None:
        """Stop following the monitor (the cell ended)."""
        if self.monitor is not None:
            self.monitor.remove_boundary_hook(self.on_boundary)

    def _on_pause(self, change: Mapping[str, Any]) -> None:
        if self.monitor is None:
            return
        if change["new"]:
            self.monitor.pause()
            self.pause_button.description, self.pause_button.icon = "Resume", "play"
            self._status = "paused"
        else:
            self.monitor.resume()
            self.pause_button.description, self.pause_button.icon = "Pause", "pause"
            self._status = "running"
        self._dirty = True

    def _on_stop(self, _button: Any) -> None:
        if self.monitor is not None:
            self.monitor.stop()
            self._status = "stopping"
            self.stop_button.disabled = True
            self._dirty = True

    def _on_freq(self, change: Mapping[str, Any]) -> None:
        if self.monitor is not None and change["new"] != self.monitor.collect_freq:
            self.monitor.set_collect_freq(int(change["new"]))
            self._dirty = True

    def _on_display(self, _change: Mapping[str, Any]) -> None:
        self.renderer.options.smooth = float(self.smooth.value)
        self.renderer.options.scale = str(self.scale.value)
        self._dirty = True
        if not self.live or self.monitor is None:
            self.redraw_now()

    # --- drawing ------------------------------------------------------------------------

    def on_boundary(self, monitor: Monitor) -> None:
        """Step-boundary hook: widget events first, then a redraw if one is due."""
        now = self.clock()
        if self.pump is not None and now - self._last_pump >= self.pump_secs:
            self._last_pump = now
            self.pump.pump()
        version = monitor.series.version
        if self._dirty or (now >= self._next_draw and version != self._drawn_version):
            self.redraw_now()
        elif now >= self._next_status:
            self._update_status()

    def redraw_now(self) -> None:
        """Draw charts and counters now, and schedule the next draw per the budget."""
        monitor = self.monitor
        t0 = self.clock()
        if monitor is not None:
            self.show_series(
                monitor.series, monitor.alerts, self._expected_step(), monitor.snapshots
            )
            self._drawn_version = monitor.series.version
        self._update_status()
        cost = self.clock() - t0
        self.draw_time += cost
        self.draws += 1
        self._dirty = False
        self._next_draw = self.clock() + max(self.refresh, cost / self.budget)

    def _expected_step(self) -> float | None:
        """The step the run should reach after as long again as it has run (>= 30 s more).

        Sizing the x axis for that long keeps full re-layouts (the costly redraws) to
        about one per doubling of the run's age.
        """
        monitor = self.monitor
        elapsed = self.clock() - self._started
        if monitor is None or monitor.last_step is None or elapsed <= 0:
            return None
        rate = monitor.step_count / elapsed
        return monitor.last_step + rate * max(elapsed, 30.0)

    def show_series(
        self,
        series: Mapping[str, Any],
        alerts: list[Any],
        expect_step: float | None = None,
        snapshots: list[Any] | None = None,
    ) -> None:
        """Draw ``series`` (tag -> steps/values), the alert strip and the snapshot table."""
        if series:
            self.image.value = self.renderer.render(series, expect_step)
        self.alerts.value = _alerts_html(alerts, self.renderer.first_nonfinite())
        if snapshots is not None and len(snapshots) != self._snapshots_shown:
            self._snapshots_shown = len(snapshots)
            self.snapshots.value = snapshots_html(snapshots)

    def warm_up(self) -> None:
        """Build the figure and draw it once, before the loop starts (not budgeted)."""
        self.image.value = self.renderer.render({})
        self._update_status()

    def _update_status(self) -> None:
        self._next_status = self.clock() + self.refresh
        monitor = self.monitor
        if monitor is None:
            return
        elapsed = self.clock() - self._started
        steps = monitor.step_count
        rate = steps / elapsed if elapsed > 0 else 0.0
        last = "-" if monitor.last_step is None else str(monitor.last_step)
        color = {"running": "#2e7d32", "paused": "#e65100", "finished": "#555"}.get(
            self._status, "#b71c1c"
        )
        self.status.value = (
            f"&nbsp;<span style='color:{color};font-weight:bold'>{self._status}</span>"
            f" &middot; step {last} &middot; {_fmt_secs(elapsed)} &middot; {rate:.1f} steps/s"
            f" &middot; every {monitor.collect_freq} steps"
        )

    def finish(self, status: str) -> None:
        """Final draw with the run's end status; controls are disabled."""
        self._status = status
        self.detach()
        for control in (self.pause_button, self.stop_button, self.freq):
            control.disabled = True
        self.renderer.tighten()
        self.redraw_now()

    @property
    def drawing_fraction(self) -> float:
        """Share of wall time spent drawing since the panel was made."""
        elapsed = self.clock() - self._started
        return self.draw_time / elapsed if elapsed > 0 else 0.0


def _alerts_html(alerts: list[Any], nonfinite: Mapping[str, int]) -> str:
    items = []
    for tag, step in sorted(nonfinite.items(), key=lambda kv: kv[1]):
        items.append(
            f"<li style='color:{_SEVERITY_COLORS['critical']}'><b>NaN/Inf</b> in "
            f"<code>{html.escape(tag)}</code> since step {step}</li>"
        )
    for alert in alerts:
        data = alert.to_dict() if hasattr(alert, "to_dict") else dict(alert)
        color = _SEVERITY_COLORS.get(str(data.get("severity")), "#333")
        since = data.get("since_step", data.get("step"))
        items.append(
            f"<li style='color:{color}'><b>{html.escape(str(data.get('kind')))}</b> since step "
            f"{since}: {html.escape(str(data.get('message', '')))}</li>"
        )
    if not items:
        return "<span style='color:#2e7d32;font-size:90%'>no alerts</span>"
    return "<ul style='margin:2px 0;padding-left:18px;font-size:90%'>" + "".join(items) + "</ul>"
