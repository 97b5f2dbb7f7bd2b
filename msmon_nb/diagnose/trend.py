"""Trend rules: a slow, sustained, multiplicative rise, caught before the loss blows up.

A divergence that builds up over tens of steps (an lr schedule bug multiplying the lr
a few % a step, a loss scale growing without being undone) never leaves the running
median's band early on: each step is only a few % above the previous one. What does
show early is the *direction*: the lr keeps rising after its warmup, and the loss, the
gradient norm and the update size (lr x grad_norm) rise together, step after step, at
a steady rate. These rules fit that rate.

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

from msmon_nb.diagnose.alert import fmt, fmt_ratio
from msmon_nb.diagnose.base import EpisodeRule, Finding, short

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
    suf_y = [0.0] * (n + 1)  # suffix sums of y and i*y over i >= k
    suf_iy = [0.0] * (n + 1)
    for i in range(n - 1, -1, -1):
        suf_y[i] = suf_y[i + 1] + values[i]
        suf_iy[i] = suf_iy[i + 1] + i * values[i]
    total_y = suf_y[0]
    syy_c = sum(v * v for v in values) - total_y * total_y / n
    fits: list[tuple[int, float]] = []
    for k in range(n - 3):
        m = n - 1 - k  # points with x > 0
        sx = m * (m + 1) / 2.0
        sxx_c = m * (m + 1) * (2 * m + 1) / 6.0 - sx * sx / n
        sxy_c = suf_iy[k + 1] - k * suf_y[k + 1] - sx * total_y / n
        if sxx_c > 0.0 and sxy_c > 0.0:
            fits.append((k, syy_c - sxy_c * sxy_c / sxx_c))
    if not fits:
        return steps[0]
    best = min(sse for _, sse in fits)
    slack = HINGE_SLACK if slack is None else slack
    bar = best + slack * best / max(n - 3, 1)  # slack x the residual variance
    k = max(k for k, sse in fits if sse <= bar)
    return steps[k + 1]  # the last flat point is k; the rise shows from k + 1


class LrRise(EpisodeRule):
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

    __slots__ = (
        "_flat",
        "_peak",
        "_prev",
        "_ref",
        "_rises",
        "_since",
        "_warm",
        "factor",
        "name",
        "patience",
        "settle",
        "until",
    )

    def __init__(
        self, *, tag: str, factor: float, patience: int, settle: int, until: int | None
    ) -> None:
        super().__init__()
        self.name = short(tag)
        self.factor = factor
        self.patience = patience
        self.settle = settle
        self.until = until
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


class RisingTrend(EpisodeRule):
    """The loss and the gradient norm (or the update size, lr x grad_norm) rising together,
    multiplicatively and steadily: the early phase of a divergence.

    Over the last ``window`` collected steps, log(loss) must have a positive
    least-squares slope whose fitted rise over the window is at least ``factor`` x and
    whose significance (slope / standard error) is at least ``loss_t``; log(grad_norm)
    or log(lr x grad_norm) must rise at least ``companion_factor`` x with significance
    ``t`` (defaults on real runs: a converged loss swings too much for its slope alone
    to mean anything, so the partner carries the evidence). ``patience`` steps in a row
    confirm it. Healthy training lowers the loss while grad_norm or the lr rises
    (warmup, the early growth of the gradient norm), and a noisy loss swings without a
    steady direction, so the joint, significant rise is a divergence's signature.

    Fed the loss by the engine; ``observe`` gets grad_norm and the lr of the same step
    first. Without them (``detect`` over a loss alone) the loss is judged alone, with
    significance ``t``. ``since_step`` is the later of the change points of
    flat-then-rising fits (``hinge_onset``) to the last ``2 x window`` log-losses and
    values of the partner that rose: at or a little after the start of the rise. It clears
    after ``QUIET`` steps without a significant loss rise.
    """

    __slots__ = (
        "_grad",
        "_grad_seen",
        "_history",
        "_history_grad",
        "_history_steps",
        "_history_upd",
        "_loss",
        "_lr",
        "_run",
        "_upd",
        "companion_factor",
        "companions",
        "factor",
        "loss_t",
        "min_history",
        "name",
        "patience",
        "t",
        "window",
    )

    def __init__(
        self,
        *,
        tag: str,
        grad_tag: str,
        lr_tag: str,
        window: int,
        factor: float,
        companion_factor: float,
        t: float,
        loss_t: float,
        patience: int,
        min_history: int,
    ) -> None:
        super().__init__()
        self.name = short(tag)
        self.window = window
        self.factor = math.log(factor)
        self.companion_factor = math.log(companion_factor)
        self.t = t
        self.loss_t = loss_t
        self.patience = patience
        self.min_history = max(min_history, window)
        self.companions = (grad_tag, lr_tag)
        self._loss = SlidingSlope(window)
        self._grad = SlidingSlope(window)
        self._upd = SlidingSlope(window)
        self._grad_seen: float | None = None
        self._lr: float | None = None
        # the last 2 x window log-losses and their steps, for the onset
        self._history: deque[float] = deque(maxlen=2 * window)
        self._history_steps: deque[int] = deque(maxlen=2 * window)
        self._history_grad: deque[float] = deque(maxlen=2 * window)  # NaN where absent
        self._history_upd: deque[float] = deque(maxlen=2 * window)
        self._run = 0

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

    def update(self, step: int, value: float) -> Finding | None:
        """Feed the loss at ``step``."""
        grad = self._grad_seen
        self._grad_seen = None
        if value <= 0.0:  # a log-rate needs a positive loss; reset rather than guess
            self._loss = SlidingSlope(self.window)
            for history in (self._history, self._history_steps):
                history.clear()
            for history in (self._history_grad, self._history_upd):
                history.clear()
            self._run = 0
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
        self._run = self._run + 1 if rising else 0
        if self.active:
            self.episode.settle(calm=not rising)
            return None
        if self._run < self.patience:
            return None
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
            what += f" (x{rate:.3g} a step) and grad_norm (x{g_rate:.3g} a step)"
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
