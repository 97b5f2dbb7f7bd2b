"""Fan-out of server-sent events: one watcher publishes, every ``/api/stream`` client reads.

Events get increasing sequence numbers and the last ``keep`` are held, so a client that
was busy writing catches up with what it missed instead of blocking the publisher.

An event's id is ``EPOCH-SEQ``: the epoch is new at each server start, so a browser that
reconnects (its ``EventSource`` sends the last id it saw as ``Last-Event-ID``) resumes
exactly after that event when this server still holds everything since, and is told it
cannot (``resume`` gives None) when the id is another server's or events it missed were
dropped: that page then reloads what it shows instead of trusting a gap. Sequence
numbers alone would resume a restarted server's client at the wrong place.
"""

from __future__ import annotations

import collections
import secrets
import threading
from typing import Any


class Broadcaster:
    """Publish ``(kind, data)`` events; wait for the ones after a sequence number."""

    def __init__(self, keep: int = 1000) -> None:
        self._events: collections.deque[tuple[int, str, Any]] = collections.deque(maxlen=keep)
        self._seq = 0
        self._cond = threading.Condition()
        self.epoch = secrets.token_hex(4)
        self.closed = False

    @property
    def seq(self) -> int:
        """Sequence number of the newest event (0 before any)."""
        with self._cond:
            return self._seq

    def event_id(self, seq: int) -> str:
        """The ``id:`` of event ``seq`` on the stream."""
        return f"{self.epoch}-{seq}"

    def resume(self, last_id: str) -> int | None:
        """The sequence number to go on after, for a client whose last event was
        ``last_id``; None when that is not exact: the id is not this server's (another
        start, or garbage), or some event after it is no longer held."""
        epoch, _, seq = last_id.strip().partition("-")
        if epoch != self.epoch or not seq.isdigit():
            return None
        after = int(seq)
        with self._cond:
            # the newest event no longer held: the one before the oldest held
            dropped = self._events[0][0] - 1 if self._events else self._seq
            if after > self._seq or after < dropped:
                return None
            return after

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
