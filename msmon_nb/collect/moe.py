"""Mixture-of-experts signals (opt-in, ``track_metrics: [..., moe]``): each router's
entropy and load, every collected PyNative step, as ``moe/<router>/router_entropy``,
``moe/<router>/tokens_per_expert_max_frac`` and, per expert, ``moe_load/<router>.expert_<i>/share``
(a heatmap: a row per router and expert, a column per step).

Why: a router that collapses (its entropy falls, one expert takes most tokens) wastes
the other experts and its load-balancing loss fights it late; both show in the router's
logits first (``metrics.routing``).

Found by structure, not by class name: a cell with an expert count (``expert_dim``,
``num_experts``, ``expert_num`` or ``num_moe_experts``) and a top-k (``num_experts_chosen``,
``top_k``, ``topk``, ``moe_router_topk`` or ``num_experts_per_tok``) that holds an
``nn.Dense`` child with that many outputs: the gate. MindFormers 2.1.0's
``modules.transformer.moe.Router`` is one (its ``dense`` gives the logits its
``TopkRouter`` softmaxes and picks from, and it runs in PyNative on the CPU);
its ``parallel_core`` ``TopKRouter`` multiplies a weight Parameter by a primitive, holds
no Dense, and does not run on the CPU (no ``TopkExt`` kernel): it is not found.

How: on a collected step a forward hook of ours on the gate copies its output (the
logits) to the host; the statistics are computed after the step. Steps not collected run
no hook. Compiled steps run no Python hook: one warning says these are not recorded.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import numpy as np

from msmon_nb.collect.tensors import to_numpy
from msmon_nb.metrics.routing import router_stats

EXPERT_ATTRS = ("expert_dim", "num_experts", "expert_num", "num_moe_experts")
TOPK_ATTRS = ("num_experts_chosen", "top_k", "topk", "moe_router_topk", "num_experts_per_tok")


def _count(cell: Any, names: tuple[str, ...]) -> int | None:
    for name in names:
        value = getattr(cell, name, None)
        if isinstance(value, int) and not isinstance(value, bool) and value >= 1:
            return value
    return None


def router_gate(cell: Any) -> tuple[Any, int] | None:
    """``(gate Dense, k)`` when ``cell`` is a router (module docstring), else None."""
    experts = _count(cell, EXPERT_ATTRS)
    k = _count(cell, TOPK_ATTRS)
    if experts is None or k is None or experts < 2:
        return None
    from mindspore import nn

    for child in cell.name_cells().values():
        if isinstance(child, nn.Dense) and int(child.out_channels) == experts:
            return child, k
    return None


def router_modules(paths: list[tuple[str, Any]]) -> list[tuple[str, Any, int]]:
    """``[(router path, gate, k)]`` among ``[(path, cell)]`` (``activations.module_paths``)."""
    out = []
    for path, cell in paths:
        found = router_gate(cell)
        if found is not None:
            out.append((path, *found))
    return out


class RouterHooks:
    """The forward hooks of one collected step on the routers' gates, and the logits
    they kept (each router's first call in the step)."""

    def __init__(self) -> None:
        self.kept: dict[str, tuple[np.ndarray, int]] = {}  # router tag -> (logits, k)

    def hook(self, name: str, k: int, count: Callable[[], None]) -> Callable[..., None]:
        """A forward hook on the gate of router ``name`` (its tag spelling)."""
        kept = self.kept

        def router_hook(cell, inputs, output):
            count()
            if name not in kept:
                logits = output[0] if isinstance(output, tuple | list) else output
                kept[name] = (np.array(to_numpy(logits)), k)

        return router_hook

    def take(self) -> dict[str, float]:
        """The step's ``moe/...`` and ``moe_load/...`` values; what was kept goes."""
        out: dict[str, float] = {}
        for name, (logits, k) in self.kept.items():
            stats, shares = router_stats(logits, k)
            for stat, value in stats.items():
                out[f"moe/{name}/{stat}"] = value
            for i, share in enumerate(shares):
                out[f"moe_load/{name}.expert_{i}/share"] = float(share)
        self.kept.clear()
        return out
