"""The one stand-in the suite tests use: a loss-scale train cell's NPU float-status
overflow check, which the CPU has no kernel for, done by ``amp.all_finite`` instead (in
the monitored and the unmonitored run alike; the rest of the cell is the suite's)."""

from __future__ import annotations

from typing import Any

import mindspore as ms
from mindspore import Tensor, ops
from mindspore.amp import all_finite


def on_cpu(cls: type) -> type:
    """``cls`` with its NPU float-status overflow check done by ``amp.all_finite``."""

    class CpuOverflowCheck(cls):
        def __init__(self, *args: Any, **kwargs: Any) -> None:
            super().__init__(*args, **kwargs)
            self.is_cpu_device = False  # mindone, MindOCR: run the check they skip on CPU

        def start_overflow_check(self, pre_cond, compute_input):
            return Tensor([0] * 8, ms.int32), compute_input

        def get_overflow_status(self, status, compute_output):
            return ops.logical_not(all_finite(compute_output))

    CpuOverflowCheck.__name__ = cls.__name__
    return CpuOverflowCheck
