"""The monitors open in this process: ``active()``, ``mm.snapshot()``, closing at exit.

A breakpoint or the debug console has no handle on the ``Monitor`` a cell made, so
``mm.snapshot()`` finds the most recently opened one here. At interpreter exit a
monitor left open is closed, marked ``interrupted`` when an uncaught exception ended the
program (``sys.excepthook`` is chained once to know), else finished.
"""

from __future__ import annotations

import atexit
import sys
from typing import Any, Protocol

from msmon_nb.config import ConfigError


class Monitor(Protocol):
    """What the registry needs of a ``monitor.run.Monitor`` (kept apart so that this
    module does not import the one that registers with it)."""

    def close(self, status: str | None = None) -> None: ...

    def snapshot(self, tensors: Any = None, step: int | None = None, reason: str = "manual"): ...


_OPEN: list[Monitor] = []
_CRASHED: list[bool] = []


def active() -> Monitor | None:
    """The most recently opened monitor that is still open."""
    return _OPEN[-1] if _OPEN else None


def snapshot(tensors: Any = None, step: int | None = None, reason: str = "manual"):
    """``mon.snapshot(...)`` on the active monitor: handy from a breakpoint or debug console."""
    mon = active()
    if mon is None:
        raise ConfigError(
            "mm.snapshot(): no monitor is active; call it while a monitored loop runs "
            "(%%msmonitor cell, `with Monitor(...)`), or use mon.snapshot(...)"
        )
    return mon.snapshot(tensors, step=step, reason=reason)


def opened(mon: Monitor) -> None:
    """``mon`` is open: it becomes the active monitor and is closed at exit."""
    _OPEN.append(mon)
    _watch_for_crash()


def closed(mon: Monitor) -> None:
    """``mon`` is closed: no longer active."""
    if mon in _OPEN:
        _OPEN.remove(mon)


def _watch_for_crash() -> None:
    """Chain sys.excepthook once, so a monitor left open at exit knows whether it crashed."""
    if getattr(sys.excepthook, "_msmon", False):
        return
    previous = sys.excepthook

    def hook(exc_type, exc, tb):
        _CRASHED.append(True)
        previous(exc_type, exc, tb)

    hook._msmon = True  # type: ignore[attr-defined]
    sys.excepthook = hook


@atexit.register
def _close_open_monitors() -> None:
    for mon in list(_OPEN):
        mon.close("interrupted" if _CRASHED else None)
