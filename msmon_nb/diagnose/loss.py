"""Loss rules: a one-step spike, a sustained rise (divergence), a stall (plateau).

Minibatch loss is noisy with a heavy upper tail: on real, healthy MLP runs single
batches reach 8x the running median once the loss is small, but never 3x the running
90th percentile. So "far above" is measured in units of the upper spread
(q90 - median) of the last ``window`` values, which widens by itself for heavy-tailed
series, and must also be a ``rel`` fraction of the median, so a near-constant loss does
not turn every wiggle into a spike.

Unlike the gradient rules, outliers stay in the loss window: one batch among 50 barely
moves the median or q90, while keeping the tail out would shrink q90 until every
ordinary hard batch looked like a spike (it did, on losses where 15 % of batches hold a
hard sample).
"""

from __future__ import annotations

import math
from collections import deque
from collections.abc import Mapping
from typing import Any

from msmon_nb.diagnose.alert import fmt, fmt_ratio
from msmon_nb.diagnose.base import TINY, CardRule, EpisodeRule, Finding, short
from msmon_nb.diagnose.trend import hinge_onset
from msmon_nb.diagnose.window import Levels


def _ratio(value: float, median: float) -> str:
    return fmt_ratio(value / median) if median > 0 else f"+{fmt(value - median)}"


def _start_level(first: float, median: float) -> float:
    """Where the loss started: the first value or the median of the first few, whichever
    is larger in size (at log_interval 10 a small model may have converged before its
    20th collected step, so the median alone would understate it)."""
    return first if abs(first) > abs(median) else median


def _margin(rule: LossSpike | LossDivergence, median: float, q90: float, bar: float) -> float:
    """How far over the running median a loss must be to count: the largest of ``tail`` x
    (q90 - median), ``rel`` x |median| and ``hold`` x the peak-hold ``bar``."""
    return max(rule.tail * (q90 - median), rule.rel * abs(median), rule.hold * bar, TINY)


def _high(
    rule: LossSpike | LossDivergence, excess: float, median: float, q90: float, bar: float
) -> bool:
    """The loss rules' test of one value: its ``excess`` over the running median beats
    the ``_margin``."""
    return excess > _margin(rule, median, q90, bar)


class LossSpike(CardRule, kind="loss_spike"):
    """One collected step whose excess over the running median is larger than each of
    ``tail`` x (q90 - median), ``rel`` x |median| and ``hold`` x the largest excess of
    the recent past (a peak hold that halves every ``memory`` collected steps).

    The peak hold keeps a converged loss with rare hard or mislabeled samples quiet:
    there a few percent of batches sit 5-40x above the median, beyond q90, and are
    healthy; a spike must beat what the series itself has been doing lately. It includes
    reported spikes, so a recurring outlier is reported once, not every time. It starts
    at ``scale`` x the starting level and decays like any peak, so early in a run, before
    the series has shown its tail, a spike must be large against the loss's starting
    level: a hard batch there is a few tenths of it, a corrupted batch on a real MLP
    (inputs x10, shuffled labels, noise inputs) 1.3-13 times it.

    Reported at the step itself (``since_step == step``), so a ``snapshot`` or ``debug``
    action lands on the outlier batch, not the one after it. A spike that persists is
    reported once here and again by ``loss_divergence``.
    """

    def __init__(self, settings: Mapping[str, Any], levels: Levels | None = None) -> None:
        super().__init__(settings, levels)
        self.name = short(self.tag)
        self.min_history = min(self.min_history, self.window)
        self._decay = 0.5 ** (1.0 / self.memory)
        self._peak = 0.0
        self._first = 0.0
        self.active = False

    def limit(self) -> float:
        """The smallest loss the next step's test would call a spike (+inf until
        ``min_history`` values were seen): what the skip gate holds an update back at,
        by the very formula ``update`` applies."""
        win = self.levels.win
        if len(win) < self.min_history:
            return math.inf
        median = win.median()
        return median + _margin(self, median, win.quantile(0.9), self._peak * self._decay)

    def update(self, step: int, value: float) -> Finding | None:
        """Feed the loss at ``step``."""
        lv = self.levels
        lv.observe(step, value)
        n = lv.n
        if n < self.min_history:
            if n == 0:
                self._first = value
            if n + 1 == self.min_history:
                start = _start_level(self._first, lv.win.median())
                self._peak = self.scale * abs(start)
            return None
        median = lv.median
        q90 = lv.q90
        excess = value - median
        peak = self._peak * self._decay
        spike = _high(self, excess, median, q90, peak)
        self._peak = excess if excess > peak else peak
        if self.active:
            if not spike:
                self.active = False
            return None
        if not spike:
            return None
        self.active = True
        message = (
            f"{self.name} spike at step {step}: {fmt(value)}, {_ratio(value, median)} over its "
            f"running median {fmt(median)} (90% of recent steps below {fmt(q90)}; largest "
            f"recent excess {fmt(peak)}); one batch is far off: check that batch's data and "
            "labels (a snapshot shows it), or clip gradients so one batch cannot derail "
            "training"
        )
        return Finding(step, value, message)


class LossDivergence(CardRule, EpisodeRule, kind="loss_divergence"):
    """A sustained rise, in either of two shapes.

    *Jump*: ``patience`` collected steps in a row whose excess over the running median
    beats ``tail`` x (q90 - median), ``rel`` x |median| and ``hold`` x the largest
    excess of the recent past as it stood before the run began (the peak hold of
    ``LossSpike``, seeded the same way; runs of hard batches stay under it);
    ``since_step`` is the first of them (exact).

    *Drift*: the loss's exponential moving average (``span``) stays, for ``patience``
    steps, above its best value by more than ``rise`` x |best| and more than
    ``giveback`` x the progress made since the start. A slow rise never leaves the
    running median's band, so this is what catches it; ``since_step`` is the step of the
    best (lowest) average: after a clear minimum that is the turning point give or take
    the average's lag, but on a long flat noisy stretch before the rise it can be
    anywhere in that stretch (approximate onset; on +1 %/step rises after a plateau it
    was up to 100 steps early).

    It clears after ``QUIET`` steps in a row with no value high and the average back
    within half the allowed rise, so a loss hovering at the threshold is reported once.
    """

    def __init__(self, settings: Mapping[str, Any], levels: Levels | None = None) -> None:
        super().__init__(settings, levels)
        self.name = short(self.tag)
        self.min_history = min(self.min_history, self.window)
        self._alpha = 2.0 / (self.span + 1.0)
        self._decay = 0.5 ** (1.0 / self.memory)
        self._peak = 0.0
        self._run_ref = 0.0
        self._run_max = 0.0
        self._first = 0.0
        self._ema = 0.0
        self._noise = 0.0  # variance of value - average
        # the last 3 x window values and their steps, for the onset of a drift
        self._recent: deque[float] = deque(maxlen=3 * self.window)
        self._recent_steps: deque[int] = deque(maxlen=3 * self.window)
        self._start: float | None = None
        self._best = 0.0
        self._best_step = 0
        self._high = 0
        self._high_since: int | None = None
        self._drift = 0

    def update(self, step: int, value: float) -> Finding | None:
        """Feed the loss at ``step``."""
        lv = self.levels
        lv.observe(step, value)
        self._recent.append(value)
        self._recent_steps.append(step)
        n = lv.n
        d = value - self._ema
        if self._start is None:
            if n == 0:
                self._first = self._ema = value
            else:
                self._ema += self._alpha * d
                self._noise += (d * d - self._noise) / n
            if n + 1 >= self.min_history:
                self._start = _start_level(self._first, lv.win.median())
                self._peak = self.scale * abs(self._start)
                self._best = self._ema
                self._best_step = step
            return None
        # winsorised, as in LossPlateau: one outlier batch moves the average by at most
        # 4 sigmas' worth, so a lone spike is a spike, never a drift
        limit = 4.0 * math.sqrt(self._noise)
        if limit > 0.0:
            d = max(-limit, min(limit, d))
        alpha = self._alpha
        ema = self._ema = self._ema + alpha * d
        slow = 0.25 * alpha
        self._noise = (1.0 - slow) * (self._noise + slow * d * d)
        median = lv.median
        excess = value - median
        peak = self._peak * self._decay
        ref = self._run_ref if self._high else peak  # a run must not raise its own bar
        high = _high(self, excess, median, lv.q90, ref)
        if high:
            if not self._high:
                self._run_ref = peak
                self._run_max = excess
                self._high_since = step
            elif excess > self._run_max:
                self._run_max = excess
            self._high += 1
            self._peak = peak
        else:
            if 0 < self._high < self.patience:
                # an unconfirmed run (a hard batch or two) raises the bar; a confirmed
                # divergence does not, or it would hide the next one
                peak = max(peak, self._run_max)
            self._high = 0
            self._high_since = None
            # while a divergence is reported its values are no yardstick for the next
            self._peak = excess if excess > peak and not self.active else peak
        best = self._best
        if ema < best:
            self._best = best = ema
            self._best_step = step
        allowed = max(self.rise * abs(best), self.giveback * (self._start - best), TINY)
        drifting = ema > best + allowed
        self._drift = self._drift + 1 if drifting else 0
        if self.active:
            # hysteresis: a loss hovering at the threshold is one divergence, not many
            self.episode.settle(calm=not high and ema <= best + 0.5 * allowed)
            return None
        if self._high >= self.patience:
            since = self._high_since if self._high_since is not None else step
            message = (
                f"{self.name} diverging since step {since}: {fmt(value)} for {self._high} "
                f"collected steps, {_ratio(value, median)} over its running median "
                f"{fmt(median)}; lower the learning rate, add warmup or gradient clipping, "
                f"and check grad_norm around step {since}"
            )
        elif self._drift >= self.patience:
            since = self._rise_start()
            message = (
                f"{self.name} rising since step {since}: smoothed {fmt(ema)}, up from its "
                f"best {fmt(best)} (started at {fmt(self._start)}); training is diverging: "
                "lower the learning rate or add gradient clipping; if the schedule raised the "
                "learning rate, check it"
            )
        else:
            return None
        self.episode.start()
        return Finding(since, value, message)

    def _rise_start(self) -> int:
        """Where the rise began: the change point of a flat-then-rising fit to the last
        ``3 x window`` values (in log when all are positive), never before the best."""
        steps = list(self._recent_steps)
        values = list(self._recent)
        if all(v > 0.0 for v in values):
            values = [math.log(v) for v in values]
        return max(hinge_onset(steps, values), min(self._best_step, steps[-1]))


_LEARNED = 0.1  # a loss less than 10 % below its start has not learned anything yet


class LossPlateau(CardRule, kind="loss_plateau"):
    """No significant improvement for ``window`` collected steps, in a run that has not
    learned: the loss's moving average is less than ``max_progress`` (a fraction) below
    where it started (the mean of its first ``span`` values).

    "Significant" means the moving average (``span``) fell below its best by more than
    ``min_delta`` x |best| and more than three times the average's own noise, so
    minibatch noise can neither fake progress nor hide a stall. Each step moves the
    average by at most 4 noise sigmas' worth, so one outlier batch cannot either. The
    ``max_progress`` condition keeps a run that learned and then converged -- every healthy run,
    eventually -- from being reported; set it to 1.0 or more to report any stall,
    early-stopping style.

    Onset: a loss still less than 10 % below its start has not learned since its first
    step, and ``since_step`` is that step (exact; by default this is the only case
    reported). After real progress it is the step of the last significant improvement,
    which can precede the true turning point by the ~30 steps a 3-sigma improvement
    takes to accumulate, or trail it by the average's lag (up to ~80 steps in tests with
    10 % noise; approximate). ``step`` is reached ``window`` collected steps after the last
    significant improvement, so a chance dip in a flat series can delay it. Once
    reported, it clears only when the average falls twice the margin below its best
    (and, for a run that had not learned, once it is 10 % below its start); a new
    stall is then reported again. On a very noisy loss (batches x/÷1.8) the start --
    a mean of ``span`` values -- can be 20 % off, and an ordinary stretch may then look
    like learning and re-arm the rule.
    A long warmup at log_interval 1 keeps the loss flat by design; raise ``window`` (or
    disable the rule) when warmup spans more collected steps than ``window``.
    """

    def __init__(self, settings: Mapping[str, Any]) -> None:
        super().__init__(settings)
        self.name = short(self.tag)
        self._alpha = 2.0 / (self.span + 1.0)
        self._count = 0
        self._ema = 0.0
        self._noise = 0.0  # variance of value - average (running, then 4 x span weighted)
        self._start = 0.0
        self._best = 0.0
        self._best_step = 0
        self._first_step = 0
        self._learned = False  # whether the reported stall came after real progress
        self._stale = 0
        self.active = False

    def update(self, step: int, value: float) -> Finding | None:
        """Feed the loss at ``step``."""
        count = self._count = self._count + 1
        d = value - self._ema
        if count <= self.span:
            # a plain running mean first: seeding the average with the first value
            # would bias its early best by that one batch
            if count == 1:
                self._ema = value
                self._first_step = step
            else:
                self._ema += d / count
                self._noise += (d * d * (count - 1) / count - self._noise) / count
            if count == self.span:
                self._start = self._best = self._ema
                self._best_step = self._first_step
                self._stale = self.span - 1  # counted from the first step
            return None
        alpha = self._alpha
        # winsorised: one outlier batch moves the average and the noise estimate by at
        # most 4 sigmas' worth, or a single spike would hide a stall (or fake one)
        limit = 4.0 * math.sqrt(self._noise)
        if limit > 0.0:
            d = max(-limit, min(limit, d))
        ema = self._ema = self._ema + alpha * d
        # the noise level is averaged 4x longer than the loss: a margin that wobbles
        # with a short noise estimate lets chance dips pass for progress
        slow = 0.25 * alpha
        self._noise = (1.0 - slow) * (self._noise + slow * d * d)
        best = self._best
        margin = max(
            self.min_delta * abs(best), 3.0 * math.sqrt(self._noise * alpha / (2.0 - alpha))
        )
        if self.active:
            # reported once; it clears only on a real move, twice the margin below the
            # best, so the deepest chance dip of a long flat stretch does not re-arm it;
            # "not learning since the start" lasts until the run has learned something
            start = self._start
            learned = start != 0.0 and (start - ema) / abs(start) >= _LEARNED
            if ema < best - 2.0 * margin and (learned or self._learned):
                self.active = False
                self._best = ema
                self._best_step = step
                self._stale = 0
            return None
        if ema < best - margin:
            self._best = ema
            self._best_step = step
            self._stale = 0
            return None
        self._stale += 1
        if self._stale < self.window or ema > best + margin:
            return None
        start = self._start
        # progress of the current average, not of the best: in a flat noisy series the
        # best is the deepest chance dip and would make the run look as if it learned
        progress = (start - ema) / abs(start) if start else 0.0
        if progress >= self.max_progress:
            return None
        self.active = True
        learned = self._learned = progress >= _LEARNED
        below = f"{fmt(max(progress, 0.0) * 100)}% below where it started ({fmt(start)})"
        delta = f"{fmt(self.min_delta * 100)}%"
        if learned:
            since = self._best_step
            message = (
                f"{self.name} stalled since step {since} at {fmt(ema)}: no improvement over "
                f"{delta} in {self._stale} collected steps ({below}); if it should still be "
                "learning, check the learning rate (too low now, or its schedule) and the "
                "data; if it has converged, consider stopping"
            )
        else:
            since = self._first_step
            message = (
                f"{self.name} not learning since step {since}: {fmt(ema)}, {below}, no "
                f"improvement over {delta} in the last {self._stale} collected steps; check "
                "that the learning rate is not tiny or zero and its warmup advances, that "
                "parameters are trainable and reach the optimizer, and that labels match "
                "inputs"
            )
        return Finding(since, ema, message)
