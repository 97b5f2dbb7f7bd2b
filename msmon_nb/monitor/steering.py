"""What a person, a command or an alert does to a running loop: ``Monitor``'s controls.

``Monitor`` (``monitor.run``) inherits them. They act on the parts the class declares
below -- the one paused/stopping state (``monitor.boundary``), the levers
(``monitor.levers``: checkpoint, lr xF), the run's records -- and take effect at a step
boundary (``boundary()``), never inside a step. They live beside the one interpreter
(``monitor.controls``) rather than among the run's wiring (opening, the ways in, the
outputs), so a change to what a command does is made and read here.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

from msmon_nb.collect.rankinfo import RankInfo
from msmon_nb.collect.recorder import StopTraining
from msmon_nb.config import ConfigError, MonitorConfig
from msmon_nb.monitor.actions import Actions
from msmon_nb.monitor.boundary import Boundary
from msmon_nb.monitor.controls import interpret
from msmon_nb.monitor.levers import Levers
from msmon_nb.monitor.outlet import Outlet
from msmon_nb.monitor.records import RunRecords, intervention
from msmon_nb.rundir.control import ControlError, ControlReader


class Steering:
    """The controls of one run; ``Monitor`` sets the parts they act on."""

    config: MonitorConfig
    enabled: bool
    collect_freq: int
    last_step: int | None
    write_dir: Path | None
    ranks: RankInfo
    boundary_state: Boundary
    levers: Levers
    records: RunRecords
    outlet: Outlet
    collector: Any  # collect.collector.StepCollector (its overhead budget)
    _actions: Actions | None
    _marker: dict[str, Any]

    def set_collect_freq(self, n: int) -> None:
        """Collect every ``n``-th step from the next step on."""
        if isinstance(n, bool) or not isinstance(n, int) or n < 1:
            raise ConfigError(f"collect frequency {n!r} must be a whole number >= 1, e.g. 10")
        self.collect_freq = n
        if self.collector.budget is not None:  # the user's new interval is the new floor
            self.collector.budget.reset()

    def will_collect(self, step: int) -> bool:
        """True when ``step`` is a collected step under the current frequency."""
        return self.enabled and step % self.collect_freq == 0

    @property
    def paused(self) -> bool:
        """True while the loop is held at a step boundary (``pause()``)."""
        return self.boundary_state.paused

    def pause(self) -> None:
        """Hold the loop at the next step boundary until ``resume()`` or ``stop()``."""
        self.boundary_state.paused = True

    def resume(self) -> None:
        """Let a paused loop go on."""
        self.boundary_state.paused = False

    def stop(self, reason: str | None = None) -> None:
        """End the loop cleanly at the next step boundary; the run is marked stopped.

        ``reason`` (e.g. "10 updates skipped in a row (limit 10): ...") is printed, kept
        in the run's marker as ``stop_reason`` and carried by the ``StopTraining``.
        """
        if self.boundary_state.ask_stop(reason):
            self._marker["stop_reason"] = reason
            print(f"msmon: stopping: {reason}", flush=True)

    def trains(self, network: Any = None, optimizer: Any = None) -> None:
        """A way in tells what the loop trains (its train network, its optimizer): what
        ``checkpoint`` saves and ``lr xF`` scales (``monitor.levers``)."""
        self.levers.trains(network, optimizer)

    def checkpoint(self) -> dict[str, Any]:
        """Save the network and optimizer state now with ``mindspore.save_checkpoint``
        into ``<write dir>/checkpoints/step_<last step>.ckpt``; ``{step, path, bytes,
        params, message}``. Call it at a step boundary (the ``checkpoint`` command and alert
        action do); ``ValueError`` says why when nothing can be saved."""
        return self.levers.checkpoint(self.write_dir, self.last_step)

    def scale_lr(self, factor: float) -> str:
        """Multiply the optimizer's lr by ``factor`` from the next step on, where that is
        exact (an lr Parameter or list); ``ValueError`` says why not (nothing changed)."""
        return self.levers.scale_lr(factor)

    def intervene(
        self,
        what: str,
        arg: Any,
        who: str,
        ok: bool,
        message: str,
        at: int | None = None,
        **extra: Any,
    ) -> dict[str, Any]:
        """Record one intervention (a command or an alert action that changes training)
        at step ``at`` (default: the last step finished): ``interventions.jsonl`` and the
        panel's markers (``monitor.records``)."""
        step = self.last_step if at is None else at
        entry = intervention(step, who, what, arg, ok, message, self.ranks.label, **extra)
        self.records.intervention(entry)
        return entry

    @property
    def interventions(self) -> list[dict[str, Any]]:
        """This run's interventions so far (this process's), oldest first."""
        return self.records.interventions

    @property
    def stop_requested(self) -> bool:
        """True when a stop waits for the next step boundary."""
        return self.boundary_state.stop_requested

    def add_boundary_hook(self, hook: Callable[[Any], None]) -> None:
        """Call ``hook(monitor)`` at every step boundary (the panel processes UI events here)."""
        self.boundary_state.hooks.append(hook)

    def remove_boundary_hook(self, hook: Callable[[Any], None]) -> None:
        """Undo ``add_boundary_hook``."""
        if hook in self.boundary_state.hooks:
            self.boundary_state.hooks.remove(hook)

    # --- step boundaries ------------------------------------------------------------------

    def boundary(self, raise_stop: bool) -> bool:
        """Run the step-boundary controls (``monitor.boundary``); True when the loop must
        stop (with ``raise_stop``, ``StopTraining`` is raised instead)."""
        if self._actions is not None and self._actions.pending():
            self._actions.at_boundary()  # a debugger session is the user's: not guarded
        state = self.boundary_state
        state.poll(self, self._obey)
        self.outlet.release(self.paused or self.stop_requested or self.outlet.batch.due())
        state.hold(self, self._obey)
        stopped = state.take_stop(self.last_step)
        if stopped is not None and raise_stop:
            raise StopTraining(stopped)
        return stopped is not None

    def _obey(self, control: ControlReader) -> None:
        """Apply the commands ``msmon ctl`` or the viewer appended to the run's control
        file (``rundir.control``), each acknowledged in the run dir."""
        for command in control.read():
            result = interpret(self, command.cmd, command.arg, source=command.source)
            control.ack(command, self.last_step, result.ok, result.message)

    def command(self, cmd: str, arg: Any = None, source: str = "") -> str:
        """Act on one control command (``rundir.control.SPECS``: pause, resume, stop,
        freq N, snapshot) through the one interpreter (``monitor.controls``); returns
        what was done, raises ``ControlError`` saying why when it is refused."""
        result = interpret(self, cmd, arg, source=source)
        if not result.ok:
            raise ControlError(result.message)
        return result.message
