"""Attention signals of MindNLP models (transformers on ``mindtorch``): each attention
module's ``attn/<module>/max_logit`` and ``attn/<module>/entropy`` on collected
PyNative steps, with the meaning ``collect.attention`` gives them.

Why capture instead of recompute: ``collect.attention`` recomputes ``nn.MultiheadAttention``'s
logits from its inputs and query/key weights, which is exact only where the logits are a
plain projection of the inputs. transformers' attention modules rotate queries and keys
(Llama's rotary embeddings), repeat grouped key heads (GQA), build causal and padding masks
outside the module, cache keys, add relative-position scores (BERT's ``relative_key``)...:
recomputing each family from its projections would be a copy of its forward, wrong at the
first variant it misses. Every one of them ends the same way, though: the logits go into a
softmax over the last axis (the eager path: ``nn.functional.softmax`` of a (batch, heads,
queries, keys) tensor) or into ``scaled_dot_product_attention`` (the sdpa path, transformers'
default under MindNLP) with the already rotated and projected query and key. So, while a
tracked module runs on a collected step, those two functions are wrapped (mindtorch's
``nn.functional.softmax``, ``ops.softmax`` / ``torch.softmax`` / ``Tensor.softmax``, and
``nn.functional.scaled_dot_product_attention``, put back when the step ends) and copy to
the host what the module's own call gives them; after the step the statistics are taken in
float64 numpy. The wrappers call the original with the same arguments and return its
result: the module computes exactly what it computed without us. Outside a tracked
module's call they only pass through, and a step that is not collected has no wrapper.

* sdpa: ``(query, key, attn_mask, is_causal, scale, enable_gqa)`` as torch defines them
  (a bool mask's True *takes part*, a float mask is added, ``is_causal`` is the
  top-left lower triangle, ``scale`` defaults to 1/sqrt(head_dim), fewer key heads are
  repeated to the query's). The logits are recomputed from that query and key in
  float64: ``max_logit`` is the largest over the positions the masks let through
  (a mask value at or below ``metrics.logits.CLOSED`` or -inf masks a position), ``entropy``
  the mean over batch, heads and queries of the softmax rows' entropy (nats), masks added.
  A softmax inside the sdpa call (mindtorch's own CPU sdpa is written with one) is not
  taken a second time.
* eager: the softmax input itself (float32 as the module computed it), in which the
  additive mask is already included. ``entropy`` is the softmax rows' entropy of exactly
  that input; ``max_logit`` is the largest entry above ``metrics.logits.ADDED_CLOSED``
  (-5000): with the masks transformers builds (0 where attended, the dtype's minimum,
  -inf or -10000 where not) those are the attended positions while logits stay under
  5000 in magnitude.

Found by structure (``attention_modules``): every module whose own children include a
query and a key projection (``query``/``key`` as BERT's, ``q_proj``/``k_proj`` as Llama's,
and the other names ``attnform`` knows) or a packed one (``qkv_proj``, ``c_attn``,
``query_key_value``, ``Wqkv``, ``W_pack``), and each module ``attention_targets`` names
(any module: what its softmax or sdpa call sees is taken). A module found whose call on a
collected step ran neither (a fused kernel of its own, a softmax imported by name before
the watch) is said once, naming it.

Cost: on a collected step, one host copy of each tracked module's logits (eager: batch x
heads x queries x keys floats) or of its query and key (sdpa), and the float64 arithmetic
after the step; nothing on the others.
"""

from __future__ import annotations

import math
import re
import sys
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from msmon_nb.collect.attnform import K_NAMES, Q_NAMES
from msmon_nb.collect.patches import Patches
from msmon_nb.collect.tensors import to_numpy
from msmon_nb.metrics.logits import logit_signals

# a child holding the query, key and value projections in one weight
PACKED = ("qkv_proj", "qkv", "c_attn", "query_key_value", "Wqkv", "W_pack")
FUNCTIONAL = "mindtorch.nn.functional"
# (module, attribute) of each softmax the wrappers replace: ``Tensor.softmax`` and
# ``torch.softmax`` call ``mindtorch.ops``' and ``mindtorch``'s
SOFTMAXES = ((FUNCTIONAL, "softmax"), ("mindtorch.ops", "softmax"), ("mindtorch", "softmax"))
SDPA = (FUNCTIONAL, "scaled_dot_product_attention")

MISSED = (
    "attention: {module} ran on a collected step but computed its attention weights in "
    "neither mindtorch's softmax nor scaled_dot_product_attention (a fused kernel of its "
    "own, or a softmax imported by name before the watch began), so no attn/{tag}/... is "
    "recorded; training goes on"
)


def _has_projection(children: dict[str, Any], names: Sequence[str]) -> bool:
    return any(getattr(children.get(n), "weight", None) is not None for n in names)


def has_projections(module: Any) -> bool:
    """Whether ``module``'s own children include a query and a key projection, or a
    packed query/key/value one (each a module holding a ``weight``)."""
    children = dict(module.named_children())
    if _has_projection(children, PACKED):
        return True
    return _has_projection(children, Q_NAMES) and _has_projection(children, K_NAMES)


def attention_modules(
    paths: list[tuple[str, Any]], targets: Sequence[str] | None = None
) -> tuple[list[tuple[str, Any]], list[str]]:
    """``([(path, module)], [problem])``: the modules found by structure among
    ``[(path, module)]`` (``torchmodules.module_paths``) and those ``targets`` names, in
    the tree's order, each once; a pattern naming none is a problem."""
    problems: list[str] = []
    chosen: set[int] = set()
    for pattern in targets or ():
        rx = re.compile(pattern)
        hits = [module for path, module in paths if rx.search(path)]
        if not hits:
            problems.append(
                f"attention_targets: {pattern!r} names no module (module paths look like "
                f"{[p for p, _ in paths][:5]})"
            )
        chosen.update(id(m) for m in hits)
    chosen.update(id(m) for _, m in paths if has_projections(m))
    return [(path, m) for path, m in paths if id(m) in chosen], problems


@dataclass
class Logits:
    """An eager softmax input, copied to the host (its mask already added)."""

    values: np.ndarray


@dataclass
class SdpaCall:
    """What one ``scaled_dot_product_attention`` call received, copied to the host."""

    query: np.ndarray
    key: np.ndarray
    mask: np.ndarray | None
    causal: bool
    scale: float | None


def _host(value: Any) -> np.ndarray:
    return np.array(to_numpy(value))


def _softmax_dim(args: tuple, kwargs: dict) -> Any:
    return args[0] if args else kwargs.get("dim", -1)


def sdpa_mask(call: SdpaCall, length: int, src: int) -> np.ndarray:
    """The additive mask a ``scaled_dot_product_attention`` call applies, float64
    (torch's meaning: module doc), broadcastable to (batch, heads, L, S)."""
    out = np.zeros((length, src))
    if call.causal:
        out = np.where(np.tril(np.ones((length, src), dtype=bool)), 0.0, -np.inf)
    if call.mask is not None:
        mask = call.mask
        if mask.dtype == np.bool_:
            out = out + np.where(mask, 0.0, -np.inf)
        else:
            out = out + mask.astype(np.float64)
    return out


def sdpa_logits(call: SdpaCall) -> np.ndarray:
    """The call's scaled QK^T in float64, key heads repeated to the query's (GQA)."""
    query = call.query.astype(np.float64)
    key = call.key.astype(np.float64)
    if query.ndim == 4 and key.shape[1] != query.shape[1]:
        key = np.repeat(key, query.shape[1] // key.shape[1], axis=1)
    scale = call.scale if call.scale is not None else 1.0 / math.sqrt(query.shape[-1])
    return (query @ key.swapaxes(-1, -2)) * scale


def signals(seen: Logits | SdpaCall) -> dict[str, float]:
    """``{max_logit, entropy}`` of one captured call, in float64."""
    if isinstance(seen, Logits):
        return logit_signals(seen.values.astype(np.float64), None)
    logits = sdpa_logits(seen)
    return logit_signals(logits, sdpa_mask(seen, logits.shape[-2], logits.shape[-1]))


class TorchAttention:
    """One watch's capture of its attention modules (mindtorch), armed on collected
    steps only: hooks that say which module runs, and the softmax/sdpa wrappers."""

    def __init__(self, warn_once: Callable[[str, str], None]) -> None:
        self.warn_once = warn_once
        self.kept: dict[str, Logits | SdpaCall] = {}  # tag prefix -> its first call's
        self.ran: dict[str, str] = {}  # tag prefix -> module path, for those that ran
        self.running: list[str] = []  # tag prefixes of the tracked calls under way
        self.in_sdpa = 0
        self.handles: list[Any] = []
        self.patches = Patches()
        self.captures = 0  # calls copied (a test counts none on steps not collected)

    def arm(self, modules: Sequence[tuple[str, str, Any]], count: Callable[[], None]) -> None:
        """Hook ``[(tag prefix, path, module)]`` and wrap the functions, for one step."""
        for prefix, path, module in modules:
            self.handles.append(module.register_forward_pre_hook(self._enter(prefix, path)))
            self.handles.append(module.register_forward_hook(self._leave(prefix, count)))
        if modules:
            self._wrap()

    def disarm(self) -> None:
        """Hooks and wrappers off (the step ended, or the watch closes)."""
        for handle in self.handles:
            handle.remove()
        self.handles.clear()
        self.patches.restore()
        self.running.clear()
        self.in_sdpa = 0

    def _enter(self, prefix: str, path: str) -> Callable[..., None]:
        def attention_enters(module, args):
            self.running.append(prefix)
            self.ran.setdefault(prefix, path)

        return attention_enters

    def _leave(self, prefix: str, count: Callable[[], None]) -> Callable[..., None]:
        def attention_leaves(module, args, output):
            count()
            if self.running and self.running[-1] == prefix:
                self.running.pop()

        return attention_leaves

    def _wrap(self) -> None:
        for name, attr in SOFTMAXES:
            owner = sys.modules.get(name)
            function = getattr(owner, attr, None)
            if callable(function):
                self.patches.put(owner, attr, self._softmax(function))
        owner = sys.modules.get(SDPA[0])
        function = getattr(owner, SDPA[1], None)
        if callable(function):
            self.patches.put(owner, SDPA[1], self._sdpa(function))

    def _wanted(self) -> str | None:
        """The tracked module whose call is under way and has nothing kept yet."""
        if not self.running or self.in_sdpa:
            return None
        prefix = self.running[-1]
        return None if prefix in self.kept else prefix

    def _softmax(self, function: Callable[..., Any]) -> Callable[..., Any]:
        def softmax(input, *args, **kwargs):
            prefix = self._wanted()
            rows = getattr(input, "ndim", 0) == 4 and _softmax_dim(args, kwargs) in (-1, 3)
            if prefix is not None and rows:  # (batch, heads, queries, keys), over the keys
                self.kept[prefix] = Logits(_host(input))
                self.captures += 1
            return function(input, *args, **kwargs)

        softmax.__wrapped__ = function  # type: ignore[attr-defined]
        return softmax

    def _sdpa(self, function: Callable[..., Any]) -> Callable[..., Any]:
        def scaled_dot_product_attention(query, key, value, *args, **kwargs):
            prefix = self._wanted()
            if prefix is not None:
                self.kept[prefix] = _sdpa_call(query, key, args, kwargs)
                self.captures += 1
            self.in_sdpa += 1
            try:
                return function(query, key, value, *args, **kwargs)
            finally:
                self.in_sdpa -= 1

        scaled_dot_product_attention.__wrapped__ = function  # type: ignore[attr-defined]
        return scaled_dot_product_attention

    def take(self) -> dict[str, float]:
        """The step's ``{attn/<module>/<stat>: value}``; a module that ran with nothing
        captured is said once. What was kept goes."""
        out: dict[str, float] = {}
        for prefix, seen in self.kept.items():
            for stat, value in signals(seen).items():
                out[f"{prefix}/{stat}"] = value
        for prefix, path in self.ran.items():
            if prefix not in self.kept:
                tag = prefix.partition("/")[2]
                self.warn_once(f"attention missed {prefix}", MISSED.format(module=path, tag=tag))
        self.kept.clear()
        self.ran.clear()
        return out


def _sdpa_call(query: Any, key: Any, args: tuple, kwargs: dict) -> SdpaCall:
    """torch's ``scaled_dot_product_attention(query, key, value, attn_mask=None,
    dropout_p=0.0, is_causal=False, scale=None, enable_gqa=False)`` arguments, copied."""
    mask = args[0] if args else kwargs.get("attn_mask")
    causal = args[2] if len(args) > 2 else kwargs.get("is_causal", False)
    scale = args[3] if len(args) > 3 else kwargs.get("scale")
    return SdpaCall(
        query=_host(query),
        key=_host(key),
        mask=None if mask is None else _host(mask),
        causal=bool(causal),
        scale=None if scale is None else float(scale),
    )
