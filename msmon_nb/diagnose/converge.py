"""Whether a run has converged: the question the "something is broken" rules ask first.

A run that converged has gradients that shrank because the loss reached its floor:
that is success. Without this, ``grad_vanishing`` tells a noiseless regression trained
to 1e-12 to "look for saturating activations" and ``adam_v_stale`` reads the noise of
tiny gradients as a stale second moment (issue 36; the converged runs of
bench/detect_runs.py).

Only rules whose message would call a converged run broken ask it. A rule that warns
of a rise never does (issue 43): a run at its floor is where a compounding rise starts
from its lowest level, and waiting for the loss to leave the floor warned after it had
passed 10x its best. ``rising_trend`` tells noise at a floor from a rise by its own
tests for a steady one.

Converged, at the current step, means both:

* the loss is at a floor far below where it started: the median of its last ``window``
  values is at most ``ratio`` (1 %) of its starting level (the first value or the median
  of the first ``window``, whichever is larger); and
* grad_norm fell with it, not further: log(grad start / grad now) <= log(loss start /
  loss now), medians of the same windows. Near a minimum the gradient falls at most as
  fast as the loss (MSE: loss ~ grad^2, so half as many decades; cross-entropy near zero
  loss: about as many). A gradient that fell further than the loss vanished for another
  reason -- a dead network, gradients cut off, an injected scale -- and the rules must
  still speak. The latest grad_norm alone may not have fallen more than a decade
  further either, so a collapse is judged at the step it happens, not once the median
  has followed it. Without grad_norm only the loss is judged.

A negative or zero starting loss has no "fraction of its start": never converged then.
The state is two 15-value windows (O(window) per step, like the rules).
"""

from __future__ import annotations

import math

from msmon_nb.diagnose.window import RollingWindow

RATIO = 1e-2  # the loss at 1 % of its start or below: it has converged (with grad_norm)
WINDOW = 15  # values in each median: enough to ride out a hard batch, short enough to follow
# how much further than the loss a single grad_norm may have fallen (a decade): minibatch
# noise is 0.1-0.4 decades a step, a collapse (a dead network, an injected scale) is more
SLACK = math.log(10.0)


class _Level:
    """One series' recent median and where it started: the first value or the median of
    the first ``window``, whichever is larger (set once that window is full)."""

    __slots__ = ("first", "last", "start", "win")

    def __init__(self, window: int) -> None:
        self.win = RollingWindow(window)
        self.first: float | None = None
        self.last = 0.0
        self.start: float | None = None

    def add(self, value: float) -> None:
        win = self.win
        win.add(value)
        self.last = value
        if self.first is None:
            self.first = value
        if self.start is None and len(win) == win.size:
            self.start = max(self.first, win.median())


class Convergence:
    """Fed the loss and grad_norm of each step (``observe``, before the rules run);
    ``converged`` says whether the run is at its floor now (see the module docstring)."""

    __slots__ = ("_grad", "_loss", "companions", "ratio")

    def __init__(
        self, *, loss_tag: str, grad_tag: str, ratio: float = RATIO, window: int = WINDOW
    ) -> None:
        self.companions = (loss_tag, grad_tag)
        self.ratio = ratio
        self._loss = _Level(window)
        self._grad = _Level(window)

    def observe(self, tag: str, value: float) -> None:
        """A finite loss or grad_norm of the current step."""
        (self._loss if tag == self.companions[0] else self._grad).add(value)

    @property
    def converged(self) -> bool:
        """True while the loss sits at a floor far below its start and grad_norm has not
        fallen further than the loss did."""
        start = self._loss.start
        if start is None or start <= 0.0:
            return False
        level = self._loss.win.median()
        if not 0.0 <= level <= self.ratio * start:
            return False
        grad = self._grad
        if grad.start is None or grad.start <= 0.0:
            return grad.first is None  # no grad_norm at all: the loss alone
        fallen = math.inf if level == 0.0 else math.log(start / level)
        if _fall(grad.start, grad.win.median()) > fallen:
            return False
        # a collapse is judged at once, not after the median has followed it
        return _fall(grad.start, grad.last) <= fallen + SLACK


def _fall(start: float, now: float) -> float:
    """How far (natural log) a positive ``start`` fell to ``now``; inf at zero."""
    return math.inf if now <= 0.0 else math.log(start / now)
