"""Which parameter started it: per-parameter gradient norms and update ratios of the last
collected steps, and the parameters whose series rose first and most when a gradient or
loss alert fires.

``NormRing`` keeps the last N collected steps' per-parameter gradient L2 norms (loss
scale undone, before clipping, like ``train/grad_norm``) and update ratios (``||w -
w_prev|| / ||w_prev||``, ``monitor.layers``; NaN where not known), one row per collected
step: pushing a row copies 2P floats, nothing else runs until an alert asks. Both series
are judged alike, and a parameter's z at a row is the larger of its two.

``blame`` judges each parameter against its own history. Norms are compared in log10
(a healthy norm fluctuates multiplicatively, so "x10" is the same evidence for a bias
of 1e-4 and a weight of 10). The reference is the median of the rows before the alert's
onset, the spread 1.4826 x their MAD (never below ``SPREAD_FLOOR`` decades, so a norm
that hardly moved does not turn a 20 % wiggle into a huge z); with fewer than
``MIN_BASELINE`` rows before the onset, every row up to the alert is the reference (the
median shrugs off a minority of bad rows). A parameter *rose* at the first row of its
unbroken run of rows over ``z`` that reaches the alert's onset or later; a NaN or Inf
norm counts as over. Parameters are ranked by that first row (who rose first), then by
their largest z in the run (who rose most). The lead of a blame is how many steps before
the alert's onset its first parameter rose.
"""

from __future__ import annotations

import math
import warnings
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

from msmon_nb.diagnose.window import MAD_TO_SIGMA

SPREAD_FLOOR = 0.05  # decades (x1.12): below it, a spread is noise of the estimate
MIN_BASELINE = 4  # rows before the onset needed to judge against them alone


@dataclass(frozen=True)
class Blamed:
    """One parameter an alert names: its name, its largest robust z in its rise, the
    step it rose at, and its norm then against its usual (the median)."""

    name: str
    z: float
    step: int
    norm: float
    usual: float

    def to_dict(self) -> dict[str, object]:
        """JSON-safe (an infinite z, from a NaN/Inf norm, is the string 'inf')."""
        return {
            "name": self.name,
            "z": round(self.z, 2) if math.isfinite(self.z) else "inf",
            "step": self.step,
            "norm": self.norm if math.isfinite(self.norm) else str(self.norm),
            "usual": self.usual,
        }


class NormRing:
    """The last ``size`` collected steps' per-parameter gradient norms (module docstring).

    A row whose parameter names differ from the rows held (another model, a changed
    parameter set) starts the buffer over: norms of different parameters do not compare.
    """

    def __init__(self, size: int) -> None:
        self.size = size
        self.names: list[str] = []
        # the names tuple of the last push: a way in hands over the same tuple every step
        # (``collect.gradtaps.tapped_names``), so the name-by-name comparison runs only
        # when another one comes (a list, which may have changed in place, always is)
        self._given: object = None
        self._rows = np.zeros((0, 0))
        # each row's update ratios (NaN: not known), beside its gradient norms
        self._ratios = np.zeros((0, 0))
        self._steps = np.zeros(size, dtype=np.int64)
        self._next = 0  # where the next row goes
        self._count = 0

    def __len__(self) -> int:
        return self._count

    def push(
        self, step: int, names: Sequence[str], norms: np.ndarray, ratios: np.ndarray | None = None
    ) -> None:
        """Keep ``norms`` (one per name) and their update ``ratios`` (None: not known) as
        step ``step``'s row."""
        if len(names) != len(norms):
            raise ValueError(f"{len(names)} names for {len(norms)} norms")
        if names is not self._given and list(names) != self.names:
            self.names = list(names)
            self._rows = np.zeros((self.size, len(names)))
            self._ratios = np.full((self.size, len(names)), np.nan)
            self._next = self._count = 0
        self._given = names if isinstance(names, tuple) else None
        self._rows[self._next] = norms
        self._ratios[self._next] = np.nan if ratios is None else ratios
        self._steps[self._next] = step
        self._next = (self._next + 1) % self.size
        self._count = min(self._count + 1, self.size)

    def last(self) -> tuple[int, np.ndarray] | None:
        """The newest row: (step, norms), or None when empty."""
        if not self._count:
            return None
        i = (self._next - 1) % self.size
        return int(self._steps[i]), self._rows[i]

    def rows(self) -> tuple[np.ndarray, np.ndarray]:
        """(steps, norms[rows, parameters]), oldest first."""
        return self._ordered(self._rows)

    def ratio_rows(self) -> tuple[np.ndarray, np.ndarray]:
        """(steps, update ratios[rows, parameters]), oldest first (NaN: not known)."""
        return self._ordered(self._ratios)

    def _ordered(self, held: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        if self._count < self.size:
            return self._steps[: self._count].copy(), held[: self._count].copy()
        order = np.r_[self._next : self.size, 0 : self._next]
        return self._steps[order], held[order]


def blame(ring: NormRing, step: int, since_step: int, z: float, top: int) -> list[Blamed]:
    """The parameters that rose first and most before an alert confirmed at ``step``
    with onset ``since_step`` (module docstring); at most ``top``, [] when none rose.
    Each parameter's gradient norm and its update ratio are judged alike; its z at a row
    is the larger of the two (a one-group lr jump shows in the update ratio first)."""
    steps, norms = ring.rows()
    _, ratios = ring.ratio_rows()
    keep = steps <= step
    steps, norms, ratios = steps[keep], norms[keep], ratios[keep]
    if len(steps) < 2:
        return []
    zs, median = _zscores(steps, norms, since_step)
    values = norms
    if np.isfinite(ratios).any():
        zr, median_r = _zscores(steps, ratios, since_step, nan_is_over=False)
        by_ratio = zr > zs
        zs = np.where(by_ratio, zr, zs)
        values = np.where(by_ratio, ratios, norms)
        median = np.stack([median, median_r])
    else:
        by_ratio = np.zeros(zs.shape, dtype=bool)
        median = np.stack([median, median])
    over = zs > z
    found: list[tuple[int, float, int, Blamed]] = []
    at_or_after = np.flatnonzero(steps >= since_step)
    if not len(at_or_after):
        at_or_after = np.array([len(steps) - 1])
    for j, name in enumerate(ring.names):
        hits = at_or_after[over[at_or_after, j]]
        if not len(hits):
            continue
        first = last = int(hits[0])
        while first > 0 and over[first - 1, j]:
            first -= 1
        while last + 1 < len(steps) and over[last + 1, j]:
            last += 1
        peak = first + int(np.argmax(zs[first : last + 1, j]))
        level = median[int(by_ratio[peak, j]), j]
        usual = float(10**level) if math.isfinite(level) else float("nan")
        item = Blamed(name, float(zs[peak, j]), int(steps[first]), float(values[peak, j]), usual)
        found.append((int(steps[first]), -item.z, j, item))
    found.sort(key=lambda t: (t[0], t[1], t[2]))
    return [item for *_, item in found[:top]]


def _zscores(
    steps: np.ndarray, values: np.ndarray, since_step: int, nan_is_over: bool = True
) -> tuple[np.ndarray, np.ndarray]:
    """(robust z of every row and parameter in log10 against the rows before the onset,
    the median log10 per parameter); a NaN/Inf value is over (+inf) when ``nan_is_over``
    (a gradient norm), else no evidence (-inf: an update ratio not known)."""
    with np.errstate(divide="ignore", invalid="ignore"):
        logs = np.log10(values)
    bad = ~np.isfinite(logs)  # NaN/Inf value (or 0: log -inf, treated as no rise below)
    over_bad = bad & ~(values == 0) & (nan_is_over | np.isinf(values))
    before = steps < since_step
    base = logs[before] if int(before.sum()) >= MIN_BASELINE else logs
    base = np.where(np.isfinite(base), base, np.nan)
    with np.errstate(invalid="ignore"), warnings.catch_warnings():
        warnings.simplefilter("ignore", RuntimeWarning)  # all-NaN column: no median
        median = np.nanmedian(base, axis=0)
        spread = np.nanmedian(np.abs(base - median), axis=0) * MAD_TO_SIGMA
    spread = np.maximum(np.nan_to_num(spread, nan=SPREAD_FLOOR), SPREAD_FLOOR)
    with np.errstate(invalid="ignore"):
        zs = (logs - median) / spread
    zs = np.where(over_bad, np.inf, np.nan_to_num(zs, nan=-np.inf, neginf=-np.inf))
    return zs, median


def describe(blamed: Sequence[Blamed]) -> str:
    """The suffix an alert's message gets: ``started in: fc2.weight (z=41 at step 120),
    ...``."""
    parts = []
    for b in blamed:
        z = (
            f"{b.z:.0f}"
            if math.isfinite(b.z) and b.z >= 10
            else (f"{b.z:.1f}" if math.isfinite(b.z) else "inf")
        )
        parts.append(f"{b.name} (z={z} at step {b.step})")
    return "started in: " + ", ".join(parts)
