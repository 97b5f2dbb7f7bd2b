"""Optimizer-state rules: Adam's second moment no longer tracking the squared gradient.

Adam divides each update by sqrt(v), v an exponential average of g^2 with a long memory
(1 / (1 - beta2) steps: 1000 at MindSpore's default 0.999, 20-100 in LLM recipes). After
a long quiet-gradient stretch v has decayed to the quiet level; when normal gradients
come back, v needs many steps to catch up, and meanwhile the update g / sqrt(v) is
several times its usual size: the loss spikes some steps later (arXiv 2506.04805,
"Adaptive Preconditioners Trigger Loss Spikes in Adam"). The same holds whenever g^2
jumps far above what v has seen, whatever the reason.

What the monitor records is enough to see it coming: the global gradient norm G and the
L2 norm of each parameter's v (``param/<name>/moment2_norm``, ``optimizer_state`` in
``track_metrics``). Their ratio rho = G^2 / ||v|| (||v|| over every tracked parameter)
is scale-free: when gradients grow or shrink slowly, v follows and rho stays at its own
level (which depends on the model, the batch noise and beta2, hence the comparison with
the series' own running median). When v lags g^2, rho jumps by up to 1 / (1 - beta2) --
at the step the gradient comes back, before the enlarged updates have moved the
weights far enough to show in the loss.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from typing import Any

from msmon_nb.diagnose.alert import fmt, fmt_ratio
from msmon_nb.diagnose.base import CardRule, EpisodeRule, Finding, Rise, short
from msmon_nb.diagnose.converge import Convergence
from msmon_nb.diagnose.window import RollingWindow

MOMENT2_SUFFIX = "/moment2_norm"
MOMENT_PREFIX = "param/"

_HINT = (
    "Adam's second moment v no longer tracks g^2 (it decayed during a quiet stretch, or "
    "lags a sudden rise), so the update g/sqrt(v) is far larger than usual until v catches "
    "up, and a loss spike often follows (arXiv 2506.04805): lower the learning rate for the "
    "next 1/(1 - beta2) steps, clip the update or the gradient, or use a smaller beta2 so v "
    "follows faster"
)


def is_moment2_tag(tag: str) -> bool:
    """``param/<name>/moment2_norm``: the L2 norm of one parameter's Adam v."""
    return tag.endswith(MOMENT2_SUFFIX) and tag.startswith(MOMENT_PREFIX)


class AdamVStale(CardRule, EpisodeRule, kind="adam_v_stale"):
    """rho = grad_norm^2 / ||v|| at least ``factor`` x its running median (and ``z``
    robust sigmas above it, in log10) for ``patience`` collected steps in a row.

    ``||v||`` is the L2 norm of Adam's second moment over every tracked parameter,
    sqrt(sum of ``moment2_norm``^2), read after the step's update (so it already holds
    the step's own g^2 x (1 - beta2)). The reference is the median of the last
    ``window`` values of log10(rho) before the current one, the spread 1.4826 x their
    MAD; a value is only judged once ``min_history`` are in the window. ``patience``
    is 1 by default: the spike follows within a few steps, so waiting costs the lead.
    ``since_step`` is the first step of the unbroken run of values more than
    max(2x, 3 sigma) over the median that ends in the alert (exact for a sudden return
    of the gradient). It clears after ``QUIET`` steps back in that band.

    An outlier batch makes rho jump too (g^2 far above v): then ``loss_spike`` or
    ``grad_explosion`` usually fires at the same step, and this alert adds why the next
    updates are large.

    No episode starts while the run has converged (``convergence``, set by the engine):
    there the gradients are tiny and noisy, rho swings with them, and the bench's converged
    Adam runs never blew up after such a swing.
    """

    def __init__(self, settings: Mapping[str, Any]) -> None:
        super().__init__(settings)
        self.name = short(self.grad_tag)
        self.log_factor = math.log10(self.factor)
        self.min_history = min(self.min_history, self.window)
        self.win = RollingWindow(self.window)
        self.rise = Rise()
        # set by the engine: once the run has converged, tiny gradients make rho noisy
        # without any update being large against the weights (None: not consulted)
        self.convergence: Convergence | None = None

    def update(self, step: int, grad_norm: float, v_norm: float) -> Finding | None:
        """Feed one collected step's global grad_norm and the L2 norm of Adam's v."""
        if not (grad_norm > 0.0 and v_norm > 0.0) or math.isinf(grad_norm + v_norm):
            return None
        x = math.log10(grad_norm * grad_norm / v_norm)
        win = self.win
        n = len(win)
        median = win.median() if n else 0.0
        win.add(x)
        history = n >= self.min_history
        d = x - median if history else 0.0
        rise = self.rise
        hot = rise.see(step, d if history else None, win.sigma, self.log_factor, self.z)
        if self.active:
            self.episode.settle(calm=not hot)
            return None
        if rise.over < self.patience:
            return None
        conv = self.convergence
        if conv is not None and conv.converged:
            return None  # a converged run's tiny gradients swing rho; no episode starts
        self.episode.start()
        since = rise.began(step)
        ratio = 10.0**d
        message = (
            f"Adam's v is stale since step {since}: {self.name}^2 / ||v|| is "
            f"{fmt_ratio(ratio)} its running median ({self.name} {fmt(grad_norm)}, "
            f"||v|| {fmt(v_norm)}), so the next updates are about {fmt_ratio(math.sqrt(ratio))} "
            f"their usual size; {_HINT}"
        )
        return Finding(since, ratio, message)
