"""monitor_config.alerts: defaults, overrides, and one clear error per bad value."""

import pytest
import yaml

from msmon_nb.config import ConfigError
from msmon_nb.diagnose import ACTIONS, KINDS, SCHEMA, SEVERITY, defaults, resolve_settings
from msmon_nb.diagnose.rules import SERIES_RULES


def test_every_kind_has_a_severity_and_an_implementation():
    assert set(SEVERITY) == set(KINDS)
    assert set(SEVERITY.values()) <= {"warning", "critical"}
    cross_series = {"nonfinite", "metric_missing", "step_order", "data_bound", "adam_v_stale"}
    cross_series |= {"layer_rise"}  # per-parameter rows, fed by the monitor (monitor.layers)
    cross_series |= {"attention_logit_growth"}  # every attn/<module>/max_logit of a step
    # every act/<module>/<stat> of a step, modules in forward order
    cross_series |= {"nonfinite_origin", "output_logit_divergence"}
    cross_series |= {"activation_blowup", "activation_dying"}
    assert set(SERIES_RULES) | cross_series == set(KINDS)


def test_defaults():
    s = defaults()
    assert s["disabled"] == []
    assert {kind: s[kind]["action"] for kind in KINDS} == dict.fromkeys(KINDS, "warn")
    assert s["grad_explosion"]["factor"] == 10.0
    assert s["grad_explosion"]["ceiling"] == 1e6
    assert s["grad_vanishing"]["floor"] == 1e-3
    assert s["nonfinite"]["tags"] == ["train/loss", "train/grad_norm"]
    assert s["lr_warmup"]["warmup_steps"] is None
    assert s["lr_decay"]["expect_by"] is None
    assert s["loss_spike"]["tag"] == "train/loss"
    assert resolve_settings({}) == resolve_settings(None) == s


def test_overrides_action_and_disabled():
    s = resolve_settings(
        {
            "grad_explosion": {"factor": 1e3, "ceiling": 1e6, "action": "snapshot"},
            "disabled": ["loss_plateau"],
            "action": "stop",
            "lr_warmup": {"warmup_steps": 2000},
            "nonfinite": {"tags": ["train/loss"]},
        }
    )
    assert s["grad_explosion"]["factor"] == 1000.0
    assert s["grad_explosion"]["action"] == "snapshot"
    assert s["loss_spike"]["action"] == "stop"  # the top-level default
    assert s["disabled"] == ["loss_plateau"]
    assert s["lr_warmup"]["warmup_steps"] == 2000
    assert s["nonfinite"]["tags"] == ["train/loss"]


def test_resolved_settings_are_independent_copies():
    a = defaults()
    a["nonfinite"]["tags"].append("train/x")
    assert defaults()["nonfinite"]["tags"] == ["train/loss", "train/grad_norm"]


@pytest.mark.parametrize(
    ("alerts", "names"),
    [
        ({"grad_explosion": {"factor": 0.5}}, ["alerts.grad_explosion.factor=0.5", "> 1"]),
        ({"grad_explosion": {"factor": "big"}}, ["factor='big'", "number"]),
        ({"grad_explosion": {"factor": "0.5"}}, ["factor='0.5'", "> 1"]),
        ({"grad_explosion": {"factor": True}}, ["factor=True", "number"]),
        ({"grad_explosion": {"factor": float("nan")}}, ["factor=nan", "finite"]),
        ({"grad_explosion": {"facter": 3}}, ["'facter'", "did you mean 'factor'"]),
        ({"gradexplosion": {}}, ["'gradexplosion'", "did you mean 'grad_explosion'"]),
        ({"grad_vanishing": {"patience": 0}}, ["patience=0", ">= 1"]),
        ({"grad_vanishing": {"patience": 2.5}}, ["patience=2.5", "whole number"]),
        ({"loss_plateau": {"min_delta": 1.5}}, ["min_delta=1.5", "between 0 and 1"]),
        ({"loss_spike": {"tag": "Train/Loss"}}, ["tag='Train/Loss'", "'train/loss'"]),
        ({"nonfinite": {"tags": "train/loss"}}, ["tags='train/loss'", "list"]),
        ({"nonfinite": {"tags": ["ok/tag", "Bad Tag"]}}, ["tag rule"]),
        ({"loss_spike": {"action": "break"}}, ["action='break'", "warn, snapshot, stop, debug"]),
        ({"action": "pdb"}, ["alerts.action='pdb'", "warn"]),
        ({"disabled": "loss_plateau"}, ["disabled='loss_plateau'", "list"]),
        ({"disabled": ["loss_plato"]}, ["'loss_plato'", "did you mean 'loss_plateau'"]),
        ({"lr_warmup": {"warmup_steps": 0}}, ["warmup_steps=0", ">= 1"]),
        ({"loss_spike": [1, 2]}, ["alerts.loss_spike=[1, 2]", "mapping"]),
        (["grad_explosion"], ["alerts=['grad_explosion']", "mapping"]),
    ],
)
def test_bad_values_name_key_value_and_a_fix(alerts, names):
    with pytest.raises(ConfigError) as info:
        resolve_settings(alerts)
    message = str(info.value)
    assert message.startswith("monitor_config.alerts")
    for name in names:
        assert name in message
    if "no key" not in message and "no setting" not in message:
        assert "for example" in message


def _examples():
    for kind, params in SCHEMA.items():
        for param in params:
            yield kind, param


@pytest.mark.parametrize(("kind", "param"), list(_examples()))
def test_every_proposed_example_is_itself_valid(kind, param):
    """The fix an error message proposes must be accepted when pasted into the YAML."""
    bad = {"tag": "Bad Tag", "tags": "x"}.get(param, -1)
    with pytest.raises(ConfigError) as info:
        resolve_settings({kind: {param: bad}})
    example = str(info.value).split("for example ", 1)[1]
    pasted = yaml.safe_load(example)["alerts"]
    resolved = resolve_settings(pasted)
    assert resolved[kind][param] == pasted[kind][param]


def test_yaml_exponents_without_a_dot_are_numbers():
    """PyYAML reads `floor: 1e-4` as the string '1e-4'; users write it that way anyway."""
    pasted = yaml.safe_load("alerts: {grad_vanishing: {floor: 1e-4}}")["alerts"]
    assert pasted["grad_vanishing"]["floor"] == "1e-4"
    assert resolve_settings(pasted)["grad_vanishing"]["floor"] == 1e-4
    with pytest.raises(ConfigError, match="floor='tiny'"):
        resolve_settings({"grad_vanishing": {"floor": "tiny"}})


def test_actions():
    assert ACTIONS == ("warn", "snapshot", "stop", "debug", "skip", "checkpoint")
    for action in ACTIONS:  # nonfinite accepts skip too (tests/collect/test_skip.py)
        assert resolve_settings({"nonfinite": {"action": action}})["nonfinite"]["action"] == action
    # a typo is named with the closest action, checkpoint among them
    with pytest.raises(ConfigError, match=r"did you mean 'checkpoint'.*checkpoint"):
        resolve_settings({"loss_spike": {"action": "checkpont"}})
    assert resolve_settings({"action": "checkpoint"})["loss_divergence"]["action"] == "checkpoint"
