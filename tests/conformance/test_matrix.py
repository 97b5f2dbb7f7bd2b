"""Monitoring never touches training, checked over the space users draw from: every
optimizer x every loop shape, and an all-pairs cover of the other axes (``cases.py``);
each case trains twice and compares (``harness.check``)."""

from __future__ import annotations

import pytest

from tests.conformance.cases import (
    FAMILIES,
    FOUND,
    default_cases,
    impossible_pairs,
    pairwise_cases,
)
from tests.conformance.harness import LR_FORMS, check, run_case
from tests.conformance.optimizers import BUILD

DEFAULT = default_cases()
PAIRWISE = [c for c in pairwise_cases() if c not in DEFAULT]


@pytest.mark.parametrize("case", DEFAULT, ids=lambda c: c.id)
def test_every_optimizer_in_every_loop(case, tmp_path):
    plain, monitored = run_case(case, tmp_path)
    check(case, plain, monitored)


@pytest.mark.parametrize("case", PAIRWISE, ids=lambda c: c.id)
def test_all_pairs_of_lr_form_loop_scaling_frequency(case, tmp_path):
    plain, monitored = run_case(case, tmp_path)
    check(case, plain, monitored)


@pytest.mark.parametrize("case", FOUND, ids=lambda c: c.id)
def test_cases_randomised_runs_found(case, tmp_path):
    plain, monitored = run_case(case, tmp_path)
    check(case, plain, monitored)


def test_the_cover_misses_only_pairs_no_case_can_hold():
    """The only pairs left out are an optimizer with an lr form it rejects, and the
    experimental API's optimizers under ``Model`` (which refuses them)."""
    expected = {
        (0, name, 2, form)
        for name in FAMILIES
        for form in LR_FORMS
        if form not in BUILD[name].forms
    }
    # Model takes nn.Optimizer only
    expected |= {(0, n, 1, "model") for n in FAMILIES if BUILD[n].family == "experimental"}
    assert impossible_pairs() == expected
