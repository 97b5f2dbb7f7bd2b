"""What every part of the configuration shares: the metric and output names, the tag
rule, the error a bad value raises and the warning a monitoring failure gives.

A leaf (standard library only): ``config.model``, ``config.alerts``,
``config.mindformers`` and every room that checks a tag or raises ``ConfigError`` import
it without pulling the rest of the configuration in.
"""

from __future__ import annotations

import re
from collections.abc import Callable
from typing import Any

CORE_METRICS = ("loss", "grad_norm", "learning_rate", "throughput", "step_time", "global_step")
OPTIONAL_METRICS = (
    "param_stats",
    "optimizer_state",
    "system",
    "activations",
    "act_grad",
    "attention",
    "stable_rank",
    "moe",
)
# where a step's time went (recorded by collect, judged by diagnose's data_bound rule)
DATA_TAG = "train/data_time"
COMPUTE_TAG = "train/compute_time"
KNOWN_METRICS = CORE_METRICS + OPTIONAL_METRICS
# what ``param_stat_kinds`` may list: each is recorded for weights, gradients and moments
# as ``param/<name>/<weight|grad|moment1|...>_<kind>`` (``metrics.extent``, a twin list
# that a test keeps equal: ``metrics`` may not import ``config``)
PARAM_STAT_KINDS = ("norm", "max_abs", "nonfinite", "zero_frac")
MONITOR_TYPES = ("summary", "mindinsight", "file", "mlflow", "tensorboard")

TAG_RULE = (
    "lowercase ASCII letters, digits, '_', '-' and '.', in groups separated by '/' "
    "(e.g. 'val/f1' or 'train/tokens_per_s')"
)
TAG_RE = re.compile(r"^[a-z0-9_][a-z0-9_.\-]*(/[a-z0-9_][a-z0-9_.\-]*)*$")
NAME_RE = re.compile(r"^[A-Za-z0-9_][A-Za-z0-9_.\-]*$")


class ConfigError(ValueError):
    """A monitor_config value is invalid; the message names field, value and a fix."""


def optimizer_series(tag: str) -> tuple[str, str] | None:
    """``opt/netd/grad_norm`` -> ``("netd", "grad_norm")``: the optimizer a series
    belongs to (two or more stepping in one iteration, docs/ARCHITECTURE.md Tags) and
    what it measures; None for any other tag. ``metrics.charts.optimizer_of`` is the same rule
    for the rooms that may not import ``config`` (a test keeps the two equal)."""
    if not tag.startswith("opt/"):
        return None
    name, sep, metric = tag[4:].partition("/")
    return (name, metric) if name and sep and metric else None


def suggest_tag(tag: str) -> str:
    """A valid spelling close to ``tag``."""
    ascii_only = tag.encode("ascii", "ignore").decode().lower()
    cleaned = re.sub(r"[^a-z0-9_.\-/]+", "_", ascii_only)
    parts = [p.strip("_") or "x" for p in cleaned.strip("/").split("/") if p]
    return "/".join(parts) or "metric"


def check_tag(tag: Any, field_name: str = "tag") -> str:
    """Return ``tag`` when it follows the tag rule, else raise ``ConfigError``."""
    if not isinstance(tag, str) or not TAG_RE.match(tag):
        hint = f"; did you mean {suggest_tag(tag)!r}?" if isinstance(tag, str) else ""
        raise ConfigError(f"{field_name}={tag!r} breaks the tag rule: {TAG_RULE}{hint}")
    return tag


def fail(name: str, value: Any, why: str, example: str) -> ConfigError:
    return ConfigError(f"monitor_config.{name}={value!r}: {why}; for example {example}")


def check_regex(
    name: str,
    pattern: Any,
    example: str,
    fail: Callable[[str, Any, str, str], ConfigError] = fail,
) -> None:
    """Raise ``fail(...)`` naming ``name`` when ``pattern`` is not a valid regex."""
    try:
        re.compile(pattern)
    except (re.error, TypeError) as exc:
        raise fail(name, pattern, f"is not a valid regex ({exc})", example) from exc


def check_regexes(name: str, value: Any, over: str, default: str, example: str) -> None:
    """``value`` is null or a non-empty list of valid regexes (``module_targets``,
    ``attention_targets``, ``stable_rank_targets``...); else ``fail(...)`` names ``name``,
    what its regexes are searched in (``over``) and what null means (``default``)."""
    if value is None:
        return
    if not isinstance(value, list | tuple) or isinstance(value, str) or not value:
        raise fail(
            name,
            value,
            f"must be a non-empty list of regexes over {over}, or null ({default})",
            example,
        )
    for pattern in value:
        check_regex(name, pattern, example)


class MonitorWarning(UserWarning):
    """Something in monitoring failed; training continues without it."""
