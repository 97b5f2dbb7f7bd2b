"""A tiny mixture-of-experts classifier around MindFormers 2.1.0's own router
(``mindformers.modules.transformer.moe.Router`` with ``TopkRouterV1``: its gate Dense, its
softmax and top-k, its capacity and dispatch/combine tensors), for the ``moe`` tests.

MindFormers 2.1.0 imports on MindSpore 2.10 from the Makefile's ``.venv/mindformers``
(``tests/trainers/test_mindformers.py``); this router runs in PyNative on the CPU. The
experts are four Dense-like weight matrices applied through the router's dispatch tensor
and summed back through its combine tensor, as MindFormers' MoE layer does.
"""

from __future__ import annotations

import os
import sys
from pathlib import Path

import mindspore as ms
import numpy as np
from mindspore import Parameter, nn, ops
from mindspore.common.initializer import Normal, initializer

MINDFORMERS_DIR = Path(os.environ.get("MSMON_MINDFORMERS_DIR", Path(sys.prefix) / "mindformers"))
TOKENS, FEATURES, HIDDEN, EXPERTS, TOPK, CLASSES = 32, 16, 32, 4, 2, 3


def import_router(log_dir: str):
    """MindFormers' ``MoEConfig``, ``Router`` and its default MoE parallel config."""
    if str(MINDFORMERS_DIR) not in sys.path:
        sys.path.append(str(MINDFORMERS_DIR))
    os.environ.setdefault("LOCAL_DEFAULT_PATH", log_dir)
    from mindformers.modules.transformer.moe import MoEConfig, Router, default_moeparallel_config

    return MoEConfig, Router, default_moeparallel_config


class TinyMoE(nn.Cell):
    """embed -> MindFormers Router -> 4 experts (dispatch/combine) -> head."""

    def __init__(self, log_dir: str) -> None:
        super().__init__()
        moe_config, router, parallel = import_router(log_dir)
        config = moe_config(
            expert_num=EXPERTS, num_experts_chosen=TOPK, capacity_factor=2.0,
            router_dense_type="float32",
        )  # fmt: skip
        self.embed = nn.Dense(FEATURES, HIDDEN)
        self.router = router(
            HIDDEN, config, routing_policy="TopkRouterV1", parallel_config=parallel,
            init_method_std=0.5,
        )  # fmt: skip
        self.experts = Parameter(
            initializer(Normal(0.2), (EXPERTS, HIDDEN, HIDDEN), ms.float32), name="experts"
        )
        self.head = nn.Dense(HIDDEN, CLASSES)

    def construct(self, x):
        h = ops.relu(self.embed(x)).reshape(1, TOKENS, HIDDEN)
        dispatch, combine, _ = self.router(h)  # (1, N, E, C) each
        capacity = dispatch.shape[-1]
        flat = dispatch.astype(ms.float32).reshape(1, TOKENS, EXPERTS * capacity).swapaxes(1, 2)
        expert_in = ops.bmm(flat, h).reshape(EXPERTS, capacity, HIDDEN)
        expert_out = ops.relu(ops.bmm(expert_in, self.experts))
        expert_out = expert_out.reshape(1, EXPERTS * capacity, HIDDEN)
        mixed = ops.bmm(combine.reshape(1, TOKENS, EXPERTS * capacity), expert_out)
        return self.head(mixed.reshape(TOKENS, HIDDEN) + h.reshape(TOKENS, HIDDEN))


def batches(steps: int, seed: int = 2):
    rng = np.random.default_rng(seed)
    centres = rng.normal(size=(CLASSES, FEATURES)).astype(np.float32)
    out = []
    for _ in range(steps):
        y = rng.integers(0, CLASSES, TOKENS).astype(np.int32)
        x = centres[y] + rng.normal(size=(TOKENS, FEATURES)).astype(np.float32)
        out.append((ms.Tensor(x), ms.Tensor(y)))
    return out
