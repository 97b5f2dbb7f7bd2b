"""``monitor_type: file``: one JSON object per step, for tools that want plain text."""

from __future__ import annotations

import json
import math
import time
from collections.abc import Mapping
from pathlib import Path

from msmon_nb.sinks.base import Sink


def _number(value: float) -> float | str:
    # JSON has no NaN/Inf; write them as strings that float() reads back
    return value if math.isfinite(value) else repr(value)


class JsonlSink(Sink):
    """Appends ``{"step": .., "wall_time": .., "<tag>": value, ...}`` lines."""

    name = "file"

    def __init__(self, path: Path) -> None:
        self.path = path
        self._file = open(path, "a", encoding="utf-8", buffering=64 * 1024)  # noqa: SIM115
        self._flushed = time.monotonic()

    def scalars(self, step: int, wall: float, values: Mapping[str, float]) -> None:
        row = {"step": step, "wall_time": wall}
        row.update({tag: _number(v) for tag, v in values.items()})
        self._file.write(json.dumps(row) + "\n")
        if time.monotonic() - self._flushed >= 1.0:  # the same 1 s deadline as summary files
            self.flush()

    def flush(self) -> None:
        self._file.flush()
        self._flushed = time.monotonic()

    def close(self) -> None:
        if not self._file.closed:
            self._file.close()
