"""The logic behind the magics: run a monitored cell, answer status and control commands.

Kept apart from ``magics.py`` (the IPython shell) so it is testable without a kernel.
"""

from __future__ import annotations

import os
import warnings
from collections.abc import Callable, Sequence
from contextlib import nullcontext
from pathlib import Path
from typing import Any

from msmon_nb.config import ConfigError, MonitorConfig
from msmon_nb.events.runs import Run, load_run
from msmon_nb.monitor import Monitor, active
from msmon_nb.monitor.controls import COMMANDS, interpret, usage
from msmon_nb.notebook.follow import follow_run, run_series
from msmon_nb.notebook.kernel_events import BusyGuard, KernelEventPump
from msmon_nb.notebook.panel import Panel


class NotebookSession:
    """State shared by the magics of one kernel: the last monitored run."""

    def __init__(self) -> None:
        self.last_monitor: Monitor | None = None
        self.last_panel: Any = None

    def run_cell(
        self,
        body: Callable[[], Any],
        *,
        save_dir: str | None = None,
        run_name: str | None = None,
        freq: int | None = None,
        config_path: str | None = None,
        break_on: str | None = None,
        panel: bool = True,
        refresh: float = 0.4,
    ) -> Any:
        """Run ``body`` under a new Monitor with ``watch()`` active (and a live panel)."""
        __tracebackhide__ = True
        config = MonitorConfig.from_yaml(config_path) if config_path else MonitorConfig()
        overrides: dict[str, Any] = {}
        if save_dir is not None:
            overrides["save_dir"] = save_dir
        if run_name is not None:
            overrides["run_name"] = run_name
        if freq is not None:
            overrides["log_interval"] = freq
        if break_on is not None:
            overrides["break_on"] = break_on
        if overrides:
            config = config.replace(**overrides)
        with _busy_guard():
            monitor = Monitor(config)
            self.last_monitor = monitor
            view = self._panel(monitor, refresh) if panel else None
            self.last_panel = view
            result = None
            try:
                with monitor, monitor.watch():
                    result = body()
            finally:
                if view is not None:
                    view.finish(monitor.status if monitor.status != "running" else "interrupted")
        if monitor.status == "stopped":
            print(
                f"msmon: stopped at step {monitor.last_step}; run marked stopped: {monitor.run_dir}"
            )
        return result

    @staticmethod
    def _panel(monitor: Monitor, refresh: float) -> Any:
        view = Panel(
            monitor.run_name or "run (not saved)", monitor.run_dir, refresh=refresh, threaded=True
        )
        pump = KernelEventPump.for_current_kernel()
        if pump is None:
            warnings.warn(
                "msmon: this kernel cannot deliver button clicks while a cell runs "
                "(ipykernel >= 7 needed); the panel still updates, controls act after the cell",
                stacklevel=3,
            )
        view.attach(monitor, pump)
        view.display()
        return view

    # --- line magic -----------------------------------------------------------------------

    def current(self) -> Monitor | None:
        """The monitor a command acts on: the running one, else the last one."""
        return active() or self.last_monitor

    def status(self) -> str:
        """One paragraph about the running or last monitored run."""
        mon = self.current()
        if mon is None:
            return "msmon: no monitored cell has run in this kernel yet"
        return (
            f"msmon: run {mon.run_name} ({mon.status}) in {mon.run_dir}\n"
            f"  steps {mon.step_count}, last step {mon.last_step}, collecting every "
            f"{mon.collect_freq}, {len(mon.alerts)} alerts" + (", paused" if mon.paused else "")
        )

    def command(self, name: str, args: Sequence[str]) -> Any:
        """``status``, ``attach RUN_DIR``, or a control command (``monitor.controls``: the
        panel's buttons and ``msmon ctl``'s, through the same interpreter)."""
        if name == "status":
            print(self.status())
            return None
        if name == "attach":
            if len(args) != 1:
                raise ConfigError("usage: %msmonitor attach RUN_DIR")
            return show(args[0], follow=True)
        if name not in COMMANDS:
            raise ConfigError(
                f"%msmonitor {name!r}: unknown command; use status, "
                f"{usage().replace('|', ', ')} or attach RUN_DIR"
            )
        mon = active()
        if mon is None:
            raise ConfigError(
                f"%msmonitor {name}: no monitored training is running; start one with %%msmonitor"
            )
        if len(args) > 1:
            raise ConfigError(f"%msmonitor {name}: one argument at most (got {len(args)})")
        result = interpret(mon, name, args[0] if args else None, source="%msmonitor")
        if not result.ok:
            raise ConfigError(f"%msmonitor {result.message}")
        print(f"msmon: {result.message}")
        print(self.status())
        return None


def _busy_guard() -> Any:
    return BusyGuard.for_current_kernel() or nullcontext()


SESSION = NotebookSession()


def last_run():
    """The run written by the last ``%%msmonitor`` cell (a ``Run``), or None."""
    mon = SESSION.last_monitor
    if mon is None or mon.run_dir is None:
        return None
    return load_run(mon.run_dir)


def show(run: Any, follow: bool = False, rank: int | None = None) -> Any:
    """Draw the panel for a run on disk (ours or MindSpore's): charts, alerts, snapshots.

    ``run`` is a run dir, a ``Run`` or a ``Monitor``. Returns the widget (displayed as the
    cell's result).
    """
    if isinstance(run, Monitor):
        run = run.run_dir
    if not isinstance(run, Run):
        run = load_run(os.fspath(run))
    if follow:
        return follow_run(run)
    view = Panel(run.name, str(run.path), live=False)
    if rank is None:
        series, alerts = run_series(run)
    else:
        series = {tag: run.scalars(tag, rank=rank) for tag in run.tags(rank=rank)}
        alerts = [a for a in run.alerts if a.get("rank") in (None, rank)]
    view.set_data(series, alerts, run.snapshots)
    view.state = run.status
    view.note = f"{run.num_points} points · {Path(run.path).name}"
    view.widget.static_png = view.render_png(final=True)
    view.keep_state()
    view.widget.panel = view  # the Panel behind the widget, for code that inspects it
    return view.widget
