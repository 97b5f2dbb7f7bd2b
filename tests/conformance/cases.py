"""The matrix's cases: every optimizer x every loop shape at the default, plus an
all-pairs cover of lr form, loop shape, scaling/clipping, collection frequency and one
optimizer of each family; and the cases randomised runs once found (kept for good)."""

from __future__ import annotations

from tests.conformance.harness import FREQS, LOOPS, LR_FORMS, SCALINGS, Case, default_lr, supported
from tests.conformance.optimizers import BUILD
from tests.conformance.pairwise import all_pairs

# one optimizer per way an optimizer holds its lr and state: MindSpore's own (a momentum
# and an Adam: beta powers), MindCV's (get_lr moves global_step), mindone's default (the
# same class, built by its factory), the experimental/mint API (lrs per group)
FAMILIES = (
    "nn.Momentum", "nn.Adam", "mindcv:adamw", "mindone:adamw_re", "experimental.optim.AdamW"
)  # fmt: skip


def default_cases() -> list[Case]:
    cases = [Case(name, loop, default_lr(name)) for name in sorted(BUILD) for loop in LOOPS]
    return [c for c in cases if supported(c)]


def pairwise_cases() -> list[Case]:
    axes = (FAMILIES, LOOPS, LR_FORMS, SCALINGS, FREQS)
    rows, _ = all_pairs(axes, lambda row: supported(Case(*row)))
    return [Case(*row) for row in rows]


def impossible_pairs() -> set:
    axes = (FAMILIES, LOOPS, LR_FORMS, SCALINGS, FREQS)
    return all_pairs(axes, lambda row: supported(Case(*row)))[1]


# every failure the randomised test ever found, fixed and kept here
FOUND: list[Case] = [
    # an experimental-API optimizer (lr Parameters only the host reads) in a jit loop
    # whose lr is set by hand between steps: read when the jit step ended, which is when
    # the next one began, it was the next step's lr
    Case("experimental.optim.ASGD", "jit", "parameter", "none", 1),
]
