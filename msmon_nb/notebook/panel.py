"""The live panel: an ipywidgets box drawn by the kernel itself while the cell trains.

Built once; afterwards only widget values change (no clear_output, so nothing flickers
in VSCode). It hooks the Monitor's step boundaries: there it processes pending widget
messages (pause, stop, frequency, display options) at most every ``pump_secs``, updates
the counters (cheap HTML) at most every ``refresh`` seconds, and redraws the charts at
most every ``refresh`` seconds, within a drawing budget of ``budget`` (1 %) of wall
time counted over the whole cell: a draw may start only when the drawing done so far
plus 1.5 x its expected cost fits in ``budget`` x elapsed time. A blit is expected to
cost what the last one did; a re-layout is priced by the renderer (per axes that must
change) and refused when the spare budget cannot pay for it, in which case the panel
comes back when it can. Only the first chart is exempt, so the user sees the curves
``first_draw`` seconds in; it is charged to the budget all the same. The figure is built
before training starts (``warm_up``, for the tags the monitor's config will produce),
outside that budget. The clock is injectable so tests are deterministic.
"""

from __future__ import annotations

import html
import math
import time
from collections.abc import Callable, Mapping
from typing import TYPE_CHECKING, Any

from msmon_nb.notebook.render import ChartRenderer, RenderOptions
from msmon_nb.notebook.snapshots_view import snapshots_html

if TYPE_CHECKING:
    from msmon_nb.monitor import Monitor

TYPICAL_BLIT = 0.03  # seconds: a redraw whose axes limits hold (bench/panel.py)
HORIZON = 60.0  # seconds of steps the x axis has room for at least (a re-layout of
# every axes costs ~0.2 s, which the 1 % budget pays for only every 20 s)
PLAN = 0.9  # plan to spend 90 % of the budget: a draw can cost more than expected
SAFETY = 1.5  # plan draws as if they cost this much more: costs vary from draw to draw
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
        first_draw: float = 1.0,
        pump_secs: float = 0.05,
        live: bool = True,
        clock: Callable[[], float] = time.perf_counter,
    ) -> None:
        import ipywidgets as w

        self.refresh = refresh
        self.budget = budget
        self.first_draw = first_draw
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
        self._cost_fast = TYPICAL_BLIT  # the last blit's cost, seconds
        self._rate_mark: tuple[float, int] | None = None  # (time, steps) for the step rate
        self._next_status = 0.0
        self._last_pump = -1e9
        self._drawn_version = -1
        self._dirty = not live  # a live panel's first chart waits for first_draw
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
        if self._rate_mark is None:  # the first step (compilation) is over
            self._rate_mark = (now, monitor.step_count)
        version = monitor.series.version
        due = now >= self._next_draw and now - self._started >= self.first_draw
        if self._dirty:
            self.redraw_now()  # the user changed a control: they wait for the answer
        elif due and version != self._drawn_version:
            spare = PLAN * self.budget * (now - self._started) - self.draw_time
            if self._drawn_version < 0:  # the first chart is not made to wait
                self.redraw_now()
            elif spare >= SAFETY * self._cost_fast:
                self.redraw_now(layout_budget=spare / SAFETY - self._cost_fast)
        elif now >= self._next_status:
            self._update_status()

    def redraw_now(self, layout_budget: float = math.inf) -> None:
        """Draw charts and counters now (or only counters, when the charts need a
        re-layout dearer than ``layout_budget`` seconds); charge the time to the budget."""
        monitor = self.monitor
        t0 = self.clock()
        layouts_before = self.renderer.full_draws
        drawn = True
        if monitor is not None:
            drawn = self.show_series(
                monitor.series,
                monitor.alerts,
                self._expected_step(),
                monitor.snapshots,
                layout_budget=layout_budget,
            )
            if drawn:
                self._drawn_version = monitor.series.version
        self._update_status()
        now = self.clock()
        cost = now - t0
        self.draw_time += cost
        self._dirty = False
        self._next_draw = now + self.refresh
        if not drawn:  # come back when that re-layout fits the budget
            need = self.draw_time + SAFETY * self.renderer.refused_cost
            self._next_draw = max(self._next_draw, self._started + need / (PLAN * self.budget))
            return
        self.draws += 1
        if self.renderer.full_draws == layouts_before:
            self._cost_fast = cost

    def _expected_step(self) -> float | None:
        """The step the run should reach after as long again as it has run (>= 60 s more).

        Sizing the x axis for that long keeps full re-layouts (the costly redraws) to
        about one per doubling of the run's age. The rate is measured since the previous
        draw, or since the first step ended (its time is mostly MindSpore compiling).
        """
        monitor = self.monitor
        now = self.clock()
        elapsed = now - self._started
        if monitor is None or monitor.last_step is None or elapsed <= 0:
            return None
        rate = monitor.step_count / elapsed
        mark = self._rate_mark
        if mark is not None and now - mark[0] > 0.2 and monitor.step_count > mark[1]:
            rate = max(rate, (monitor.step_count - mark[1]) / (now - mark[0]))
            self._rate_mark = (now, monitor.step_count)
        return monitor.last_step + rate * max(elapsed, HORIZON)

    def show_series(
        self,
        series: Mapping[str, Any],
        alerts: list[Any],
        expect_step: float | None = None,
        snapshots: list[Any] | None = None,
        layout_budget: float = math.inf,
    ) -> bool:
        """Draw ``series`` (tag -> steps/values), the alert strip and the snapshot table.

        False when the charts were left as they were (a re-layout was not allowed).
        """
        drawn = True
        if series:
            png = self.renderer.render(series, expect_step, layout_budget=layout_budget)
            if png is None:
                drawn = False
            else:
                self.image.value = png
        self.alerts.value = _alerts_html(alerts, self.renderer.first_nonfinite())
        if snapshots is not None and len(snapshots) != self._snapshots_shown:
            self._snapshots_shown = len(snapshots)
            self.snapshots.value = snapshots_html(snapshots)
        return drawn

    def warm_up(self) -> None:
        """Build the figure and draw it once, before the loop starts (not budgeted).

        The figure is built for the tags the attached monitor will record, so the first
        chart with data needs only a re-layout, not a new figure, inside the budget.
        """
        from msmon_nb.metrics.series import Series

        tags = self.monitor.expected_tags() if self.monitor is not None else []
        self.image.value = self.renderer.render({tag: Series() for tag in tags})
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
