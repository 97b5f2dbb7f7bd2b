"""Diagnoser: new alerts only, once per anomaly, incremental, and equal to a replay."""

import json
import math
from collections import deque

import numpy as np
import pytest

from msmon_nb.config import ConfigError
from msmon_nb.diagnose import Alert, Diagnoser, detect, diagnose
from msmon_nb.diagnose.alert import fmt, fmt_ratio
from msmon_nb.metrics.series import SeriesStore
from tests.support.curves import healthy

NAN = float("nan")


def feed(diag, curves):
    """Step-by-step, as a monitor would: one update per collected step."""
    out = []
    steps = curves["train/loss"][0]
    for i, step in enumerate(steps.tolist()):
        out += diag.update(step, {tag: float(v[i]) for tag, (_, v) in curves.items()})
    return out


def test_new_alerts_only_once_per_anomaly_and_again_after_it_clears():
    diag = Diagnoser()
    loss = [1.0, NAN, NAN, 1.0, NAN] + [1.0] * 10 + [NAN]
    got = [diag.update(s, {"train/loss": v}) for s, v in enumerate(loss)]
    # flapping between NaN and finite is one episode; ten finite steps end it
    assert [(s, [a.since_step for a in alerts]) for s, alerts in enumerate(got) if alerts] == [
        (1, [1]),
        (15, [15]),
    ]


def test_nan_does_not_poison_the_running_statistics():
    curves = healthy("cosine", seed=0, n=1500)
    clean = feed(Diagnoser(), curves)
    steps, loss = curves["train/loss"]
    loss = loss.copy()
    loss[[300, 700]] = NAN
    grads = curves["train/grad_norm"][1].copy()
    grads[500] = float("inf")
    dirty = feed(
        Diagnoser(),
        {**curves, "train/loss": (steps, loss), "train/grad_norm": (steps, grads)},
    )
    assert clean == []
    assert [(a.kind, a.tag, a.step) for a in dirty] == [
        ("nonfinite", "train/loss", 300),
        ("nonfinite", "train/grad_norm", 500),
        ("nonfinite", "train/loss", 700),
    ]
    # and the rules still see a later failure
    loss[1000] = 50.0
    late = feed(Diagnoser(), {**curves, "train/loss": (steps, loss)})
    assert ("loss_spike", 1000) in [(a.kind, a.step) for a in late]


def test_rules_follow_their_configured_tags():
    diag = Diagnoser({"nonfinite": {"tags": ["train/lm_loss"]}, "loss_spike": {"tag": "lm"}})
    assert diag.update(0, {"train/loss": NAN}) == []
    [alert] = diag.update(1, {"train/lm_loss": NAN})
    assert alert.tag == "train/lm_loss"
    for step in range(2, 40):
        diag.update(step, {"lm": 1.0 + 0.01 * (step % 3)})
    [spike] = diag.update(40, {"lm": 9.0})
    assert (spike.kind, spike.tag) == ("loss_spike", "lm")


def test_disabled_kinds_stay_quiet_and_the_others_still_work():
    diag = Diagnoser({"disabled": ["nonfinite", "step_order"]})
    assert diag.update(0, {"train/loss": NAN}) == []
    assert diag.update(0, {"train/loss": 1.0}) == []  # repeated step: step_order is off
    for step in range(1, 4):
        alerts = diag.update(step, {"train/learning_rate": 0.0})
    assert [a.kind for a in alerts] == ["lr_zero"]


def test_decay_rule_runs_only_when_configured():
    lr = {"train/learning_rate": 1e-3}
    assert all(Diagnoser().update(s, lr) == [] for s in range(0, 6000, 100))
    diag = Diagnoser({"lr_decay": {"expect_by": 5000}})
    alerts = [a for s in range(0, 6000, 100) for a in diag.update(s, lr)]
    assert [(a.kind, a.step) for a in alerts] == [("lr_decay", 5000)]


def test_rank_settings_and_action_lookup():
    diag = Diagnoser({"nonfinite": {"action": "debug"}, "action": "snapshot"}, rank=3)
    [alert] = diag.update(7, {"train/grad_norm": NAN})
    assert alert.rank == 3
    assert diag.action("nonfinite") == "debug"
    assert diag.action("grad_explosion") == "snapshot"
    assert diag.settings["grad_explosion"]["factor"] == 10.0
    with pytest.raises(ConfigError, match=r"alerts\.loss_spike\.tail=-1"):
        Diagnoser({"loss_spike": {"tail": -1}})


def test_values_of_any_numeric_type():
    diag = Diagnoser()
    assert diag.update(0, {"train/loss": np.float32(1.5), "train/global_step": 0}) == []
    [alert] = diag.update(1, {"train/loss": np.float32("nan")})
    assert alert.kind == "nonfinite"
    assert diag.update(2, {}) == []


def test_active_lists_only_ongoing_anomalies():
    diag = Diagnoser()
    diag.update(0, {"train/loss": NAN, "train/grad_norm": NAN})
    assert sorted(a.tag for a in diag.active()) == ["train/grad_norm", "train/loss"]
    for step in range(1, 11):
        diag.update(step, {"train/loss": 1.0, "train/grad_norm": NAN})
    assert [a.tag for a in diag.active()] == ["train/grad_norm"]  # ten finite losses
    diag.update(0, {"train/loss": 1.0})
    assert "step_order" in [a.kind for a in diag.active()]


def test_active_shows_the_latest_alert_of_a_recurring_anomaly():
    diag = Diagnoser()
    loss = [NAN] + [1.0] * 10 + [NAN]
    for step, value in enumerate(loss):
        diag.update(step, {"train/loss": value})
    assert [(a.kind, a.step) for a in diag.active()] == [("nonfinite", 11)]


def test_replay_equals_the_live_engine():
    curves = healthy("constant", seed=1, n=2000)
    steps, grads = curves["train/grad_norm"]
    grads = grads.copy()
    grads[1200:] *= 1e4
    curves["train/grad_norm"] = (steps, grads)
    live = feed(Diagnoser(), curves)
    assert [a.kind for a in live][:1] == ["grad_explosion"]
    store = SeriesStore()  # what mon.series holds
    for i, step in enumerate(steps.tolist()):
        store.add(step, 0.0, {tag: float(v[i]) for tag, (_, v) in curves.items()})
    assert diagnose(store) == live
    assert diagnose(curves) == live  # (steps, values) tuples


def test_replay_keeps_each_series_in_its_own_order():
    """A raw series written by two runs goes backwards; the replay must show it."""
    steps = np.array([0, 1, 2, 3, 1, 2, 3, 4])
    alerts = diagnose({"train/loss": (steps, np.ones(8)), "train/lr": ([0, 1, 2, 3, 4], [1] * 5)})
    assert [(a.kind, a.tag, a.step) for a in alerts] == [("step_order", "train/loss", 1)]


def test_detect_agrees_with_the_engine_per_rule():
    curves = healthy("cosine", seed=2, n=1500)
    steps, loss = curves["train/loss"]
    loss = loss.copy()
    loss[900] = 40.0
    loss[1100:] *= 6.0
    kinds = ("loss_spike", "loss_divergence")
    engine = [a for a in diagnose({"train/loss": (steps, loss)}) if a.kind in kinds]
    per_rule = detect("loss_spike", steps, loss) + detect("loss_divergence", steps, loss)
    assert sorted(engine, key=lambda a: a.step) == sorted(per_rule, key=lambda a: a.step)
    assert {a.kind for a in engine} == set(kinds)


def test_detect_refuses_what_it_cannot_judge():
    with pytest.raises(ValueError, match="unknown alert kind 'grad_boom'"):
        detect("grad_boom", [0], [1.0])
    with pytest.raises(ValueError, match="Diagnoser"):
        detect("metric_missing", [0], [1.0])
    with pytest.raises(ValueError, match="2 steps but 1 values"):
        detect("loss_spike", [0, 1], [1.0])
    with pytest.raises(ConfigError):
        detect("loss_spike", [0], [1.0], tail=0)


def _stored(obj, seen=None) -> int:
    """Numbers of items held in every container reachable from ``obj``."""
    seen = set() if seen is None else seen
    if id(obj) in seen or isinstance(obj, str | int | float | bool | type(None)):
        return 0
    seen.add(id(obj))
    total = 0
    if isinstance(obj, list | tuple | deque | set):
        total += len(obj) + sum(_stored(x, seen) for x in obj)
    elif isinstance(obj, dict):
        total += len(obj) + sum(_stored(k, seen) + _stored(v, seen) for k, v in obj.items())
    for name in getattr(type(obj), "__slots__", ()):
        total += _stored(getattr(obj, name, None), seen)
    if hasattr(obj, "__dict__"):  # attributes, like slots: not a container that grows
        total += sum(_stored(value, seen) for value in vars(obj).values())
    return total


def test_state_stays_bounded_however_long_the_run():
    """Incremental: after the windows fill, nothing grows with the number of steps."""
    curves = healthy("cosine", seed=3, n=20_000)
    diag = Diagnoser()
    sizes = {}
    for i, step in enumerate(curves["train/loss"][0].tolist()):
        diag.update(step, {tag: float(v[i]) for tag, (_, v) in curves.items()})
        if step in (1000, 19_999):
            sizes[step] = _stored(diag._routes) + _stored(diag._order)
    assert sizes[1000] == sizes[19_999]
    assert sizes[1000] < 1200  # the rules' windows and the convergence judge's two


def test_alert_to_dict_is_json_and_round_trips():
    alert = Alert(12, "nonfinite", "critical", "loss is NaN", 12, "train/loss", NAN, 1)
    data = alert.to_dict()
    assert json.loads(json.dumps(data, allow_nan=False)) == data
    assert data["value"] == "nan"
    back = Alert.from_dict(data)
    assert math.isnan(back.value)
    assert back.to_dict() == data
    for value in (float("inf"), -float("inf"), 3.5, None):
        a = Alert(1, "k", "warning", "m", 0, value=value)
        assert Alert.from_dict(json.loads(json.dumps(a.to_dict(), allow_nan=False))) == a


@pytest.mark.parametrize(
    ("value", "text"),
    [(3.2e6, "3.2e6"), (1e-5, "1e-5"), (0.043, "0.043"), (12.0, "12"), (0.0, "0"), (NAN, "nan")],
)
def test_number_spelling(value, text):
    assert fmt(value) == text


def test_ratio_spelling():
    assert [fmt_ratio(r) for r in (2.5, 12.4, 1.2e4, float("inf"))] == [
        "x2.5",
        "x12",
        "x1.2e4",
        "xinf",
    ]


def test_data_bound_flagged_with_its_onset():
    from msmon_nb.diagnose import Diagnoser

    diag = Diagnoser()
    alerts = []
    for step in range(40):
        data = 0.020 if step >= 12 else 0.001
        alerts += diag.update(step, {"train/data_time": data, "train/compute_time": 0.008})
    (alert,) = [a for a in alerts if a.kind == "data_bound"]
    # the median of the last 10 steps turns data-bound once 6 of them are: at step 17
    assert alert.since_step == 12 and alert.step == 17
    assert "data-bound" in alert.message and "71%" in alert.message


def test_in_memory_loop_is_not_data_bound():
    from msmon_nb.diagnose import Diagnoser

    diag = Diagnoser()
    alerts = []
    for step in range(200):
        alerts += diag.update(step, {"train/data_time": 0.0004, "train/compute_time": 0.01})
    assert [a for a in alerts if a.kind == "data_bound"] == []


def test_a_handled_overflow_is_no_nonfinite_alert():
    """A step whose loss scaler caught the overflow (update skipped, train/overflow 1) at
    a scale it can still lower: its NaN loss is what dynamic loss scaling handles. At
    scale 1, or without an overflow flag, a NaN is the model's own."""
    diag = Diagnoser()
    found = []
    for step in range(6):
        values = {"train/loss": 2.0, "train/loss_scale": 2.0**16, "train/overflow": 0.0}
        if step == 3:
            values.update({"train/loss": NAN, "train/overflow": 1.0})
        found += diag.update(step, values)
    assert found == []
    at_one = diag.update(6, {"train/loss": NAN, "train/loss_scale": 1.0, "train/overflow": 1.0})
    assert [(a.kind, a.tag, a.step) for a in at_one] == [("nonfinite", "train/loss", 6)]
    plain = Diagnoser().update(0, {"train/loss": NAN, "train/loss_scale": 1024.0})
    assert [a.kind for a in plain] == ["nonfinite"]
