"""What the panel sends the browser: per series key, only the points that are new.

``PointStream`` keeps one cursor per series key. ``take()`` returns the points recorded
since the previous call, min/max-decimated to at most ``max_new`` per key (each bucket's
minimum and maximum at their own steps, so a one-step spike is sent even when thousands
of steps passed between two messages; the newest point is always sent exactly), plus the
non-finite points, which the page marks instead of drawing. The cost of a call is
O(new points), never O(run length), and the bytes it produces are bounded by
``keys x max_new x 16`` whatever the run's length or step rate.

Pure numpy over anything with ``steps``/``values`` arrays (a live ``SeriesStore`` or a
``Run`` read from disk), so it is tested without a kernel or a browser.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from msmon_nb.metrics.decimate import downsample

MAX_NEW = 512  # points per key per message: at 2-4 messages/s, ~32-64 KB/s per key at most
RESET_POINTS = 2000  # points per key in a reset (the page keeps up to 4000)
# The most bytes one message's buffer holds: VS Code relays a message to its notebook page
# as a JSON array of byte values (spread from an ArrayBuffer, or ``Array.apply`` over a
# view, which throws past ~120 KB in V8), ~1-3 ms per 32 KB (bench/relay.py): one series'
# reset (2000 points) fits. The panel's synced state is one message too (sent every 2 s
# until the kernel read the page's hello, see panel.py), so it gets the same bound.
MAX_MESSAGE_BYTES = 32 * 1024
MAX_STATE_BYTES = 32 * 1024


@dataclass
class Chunk:
    """New points of several keys, ready for one comm message.

    ``buffer`` holds, key after key, that key's ``counts[i]`` steps then as many values,
    all little-endian float64: one binary frame per message (each extra frame costs the
    kernel ~30 us to send, more than packing them).
    """

    keys: list[str] = field(default_factory=list)
    counts: list[int] = field(default_factory=list)
    parts: list[np.ndarray] = field(default_factory=list)
    nonfinite: dict[str, list[list[Any]]] = field(default_factory=dict)

    @property
    def points(self) -> int:
        """Points in the chunk, all keys together."""
        return sum(self.counts)

    @property
    def buffer(self) -> bytes:
        """The packed steps and values (see the class docstring)."""
        if not self.parts:
            return b""
        return np.concatenate(self.parts).astype("<f8", copy=False).tobytes()

    @property
    def nbytes(self) -> int:
        """Bytes of the packed buffer."""
        return 16 * self.points

    def split(self, max_bytes: int = MAX_MESSAGE_BYTES) -> list[Chunk]:
        """The same points as chunks whose buffers hold at most ``max_bytes`` each (a key
        is never cut; one key over the limit travels alone), in key order; the
        non-finite marks stay with the first."""
        out: list[Chunk] = []
        current = Chunk(nonfinite=self.nonfinite)
        for i, (key, count) in enumerate(zip(self.keys, self.counts, strict=True)):
            if current.keys and current.nbytes + 16 * count > max_bytes:
                out.append(current)
                current = Chunk()
            current.keys.append(key)
            current.counts.append(count)
            current.parts += self.parts[2 * i : 2 * i + 2]
        out.append(current)
        return out


def _kind(value: float) -> str:
    return "nan" if np.isnan(value) else ("inf" if value > 0 else "-inf")


class PointStream:
    """Cursors into a mapping of series; see the module docstring."""

    def __init__(self, max_new: int = MAX_NEW, reset_points: int = RESET_POINTS) -> None:
        self.max_new = max_new
        self.reset_points = reset_points
        self.sent: dict[str, int] = {}  # key -> points of its series sent (ever added)
        self.last_step: dict[str, int] = {}  # key -> the newest step sent

    def reset(self) -> None:
        """Forget what was sent: the next ``take`` sends everything (decimated)."""
        self.sent.clear()
        self.last_step.clear()

    def take(self, series: Mapping[str, Any], keys: Iterable[str] | None = None) -> Chunk:
        """The points of ``keys`` (default: all) added since the last call.

        A key whose series shrank (a run re-read after its steps restarted) makes the
        whole stream start over; the caller then sends a reset.
        """
        chunk = Chunk()
        for key in series if keys is None else keys:
            s = series.get(key)
            if s is None:
                continue
            steps, values = s.steps, s.values
            n = len(steps)
            added = _added(s, n)
            start = self.sent.get(key, 0) - (added - n)  # index of the first unsent point
            if n <= start:
                continue
            if start < 0 and key in self.sent:
                # unsent points were thinned (metrics.series: the panel was not pumped
                # for half a series' limit): what is held after the last step sent, the
                # missed stretch as its min/max outline, is what is new
                start = int(np.searchsorted(steps, self.last_step[key], side="right"))
            start = max(start, 0)
            cap = self.max_new if key in self.sent else max(self.max_new, self.reset_points)
            new_steps, new_values = steps[start:n], values[start:n]
            bad = ~np.isfinite(new_values)
            if bad.any():
                chunk.nonfinite[key] = [
                    [int(st), _kind(v)]
                    for st, v in zip(new_steps[bad], new_values[bad], strict=True)
                ]
            if n - start > cap:
                # the one decimation: extremes, NaN/Inf, first and newest point kept
                new_steps, new_values, _, _ = downsample(new_steps, new_values, cap)
            self.sent[key] = added
            self.last_step[key] = int(steps[n - 1])
            chunk.keys.append(key)
            chunk.counts.append(len(new_steps))
            chunk.parts += [np.asarray(new_steps, np.float64), np.asarray(new_values, np.float64)]
        return chunk

    def shrank(self, series: Mapping[str, Any]) -> bool:
        """True when some series holds fewer points than were already sent."""
        return any(
            key in series and _added(series[key], len(series[key].steps)) < n
            for key, n in self.sent.items()
        )


def _added(s: Any, n: int) -> int:
    """Points ever added to ``s``: a live ``Series`` counts the ones it thinned, a
    series read from disk holds them all."""
    return getattr(s, "appended", n)


def unpack(
    keys: list[str], counts: list[int], buffer: bytes | memoryview
) -> dict[str, tuple[np.ndarray, np.ndarray]]:
    """key -> (steps, values) from a packed buffer (what the page does, in numpy)."""
    packed = np.frombuffer(buffer, "<f8") if keys else np.empty(0)
    out, offset = {}, 0
    for key, n in zip(keys, counts, strict=True):
        out[key] = (packed[offset : offset + n], packed[offset + n : offset + 2 * n])
        offset += 2 * n
    return out
