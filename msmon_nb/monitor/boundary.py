"""The step boundary of one run: the one paused/stopping state, and what acts there.

A running loop can only be acted on between steps, so every control ends here: the
panel's clicks (its boundary hook pumps the kernel's queued comm messages), ``msmon ctl``
and the viewer (the run's control file, polled at most every 0.1 s), alert actions
(``stop``), ``%msmonitor stop``. They all change the one state held here -- paused, a
stop asked and why -- which the panel, ``msmon ctl``'s answers and the marker read; no
page keeps its own copy. A paused loop waits here, still polling, so it can be resumed
or stopped from any of those roads.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any

from msmon_nb.rundir.control import ControlReader

PAUSE_POLL = 0.05  # s between polls while paused


class Boundary:
    """Pause/stop state, the control file and the boundary hooks of one run.

    ``guard(what, fn, *args)`` is the run's ``collect.guard.Guard``: a failing hook or
    an unreadable control file warns once and the loop goes on.
    """

    def __init__(self, guard: Callable[..., Any]) -> None:
        self.paused = False
        self.stop_requested = False
        self.stop_reason: str | None = None
        self.stopped = False  # a stop took effect (the run is marked stopped)
        self.control: ControlReader | None = None  # msmon ctl commands (rundir.control)
        self.hooks: list[Callable[[Any], None]] = []
        self._guard = guard

    def ask_stop(self, reason: str | None) -> bool:
        """A stop at the next boundary; True when ``reason`` is the first one given (the
        caller prints it and keeps it in the marker)."""
        self.stop_requested = True
        if reason is None or self.stop_reason is not None:
            return False
        self.stop_reason = reason
        return True

    def poll(self, mon: Any, obey: Callable[[ControlReader], None]) -> None:
        """What may act now: the control file's commands (``obey``) and the hooks."""
        control = self.control
        if control is not None and control.due(time.monotonic()):
            self._guard("reading msmon ctl commands", obey, control)
        for hook in list(self.hooks):
            self._guard(f"boundary hook {getattr(hook, '__name__', hook)}", hook, mon)

    def hold(self, mon: Any, obey: Callable[[ControlReader], None]) -> None:
        """While paused (and no stop is asked), wait here, still polling."""
        while self.paused and not self.stop_requested:
            time.sleep(PAUSE_POLL)
            self.poll(mon, obey)

    def take_stop(self, step: int | None) -> str | None:
        """The asked stop takes effect: its message (for ``StopTraining``), or None when
        no stop was asked."""
        if not self.stop_requested:
            return None
        self.stop_requested = False
        self.stopped = True
        why = f": {self.stop_reason}" if self.stop_reason else ""
        return f"msmon: stopped at step {step}{why}"
