"""Activation rules: a module's forward output diverging, blowing up, dying or turning
non-finite, named with the step it began (``output_logit_divergence``,
``activation_blowup``, ``activation_dying``, ``nonfinite_origin``).

Why: one module's outputs show a failure before the loss and the global gradient norm
do, and say where it is. They are recorded as ``act/<module>/<stat>``
(``collect.activations``, ``track_metrics: [..., activations]``), one step's modules in
forward order: the order of a step's tags is the order their hooks ran. ``ActStep`` keeps
that order from the first step it sees a module (the heatmap's rows use the same), so
"first" below means first in forward order.

- ``nonfinite_origin`` (critical): on a step where some module's output holds NaN/Inf
  (``nonfinite`` > 0, or a NaN ``max_abs``/``norm``), the first such module is where it
  began: its inputs were finite, its output is not. Onset: that step, exact.
- ``output_logit_divergence``: the output layer's largest |logit| (``max_abs`` of
  ``module``, by default the last module in forward order) growing by ``factor`` over
  the last ``window`` collected steps, fitted in log10 (slope ``t`` standard errors above
  0), past ``factor`` over its own earlier peak and above ``min_logit``, ``patience``
  steps in a row. Large logits make the softmax cross-entropy ill-conditioned; they grow
  until the loss diverges (Wortsman et al. 2023: output logit divergence; z-loss is the
  usual fix). Onset: the step after the last one within x sqrt(``factor``) of the
  median of the ``window`` values before it (``_Growth.onset``).
- ``activation_blowup``: a module's ``max_abs`` growing the same way (by ``factor``, ``t``
  standard errors, past its earlier peak by ``factor``) *faster than every module before
  it*, by ``factor``: a module downstream of a blow-up grows as fast as its input and is
  not named; the one whose output outgrows its input is. The output module is left to
  ``output_logit_divergence`` while that rule is on (a classifier's logits outgrow its
  features while it learns). Onset as above.
- ``activation_dying``: a module's ``zero_frac`` reaching ``dead`` (0.95: nearly every
  output exactly 0, a ReLU layer whose units all died) while its usual zero fraction
  (the median of its last ``window`` steps before) is below ``usual_below``, ``patience``
  steps in a row. Onset: the first step of the climb (past halfway from its usual level
  to ``dead``). Only modules whose output follows the activation show it: ``Dense(...,
  activation="relu")``, or the activation cells themselves named in ``module_targets``.

Each alert names the modules it found in ``blame`` (the first to begin first, ties in
forward order) and carries the first one's tag. O(modules) per collected step; the onset
fit runs only when an alert is raised.
"""

from __future__ import annotations

import math
import statistics
from collections.abc import Iterable, Mapping
from typing import Any

from msmon_nb.diagnose.alert import fmt
from msmon_nb.diagnose.base import CardRule, EpisodeRule, Finding
from msmon_nb.diagnose.blame import Blamed
from msmon_nb.diagnose.trend import LogGrowth
from msmon_nb.diagnose.window import RollingWindow

PREFIX = "act/"
HISTORY = 4  # windows of each module's log values kept for the onset fit
FLOOR = 1e-12  # a zero max_abs in log10: -12


def act_tag(tag: str) -> tuple[str, str] | None:
    """``act/<module>/<stat>`` -> ``(module, stat)``; None for any other tag."""
    if not tag.startswith(PREFIX):
        return None
    module, _, stat = tag[len(PREFIX) :].rpartition("/")
    return (module, stat) if module else None


class ActStep:
    """The modules in forward order (first seen first) and one step's values of each."""

    __slots__ = ("index", "order", "values")

    def __init__(self) -> None:
        self.order: list[str] = []
        self.index: dict[str, int] = {}
        self.values: dict[str, dict[str, float]] = {}

    def take(self, items: Iterable[tuple[str, str, float]]) -> None:
        """One step's ``(module, stat, value)`` in the order recorded."""
        values: dict[str, dict[str, float]] = {}
        for module, stat, value in items:
            if module not in self.index:
                self.index[module] = len(self.order)
                self.order.append(module)
            values.setdefault(module, {})[stat] = value
        self.values = values

    def modules(self) -> list[str]:
        """This step's modules, in forward order."""
        return sorted(self.values, key=self.index.__getitem__)


class _Growth(LogGrowth):
    """One module's ``LogGrowth`` of its max |x|, with its blame and onset."""

    __slots__ = ()

    def blamed(self, name: str, window: int, log_factor: float) -> Blamed:
        usual = 10**self.peak if math.isfinite(self.peak) else 10 ** self.recent[0]
        return Blamed(name, self.t, self.onset(window, log_factor), 10 ** self.recent[-1], usual)

    def onset(self, window: int, log_factor: float) -> int:
        """The step after the last one still within half of ``log_factor`` of the median
        of the ``window`` values before it: where the value left its own usual band for
        good. (A flat-then-rising fit over the recent values dates a rise confirmed a few
        steps in back to an earlier, healthy one, such as the logits' growth while the
        model learns.) Runs only when an alert is raised."""
        ys, steps = list(self.recent), list(self.steps)
        band = 0.5 * log_factor
        for k in range(len(ys) - 2, window - 1, -1):
            if ys[k] <= statistics.median(ys[k - window : k]) + band:
                return steps[k + 1]
        return steps[0]


class _ActRule(CardRule, EpisodeRule):
    """What the four rules share: ``update(step, acts)`` over one step's modules, and
    ``named``, the modules of the last finding."""

    def __init__(self, settings: Mapping[str, Any]) -> None:
        CardRule.__init__(self, settings)
        EpisodeRule.__init__(self)
        self.named: list[Blamed] = []
        self.stat = "max_abs"

    def _start(self, named: list[Blamed], acts: ActStep) -> Blamed:
        named.sort(key=lambda b: (b.step, acts.index[b.name]))
        self.named = named
        self.episode.start()
        return named[0]

    def _also(self) -> str:
        others = [b.name for b in self.named[1:3]]
        return f" (also {', '.join(others)})" if others else ""


class NonfiniteOrigin(_ActRule, kind="nonfinite_origin"):
    """The first module in forward order whose output is not finite (module docstring)."""

    def __init__(self, settings: Mapping[str, Any]) -> None:
        super().__init__(settings)
        self.stat = "nonfinite"

    def update(self, step: int, acts: ActStep) -> Finding | None:
        bad = []
        for module in acts.modules():
            got = acts.values[module]
            count = got.get("nonfinite", 0.0)
            worst = max(got.get("max_abs", 0.0), got.get("norm", 0.0))
            if count > 0 or not math.isfinite(worst):
                bad.append(Blamed(module, math.inf, step, count, 0.0))
        if not bad:
            self.episode.settle(calm=True)
            return None
        self.episode.settle(calm=False)
        if self.active:
            return None
        first = self._start(bad, acts)
        after = f"; {len(bad) - 1} module(s) after it too{self._also()}" if len(bad) > 1 else ""
        clean = acts.index[first.name]
        before = f", while the {clean} module(s) before it were finite" if clean else ""
        message = (
            f"non-finite values first appear in {first.name}'s output at step {step} "
            f"({fmt(first.norm)} values){before}{after}: look at its weights and its "
            "inputs there"
        )
        return Finding(step, first.norm, message)


class _GrowthRule(_ActRule):
    """A module's ``max_abs`` growing past its own history (``_Growth``)."""

    def __init__(self, settings: Mapping[str, Any]) -> None:
        super().__init__(settings)
        self.log_factor = math.log10(self.factor)
        self.modules: dict[str, _Growth] = {}

    def _feed(self, step: int, module: str, value: float) -> tuple[_Growth, float] | None:
        if not math.isfinite(value):
            return None
        mod = self.modules.get(module)
        if mod is None:
            mod = self.modules[module] = _Growth(self.window, HISTORY)
        y = math.log10(max(value, FLOOR))
        mod.add(step, y)
        return mod, y

    def _grows(self, mod: _Growth, y: float) -> bool:
        return (
            mod.n >= self.min_history
            and mod.rise > self.log_factor
            and mod.t > self.t
            and y > mod.peak + self.log_factor
        )


class OutputLogitDivergence(_GrowthRule, kind="output_logit_divergence"):
    """The output layer's max |logit| growing (module docstring)."""

    def update(self, step: int, acts: ActStep) -> Finding | None:
        name = self.module or (acts.order[-1] if acts.order else None)
        value = acts.values.get(name, {}).get("max_abs") if name is not None else None
        if value is None:
            return None
        fed = self._feed(step, name, value)
        if fed is None:
            return None
        mod, y = fed
        over = self._grows(mod, y) and value > self.min_logit
        mod.count = mod.count + 1 if over else 0
        self.episode.settle(calm=not over)
        if not over or mod.count < self.patience or self.active:
            return None
        first = self._start([mod.blamed(name, self.window, self.log_factor)], acts)
        growth = mod.per_step()
        message = (
            f"output logits of {name} diverging since step {first.step}: max |logit| "
            f"{fmt(value)}, x{growth:.3g} per collected step over the last "
            f"{len(mod.slope)} (earlier peak {fmt(first.usual)}); logits this large "
            "precede loss divergence: add a z-loss, or lower the output layer's lr"
        )
        return Finding(first.step, value, message)


class ActivationBlowup(_GrowthRule, kind="activation_blowup"):
    """A module's max |activation| outgrowing its inputs (module docstring). ``output``:
    the module left to ``output_logit_divergence`` when that rule is on (set by the
    engine; "" for the last module in forward order, None: none is left out)."""

    def __init__(self, settings: Mapping[str, Any]) -> None:
        super().__init__(settings)
        self.output: str | None = None

    def update(self, step: int, acts: ActStep) -> Finding | None:
        modules = acts.modules()
        skip = self.output or (acts.order[-1] if self.output == "" and acts.order else None)
        upstream = 0.0  # the largest rise of the modules before, 0 for the first
        over: list[tuple[str, _Growth]] = []
        for module in modules:
            fed = self._feed(step, module, acts.values[module].get("max_abs", math.nan))
            if fed is None:
                continue
            mod, y = fed
            hit = module != skip and self._grows(mod, y) and mod.rise - upstream > self.log_factor
            if mod.n >= self.min_history:
                upstream = max(upstream, mod.rise)
            mod.count = mod.count + 1 if hit else 0
            if hit:
                over.append((module, mod))
        self.episode.settle(calm=not over)
        if not any(m.count >= self.patience for _, m in over) or self.active:
            return None
        blamed = [m.blamed(name, self.window, self.log_factor) for name, m in over]
        first = self._start(blamed, acts)
        mod = self.modules[first.name]
        growth = mod.per_step()
        message = (
            f"activations of {first.name} blowing up since step {first.step}: max "
            f"|activation| {fmt(first.norm)} (earlier peak {fmt(first.usual)}), "
            f"x{growth:.3g} per collected step, faster than the modules before it"
            f"{self._also()}: look at its weights, its lr and its normalisation"
        )
        return Finding(first.step, first.norm, message)


class _Zeros:
    """One module's usual zero fraction and its current climb."""

    __slots__ = ("count", "since", "usual")

    def __init__(self, window: int) -> None:
        self.usual = RollingWindow(window)
        self.count = 0
        self.since: int | None = None


class ActivationDying(_ActRule, kind="activation_dying"):
    """A module's outputs turning all 0 (module docstring)."""

    def __init__(self, settings: Mapping[str, Any]) -> None:
        super().__init__(settings)
        self.stat = "zero_frac"
        self.modules: dict[str, _Zeros] = {}

    def update(self, step: int, acts: ActStep) -> Finding | None:
        over: list[Blamed] = []
        for module in acts.modules():
            zf = acts.values[module].get("zero_frac")
            if zf is None or not math.isfinite(zf):
                continue
            mod = self.modules.get(module)
            if mod is None:
                mod = self.modules[module] = _Zeros(self.window)
            known = len(mod.usual) >= self.min_history
            usual = mod.usual.median() if known else 0.0
            climbing = known and zf > 0.5 * (usual + self.dead)
            if not climbing:
                mod.usual.add(zf)
                mod.since, mod.count = None, 0
                continue
            if mod.since is None:
                mod.since = step
            if zf >= self.dead and usual < self.usual_below:
                mod.count += 1
                if mod.count >= self.patience:
                    over.append(Blamed(module, math.inf, mod.since, zf, usual))
            else:
                mod.count = 0
        self.episode.settle(calm=not over)
        if not over or self.active:
            return None
        first = self._start(over, acts)
        message = (
            f"activations of {first.name} dying since step {first.step}: "
            f"{first.norm:.1%} of its outputs are 0 (usually {first.usual:.0%}){self._also()}; "
            "ReLU units that all output 0 get no gradient and stay dead: restore a "
            "checkpoint from before, lower the lr, or use a leaky activation"
        )
        return Finding(first.step, first.norm, message)


ACT_RULES = (NonfiniteOrigin, OutputLogitDivergence, ActivationBlowup, ActivationDying)
