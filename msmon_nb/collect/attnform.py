"""What an attention module must look like for msmon to recompute its logits, found by
structure: ``AttentionForm`` says where its query and key inputs, its masks and its query
and key projections are, and how many heads it splits them into.

Two shapes are followed, because their logits are a function of what the module holds
and receives, nothing else:

* ``mindspore.nn.MultiheadAttention`` (so every ``nn.TransformerEncoderLayer`` /
  ``DecoderLayer``): always, found by its class (``mha_form``).
* a module the user names (``attention_targets``: regexes over module paths) that
  computes softmax(Q K^T / sqrt(d) + mask) per head with Q and K plain linear projections
  of its inputs (``named_form``): it holds two ``nn.Dense`` sub-cells for the query and
  key projections (``q_proj``/``k_proj``, ``query``/``key``, ``wq``/``wk``, ``q``/``k``,
  ``q_lin``/``k_lin``, ``to_q``/``to_k``) with the same output width, and its head count
  as an int attribute (``num_heads``, ``num_attention_heads``, ``n_heads``, ``n_head``,
  ``heads``); its first ``construct`` argument is the hidden states, (batch, length,
  width); the keys are projected from that input, or from an argument named
  ``encoder_hidden_states`` / ``key_value_states`` / ``memory`` when one is passed
  (cross-attention); a mask, if any, is the argument named ``attention_mask`` /
  ``attn_mask`` / ``mask`` (a float mask is added to the logits, a bool one marks the
  positions not attended, as ``nn.MultiheadAttention``'s; (L, S) or broadcastable to
  (batch, heads, L, S)). A named module that is an ``nn.MultiheadAttention`` or holds
  exactly one is that one.

What cannot be followed this way is refused with ``AttentionShapeError``, naming the
module, what is missing and what to do (``attention_targets`` then records the others),
unless the module computes its own softmax(Q K^T ...), which ``collect.attnsoftmax``
follows through the softmax's input instead (``attention_forms``' ``fallback``): rotary
position embeddings (a sub-cell or attribute named ``rotary``/``rope``: the logits are of
rotated queries and keys, which are not a projection of the inputs; MindFormers'
``LlamaAttention`` and the Llama/Qwen/GLM families are such), grouped key heads (the key
projection narrower than the query's), no head count, no projections found. A causal
mask the module builds inside its own ``construct`` (not an argument) cannot be seen:
its logits would include the masked positions, so such a module must not be named --
this is said in the manual, as the one condition msmon cannot check.
"""

from __future__ import annotations

import inspect
import re
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

Q_NAMES = ("q_proj", "query", "wq", "q", "q_lin", "to_q")
K_NAMES = ("k_proj", "key", "wk", "k", "k_lin", "to_k")
HEAD_NAMES = ("num_heads", "num_attention_heads", "n_heads", "n_head", "heads")
KEY_INPUTS = ("encoder_hidden_states", "key_value_states", "memory")
MASK_INPUTS = ("attention_mask", "attn_mask", "mask")
# a sub-cell or attribute name saying the module rotates its queries and keys
ROTARY = re.compile(r"rotary|(^|_)rope(_|$)")

# (positional index, keyword name) of a construct argument; index -1: keyword only
Arg = tuple[int, str]


class AttentionShapeError(ValueError):
    """A module named by ``attention_targets`` whose logits msmon cannot recompute."""


@dataclass(frozen=True)
class AttentionForm:
    """Where one attention module's logits come from. Weights are the module's own
    Parameters (read, never written); ``*_rows`` slice a packed in-projection."""

    kind: str  # "MultiheadAttention" | "projections"
    heads: int
    batch_first: bool  # a batched input is (N, L, E); else (L, N, E)
    w_q: Any
    w_k: Any
    b_q: Any  # None: no bias
    b_k: Any
    q_rows: tuple[int, int] | None  # rows of w_q that are the query's (packed)
    k_rows: tuple[int, int] | None
    b_q_rows: tuple[int, int] | None  # rows of b_q that are the query's (packed)
    b_k_rows: tuple[int, int] | None
    bias_k: Any  # a learned key row appended to every sequence (MHA's add_bias_kv)
    zero_attn: bool  # a zero key appended after the projection (MHA's add_zero_attn)
    query: Arg
    key: Arg | None  # None: the keys are projected from the query's input
    key_padding_mask: Arg | None
    attn_mask: Arg | None
    # mask dims the module reads as (N * H, L, S) (MHA); else 4-D broadcast
    mask_3d_per_head: bool = False


def is_mha(cell: Any) -> bool:
    from mindspore import nn

    return isinstance(cell, nn.MultiheadAttention)


def mha_form(cell: Any) -> AttentionForm:
    """``nn.MultiheadAttention``'s form. Its ``construct(query, key, value,
    key_padding_mask, need_weights, attn_mask, average_attn_weights)``."""
    embed = int(cell.embed_dim)
    packed = cell.in_proj_weight is not None
    return AttentionForm(
        kind="MultiheadAttention",
        heads=int(cell.num_heads),
        batch_first=bool(cell.batch_first),
        w_q=cell.in_proj_weight if packed else cell.q_proj_weight,
        w_k=cell.in_proj_weight if packed else cell.k_proj_weight,
        b_q=cell.in_proj_bias,
        b_k=cell.in_proj_bias,
        q_rows=(0, embed) if packed else None,
        k_rows=(embed, 2 * embed) if packed else None,
        b_q_rows=(0, embed),  # the bias is packed either way
        b_k_rows=(embed, 2 * embed),
        bias_k=cell.bias_k,
        zero_attn=bool(cell.add_zero_attn),
        query=(0, "query"),
        key=(1, "key"),
        key_padding_mask=(3, "key_padding_mask"),
        attn_mask=(5, "attn_mask"),
        mask_3d_per_head=True,
    )


def named_form(path: str, cell: Any) -> AttentionForm:
    """The form of a module the user named (see the module doc), or
    ``AttentionShapeError`` saying what does not fit and what to do."""
    from mindspore import nn

    name = f"attention_targets: module {path!r} ({type(cell).__name__})"
    if is_mha(cell):
        return mha_form(cell)
    inner = [c for _, c in cell.cells_and_names() if c is not cell and is_mha(c)]
    if len(inner) == 1:
        return mha_form(inner[0])
    children = dict(cell.name_cells())
    rotary = [n for n in (*children, *vars(cell)) if ROTARY.search(n.lower())]
    if rotary:
        raise AttentionShapeError(
            f"{name} applies rotary position embeddings ({rotary[0]!r}): its logits are of "
            "rotated queries and keys, which msmon cannot recompute from its projections; "
            "remove it from attention_targets (a MindFormers/Llama-style attention is such)"
        )
    q = _dense(children, Q_NAMES, nn.Dense)
    k = _dense(children, K_NAMES, nn.Dense)
    if q is None or k is None:
        raise AttentionShapeError(
            f"{name} holds no query and key projections msmon knows: it needs two nn.Dense "
            f"sub-cells named like {Q_NAMES[0]}/{K_NAMES[0]} (or {', '.join(Q_NAMES[1:])} / "
            f"{', '.join(K_NAMES[1:])}); it holds {sorted(children) or 'no sub-cells'}. Name "
            "the module that holds them, or remove it from attention_targets"
        )
    heads = next(
        (getattr(cell, h) for h in HEAD_NAMES if isinstance(getattr(cell, h, None), int)), None
    )
    if heads is None or isinstance(heads, bool) or heads <= 0:
        raise AttentionShapeError(
            f"{name} has no head count msmon knows: set one of {', '.join(HEAD_NAMES)} on it "
            "as an int attribute (e.g. self.num_heads = 8), or remove it from attention_targets"
        )
    q_out, k_out = int(q.weight.shape[0]), int(k.weight.shape[0])
    if q_out != k_out or q_out % heads:
        raise AttentionShapeError(
            f"{name}: its query projection gives {q_out} features and its key projection "
            f"{k_out}, for {heads} heads; msmon recomputes logits where both give heads x "
            "head_dim (grouped key heads are not followed); remove it from attention_targets"
        )
    params = _construct_params(cell)
    if not params:
        raise AttentionShapeError(
            f"{name}: its construct takes no input msmon can read as the hidden states"
        )
    return AttentionForm(
        kind="projections",
        heads=int(heads),
        batch_first=True,
        w_q=q.weight,
        w_k=k.weight,
        b_q=q.bias if q.has_bias else None,
        b_k=k.bias if k.has_bias else None,
        q_rows=None,
        k_rows=None,
        b_q_rows=None,
        b_k_rows=None,
        bias_k=None,
        zero_attn=False,
        query=params[0],
        key=_named(params, KEY_INPUTS),
        key_padding_mask=None,
        attn_mask=_named(params, MASK_INPUTS),
    )


def _dense(children: dict[str, Any], names: tuple[str, ...], dense: type) -> Any:
    for n in names:
        if isinstance(children.get(n), dense):
            return children[n]
    return None


def _construct_params(cell: Any) -> list[Arg]:
    """``(index, name)`` of ``cell.construct``'s arguments (keyword-only: index -1)."""
    try:
        sig = inspect.signature(type(cell).construct)
    except (TypeError, ValueError):
        return []
    out: list[Arg] = []
    index = 0
    for p in list(sig.parameters.values())[1:]:  # self
        if p.kind in (p.POSITIONAL_ONLY, p.POSITIONAL_OR_KEYWORD):
            out.append((index, p.name))
            index += 1
        elif p.kind is p.KEYWORD_ONLY:
            out.append((-1, p.name))
    return out


def _named(params: list[Arg], names: tuple[str, ...]) -> Arg | None:
    for n in names:
        for arg in params:
            if arg[1] == n:
                return arg
    return None


def attention_forms(
    paths: list[tuple[str, Any]],
    targets: list[str] | None,
    fallback: Callable[[Any], Any] | None = None,
) -> tuple[list[tuple[str, Any, Any]], list[str]]:
    """``([(path, cell, form)], [problem])``: every ``nn.MultiheadAttention`` under the
    network, and each module ``targets`` names (regexes searched in its path), once each
    (a named module's own MHA is not counted twice); a named module that does not fit
    takes ``fallback(cell)``'s form where that is not None (``attention``: its softmax),
    else gives its ``AttentionShapeError`` message, and a pattern naming nothing says so
    too."""
    out: list[tuple[str, Any, Any]] = []
    problems: list[str] = []
    seen: set[int] = set()
    patterns = [re.compile(t) for t in targets or ()]
    named: list[tuple[str, Any]] = []
    for rx in patterns:
        hits = [(p, c) for p, c in paths if rx.search(p)]
        if not hits:
            problems.append(
                f"attention_targets: {rx.pattern!r} names no module (module paths look like "
                f"{[p for p, _ in paths][:5]})"
            )
        named += hits
    for path, cell in named:
        if id(cell) in seen:
            continue
        try:
            form = named_form(path, cell)
        except AttentionShapeError as exc:
            other = fallback(cell) if fallback is not None else None
            if other is not None:
                out.append((path, cell, other))
            else:
                problems.append(str(exc))
            seen.add(id(cell))
            continue
        seen.add(id(cell))
        owner = cell
        if not is_mha(cell) and form.kind == "MultiheadAttention":  # the one it holds
            owner = next(c for _, c in cell.cells_and_names() if is_mha(c))
            seen.add(id(owner))
            path = next(p for p, c in paths if c is owner)
        out.append((path, owner, form))
    for path, cell in paths:
        if is_mha(cell) and id(cell) not in seen:
            seen.add(id(cell))
            out.append((path, cell, mha_form(cell)))
    order = {id(c): i for i, (_, c) in enumerate(paths)}
    out.sort(key=lambda item: order.get(id(item[1]), len(order)))
    return out, problems
