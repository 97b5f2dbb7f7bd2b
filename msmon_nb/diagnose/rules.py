"""The rule registry (kind -> rule class, from the cards) and ``detect``, the pure-function
form of every rule: a whole series in, the alerts it raises out.

``detect`` runs the same incremental rule objects the live engine uses, so what a test,
the viewer or a post-mortem script finds over a finished series is exactly what the
``Diagnoser`` reported step by step.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

from msmon_nb.config.alerts import resolve_settings
from msmon_nb.config.cards import CARDS, KINDS
from msmon_nb.diagnose import activations, attention, grad, layers, loss, lr, optim, pipeline, trend
from msmon_nb.diagnose import steps as stream
from msmon_nb.diagnose.alert import Alert
from msmon_nb.diagnose.base import RULES
from msmon_nb.diagnose.window import Levels

# the modules whose rule classes register themselves with their cards (``RULES``); a
# rule in a new module is found once the module is named here
RULE_MODULES = (activations, attention, grad, layers, loss, lr, optim, pipeline, stream, trend)

# Rules fed one tag's finite values (the cards' feed "series"), in the order the engine
# evaluates them: the cards' order.
SERIES_RULES: dict[str, type] = {
    kind: RULES[kind] for kind, card in CARDS.items() if card.feed == "series"
}
# kind -> "warning" | "critical" of the configurable kinds (``config.cards.SEVERITY``
# has the cross-rank kinds too)
SEVERITY: dict[str, str] = {kind: CARDS[kind].severity for kind in KINDS}
__all__ = ["RULES", "SERIES_RULES", "SEVERITY", "detect", "make_rule"]


def make_rule(kind: str, params: dict[str, Any], shared: dict | None = None) -> Any:
    """A fresh rule object for a series kind from its resolved settings.

    Rules of one tag whose cards read the same kind of running level share it through
    ``shared`` (a dict the caller keeps for the rules of one engine), so it is fed once
    per step.
    """
    cls = SERIES_RULES[kind]
    how = cls.card.level
    if how is None:
        return cls(params)
    levels = None
    if shared is not None:
        key = (params["tag"], params["window"], tuple(sorted(how)))
        levels = shared.get(key)
        if levels is None:
            levels = shared[key] = Levels(params["window"], **how)
    return cls(params, levels)


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
    card = CARDS[kind]
    severity = card.severity
    step_list = [int(s) for s in (steps.tolist() if hasattr(steps, "tolist") else steps)]
    out: list[Alert] = []
    if card.feed == "steps":
        name = tag or ""
        order = RULES[kind](settings)
        for step in step_list:
            for _tag, f in order.update(step, (name,)):
                out.append(Alert(step, kind, severity, f.message, f.since_step, name, None, rank))
        return out
    if card.feed == "several":
        raise ValueError(f"{kind} spans several series; feed a Diagnoser instead")
    if values is None:
        raise ValueError(f"{kind} needs values")
    value_list = [float(v) for v in (values.tolist() if hasattr(values, "tolist") else values)]
    if len(value_list) != len(step_list):
        raise ValueError(f"{len(step_list)} steps but {len(value_list)} values")
    if card.feed == "values":
        name = tag or settings["tags"][0]
        rule: Any = RULES[kind](settings, name)
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
