"""The default output: MindSpore summary files, through ``EventWriter``."""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path
from typing import Any

import numpy as np

from msmon_nb.events.writer import EventWriter
from msmon_nb.sinks.base import Sink


class SummarySink(Sink):
    """Scalars, histograms and tensors into ``events.out.events.summary.*`` files."""

    name = "summary"

    def __init__(self, run_dir: Path, rank: int = 0, **writer_options: Any) -> None:
        options = {k: v for k, v in writer_options.items() if v is not None}
        self.writer = EventWriter(run_dir, rank=rank, **options)

    def scalars(self, step: int, wall: float, values: Mapping[str, float]) -> None:
        self.writer.add_scalars(step, values, wall_time=wall)

    def histogram(self, step: int, wall: float, tag: str, values: Any) -> None:
        self.writer.add_histogram(tag, values, step, wall_time=wall)

    def tensor(self, step: int, wall: float, tag: str, values: np.ndarray) -> None:
        self.writer.add_tensor(tag, values, step, wall_time=wall)

    def flush(self) -> None:
        self.writer.flush()

    def close(self) -> None:
        self.writer.close()
