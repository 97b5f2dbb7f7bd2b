"""The one interpreter of control commands: the panel, ``%msmonitor``, ``msmon ctl`` and the
viewer all end here.

A command arrives by four roads (a panel click over the comm, the line magic, the control
file that ``msmon ctl`` and the viewer append to, read at step boundaries), but what it
means, how its argument is checked, what it answers and why it is refused is decided
once, here, so the roads cannot drift apart. The commands themselves (names, labels,
arguments) are the table ``rundir.control.SPECS``; this module gives each its handler.
Adding a command is one ``CommandSpec`` there and one handler in ``HANDLERS`` here (a
test checks that the two tables match).

A handler acts on the monitor through its public controls only (``pause``, ``stop``,
``set_collect_freq``, ``snapshot``...); it returns the text the user sees, or raises
``Refused`` saying why it cannot act. Everything runs at a step boundary (the panel's
pump and the control file are read there), so a handler never races the training step.

A command whose spec is ``recorded`` (it changes training, or what is recorded of it)
is an intervention: whatever came of it (done or refused, and by whom: ``panel``,
``ctl``, ``viewer``, ``magic``) is kept through ``mon.intervene`` in the run's
``interventions.jsonl``, here, once for every road.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, Protocol

from msmon_nb.collect.snapshot import ACTIVATIONS
from msmon_nb.config import ConfigError
from msmon_nb.monitor.levers import recorded
from msmon_nb.rundir.control import (
    CHECKPOINT,
    COMMANDS,
    FREQ,
    LR,
    PAUSE,
    RESUME,
    SNAPSHOT,
    SPECS,
    STOP,
    CommandSpec,
    ControlError,
    check_command,
    command_list,
    usage,
)


class Monitor(Protocol):
    """The public controls of ``monitor.run.Monitor`` a handler may use (a Protocol, so
    this module does not import the one that calls it)."""

    paused: bool
    enabled: bool
    status: str
    last_step: int | None

    @property
    def stop_requested(self) -> bool: ...

    def pause(self) -> None: ...

    def resume(self) -> None: ...

    def stop(self, reason: str | None = None) -> None: ...

    def set_collect_freq(self, n: int) -> None: ...

    def snapshot(self, tensors: Any = None, step: int | None = None, reason: str = "manual"): ...

    def checkpoint(self) -> dict[str, Any]: ...

    def scale_lr(self, factor: float) -> str: ...

    def intervene(
        self, what: str, arg: Any, who: str, ok: bool, message: str, **extra: Any
    ) -> dict[str, Any]: ...


log = logging.getLogger(__name__)

__all__ = [
    "COMMANDS",
    "HANDLERS",
    "Refused",
    "Result",
    "command_list",
    "interpret",
    "state_of",
    "usage",
]


class Refused(Exception):
    """A valid command the monitor cannot act on now; the text says why."""


@dataclass(frozen=True)
class Result:
    """What came of one command: done or refused, and the text the user sees."""

    ok: bool
    message: str


@dataclass(frozen=True)
class Done:
    """A handler's answer with facts for the intervention record (a checkpoint's path)."""

    message: str
    extra: dict[str, Any]


Handler = Callable[[Monitor, Any, str], "str | Done"]


def _pause(mon: Monitor, _arg: Any, _by: str) -> str:
    if mon.paused:
        return f"already paused at step {mon.last_step}"
    mon.pause()
    return f"paused at step {mon.last_step}"


def _resume(mon: Monitor, _arg: Any, _by: str) -> str:
    if not mon.paused:
        return "not paused: the loop is running"
    mon.resume()
    return "resumed"


def _stop(mon: Monitor, _arg: Any, by: str) -> str:
    mon.stop(reason=f"stop requested{by}")
    return "stopping at the next step boundary"


def _freq(mon: Monitor, n: int, _by: str) -> str:
    mon.set_collect_freq(n)
    return f"collecting every {n} steps"


def _snapshot(mon: Monitor, _arg: Any, by: str) -> str:
    if not mon.enabled:
        raise Refused("this monitor is disabled (enable_monitor: false): nothing to snapshot")
    taken = mon.snapshot(reason=f"ctl{by}")
    acts = sum(1 for e in taken if e.get("kind") == ACTIVATIONS)
    modules = f" and {acts} modules' activations" if acts else ""
    return f"snapshot of {len(taken) - acts} tensors{modules} at step {mon.last_step}"


def _checkpoint(mon: Monitor, _arg: Any, _by: str) -> Done:
    if not mon.enabled:
        raise Refused("this monitor is disabled (enable_monitor: false): nothing to save")
    saved = mon.checkpoint()
    return Done(saved["message"], recorded(saved))


def _lr(mon: Monitor, factor: float, _by: str) -> str:
    if not mon.enabled:
        raise Refused("this monitor is disabled (enable_monitor: false): no optimizer known")
    return mon.scale_lr(factor)


HANDLERS: dict[CommandSpec, Handler] = {
    PAUSE: _pause,
    RESUME: _resume,
    STOP: _stop,
    FREQ: _freq,
    SNAPSHOT: _snapshot,
    CHECKPOINT: _checkpoint,
    LR: _lr,
}


def interpret(mon: Monitor, cmd: Any, arg: Any = None, source: str = "") -> Result:
    """Check ``cmd`` and its ``arg`` (a number or its text), then act on ``mon``.

    Never raises for a bad or refused command: the ``Result`` says what went wrong and
    how to fix it, so every road answers the same way (an ack line, a panel message,
    a ``%msmonitor`` error). ``source`` (``msmon ctl``, ``panel``...) is kept in a stop's
    reason and a snapshot's."""
    try:
        name, value = check_command(cmd, arg)
    except ControlError as exc:
        return Result(False, str(exc))
    result, extra = _act(mon, name, value, source)
    if SPECS[name].recorded:
        try:
            mon.intervene(name, value, source, result.ok, result.message, **extra)
        except Exception:  # a record that cannot be kept must not undo the answer
            log.debug("msmon: recording %s failed", name, exc_info=True)
    return result


def _act(mon: Monitor, name: str, value: Any, source: str) -> tuple[Result, dict[str, Any]]:
    """Run the checked command's handler: its ``Result`` and the record's extra facts."""
    if mon.stop_requested and name != STOP.name:
        return Result(False, f"{name} refused: the run is stopping at the next step boundary"), {}
    by = f" ({source})" if source else ""
    try:
        done = HANDLERS[SPECS[name]](mon, value, by)
    except (Refused, ConfigError, ValueError) as exc:
        return Result(False, f"{name} refused: {exc}"), {}
    except Exception as exc:  # a monitoring failure: answered, and training goes on
        log.debug("msmon: command %s failed", name, exc_info=True)
        return Result(False, f"{name} failed ({type(exc).__name__}: {exc}); training goes on"), {}
    if isinstance(done, Done):
        return Result(True, done.message), done.extra
    return Result(True, done), {}


def state_of(mon: Monitor) -> str:
    """The monitor's control state as the pages show it: ``stopping`` once a stop was
    asked, ``paused`` while held, else the monitor's own status (``running``...)."""
    if mon.stop_requested:
        return "stopping"
    if mon.paused:
        return "paused"
    return mon.status
