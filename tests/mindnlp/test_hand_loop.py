"""A hand-written MindNLP loop under ``mon.watch()``: mindtorch's ``value_and_grad`` over
``model(**batch).loss`` (divided by the accumulation steps, the torch recipe), mindtorch's
AdamW, transformers' linear schedule with warmup, ``torch.nn.utils.clip_grad_norm_``.
Steps are updates, loss the sum of the micro-batch losses (their mean before the
division), grad_norm the accumulated gradient's before clipping (float64 twin, rtol 1e-3),
micro_grad_norm, the lr each update used, grad_norm_clipped; weights and AdamW state
bit-identical to the unmonitored twin.

Both runs use the stand-in for MindNLP's two missing CPU kernels (``tests.mindnlp.support``:
mindtorch ``addcdiv``, and the ``axis=None`` norm inside ``clip_grad_norm_``).
"""

from __future__ import annotations

import warnings

import numpy as np
import torch
from mindtorch.autograd import value_and_grad
from transformers import get_linear_schedule_with_warmup

from msmon_nb.config.checks import MonitorWarning
from msmon_nb.events.runs import load_run
from msmon_nb.monitor import Monitor
from tests.mindnlp.support import (
    LR,
    WARMUP,
    Reference,
    Tokens,
    assert_identical,
    bert,
    state,
)

UPDATES, ACCUMULATE, CLIP = 3, 2, 0.02


def hand_loop(ref: Reference | None = None):
    """The loop as a MindNLP user writes it; ``ref``: the twin's readings around it."""
    model = bert()
    data = Tokens()
    params = model.trainable_params()
    optimizer = torch.optim.AdamW(model.parameters(), lr=LR)
    schedule = get_linear_schedule_with_warmup(optimizer, WARMUP, UPDATES)

    def forward(batch):
        return model(**batch).loss / ACCUMULATE

    grad_fn = value_and_grad(forward, params, attach_grads=True)
    model.train()
    for update in range(UPDATES):
        for micro in range(ACCUMULATE):
            loss = grad_fn(data.batch(update * ACCUMULATE + micro))
            if ref is not None:
                ref.micro_batch(float(loss.asnumpy()), params)
        if ref is not None:
            ref.before_clip(params)
        torch.nn.utils.clip_grad_norm_(model.parameters(), CLIP)
        if ref is not None:
            ref.update(optimizer, params)
        optimizer.step()
        schedule.step()
        model.zero_grad()  # (optimizer.zero_grad() fails in mindtorch 0.5.1: no autograd.profiler)
    return model, optimizer


def test_hand_loop_steps_are_updates_and_training_is_unchanged(tmp_path):
    ref = Reference()
    twin = state(*hand_loop(ref))
    with warnings.catch_warnings(record=True) as said:
        warnings.simplefilter("always")
        with Monitor(save_dir=str(tmp_path), log_interval=1) as mon, mon.watch():
            monitored = state(*hand_loop())
    assert_identical(monitored, twin)

    run = load_run(mon.run_dir)
    steps = list(range(UPDATES))
    expected = {
        "train/loss": (ref.loss, 1e-6),
        "train/grad_norm": (ref.grad_norm, 1e-3),
        "train/grad_norm_clipped": (ref.clipped, 1e-3),
        "train/micro_grad_norm": (ref.micro, 1e-3),
        "train/learning_rate": (ref.lr, 1e-7),
    }
    for tag, (values, rtol) in expected.items():
        got = run.scalars(tag)
        assert got.steps.tolist() == steps, (tag, got.steps.tolist())
        np.testing.assert_allclose(got.values, values, rtol=rtol, err_msg=tag)
    assert ref.lr[0] == 0.0 and ref.lr[1] > ref.lr[2] > 0
    assert min(ref.grad_norm) > CLIP, "the test means to clip every update"
    ours = [str(w.message) for w in said if issubclass(w.category, MonitorWarning)]
    assert ours == [], ours
