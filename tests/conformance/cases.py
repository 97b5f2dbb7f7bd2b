"""The matrix's cases: every optimizer x every loop shape at the default, plus an
all-pairs cover of lr form, loop shape, scaling/clipping, collection frequency,
precision and one optimizer of each family; who undoes the loss scale over every MindCV
and mindone optimizer name; the cases randomised runs once found (kept for good); and
the draw of the randomised test (``drawn``)."""

from __future__ import annotations

import hashlib
from itertools import product

from tests.conformance.harness import (
    FREQS,
    HOST,
    LOOPS,
    LR_FORMS,
    PRECISIONS,
    SCALINGS,
    TRAINER,
    Case,
    default_lr,
    supported,
)
from tests.conformance.optimizers import BUILD
from tests.conformance.pairwise import all_pairs

# one optimizer per way an optimizer holds its lr and state: MindSpore's own (a momentum
# and an Adam: beta powers), MindCV's (get_lr moves global_step), mindone's default (the
# same class, built by its factory), the experimental/mint API (lrs per group)
FAMILIES = (
    "nn.Momentum", "nn.Adam", "mindcv:adamw", "mindone:adamw_re", "experimental.optim.AdamW"
)  # fmt: skip
PAIRWISE_AXES = (FAMILIES, LOOPS, LR_FORMS, SCALINGS, FREQS, PRECISIONS)


def default_cases() -> list[Case]:
    cases = [Case(name, loop, default_lr(name)) for name in sorted(BUILD) for loop in LOOPS]
    return [c for c in cases if supported(c)]


def _pairwise_case(row: tuple) -> Case:
    name, loop, lr, scaling, freq, precision = row
    return Case(name, loop, lr, scaling, freq, precision=precision)


def pairwise_cases() -> list[Case]:
    rows, _ = all_pairs(PAIRWISE_AXES, lambda row: supported(_pairwise_case(row)))
    return [_pairwise_case(row) for row in rows]


def impossible_pairs() -> set:
    return all_pairs(PAIRWISE_AXES, lambda row: supported(_pairwise_case(row)))[1]


# the suites' optimizer names: every one MindCV's and mindone's factories accept and the
# matrix trains (optimizers.BUILD)
SUITE_NAMES = tuple(n for n in sorted(BUILD) if n.startswith(("mindcv:", "mindone:")))
UNDO_LOOPS = ("cell", "model")  # where a train cell's sens or a trainer exists
# MindCV's optimizers by how they undo their loss_scale: nn.Optimizer's scale_grad (sgd),
# their own reciprocal_scale (adamw, lion), not at all (nadam)
BY_HAND = ("mindcv:sgd", "mindcv:adamw", "mindcv:lion", "mindcv:nadam")


def undo_cases() -> list[Case]:
    """Who undoes the loss scale, over every MindCV and mindone optimizer name.

    MindCV's names take ``create_optimizer(loss_scale=S)``, and the optimizer undoes it
    (``nn.Optimizer``'s ``scale_grad``, or its own ``construct`` as AdamW and Lion, or
    nowhere, as NAdam): each name under MindCV's trainer (``create_trainer``, fixed scale,
    ``drop_overflow_update=False``: ``Model`` builds ``TrainOneStepCell(sens=S)``), and
    that cell driven by hand (``optscale``) for one optimizer of each way of undoing it
    (``BY_HAND``). In the ``drop_overflow_update=True`` form
    the cell undoes it and the optimizer gets 1 (``trainer_drop``): the optimizer's own
    undoing never runs, so once per loop, over the two that undo it their own way.
    mindone's factory takes no ``loss_scale``: its names can only have a cell undo it
    (``static``), each once, in a cell or ``Model`` by turns. (The cell's and the amp
    scaler's undoing over every loop, lr form and precision: ``pairwise_cases``.)"""
    out: list[Case] = []
    for i, name in enumerate(SUITE_NAMES):
        lr = default_lr(name)
        if BUILD[name].mindcv:
            out.append(Case(name, "model", lr, "trainer"))
            if name in BY_HAND:
                out.append(Case(name, "cell", lr, "optscale"))
        else:
            out.append(Case(name, UNDO_LOOPS[i % 2], lr, "static"))
    out += [
        Case("mindcv:adamw", "model", "list", "trainer_drop"),
        Case("mindcv:lion", "cell", "list", "trainer_drop"),
    ]
    assert all(supported(c) for c in out)
    return out


def host_cases() -> list[Case]:
    """A jit step per micro-batch that returns its gradients and holds no optimizer, the
    host accumulating and calling the optimizer (MindYOLO's ``ms_jit`` Trainer with
    ``accumulate=2``): every family, collected every step and every 3rd. Before the
    watch held such calls, the first micro-batch was recorded as a step of its own."""
    cases = [Case(name, "jit", default_lr(name), HOST[0], freq)
             for name in FAMILIES for freq in FREQS]  # fmt: skip
    assert all(supported(c) for c in cases)
    return cases


# every failure the randomised test ever found, fixed and kept here
FOUND: list[Case] = [
    # an experimental-API optimizer (lr Parameters only the host reads) in a jit loop
    # whose lr is set by hand between steps: read when the jit step ended, which is when
    # the next one began, it was the next step's lr
    Case("experimental.optim.ASGD", "jit", "parameter", "none", 1),
    # the first float16 draw: a clipped O3 cell's grad_norm 0.32% from the PyNative
    # float64 twin's, float16 rounding in the two runs' gradients (not the monitor's): the
    # check's tolerance under O2/O3 is float16's
    Case("mint.optim.Adam", "cell", "parameter", "clip", 3, precision="O3"),
]


def inside_cases() -> list[Case]:
    """The monitor recording the inside of the model (``harness.INSIDE``: activations
    and their gradients, max |x|, non-finite counts and zero shares of weights,
    gradients and moments): every family in every loop shape, collected every 3rd step,
    so that both the hooked and the unhooked steps are compared."""
    cases = [Case(name, loop, default_lr(name), freq=3, inside=True)
             for name in FAMILIES for loop in LOOPS]  # fmt: skip
    return [c for c in cases if supported(c)]


def matrix() -> set[Case]:
    """Every case the matrix trains (the draws leave these out)."""
    return {
        *default_cases(), *pairwise_cases(), *undo_cases(), *host_cases(), *inside_cases(), *FOUND
    }  # fmt: skip


def rank(case: Case, salt: str = "") -> str:
    """A case's place in every draw: a hash of its id, so that it does not move when the
    table around it grows (a new case can only rank before it or after it)."""
    return hashlib.sha256(f"{salt}{case.id}".encode()).hexdigest()


def space() -> list[Case]:
    """Every case that can exist over all the axes at once (no suite cells)."""
    axes = (sorted(BUILD), LOOPS, LR_FORMS, (*SCALINGS, *TRAINER, *HOST), FREQS, PRECISIONS)
    cases = (
        Case(name, loop, lr, scaling, freq, precision=precision)
        for name, loop, lr, scaling, freq, precision in product(*axes)
    )
    return [c for c in cases if supported(c)]


def drawn(count: int, salt: str = "") -> list[Case]:
    """The first ``count`` cases by ``rank`` that the matrix does not already train."""
    trained = matrix()
    fresh = [c for c in space() if c not in trained]
    return sorted(fresh, key=lambda c: rank(c, salt))[:count]
