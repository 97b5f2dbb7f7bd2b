"""The "converged, then broken" set (issue 43) as frozen in bench/data/relapse_curves.json.gz:
the runs its generator specifies, real training (a run retrained now matches), controls
at their floor when the break comes, and each broken run its control until then."""

from __future__ import annotations

import math
import statistics
from dataclasses import asdict

import pytest

from bench.detect_score import blowup_step
from bench.relapse import twin_blowup
from bench.relapse_data import thaw
from bench.relapse_runs import FAILURES, STEPS, specs, train


@pytest.fixture(scope="module")
def frozen():
    return thaw()


def test_the_file_holds_exactly_the_generators_runs(frozen):
    assert [asdict(s) for s, _ in frozen] == [asdict(s) for s in specs()]
    for spec, rec in frozen:
        assert len(rec["loss"]) == len(rec["grad_norm"]) == len(rec["lr"]) == STEPS
        assert bool(rec["opt"]) == spec.opt.startswith("adam"), spec.name


def test_every_kind_breaks_every_base_and_the_bases_cover_the_issue(frozen):
    controls = [s for s, _ in frozen if s.failure is None]
    assert len(controls) == 8
    for control in controls:
        base = control.name.removesuffix("-control")
        kinds = sorted(s.failure for s, _ in frozen if s.name.startswith(base + "-") and s.failure)
        assert kinds == sorted(FAILURES), base
    assert {s.opt for s in controls} >= {"sgd", "momentum", "adam", "adamw"}
    assert {s.model for s in controls} >= {"mlp", "conv", "transformer"}
    assert sum("pretrain" in s.extra for s in controls) >= 2  # fine-tuning converged weights
    assert sum(s.extra.get("samples") == 64 for s in controls) >= 4  # memorisation


def test_each_break_comes_after_its_control_converged_and_matches_it_until_then(frozen):
    """Before ``at`` a broken run is its control, value for value; at ``at`` the control's
    loss (median of the 50 steps before) is at most 5 % of where it started."""
    by_name = {s.name: r for s, r in frozen}
    for spec, rec in frozen:
        if spec.failure is None:
            continue
        control = by_name[spec.name.removesuffix("-" + spec.failure) + "-control"]
        at = spec.at
        assert spec.onset == at
        assert rec["loss"][:at] == control["loss"][:at], spec.name
        assert rec["grad_norm"][:at] == control["grad_norm"][:at], spec.name
        assert rec["loss"][at:] != control["loss"][at:], spec.name
        loss = control["loss"]
        start = max(loss[0], statistics.median(loss[:15]))
        assert statistics.median(loss[at - 50 : at]) <= 0.05 * start, spec.name


def test_a_retrained_run_matches_the_frozen_curves(frozen):
    spec, rec = next((s, r) for s, r in frozen if s.name == "rl-regress-mlp-momentum-s431-control")
    fresh = train(spec)
    assert fresh["lr"] == rec["lr"]
    for what in ("loss", "grad_norm"):
        for step, (a, b) in enumerate(zip(rec[what], fresh[what], strict=True)):
            if math.isnan(a) and math.isnan(b):
                continue
            assert math.isclose(a, b, rel_tol=1e-4, abs_tol=1e-7), (what, step, a, b)


def test_at_a_floor_one_lucky_batch_is_no_measure_of_a_blow_up(frozen):
    """Why the set's blow-up point is 10x the unbroken control's loss (``relapse.
    twin_blowup``), not 10x the best batch before the break: by that measure the
    unbroken controls themselves "blew up" within 3 steps of 19 of the 48 breaks."""
    controls = {s.name.removesuffix("-control"): r for s, r in frozen if s.failure is None}
    early = 0
    for spec, _ in frozen:
        if spec.failure:
            twin = controls[spec.name.removesuffix("-" + spec.failure)]["loss"]
            step = blowup_step(spec, twin)
            early += step is not None and step <= spec.at + 3
    assert early == 19
    blowup = twin_blowup(frozen)
    for spec, rec in frozen:
        if spec.failure:
            step = blowup(spec, rec["loss"])
            assert step is None or step >= spec.at + 2, spec.name  # a 5-step median's delay
