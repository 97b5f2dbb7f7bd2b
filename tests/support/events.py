"""Helpers for event tests: build files record by record with real framing."""

from __future__ import annotations

import struct
from pathlib import Path

from msmon_nb.events import wire
from msmon_nb.events.framing import frame


def scalar_records(n: int, tags=("a/x", "a/y"), start: int = 0) -> list[bytes]:
    """``n`` framed scalar events (value = step * 10 + tag index)."""
    return [
        frame(wire.scalar_event(s, 1000.0 + s, [(t, s * 10 + i) for i, t in enumerate(tags)]))
        for s in range(start, start + n)
    ]


def write_file(path: Path, records: list[bytes]) -> list[int]:
    """Write a version record plus ``records``; returns each record's offset."""
    offsets = []
    data = bytearray(frame(wire.version_event(999.0)))
    for rec in records:
        offsets.append(len(data))
        data += rec
    path.write_bytes(bytes(data))
    return offsets


def steps_of(records) -> list[int]:
    return [r.step for r in records if r.step is not None]


def f32(x: float) -> float:
    return struct.unpack("<f", struct.pack("<f", x))[0]
