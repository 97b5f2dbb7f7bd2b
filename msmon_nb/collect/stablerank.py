"""Stable rank (opt-in): ``param/<name>/stable_rank`` and ``param/<name>/sigma_max`` of the
selected weight matrices, every ``stable_rank_every``-th collected step.

With ``stable_rank`` in ``track_metrics``, the trainable 2-D parameters (Dense/Linear
weights, embedding tables) whose names a ``stable_rank_targets`` regex (else
``param_targets``) is found in are read after the step, as ``param_stats`` reads them:
the Parameters the way in hands over on collected steps, copied to nothing on the CPU
(``asnumpy`` shares host memory) and over the bus elsewhere. No user code runs and no
Parameter is written. ``metrics.spectral`` finds ``sigma_max`` from matrix-vector
products started from the previous call's vector, so a layer that changed little
since costs a few passes over its weights (``bench/stablerank.py`` measures it).

Counting collected steps rather than steps keeps it a fixed share of what collection
already costs: ``log_interval: 10, stable_rank_every: 10`` reads the matrices every
100 steps, the first collected step included (the default, 100 collected steps, is
MindFormers' ``step_interval``: one read costs a few training steps' worth of passes
over the weights of a small-batch MLP).
"""

from __future__ import annotations

import re
from collections.abc import Callable, Iterable, Sequence
from typing import Any

import numpy as np

from msmon_nb.collect.tensors import to_numpy
from msmon_nb.collect.values import param_tag
from msmon_nb.metrics.spectral import stable_rank, top_singular

MISSING_PARAMS = (
    "stable_rank reads the weights on collected steps, but this way in handed over no "
    "parameters: pass params=net.trainable_params() to mon.step(...)"
)


class StableRanks:
    """The warm-start vectors and the collected-step count of one run."""

    def __init__(
        self, targets: Iterable[str], every: int, warn: Callable[[str, str], None]
    ) -> None:
        self._patterns = [re.compile(t) for t in targets]
        self._every = every
        self._warn = warn
        self._seen = 0  # collected steps so far
        self._vectors: dict[str, np.ndarray] = {}
        self._chosen: dict[str, bool] = {}  # parameter name -> selected
        self.products = 0  # matrix-vector products, for the cost bench

    def due(self) -> bool:
        """Count a collected step; True on the first and every ``every``-th after it."""
        due = self._seen % self._every == 0
        self._seen += 1
        return due

    def read(self, params: Sequence[Any] | None) -> dict[str, float]:
        """The two tags of each selected matrix among ``params`` (a due step's)."""
        if params is None:
            self._warn("stable_rank params", MISSING_PARAMS)
            return {}
        out: dict[str, float] = {}
        for param in params:
            name = str(getattr(param, "name", ""))
            if not self._selected(name, param):
                continue
            weight = to_numpy(param)
            top = top_singular(weight, self._vectors.get(name))
            self.products += top.products
            if top.vector is None:
                self._vectors.pop(name, None)
            else:
                self._vectors[name] = top.vector
            tag = param_tag(name)
            out[f"param/{tag}/sigma_max"] = top.sigma
            rank = stable_rank(weight, top.sigma)
            if rank is not None:
                out[f"param/{tag}/stable_rank"] = rank
        if not self._vectors and not out:
            self._warn(
                "stable_rank none",
                "stable_rank: no 2-D trainable parameter matches stable_rank_targets "
                f"({[p.pattern for p in self._patterns]}); nothing is recorded",
            )
        return out

    def _selected(self, name: str, param: Any) -> bool:
        known = self._chosen.get(name)
        if known is None:
            matrix = len(getattr(param, "shape", ())) == 2
            known = matrix and any(p.search(name) for p in self._patterns)
            self._chosen[name] = known
        return known
