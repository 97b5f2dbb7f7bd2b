"""The ``monitor_config.alerts`` schema: defaults, validation, resolved thresholds.

``resolve_settings(alerts)`` is the one place user input about alerts is checked; a bad
value raises ``ConfigError`` naming the key, the value and a valid example, like every
other ``monitor_config`` field. ``MonitorConfig.validate`` can call it, so a typo fails
when the config is loaded rather than a thousand steps into training.

Defaults were tuned on healthy curves (synthetic ones and real MindSpore MLP runs with
Momentum, Adam and SGD, see ``tests/diagnose``), so a healthy run raises nothing.
"""

from __future__ import annotations

import copy
import difflib
import math
from collections.abc import Callable, Mapping
from typing import Any

from msmon_nb.config.checks import TAG_RULE, ConfigError, check_tag, suggest_tag

# ``checkpoint`` saves the network and optimizer state at the step boundary after the
# alert (``monitor.actions``), so a run that goes wrong can be resumed from before it
ACTIONS = ("warn", "snapshot", "stop", "debug", "skip", "checkpoint")
DEFAULT_ACTION = "warn"
# ``skip`` holds back the parameter update of the step being judged, so it only makes
# sense for rules that judge one step on its own value: a whole-run pattern (a plateau,
# an lr schedule, a trend) has no single bad batch to drop.
SKIP_KINDS = ("grad_explosion", "loss_spike", "nonfinite")
# updates skipped in a row before the run stops (MindFormers'
# global_norm_spike_count_threshold; its documented example is 10)
DEFAULT_MAX_SKIPS = 10


class _Bad(Exception):
    """A value failed a check; carries why."""


def _number(value: Any) -> float:
    if isinstance(value, str):
        # PyYAML (YAML 1.1) reads 1e-4 -- no dot in the mantissa -- as a string
        try:
            value = float(value)
        except ValueError:
            raise _Bad("must be a finite number") from None
    if isinstance(value, bool) or not isinstance(value, int | float) or not math.isfinite(value):
        raise _Bad("must be a finite number")
    return float(value)


def _positive(value: Any) -> float:
    out = _number(value)
    if out <= 0:
        raise _Bad("must be a number > 0")
    return out


def _above_one(value: Any) -> float:
    out = _number(value)
    if out <= 1:
        raise _Bad("must be a number > 1 (a factor)")
    return out


def _fraction(value: Any) -> float:
    out = _number(value)
    if not 0 < out < 1:
        raise _Bad("must be a fraction strictly between 0 and 1")
    return out


def _nonnegative(value: Any) -> float:
    out = _number(value)
    if out < 0:
        raise _Bad("must be a number >= 0")
    return out


def _count(minimum: int) -> Callable[[Any], int]:
    def check(value: Any) -> int:
        if isinstance(value, bool) or not isinstance(value, int) or value < minimum:
            raise _Bad(f"must be a whole number >= {minimum}")
        return value

    return check


def _tag(value: Any) -> str:
    try:
        return check_tag(value)
    except ConfigError:
        hint = f" (did you mean {suggest_tag(value)!r}?)" if isinstance(value, str) else ""
        raise _Bad(f"breaks the tag rule{hint}: {TAG_RULE}") from None


def _tags(value: Any) -> list[str]:
    if not isinstance(value, list | tuple) or not value:
        raise _Bad("must be a non-empty list of tags")
    return [_tag(tag) for tag in value]


def _optional_count(value: Any) -> int | None:
    if value is None:
        return None
    return _count(1)(value)


def _flag(value: Any) -> bool:
    if not isinstance(value, bool):
        raise _Bad("must be true or false")
    return value


def _optional_positive(value: Any) -> float | None:
    if value is None:
        return None
    return _positive(value)


# kind -> parameter -> (default, check, example). The example is what error messages
# propose, so it must itself pass the check.
SCHEMA: dict[str, dict[str, tuple[Any, Callable[[Any], Any], Any]]] = {
    "grad_explosion": {
        "tag": ("train/grad_norm", _tag, "train/grad_norm"),
        "factor": (10.0, _above_one, 100.0),
        "z": (5.0, _positive, 8.0),
        "ceiling": (1e6, _positive, 1e5),
        # with action skip: also skip any step whose grad_norm >= this fixed limit
        # (MindFormers' global_norm_spike_threshold), besides factor x running median
        "skip_above": (None, _optional_positive, 10.0),
        # with action skip: also skip at factor x the running median (false: skip_above
        # and the ceiling only, as MindFormers' use_skip_data_by_global_norm does)
        "skip_relative": (True, _flag, False),
        "patience": (2, _count(1), 3),
        "window": (64, _count(4), 128),
        "min_history": (10, _count(2), 20),
    },
    "grad_vanishing": {
        "tag": ("train/grad_norm", _tag, "train/grad_norm"),
        "floor": (1e-3, _nonnegative, 1e-4),
        "factor": (100.0, _above_one, 1000.0),
        "patience": (3, _count(1), 5),
        "window": (64, _count(4), 128),
        "min_history": (10, _count(2), 20),
    },
    "nonfinite": {
        "tags": (["train/loss", "train/grad_norm"], _tags, ["train/loss", "train/grad_norm"]),
        "patience": (1, _count(1), 3),
    },
    "loss_spike": {
        "tag": ("train/loss", _tag, "train/loss"),
        "tail": (8.0, _positive, 10.0),
        "rel": (1.0, _nonnegative, 2.0),
        "hold": (3.0, _nonnegative, 5.0),
        "memory": (1000, _count(1), 5000),
        "scale": (0.25, _nonnegative, 0.5),
        "window": (50, _count(4), 100),
        "min_history": (20, _count(2), 30),
    },
    "loss_divergence": {
        "tag": ("train/loss", _tag, "train/loss"),
        "tail": (3.0, _positive, 4.0),
        "rel": (0.5, _nonnegative, 1.0),
        "patience": (3, _count(1), 5),
        "rise": (1.0, _positive, 2.0),
        "giveback": (0.5, _positive, 0.8),
        "span": (20, _count(1), 50),
        "hold": (1.0, _nonnegative, 2.0),
        "memory": (1000, _count(1), 5000),
        "scale": (0.25, _nonnegative, 0.5),
        "window": (50, _count(4), 100),
        "min_history": (20, _count(2), 30),
    },
    "loss_plateau": {
        "tag": ("train/loss", _tag, "train/loss"),
        "window": (100, _count(2), 500),
        "min_delta": (0.01, _fraction, 0.001),
        "span": (10, _count(1), 20),
        "max_progress": (0.1, _positive, 1.0),
    },
    "lr_zero": {
        "tag": ("train/learning_rate", _tag, "train/learning_rate"),
        "patience": (3, _count(1), 5),
    },
    "lr_warmup": {
        "tag": ("train/learning_rate", _tag, "train/learning_rate"),
        "warmup_steps": (None, _optional_count, 2000),
        "tiny": (1e-7, _nonnegative, 1e-8),
        "patience": (3, _count(2), 5),
    },
    "lr_decay": {
        "tag": ("train/learning_rate", _tag, "train/learning_rate"),
        "expect_by": (None, _optional_count, 10000),
        "min_drop": (0.1, _fraction, 0.5),
    },
    "lr_rise": {
        "tag": ("train/learning_rate", _tag, "train/learning_rate"),
        "factor": (2.0, _above_one, 3.0),
        "patience": (3, _count(2), 5),
        "settle": (10, _count(1), 20),
        "until": (None, _optional_count, 5000),
    },
    "rising_trend": {
        "tag": ("train/loss", _tag, "train/loss"),
        "grad_tag": ("train/grad_norm", _tag, "train/grad_norm"),
        "lr_tag": ("train/learning_rate", _tag, "train/learning_rate"),
        "window": (30, _count(5), 50),
        "factor": (1.0, _positive, 1.5),
        "companion_factor": (2.0, _above_one, 3.0),
        "t": (6.0, _positive, 8.0),
        "loss_t": (1.0, _nonnegative, 2.0),
        "lead_t": (6.0, _positive, 7.0),
        "lead_patience": (2, _count(1), 3),
        "patience": (3, _count(1), 5),
        "min_history": (30, _count(2), 50),
    },
    "adam_v_stale": {
        "grad_tag": ("train/grad_norm", _tag, "train/grad_norm"),
        "factor": (10.0, _above_one, 30.0),
        "z": (5.0, _positive, 8.0),
        "patience": (1, _count(1), 2),
        "window": (64, _count(4), 128),
        "min_history": (20, _count(2), 30),
    },
    "metric_missing": {
        "patience": (100, _count(1), 500),
    },
    "data_bound": {
        "share": (0.5, _fraction, 0.6),
        "window": (10, _count(2), 20),
        "min_wait": (0.001, _nonnegative, 0.005),
    },
    "step_order": {},
}

KINDS = tuple(SCHEMA)


def defaults() -> dict[str, Any]:
    """The resolved settings when ``monitor_config.alerts`` is empty."""
    return resolve_settings(None)


def _fail(path: str, value: Any, why: str, example: str) -> ConfigError:
    return ConfigError(f"monitor_config.alerts.{path}={value!r}: {why}; for example {example}")


def _yaml(value: Any) -> str:
    """``value`` spelled so YAML reads it back as the same type (1e-08 -> 1.0e-08)."""
    text = repr(value)
    if isinstance(value, float) and "e" in text and "." not in text.split("e")[0]:
        mantissa, exp = text.split("e")
        text = f"{mantissa}.0e{exp}"
    return text


def _example(kind: str, param: str, value: Any) -> str:
    return f"alerts: {{{kind}: {{{param}: {_yaml(value)}}}}}"


def _close(word: Any, options: list[str]) -> str:
    close = difflib.get_close_matches(str(word), options, n=1)
    return f" (did you mean {close[0]!r}?)" if close else ""


def _action(path: str, value: Any, example: str, kind: str | None = None) -> str:
    if value not in ACTIONS:
        hint = _close(value, list(ACTIONS)) if isinstance(value, str) else ""
        raise _fail(path, value, f"unknown action{hint}; use one of {', '.join(ACTIONS)}", example)
    if value == "skip" and kind not in SKIP_KINDS:
        what = f"{kind} judges" if kind else "a top-level action applies to every kind; most judge"
        raise _fail(
            path,
            value,
            f"skip drops one step's parameter update, so only the kinds that judge a single "
            f"step accept it ({', '.join(SKIP_KINDS)}); {what} more than one step",
            "alerts: {grad_explosion: {action: skip}}",
        )
    return value


def resolve_settings(alerts: Mapping[str, Any] | None) -> dict[str, Any]:
    """Defaults overlaid with ``alerts``, validated; raises ``ConfigError`` on bad input.

    Returns ``{kind: {param: value, ..., "action": "warn"}, ..., "disabled": [kinds],
    "max_skips_in_a_row": 10}`` with every kind present (disabled ones too, so their
    thresholds stay inspectable). A top-level ``action`` sets the default action of
    every kind (so it cannot be ``skip``, which only ``SKIP_KINDS`` accept);
    ``max_skips_in_a_row`` is how many updates ``skip`` may drop in a row before the
    run stops.
    """
    if alerts is None:
        alerts = {}
    if not isinstance(alerts, Mapping):
        raise ConfigError(
            f"monitor_config.alerts={alerts!r}: must be a mapping of alert kinds to "
            "settings; for example alerts: {grad_explosion: {factor: 100.0}}"
        )
    top = [*KINDS, "disabled", "action", "max_skips_in_a_row"]
    for key in alerts:
        if key not in top:
            raise ConfigError(
                f"monitor_config.alerts has no key {key!r}{_close(key, top)}; keys are the "
                f"alert kinds ({', '.join(KINDS)}), 'disabled', 'action' and "
                "'max_skips_in_a_row'; for example "
                "alerts: {grad_explosion: {factor: 100.0}, disabled: [loss_plateau]}"
            )
    default_action = _action(
        "action", alerts.get("action", DEFAULT_ACTION), "alerts: {action: snapshot}"
    )
    disabled = alerts.get("disabled", [])
    if not isinstance(disabled, list | tuple):
        raise _fail("disabled", disabled, "must be a list of alert kinds", "[loss_plateau]")
    for kind in disabled:
        if kind not in KINDS:
            raise _fail(
                "disabled",
                kind,
                f"unknown alert kind{_close(kind, list(KINDS))}; kinds: {', '.join(KINDS)}",
                "alerts: {disabled: [loss_plateau]}",
            )
    max_skips = alerts.get("max_skips_in_a_row", DEFAULT_MAX_SKIPS)
    try:
        max_skips = _count(1)(max_skips)
    except _Bad as exc:
        raise _fail(
            "max_skips_in_a_row", max_skips, str(exc), "alerts: {max_skips_in_a_row: 10}"
        ) from None
    out: dict[str, Any] = {
        "disabled": list(dict.fromkeys(disabled)),
        "max_skips_in_a_row": max_skips,
    }
    for kind, schema in SCHEMA.items():
        given = alerts.get(kind, {})
        if given is None:
            given = {}
        if not isinstance(given, Mapping):
            raise _fail(
                kind, given, "must be a mapping of thresholds", _example(kind, "action", "warn")
            )
        resolved = {param: copy.deepcopy(spec[0]) for param, spec in schema.items()}
        resolved["action"] = default_action
        for param, value in given.items():
            path = f"{kind}.{param}"
            if param == "action":
                resolved["action"] = _action(
                    path, value, _example(kind, "action", "snapshot"), kind
                )
                continue
            if param not in schema:
                params = [*schema, "action"]
                raise ConfigError(
                    f"monitor_config.alerts.{kind} has no setting {param!r}"
                    f"{_close(param, params)}; settings: {', '.join(params)}"
                )
            _default, check, example = schema[param]
            try:
                resolved[param] = check(value)
            except _Bad as exc:
                fix = _example(kind, param, example)
                if param == "skip_above":  # acts only with action skip: propose both
                    fix = f"alerts: {{{kind}: {{action: skip, skip_above: {_yaml(example)}}}}}"
                raise _fail(path, value, str(exc), fix) from None
        limit = resolved.get("skip_above")
        if limit is not None and resolved["action"] != "skip":
            raise _fail(
                f"{kind}.skip_above",
                limit,
                f"a skip threshold only acts with action: skip (this kind's action is "
                f"{resolved['action']!r})",
                f"alerts: {{{kind}: {{action: skip, skip_above: {_yaml(limit)}}}}}",
            )
        out[kind] = resolved
    return out
