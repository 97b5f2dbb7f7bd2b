"""``Diagnoser``: every enabled rule, evaluated incrementally once per collected step.

Each rule keeps O(window) state (ring buffers and running statistics), so a step costs
the same at step 10 and at step 10 million; ``bench/diagnose.py`` measures it. The
engine reports an anomaly once, when it starts, and again only after the rule saw it
clear and it came back.
"""

from __future__ import annotations

import dataclasses
import heapq
from collections.abc import Callable, Iterable, Mapping, Sequence
from typing import Any

from msmon_nb.config import COMPUTE_TAG, DATA_TAG
from msmon_nb.config.alerts import resolve_settings
from msmon_nb.config.cards import CARDS, GRAD, LOSS, LR, SEVERITY
from msmon_nb.config.checks import optimizer_series
from msmon_nb.diagnose.activations import (
    ACT_RULES,
    ActivationBlowup,
    ActStep,
    OutputLogitDivergence,
    act_tag,
)
from msmon_nb.diagnose.alert import Alert
from msmon_nb.diagnose.attention import AttentionGrowth, is_max_logit
from msmon_nb.diagnose.converge import Convergence
from msmon_nb.diagnose.layers import LayerRise
from msmon_nb.diagnose.optim import AdamVStale, is_moment2_tag
from msmon_nb.diagnose.pipeline import DataBound
from msmon_nb.diagnose.rules import SERIES_RULES, make_rule
from msmon_nb.diagnose.steps import MetricMissing, NonFinite, StepOrder

# the tags a train step's loss scaler is recorded under (collect.gradsource)
OVERFLOW_TAG = "train/overflow"
LOSS_SCALE_TAG = "train/loss_scale"
# the whole-step tags each optimizer has its own series of when two or more step in one
# iteration (opt/<name>/loss...): a rule configured on one of them also judges each
# optimizer's own series, on its own
PER_OPTIMIZER = frozenset({LOSS, GRAD, LR})


class Diagnoser:
    """Alert rules over a live run's scalars (see the package docstring for the contract).

    Args:
        settings: ``monitor_config.alerts`` (validated here too; ``ConfigError`` on a bad
            value), or None for the defaults.
        tracked: ``monitor_config.track_metrics``. Entries that are tags (contain '/',
            e.g. 'val/f1') are watched by ``metric_missing``; bare core names ('loss',
            'grad_norm') are ignored, because whether the monitor can produce those
            depends on the way in (an explicit ``mon.step(loss=...)`` has no grads).
        rank: stamped on every alert (distributed runs).
    """

    def __init__(
        self,
        settings: Mapping[str, Any] | None = None,
        tracked: Iterable[str] | None = None,
        *,
        rank: int | None = None,
    ) -> None:
        self.settings: dict[str, Any] = resolve_settings(settings)
        self.rank = rank
        self._disabled = disabled = set(self.settings["disabled"])
        # tag -> ([(kind, rule)...], NonFinite | None): one lookup per tag per step
        self._routes: dict[str, tuple[list[tuple[str, Any]], NonFinite | None]] = {}
        # tag -> observe(tag, value) of rules that read other series of the same step
        # (rising_trend: grad_norm and lr next to the loss); fed before any rule runs
        self._observers: dict[str, list[Callable[[str, float], None]]] = {}
        self._shared: dict = {}
        convergence, _ = self._wire(lambda tag: tag)
        # the optimizers whose own series (opt/<name>/<metric>) have rules, and the opt/
        # tags already looked at: an optimizer's rules are made when its first series
        # appears (two or more optimizers stepping in one iteration: docs/ARCHITECTURE.md,
        # Tags)
        self._optimizers: set[str] = set()
        self._opt_seen: set[str] = set()
        self._order = self._make(StepOrder, disabled)
        tags = [t for t in (tracked or ()) if "/" in t]
        self._missing = (
            MetricMissing(self.settings[MetricMissing.kind], tags)
            if tags and MetricMissing.kind not in disabled
            else None
        )
        self._data_bound = self._make(DataBound, disabled)
        vstale = self.settings[AdamVStale.kind]
        self._vstale = self._make(AdamVStale, disabled)
        if self._vstale is not None:
            self._vstale.convergence = convergence
        self._vstale_tag = vstale["grad_tag"]
        # ("v"|"g", step) -> a half of adam_v_stale's input waiting for the other half;
        # empty until the first moment2 tag arrives, so runs without it pay nothing
        self._v_pending: dict[tuple[str, int], float] = {}
        self._layers = self._make(LayerRise, disabled)
        self._attn = self._make(AttentionGrowth, disabled)
        # the activation rules (act/<module>/<stat>), fed one step's modules at once
        self._acts = [rule for rule in map(lambda c: self._make(c, disabled), ACT_RULES) if rule]
        self._act_step = ActStep()
        if OutputLogitDivergence.kind not in disabled:
            for rule in self._acts:
                if isinstance(rule, ActivationBlowup):
                    rule.output = self.settings[OutputLogitDivergence.kind]["module"] or ""
        # (kind, tag) -> its latest alert and whether that anomaly is still going on
        self._latest: dict[tuple[str, str], tuple[Alert, Callable[[], bool]]] = {}

    def _wire(
        self, rename: Callable[[str], str | None]
    ) -> tuple[Convergence | None, list[tuple[str, Callable]]]:
        """Make the series rules and ``nonfinite`` for the tags ``rename`` gives the
        configured ones (None: not this set's), with their own convergence judge; route
        them. The identity makes the run's rules; an optimizer's renaming makes its own
        (``opt/netd/grad_norm`` judged as ``train/grad_norm`` is, never against another
        optimizer's values). Returns the judge and the (tag, observe) pairs it added."""
        settings, disabled, routes = self.settings, self._disabled, self._routes
        added: list[tuple[str, Callable]] = []
        # one judge of "has this run converged?" for the rules whose message names a bug
        # (a converged run's small, noisy gradients are success), never for one that
        # warns of a rise: fed the loss and grad_norm the loss and gradient rules read
        convergence = None
        loss_tag = rename(settings["loss_divergence"]["tag"])
        grad_tag = rename(settings["grad_vanishing"]["tag"])
        if loss_tag is not None and grad_tag is not None:
            convergence = Convergence(loss_tag=loss_tag, grad_tag=grad_tag)
            added += [(tag, convergence.observe) for tag in convergence.companions]
        for kind in SERIES_RULES:
            params = settings[kind]
            needs = CARDS[kind].runs_when
            tag = rename(params["tag"])
            if tag is None or kind in disabled or (needs is not None and params[needs] is None):
                continue
            if tag != params["tag"]:
                params = {**params, "tag": tag}
                for name in CARDS[kind].companions:
                    params[name] = rename(params[name]) or params[name]
            rules, _ = routes.setdefault(tag, ([], None))
            rule = make_rule(kind, params, self._shared)
            if hasattr(rule, "convergence"):
                rule.convergence = convergence
            rules.append((kind, rule))
            added += [(t, rule.observe) for t in getattr(rule, "companions", ())]
        if NonFinite.kind not in disabled:
            nonfinite = settings[NonFinite.kind]
            for tag in filter(None, map(rename, nonfinite["tags"])):
                rules, _ = routes.get(tag, ([], None))
                routes[tag] = (rules, NonFinite(nonfinite, tag))
        for tag, observe in added:
            self._observers.setdefault(tag, []).append(observe)
        return convergence, added

    def _optimizer(self, tag: str, values: Mapping[str, float]) -> Any:
        """The route of an ``opt/`` tag seen for the first time: when it is the first
        series of its optimizer, that optimizer's rules are made (renaming each configured
        ``train/<metric>`` to ``opt/<name>/<metric>``) and their observers are given this
        step's values, as the run's rules' were before any rule ran."""
        self._opt_seen.add(tag)
        found = optimizer_series(tag)
        if found is None or found[0] in self._optimizers:
            return self._routes.get(tag)
        name = found[0]
        self._optimizers.add(name)

        def rename(configured: str) -> str | None:
            return f"opt/{name}/{configured[6:]}" if configured in PER_OPTIMIZER else None

        for companion, observe in self._wire(rename)[1]:
            value = values.get(companion)
            if value is not None:
                value = float(value)
                if value - value == 0.0:
                    observe(companion, value)
        return self._routes.get(tag)

    def _make(self, cls: type, disabled: set[str]) -> Any:
        """A rule fed by hand below (not one tag's series), or None when disabled."""
        return None if cls.kind in disabled else cls(self.settings[cls.kind])

    def action(self, kind: str) -> str:
        """What the monitor should do for an alert of ``kind``: warn|snapshot|stop|debug."""
        return self.settings[kind]["action"]

    def rule(self, kind: str, tag: str | None = None) -> Any:
        """The running rule object of ``kind`` (its ``limit()`` and state), or None when
        it is disabled; ``tag``: the one judging that series (an optimizer's own,
        ``opt/netd/grad_norm``, once it appeared) instead of the configured one."""
        tag = tag or self.settings[kind].get("tag")
        for name, rule in self._routes.get(tag, ([], None))[0]:
            if name == kind:
                return rule
        return None

    def update(self, step: int, values: Mapping[str, float]) -> list[Alert]:
        """Evaluate the rules on one collected step's scalars; only NEW alerts come back.

        ``values`` maps tags to numbers (e.g. ``{'train/loss': 0.4, 'train/grad_norm':
        1.3, 'train/learning_rate': 1e-3}``); tags no rule watches cost one dict lookup.
        Calling again with the same step and other tags (``mon.log`` at the current
        step) is fine; the same tag twice at one step is a ``step_order`` alert. Values
        must be numbers (any NaN/Inf included); nothing else is checked here.
        """
        new: list[Alert] = []
        order = self._order
        if order is not None:
            found = order.update(step, values)
            if found:
                for tag, f in found:
                    self._raise(new, step, "step_order", tag, f, self._order_check(tag))
        for tag, observe in self._observers.items():
            value = values.get(tag)
            if value is not None:
                value = float(value)
                if value - value == 0.0:
                    for fn in observe:
                        fn(tag, value)
        routes = self._routes
        vstale = self._vstale
        v_squares = 0.0
        v_count = 0
        handled = handled_overflow(values)
        acts: list[tuple[str, str, float]] = []
        for tag, value in values.items():
            route = routes.get(tag)
            if route is None and tag.startswith("opt/") and tag not in self._opt_seen:
                route = self._optimizer(tag, values)
            if route is None:
                if self._attn is not None and is_max_logit(tag):
                    self._attention(new, step, tag, float(value))
                    continue
                if self._acts:
                    found = act_tag(tag)
                    if found is not None:
                        acts.append((*found, float(value)))
                        continue
                # Adam's v, one tag per parameter: summed here for adam_v_stale
                if vstale is not None and is_moment2_tag(tag):
                    value = float(value)
                    if value - value == 0.0:
                        v_squares += value * value
                        v_count += 1
                continue
            value = float(value)
            rules, nonfinite = route
            if nonfinite is not None and not handled:
                f = nonfinite.update(step, value)
                if f is not None:
                    self._raise(new, step, "nonfinite", tag, f, _flag(nonfinite))
            if value - value != 0.0:  # NaN/Inf would poison every running statistic
                continue
            for kind, rule in rules:
                f = rule.update(step, value)
                if f is not None:
                    self._raise(new, step, kind, tag, f, _flag(rule))
        if acts:
            self._activations(new, step, acts)
        if vstale is not None and (v_count or self._v_pending):
            self._pair_v(
                new, step, values.get(self._vstale_tag), v_squares**0.5 if v_count else None
            )
        bound = self._data_bound
        if bound is not None and DATA_TAG in values and COMPUTE_TAG in values:
            f = bound.update(step, float(values[DATA_TAG]), float(values[COMPUTE_TAG]))
            if f is not None:
                self._raise(new, step, "data_bound", DATA_TAG, f, _flag(bound))
        missing = self._missing
        if missing is not None and (missing.pending or missing.reported):
            for tag, f in missing.update(step, values):
                self._raise(new, step, "metric_missing", tag, f, self._missing_check(tag))
        return new

    def _attention(self, new: list[Alert], step: int, tag: str, value: float) -> None:
        """Feed one module's max logit to ``attention_logit_growth``; its alert carries
        that module's tag and names the modules growing (``blame``: module, onset)."""
        rule = self._attn
        if value - value != 0.0:  # NaN/Inf: nonfinite's business, not a growth rate
            return
        f = rule.update(step, tag, value)  # type: ignore[union-attr]
        if f is None:
            return
        named = rule.named  # type: ignore[union-attr]
        first = f"attn/{named[0].name}/max_logit"
        self._raise(new, step, AttentionGrowth.kind, first, f, _flag(rule))
        blamed = tuple(b.to_dict() for b in named[:3])
        new[-1] = dataclasses.replace(new[-1], blame=blamed)
        self._latest[(AttentionGrowth.kind, first)] = (new[-1], _flag(rule))

    def _activations(self, new: list[Alert], step: int, acts: list) -> None:
        """Feed one step's ``act/<module>/<stat>`` values (in the order recorded: forward
        order) to the activation rules; each alert carries its first module's tag and
        names the modules it found (``blame``)."""
        batch = self._act_step
        batch.take(acts)
        for rule in self._acts:
            f = rule.update(step, batch)
            if f is None:
                continue
            tag = f"act/{rule.named[0].name}/{rule.stat}"
            self._raise(new, step, rule.kind, tag, f, _flag(rule))
            blamed = tuple(b.to_dict() for b in rule.named[:3])
            new[-1] = dataclasses.replace(new[-1], blame=blamed)
            self._latest[(rule.kind, tag)] = (new[-1], _flag(rule))

    def update_layers(
        self, step: int, names: Sequence[str], grads: Any, ratios: Any, top: int = 3
    ) -> list[Alert]:
        """Judge one collected step's per-parameter gradient norms and update ratios
        (NaN or None: not known) with ``layer_rise``; its NEW alert, naming up to ``top``
        parameters in its ``blame``, or []. The monitor calls it beside ``update`` for
        the steps whose per-parameter norms it has (``monitor.layers``)."""
        rule = self._layers
        if rule is None:
            return []
        f = rule.update(step, names, grads, ratios)
        if f is None:
            return []
        new: list[Alert] = []
        self._raise(new, step, LayerRise.kind, "", f, _flag(rule))
        blamed = tuple(b.to_dict() for b in rule.named[:top])
        alert = dataclasses.replace(new[0], blame=blamed)
        self._latest[(LayerRise.kind, "")] = (alert, _flag(rule))
        return [alert]

    def _pair_v(self, new: list[Alert], step: int, grad: Any, v_norm: float | None) -> None:
        """Feed ``adam_v_stale`` grad_norm and ||v|| of one step, even when they arrive in
        different ``update`` calls: on Ascend/GPU the monitor reads the device grad_norm
        one collected step late and records it at its own step, after that step's
        optimizer state. Unpaired halves wait for their partner for a few steps."""
        pending = self._v_pending
        if v_norm is None:
            if grad is None:
                return
            v_norm = pending.pop(("v", step), None)
            if v_norm is None:
                pending[("g", step)] = float(grad)
        elif grad is None:
            grad = pending.pop(("g", step), None)
            if grad is None:
                pending[("v", step)] = v_norm
        if grad is not None and v_norm is not None:
            vstale = self._vstale
            f = vstale.update(step, float(grad), v_norm)  # type: ignore[union-attr]
            if f is not None:
                self._raise(new, step, "adam_v_stale", self._vstale_tag, f, _flag(vstale))
        while len(pending) > 4:  # halves whose partner never came
            del pending[next(iter(pending))]

    def active(self) -> list[Alert]:
        """Alerts whose anomaly is still ongoing (for a panel's "now" strip)."""
        return [alert for alert, ongoing in self._latest.values() if ongoing()]

    def _raise(
        self, new: list[Alert], step: int, kind: str, tag: str, f: Any, ongoing: Callable
    ) -> None:
        alert = Alert(step, kind, SEVERITY[kind], f.message, f.since_step, tag, f.value, self.rank)
        new.append(alert)
        self._latest[(kind, tag)] = (alert, ongoing)

    def _order_check(self, tag: str) -> Callable[[], bool]:
        order = self._order
        return lambda: order is not None and order.is_active(tag)

    def _missing_check(self, tag: str) -> Callable[[], bool]:
        missing = self._missing
        return lambda: missing is not None and missing.is_active(tag)


def _flag(rule: Any) -> Callable[[], bool]:
    return lambda: bool(rule.active)


def _columns(series: Any) -> tuple[list[int], list[float]]:
    steps, values = (
        (series.steps, series.values) if hasattr(series, "steps") else (series[0], series[1])
    )
    steps = steps.tolist() if hasattr(steps, "tolist") else list(steps)
    values = values.tolist() if hasattr(values, "tolist") else list(values)
    return [int(s) for s in steps], [float(v) for v in values]


def diagnose(
    series: Mapping[str, Any],
    settings: Mapping[str, Any] | None = None,
    tracked: Iterable[str] | None = None,
    *,
    rank: int | None = None,
) -> list[Alert]:
    """Replay whole series through a fresh ``Diagnoser``; every alert it raises, in order.

    ``series`` maps tags to anything with ``.steps`` and ``.values`` (``mon.series``,
    ``run.scalars(tag)``, ``run.scalars(tag, raw=True)``) or to ``(steps, values)``.
    Series are merged by step, each kept in its own order, so a raw series that goes
    backwards still trips ``step_order``; values at one step form one update.
    """
    streams = []
    for tag, s in series.items():
        steps, values = _columns(s)
        streams.append([(step, tag, value) for step, value in zip(steps, values, strict=True)])
    diag = Diagnoser(settings, tracked, rank=rank)
    out: list[Alert] = []
    batch: dict[str, float] = {}
    current: int | None = None
    for step, tag, value in heapq.merge(*streams, key=lambda point: point[0]):
        if step != current or tag in batch:
            if batch:
                out += diag.update(current, batch)  # type: ignore[arg-type]
            batch = {}
            current = step
        batch[tag] = value
    if batch:
        out += diag.update(current, batch)  # type: ignore[arg-type]
    return out


def handled_overflow(values: Mapping[str, Any]) -> bool:
    """A step whose loss-scaled gradients overflowed and whose train step handled it:
    skipped the update (``train/overflow`` 1) at a loss scale it can still lower (> 1).
    Its NaN/Inf -- gradients, and a float16 forward's loss that the same check caught --
    is what dynamic loss scaling is for, and no ``nonfinite`` alert: the guide promises
    an overflow step none. The step neither starts nor ends an episode. At scale 1 the
    scale has nothing left to give: a NaN/Inf there is the model's own, and alerts."""
    if values.get(OVERFLOW_TAG) != 1.0:
        return False
    scale = values.get(LOSS_SCALE_TAG)
    return scale is not None and float(scale) > 1.0
