"""``read_lr``: list schedules are looked up on the host, and agree with ``get_lr()``."""

from __future__ import annotations

import mindspore as ms
import numpy as np
import pytest
from mindspore import nn

from msmon_nb.collect.values import _NOT_LISTED, _listed_lr, read_lr


def _reference(opt: nn.Optimizer) -> float:
    lr = opt.get_lr()
    return float((lr[0] if isinstance(lr, tuple) else lr).asnumpy())


@pytest.mark.parametrize("mode", [ms.PYNATIVE_MODE, ms.GRAPH_MODE])
def test_list_schedule_read_on_the_host_matches_get_lr_at_every_step(mode) -> None:
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
                fast = _listed_lr(opt)
                assert fast is not _NOT_LISTED, "a list schedule must take the host path"
                assert fast == pytest.approx(_reference(opt), rel=1e-7, abs=0.0)
                seen.append(fast)
                ms.ops.assign_add(opt.global_step, ms.Tensor([1], ms.int32))
            np.testing.assert_allclose(seen, np.float32(schedule), rtol=1e-7)
            assert read_lr(opt) is None  # past the end: nothing to read (get_lr would raise)
    finally:
        ms.set_context(mode=ms.PYNATIVE_MODE)


def test_other_lrs_still_read_through_get_lr() -> None:
    net = nn.Dense(4, 2)
    constant = nn.Momentum(net.trainable_params(), 0.05, 0.9)
    decay = nn.Momentum(net.trainable_params(), nn.ExponentialDecayLR(0.1, 0.5, 2), 0.9)
    assert _listed_lr(constant) is _NOT_LISTED and _listed_lr(decay) is _NOT_LISTED
    assert read_lr(constant) == pytest.approx(0.05)
    assert read_lr(decay) == pytest.approx(_reference(decay))
