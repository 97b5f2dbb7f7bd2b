"""Gradient-norm rules: explosion and vanishing, relative to the series' own history.

Both work on log10(grad_norm): a healthy grad_norm fluctuates roughly log-normally (on
real MLP runs the step-to-step spread is 0.12-0.38 decades), so "x10 over the median" is
the same evidence at 1e-3 and at 1e3. The reference is the running median of the last
``window`` values before the current one; the robust spread is 1.4826 x their MAD
(refreshed every 8 steps, and only computed when a value is already 2x off).

Onset. A value is *out of band* when it is more than max(2x, 3 robust sigma) from the
median. ``since_step`` is the first step of the unbroken run of out-of-band values that
ends in the confirmed alert: for a jump that is the jump step; for an exponential rise it
is where the rise left the band, which is the step a person would point at on the chart.
An explosion growing slower than ``factor ** (1 / patience)`` per step is confirmed later
than ``patience`` steps after that onset (it needs to reach ``factor``), but
``since_step`` still names the onset.

Anomalous values enter the window like any other: a 64-value median moves by one rank
per value, so a few exploded steps do not shift the reference, and a lasting change of
level becomes the new normal after about window/2 steps -- which is also when an alert
whose level persisted clears. (Keeping outliers out instead starves the spread estimate
of the tail and feeds back into more outliers.)
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from typing import Any

from msmon_nb.diagnose.alert import fmt, fmt_ratio
from msmon_nb.diagnose.base import LOG2, CardRule, EpisodeRule, Finding, Rise, short
from msmon_nb.diagnose.converge import Convergence
from msmon_nb.diagnose.window import Levels

_CLIP_HINT = "lower the learning rate or clip gradients (nn.ClipByNorm / ops.clip_by_global_norm)"
_VANISH_HINT = (
    "parameters barely move: look for saturating activations (sigmoid/tanh), dead ReLUs, "
    "a too-small init or learning rate; try ReLU/GELU, normalisation layers or residual "
    "connections"
)


class GradExplosion(CardRule, EpisodeRule, kind="grad_explosion"):
    """grad_norm >= ``factor`` x its running median (and ``z`` robust sigmas above it) for
    ``patience`` collected steps in a row, or above the absolute ``ceiling`` once."""

    def __init__(self, settings: Mapping[str, Any], levels: Levels | None = None) -> None:
        super().__init__(settings, levels)
        self.name = short(self.tag)
        self.log_factor = math.log10(self.factor)
        self.min_history = min(self.min_history, self.window)
        self.rise = Rise()

    def limit(self) -> float:
        """``factor`` x the running median of the last grad norms: the relative part of
        what the skip gate holds an update back at (+inf until ``min_history``)."""
        win = self.levels.win
        if len(win) < self.min_history:
            return math.inf
        return 10.0 ** (win.median() + self.log_factor)

    def update(self, step: int, value: float) -> Finding | None:
        """Feed grad_norm at ``step``."""
        lv = self.levels
        lv.observe(step, value)
        history = lv.x is not None and lv.n >= self.min_history
        d = lv.x - lv.median if history else 0.0
        high = value >= self.ceiling
        rise = self.rise
        hot = rise.see(step, d if history else None, lv.sigma, self.log_factor, self.z, high)
        if self.active:
            self.episode.settle(calm=not hot)
            return None
        if not (high or rise.over >= self.patience):
            return None
        self.episode.start()
        since = rise.began(step)
        if d > 0.0:
            where = f"{fmt_ratio(10.0**d)} over its running median {fmt(10.0**lv.median)}"
            if high:
                where = f"above the ceiling {fmt(self.ceiling)}, {where}"
        else:
            where = f"above the ceiling {fmt(self.ceiling)}"
        message = f"{self.name} exploding since step {since}: {fmt(value)}, {where}; {_CLIP_HINT}"
        return Finding(since, value, message)


class GradVanishing(CardRule, EpisodeRule, kind="grad_vanishing"):
    """grad_norm below ``floor`` for ``patience`` collected steps in a row, or ``factor`` x
    below its running median for ``patience`` steps (a sudden collapse); none starts while the
    run has converged (``convergence``, set by the engine: the loss at its floor, grad_norm
    fallen no further than it), where small gradients are success.

    For the floor, ``since_step`` is the first step below it since the series was last
    at or above 2 x floor, so a noisy decline that wobbles across the floor is dated
    from its first crossing.
    """

    def __init__(self, settings: Mapping[str, Any], levels: Levels | None = None) -> None:
        super().__init__(settings, levels)
        self.name = short(self.tag)
        self.log_factor = math.log10(self.factor)
        self.min_history = min(self.min_history, self.window)
        self._floor_count = 0
        self._floor_since: int | None = None
        self._rel_count = 0
        self._rel_since: int | None = None
        # set by the engine: a converged run's gradients are small because the loss is
        # at its floor, which is no fault (None: judged on grad_norm alone)
        self.convergence: Convergence | None = None

    def update(self, step: int, value: float) -> Finding | None:
        """Feed grad_norm at ``step``."""
        lv = self.levels
        lv.observe(step, value)
        depressed = collapsed = False
        d = 0.0
        if lv.n >= self.min_history:
            if lv.x is None:  # exactly zero: infinitely far below any history
                depressed = collapsed = True
                d = math.inf
            else:
                d = lv.median - lv.x
                if d > LOG2:
                    depressed = d > 3.0 * lv.sigma()
                    collapsed = depressed and d > self.log_factor
        if value < self.floor:
            self._floor_count += 1
            if self._floor_since is None:
                self._floor_since = step
        else:
            self._floor_count = 0
            if value >= 2.0 * self.floor:  # a noisy decline wobbling at the floor keeps its onset
                self._floor_since = None
        if depressed:
            if self._rel_since is None:
                self._rel_since = step
        else:
            self._rel_since = None
        self._rel_count = self._rel_count + 1 if collapsed else 0
        conv = self.convergence
        if conv is not None and conv.converged:
            # small gradients at a converged loss's floor are success: nothing starts, and
            # a floor streak starts over (its onset would date the convergence); a collapse
            # keeps its onset, so a network that dies and lifts the loss off its floor is
            # reported from the step its gradients fell
            self._floor_count = 0
            self._floor_since = None
            if self.active:
                self.episode.settle(calm=not depressed)
            return None
        if self.active:
            self.episode.settle(calm=value >= 2.0 * self.floor and not depressed)
            return None
        if self._floor_count >= self.patience:
            since = self._floor_since if self._floor_since is not None else step
            return self._fire(since, value, d, floor=True)
        if self._rel_count >= self.patience:
            since = self._rel_since if self._rel_since is not None else step
            return self._fire(since, value, d, floor=False)
        return None

    def _fire(self, since: int, value: float, d: float, floor: bool) -> Finding:
        self.episode.start()
        lv = self.levels
        median = f"running median {fmt(10.0**lv.median)}" if lv.n else ""
        if floor:
            context = f" ({median})" if median else ""
            message = (
                f"{self.name} vanishing since step {since}: {fmt(value)}, below "
                f"{fmt(self.floor)} for {self._floor_count} collected steps{context}; "
                f"{_VANISH_HINT}"
            )
        else:
            ratio = fmt_ratio(10.0**d) if math.isfinite(d) else "infinitely far"
            message = (
                f"{self.name} collapsed since step {since}: {fmt(value)}, {ratio} below its "
                f"{median or 'running median'} for {self._rel_count} collected steps; "
                f"{_VANISH_HINT}"
            )
        return Finding(since, value, message)
