"""``collect.torchattn``'s arithmetic, without MindNLP: what a captured
``scaled_dot_product_attention`` call or eager softmax input gives as ``max_logit`` and
``entropy``, against a per-row loop written here from torch's definitions (a bool mask's
True takes part, ``is_causal`` is the top-left lower triangle, fewer key heads are repeated
to the query's, the scale defaults to 1/sqrt(head_dim)). The MindNLP models themselves:
``tests/mindnlp/test_inside.py``."""

import math

import numpy as np

from msmon_nb.collect.torchattn import Logits, SdpaCall, signals

B, H, KV, L, S, D = 2, 4, 2, 5, 5, 8


def loop(q, k, allowed, scale):
    """``{max_logit, entropy}`` row by row: ``allowed[b, h, i, j]`` says key j is attended."""
    top, entropies = -math.inf, []
    for b in range(q.shape[0]):
        for h in range(q.shape[1]):
            kv = h // (q.shape[1] // k.shape[1])
            for i in range(q.shape[2]):
                keys = [j for j in range(k.shape[2]) if allowed[b, h, i, j]]
                row = np.array([float(q[b, h, i] @ k[b, kv, j]) * scale for j in keys])
                top = max(top, float(row.max()))
                p = np.exp(row - row.max())
                p /= p.sum()
                entropies.append(float(-(p * np.log(p)).sum()))
    return top, float(np.mean(entropies))


def test_sdpa_bool_mask_causal_and_grouped_heads():
    rng = np.random.default_rng(0)
    q = rng.normal(size=(B, H, L, D)).astype(np.float32)
    k = rng.normal(size=(B, KV, S, D)).astype(np.float32)
    keep = np.ones((B, 1, L, S), bool)
    keep[1, :, :, 3:] = False  # the second sequence's last two keys are padding
    keep[:, :, :, 0] = True
    got = signals(SdpaCall(q, k, keep, causal=False, scale=None))
    want = loop(q.astype(np.float64), k.astype(np.float64), np.broadcast_to(keep, (B, H, L, S)),
                1 / math.sqrt(D))  # fmt: skip
    assert math.isclose(got["max_logit"], want[0], rel_tol=1e-12)
    assert math.isclose(got["entropy"], want[1], rel_tol=1e-12)

    causal = signals(SdpaCall(q, k, None, causal=True, scale=0.5))
    tril = np.broadcast_to(np.tril(np.ones((L, S), bool)), (B, H, L, S))
    want = loop(q.astype(np.float64), k.astype(np.float64), tril, 0.5)
    assert math.isclose(causal["max_logit"], want[0], rel_tol=1e-12)
    assert math.isclose(causal["entropy"], want[1], rel_tol=1e-12)


def test_sdpa_float_mask_of_the_dtype_minimum_masks():
    rng = np.random.default_rng(1)
    q = rng.normal(size=(B, H, L, D)).astype(np.float32)
    k = rng.normal(size=(B, H, S, D)).astype(np.float32) * 3
    additive = np.zeros((B, 1, 1, S), np.float32)
    additive[0, ..., -1] = np.finfo(np.float32).min
    got = signals(SdpaCall(q, k, additive, causal=False, scale=None))
    allowed = np.broadcast_to(additive > -1e4, (B, H, L, S))
    want = loop(q.astype(np.float64), k.astype(np.float64), allowed, 1 / math.sqrt(D))
    assert math.isclose(got["max_logit"], want[0], rel_tol=1e-12)
    assert math.isclose(got["entropy"], want[1], rel_tol=1e-12)


def test_eager_input_has_its_mask_added_already():
    rng = np.random.default_rng(2)
    logits = rng.normal(size=(B, H, L, S)) * 4
    allowed = np.ones((B, H, L, S), bool)
    allowed[..., 2] = False
    shown = np.where(allowed, logits, logits + np.finfo(np.float32).min).astype(np.float32)
    got = signals(Logits(shown))
    open_rows = np.where(allowed, shown.astype(np.float64), -np.inf)
    p = np.exp(open_rows - open_rows.max(-1, keepdims=True))
    p /= p.sum(-1, keepdims=True)
    entropy = float(np.mean(-np.where(p > 0, p * np.log(np.where(p > 0, p, 1)), 0).sum(-1)))
    assert got["max_logit"] == float(shown.astype(np.float64)[allowed].max())
    assert math.isclose(got["entropy"], entropy, rel_tol=1e-12)


def test_a_nan_is_reported_not_skipped():
    logits = np.zeros((1, 1, 2, 2), np.float32)
    logits[0, 0, 1, 1] = np.nan
    assert math.isnan(signals(Logits(logits))["max_logit"])
