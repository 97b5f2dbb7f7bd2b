"""Attention signals inside compiled steps (``@ms.jit`` steps, GRAPH_MODE train cells,
``Model.train``): each attention module's max logit and entropy computed in the graph,
on collected steps only.

The way ``collect.acttaps`` taps activations: the module's class is swapped, around the
collected steps' graph call (a graph keyed apart; where none can be, for the watch's
lifetime, under the ``on`` flag), for a subclass whose ``construct`` runs the original
(a bound method, with the arguments it was given) and then recomputes the module's
logits from the same inputs and its own query/key weights -- the arithmetic of
``collect.attention.signals``, in graph syntax -- and assigns ``[max_logit, entropy,
serial]`` to a Parameter of ours. The output goes on unchanged (``ops.depend`` on a
scalar token); the inputs and weights enter the computation through ``stop_gradient``,
so the backward pass is the one the module had. A step that is not collected runs a
graph without any of it. Where the module appears (``attnform.AttentionForm``) is
decided on the host; each module gets its own class, its constants closed over.

Which weights: the ones the module's forward read, before the optimizer in the same
graph writes them (MindSpore orders a Parameter's reads before a later write in program
order; the tests compare with a float64 recomputation from the weights the step's
forward pass saw). Reduced in float64 on the CPU, float32 elsewhere
(``GraphActivations``' ``wide``).
"""

from __future__ import annotations

import math
from typing import Any

import mindspore as ms
from mindspore import Parameter, Tensor, ops

from msmon_nb.collect.attnform import AttentionForm
from msmon_nb.metrics.logits import CLOSED

_ONE = Tensor(1, ms.int32)
_ZERO = Tensor(0, ms.int32)
_BMM_T = ops.BatchMatMul(transpose_b=True)
_MAX_KEEP = ops.ReduceMax(keep_dims=True)
_SUM_KEEP = ops.ReduceSum(keep_dims=True)


def _arg(args, kwargs, index, name):
    """A ``construct`` argument by name or position; None when absent. Graph syntax:
    ``index`` and ``name`` are constants where it compiles."""
    if name in kwargs:
        return kwargs[name]
    if 0 <= index < len(args):
        return args[index]
    return None


def _project(x, w, b, rows, b_rows, wide):
    """``x @ w[rows].T + b[b_rows]`` over the last axis, in ``wide``; graph syntax."""
    w = ops.cast(ops.stop_gradient(w), wide)
    if rows is not None:
        w = w[rows[0] : rows[1]]
    shape = x.shape
    flat = ops.reshape(x, (-1, shape[-1]))
    y = ops.matmul(flat, ops.transpose(w, (1, 0)))
    if b is not None:
        b = ops.cast(ops.stop_gradient(b), wide)
        if b_rows is not None:
            b = b[b_rows[0] : b_rows[1]]
        y = y + b
    return ops.reshape(y, shape[:-1] + (w.shape[0],))  # noqa: RUF005 -- graph syntax


def _additive(mask, wide):
    """A bool/uint8 mask (True: not attended) as -inf/0; a float mask as it is added."""
    if mask.dtype == ms.bool_ or mask.dtype == ms.uint8:
        mask = ops.cast(mask, ms.bool_)
        zeros = ops.zeros(mask.shape, wide)
        return ops.select(mask, ops.full_like(zeros, float("-inf")), zeros)
    return ops.cast(ops.stop_gradient(mask), wide)


def _pad_keys(mask, extra, wide):
    """``mask`` with ``extra`` open key columns appended (MHA's bias_k / zero_attn)."""
    if extra == 0:
        return mask
    return ops.concat((mask, ops.zeros(mask.shape[:-1] + (extra,), wide)), -1)  # noqa: RUF005


def graph_signals(form: AttentionForm, wide: Any) -> Any:
    """A graph-syntax function ``(query, key, key_padding_mask, attn_mask) -> [max_logit,
    entropy]`` in ``wide`` for one module of ``form`` (``attention.signals``' arithmetic:
    the same layouts, appended keys and masks)."""
    heads, batch_first = form.heads, form.batch_first
    w_q, w_k, b_q, b_k = form.w_q, form.w_k, form.b_q, form.b_k
    q_rows, k_rows, b_q_rows, b_k_rows = form.q_rows, form.k_rows, form.b_q_rows, form.b_k_rows
    bias_k, zero_attn = form.bias_k, form.zero_attn
    has_bias_k = bias_k is not None
    per_head = form.mask_3d_per_head
    extra = int(has_bias_k) + int(zero_attn)

    def signals(query, key, key_padding_mask, attn_mask):
        query = ops.cast(ops.stop_gradient(query), wide)
        key = ops.cast(ops.stop_gradient(key), wide)
        batched = len(query.shape) == 3
        if not batched:  # (L, E) -> (1, L, E)
            query = ops.expand_dims(query, 0)
            key = ops.expand_dims(key, 0)
        elif not batch_first:  # (L, N, E) -> (N, L, E)
            query = ops.transpose(query, (1, 0, 2))
            key = ops.transpose(key, (1, 0, 2))
        q = _project(query, w_q, b_q, q_rows, b_q_rows, wide)
        k = _project(key, w_k, b_k, k_rows, b_k_rows, wide)
        batch, length, embed = q.shape
        if has_bias_k:  # a learned key row appended to every sequence
            row = ops.reshape(ops.cast(ops.stop_gradient(bias_k), wide), (1, 1, embed))
            k = ops.concat((k, ops.tile(row, (batch, 1, 1))), 1)
        dim = embed // heads
        q = ops.transpose(ops.reshape(q, (batch, length, heads, dim)), (0, 2, 1, 3))
        k = ops.transpose(ops.reshape(k, (batch, k.shape[1], heads, dim)), (0, 2, 1, 3))
        if zero_attn:  # a zero key appended after the projection
            k = ops.concat((k, ops.zeros((batch, heads, 1, dim), wide)), 2)
        logits = _BMM_T(q, k) / math.sqrt(dim)  # (N, H, L, S)
        src = logits.shape[-1]
        mask = ops.zeros_like(logits)
        if attn_mask is not None:
            extra_mask = _pad_keys(_additive(attn_mask, wide), extra, wide)
            if len(extra_mask.shape) == 3 and per_head:  # (N * H, L, S)
                extra_mask = ops.reshape(extra_mask, (batch, heads, length, src))
            mask = mask + extra_mask
        if key_padding_mask is not None:
            pad = _additive(key_padding_mask, wide)
            if not batched:
                pad = ops.expand_dims(pad, 0)
            pad = _pad_keys(pad, extra, wide)
            mask = mask + ops.reshape(pad, (batch, 1, 1, src))
        shown = logits + mask
        open_ = mask > CLOSED
        low = ops.full_like(logits, float("-inf"))
        top = ops.reduce_max(ops.select(open_, logits, low))
        # like max_abs, a NaN is reported, never skipped
        bad = ops.logical_or(ops.any(ops.isnan(logits)), ops.logical_not(ops.any(open_)))
        top = ops.select(bad, ops.full_like(top, float("nan")), top)
        weights = ops.exp(shown - _MAX_KEEP(shown, -1))
        weights = weights / _SUM_KEEP(weights, -1)
        terms = ops.select(weights > 0, weights * ops.log(weights), ops.zeros_like(weights))
        entropy = ops.reduce_mean(-ops.reduce_sum(terms, -1))
        return ops.stack([top, entropy])

    return signals


def tapped_attention_class(
    cls: type,
    form: AttentionForm,
    store: Parameter,
    on: Parameter | None,
    count: Parameter,
    wide: Any,
) -> type:
    """A subclass of ``cls`` whose ``construct`` also stores the module's attention
    signals and the count after them (the serial the host reads them by): always
    (``on`` None: the graph compiled for collected steps only), or while ``on`` is 1."""
    signals = graph_signals(form, wide)
    q_at, k_at = form.query, form.key if form.key is not None else (-2, "")
    pad_at = form.key_padding_mask if form.key_padding_mask is not None else (-2, "")
    mask_at = form.attn_mask if form.attn_mask is not None else (-2, "")

    # MindSpore parses these functions' source: plain graph syntax, closure variables
    def computing(self, *args, **kwargs):
        out = self._msmon_attn_inner(*args, **kwargs)
        query = _arg(args, kwargs, q_at[0], q_at[1])
        key = _arg(args, kwargs, k_at[0], k_at[1])
        if key is None:  # self-attention: the keys come from the query's input
            key = query
        pad = _arg(args, kwargs, pad_at[0], pad_at[1])
        mask = _arg(args, kwargs, mask_at[0], mask_at[1])
        serial = ops.assign_add(count, _ONE)
        serial = ops.cast(ops.reshape(serial, (1,)), wide)
        got = ops.concat((signals(query, key, pad, mask), serial))
        token = ops.depend(_ONE, ops.assign(store, got))
        return ops.depend(out, token)

    def branching(self, *args, **kwargs):
        out = self._msmon_attn_inner(*args, **kwargs)
        if on > 0:
            query = _arg(args, kwargs, q_at[0], q_at[1])
            key = _arg(args, kwargs, k_at[0], k_at[1])
            if key is None:  # self-attention: the keys come from the query's input
                key = query
            pad = _arg(args, kwargs, pad_at[0], pad_at[1])
            mask = _arg(args, kwargs, mask_at[0], mask_at[1])
            serial = ops.assign_add(count, _ONE)
            serial = ops.cast(ops.reshape(serial, (1,)), wide)
            got = ops.concat((signals(query, key, pad, mask), serial))
            token = ops.depend(_ONE, ops.assign(store, got))
        else:
            token = _ZERO
        return ops.depend(out, token)

    construct = computing if on is None else branching
    body = {"construct": construct, "_msmon_attn_inner": cls.construct, "_msmon_attn_of": cls}
    return type(cls.__name__, (cls,), body)
