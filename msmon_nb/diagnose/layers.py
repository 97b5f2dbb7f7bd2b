"""One layer rising alone: a parameter's gradient norm or update ratio past its own history
while the model as a whole does not move as much (``layer_rise``).

The global rules see one number per step; a failure in one layer (a wrong lr for one
parameter group, Adam's quiet-then-back gradient in one weight, a mis-set penalty, a
frozen layer unfrozen with a big lr, a corrupted weight) can change that number by less
than its noise while the layer's own series jumps by decades. So every collected step,
each parameter's two series -- its gradient norm and its update ratio ``||w - w_prev|| /
||w_prev||`` -- are judged against their own history, in log10 (a healthy series moves
multiplicatively):

- the model-wide move of the step (the median over the parameters of each series'
  distance from its level: an lr schedule, a loss scale, the loss falling) is taken out,
  so only a parameter that moves apart from the others counts: its *excess*;
- each series keeps a running level (an EMA over ``window`` steps, the plain mean until
  then) and a running spread of its excess (the EMA of its absolute value, x1.25 to a
  sigma, never below ``SPREAD_FLOOR`` decades), updated with deviations clipped at
  ``CLIP`` sigmas so that one wild step does not move them, and only a quarter as fast
  while it is over;
- a parameter is *over* when that excess is past ``z`` spreads and past ``factor``, while
  the global grad_norm (read from the same step's norms: sqrt of their sum of squares)
  rose less than ``global_factor`` over its own level: past it, the whole gradient rose
  with the layer and the global rules speak (their blame names the layer);
- ``patience`` over steps in a row confirm it, or one step over by ``jump`` (a weight
  written between two steps shows its update ratio once); the alert names the parameters
  over then, the first to rise first, and lasts until ``QUIET`` steps with none over.

A series that never moved (a frozen layer's update ratio, exactly 0) has no history of its
own to rise past: it is judged against the other parameters' level of that series, and
its history starts from theirs when it moves (a layer unfrozen at the usual lr moves like
the others and stays quiet). With fewer than
``min_history`` steps nothing is judged. Every step costs a few numpy operations over two
rows of P values (``bench/layers.py`` prints it).
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np

from msmon_nb.diagnose.base import CardRule, Episode, Finding
from msmon_nb.diagnose.blame import SPREAD_FLOOR, Blamed

TINY = 1e-30  # a zero norm or ratio, in log10 -30: "never moved"
STILL = math.log10(TINY) + 1.0  # a level below this: the series never moved
CLIP = 3.0  # sigmas a deviation is clipped to before it moves the level
ABS_TO_SIGMA = 1.2533  # E|x - mean| of a normal is 0.798 sigma
SERIES = ("grad_norm", "update_ratio")


class LayerRise(CardRule, kind="layer_rise"):
    """The per-parameter rule (module docstring). ``update(step, names, grads, ratios)``
    takes one collected step's per-parameter gradient norms and update ratios (NaN: not
    known); ``named`` holds the parameters of the last finding."""

    def __init__(self, settings: Mapping[str, Any]) -> None:
        super().__init__(settings)
        self.log_factor = math.log10(self.factor)
        self.log_jump = math.log10(self.jump)
        self.log_global = math.log10(self.global_factor)
        self.alpha = 2.0 / (self.window + 1)
        self.episode = Episode()
        self.named: list[Blamed] = []
        self.series: dict[str, str] = {}
        self._names: Sequence[str] | None = None
        self._reset(0)

    @property
    def active(self) -> bool:
        return self.episode.active

    def _reset(self, p: int) -> None:
        self.n = 0
        self._values = np.empty((2, p))
        self._level = np.zeros((2, p))
        self._spread = np.zeros((2, p))
        self._sigma = np.full((2, p), SPREAD_FLOOR)  # max(spread x 1.25, SPREAD_FLOOR)
        # the rows judged on a step: both series, or the gradient norms alone where no
        # update ratio is known (the default: half the arithmetic, and no all-NaN row to
        # take the slow median path every step)
        self._rows = {
            k: (self._values[:k], self._level[:k], self._spread[:k], self._sigma[:k])
            for k in (1, 2)
        }
        self._g = [0.0, 0.0]  # the global grad_norm's level and spread (log10)
        self._count = np.zeros(p, dtype=np.int64)  # over steps in a row, per parameter
        self._counting = False  # some count is not 0
        self._stilled = True  # some series may not have moved yet (``update``)
        self._since = np.zeros(p, dtype=np.int64)  # the first of them

    def update(
        self, step: int, names: Sequence[str], grads: np.ndarray, ratios: np.ndarray | None
    ) -> Finding | None:
        """One collected step (module docstring); a ``Finding`` when an episode starts.

        Written for a few numpy calls over the (2, P) rows on a step where nothing is
        over: no ``errstate`` (NaN passes through log10, comparisons and arithmetic
        without a warning), medians from one sort."""
        if names is not self._names:
            if self._names is None or list(names) != list(self._names):
                self._reset(len(grads))  # another parameter set: histories do not compare
            self._names = names
        values, level, spread, sigma = self._rows[1 if ratios is None else 2]
        values[0] = grads
        if ratios is not None:
            values[1] = ratios
        x = np.log10(np.maximum(values, TINY))  # NaN stays NaN, Inf stays Inf
        total = float(np.dot(values[0], values[0]))
        g = 0.5 * math.log10(total) if 0.0 < total < math.inf else math.nan
        n = self.n
        self.n = n + 1
        dev = x - level
        # never moved (judged against the others' level instead): checked while some
        # series has not moved yet, and every 64 steps (a level only sinks that far
        # after a long run of exact zeros)
        still = None
        if self._stilled or not n % 64:
            still = level < STILL
            self._stilled = bool(still.any())
            if not self._stilled:
                still = None
        common = _medians(dev if still is None else np.where(still, np.nan, dev))
        rows = (level, spread, sigma)
        if n < self.min_history:
            self._learn(rows, x, dev, g, 1.0 / (n + 1), None, common, still)
            return None
        excess = dev - common[:, None]
        if still is not None:
            typical = _medians(np.where(still, np.nan, x))
            excess = np.where(still, x - typical[:, None], excess)
        # how far the global grad_norm rose beyond the gradients' model-wide move: past
        # ``global_factor`` the whole gradient rose with the layer, and the global rules
        # speak (their blame names it)
        g_rise = g - self._g[0] - common[0]
        zs = excess / sigma
        over = (zs > self.z) & (excess > self.log_factor)
        if not g_rise < self.log_global:
            over[:] = False
        if not over.any():
            if self._counting:
                self._count[:] = 0
                self._counting = False
            self.episode.settle(calm=True)
            self._learn(rows, x, dev, g, self.alpha, None, common, still, excess)
            return None
        over_p = over.any(axis=0)
        started = over_p & (self._count == 0)
        self._since[started] = step
        self._count = np.where(over_p, self._count + 1, 0)
        self._counting = True
        big = ((excess > self.log_jump) & over).any(axis=0)
        confirmed = over_p & ((self._count >= self.patience) | big)
        self._learn(rows, x, dev, g, self.alpha, over, common, still, excess)
        self.episode.settle(calm=False)
        if not confirmed.any() or self.episode.active:
            return None
        self.episode.start()
        self.named = self._name(names, over_p, zs, values)
        first = self.named[0]
        return Finding(first.step, first.norm, self._message(first))

    def _name(
        self, names: Sequence[str], over_p: np.ndarray, zs: np.ndarray, values: np.ndarray
    ) -> list[Blamed]:
        """The parameters over now, the first to rise first, then the largest z; each
        with the series it rose most in (``series``: name -> grad_norm|update_ratio)."""
        found = []
        for j in np.flatnonzero(over_p):
            col = np.where(np.isnan(zs[:, j]), -np.inf, zs[:, j])
            i = int(np.argmax(col))
            z = float(col[i]) if math.isfinite(col[i]) else math.inf
            since = int(self._since[j])
            level = self._level[i, j]
            usual = float(10**level) if level >= STILL else 0.0  # 0: it never moved
            item = Blamed(names[j], z, since, float(values[i, j]), usual)
            found.append((since, -z, int(j), item, SERIES[i]))
        found.sort(key=lambda t: (t[0], t[1], t[2]))
        self.series = {t[3].name: t[4] for t in found}
        return [t[3] for t in found]

    def _message(self, first: Blamed) -> str:
        series = self.series[first.name]
        if not math.isfinite(first.norm):
            ratio = f"at {first.norm}"
        elif first.usual > 0:
            ratio = f"x{first.norm / first.usual:.3g}"
        else:
            ratio = "from 0"
        others = [b.name for b in self.named[1:3]]
        also = f" (also {', '.join(others)})" if others else ""
        return (
            f"layer {first.name}: {series} {ratio} over its own level since step "
            f"{first.step}, while the model's grad_norm did not rise with it{also}"
        )

    def _learn(
        self,
        rows: tuple[np.ndarray, np.ndarray, np.ndarray],
        x: np.ndarray,
        dev: np.ndarray,
        g: float,
        alpha: float,
        over: np.ndarray | None,
        common: np.ndarray,
        still: np.ndarray | None,
        excess: np.ndarray | None = None,
    ) -> None:
        """Move the levels and spreads toward this step (module docstring): deviations
        ``dev`` (``x`` - level) clipped at ``CLIP`` sigmas once there is history, a
        quarter of the rate where ``over``; NaN moves nothing. The spread is that of the
        excess (``common``, the step's model-wide move, taken out), the quantity ``z`` is
        judged on: the layers of a model rise and fall together early in training and
        with the lr, and that shared move is not a layer's own noise. ``rows``: the
        (level, spread, sigma) rows judged this step."""
        level, spread, sigma = rows
        if still is not None:
            wake = still & (x >= STILL)
            if wake.any():  # a series that never moved moves: its history starts here
                self._wake(level, spread, wake, x)
                dev = x - level
        # ``excess`` (judged this step) is ``dev - common`` unless a still series was
        # judged against the others instead: then, or without it, it is computed here
        own = np.abs(excess if still is None and excess is not None else dev - common[:, None])
        unknown = np.isnan(dev)  # ``common`` is finite: ``own`` is NaN exactly there too
        np.copyto(dev, 0.0, where=unknown)  # not known: the level stays
        np.copyto(own, spread, where=unknown)  # and the spread
        if self.n > self.min_history:
            # an Inf deviation ends at the limit, as np.clip puts it (two ufuncs: np.clip's
            # wrapper cost more than the rule's arithmetic on a few parameters)
            limit = CLIP * sigma
            np.minimum(dev, limit, out=dev)
            np.maximum(dev, -limit, out=dev)
            np.minimum(own, limit, out=own)
        elif not math.isfinite(float(dev.sum())):  # an Inf before there is history
            np.nan_to_num(dev, copy=False)
        if over is None:
            level += alpha * dev
            spread += alpha * (own - spread)
        else:
            rate = np.where(over, alpha / 4, alpha)
            level += rate * dev
            spread += rate * (own - spread)
        np.maximum(spread * ABS_TO_SIGMA, SPREAD_FLOOR, out=sigma)
        if g == g and g != math.inf:
            d = g - self._g[0]
            if self.n > self.min_history:
                limit = CLIP * max(self._g[1] * ABS_TO_SIGMA, SPREAD_FLOOR)
                d = min(max(d, -limit), limit)
            self._g[0] += alpha * d
            self._g[1] += alpha * (abs(d) - self._g[1])

    def _wake(self, level: np.ndarray, spread: np.ndarray, wake: np.ndarray, x: np.ndarray) -> None:
        """A series that never moved starts moving: its history starts from what the
        moving series of its kind do (their median level and spread; it has none of its
        own), so a layer unfrozen at the others' pace is at home at once and one unfrozen
        far above them stays over until ``patience`` confirms it."""
        moving = level >= STILL
        typical = _medians(np.where(moving, level, np.nan))
        usual = _medians(np.where(moving, spread, np.nan))
        for i, j in zip(*np.nonzero(wake), strict=True):
            level[i, j] = typical[i] if moving[i].any() else x[i, j]
            spread[i, j] = usual[i]


def _medians(rows: np.ndarray) -> np.ndarray:
    """Each row's median over its finite values (0 for a row with none): one sort, NaN
    last, no warning. The common case, every value finite, takes two numpy calls after
    the sort: this runs on every collected step, twice."""
    ordered = np.sort(rows, axis=1)
    p = ordered.shape[1]
    # sorted, -Inf comes first and +Inf then NaN last: the ends tell whether all are finite
    if p and all(map(math.isfinite, ordered[:, :: max(p - 1, 1)].ravel().tolist())):
        return 0.5 * (ordered[:, (p - 1) // 2] + ordered[:, p // 2])
    counts = np.count_nonzero(np.isfinite(ordered), axis=1)
    out = np.zeros(len(rows))
    for i, k in enumerate(counts.tolist()):
        if k:
            out[i] = 0.5 * (ordered[i, (k - 1) // 2] + ordered[i, k // 2])
    return out
