"""The activation-rules set (issue 45 item 4) as frozen in bench/data/actrules_curves.json.gz,
and what the guide claims of it (``bench/actrules.py``'s own scoring): every fault is found
by the rule made for it, at or after the fault's step, naming the module the fault is in;
a NaN's origin at the very step; a dead layer within ``patience`` steps."""

from __future__ import annotations

from dataclasses import asdict

import pytest

from bench.actrules import EXPECT, FROZEN, alerts, diverged, judge, thaw
from bench.actrules_runs import STEPS, specs

# (activation alerts on the healthy runs, stray activation alerts on the failing ones), as
# docs/guide/alerts.md reports them
HEALTHY_AND_STRAY = (0, 0)


@pytest.fixture(scope="module")
def frozen():
    return [(spec, rec, alerts(rec)) for spec, rec in thaw(FROZEN)]


def test_the_file_holds_exactly_the_generators_runs(frozen):
    assert [asdict(s) for s, _, _ in frozen] == [asdict(s) for s in specs()]
    for _, rec, _ in frozen:
        assert len(rec["loss"]) == STEPS
        assert all(len(v) == len(rec["modules"]) for v in rec["act"].values())


def test_each_fault_did_what_its_kind_says(frozen):
    """The set is what it claims: the faulty module's series moved at the fault."""
    for spec, rec, _ in frozen:
        if not spec.fails:
            continue
        i = rec["modules"].index(spec.culprit)
        at = spec.at
        if spec.kind == "nan":
            bad = [m for m, v in zip(rec["modules"], rec["act"]["nonfinite"], strict=True) if v[at]]
            assert bad == [spec.culprit], spec.name  # only it, at the fault's step
            assert all(v[at - 1] == 0 for v in rec["act"]["nonfinite"]), spec.name
        elif spec.kind == "dying":
            zf = rec["act"]["zero_frac"][i]
            assert max(zf[:at]) < 0.9 and min(zf[at:]) > 0.95, spec.name
        else:  # an lr ramp: the module's max |activation| grows x5 past its level
            top = rec["act"]["max_abs"][i]
            assert max(top[at:]) > 5 * max(top[:at]), spec.name
        if spec.kind == "head_lr":
            assert diverged(rec["loss"]) is not None, spec.name


def test_every_fault_is_found_by_its_rule_naming_the_faulty_module(frozen):
    for spec, _, found in frozen:
        if not spec.fails:
            continue
        got = judge(spec, found)
        ours = got["ours"]
        assert ours is not None, spec.name
        assert got["named"] == spec.culprit, spec.name
        assert ours.tag.startswith(f"act/{spec.culprit}/"), spec.name
        assert spec.at <= ours.since_step <= ours.step, spec.name
        if spec.kind == "nan":
            assert ours.step == ours.since_step == spec.at  # exact
            assert ours.severity == "critical"
        if spec.kind == "dying":
            assert ours.since_step == spec.at and ours.step <= spec.at + 1  # patience 2


def test_the_nan_origin_is_named_where_the_loss_rule_only_says_nan(frozen):
    """The loss's ``nonfinite`` alert fires at the same step; only ours names the module."""
    for spec, _, found in frozen:
        if spec.kind != "nan":
            continue
        loss_nan = [a for a in found if a.kind == "nonfinite"]
        assert loss_nan and loss_nan[0].step == spec.at, spec.name
        assert spec.culprit not in loss_nan[0].message, spec.name


def test_false_alarms_are_what_the_guide_reports(frozen):
    """The guide's count of activation alerts on healthy runs and stray ones on failing
    runs; a change to a rule that moves them must update the guide."""
    healthy = [(s.name, a.kind, a.step) for s, _, f in frozen if not s.fails for a in f]
    stray = [
        (s.name, a.kind, a.step) for s, _, f in frozen if s.fails for a in judge(s, f)["stray"]
    ]
    assert all(kind in EXPECT.values() for _, kind, _ in healthy)  # the other rules: none
    assert (len(healthy), len(stray)) == HEALTHY_AND_STRAY
