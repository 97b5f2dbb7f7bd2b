"""Which observed norm is ``train/grad_norm``, and what else a step's gradients say.

A train step can show its gradients in up to three places: where they are produced
(a PyNative ``value_and_grad``: loss scale still in them), where a clip function
receives them (before clipping), and where the optimizer receives them (after clipping,
or accumulated, and scaled by the optimizer's own ``loss_scale`` if it has one). The
ways in (``collect.watch``, ``collect.callback``) report what they saw as a
``GradSeen``; ``resolve`` applies the contract of docs/ARCHITECTURE.md (Tags):

* ``train/grad_norm``: the gradient as the model produced it, every loss scale undone,
  before clipping; with gradient accumulation, the accumulated gradient on the step the
  optimizer applies it. Never a clipped or scaled value: where only such a value exists,
  nothing is recorded under this tag and ``note`` says why (warned once).
* ``train/grad_norm_clipped``: what the optimizer received, where the step clipped.
* ``train/micro_grad_norm``: the largest gradient norm of the step's micro-batches, where
  the step accumulated over several (before any clipping), or the one micro-batch a
  graph train cell added into its accumulation buffer in this step.
* ``train/loss_scale``, ``train/overflow`` (1 on a step whose loss-scaled gradients
  overflowed, whose update the step skipped; 0 on the others): where a loss scale is used.

No MindSpore here: the ways in turn tensors into numbers first.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

from msmon_nb.collect.tensors import to_float

GRAD_NORM = "train/grad_norm"
CLIPPED = "train/grad_norm_clipped"
MICRO = "train/micro_grad_norm"
LOSS_SCALE = "train/loss_scale"
OVERFLOW = "train/overflow"

SPARSE = (
    "the optimizer receives sparse gradients (a RowTensor, e.g. from "
    "nn.EmbeddingLookup(sparse=True)): they pass to it untouched and their norm is not "
    "measured, so train/grad_norm is not recorded for this step; "
    "return it from your step (mm.global_norm of dense gradients) or use mon.step(grad_norm=...)"
)

MICRO_UNSEEN = (
    "this train cell accumulates micro-batch gradients inside its graph (its optimizer "
    "runs every few steps) and no micro-batch's gradient leaves the graph: "
    "train/micro_grad_norm is not recorded; train/grad_norm is the accumulated gradient's "
    "norm on the steps that apply it"
)

SEVERAL_UNTOLD = (
    "each step calls {calls} optimizers inside one call of yours (a train cell or jit "
    "step that steps a GAN's discriminator and generator, or an actor and a critic), and "
    "the monitor cannot tell which gradient belongs to which ({why}): train/loss, "
    "grad_norm and learning_rate are not recorded (throughput and step time are); call "
    "each network's train cell or optimizer from Python in the loop, and each gets its "
    "own opt/<name>/... series"
)

PER_MICRO_CLIP = (
    "this step clips each micro-batch's gradients before accumulating them, so the "
    "accumulated gradient before clipping never exists: train/grad_norm is not recorded; "
    "train/micro_grad_norm holds each micro-batch's norm before clipping and "
    "train/grad_norm_clipped the accumulated gradient the optimizer received"
)


@dataclass
class GradSeen:
    """What one finished step showed of its gradients (norms already unscaled where
    the scale was known; None where not seen)."""

    produced: float | None = None  # as produced, loss scale undone, before any clipping
    produced_later: bool = False  # produced gradients exist; the recorder takes their norm
    clip_input: float | None = None  # what the step's clip calls received
    received: float | None = None  # what the optimizer received, its loss_scale undone
    received_each: Any = None  # each of its gradients' norms (numpy), as ``received``
    optimizer_ran: bool = False
    micro: list[float] = field(default_factory=list)  # each micro-batch's produced norm
    # the gradient a graph step added into its accumulation buffer (MindSpore's boost
    # accumulation op: MindCV, mindone), unscaled: that step's micro-batch
    micro_in_graph: float | None = None
    accumulating: bool = False  # the optimizer got a gradient summed over micro-batches
    overflow: bool | None = None  # None: no overflow check ran this step
    loss_scale: float | None = None
    sparse: bool = False  # the optimizer got sparse gradients, passed on unmeasured
    # (optimizer fingerprint, norm) of each optimizer call inside the step's graph where
    # there were several (``graph.OptimizerTap.read_calls``)
    calls: list[tuple[int, float]] = field(default_factory=list)


@dataclass(frozen=True)
class Resolved:
    """The tags a step's gradients give, and why grad_norm is absent if it is."""

    grad_norm: float | None
    values: dict[str, float]
    note: str | None = None
    source: str | None = None  # produced / clip / received: where grad_norm comes from
    # several optimizers stepped inside the step's one graph: its loss and lr are not
    # the step's either (the way in drops them)
    mixed: bool = False


def resolve(seen: GradSeen, *, clip_per_micro: bool = False) -> Resolved:
    """Apply the contract to one step. ``clip_per_micro``: the loop is known to clip
    micro-batches before accumulating (``StepPattern`` finds out)."""
    if len({key for key, _ in seen.calls}) > 1:  # several optimizers: collect.several
        return Resolved(None, {}, mixed=True)
    values: dict[str, float] = {}
    if seen.loss_scale is not None:
        values[LOSS_SCALE] = seen.loss_scale
    if seen.overflow is not None:
        values[OVERFLOW] = 1.0 if seen.overflow else 0.0
    if seen.overflow:
        return Resolved(None, values)  # inf/nan by construction: the step skipped it
    if len(seen.micro) > 1:
        values[MICRO] = max(seen.micro)
    elif seen.micro_in_graph is not None:  # (after a clip of each micro-batch, if any)
        values[MICRO] = seen.micro_in_graph
    if seen.clip_input is not None:
        if seen.optimizer_ran and seen.received is not None:
            values[CLIPPED] = seen.received
        if clip_per_micro or not seen.optimizer_ran:
            values[MICRO] = max(seen.clip_input, values.get(MICRO, 0.0))
            return Resolved(None, values, PER_MICRO_CLIP if clip_per_micro else None)
        return Resolved(seen.clip_input, values, source="clip")
    if seen.accumulating or len(seen.micro) > 1:
        if seen.produced is not None and MICRO not in values:
            values[MICRO] = seen.produced
        # only the graph's accumulated gradient was seen: say why no micro-batch norm
        unseen = None if MICRO in values or seen.produced_later else MICRO_UNSEEN
        if seen.optimizer_ran:  # the accumulated gradient, on the step that applies it
            return Resolved(seen.received, values, unseen, source="received")
        return Resolved(None, values, unseen)
    if seen.produced is not None or seen.produced_later:
        return Resolved(seen.produced, values, source="produced")
    if seen.optimizer_ran:
        return Resolved(seen.received, values, source="received")
    return Resolved(None, values, SPARSE if seen.sparse else None)


def param_norms(
    seen: GradSeen, grad_norm: float | None, names: Sequence[str]
) -> tuple[Sequence[str], Any] | None:
    """``(names, norms)``: each gradient's norm as the optimizer received it, brought to
    ``train/grad_norm``'s measure (``grad_norm``, this step's resolved value): times
    ``grad_norm / received``. Exact where the two differ by one factor over every
    gradient -- a clip by global norm, a loss scale -- which is how train steps clip and
    scale; None where either norm is missing or the names do not match."""
    each, received = seen.received_each, seen.received
    if each is None or grad_norm is None or not received or not names:
        return None
    if len(names) != len(each):
        return None
    factor = grad_norm / received
    if factor != 1.0 and math.isfinite(factor) and factor > 0:
        each = each * factor
    return names, each


def scaling_artifact(values: dict[str, float], loss: Any) -> bool:
    """True when ``loss`` is +Inf only because the loss scale overflowed it: on an
    overflow step, scaled by more than 1. The loop then returns ``unscale(scale(loss))``
    = Inf for a finite loss; the step skipped its update and the next one retries at a
    lower scale, so it is no NaN/Inf alert. A NaN loss, or an Inf at scale 1, is the
    model's own and is recorded. (The loss is read only on such steps.)"""
    if values.get(OVERFLOW) != 1.0 or values.get(LOSS_SCALE, 1.0) <= 1.0 or loss is None:
        return False
    return to_float(loss) == float("inf")


class StepPattern:
    """How a loop shapes its steps, learnt from call counts over the run (the steps in
    between collected ones included):

    * ``accumulating``: steps that called no optimizer and were not skipped for an
      overflow (MindCV's or MindOCR's train step with ``gradient_accumulation_steps``:
      the optimizer runs on every M-th step);
    * ``per_micro_clip``: clipping on steps that apply no update. MindCV clips each
      micro-batch before accumulating it; MindOCR and MindYOLO clip what the optimizer
      gets. Seen directly on a collected step that clipped without an optimizer call, or
      across uncollected steps when they clipped more often per update than a collected
      update step does (clip calls per step vary: ``nn.ClipByNorm`` runs once a tensor).
    """

    def __init__(self) -> None:
        self.accumulating = False
        self.per_micro_clip = False
        self._totals = [0, 0, 0]  # steps, optimizer calls, skipped updates
        self._clips_per_update: float | None = None  # on a collected update step

    def update(self, steps: int, clip_calls: int, optimizer_calls: int, skipped: int) -> None:
        """Counts over ``steps`` steps since the last update (``steps == 1``: a
        collected step of its own)."""
        totals = self._totals
        totals[0] += steps
        totals[1] += optimizer_calls
        totals[2] += skipped
        if totals[1] > 0 and totals[1] + totals[2] < totals[0]:
            self.accumulating = True
        updates = optimizer_calls + skipped
        if steps == 1:
            if clip_calls and not updates:
                self.per_micro_clip = True
            elif clip_calls and updates:
                self._clips_per_update = clip_calls / updates
        elif updates and clip_calls and self._clips_per_update is not None:
            self.per_micro_clip |= clip_calls / updates > self._clips_per_update
