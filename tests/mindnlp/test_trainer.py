"""transformers' ``Trainer.train()`` on MindNLP 0.5.1 (MindSpore 2.7.0) under
``mon.watch()``: one step per optimizer update (mindtorch's AdamW ``step()``), the
Trainer's loss (the sum of its micro-batch losses: each is divided by the accumulation
steps), grad_norm the accumulated gradient's before clipping against a float64 twin
(rtol 1e-3), micro_grad_norm the largest micro-batch's, the lr each update used (read
from ``param_groups``, the scheduler never called), grad_norm_clipped where clipped; and
training bit-identical to an unmonitored twin: weights and AdamW's ``exp_avg``,
``exp_avg_sq`` and ``step``. Accumulation 1 and 2, clipping on and off.

Both runs use the stand-in for MindNLP's two missing CPU kernels (``tests.mindnlp.support``:
mindtorch ``addcdiv``, and the ``axis=None`` norm inside ``clip_grad_norm_``).
"""

from __future__ import annotations

import warnings

import numpy as np
import pytest

from msmon_nb.config.checks import MonitorWarning
from msmon_nb.events.runs import load_run
from msmon_nb.monitor import Monitor
from tests.mindnlp.support import assert_identical, observe, state, trainer

UPDATES = 3
CLIP = 0.05  # below the tiny BERT's gradient norms (0.1-0.5): it clips on every update


def series(run, tag: str) -> tuple[list[int], np.ndarray]:
    got = run.scalars(tag)
    return got.steps.tolist(), np.asarray(got.values, dtype=np.float64)


@pytest.mark.parametrize(
    ("accumulate", "clip"), [(1, CLIP), (2, CLIP), (1, 0.0), (2, 0.0)], ids=str
)
def test_trainer_steps_are_updates_and_training_is_unchanged(tmp_path, accumulate, clip):
    twin = trainer(accumulate, clip, UPDATES, str(tmp_path / "twin"))
    ref = observe(twin)
    twin.train()
    logged = [h for h in twin.state.log_history if "loss" in h]

    monitored = trainer(accumulate, clip, UPDATES, str(tmp_path / "monitored"))
    with warnings.catch_warnings(record=True) as said:
        warnings.simplefilter("always")
        with Monitor(save_dir=str(tmp_path / "runs"), log_interval=1) as mon, mon.watch():
            monitored.train()
    assert_identical(state(monitored.model, monitored.optimizer), state(twin.model, twin.optimizer))

    run = load_run(mon.run_dir)
    steps = list(range(UPDATES))
    loss_steps, loss = series(run, "train/loss")
    assert loss_steps == steps, "one step per optimizer update"
    np.testing.assert_allclose(loss, ref.loss, rtol=1e-6)
    # the Trainer's own log (4 decimals): the same loss
    np.testing.assert_allclose(loss, [h["loss"] for h in logged], atol=6e-5)
    norm_steps, norm = series(run, "train/grad_norm")
    assert norm_steps == steps
    assert min(ref.grad_norm) > 0.01, ref.grad_norm  # (a gradient to compare with)
    np.testing.assert_allclose(norm, ref.grad_norm, rtol=1e-3)
    lr_steps, lr = series(run, "train/learning_rate")
    assert lr_steps == steps
    np.testing.assert_allclose(lr, ref.lr, rtol=1e-7)  # (summaries hold float32)
    assert lr[0] == 0.0 and lr[1] > lr[2] > 0, "warmup, then linear decay, update by update"
    np.testing.assert_allclose(lr, [h["learning_rate"] for h in logged], rtol=1e-7)
    if clip:
        clipped_steps, clipped = series(run, "train/grad_norm_clipped")
        assert clipped_steps == steps
        assert np.all(np.asarray(ref.grad_norm) > clip), "the test means to clip every update"
        np.testing.assert_allclose(clipped, ref.clipped, rtol=1e-3)
        # the norm clip_grad_norm_ returned is the one the Trainer logs
        np.testing.assert_allclose(norm, [h["grad_norm"] for h in logged], rtol=1e-6)
    else:
        assert "train/grad_norm_clipped" not in run.tags
    if accumulate > 1:
        micro_steps, micro = series(run, "train/micro_grad_norm")
        assert micro_steps == steps
        np.testing.assert_allclose(micro, ref.micro, rtol=1e-3)
    else:
        assert "train/micro_grad_norm" not in run.tags
    ours = [str(w.message) for w in said if issubclass(w.category, MonitorWarning)]
    assert ours == [], ours
