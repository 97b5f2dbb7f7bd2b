"""What a mixture-of-experts router decided on one step, from its logits alone.

``router_entropy``: the mean over tokens of the entropy (nats) of the router's softmax
over experts; ``log(E)`` is indifference, 0 a router that has collapsed onto one expert
per token. ``tokens_per_expert_max_frac``: the share of the step's ``k``-expert choices
(top-k of those probabilities, the order MindFormers' routers pick them in) that went to
the busiest expert; ``1/E`` is perfect balance, and its ceiling is ``1/k`` (every token
sends one of its k choices to that expert). Each expert's share is also returned, for a
series per expert.

Before any capacity limit drops tokens: the router's own choice, which is what load
balancing losses act on.
"""

from __future__ import annotations

import numpy as np


def router_stats(logits: np.ndarray, k: int) -> tuple[dict[str, float], np.ndarray]:
    """``({router_entropy, tokens_per_expert_max_frac}, each expert's share)`` of
    ``logits`` (``(..., E)``, one row per token), ``k`` experts chosen per token."""
    x = np.asarray(logits, dtype=np.float64).reshape(-1, np.shape(logits)[-1])
    experts = x.shape[1]
    if x.shape[0] == 0 or not np.isfinite(x).all():
        nan = float("nan")
        return {"router_entropy": nan, "tokens_per_expert_max_frac": nan}, np.full(experts, nan)
    shifted = x - x.max(axis=1, keepdims=True)
    p = np.exp(shifted)
    p /= p.sum(axis=1, keepdims=True)
    with np.errstate(divide="ignore", invalid="ignore"):
        terms = np.where(p > 0, p * np.log(p), 0.0)
    entropy = float(np.mean(-terms.sum(axis=1)))
    k = max(1, min(int(k), experts))
    # stable sort on -p: ties go to the lower index, as argmax does
    chosen = np.argsort(-p, axis=1, kind="stable")[:, :k]
    counts = np.bincount(chosen.reshape(-1), minlength=experts).astype(np.float64)
    share = counts / counts.sum()
    return {"router_entropy": entropy, "tokens_per_expert_max_frac": float(share.max())}, share
