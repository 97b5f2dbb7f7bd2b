"""``monitor_type: tensorboard``: scalars as tfevents files TensorBoard opens directly.

TensorBoard's Event uses the same record framing and the same field numbers as
MindSpore's except the scalar (``simple_value = 2``), so the same writer thread serves.
Histograms and tensors stay in the summary files only.
"""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path

from msmon_nb.events.writer import EventWriter
from msmon_nb.sinks.base import Sink


class TensorboardSink(Sink):
    """Scalars into ``<run>/tensorboard/events.out.tfevents.*``."""

    name = "tensorboard"

    def __init__(self, logdir: Path, rank: int = 0) -> None:
        self.writer = EventWriter(logdir, rank=rank, flavor="tensorboard")

    def scalars(self, step: int, wall: float, values: Mapping[str, float]) -> None:
        self.writer.add_scalars(step, values, wall_time=wall)

    def flush(self) -> None:
        self.writer.flush()

    def close(self) -> None:
        self.writer.close()
