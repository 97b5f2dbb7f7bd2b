"""``read_lr``: the lr read from the optimizer's Parameters alone, never by calling its
``get_lr()`` or a schedule cell (MindCV's ``get_lr()`` moves ``global_step``)."""

from __future__ import annotations

import mindspore as ms
import numpy as np
import pytest
from mindspore import Tensor, nn, ops
from mindspore.experimental import optim as experimental

from msmon_nb.collect.values import lr_on_host, read_lr


def _step(opt: nn.Optimizer) -> None:
    ops.assign_add(opt.global_step, Tensor([1], ms.int32))


@pytest.mark.parametrize("mode", [ms.PYNATIVE_MODE, ms.GRAPH_MODE])
def test_list_schedule_read_at_global_step_at_every_step(mode) -> None:
    ms.set_context(mode=mode)
    try:
        net = nn.Dense(4, 2)
        schedule = nn.warmup_lr(0.1, 12, 1, 6) + nn.cosine_decay_lr(0.0, 0.1, 12, 1, 12)
        optimizers = [
            nn.Momentum(net.trainable_params(), schedule, 0.9),
            nn.Adam([{"params": net.trainable_params(), "lr": schedule}], learning_rate=0.01),
        ]
        for opt in optimizers:
            seen = []
            for _ in range(len(schedule)):
                assert lr_on_host(opt)
                seen.append(read_lr(opt))
                _step(opt)
            np.testing.assert_array_equal(seen, np.float32(schedule).tolist())
            assert read_lr(opt) is None  # past the end: nothing to read (get_lr would raise)
    finally:
        ms.set_context(mode=ms.PYNATIVE_MODE)


def test_constant_group_and_hand_set_lrs_are_parameters() -> None:
    net = nn.Dense(4, 2)
    params = net.trainable_params()
    constant = nn.Momentum(params, 0.05, 0.9)
    assert read_lr(constant) == pytest.approx(0.05)
    ops.assign(constant.learning_rate, Tensor(0.02, ms.float32))  # as LearningRateScheduler
    assert read_lr(constant) == pytest.approx(0.02)
    grouped = nn.Momentum([{"params": params[:1], "lr": 0.3}, {"params": params[1:]}], 0.1, 0.9)
    assert read_lr(grouped) == pytest.approx(0.3)
    adam = experimental.Adam(params, lr=0.004)
    assert lr_on_host(adam) and read_lr(adam) == pytest.approx(0.004)


def test_a_schedule_cell_is_not_called() -> None:
    """Only running the schedule would tell its value: not ours to run (the optimizer
    tap keeps what the optimizer's own get_lr() computed instead)."""
    calls = []

    class Counted(nn.ExponentialDecayLR):
        def construct(self, global_step):
            calls.append(1)
            return super().construct(global_step)

    opt = nn.Momentum(nn.Dense(4, 2).trainable_params(), Counted(0.1, 0.5, 2), 0.9)
    assert not lr_on_host(opt)
    assert read_lr(opt) is None
    assert calls == []
