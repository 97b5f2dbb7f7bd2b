"""The two attention signals of one call's logits: the largest logit the masks let
through (``max_logit``) and the mean entropy of its softmax rows (``entropy``), in float64.

One definition for every way the logits reach us: recomputed from a module's inputs and
weights with its mask apart (``collect.attention``: ``nn.MultiheadAttention`` and named
modules), the rotated query and key of an sdpa call with its mask apart
(``collect.torchattn``), or the very input a module feeds its softmax, masks already added
(``collect.attnsoftmax``, ``collect.torchattn``'s eager path).

A position is masked where its additive mask is at or below ``CLOSED`` (-10000: -inf,
BERT's -10000 and the float-min masks of HF-style models alike; exp(-10000) is 0 in any
float type). Where the mask is already added, a score at or below ``ADDED_CLOSED`` (-5000)
is masked: a masked position lands within a logit's size of -10000 or below, an open one
keeps its logit exactly, so the cut half way gives the same answer while logits stay under
5000 in magnitude. ``max_logit`` is signed (a very negative logit only silences a key) and
NaN when a logit is NaN or no position is open; the entropy is in nats, of the rows the
module's softmax computes (every additive mask included).
"""

from __future__ import annotations

import math

import numpy as np

CLOSED = -1e4
ADDED_CLOSED = -5e3


def logit_signals(logits: np.ndarray, mask: np.ndarray | None = None) -> dict[str, float]:
    """``{max_logit, entropy}`` of float64 ``logits`` (last axis: the keys) under the
    additive ``mask`` (broadcastable to them; None: the mask is already added, as in a
    softmax's input)."""
    if mask is None:
        shown, open_ = logits, logits > ADDED_CLOSED
    else:
        shown = logits + mask
        open_ = np.broadcast_to(mask > CLOSED, shown.shape)
    # like max_abs, a NaN is reported, never skipped
    bad = bool(np.isnan(logits).any()) or not bool(open_.any())
    top = math.nan if bad else float(np.max(np.broadcast_to(logits, shown.shape)[open_]))
    # a row's entropy is log Z - sum(e * x) / Z over its shifted logits x (e = exp x, Z =
    # sum e): one exp, no log per logit (a softmax input can be heads x L x S of them)
    with np.errstate(invalid="ignore", divide="ignore"):
        shifted = shown - np.max(shown, axis=-1, keepdims=True)
        weights = np.exp(shifted)
        total = weights.sum(axis=-1)
        spent = np.where(weights > 0, weights * shifted, 0.0).sum(axis=-1)
        entropy = float(np.mean(np.log(total) - spent / total))
    return {"max_logit": top, "entropy": entropy}
