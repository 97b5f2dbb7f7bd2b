"""Fan-out of server-sent events: one watcher publishes, every ``/api/stream`` client reads.

Events get increasing sequence numbers and the last ``keep`` are held, so a client that
was busy writing catches up with what it missed instead of blocking the publisher; a
client that falls further behind than ``keep`` simply skips ahead (the page refetches on
any event anyway).
"""

from __future__ import annotations

import collections
import threading
from typing import Any


class Broadcaster:
    """Publish ``(kind, data)`` events; wait for the ones after a sequence number."""

    def __init__(self, keep: int = 1000) -> None:
        self._events: collections.deque[tuple[int, str, Any]] = collections.deque(maxlen=keep)
        self._seq = 0
        self._cond = threading.Condition()
        self.closed = False

    @property
    def seq(self) -> int:
        """Sequence number of the newest event (0 before any)."""
        with self._cond:
            return self._seq

    def publish(self, kind: str, data: Any) -> int:
        """Add one event and wake every waiting client; returns its sequence number."""
        with self._cond:
            self._seq += 1
            self._events.append((self._seq, kind, data))
            self._cond.notify_all()
            return self._seq

    def wait(self, after: int, timeout: float) -> list[tuple[int, str, Any]]:
        """Events newer than ``after``, waiting up to ``timeout`` s for one; [] on timeout."""
        with self._cond:
            self._cond.wait_for(lambda: self._seq > after or self.closed, timeout)
            return [e for e in self._events if e[0] > after]

    def close(self) -> None:
        """Release every waiting client (the server is stopping)."""
        with self._cond:
            self.closed = True
            self._cond.notify_all()
