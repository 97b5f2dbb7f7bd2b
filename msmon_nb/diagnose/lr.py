"""Learning-rate rules: lr at zero, a warmup that never rises, a decay that never comes.

A constant learning rate is a legitimate choice, so the warmup and decay rules only
judge what the user declared (``warmup_steps``, ``expect_by``); without that, the
warmup rule still catches the common bug signature of a schedule whose step counter
never advances: an lr stuck at a tiny first value (e.g. peak / warmup_steps).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from msmon_nb.diagnose.alert import fmt
from msmon_nb.diagnose.base import CardRule, Finding, Streak, short


class LrZero(CardRule, kind="lr_zero"):
    """lr <= 0 for ``patience`` collected steps in a row: nothing is being learned.

    A schedule that starts its warmup at 0 or ends its decay at 0 shows a single zero;
    ``patience`` (default 3) lets that pass. ``since_step`` is the first zero (exact).
    """

    def __init__(self, settings: Mapping[str, Any]) -> None:
        super().__init__(settings)
        self.name = short(self.tag)
        self._streak = Streak(self.patience)

    @property
    def active(self) -> bool:
        """True while the episode lasts."""
        return self._streak.active

    def update(self, step: int, value: float) -> Finding | None:
        """Feed the learning rate at ``step``."""
        streak = self._streak
        if value > 0.0:
            streak.miss()
            return None
        if not streak.hit(step):
            return None
        what = "0" if value == 0 else f"negative ({fmt(value)}: this ascends the loss)"
        message = (
            f"{self.name} is {what} since step {streak.since} ({streak.count} collected steps): "
            "parameters are not updated; check the schedule (a warmup starting at 0 that "
            "never advances, a decay ending at 0 or min_lr=0 before training ends) and the "
            "learning_rate passed to the optimizer"
        )
        return Finding(streak.since, value, message)


class LrWarmup(CardRule, kind="lr_warmup"):
    """The lr never moved from its first value during the first ``patience`` collected
    steps, while a warmup of ``warmup_steps`` was configured, or while that first value
    is tiny (<= ``tiny``) -- the signature of a warmup whose step counter is stuck.

    Judged once, on the first ``patience`` collected steps; ``since_step`` is the first
    step (exact). A first value <= 0 is left to ``lr_zero``.
    """

    def __init__(self, settings: Mapping[str, Any]) -> None:
        super().__init__(settings)
        self.name = short(self.tag)
        self._count = 0
        self._first = 0.0
        self._first_step = 0
        self._done = False
        self.active = False

    def update(self, step: int, value: float) -> Finding | None:
        """Feed the learning rate at ``step``."""
        if self._done:
            if self.active and value != self._first:
                self.active = False
            return None
        if self._count == 0:
            self._first = value
            self._first_step = step
        elif value != self._first:
            self._done = True
            return None
        self._count += 1
        if self._count < self.patience:
            return None
        self._done = True
        first = self._first
        if first <= 0.0:
            return None
        if self.warmup_steps is not None:
            why = f"although a {self.warmup_steps}-step warmup was configured"
        elif first <= self.tiny:
            why = "a tiny value, as left by a warmup whose step counter never advances"
        else:
            return None
        self.active = True
        message = (
            f"{self.name} stuck at its first value {fmt(first)} since step {self._first_step} "
            f"({self._count} collected steps), {why}; check that the optimizer's global_step "
            "advances and that the warmup schedule itself is passed to the optimizer "
            "(learning_rate=<LearningRateSchedule or per-step list>), not a number computed "
            "once"
        )
        return Finding(self._first_step, first, message)


class LrDecay(CardRule, kind="lr_decay"):
    """By step ``expect_by`` the lr is still within ``min_drop`` of its peak: the decay the
    user declared never started. Judged once, at the first collected step >= expect_by;
    ``since_step`` is the step the lr last changed (the start of its flat stretch)."""

    def __init__(self, settings: Mapping[str, Any]) -> None:
        super().__init__(settings)
        self.name = short(self.tag)
        self._peak = -1.0
        self._last: float | None = None
        self._changed = 0
        self._done = self.expect_by is None
        self.active = False

    def update(self, step: int, value: float) -> Finding | None:
        """Feed the learning rate at ``step``."""
        if self._done:
            if self.active and value < (1.0 - self.min_drop) * self._peak:
                self.active = False
            return None
        if value != self._last:
            self._last = value
            self._changed = step
        if value > self._peak:
            self._peak = value
        if step < self.expect_by:  # type: ignore[operator]  # None means _done from the start
            return None
        self._done = True
        if value < (1.0 - self.min_drop) * self._peak:
            return None
        self.active = True
        message = (
            f"{self.name} has not decayed by step {step}: {fmt(value)}, unchanged since step "
            f"{self._changed} (peak {fmt(self._peak)}; a decay of at least "
            f"{fmt(self.min_drop * 100)}% was expected by step {self.expect_by}); check the "
            "decay schedule (decay_steps, total_steps) and that the schedule object is what "
            "the optimizer receives"
        )
        return Finding(self._changed, value, message)
