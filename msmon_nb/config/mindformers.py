"""MindFormers' ``monitor_config`` keys read as ours (``TrainingStateMonitor``, mindformers 2.1.0).

A MindFormers YAML loads unchanged. Keys we have a meaning for are mapped onto
``MonitorConfig`` fields (``step_interval``, ``monitor_on``, ``dump_path`` and ``target``
are plain aliases in ``config.ALIASES``); keys asking for something we do not do yet are
named together in one ``MonitorWarning`` and ignored; a value MindFormers itself rejects
is a ``ConfigError`` naming the key, the value and a valid example. A key left at its
"off" value (a ``null`` format, a ``false`` switch) asks for nothing and passes silently,
because MindFormers' templates spell every key out.
"""

from __future__ import annotations

import math
import re
import warnings
from collections.abc import Mapping
from typing import Any

from msmon_nb.config.checks import CORE_METRICS, ConfigError, MonitorWarning, check_regex

# key -> what MindFormers does with it, as the warning names it
UNSUPPORTED = {
    "local_norm_format": "per-parameter local grad norms",
    "max_attention_logit_format": "max attention logits",
    "print_struct": "print the parameter names and stop",
    "stable_rank_config": "stable rank of the weights",
    "health_checkpoint": "checkpoint health by embedding norm",
}
FORMAT_KEYS = (
    "local_norm_format",
    "device_local_norm_format",
    "local_loss_format",
    "device_local_loss_format",
    "optimizer_state_format",
    "max_attention_logit_format",
    "weight_state_format",
)
MAPPED = (
    "invert",
    "device_local_norm_format",  # train/local_grad_norm per rank (collect/comm.py)
    "local_loss_format",  # train/local_loss per rank
    "device_local_loss_format",
    "optimizer_state_format",
    "weight_state_format",
    "check_for_global_norm",
    "global_norm_spike_threshold",
    "global_norm_spike_count_threshold",
    "use_skip_data_by_global_norm",
)
KEYS = frozenset(UNSUPPORTED) | frozenset(MAPPED)
# TrainingStateMonitor's threshold when check_for_global_norm is on and none is given
DEFAULT_SPIKE_THRESHOLD = 3.0
# the train-step wrapper's threshold when use_skip_data_by_global_norm is on and none is
# given (BaseTrainer.create_model_wrapper's default)
DEFAULT_SKIP_THRESHOLD = 1.0
_LEADING_FLAGS = re.compile(r"^\(\?([aiLmsux]+)\)")


def _fail(key: str, value: Any, why: str, example: str) -> ConfigError:
    return ConfigError(
        f"monitor_config.{key}={value!r}: {why} (a MindFormers TrainingStateMonitor key); "
        f"for example {example}"
    )


def _format(key: str, value: Any) -> bool:
    """True when the format asks for output; raises on what MindFormers rejects."""
    if value is None:
        return False
    formats = [value] if isinstance(value, str) else value
    if not isinstance(formats, list | tuple) or any(
        f not in ("tensorboard", "log") for f in formats
    ):
        raise _fail(
            key, value, "must be 'tensorboard', 'log', a list of them, or null", f"{key}: ['log']"
        )
    return bool(formats)


def _bool(key: str, value: Any) -> bool:
    if value is None:
        return False
    if not isinstance(value, bool):
        raise _fail(key, value, "must be true or false", f"{key}: true")
    return value


def _threshold(value: Any) -> float:
    key = "global_norm_spike_threshold"
    number = value
    if isinstance(number, str):  # PyYAML (YAML 1.1) reads 1e4 as text
        try:
            number = float(number)
        except ValueError:
            pass
    if (
        isinstance(number, bool)
        or not isinstance(number, int | float)
        or not math.isfinite(number)
        or number <= 0
    ):
        raise _fail(key, value, "must be a number > 0", f"{key}: 3.0")
    return float(number)


def invert_targets(targets: list[str]) -> str:
    """One regex that ``re.search`` finds in a name exactly when none of ``targets`` does.

    MindFormers selects a parameter when any target is found in its name (``re.search``),
    and with ``invert`` selects the others; our consumers search a list of regexes, so the
    inversion is a start-anchored negative lookahead per target. A leading global flag
    group such as ``(?i)`` becomes a scoped one, since Python rejects global flags inside.
    """
    parts = []
    for pattern in targets:
        check_regex("target", pattern, "['layers.[01]']", fail=_fail)
        flags = _LEADING_FLAGS.match(pattern)
        if flags:
            pattern = f"(?{flags.group(1)}:{pattern[flags.end() :]})"
        parts.append(f"(?![\\s\\S]*?(?:{pattern}))")
    return "^" + "".join(parts)


def apply_mindformers(mf: Mapping[str, Any], kwargs: dict[str, Any]) -> list[str]:
    """Map the MindFormers-only keys ``mf`` into ``kwargs`` (our field names).

    Returns the keys that ask for something unsupported, in the order given.
    """
    for key in FORMAT_KEYS:
        if key in mf:
            _format(key, mf[key])
    for key in ("invert", "check_for_global_norm", "use_skip_data_by_global_norm", "print_struct"):
        if key in mf:
            _bool(key, mf[key])
    threshold = None
    if mf.get("global_norm_spike_threshold") is not None:
        threshold = _threshold(mf["global_norm_spike_threshold"])
    count = mf.get("global_norm_spike_count_threshold")
    if count is not None and (isinstance(count, bool) or not isinstance(count, int) or count < 1):
        raise _fail(
            "global_norm_spike_count_threshold",
            count,
            "must be a whole number >= 1",
            "global_norm_spike_count_threshold: 10",
        )
    for key in ("stable_rank_config", "health_checkpoint"):
        if mf.get(key) is not None and not isinstance(mf[key], Mapping):
            raise _fail(key, mf[key], "must be a mapping or null", f"{key}: null")

    check = _bool("check_for_global_norm", mf.get("check_for_global_norm"))
    skip = _bool("use_skip_data_by_global_norm", mf.get("use_skip_data_by_global_norm"))
    if check and skip:
        raise ConfigError(
            "monitor_config sets both check_for_global_norm and use_skip_data_by_global_norm; "
            "MindFormers allows one of them; for example check_for_global_norm: true, "
            "use_skip_data_by_global_norm: false"
        )
    if check:
        _set_ceiling(kwargs, DEFAULT_SPIKE_THRESHOLD if threshold is None else threshold)
    if skip:
        _set_skip(kwargs, DEFAULT_SKIP_THRESHOLD if threshold is None else threshold, count)
    targets = kwargs.get("param_targets", [".*"])
    if _bool("invert", mf.get("invert")) and isinstance(targets, list | tuple):
        kwargs["param_targets"] = [invert_targets(list(targets))]  # else validate() names it
    for key, metric in (
        ("weight_state_format", "param_stats"),
        ("optimizer_state_format", "optimizer_state"),  # collect/optstate.py
        # each rank records its local norm/loss whenever it tracks the global one
        ("device_local_norm_format", "grad_norm"),
        ("local_loss_format", "loss"),
        ("device_local_loss_format", "loss"),
    ):
        if _format(key, mf.get(key)):
            metrics = kwargs.get("track_metrics", list(CORE_METRICS))
            if isinstance(metrics, list | tuple) and metric not in metrics:
                kwargs["track_metrics"] = [*metrics, metric]

    ignored = []
    for key, value in mf.items():
        if key not in UNSUPPORTED:
            continue
        asks = _format(key, value) if key in FORMAT_KEYS else bool(value)
        if key == "stable_rank_config":
            asks = bool(value) and _format("stable_rank_config.format", value.get("format"))
        if asks:
            ignored.append(key)
    return ignored


def _explosion(kwargs: dict[str, Any]) -> tuple[dict[str, Any], dict[str, Any]] | None:
    """Copies of the ``alerts`` mapping and its ``grad_explosion`` entry, which the
    MindFormers global-norm keys map onto; None when the user's entry is not a mapping
    (``resolve_settings`` names that bad value)."""
    alerts = kwargs.get("alerts")
    alerts = dict(alerts) if isinstance(alerts, Mapping) else {}
    if alerts.get("grad_explosion") is not None and not isinstance(
        alerts["grad_explosion"], Mapping
    ):
        return None
    return alerts, dict(alerts.get("grad_explosion") or {})


def _set_ceiling(kwargs: dict[str, Any], threshold: float) -> None:
    found = _explosion(kwargs)
    if found is None:
        return
    alerts, explosion = found
    if explosion.get("ceiling", threshold) != threshold:
        raise ConfigError(
            f"monitor_config sets the grad_norm ceiling twice: check_for_global_norm with "
            f"global_norm_spike_threshold={threshold!r} and alerts.grad_explosion.ceiling="
            f"{explosion['ceiling']!r}; keep one, for example alerts: "
            "{grad_explosion: {ceiling: 3.0}}"
        )
    if "grad_explosion" in (alerts.get("disabled") or []):
        raise ConfigError(
            "monitor_config sets check_for_global_norm: true but alerts.disabled lists "
            "grad_explosion, the alert it maps to; for example alerts: {disabled: []}"
        )
    explosion["ceiling"] = threshold
    alerts["grad_explosion"] = explosion
    kwargs["alerts"] = alerts


def _set_skip(kwargs: dict[str, Any], threshold: float, count: int | None) -> None:
    """use_skip_data_by_global_norm: skip the update of a step whose global norm is at or
    above the threshold (fixed, as MindFormers does: no relative criterion), and stop
    after ``global_norm_spike_count_threshold`` such steps in a row."""
    found = _explosion(kwargs)
    if found is None:
        return
    alerts, explosion = found
    for key, value in (("action", "skip"), ("skip_above", threshold)):
        if explosion.get(key, value) != value:
            raise ConfigError(
                f"monitor_config sets use_skip_data_by_global_norm (grad_explosion {key} "
                f"{value!r}) and alerts.grad_explosion.{key}={explosion[key]!r}; keep one, "
                f"for example alerts: {{grad_explosion: {{action: skip, skip_above: "
                f"{threshold!r}}}}}"
            )
    if "grad_explosion" in (alerts.get("disabled") or []):
        raise ConfigError(
            "monitor_config sets use_skip_data_by_global_norm: true but alerts.disabled "
            "lists grad_explosion, the alert it maps to; for example alerts: {disabled: []}"
        )
    explosion.setdefault("skip_relative", False)
    explosion.update(action="skip", skip_above=threshold)
    alerts["grad_explosion"] = explosion
    if count is not None:
        given = alerts.get("max_skips_in_a_row", count)
        if given != count:
            raise ConfigError(
                f"monitor_config sets global_norm_spike_count_threshold={count!r} and "
                f"alerts.max_skips_in_a_row={given!r}; keep one, for example alerts: "
                f"{{max_skips_in_a_row: {count!r}}}"
            )
        alerts["max_skips_in_a_row"] = count
    kwargs["alerts"] = alerts


def warn_ignored(keys: list[str], stacklevel: int = 3) -> None:
    """One ``MonitorWarning`` naming every ignored MindFormers key."""
    if not keys:
        return
    listed = "; ".join(f"{key} ({UNSUPPORTED.get(key, 'not mapped')})" for key in keys)
    warnings.warn(
        f"msmon: MindFormers monitor_config keys not supported yet, ignored: {listed}. "
        "The rest of the block is used (README, 'Coming from MindFormers').",
        MonitorWarning,
        stacklevel=stacklevel,
    )
