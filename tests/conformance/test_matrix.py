"""Monitoring never touches training, checked over the space users draw from: every
optimizer x every loop shape, an all-pairs cover of the other axes, and who undoes the
loss scale over every MindCV and mindone optimizer name (``cases.py``); each case trains
twice and compares (``harness.check``)."""

from __future__ import annotations

import pytest

from tests.conformance.cases import (
    BY_HAND,
    FAMILIES,
    FOUND,
    default_cases,
    host_cases,
    impossible_pairs,
    inside_cases,
    pairwise_cases,
    undo_cases,
)
from tests.conformance.harness import LOOPS, LR_FORMS, check, run_case
from tests.conformance.optimizers import BUILD

DEFAULT = default_cases()
PAIRWISE = [c for c in pairwise_cases() if c not in DEFAULT]
UNDO = [c for c in undo_cases() if c not in DEFAULT and c not in PAIRWISE]


@pytest.mark.parametrize("case", DEFAULT, ids=lambda c: c.id)
def test_every_optimizer_in_every_loop(case, tmp_path):
    plain, monitored = run_case(case, tmp_path)
    check(case, plain, monitored)


@pytest.mark.parametrize("case", PAIRWISE, ids=lambda c: c.id)
def test_all_pairs_of_lr_form_loop_scaling_frequency_precision(case, tmp_path):
    plain, monitored = run_case(case, tmp_path)
    check(case, plain, monitored)


@pytest.mark.parametrize("case", UNDO, ids=lambda c: c.id)
def test_who_undoes_the_loss_scale_for_every_suite_optimizer(case, tmp_path):
    plain, monitored = run_case(case, tmp_path)
    check(case, plain, monitored)


@pytest.mark.parametrize("case", host_cases(), ids=lambda c: c.id)
def test_a_jit_step_returning_gradients_the_host_accumulates(case, tmp_path):
    plain, monitored = run_case(case, tmp_path)
    check(case, plain, monitored)


@pytest.mark.parametrize("case", inside_cases(), ids=lambda c: c.id)
def test_recording_the_inside_of_the_model_never_changes_training(case, tmp_path):
    plain, monitored = run_case(case, tmp_path)
    check(case, plain, monitored)
    tags = set(monitored.run.tags())
    assert any(t.startswith("param/") and t.endswith("_zero_frac") for t in tags), case.id
    assert any(t.startswith("act/") for t in tags), case.id
    if case.loop == "pynative":  # hooks run there; compiled steps record no act_grad
        assert any(t.startswith("act_grad/") for t in tags), case.id


@pytest.mark.parametrize("case", FOUND, ids=lambda c: c.id)
def test_cases_randomised_runs_found(case, tmp_path):
    plain, monitored = run_case(case, tmp_path)
    check(case, plain, monitored)


def test_the_cover_misses_only_pairs_no_case_can_hold():
    """The only pairs left out are an optimizer with an lr form it rejects, the
    experimental API's optimizers under ``Model`` (which refuses them), the optimizer's
    own ``loss_scale`` where it has none or where no train cell hands it a scaled
    gradient (function loops), and a dynamic scale of 2**120 in float16."""
    expected = {
        (0, name, 2, form)
        for name in FAMILIES
        for form in LR_FORMS
        if form not in BUILD[name].forms
    }
    # Model takes nn.Optimizer only
    expected |= {(0, n, 1, "model") for n in FAMILIES if BUILD[n].family == "experimental"}
    expected |= {(0, n, 3, "optscale") for n in FAMILIES if not BUILD[n].loss_scale}
    expected |= {(1, loop, 3, "optscale") for loop in LOOPS if loop in ("pynative", "jit")}
    expected |= {(3, "dynamic", 5, amp) for amp in ("O2", "O3")}
    assert impossible_pairs() == expected


def test_who_undoes_covers_every_suite_name_and_both_trainer_forms():
    cases = undo_cases()
    names = {n for n in BUILD if n.startswith(("mindcv:", "mindone:"))}
    assert {c.optimizer for c in cases} == names
    mindcv = {n for n in names if n.startswith("mindcv:")}
    assert {c.optimizer for c in cases if c.scaling == "trainer"} == mindcv
    assert {c.optimizer for c in cases if c.scaling == "optscale"} == set(BY_HAND)
    assert {c.loop for c in cases if c.scaling == "trainer_drop"} == {"cell", "model"}
    print(f"who undoes the scale: {len(cases)} cases, {len(UNDO)} not already in the matrix")
