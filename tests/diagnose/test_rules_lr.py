"""lr_zero, lr_warmup and lr_decay on synthetic schedules."""

import numpy as np
import pytest

from msmon_nb.diagnose import detect
from tests.support.curves import warmup_cosine_lr


def test_lr_zero_for_three_collected_steps():
    lr = [0.1] * 5 + [0.0] * 5 + [0.1] * 3 + [0.0] * 3 + [0.1] * 10 + [0.0] * 3
    steps = list(range(0, 290, 10))  # log_interval 10
    alerts = detect("lr_zero", steps, lr)
    # back at 0 after 3 steps: the same episode; after 10 steps: a new one
    assert [(a.since_step, a.step) for a in alerts] == [(50, 70), (260, 280)]
    assert alerts[0].severity == "warning"
    assert alerts[0].message.startswith("learning_rate is 0 since step 50 (3 collected steps)")
    assert "min_lr=0" in alerts[0].message


def test_warmup_from_zero_and_cosine_to_zero_are_healthy():
    steps = np.arange(1000)
    lr = warmup_cosine_lr(steps, warmup=100)
    assert lr[0] == 0.0 and lr[-1] == pytest.approx(0.0)
    assert detect("lr_zero", steps, lr) == []
    assert detect("lr_warmup", steps, lr, warmup_steps=100) == []


def test_negative_lr_is_named():
    [alert] = detect("lr_zero", range(5), [0.1, -0.1, -0.1, -0.1, -0.1])
    assert (alert.since_step, alert.step) == (1, 3)
    assert "negative (-0.1: this ascends the loss)" in alert.message


def test_configured_warmup_that_never_rises():
    steps = list(range(0, 100, 10))
    stuck = [5e-8] * 10  # lr(0) = 1e-4 / 2000 of a 2000-step warmup, never advancing
    [alert] = detect("lr_warmup", steps, stuck, warmup_steps=2000)
    assert (alert.since_step, alert.step, alert.value) == (0, 20, 5e-8)
    assert alert.message.startswith("learning_rate stuck at its first value 5e-8 since step 0")
    assert "although a 2000-step warmup was configured" in alert.message
    assert "global_step" in alert.message


def test_configured_warmup_with_a_normal_first_value_is_judged_too():
    [alert] = detect("lr_warmup", range(5), [1e-3] * 5, warmup_steps=100)
    assert (alert.since_step, alert.step) == (0, 2)


def test_tiny_first_value_without_configuration():
    [alert] = detect("lr_warmup", range(5), [5e-8] * 5)
    assert (alert.since_step, alert.step) == (0, 2)
    assert "a tiny value, as left by a warmup whose step counter never advances" in alert.message


@pytest.mark.parametrize(
    "lr",
    [
        [1e-3] * 10,  # a constant lr is a choice
        [5e-8, 1e-7, 1.5e-7] + [2e-7] * 7,  # a tiny warmup that moves
        [5e-8, 5e-8, 1e-4] + [1e-4] * 7,  # moves on the third collected step
        [0.0] * 10,  # zero is lr_zero's business
    ],
)
def test_warmup_rule_quiet_cases(lr):
    assert detect("lr_warmup", range(len(lr)), lr) == []


def test_warmup_judged_once_on_the_first_collected_steps():
    lr = [1e-3] * 3 + [1e-2] * 3 + [1e-2] * 10
    assert [a.step for a in detect("lr_warmup", range(16), lr, warmup_steps=50)] == [2]


def test_decay_that_never_comes():
    steps = np.arange(0, 5000, 100)
    lr = np.where(steps < 500, 1e-3 * steps / 500, 1e-3)  # warmup, then flat
    [alert] = detect("lr_decay", steps, lr, expect_by=4000)
    assert (alert.since_step, alert.step) == (500, 4000)
    assert alert.message.startswith("learning_rate has not decayed by step 4000: 0.001, ")
    assert "unchanged since step 500" in alert.message


def test_decay_rule_quiet_cases():
    steps = np.arange(0, 5000, 100)
    decaying = warmup_cosine_lr(steps, warmup=500)
    assert detect("lr_decay", steps, decaying, expect_by=4000) == []
    assert detect("lr_decay", steps, np.full(steps.size, 1e-3)) == []  # not configured
    small_drop = np.where(steps < 3000, 1e-3, 0.95e-3)  # 5 % < min_drop 10 %
    assert len(detect("lr_decay", steps, small_drop, expect_by=4000)) == 1
    assert detect("lr_decay", steps, small_drop, expect_by=4000, min_drop=0.04) == []
