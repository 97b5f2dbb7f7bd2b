"""What every rule shares: the ``Finding`` a rule returns and the conventions it follows.

A rule is a small object with ``update(step, value) -> Finding | None`` and an
``active`` flag. It sees one tag's finite values in arrival order (the engine keeps NaN
and Inf away from every rule but ``nonfinite``), keeps O(1)-sized state, touches no
clock, file or global, and returns a ``Finding`` only when an anomaly *starts*; while
``active`` is set it stays quiet, and it clears ``active`` by its own hysteresis (for
most rules: ``QUIET`` normal steps in a row) so a value hovering at a threshold, or a
run flapping between Inf and finite values, is one report, not many.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping
from typing import Any, ClassVar, NamedTuple, Protocol

from msmon_nb.config.cards import Card, card
from msmon_nb.config.checks import optimizer_series
from msmon_nb.diagnose.window import Levels

LOG2 = math.log10(2.0)  # values within 2x of the running median are never "out of band"
TINY = 1e-12  # keeps thresholds above a perfectly constant series
# An anomaly clears after this many collected steps in a row without it: a diverging
# loss alternates Inf and finite values, an exploding grad_norm dips back into its band
# now and then, and each of those is one episode, not many.
QUIET = 10


class Finding(NamedTuple):
    """A rule's raw result; the engine turns it into an ``Alert``."""

    since_step: int
    value: float | None
    message: str


class Episode:
    """An anomaly reported once while it lasts: ``start()`` when it is reported, then
    ``settle(calm)`` at each later step; ``QUIET`` calm steps in a row end it."""

    __slots__ = ("_calm", "active")

    def __init__(self) -> None:
        self._calm = 0
        self.active = False

    def start(self) -> None:
        """The anomaly was just reported."""
        self.active = True
        self._calm = 0

    def settle(self, calm: bool) -> None:
        """One more step, normal (``calm``) or not."""
        self._calm = self._calm + 1 if calm else 0
        if self._calm >= QUIET:
            self.active = False


class Rise:
    """A log value rising far above its running median, robustly: where the rise began
    (``since``) and for how many collected steps in a row it has exceeded (``over``).

    ``see(step, d, sigma, log_factor, z)`` takes ``d``, the value's log10 distance above
    the median (None before there is history), and ``sigma``, the window's MAD-sigma,
    asked only when ``d`` is past ``LOG2`` (the MAD costs a pass over the window). A
    step is *elevated* past 3 sigmas, and *exceeds* when it is also past ``log_factor``
    and ``z`` sigmas. ``also`` (grad_norm's absolute ceiling) counts as elevated. The
    rules whose alert is such a rise (grad explosion, Adam's stale v) keep one each."""

    __slots__ = ("over", "since")

    def __init__(self) -> None:
        self.over = 0
        self.since: int | None = None

    def see(
        self,
        step: int,
        d: float | None,
        sigma: Callable[[], float],
        log_factor: float,
        z: float,
        also: bool = False,
    ) -> bool:
        """Take one step; True when it is elevated (or ``also``)."""
        elevated = exceeds = False
        if d is not None and d > LOG2:
            spread = sigma()
            elevated = d > 3.0 * spread
            exceeds = elevated and d > log_factor and d > z * spread
        hot = elevated or also
        if not hot:
            self.since = None
        elif self.since is None:
            self.since = step
        self.over = self.over + 1 if exceeds else 0
        return hot

    def began(self, step: int) -> int:
        """The step the rise began (``step`` itself when it began there)."""
        return step if self.since is None else self.since


class EpisodeRule:
    """Base of the rules whose reports last an ``Episode``: ``active`` is the episode's."""

    __slots__ = ("episode",)

    def __init__(self) -> None:
        self.episode = Episode()

    @property
    def active(self) -> bool:
        """True while the reported anomaly lasts."""
        return self.episode.active


class Streak(EpisodeRule):
    """An episode of a condition: ``patience`` hits in a row start it (reported once),
    ``QUIET`` misses in a row end it. ``since`` is the first hit of the run of hits."""

    __slots__ = ("count", "patience", "since")

    def __init__(self, patience: int) -> None:
        super().__init__()
        self.patience = patience
        self.count = 0
        self.since = 0

    def miss(self) -> None:
        """The condition does not hold at this step."""
        self.count = 0
        if self.episode.active:
            self.episode.settle(calm=True)

    def hit(self, step: int) -> bool:
        """The condition holds at ``step``; True when this confirms a new episode."""
        self.episode.settle(calm=False)
        if self.count == 0:
            self.since = step
        self.count += 1
        if self.active or self.count < self.patience:
            return False
        self.episode.start()
        return True


# kind -> the rule class that declared it (``CardRule`` subclasses register themselves)
RULES: dict[str, type[CardRule]] = {}


class CardRule:
    """Base of every rule of an alert card: ``class LrZero(CardRule, kind="lr_zero")``.

    The class names its card once, by kind (``config.cards``), and registers itself in
    ``RULES``; ``__init__(settings)`` takes the kind's resolved settings and sets every
    parameter the card gives the rule as an attribute of the same name, so a parameter
    is written in its card and where the rule uses it, nowhere else. A subclass that
    keeps a derived value (``log10(factor)``) assigns it after ``super().__init__``.
    Companion tags the card names become ``self.companions`` (the engine feeds them to
    ``observe``). A card with a ``level`` gets ``self.levels``: the running level of its series,
    ``levels`` when the engine shares one between the rules of a tag, else its own.
    """

    __slots__ = ()
    kind: ClassVar[str]
    card: ClassVar[Card]

    def __init_subclass__(cls, kind: str | None = None, **kwargs: Any) -> None:
        super().__init_subclass__(**kwargs)
        if kind is not None:
            if kind in RULES:
                raise TypeError(f"{cls.__name__}: {kind!r} already has a rule ({RULES[kind]})")
            cls.kind = kind
            cls.card = card(kind)
            RULES[kind] = cls

    def __init__(self, settings: Mapping[str, Any], levels: Levels | None = None) -> None:
        for name in self.card.rule_params():
            setattr(self, name, settings[name])
        how = self.card.level
        if how is not None:
            self.levels = levels if levels is not None else Levels(settings["window"], **how)
        if self.card.companions:
            self.companions = tuple(settings[name] for name in self.card.companions)
        super().__init__()


class SeriesRule(Protocol):
    """The interface of the rules bound to one tag."""

    active: bool

    def update(self, step: int, value: float) -> Finding | None:
        """Feed the next value of the series; a ``Finding`` when an anomaly starts."""
        ...


def short(tag: str) -> str:
    """'train/grad_norm' -> 'grad_norm': messages name the quantity, not the group; an
    optimizer's own series by the optimizer too ('opt/netd/grad_norm' -> 'netd
    grad_norm'), so an alert says whose gradients exploded."""
    found = optimizer_series(tag)
    if found is not None:
        return f"{found[0]} {found[1]}"
    return tag.rsplit("/", 1)[-1]
