"""Trend rules: a slow, sustained, multiplicative rise, caught before the loss blows up.

A divergence that builds up over tens of steps (an lr schedule bug multiplying the lr
a few % a step, a loss scale growing without being undone) never leaves the running
median's band early on: each step is only a few % above the previous one. What does
show early is the *direction*: the lr keeps rising after its warmup, and the loss, the
gradient norm and the update size (lr x grad_norm) rise together, step after step, at
a steady rate. These rules fit that rate.

When the gradient scale (or an effective lr nobody records) grows, the loss often shows
nothing until the update crosses the stability edge and then passes 10x its best within
~10 steps (bench/detect.py, SGD x1.04 a step: flat until 8 steps before), so a warning
20 steps ahead must come from grad_norm: ``RisingTrend``'s grad-led shape. The update
size is a proxy, lr x grad_norm (exact for SGD, not for momentum or Adam, whose update
is built from optimizer state); with a constant lr it carries the same evidence as
grad_norm, and in warmup it rises by design, so the grad-led shape reads grad_norm
alone. Where even grad_norm stays flat (plain SGD whose true gradient shrinks as fast
as the scale grows; ``tests/scenarios/test_trend.py``) no scalar here shows the ramp
before the edge.

Rates are slopes of log(value) against the collected step index, fitted by least
squares over the last ``window`` values (``SlidingSlope``: O(1) per step) and judged by
their size (the fitted rise over the window) and their significance (slope over its
standard error), so the noise of small batches, which makes single steps swing by 2x,
has to line up for many steps to pass.

Onsets come from ``hinge_onset``: the change point of a flat-then-linear fit to the
recent history, computed only when an alert is raised; it lands at or a little after
the step the rise began, never in the flat stretch before it.
"""

from __future__ import annotations

import math
from collections import deque
from collections.abc import Mapping
from typing import Any

from msmon_nb.diagnose.alert import fmt, fmt_ratio
from msmon_nb.diagnose.base import CardRule, EpisodeRule, Finding, short

# How far from the best hinge fit (in residual variances) a later kink may be and still
# be taken as the onset: about a 1-sigma likelihood interval for the change point.
HINGE_SLACK = 0.7


class SlidingSlope:
    """Least-squares slope of the last ``size`` values against their index, O(1) per add.

    Running sums are updated as the window slides (each value's index drops by one) and
    recomputed from the window every ``size`` additions, so rounding cannot build up.
    """

    __slots__ = ("_adds", "_fifo", "size", "sxy", "sy", "syy")

    def __init__(self, size: int) -> None:
        self.size = size
        self._fifo: deque[float] = deque()
        self.sy = self.sxy = self.syy = 0.0
        self._adds = 0

    def __len__(self) -> int:
        return len(self._fifo)

    def add(self, y: float) -> None:
        """Append ``y``; the oldest value leaves once the window is full."""
        fifo = self._fifo
        if len(fifo) == self.size:
            y0 = fifo.popleft()
            self.sy -= y0
            self.sxy -= self.sy  # every remaining value moves down one index
            self.syy -= y0 * y0
        self.sxy += len(fifo) * y
        self.sy += y
        self.syy += y * y
        fifo.append(y)
        self._adds += 1
        if self._adds >= self.size:
            self._adds = 0
            self.sy = sum(fifo)
            self.sxy = sum(i * v for i, v in enumerate(fifo))
            self.syy = sum(v * v for v in fifo)

    def fit(self) -> tuple[float, float]:
        """(slope per index, t = slope / its standard error); (0, 0) below 3 values."""
        n = len(self._fifo)
        if n < 3:
            return 0.0, 0.0
        sx = n * (n - 1) / 2.0
        sxx_c = n * (n * n - 1) / 12.0  # sum of (x - mean x)^2 for x = 0..n-1
        sxy_c = self.sxy - sx * self.sy / n
        slope = sxy_c / sxx_c
        sse = max(self.syy - self.sy * self.sy / n - slope * sxy_c, 0.0)
        se = math.sqrt(sse / (n - 2) / sxx_c)
        if se == 0.0:
            return slope, math.copysign(math.inf, slope) if slope else 0.0
        return slope, slope / se

    def last(self) -> float:
        """The newest value."""
        return self._fifo[-1]


def _hinge_fits(values: list[float]) -> list[tuple[int, float, float, float]]:
    """For each kink ``k`` of a flat-then-linear fit ``a + b * max(0, i - k)`` with a
    positive slope: ``(k, sxy, sxx, sse)`` (centred cross and square sums of the hinge
    regressor, residual sum of squares). O(n) with suffix sums."""
    n = len(values)
    suf_y = [0.0] * (n + 1)  # suffix sums of y and i*y over i >= k
    suf_iy = [0.0] * (n + 1)
    for i in range(n - 1, -1, -1):
        suf_y[i] = suf_y[i + 1] + values[i]
        suf_iy[i] = suf_iy[i + 1] + i * values[i]
    total_y = suf_y[0]
    syy_c = sum(v * v for v in values) - total_y * total_y / n
    fits: list[tuple[int, float, float, float]] = []
    for k in range(n - 3):
        m = n - 1 - k  # points with x > 0
        sx = m * (m + 1) / 2.0
        sxx_c = m * (m + 1) * (2 * m + 1) / 6.0 - sx * sx / n
        sxy_c = suf_iy[k + 1] - k * suf_y[k + 1] - sx * total_y / n
        if sxx_c > 0.0 and sxy_c > 0.0:
            fits.append((k, sxy_c, sxx_c, max(syy_c - sxy_c * sxy_c / sxx_c, 0.0)))
    return fits


class LogGrowth:
    """One series' growth, in log10, as the growth rules judge it (``diagnose.attention``'s
    max logits, ``diagnose.activations``' max |x|): a ``SlidingSlope`` over the last
    ``window`` values with this step's fitted rise over the window (``rise``) and its
    significance (``t``), the largest value before the window (``peak``: "beyond its own
    earlier peak"), and the last ``history`` windows of values and their steps (``recent``,
    ``steps``: what an onset is dated from). ``count``: the rule's steps over in a row."""

    __slots__ = ("count", "n", "peak", "recent", "rise", "slope", "steps", "t", "window")

    def __init__(self, window: int, history: int) -> None:
        self.window = window
        self.slope = SlidingSlope(window)
        self.recent: deque[float] = deque(maxlen=history * window)
        self.steps: deque[int] = deque(maxlen=history * window)
        self.peak = -math.inf  # the largest log value before the current window
        self.n = 0
        self.count = 0  # steps over in a row
        self.rise = 0.0  # the fitted rise over the window (log10), this step
        self.t = 0.0

    def add(self, step: int, y: float) -> None:
        """Take ``y`` (a log10 value) of collected step ``step``."""
        if len(self.recent) >= self.window:  # leaving the window: history
            self.peak = max(self.peak, self.recent[-self.window])
        self.slope.add(y)
        self.recent.append(y)
        self.steps.append(step)
        self.n += 1
        b, self.t = self.slope.fit()
        self.rise = b * (len(self.slope) - 1)

    def per_step(self) -> float:
        """The fitted growth factor per collected step."""
        return 10 ** (self.rise / max(len(self.slope) - 1, 1))


def hinge_onset(steps: list[int], values: list[float], slack: float | None = None) -> int:
    """The first rising step of a flat-then-linear fit ``a + b * max(0, i - k)`` (b > 0):
    ``steps[k + 1]``, for the latest kink ``k`` whose fit is within ``slack`` residual
    variances of the best one.

    The best kink alone lands a few steps either side of the true start on a noisy
    series; taking the late end of the near-best kinks errs late, so an onset is not
    dated before the rise it names. O(n) with suffix sums; used when an alert is raised.
    """
    n = len(values)
    if n < 4:
        return steps[0]
    fits = _hinge_fits(values)
    if not fits:
        return steps[0]
    best = min(sse for _, _, _, sse in fits)
    slack = HINGE_SLACK if slack is None else slack
    bar = best + slack * best / max(n - 3, 1)  # slack x the residual variance
    k = max(k for k, _, _, sse in fits if sse <= bar)
    return steps[k + 1]  # the last flat point is k; the rise shows from k + 1


def hinge_rise(
    values: list[float], *, min_flat: int, min_rise: int, rise: float
) -> tuple[float, int, float]:
    """The strongest flat-then-rising fit: ``(t, k, fitted rise)`` maximising the slope's
    significance ``t`` (slope / standard error) over kinks ``k`` that leave at least
    ``min_flat`` points before the rise and ``min_rise`` in it, among fits whose rise
    since the kink, ``b * (n - 1 - k)``, is at least ``rise``; ``(0, -1, 0)`` if none.

    Why a hinge rather than a straight line: a divergence that began 20 steps ago fills
    only part of any fixed window, and a line through the flat part dilutes its slope;
    the flat stretch before the kink instead pins the level and the noise, so the same
    20 rising steps are about 1.5x as significant (a line over 30 steps needed ~x3.5 of
    growth for t = 5; the hinge reaches t = 7 at ~x2.5 on the same run).
    """
    n = len(values)
    best = (0.0, -1, 0.0)
    for k, sxy, sxx, sse in _hinge_fits(values):
        m = n - 1 - k
        if k + 1 < min_flat or m < min_rise:
            continue
        slope = sxy / sxx
        if slope * m < rise:
            continue
        if sse == 0.0:
            return (math.inf, k, slope * m)
        t = slope / math.sqrt(sse / (n - 2) / sxx)
        if t > best[0]:
            best = (t, k, slope * m)
    return best


def hinge_slope(values: list[float], k: int) -> float:
    """Least-squares slope of ``a + b * max(0, i - k)`` through ``values``: ``b``."""
    n = len(values)
    x = [max(0, i - k) for i in range(n)]
    mean_x = sum(x) / n
    mean_y = sum(values) / n
    sxx = sum((v - mean_x) ** 2 for v in x)
    if sxx == 0.0:
        return 0.0
    return sum((xi - mean_x) * (v - mean_y) for xi, v in zip(x, values, strict=True)) / sxx


def ols_t(values: list[float]) -> float:
    """Significance (slope / standard error) of a least-squares line through ``values``
    against their index; 0 below 3 values or on a constant series."""
    n = len(values)
    if n < 3:
        return 0.0
    mean_x = (n - 1) / 2.0
    mean_y = sum(values) / n
    sxx = n * (n * n - 1) / 12.0
    sxy = sum((i - mean_x) * (v - mean_y) for i, v in enumerate(values))
    syy = sum((v - mean_y) ** 2 for v in values)
    slope = sxy / sxx
    sse = max(syy - slope * sxy, 0.0)
    if sse == 0.0:
        return math.copysign(math.inf, slope) if slope else 0.0
    return slope / math.sqrt(sse / (n - 2) / sxx)


class LrRise(CardRule, EpisodeRule, kind="lr_rise"):
    """The lr keeps rising after its warmup, and nothing declared it.

    Warmup is the rise the lr starts with: it lasts until the lr first goes down or
    stays flat for ``settle`` collected steps in a row. After that, a rise is reported
    when the lr went up at each of the last ``patience`` collected steps and stands at
    ``factor`` x or more its highest value before that rise (so a cyclic or restarted
    schedule climbing back to its old peak is quiet; an lr growing a few % a step is not).
    ``until``: rises before this step are expected (a declared schedule; e.g. a second
    warmup). ``since_step`` is the first step of the rise (exact).

    A rise that starts while the warmup is still going on (no flat or falling step in
    between) is taken for the warmup.
    """

    def __init__(self, settings: Mapping[str, Any]) -> None:
        super().__init__(settings)
        self.name = short(self.tag)
        self._prev: float | None = None
        self._peak = 0.0
        self._ref = 0.0
        self._rises = 0
        self._since = 0
        self._flat = 0
        self._warm = True

    def update(self, step: int, value: float) -> Finding | None:
        """Feed the learning rate at ``step``."""
        prev = self._prev
        self._prev = value
        if prev is None:
            self._peak = value
            return None
        if value > prev:
            if self._rises == 0:
                self._since = step
                self._ref = self._peak
            self._rises += 1
            self._flat = 0
        else:
            self._rises = 0
            if value < prev:
                self._warm = False
            else:
                self._flat += 1
                if self._flat >= self.settle:
                    self._warm = False
        if value > self._peak:
            self._peak = value
        if self.active:
            self.episode.settle(calm=self._rises == 0)
            return None
        if self._warm or self._rises < self.patience:
            return None
        if self.until is not None and step < self.until:
            return None
        ref = self._ref
        if ref <= 0.0 or value < self.factor * ref:
            return None
        self.episode.start()
        per_step = (value / ref) ** (1.0 / self._rises)
        message = (
            f"{self.name} rising since step {self._since}: {fmt(value)}, {fmt_ratio(value / ref)} "
            f"its earlier peak {fmt(ref)}, up at each of the last {self._rises} collected steps "
            f"({fmt_ratio(per_step)} a step) after its warmup ended, with no schedule declaring "
            "it; an lr that keeps growing makes training diverge: check the schedule (a factor "
            "applied every step, a step counter going the wrong way) and lower the lr, or "
            f"declare the rise with alerts: {{lr_rise: {{until: <step>}}}}"
        )
        return Finding(self._since, value, message)


# The grad-led arm of ``RisingTrend``: the hinge's flat part and rising part must hold at
# least these fractions of its ``2 x window`` history (20 and 10 values by default), so
# the level and the noise are pinned before the rise and a rise is more than a blip.
_FLAT_SHARE = 1 / 3
_RISE_SHARE = 1 / 6
# ... and it is only computed (O(window) per step) once the straight-line slope of the
# last ``window`` log grad_norms is at least this significant (cheap, O(1)): on the
# real healthy runs of bench/detect.py that gate is open on ~2.5 % of steps.
_GATE_T = 2.0
# ... and that line rises at least this share of ``companion_factor`` over the window.
# A rise the hinge would report (x2 over its last 10-40 values) puts 0.75-1.0 of it on
# that line; a grad_norm creeping up a few % over the window (the memorising, random-
# label MLP of bench/overhead.py: t >= 2 on half its steps) does not, and paid the fit
# (~27 us offline, ~100 us inside Model.train's callback). Checked: the same alerts,
# steps and onsets with this share at 0.2, 0.3 or 0.4 on bench/detect.py's 67 runs and
# tests/diagnose's 60 synthetic healthy ones; no fit on that bench's run at any of them.
_GATE_RISE = 0.2
# A loss falling this significantly over the rising stretch is healthy training whose
# gradient norm grows (early training, warmup), not a divergence.
_LOSS_FALLING_T = -2.0
# The grad-led onset takes the late end of a wider interval than ``HINGE_SLACK``'s
# (8 residual variances, about a 2.8-sigma likelihood interval): it is dated from fewer
# rising values, and a few low grad_norms just before the rise pull the best kink early
# (on bench/detect.py one momentum run was dated 9 steps before its rise with 0.7 and 2
# steps before with 5; with 8 all 14 slow-divergence runs are dated 5-20 steps after
# it: late, never early).
_LEAD_SLACK = 8.0


class RisingTrend(CardRule, EpisodeRule, kind="rising_trend"):
    """The early phase of a divergence, in either of two shapes.

    *Joint*: the loss and the gradient norm (or the update size, lr x grad_norm) rising
    together, multiplicatively and steadily. Over the last ``window`` collected steps,
    log(loss) must have a positive least-squares slope whose fitted rise over the window
    is at least ``factor`` x and whose significance (slope / standard error) is at least
    ``loss_t``; log(grad_norm) or log(lr x grad_norm) must rise at least
    ``companion_factor`` x with significance ``t`` (defaults on real runs: a converged
    loss swings too much for its slope alone to mean anything, so the partner carries the
    evidence). Healthy training lowers the loss while grad_norm or the lr rises (warmup,
    the early growth of the gradient norm), and a noisy loss swings without a steady
    direction, so the joint, significant rise is a divergence's signature.

    *Grad-led*: log(grad_norm) flat, then rising steadily, while the loss has not yet
    moved. When the gradient scale or the effective lr grows a few % a step (a loss
    scale not undone, a per-step factor in the optimizer), the loss stays flat until
    the update crosses the stability edge and then passes 10x its best within ~10
    steps, too fast for any loss-based warning to come 20 steps ahead; grad_norm (and
    with a constant lr the update size, which is then proportional to it) rises from the
    first step. Over the last ``2 x window`` log grad_norms, the best flat-then-rising
    fit (``hinge_rise``; at least 1/3 of the values flat, 1/6 rising) must rise
    ``companion_factor`` x or more since its kink with significance ``lead_t``, while
    the loss over the same stretch is not falling significantly (healthy training that
    grows its gradient norm lowers the loss), and only once grad_norm's early growth is
    over (its straight-line slope over ``2 x window`` steps has been <= 0 once: healthy
    runs often grow it several-fold at the start, the way warmup grows the lr).
    Calibration (``lead_t`` 6 held ``lead_patience`` 2 steps): on bench/detect.py's real
    healthy runs and the steps before each failure the statistic never passed 3.3 (3.1
    held 2 steps); on tests/diagnose's synthetic healthy curves it reached 5.8 (5.2 held
    2 steps) once, on log-normal grad_norm noise of x2.2 a step; a x1.04-a-step rise
    passes 6 some 15-20 steps in.

    ``patience`` steps in a row confirm the joint shape, ``lead_patience`` the grad-led
    one. Fed the loss by the engine; ``observe``
    gets grad_norm and the lr of the same step first. Without them (``detect`` over a
    loss alone) the loss is judged alone, with significance ``t``. ``since_step`` is the
    later of the change points of flat-then-rising fits (``hinge_onset``) to the last
    ``2 x window`` log-losses and values of the partner that rose (grad-led: of
    grad_norm alone): at or a little after the start of the rise. It clears after
    ``QUIET`` steps with neither shape present.

    Convergence quiets neither shape (issue 43): a run at its floor is where a
    compounding rise starts from its lowest level, and a rule that waited for the loss
    to leave its floor warned after the loss had passed 10x its best (a Momentum
    regression at its floor, gradients x1.04 a step: 8 steps after, against 23 before
    without the wait; ``tests/diagnose/test_converged.py``). Noise at a floor is told
    from a rise the way any noise is: it has no steady direction, so neither shape's
    significance tests pass on it. On the 20 converged healthy runs of bench/detect.py
    (14.5 k steps) one alert comes, on a loss that leaves its floor x20 in 60 steps
    and stays there (Adam at lr 1e-2 memorising 64 samples, the tuning set): a rise,
    reported as one.
    """

    def __init__(self, settings: Mapping[str, Any]) -> None:
        super().__init__(settings)
        window = self.window
        self.name = short(self.tag)
        self.factor = math.log(self.factor)
        self.companion_factor = math.log(self.companion_factor)
        self.min_history = max(self.min_history, window)
        self._loss = SlidingSlope(window)
        self._grad = SlidingSlope(window)
        # grad_norm's early growth: the grad-led shape waits until the 2 x window
        # straight-line slope of log grad_norm has been <= 0 once
        self._grad_long = SlidingSlope(2 * window)
        self._grad_settled = False
        self._upd = SlidingSlope(window)
        self._grad_seen: float | None = None
        self._lr: float | None = None
        # the last 2 x window log-losses and their steps, for the onset
        self._history: deque[float] = deque(maxlen=2 * window)
        self._history_steps: deque[int] = deque(maxlen=2 * window)
        self._history_grad: deque[float] = deque(maxlen=2 * window)  # NaN where absent
        self._history_upd: deque[float] = deque(maxlen=2 * window)
        self._run = 0
        self._lead_run = 0

    def observe(self, tag: str, value: float) -> None:
        """grad_norm or lr of the current step (finite values), before ``update``."""
        if tag == self.companions[0]:
            self._grad_seen = value
        else:
            self._lr = value

    def _rising(self, slope: SlidingSlope, factor: float, t_min: float) -> bool:
        if len(slope) < self.window:
            return False
        rate, t = slope.fit()
        return rate > 0.0 and rate * (self.window - 1) >= factor and t >= t_min

    def _lead(self, gated: bool) -> tuple[float, int, float, int] | None:
        """The grad-led shape at this step: ``(t, first rising index, fitted log-rise,
        rising values)`` over the paired history, or None. ``gated``: skip the O(window)
        fit unless the cheap straight-line slope already points up (while an episode
        lasts it is not gated, so the gate cannot end an episode the fit still sees)."""
        grad = self._history_grad
        if len(grad) < grad.maxlen or not self._grad_settled:
            return None
        if gated and not self._rising(self._grad, _GATE_RISE * self.companion_factor, _GATE_T):
            return None
        pairs = [(g, y) for g, y in zip(grad, self._history, strict=True) if g == g]
        if len(pairs) < len(grad):  # grad_norm missing at some steps: no fair fit
            return None
        values = [g for g, _ in pairs]
        n = len(values)
        t, k, rise = hinge_rise(
            values,
            min_flat=int(n * _FLAT_SHARE),
            min_rise=int(n * _RISE_SHARE),
            rise=self.companion_factor,
        )
        if t < self.lead_t:
            return None
        if ols_t([y for _, y in pairs[k + 1 :]]) <= _LOSS_FALLING_T:
            return None
        return t, k + 1, rise, n - 1 - k

    def _reset(self) -> None:
        self._loss = SlidingSlope(self.window)
        for history in (self._history, self._history_steps):
            history.clear()
        for history in (self._history_grad, self._history_upd):
            history.clear()
        self._run = self._lead_run = 0

    def update(self, step: int, value: float) -> Finding | None:
        """Feed the loss at ``step``."""
        grad = self._grad_seen
        self._grad_seen = None
        if value <= 0.0:  # a log-rate needs a positive loss; reset rather than guess
            self._reset()
            return None
        y = math.log(value)
        self._loss.add(y)
        self._history.append(y)
        self._history_steps.append(step)
        companions = False
        g = u = math.nan
        if grad is not None and grad > 0.0:
            companions = True
            g = math.log(grad)
            self._grad.add(g)
            if not self._grad_settled:
                long = self._grad_long
                long.add(g)
                self._grad_settled = len(long) == long.size and long.fit()[0] <= 0.0
            lr = self._lr
            if lr is not None and lr > 0.0:
                u = math.log(lr * grad)
                self._upd.add(u)
        self._history_grad.append(g)
        self._history_upd.append(u)
        rising = len(self._history) >= self.min_history and self._rising(
            self._loss, self.factor, self.loss_t if companions else self.t
        )
        partner = None
        if rising and companions:
            if self._rising(self._grad, self.companion_factor, self.t):
                partner = self._history_grad
            elif self._rising(self._upd, self.companion_factor, self.t):
                partner = self._history_upd
            rising = partner is not None
        # judged on its own: a step where the joint shape also holds must not break
        # the grad-led run (they overlap as the loss starts to follow)
        lead = self._lead(gated=not self.active) if companions else None
        self._run = self._run + 1 if rising else 0
        self._lead_run = self._lead_run + 1 if lead is not None else 0
        if self.active:
            self.episode.settle(calm=not rising and lead is None)
            return None
        if self._run >= self.patience:
            return self._joint(step, value, y, partner, companions)
        if lead is not None and self._lead_run >= self.lead_patience:
            return self._led(step, value, lead)
        return None

    def _joint(
        self, step: int, value: float, y: float, partner: deque | None, companions: bool
    ) -> Finding:
        self.episode.start()
        steps = list(self._history_steps)
        since = hinge_onset(steps, list(self._history))
        if partner is not None:
            # the rise is joint: it began once both had started (the loss alone can
            # wander up for a while before the partner turns)
            pairs = [(s, v) for s, v in zip(steps, partner, strict=True) if v == v]
            if len(pairs) >= 4:
                since = max(since, hinge_onset([s for s, _ in pairs], [v for _, v in pairs]))
        rate = math.exp(self._loss.fit()[0])
        what = f"{self.name}"
        if companions:
            g_rate = math.exp(self._grad.fit()[0])
            grad = short(self.companions[0])
            what += f" (x{rate:.3g} a step) and {grad} (x{g_rate:.3g} a step)"
        else:
            what += f" (x{rate:.3g} a step)"
        message = (
            f"{what} rising together since step {since}: {self.name} {fmt(value)}, up "
            f"{fmt_ratio(math.exp(y - min(self._history)))} from its recent low, "
            f"steadily over the last {self.window} collected steps; training is starting to "
            "diverge: lower the learning rate or clip gradients now, and check the lr "
            "schedule and any loss scale"
        )
        return Finding(since, value, message)

    def _led(self, step: int, value: float, lead: tuple[float, int, float, int]) -> Finding:
        self.episode.start()
        _t, first, rise, count = lead
        steps = list(self._history_steps)
        grads = list(self._history_grad)
        # the hinge's own kink can sit a few steps early on a noisy series; the late
        # end of the near-best kinks does not (never before the rise)
        since = max(steps[first], hinge_onset(steps, grads, _LEAD_SLACK))
        # the update size, proxied by lr x grad_norm (exact for SGD only), over the same fit
        upd = list(self._history_upd)
        update = ""
        if all(u == u for u in upd):
            u_rise = math.exp(hinge_slope(upd, first - 1) * count)
            update = f"; the update size lr x grad_norm {fmt_ratio(u_rise)} over them"
        message = (
            f"{short(self.companions[0])} rising steadily since step {since}: "
            f"{fmt(math.exp(grads[-1]))}, "
            f"{fmt_ratio(math.exp(rise))} in {count} collected steps "
            f"(x{math.exp(rise / count):.3g} a step){update}, while {self.name} "
            f"({fmt(value)}) has not improved; the gradient or update scale is growing "
            "(a loss scale not undone, an lr or factor compounding every step) and the loss "
            "will blow up once it passes the stability edge: lower the learning rate or "
            "clip gradients now, and check any loss scale and the lr schedule"
        )
        return Finding(since, value, message)
