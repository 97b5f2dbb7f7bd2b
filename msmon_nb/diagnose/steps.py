"""Rules over the stream of steps rather than one series' values: NaN/Inf, steps that
go backwards, and a tracked metric that never shows up."""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import Any

from msmon_nb.config.checks import optimizer_series
from msmon_nb.diagnose.alert import fmt
from msmon_nb.diagnose.base import QUIET, CardRule, Finding, Streak, short

_NAN_HINTS = {
    "loss": (
        "look for log(0), division by zero or sqrt of a negative in the loss (add an epsilon "
        "or clamp), lower the learning rate, or clip gradients"
    ),
    "grad_norm": (
        "gradients overflowed: lower the learning rate, clip gradients "
        "(ops.clip_by_global_norm), or in mixed precision use dynamic loss scaling "
        "(DynamicLossScaleUpdateCell)"
    ),
}


class NonFinite(CardRule, kind="nonfinite"):
    """The first NaN or Inf of a series (``patience`` in a row; 1 by default).

    Mixed-precision training with dynamic loss scaling skips an overflowing step now and
    then on purpose; there, set ``patience`` to a few steps. ``since_step`` is the first
    non-finite step (exact); fed every value of its tag, finite ones included. A run
    that flaps between Inf and finite values is one episode until ``QUIET`` finite
    steps in a row.
    """

    def __init__(self, settings: Mapping[str, Any], tag: str) -> None:
        """One rule per tag of the card's ``tags``: ``tag`` is the one it watches."""
        super().__init__(settings)
        self.name = short(tag)
        self._hint = _NAN_HINTS.get(
            tag.rsplit("/", 1)[-1], "find the first operation that produces it"
        )
        self._streak = Streak(self.patience)
        self._last: float | None = None
        self._last_step = 0

    @property
    def active(self) -> bool:
        """True while the episode lasts."""
        return self._streak.active

    def update(self, step: int, value: float) -> Finding | None:
        """Feed any value (finite or not) of the series at ``step``."""
        streak = self._streak
        if value - value == 0.0:  # finite: NaN - NaN and Inf - Inf are NaN
            self._last = value
            self._last_step = step
            streak.miss()
            return None
        if not streak.hit(step):
            return None
        word = "NaN" if value != value else ("Inf" if value > 0 else "-Inf")
        before = (
            f"last finite {fmt(self._last)} at step {self._last_step}"
            if self._last is not None
            else "no finite value before it"
        )
        message = (
            f"{self.name} is {word} since step {streak.since} (first non-finite value; {before}); "
            f"{self._hint}"
        )
        return Finding(streak.since, value, message)


class StepOrder(CardRule, kind="step_order"):
    """Within one series the step must increase; a step <= the previous one means two
    runs write into one place or a restart re-used step numbers.

    Reported once per tag; it clears after ``QUIET`` increasing steps beyond the highest
    step seen before the jump, so two interleaved writers (which never get there) are
    reported once, and a restart that catches up is forgotten. ``since_step`` is the
    offending step (exact).
    """

    def __init__(self, settings: Mapping[str, Any]) -> None:
        super().__init__(settings)
        # tag -> [last step, max step, active, quiet streak, max step at the alert]
        self._state: dict[str, list] = {}

    def update(self, step: int, tags: Iterable[str]) -> list[tuple[str, Finding]]:
        """Feed the tags recorded at ``step``; (tag, finding) pairs for new problems."""
        out: list[tuple[str, Finding]] = []
        state = self._state
        for tag in tags:
            st = state.get(tag)
            if st is None:
                state[tag] = [step, step, False, 0, 0]
                continue
            prev = st[0]
            st[0] = step
            if step > prev:
                if step > st[1]:
                    st[1] = step
                if st[2] and step > st[4]:
                    st[3] += 1
                    if st[3] >= QUIET:
                        st[2] = False
                continue
            st[3] = 0
            if st[2]:
                continue
            st[2] = True
            st[4] = st[1]
            how = f"repeated step {step}" if step == prev else f"went back to step {step}"
            message = (
                f"{tag} {how} after step {prev} (highest so far {st[1]}): two runs may be "
                "writing into one run dir, or a restart re-used step numbers; give each run "
                "its own run_name, or resume with the step it stopped at"
            )
            out.append((tag, Finding(step, None, message)))
        return out

    def is_active(self, tag: str) -> bool:
        """True while the backwards jump of ``tag`` is still being reported."""
        st = self._state.get(tag)
        return bool(st and st[2])


# tags whose presence shows a tracked metric is observed though not recorded under its
# own tag: grad_norm of a step whose loss scale overflowed, or of a loop that clips each
# micro-batch before accumulating (collect.gradsource says why, once)
_STANDS_IN = {"train/grad_norm": ("train/micro_grad_norm", "train/overflow")}


def _seen(tag: str, values: Mapping[str, float]) -> bool:
    alts = (tag, *_STANDS_IN.get(tag, ()))
    if any(alt in values for alt in alts):
        return True
    if not tag.startswith("train/"):
        return False
    # two or more optimizers stepping in one iteration record no whole-step train/<m>:
    # each one's opt/<name>/<m> stands for it
    metrics = {alt[6:] for alt in alts}
    return any((found := optimizer_series(t)) is not None and found[1] in metrics for t in values)


class MetricMissing(CardRule, kind="metric_missing"):
    """A tag listed in ``track_metrics`` that has not appeared after ``patience``
    collected steps: its chart would show a flat line that looks like data.

    Collected steps are counted as distinct step numbers passed to the engine; each tag
    is reported once and stays active until it first appears; ``since_step`` is the
    first collected step (the metric has been missing from the start).
    """

    def __init__(self, settings: Mapping[str, Any], tags: Iterable[str]) -> None:
        """``tags``: the tracked tags (``track_metrics`` entries with a group)."""
        super().__init__(settings)
        self.pending = list(dict.fromkeys(tags))
        self.reported: list[str] = []
        self._collected = 0
        self._first: int | None = None
        self._last_step: int | None = None

    def update(self, step: int, values: Mapping[str, float]) -> list[tuple[str, Finding]]:
        """Feed the tags recorded at ``step``; (tag, finding) for metrics still missing."""
        if step != self._last_step:
            self._last_step = step
            self._collected += 1
            if self._first is None:
                self._first = step
        if self.reported and any(_seen(tag, values) for tag in self.reported):
            self.reported = [t for t in self.reported if not _seen(t, values)]
        pending = self.pending
        if any(_seen(tag, values) for tag in pending):
            self.pending = pending = [t for t in pending if not _seen(t, values)]
        if not pending or self._collected < self.patience:
            return []
        first = self._first if self._first is not None else step
        out = []
        for tag in pending:
            message = (
                f"'{tag}' is in track_metrics but has not been recorded in {self._collected} "
                f"collected steps (steps {first}-{step}): its chart would be an empty flat "
                f"line; record it with mon.log({{'{tag}': value}}) (or mon.step(...)), or "
                "remove it from track_metrics"
            )
            out.append((tag, Finding(first, None, message)))
        self.reported += pending
        self.pending = []
        return out

    def is_active(self, tag: str) -> bool:
        """True from the report until the tag first appears."""
        return tag in self.reported
