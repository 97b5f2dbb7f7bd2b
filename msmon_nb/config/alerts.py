"""The ``monitor_config.alerts`` schema: defaults, validation, resolved thresholds.

``resolve_settings(alerts)`` is the one place user input about alerts is checked; a bad
value raises ``ConfigError`` naming the key, the value and a valid example, like every
other ``monitor_config`` field. ``MonitorConfig.validate`` can call it, so a typo fails
when the config is loaded rather than a thousand steps into training.

The kinds, their parameters, defaults, checks and examples are the alert cards
(``config.cards``); this module only turns them into validation and error messages.
"""

from __future__ import annotations

import difflib
from collections.abc import Mapping
from typing import Any

from msmon_nb.config.cards import CARDS, KINDS, SKIP_KINDS, Card
from msmon_nb.config.checks import ConfigError
from msmon_nb.config.params import BadValue, count

# ``checkpoint`` saves the network and optimizer state at the step boundary after the
# alert (``monitor.actions``), so a run that goes wrong can be resumed from before it
ACTIONS = ("warn", "snapshot", "stop", "debug", "skip", "checkpoint")
DEFAULT_ACTION = "warn"
# updates skipped in a row before the run stops (MindFormers'
# global_norm_spike_count_threshold; its documented example is 10)
DEFAULT_MAX_SKIPS = 10
# kind -> parameter -> (default, check, example), read from the cards: the form this
# module exported before the cards existed
SCHEMA: dict[str, dict[str, tuple[Any, Any, Any]]] = {
    kind: {name: (s.default, s.check, s.example) for name, s in CARDS[kind].params.items()}
    for kind in KINDS
}


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
        max_skips = count(1)(max_skips)
    except BadValue as exc:
        raise _fail(
            "max_skips_in_a_row", max_skips, str(exc), "alerts: {max_skips_in_a_row: 10}"
        ) from None
    out: dict[str, Any] = {
        "disabled": list(dict.fromkeys(disabled)),
        "max_skips_in_a_row": max_skips,
    }
    for kind in KINDS:
        out[kind] = _resolve_kind(CARDS[kind], alerts.get(kind), default_action)
    return out


def _resolve_kind(card: Card, given: Any, default_action: str) -> dict[str, Any]:
    """One kind's card defaults overlaid with what the user gave, each value checked."""
    kind = card.kind
    if given is None:
        given = {}
    if not isinstance(given, Mapping):
        raise _fail(
            kind, given, "must be a mapping of thresholds", _example(kind, "action", "warn")
        )
    resolved = card.defaults()
    resolved["action"] = default_action
    for name, value in given.items():
        path = f"{kind}.{name}"
        if name == "action":
            resolved["action"] = _action(path, value, _example(kind, "action", "snapshot"), kind)
            continue
        spec = card.params.get(name)
        if spec is None:
            names = [*card.params, "action"]
            raise ConfigError(
                f"monitor_config.alerts.{kind} has no setting {name!r}"
                f"{_close(name, names)}; settings: {', '.join(names)}"
            )
        try:
            resolved[name] = spec.check(value)
        except BadValue as exc:
            fix = _example(kind, name, spec.example)
            if spec.skip_only:  # acts only with action skip: propose both
                fix = f"alerts: {{{kind}: {{action: skip, {name}: {_yaml(spec.example)}}}}}"
            raise _fail(path, value, str(exc), fix) from None
    for name, spec in card.params.items():
        limit = resolved[name]
        if spec.skip_only and limit is not None and resolved["action"] != "skip":
            raise _fail(
                f"{kind}.{name}",
                limit,
                f"a skip threshold only acts with action: skip (this kind's action is "
                f"{resolved['action']!r})",
                f"alerts: {{{kind}: {{action: skip, {name}: {_yaml(limit)}}}}}",
            )
    return resolved
