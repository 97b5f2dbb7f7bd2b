"""nonfinite, step_order and metric_missing."""

import math

import pytest

from msmon_nb.diagnose import Diagnoser, detect

NAN, INF = float("nan"), float("inf")


def test_first_nan_in_the_loss():
    values = [2.0, 1.9, 1.8, NAN, NAN, 1.7, NAN] + [1.0] * 10 + [NAN]
    alerts = detect("nonfinite", range(len(values)), values)
    # NaN, finite, NaN is one episode (a diverging run flaps); 10 finite steps end it
    assert [(a.since_step, a.step) for a in alerts] == [(3, 3), (17, 17)]
    first = alerts[0]
    assert (first.kind, first.severity, first.tag) == ("nonfinite", "critical", "train/loss")
    assert math.isnan(first.value)
    assert first.message.startswith(
        "loss is NaN since step 3 (first non-finite value; last finite 1.8 at step 2); "
    )
    assert "log(0)" in first.message


def test_inf_gradients_are_named_an_overflow():
    [alert] = detect("nonfinite", range(3), [1.0, INF, INF], tag="train/grad_norm")
    assert (alert.since_step, alert.value) == (1, INF)
    assert alert.message.startswith("grad_norm is Inf since step 1")
    assert "gradients overflowed" in alert.message
    [neg] = detect("nonfinite", range(2), [-INF, 1.0], tag="val/f1")
    assert neg.message.startswith("f1 is -Inf since step 0 (first non-finite value; no finite")


def test_patience_for_loss_scaling_skips():
    values = [1.0, INF, 1.0, INF, INF, 1.0, INF, INF, INF]
    alerts = detect("nonfinite", range(9), values, patience=3)
    assert [(a.since_step, a.step) for a in alerts] == [(6, 8)]


def test_steps_going_backwards():
    steps = [0, 10, 20, 30, 10, 20, 30, 40, 50]
    [alert] = detect("step_order", steps, tag="train/loss")
    assert (alert.step, alert.since_step, alert.value) == (10, 10, None)
    assert alert.message.startswith(
        "train/loss went back to step 10 after step 30 (highest so far 30): two runs"
    )


def test_repeated_step():
    [alert] = detect("step_order", [0, 1, 1, 2], tag="train/loss")
    assert alert.message.startswith("train/loss repeated step 1 after step 1")


def test_two_interleaved_writers_reported_once():
    steps = [s for pair in zip(range(100), range(100), strict=True) for s in pair]
    assert len(detect("step_order", steps, tag="train/loss")) == 1


def test_restart_that_catches_up_is_forgotten_then_a_new_jump_is_reported():
    steps = list(range(50)) + list(range(20, 80)) + list(range(30, 40))
    alerts = detect("step_order", steps, tag="train/loss")
    assert [a.step for a in alerts] == [20, 30]


def test_tracked_metric_never_recorded():
    diag = Diagnoser({"metric_missing": {"patience": 5}}, tracked=["loss", "val/f1", "val/acc"])
    alerts = []
    for step in range(0, 100, 10):
        values = {"train/loss": 1.0}
        if step == 20:
            values["val/acc"] = 0.5
        alerts += diag.update(step, values)
        if step == 20:
            alerts += diag.update(step, {"val/acc": 0.5})  # mon.log at the same step
    [alert] = [a for a in alerts if a.kind == "metric_missing"]
    assert (alert.tag, alert.since_step, alert.step, alert.value) == ("val/f1", 0, 40, None)
    assert alert.message.startswith(
        "'val/f1' is in track_metrics but has not been recorded in 5 collected steps (steps 0-40)"
    )
    assert "mon.log({'val/f1': value})" in alert.message
    assert [a.tag for a in diag.active() if a.kind == "metric_missing"] == ["val/f1"]
    diag.update(100, {"val/f1": 0.7})
    assert [a for a in diag.active() if a.kind == "metric_missing"] == []


@pytest.mark.parametrize("tracked", [None, [], ["loss", "grad_norm", "learning_rate"]])
def test_core_metric_names_are_not_watched(tracked):
    diag = Diagnoser({"metric_missing": {"patience": 1}}, tracked=tracked)
    assert diag.update(0, {"train/loss": 1.0}) == []
    assert diag.update(1, {"train/loss": 1.0}) == []
