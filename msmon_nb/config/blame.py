"""The ``monitor_config.blame`` schema: which layer started a gradient or loss alert.

``resolve_blame(blame)`` checks the user's mapping and returns every key filled in; a
bad value raises ``ConfigError`` naming the key, the value and a valid example, as every
other ``monitor_config`` field does, so a typo fails when the config is loaded.

Keys (docs/guide/alerts.md, "Which layer started it"):

- ``enabled``: keep per-parameter gradient norms of the last collected steps and name,
  in gradient and loss alerts, the parameters whose norms rose first and most;
- ``steps``: how many collected steps the ring buffer keeps (the history each
  parameter's norm is judged against);
- ``z``: the robust z-score (median/MAD of the log norm) over which a parameter "rose";
  tuned on ``bench/blame.py``'s tuning set, reported on its held-out set;
- ``top``: how many parameters an alert names;
- ``detail_steps``: after such an alert, record ``param/<name>/grad_norm``,
  ``weight_norm`` and ``update_ratio`` for this many steps (0: never);
- ``update_ratio``: on every collected step, also measure each parameter's update ratio
  ``||w - w_prev|| / ||w_prev||`` from the Parameters (kept in the ring beside the
  gradient norms; the ``layer_rise`` alert and blame read it);
- ``ratio_mb``: the most host memory the float32 copies of ``w_prev`` may take; the
  parameters past it (in the optimizer's order) are not measured, said once.
"""

from __future__ import annotations

import difflib
import math
from collections.abc import Mapping
from typing import Any

from msmon_nb.config.checks import ConfigError

# key -> default
BLAME_DEFAULTS: dict[str, Any] = {
    "enabled": True,
    "steps": 128,
    "z": 6.0,
    "top": 3,
    "detail_steps": 50,
    # opt-in: a pass over the weights and a host copy of them on every collected step
    # (0.4-0.6 ms on the overhead bench's 6.5 ms MLP step, against a 1 % budget)
    "update_ratio": False,
    "ratio_mb": 512,
}
MIN_STEPS = 8  # fewer rows give no median/MAD worth the name


def blame_on(config: Any) -> bool:
    """Whether a run with ``config`` (a ``MonitorConfig``) keeps per-parameter gradient
    norms: blame enabled, and grad_norm tracked (they come from the same pass)."""
    return bool(resolve_blame(config.blame)["enabled"]) and config.tracks("grad_norm")


def keeps_param_norms(config: Any) -> bool:
    """Whether the ways in measure each parameter's gradient norm: for blame, or for
    ``param_stats``' ``param/<name>/grad_norm`` where the gradients stay inside a graph
    (the optimizer tap's per-gradient norms are the only ones there)."""
    return blame_on(config) or config.tracks("param_stats")


def _bad(key: str, value: Any, why: str, example: str) -> ConfigError:
    return ConfigError(f"monitor_config.blame.{key}={value!r}: {why}; for example blame: {example}")


def resolve_blame(blame: Any) -> dict[str, Any]:
    """``blame`` with every key present, checked (module docstring)."""
    if blame is None:
        blame = {}
    if not isinstance(blame, Mapping):
        raise ConfigError(
            f"monitor_config.blame={blame!r}: must be a mapping; for example "
            "blame: {steps: 128, detail_steps: 50}"
        )
    out = dict(BLAME_DEFAULTS)
    for key, value in blame.items():
        if key not in BLAME_DEFAULTS:
            close = difflib.get_close_matches(str(key), list(BLAME_DEFAULTS), n=1)
            hint = f"; did you mean {close[0]!r}?" if close else ""
            raise ConfigError(
                f"monitor_config.blame has no key {key!r}{hint} (keys: {', '.join(BLAME_DEFAULTS)})"
            )
        out[key] = _check(key, value)
    return out


def _whole(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def _check(key: str, value: Any) -> Any:
    if key in ("enabled", "update_ratio"):
        if not isinstance(value, bool):
            raise _bad(key, value, "must be true or false", f"{{{key}: false}}")
        return value
    if key == "ratio_mb":
        if not _whole(value) or value < 1:
            raise _bad(key, value, "must be a whole number of MB >= 1", "{ratio_mb: 1024}")
        return value
    if key == "steps":
        if not _whole(value) or value < MIN_STEPS:
            raise _bad(key, value, f"must be a whole number >= {MIN_STEPS}", "{steps: 128}")
        return value
    if key == "top":
        if not _whole(value) or value < 1:
            raise _bad(key, value, "must be a whole number >= 1", "{top: 3}")
        return value
    if key == "detail_steps":
        if not _whole(value) or value < 0:
            raise _bad(key, value, "must be a whole number >= 0 (0: off)", "{detail_steps: 50}")
        return value
    # z
    if isinstance(value, str):  # PyYAML reads 1e1 (no dot) as text
        try:
            value = float(value)
        except ValueError:
            pass
    if isinstance(value, bool) or not isinstance(value, int | float) or not math.isfinite(value):
        raise _bad(key, value, "must be a finite number > 0", "{z: 6.0}")
    if value <= 0:
        raise _bad(key, value, "must be a finite number > 0", "{z: 6.0}")
    return float(value)
