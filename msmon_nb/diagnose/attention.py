"""Attention-logit growth (``attention_logit_growth``): one attention module's largest
logit rising past its own history at a steady multiplicative rate, named with the step
its growth began.

Why: without QK layernorm, the query and key weights of a transformer can grow until the
attention logits (QK^T / sqrt(d)) reach the hundreds, the softmax turns one-hot and the
loss diverges (Wortsman et al. 2023); the logits show it while the loss and the global
gradient norm are still flat. The monitor records them as ``attn/<module>/max_logit``
(``collect.attention``). A healthy model's logits also rise while it learns to attend,
but slowly and to a bounded size; the rule asks for growth that is both fast (by
``factor`` over the last ``window`` collected steps, fitted in log10 so noise must line
up for many steps) and significant (the fitted slope ``t`` standard errors above 0),
past the module's own earlier peak, and above ``min_logit`` (a softmax over logits of a
few units is far from one-hot: nothing to warn about yet), for ``patience`` steps in a
row.

Each module is judged on its own history (modules differ by decades). The alert names
the module whose growth began first among those over, its onset (``trend.hinge_onset``
over the module's recent log values: the change point of a flat-then-rising fit), and
the others growing with it. O(1) per module and step (``trend.SlidingSlope``); the
onset fit runs only when an alert is raised.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from typing import Any

from msmon_nb.diagnose.alert import fmt
from msmon_nb.diagnose.base import CardRule, EpisodeRule, Finding
from msmon_nb.diagnose.blame import Blamed
from msmon_nb.diagnose.trend import LogGrowth, hinge_onset

PREFIX, SUFFIX = "attn/", "/max_logit"
HISTORY = 4  # windows of each module's log values kept for the onset fit


def is_max_logit(tag: str) -> bool:
    """Whether ``tag`` is an attention module's max logit (``attn/<module>/max_logit``)."""
    return tag.startswith(PREFIX) and tag.endswith(SUFFIX)


def module_of(tag: str) -> str:
    """``attn/<module>/max_logit`` -> ``<module>``."""
    return tag[len(PREFIX) : -len(SUFFIX)]


class AttentionGrowth(CardRule, EpisodeRule, kind="attention_logit_growth"):
    """The rule (module docstring): ``update(step, tag, value)`` per module's max logit
    at a collected step; ``named`` lists the modules of the last finding."""

    def __init__(self, settings: Mapping[str, Any]) -> None:
        super().__init__(settings)
        self.log_factor = math.log10(self.factor)
        self.modules: dict[str, LogGrowth] = {}
        # the modules of the last finding, the first to grow first: name (the module
        # path), z (the slope's t), step (its onset), norm (its max logit), usual (its
        # earlier peak)
        self.named: list[Blamed] = []
        self._step: int | None = None
        self._hot = False  # some module over at the step being fed

    def update(self, step: int, tag: str, value: float) -> Finding | None:
        """One module's max logit at ``step`` (finite; the engine keeps NaN away)."""
        if step != self._step:
            if self._step is not None:
                self.episode.settle(calm=not self._hot)
            self._step, self._hot = step, False
        mod = self.modules.get(tag)
        if mod is None:
            mod = self.modules[tag] = LogGrowth(self.window, HISTORY)
        y = math.log10(value) if value > 0 else math.log10(1e-6)
        mod.add(step, y)
        if mod.n < self.min_history:
            return None
        over = (
            mod.rise > self.log_factor
            and mod.t > self.t
            and value > self.min_logit
            and y > mod.peak + self.log_factor
        )
        mod.count = mod.count + 1 if over else 0
        if not over:
            return None
        self._hot = True
        if mod.count < self.patience or self.active:
            return None
        self.episode.start()
        self.named = sorted(
            (_blamed(name, m) for name, m in self.modules.items() if m.count > 0),
            key=lambda b: (b.step, -b.z),
        )
        first, since = self.named[0].name, self.named[0].step
        growth = mod.per_step()
        others = [b.name for b in self.named[1:3]]
        also = f" (also {', '.join(others)})" if others else ""
        message = (
            f"attention logits of {first} growing since step {since}: max logit "
            f"{fmt(value)}, x{growth:.3g} per collected step over the last "
            f"{len(mod.slope)}{also}; without QK normalisation such growth precedes loss "
            "divergence: lower the lr of the query/key projections, add QK layernorm, or "
            "clip the logits"
        )
        return Finding(since, value, message)


def _blamed(tag: str, mod: LogGrowth) -> Blamed:
    """A growing module as a blame entry (``AttentionGrowth.named``)."""
    since = hinge_onset(list(mod.steps), list(mod.recent))
    usual = 10**mod.peak if math.isfinite(mod.peak) else 10 ** mod.recent[0]
    return Blamed(module_of(tag), mod.t, since, 10 ** mod.recent[-1], usual)
