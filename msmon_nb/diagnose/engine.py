"""``Diagnoser``: every enabled rule, evaluated incrementally once per collected step.

Each rule keeps O(window) state (ring buffers and running statistics), so a step costs
the same at step 10 and at step 10 million; ``bench/diagnose.py`` measures it. The
engine reports an anomaly once, when it starts, and again only after the rule saw it
clear and it came back.
"""

from __future__ import annotations

import heapq
from collections.abc import Callable, Iterable, Mapping
from typing import Any

from msmon_nb.config import COMPUTE_TAG, DATA_TAG
from msmon_nb.config.alerts import resolve_settings
from msmon_nb.config.cards import CARDS, SEVERITY
from msmon_nb.diagnose.alert import Alert
from msmon_nb.diagnose.converge import Convergence
from msmon_nb.diagnose.optim import AdamVStale, is_moment2_tag
from msmon_nb.diagnose.pipeline import DataBound
from msmon_nb.diagnose.rules import SERIES_RULES, make_rule
from msmon_nb.diagnose.steps import MetricMissing, NonFinite, StepOrder


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
        disabled = set(self.settings["disabled"])
        # tag -> ([(kind, rule)...], NonFinite | None): one lookup per tag per step
        routes: dict[str, tuple[list[tuple[str, Any]], NonFinite | None]] = {}
        # tag -> observe(tag, value) of rules that read other series of the same step
        # (rising_trend: grad_norm and lr next to the loss); fed before any rule runs
        observers: dict[str, list[Callable[[str, float], None]]] = {}
        shared: dict = {}
        # one judge of "has this run converged?" for the rules whose message names a bug
        # (a converged run's small, noisy gradients are success), never for one that
        # warns of a rise: fed the loss and grad_norm the loss and gradient rules read
        convergence = Convergence(
            loss_tag=self.settings["loss_divergence"]["tag"],
            grad_tag=self.settings["grad_vanishing"]["tag"],
        )
        for tag in convergence.companions:
            observers.setdefault(tag, []).append(convergence.observe)
        for kind in SERIES_RULES:
            params = self.settings[kind]
            needs = CARDS[kind].runs_when
            if kind in disabled or (needs is not None and params[needs] is None):
                continue
            rules, _ = routes.setdefault(params["tag"], ([], None))
            rule = make_rule(kind, params, shared)
            if hasattr(rule, "convergence"):
                rule.convergence = convergence
            rules.append((kind, rule))
            for tag in getattr(rule, "companions", ()):
                observers.setdefault(tag, []).append(rule.observe)
        self._observers = observers
        if NonFinite.kind not in disabled:
            nonfinite = self.settings[NonFinite.kind]
            for tag in nonfinite["tags"]:
                rules, _ = routes.get(tag, ([], None))
                routes[tag] = (rules, NonFinite(nonfinite, tag))
        self._routes = routes
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
        # (kind, tag) -> its latest alert and whether that anomaly is still going on
        self._latest: dict[tuple[str, str], tuple[Alert, Callable[[], bool]]] = {}

    def _make(self, cls: type, disabled: set[str]) -> Any:
        """A rule fed by hand below (not one tag's series), or None when disabled."""
        return None if cls.kind in disabled else cls(self.settings[cls.kind])

    def action(self, kind: str) -> str:
        """What the monitor should do for an alert of ``kind``: warn|snapshot|stop|debug."""
        return self.settings[kind]["action"]

    def rule(self, kind: str) -> Any:
        """The running rule object of ``kind`` (its ``limit()`` and state), or None when
        it is disabled."""
        tag = self.settings[kind].get("tag")
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
        for tag, value in values.items():
            route = routes.get(tag)
            if route is None:
                # Adam's v, one tag per parameter: summed here for adam_v_stale
                if vstale is not None and is_moment2_tag(tag):
                    value = float(value)
                    if value - value == 0.0:
                        v_squares += value * value
                        v_count += 1
                continue
            value = float(value)
            rules, nonfinite = route
            if nonfinite is not None:
                f = nonfinite.update(step, value)
                if f is not None:
                    self._raise(new, step, "nonfinite", tag, f, _flag(nonfinite))
            if value - value != 0.0:  # NaN/Inf would poison every running statistic
                continue
            for kind, rule in rules:
                f = rule.update(step, value)
                if f is not None:
                    self._raise(new, step, kind, tag, f, _flag(rule))
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
