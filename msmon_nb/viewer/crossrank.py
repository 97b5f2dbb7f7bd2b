"""Cross-rank alerts of the loaded runs, computed off the request path.

``diagnose.ranks.rank_alerts`` reads every rank's series (seconds for a 64-rank job of
100,000 steps), so it runs neither per request nor under a run's lock: when a run with
several ranks is loaded or grows, the store hands over a ``RankView`` (references to its
arrays, taken under the lock) and one worker thread evaluates the rules on it. Results
are kept per run with the run version they describe; a run that changes while its rules
run is simply evaluated again afterwards, at most once per four times the last
evaluation took, so a long live job costs the viewer at most a fifth of a core.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable
from typing import Any

from msmon_nb.diagnose.rankrules import rank_alerts

log = logging.getLogger(__name__)

PAUSE_FACTOR = 4.0


def _default_rules(view: Any) -> list[Any]:
    return rank_alerts(view)


class CrossRankAlerts:
    """Evaluate cross-rank rules per run in one worker; ``get`` the latest result."""

    def __init__(
        self,
        on_change: Callable[[str], None],
        rules: Callable[[Any], list[Any]] = _default_rules,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self._on_change = on_change
        self._rules = rules
        self._clock = clock
        self._cond = threading.Condition()
        self._pending: dict[str, tuple[int, Any]] = {}
        self._done: dict[str, tuple[int, list[dict[str, Any]]]] = {}
        self._not_before: dict[str, float] = {}
        self._busy: str | None = None
        self._thread: threading.Thread | None = None
        self._closed = False

    def submit(self, name: str, version: int, view: Any) -> None:
        """Evaluate the rules on ``view``, version ``version`` of run ``name``."""
        with self._cond:
            if self._closed or self._done.get(name, (None,))[0] == version:
                return
            self._pending[name] = (version, view)
            if self._thread is None:
                self._thread = threading.Thread(
                    target=self._loop, name="msmon-view-ranks", daemon=True
                )
                self._thread.start()
            self._cond.notify_all()

    def get(self, name: str) -> list[dict[str, Any]]:
        """The latest alerts found for ``name`` (each with ``cross_rank: true``); [] before."""
        with self._cond:
            done = self._done.get(name)
        return list(done[1]) if done else []

    def wait(self, name: str, timeout: float) -> bool:
        """Wait up to ``timeout`` s until nothing is queued or running for ``name``."""
        with self._cond:
            return self._cond.wait_for(
                lambda: self._closed or (name not in self._pending and self._busy != name),
                timeout,
            )

    def forget(self, name: str) -> None:
        """Drop what is known about a run that vanished."""
        with self._cond:
            self._pending.pop(name, None)
            self._done.pop(name, None)
            self._not_before.pop(name, None)

    def close(self) -> None:
        """Stop the worker (after the evaluation in progress, if any)."""
        with self._cond:
            self._closed = True
            self._cond.notify_all()

    def _next(self) -> tuple[str, int, Any] | None:
        with self._cond:
            while not self._closed:
                now = self._clock()
                ready = [n for n in self._pending if self._not_before.get(n, 0.0) <= now]
                if ready:
                    name = ready[0]
                    version, view = self._pending.pop(name)
                    self._busy = name
                    return name, version, view
                waits = [self._not_before.get(n, 0.0) - now for n in self._pending]
                self._cond.wait(min(waits) if waits else None)
        return None

    def _loop(self) -> None:
        while (job := self._next()) is not None:
            name, version, view = job
            started = self._clock()
            try:
                found = [dict(a.to_dict(), cross_rank=True) for a in self._rules(view)]
            except Exception:  # thread boundary: keep serving, say why
                log.exception("msmon view: cross-rank rules failed on run %r", name)
                found = None
            with self._cond:
                self._busy = None
                self._cond.notify_all()
                before = self._done.get(name)
                self._not_before[name] = self._clock() + PAUSE_FACTOR * (self._clock() - started)
                if found is None:
                    continue
                self._done[name] = (version, found)
            if (before[1] if before else []) != found:
                self._on_change(name)
