"""adam_v_stale on real series: the curves of real MindSpore Adam runs frozen by
bench/detect.py (``bench/data/detect_curves.json.gz``; tuning set only, the set the
rule's defaults were chosen on)."""

from __future__ import annotations

import math

import pytest

from bench.detect_data import thaw
from bench.detect_score import blowup_step, series
from msmon_nb.diagnose import Diagnoser, detect, diagnose, resolve_settings
from msmon_nb.diagnose.optim import AdamVStale, is_moment2_tag


@pytest.fixture(scope="module")
def tuning():
    return thaw()["tuning"]


def _stale(spec, rec, **settings):
    alerts = diagnose(series(spec, rec), {"adam_v_stale": settings} if settings else None)
    return [a for a in alerts if a.kind == "adam_v_stale"]


def test_warns_at_the_return_of_the_gradient_before_the_loss_spikes(tuning):
    spikes = [(s, r) for s, r in tuning if s.failure == "adam_spike"]
    assert len(spikes) >= 6
    leads = []
    for spec, rec in spikes:
        found = _stale(spec, rec)
        assert found, spec.name
        first = found[0]
        # nothing during the quiet stretch itself: v decaying is not yet a danger
        assert first.since_step >= spec.onset, (spec.name, first)
        if "ramp" in spec.extra:  # gradients back over 20-30 steps: within that ramp
            assert first.step < spec.onset + spec.extra["ramp"], (spec.name, first)
        else:  # at once: the step they come back or the next (a x0.03 quiet level
            # leaves less of a jump than x0.01)
            assert first.step <= spec.onset + 1, (spec.name, first)
        assert "stale" in first.message and "beta2" in first.message
        blow = blowup_step(spec, rec["loss"])
        if blow is not None:
            leads.append(blow - first.step)
    assert len(leads) >= 4 and min(leads) > 0, leads


def test_quiet_on_healthy_adam_runs(tuning):
    healthy = [(s, r) for s, r in tuning if s.failure is None and s.opt in ("adam", "adamw")]
    assert len(healthy) >= 10
    for spec, rec in healthy:
        assert rec["opt"], spec.name  # moment norms were recorded
        assert _stale(spec, rec) == [], spec.name


def test_a_lower_factor_does_fire_on_healthy_runs(tuning):
    """The default's margin is real: at factor 1.5 and z 1 the same healthy runs alarm."""
    healthy = [(s, r) for s, r in tuning if s.failure is None and s.opt in ("adam", "adamw")]
    assert sum(len(_stale(s, r, factor=1.5, z=1.0)) for s, r in healthy) > 0


def test_scale_free_and_summed_over_parameters(tuning):
    spec, rec = next((s, r) for s, r in tuning if s.name == "adam-spike-regress-s0")
    base = [(a.step, a.since_step) for a in _stale(spec, rec)]
    assert base
    # gradients x1000 (v x1e6): the same alerts at the same steps
    scaled = dict(rec, grad_norm=[g * 1e3 for g in rec["grad_norm"]])
    scaled["opt"] = {t: [v * 1e6 for v in vs] for t, vs in rec["opt"].items()}
    assert [(a.step, a.since_step) for a in _stale(spec, scaled)] == base
    # one tag holding sqrt(sum of squares) of every parameter's v is the same input
    tags = list(rec["opt"])
    total = [math.sqrt(sum(rec["opt"][t][i] ** 2 for t in tags)) for i in range(len(rec["loss"]))]
    merged = dict(rec, opt={"param/all/moment2_norm": total})
    assert [(a.step, a.since_step) for a in _stale(spec, merged)] == base
    # only one parameter's v: a different input, so not necessarily the same steps, but
    # the rule still reads it (moment1 tags are ignored)
    ignored = dict(rec, opt={t.replace("moment2", "moment1"): v for t, v in rec["opt"].items()})
    assert _stale(spec, ignored) == []


def test_disabled_and_needs_both_series(tuning):
    spec, rec = next((s, r) for s, r in tuning if s.name == "adam-spike-regress-s0")
    data = series(spec, rec)
    assert [
        a for a in diagnose(data, {"disabled": ["adam_v_stale"]}) if a.kind == "adam_v_stale"
    ] == []
    no_grad = {t: v for t, v in data.items() if t != "train/grad_norm"}
    assert [a for a in diagnose(no_grad) if a.kind == "adam_v_stale"] == []
    with pytest.raises(ValueError, match="several series"):
        detect("adam_v_stale", [0, 1], [1.0, 2.0])


def test_live_engine_matches_replay(tuning):
    spec, rec = next((s, r) for s, r in tuning if s.name == "adam-spike-blobs-s2")
    diag = Diagnoser()
    live = []
    for i in range(len(rec["loss"])):
        values = {"train/loss": rec["loss"][i], "train/grad_norm": rec["grad_norm"][i]}
        values.update({t: v[i] for t, v in rec["opt"].items()})
        live += [a for a in diag.update(i, values) if a.kind == "adam_v_stale"]
    replay = [
        a
        for a in diagnose({k: v for k, v in series(spec, rec).items() if "learning" not in k})
        if a.kind == "adam_v_stale"
    ]
    assert [(a.step, a.since_step) for a in live] == [(a.step, a.since_step) for a in replay]
    assert live and live[0].since_step == spec.onset


def test_rule_object_alone():
    """The rule object alone, on hand-made values: it judges only after min_history
    values and ignores zero and infinite inputs."""
    settings = resolve_settings({"adam_v_stale": {"window": 8, "min_history": 4}})
    rule = AdamVStale(settings["adam_v_stale"])
    assert rule.update(0, 0.0, 1.0) is None and rule.update(1, math.inf, 1.0) is None
    for s in range(2, 6):
        assert rule.update(s, 1.0, 1.0) is None
    assert rule.update(6, 1.0, 1e-3) is not None  # g^2 / ||v|| x1000 its median
    assert rule.active
    assert is_moment2_tag("param/fc1.weight/moment2_norm")
    assert not is_moment2_tag("param/fc1.weight/moment1_norm")
    assert not is_moment2_tag("train/moment2_norm")


def test_grad_norm_recorded_a_step_late_still_pairs_with_its_v(tuning):
    """On Ascend/GPU the monitor records the device grad_norm one collected step late, in
    its own update: the rule must still judge each step's grad_norm with that step's v."""
    spec, rec = next((s, r) for s, r in tuning if s.name == "adam-spike-regress-lr1-s1")
    together, late = Diagnoser(), Diagnoser()
    got_together, got_late = [], []
    for i in range(len(rec["loss"])):
        moments = {t: v[i] for t, v in rec["opt"].items()}
        both = {"train/grad_norm": rec["grad_norm"][i], **moments}
        got_together += [a for a in together.update(i, both) if a.kind == "adam_v_stale"]
        got_late += [a for a in late.update(i, moments) if a.kind == "adam_v_stale"]
        if i:  # the previous step's grad_norm, recorded at its own step
            prev = {"train/grad_norm": rec["grad_norm"][i - 1]}
            got_late += [a for a in late.update(i - 1, prev) if a.kind == "adam_v_stale"]
    assert got_together and got_together[0].since_step == spec.onset
    # the last step's grad_norm never came: everything before it is judged the same
    assert [(a.step, a.since_step) for a in got_late] == [
        (a.step, a.since_step) for a in got_together if a.step < len(rec["loss"]) - 1
    ]
