"""layer_rise (diagnose.layers): one parameter's gradient norm or update ratio rising past
its own history while the model as a whole does not; synthetic rows through the engine's
``update_layers``, as the monitor feeds them."""

from __future__ import annotations

import numpy as np
import pytest

from msmon_nb.config import ConfigError
from msmon_nb.diagnose.alert import with_chart
from msmon_nb.diagnose.engine import Diagnoser

NAMES = tuple(f"l{i}.weight" for i in range(6))


def feed(steps: int, change, seed: int = 0, settings=None) -> list:
    """Healthy log-normal rows (gradient norms ~1, update ratios ~1e-3, 20 % noise),
    ``change(step, grads, ratios)`` editing them in place; every alert."""
    rng = np.random.default_rng(seed)
    diag = Diagnoser(settings)
    out = []
    for s in range(steps):
        grads = np.exp(rng.normal(size=len(NAMES)) * 0.2)
        ratios = 1e-3 * np.exp(rng.normal(size=len(NAMES)) * 0.2)
        change(s, grads, ratios)
        out += diag.update_layers(s, NAMES, grads, ratios)
    return out


def test_one_groups_update_ratio_jump_is_named_at_its_step():
    def jump(s, grads, ratios):
        if s >= 150:
            ratios[2] *= 30

    alerts = feed(300, jump)
    assert len(alerts) == 1
    a = alerts[0]
    assert a.kind == "layer_rise" and a.since_step == 150 and a.step == 151  # patience 2
    assert a.blame[0]["name"] == "l2.weight" and a.blame[0]["step"] == 150
    assert "layer l2.weight: update_ratio x" in a.message
    assert a.severity == "warning" and with_chart(a.to_dict())["chart"] == "train/grad_norm"


def test_a_weight_written_between_steps_is_named_at_once():
    def corrupt(s, grads, ratios):
        if s == 120:
            ratios[4] = 2.0  # x2000 in one step, then back

    (a,) = feed(200, corrupt)
    assert (a.step, a.since_step, a.blame[0]["name"]) == (120, 120, "l4.weight")


def test_a_move_of_every_layer_is_not_one_layers_rise():
    def schedule(s, grads, ratios):  # an lr x30 for everything, a loss scale x100
        if s >= 150:
            ratios *= 30
        if s >= 200:
            grads *= 100

    assert feed(300, schedule) == []


def test_a_layer_that_carries_the_global_norm_is_left_to_the_global_rules():
    def dominant(s, grads, ratios):
        grads[0] *= 30  # the gradient's largest part: the global norm rises x20 with it
        if s >= 150:
            grads[0] *= 20

    assert feed(300, dominant) == []


def test_a_frozen_layer_unfrozen_at_the_usual_lr_is_quiet_and_at_100x_is_named():
    def unfreeze(factor):
        def change(s, grads, ratios):
            if s < 150:
                ratios[3] = 0.0
            else:
                ratios[3] *= factor

        return change

    assert feed(400, unfreeze(1.0)) == []
    (a,) = feed(400, unfreeze(100.0))
    assert a.since_step == 150 and a.blame[0]["name"] == "l3.weight"
    assert "layer l3.weight: update_ratio x" in a.message


def test_a_gradient_norm_rise_in_one_layer_is_named():
    def penalty(s, grads, ratios):
        if s >= 200:
            grads[1] *= 12

    (a,) = feed(300, penalty)
    assert a.since_step == 200 and "layer l1.weight: grad_norm x" in a.message


def test_healthy_rows_stay_quiet_and_disabled_means_off():
    assert feed(20_000, lambda *_: None, seed=3) == []

    def jump(s, grads, ratios):
        if s >= 150:
            ratios[2] *= 30

    assert feed(300, jump, settings={"disabled": ["layer_rise"]}) == []


def test_without_ratios_the_gradient_norms_are_judged_alone():
    rng = np.random.default_rng(1)
    diag = Diagnoser()
    found = []
    for s in range(300):
        grads = np.exp(rng.normal(size=6) * 0.2)
        if s >= 200:
            grads[5] *= 20
        found += diag.update_layers(s, NAMES, grads, None)
    assert [a.blame[0]["name"] for a in found] == ["l5.weight"]


def test_settings_are_checked_by_the_card():
    with pytest.raises(ConfigError, match=r"layer_rise\.factor"):
        Diagnoser({"layer_rise": {"factor": 0.5}})
