"""Transformer signals (opt-in, ``track_metrics: [..., attention]``): each attention
module's largest attention logit and its attention entropy, every collected step, as
``attn/<module>/max_logit`` and ``attn/<module>/entropy``.

Why these two: in transformer training the attention logits (QK^T / sqrt(d), before the
softmax) can grow without bound when nothing bounds the query and key norms; the softmax
then saturates to one-hot rows (entropy collapses towards 0) and the loss diverges
steps later (Wortsman et al. 2023, "Small-scale proxies for large-scale Transformer
training instabilities"; Dehghani et al. 2023). Both move before the gradient norm does.

Found by structure (``collect.attnform``): every ``mindspore.nn.MultiheadAttention``
under the network (so every ``nn.TransformerEncoderLayer`` / ``DecoderLayer``, which hold
one), and each module ``attention_targets`` names whose logits are a projection of its
inputs (query/key ``nn.Dense`` sub-cells and a head count; the shape it must have, and
what is refused, are ``attnform``'s), and every module computing its own softmax(Q K^T
...) -- rotary, grouped key heads, masks built inside, MindFormers' ``LLamaAttention`` --
followed through the scores it feeds that softmax (``collect.attnsoftmax``, PyNative steps
only; a named module ``attnform`` refuses is followed so where it can be).
``module_targets`` does not restrict them: a model has few, and two series each.

How, without touching training: on a collected PyNative step a forward hook of ours sees
the module's own inputs (query, key, masks); it copies them and the module's query and
key projection weights to the host (they must be read at the forward pass: the
optimizer writes the weights in place before the step ends). When the step has ended,
the logits are recomputed from those copies in float64 numpy -- the module is never
called again, its Parameters only read. A step not collected runs no hook of ours.

``max_logit`` is the largest scaled logit among the positions the masks let through
(a masked position's logit is never attended to: a bool mask's True, an additive mask of
-inf or at most ``metrics.logits.CLOSED``, -10000); ``entropy`` is the mean, over batch,
heads and queries, of the entropy (nats) of the softmax rows the module computes
(additive float masks included). ``max_logit`` is signed: the largest logit, not the
largest magnitude, since a very negative logit only silences a key.

The max *output* logit needs nothing new: ``act/<the output layer>/max_abs``
(``collect.activations``) is the largest logit magnitude of the model's last layer.

Compiled steps (``@ms.jit``, GRAPH_MODE train cells, ``Model.train``) run no Python
hook: there the same arithmetic is compiled into the step's graph (``collect.attntaps``),
computed only while the collect flag is 1.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from typing import Any

import numpy as np

from msmon_nb.collect.attnform import Arg, AttentionForm, attention_forms, is_mha, mha_form
from msmon_nb.collect.attnsoftmax import (
    SoftmaxCapture,
    SoftmaxForm,
    is_softmax_form,
    score_signals,
    softmax_form_within,
    softmax_modules,
)
from msmon_nb.collect.tensors import to_numpy
from msmon_nb.metrics.logits import logit_signals

ATTN_STATS = ("max_logit", "entropy")


def is_attention(cell: Any) -> bool:
    """Whether ``cell`` is an attention module msmon finds by itself (its class)."""
    return is_mha(cell)


def attention_modules(
    paths: list[tuple[str, Any]], targets: list[str] | None = None
) -> tuple[list[tuple[str, Any, Any]], list[str]]:
    """The attention modules among ``[(path, cell)]`` (``activations.module_paths``):
    every ``nn.MultiheadAttention`` and each module ``attention_targets`` names, with
    their forms (``attnform.attention_forms``), and every module computing its own
    softmax(Q K^T ...) (``attnsoftmax``: rotary, grouped heads, inner masks), with what
    did not fit. A named module ``attnform`` refuses is followed through its softmax
    when it (or the one cell under it that does) computes one."""
    found, problems = attention_forms(paths, targets, fallback=softmax_form_within)
    taken = {id(c) for _, c, _ in found}
    taken |= {id(f.owner) for _, _, f in found if is_softmax_form(f)}
    for path, cell, form in softmax_modules(paths):
        if id(cell) not in taken:
            taken.add(id(cell))
            found.append((path, cell, form))
    order = {id(c): i for i, (_, c) in enumerate(paths)}
    found.sort(key=lambda item: order.get(id(item[1]), len(order)))
    return found, problems


def _arg(args: tuple, kwargs: dict, where: Arg | None) -> Any:
    """A ``construct`` argument given by position or by name; None when absent."""
    if where is None:
        return None
    index, name = where
    if name in kwargs:
        return kwargs[name]
    return args[index] if 0 <= index < len(args) else None


def _host(value: Any) -> np.ndarray | None:
    return None if value is None else np.array(to_numpy(value))


def _rows(value: np.ndarray | None, rows: tuple[int, int] | None) -> np.ndarray | None:
    if value is None or rows is None:
        return value
    return value[rows[0] : rows[1]]


class Snapshot:
    """What one forward call of an attention module computed its logits from: its
    inputs and its query/key weights, copied to the host (``form``: where they are;
    ``nn.MultiheadAttention``'s when not given)."""

    def __init__(
        self, cell: Any, args: tuple, kwargs: dict, form: AttentionForm | None = None
    ) -> None:
        form = form if form is not None else mha_form(cell)
        self.query = _host(_arg(args, kwargs, form.query))
        key = _arg(args, kwargs, form.key)
        self.key = self.query if key is None else _host(key)
        self.key_padding_mask = _host(_arg(args, kwargs, form.key_padding_mask))
        self.attn_mask = _host(_arg(args, kwargs, form.attn_mask))
        self.mask_3d_per_head = form.mask_3d_per_head
        self.w_q = _rows(_host(form.w_q), form.q_rows)
        self.w_k = _rows(_host(form.w_k), form.k_rows)
        self.b_q = _rows(_host(form.b_q), form.b_q_rows)
        self.b_k = _rows(_host(form.b_k), form.b_k_rows)
        self.bias_k = _host(form.bias_k)
        self.zero_attn = form.zero_attn
        self.heads = form.heads
        self.batch_first = form.batch_first


def signals(snap: Snapshot) -> dict[str, float]:
    """``{max_logit, entropy}`` of one forward call, in float64 (see the module doc)."""
    query = snap.query.astype(np.float64)
    key = snap.key.astype(np.float64)
    batched = query.ndim == 3
    if not batched:  # (L, E) -> (1, L, E)
        query, key = query[None], key[None]
    elif not snap.batch_first:  # (L, N, E) -> (N, L, E)
        query, key = query.swapaxes(0, 1), key.swapaxes(0, 1)
    q = query @ snap.w_q.astype(np.float64).T
    k = key @ snap.w_k.astype(np.float64).T
    if snap.b_q is not None:
        q = q + snap.b_q.astype(np.float64)
        k = k + snap.b_k.astype(np.float64)
    batch, length, embed = q.shape
    extra = 0
    if snap.bias_k is not None:  # a learned key row appended to every sequence
        row = np.broadcast_to(snap.bias_k.reshape(1, 1, -1), (batch, 1, embed))
        k = np.concatenate([k, row], 1)
        extra += 1
    heads = snap.heads
    dim = embed // heads
    q = q.reshape(batch, length, heads, dim).transpose(0, 2, 1, 3)
    k = k.reshape(batch, k.shape[1], heads, dim).transpose(0, 2, 1, 3)
    if snap.zero_attn:  # a zero key appended after the projection
        k = np.concatenate([k, np.zeros((batch, heads, 1, dim))], 2)
        extra += 1
    logits = (q @ k.swapaxes(-1, -2)) / math.sqrt(dim)  # (N, H, L, S)
    mask = _additive_mask(snap, batch, heads, length, logits.shape[-1], extra, batched)
    return logit_signals(logits, mask)


def _as_additive(mask: np.ndarray) -> np.ndarray:
    """A bool mask (True: not attended) as -inf/0; a float mask as it is added."""
    if mask.dtype == np.bool_ or mask.dtype == np.uint8:
        return np.where(mask.astype(np.bool_), -np.inf, 0.0)
    return mask.astype(np.float64)


def _additive_mask(
    snap: Snapshot, batch: int, heads: int, length: int, src: int, extra: int, batched: bool
) -> np.ndarray:
    """The masks the module adds to its logits, as one (N, H, L, S) float64 array."""
    out = np.zeros((batch, heads, length, src))
    if snap.attn_mask is not None:
        mask = _as_additive(snap.attn_mask)
        if extra:
            mask = np.concatenate([mask, np.zeros((*mask.shape[:-1], extra))], -1)
        if mask.ndim == 3 and snap.mask_3d_per_head:  # (N * H, L, S)
            mask = mask.reshape(batch, heads, length, src)
        out = out + mask  # (L, S) for every head, or broadcast from 4-D
    if snap.key_padding_mask is not None:
        pad = _as_additive(snap.key_padding_mask)
        if not batched:
            pad = pad[None]
        if extra:
            pad = np.concatenate([pad, np.zeros((batch, extra))], -1)
        out = out + pad[:, None, None, :]
    return out


class AttentionHooks:
    """The forward hooks of one collected step on the attention modules, and what they
    kept (one snapshot per module: its first call in the step)."""

    def __init__(self) -> None:
        self.kept: dict[str, Snapshot | np.ndarray] = {}  # tag prefix -> snapshot / scores
        self.missed: list[str] = []  # softmax captures a collected step never called
        self.called = 0  # softmax captures a collected step called

    def hook(
        self, prefix: str, form: AttentionForm, count: Callable[[], None]
    ) -> Callable[..., None]:
        """A forward hook (``with_kwargs=True``) keeping ``prefix``'s snapshot."""
        kept = self.kept

        def attention_hook(cell, args, kwargs, output):
            count()
            if prefix not in kept:
                kept[prefix] = Snapshot(cell, args, kwargs, form)

        return attention_hook

    def capture(self, prefix: str, form: SoftmaxForm, count: Callable[[], None]) -> SoftmaxCapture:
        """Shadow ``form``'s softmax for this step (``attnsoftmax.SoftmaxCapture``),
        keeping ``prefix``'s scores; the handle's ``remove()`` puts the module back and
        counts it in ``called`` or notes it in ``missed`` (its softmax not called)."""
        kept = self.kept

        def keep(scores: np.ndarray) -> None:
            kept.setdefault(prefix, scores)

        def done(called: bool) -> None:
            if called:
                self.called += 1
            else:
                self.missed.append(prefix)

        return SoftmaxCapture(form, keep, count, done)

    def take(self) -> dict[str, float]:
        """``{attn/<module>/<stat>: value}`` of the step's snapshots; they go."""
        out: dict[str, float] = {}
        for prefix, snap in self.kept.items():
            values = score_signals(snap) if isinstance(snap, np.ndarray) else signals(snap)
            for stat, value in values.items():
                out[f"{prefix}/{stat}"] = value
        self.kept.clear()
        return out
