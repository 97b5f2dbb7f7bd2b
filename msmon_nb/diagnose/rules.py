"""The rule registry (kind -> rule class, severity) and ``detect``, the pure-function
form of every rule: a whole series in, the alerts it raises out.

``detect`` runs the same incremental rule objects the live engine uses, so what a test,
the viewer or a post-mortem script finds over a finished series is exactly what the
``Diagnoser`` reported step by step.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

from msmon_nb.config.alerts import KINDS, resolve_settings
from msmon_nb.diagnose.alert import Alert
from msmon_nb.diagnose.grad import GradExplosion, GradVanishing
from msmon_nb.diagnose.loss import LossDivergence, LossPlateau, LossSpike
from msmon_nb.diagnose.lr import LrDecay, LrWarmup, LrZero
from msmon_nb.diagnose.steps import NonFinite, StepOrder
from msmon_nb.diagnose.trend import LrRise, RisingTrend
from msmon_nb.diagnose.window import Levels

# Rules fed one tag's finite values, in the order the engine evaluates them.
SERIES_RULES: dict[str, type] = {
    "grad_explosion": GradExplosion,
    "grad_vanishing": GradVanishing,
    "loss_spike": LossSpike,
    "loss_divergence": LossDivergence,
    "loss_plateau": LossPlateau,
    "lr_zero": LrZero,
    "lr_warmup": LrWarmup,
    "lr_decay": LrDecay,
    "lr_rise": LrRise,
    "rising_trend": RisingTrend,
}

SEVERITY: dict[str, str] = {
    "nonfinite": "critical",
    "grad_explosion": "critical",
    "loss_divergence": "critical",
    "grad_vanishing": "warning",
    "loss_spike": "warning",
    "loss_plateau": "warning",
    "lr_zero": "warning",
    "lr_warmup": "warning",
    "lr_decay": "warning",
    "lr_rise": "warning",
    "rising_trend": "warning",
    "metric_missing": "warning",
    "data_bound": "warning",
    "adam_v_stale": "warning",
    "step_order": "warning",
}


# Rules that judge a value against the running level of its series, and how they read it.
_LEVEL_KINDS = {
    "grad_explosion": {"log": True},
    "grad_vanishing": {"log": True},
    "loss_spike": {"upper": True},
    "loss_divergence": {"upper": True},
}


# settings that say what the monitor does about a finding, not how to find it
_NOT_RULE_PARAMS = ("action", "skip_above", "skip_relative")


def make_rule(kind: str, params: dict[str, Any], shared: dict | None = None) -> Any:
    """A fresh rule object for ``kind`` from its resolved settings (``action`` and the
    skip settings ignored).

    Rules of one tag that keep the same kind of window share it through ``shared``
    (a dict the caller keeps for the rules of one engine), so it is fed once per step.
    """
    cls = SERIES_RULES[kind]
    kwargs = {k: v for k, v in params.items() if k not in _NOT_RULE_PARAMS}
    how = _LEVEL_KINDS.get(kind)
    if how is not None and shared is not None:
        key = (params["tag"], params["window"], tuple(sorted(how)))
        levels = shared.get(key)
        if levels is None:
            levels = shared[key] = Levels(params["window"], **how)
        kwargs["levels"] = levels
    return cls(**kwargs)


def detect(
    kind: str,
    steps: Iterable[int],
    values: Iterable[float] | None = None,
    *,
    tag: str | None = None,
    rank: int | None = None,
    **params: Any,
) -> list[Alert]:
    """Run one rule over a whole series; ``params`` override its defaults (validated).

    ``steps`` and ``values`` are parallel sequences (lists or numpy arrays) in arrival
    order. As in the engine, NaN/Inf reach only ``nonfinite``. ``step_order`` looks at
    ``steps`` only. ``metric_missing`` spans several series: use ``Diagnoser``.

    >>> detect("lr_zero", [0, 1, 2, 3], [0.1, 0.0, 0.0, 0.0])[0].since_step
    1
    """
    if kind not in KINDS:
        raise ValueError(f"unknown alert kind {kind!r}; kinds: {', '.join(KINDS)}")
    settings = resolve_settings({kind: params})[kind]
    severity = SEVERITY[kind]
    step_list = [int(s) for s in (steps.tolist() if hasattr(steps, "tolist") else steps)]
    out: list[Alert] = []
    if kind == "step_order":
        name = tag or ""
        order = StepOrder()
        for step in step_list:
            for _tag, f in order.update(step, (name,)):
                out.append(Alert(step, kind, severity, f.message, f.since_step, name, None, rank))
        return out
    if kind in ("metric_missing", "data_bound", "adam_v_stale"):
        raise ValueError(f"{kind} spans several series; feed a Diagnoser instead")
    if values is None:
        raise ValueError(f"{kind} needs values")
    value_list = [float(v) for v in (values.tolist() if hasattr(values, "tolist") else values)]
    if len(value_list) != len(step_list):
        raise ValueError(f"{len(step_list)} steps but {len(value_list)} values")
    if kind == "nonfinite":
        name = tag or settings["tags"][0]
        rule: Any = NonFinite(tag=name, patience=settings["patience"])
        finite_only = False
    else:
        if tag is not None:
            settings["tag"] = tag
        name = settings["tag"]
        rule = make_rule(kind, settings)
        finite_only = True
    for step, value in zip(step_list, value_list, strict=True):
        if finite_only and value - value != 0.0:
            continue
        f = rule.update(step, value)
        if f is not None:
            out.append(Alert(step, kind, severity, f.message, f.since_step, name, f.value, rank))
    return out
