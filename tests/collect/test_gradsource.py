"""collect.gradsource: which observed norm is train/grad_norm (pure logic, no MindSpore)."""

from __future__ import annotations

from msmon_nb.collect.gradsource import (
    CLIPPED,
    LOSS_SCALE,
    MICRO,
    OVERFLOW,
    PER_MICRO_CLIP,
    GradSeen,
    StepPattern,
    resolve,
    scaling_artifact,
)


def test_clip_input_wins_and_clipped_is_what_the_optimizer_got():
    got = resolve(GradSeen(produced=9.0, clip_input=9.0, received=1.0, optimizer_ran=True))
    assert got.grad_norm == 9.0 and got.source == "clip"
    assert got.values == {CLIPPED: 1.0}


def test_overflow_step_has_no_grad_norm_but_says_so():
    got = resolve(
        GradSeen(received=float("inf"), optimizer_ran=False, overflow=True, loss_scale=2.0**16)
    )
    assert got.grad_norm is None and got.source is None
    assert got.values == {OVERFLOW: 1.0, LOSS_SCALE: 65536.0}


def test_accumulation_records_the_applied_gradient_and_the_largest_micro_batch():
    seen = GradSeen(produced=3.0, received=2.5, optimizer_ran=True, micro=[4.0, 3.0])
    got = resolve(seen)
    assert got.grad_norm == 2.5 and got.values == {MICRO: 4.0}
    # a micro-step without an update: its own norm, no grad_norm
    got = resolve(GradSeen(produced=4.0, accumulating=True))
    assert got.grad_norm is None and got.values == {MICRO: 4.0}


def test_per_micro_clipping_records_no_grad_norm():
    seen = GradSeen(clip_input=7.0, received=0.5, optimizer_ran=True)
    got = resolve(seen, clip_per_micro=True)
    assert got.grad_norm is None and got.note == PER_MICRO_CLIP
    assert got.values == {MICRO: 7.0, CLIPPED: 0.5}


def test_produced_later_leaves_the_norm_to_the_recorder():
    got = resolve(GradSeen(produced_later=True, received=1.0, optimizer_ran=True))
    assert got.grad_norm is None and got.source == "produced"


def test_pattern_tells_accumulation_and_where_clipping_happens():
    mindcv = StepPattern()  # clip every micro-batch, optimizer every 2nd
    mindcv.update(1, clip_calls=1, optimizer_calls=0, skipped=0)
    assert mindcv.per_micro_clip
    mindocr = StepPattern()  # clip with the optimizer, seen only on update steps
    mindocr.update(1, clip_calls=1, optimizer_calls=1, skipped=0)
    mindocr.update(9, clip_calls=4, optimizer_calls=4, skipped=0)
    assert mindocr.accumulating and not mindocr.per_micro_clip
    per_tensor = StepPattern()  # nn.ClipByNorm: 6 calls a step, every step an update
    per_tensor.update(1, clip_calls=6, optimizer_calls=1, skipped=0)
    per_tensor.update(9, clip_calls=54, optimizer_calls=9, skipped=0)
    assert not per_tensor.accumulating and not per_tensor.per_micro_clip
    hidden = StepPattern()  # collected steps are all update steps; the others clip too
    hidden.update(1, clip_calls=1, optimizer_calls=1, skipped=0)
    hidden.update(9, clip_calls=9, optimizer_calls=4, skipped=1)
    assert hidden.per_micro_clip


def test_only_an_inf_loss_made_by_the_scale_is_dropped():
    overflow = {OVERFLOW: 1.0, LOSS_SCALE: 1024.0}
    assert scaling_artifact(overflow, float("inf"))
    assert not scaling_artifact(overflow, float("nan"))  # the model's own
    assert not scaling_artifact({OVERFLOW: 1.0, LOSS_SCALE: 1.0}, float("inf"))
    assert not scaling_artifact({OVERFLOW: 0.0, LOSS_SCALE: 1024.0}, float("inf"))
    assert not scaling_artifact(overflow, 1.5)


def test_a_cell_without_a_buffer_skips_and_learns_nothing():
    """MindFormers' skip by global norm: a step that clips and calls no optimizer, in a
    cell that holds no accumulation buffer, is a skipped update. It is no micro-batch,
    and the steps after it are plain updates again (before: accumulating, clipping each
    micro-batch, for good)."""
    mf = StepPattern()
    mf.buffer = False
    mf.update(1, clip_calls=1, optimizer_calls=1, skipped=0)
    mf.update(1, clip_calls=1, optimizer_calls=0, skipped=0)  # the skipped step
    mf.update(9, clip_calls=9, optimizer_calls=7, skipped=0)  # two more among these
    assert not mf.accumulating and not mf.per_micro_clip
    got = resolve(GradSeen(clip_input=7.0, skipped=True, loss_scale=1024.0))
    assert got.grad_norm is None and got.note is None and got.source == "skipped"
    assert got.values == {LOSS_SCALE: 1024.0}  # no micro_grad_norm, no clipped norm
    update = resolve(GradSeen(clip_input=1.4, received=1.0, optimizer_ran=True))
    assert update.grad_norm == 1.4
    mindcv = StepPattern()  # a cell that holds one accumulates from its first step
    mindcv.buffer = True
    assert mindcv.accumulating
    mindcv.update(1, clip_calls=1, optimizer_calls=0, skipped=0)
    assert mindcv.per_micro_clip
