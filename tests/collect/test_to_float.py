"""``to_float``: one-element tensors read through ``item()``, the same values as
``asnumpy()``, also for a Parameter a compiled graph has just written."""

from __future__ import annotations

import mindspore as ms
import numpy as np
import pytest
from mindspore import Parameter, Tensor, ops

from msmon_nb.collect.tensors import to_float


@pytest.mark.parametrize(
    "value, dtype, expected",
    [
        (1.25, ms.float32, 1.25),
        ([0.3], ms.float32, float(np.float32(0.3))),
        ([[7.0]], ms.float64, 7.0),
        (1.5, ms.float16, 1.5),
        (2.5, ms.bfloat16, 2.5),
        (7, ms.int32, 7.0),
        ([3], ms.int64, 3.0),
        (True, ms.bool_, 1.0),
    ],
)
def test_one_element_tensors_of_every_dtype(value, dtype, expected) -> None:
    got = to_float(Tensor(value, dtype))
    assert type(got) is float
    assert got == expected


def test_larger_tensors_give_their_mean_and_empty_ones_none() -> None:
    assert to_float(Tensor(np.array([[1.0, 2.0], [3.0, 6.0]], np.float32))) == 3.0
    assert to_float(Tensor(np.zeros((0,), np.float32))) is None
    assert to_float((Tensor(0.5, ms.float32), Tensor(9.0, ms.float32))) == 0.5
    assert to_float(np.float32(0.25)) == 0.25
    assert to_float(None) is None and to_float([]) is None


@pytest.mark.parametrize("mode", [ms.PYNATIVE_MODE, ms.GRAPH_MODE])
def test_a_parameter_written_inside_a_graph_reads_its_new_value(mode) -> None:
    ms.set_context(mode=mode)
    try:
        store = Parameter(Tensor(0.0, ms.float32), name="to_float_store", requires_grad=False)
        counter = Parameter(Tensor([0], ms.int32), name="to_float_counter", requires_grad=False)

        @ms.jit
        def write(x):
            ops.assign(store, ops.sqrt(ops.reduce_sum(x * x)))
            ops.assign_add(counter, Tensor([1], ms.int32))
            return x

        for i in range(1, 4):
            x = Tensor(np.full((3, 4), float(i), np.float32))
            write(x)
            assert to_float(store) == pytest.approx(float(store.asnumpy()), rel=0, abs=0)
            assert to_float(store) == pytest.approx(i * np.sqrt(12.0), rel=1e-6)
            assert to_float(counter) == float(i)
    finally:
        ms.set_context(mode=ms.PYNATIVE_MODE)
