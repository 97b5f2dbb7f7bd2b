"""Run monitoring code so that its failure never reaches training: warn once, go on.

Every room that runs code on the user's behalf (the ways in, the collector, the
monitor's actions and outputs) shares one ``Guard`` per run, so a fault is reported
once per kind however often it recurs, and ``StopTraining`` -- how a loop is ended on
purpose -- still passes.
"""

from __future__ import annotations

import logging
import warnings
from collections.abc import Callable
from typing import Any

from msmon_nb.collect.recorder import StopTraining
from msmon_nb.config import MonitorWarning

log = logging.getLogger(__name__)


class Guard:
    """``guard(what, fn, *args)`` and ``warn_once(key, message)`` of one run."""

    def __init__(self) -> None:
        self.warned: set[str] = set()

    def __call__(self, what: str, fn: Callable[..., Any], *args: Any, **kwargs: Any) -> Any:
        """``fn(*args, **kwargs)``; on failure warn once (keyed by ``what``) and return None."""
        try:
            return fn(*args, **kwargs)
        except StopTraining:
            raise
        except Exception as exc:
            self.warn_once(what, f"{what} failed ({type(exc).__name__}: {exc}); training goes on")
            log.debug("msmon: %s failed", what, exc_info=True)
            return None

    def warn_once(self, key: str, message: str, stacklevel: int = 3) -> None:
        """One ``MonitorWarning`` per ``key``."""
        if key in self.warned:
            return
        self.warned.add(key)
        warnings.warn(f"msmon: {message}", MonitorWarning, stacklevel=stacklevel + 1)
