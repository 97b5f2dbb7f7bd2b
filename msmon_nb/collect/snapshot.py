"""Step-level tensor summaries, and the flight recorder that keeps them for the last steps.

A summary of one tensor is its shape, dtype, ``tensor_stats`` (min, max, mean, std, norm,
NaN/Inf counts, share of zeros), a histogram in MindSpore's layout, and the raw values
when the tensor is small. The monitor writes them as summary events under
``snap/<name>/<stat>``, ``snap/<name>/hist`` and ``snap/<name>/value``, and lists each
in ``snapshots.jsonl``.

The flight recorder (``monitor_config.snapshot: {on: alert}``) summarises parameters and
gradients on every collected step into a ring buffer of the last ``keep`` steps; when an
alert fires, the monitor writes the buffer, so the run holds the state *before* the
failure, not only after it. It costs a statistics pass over the selected tensors on each
collected step, which is why it is opt-in and filtered by ``targets``.

When activations are tracked (``track_metrics: [..., activations]``), a snapshot also lists
each selected module's activation statistics (``act/<module>/<stat>``, and
``act_grad/...``) at the last step they were collected (``activation_entries``): the
monitor already holds them, so the snapshot costs nothing more and never reaches into the
model. Each is a ``snapshots.jsonl`` entry of ``kind: "activations"``, named
``act/<module>``, without shape, histogram or summary events (its values are the run's own
``act/`` series at that step).
"""

from __future__ import annotations

import collections
import re
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any

import numpy as np

from msmon_nb.collect.tensors import flatten_tensors, to_numpy
from msmon_nb.config import suggest_tag
from msmon_nb.events.histogram import histogram
from msmon_nb.events.wire import Histogram
from msmon_nb.metrics.stats import tensor_stats

DEFAULT_MAX_RAW = 4096
DEFAULT_KEEP = 20
ACTIVATIONS = "activations"  # the ``kind`` of a snapshot entry holding a module's stats
_ACT_PREFIXES = ("act/", "act_grad/")


@dataclass
class TensorSummary:
    """What a snapshot records for one tensor."""

    name: str  # tag-safe, used in snap/<name>/...
    label: str  # the name as the user or the framework spelled it
    shape: tuple[int, ...]
    dtype: str
    stats: dict[str, float]
    hist: Histogram
    raw: np.ndarray | None

    def to_dict(self) -> dict[str, Any]:
        """The ``snapshots.jsonl`` form (without histogram and raw values)."""
        return {
            "name": self.name,
            "label": self.label,
            "shape": list(self.shape),
            "dtype": self.dtype,
            "stats": self.stats,
        }


def summarize(label: str, tensor: Any, max_raw: int = DEFAULT_MAX_RAW) -> TensorSummary:
    """Summary of one tensor (MindSpore Tensor/Parameter, numpy array or number)."""
    arr = np.asarray(to_numpy(tensor))
    raw = np.array(arr, copy=True) if arr.size <= max_raw else None
    return TensorSummary(
        name=suggest_tag(label.replace("/", ".")),
        label=label,
        shape=tuple(int(d) for d in arr.shape),
        dtype=str(arr.dtype),
        stats=tensor_stats(arr),
        hist=histogram(arr),
        raw=raw,
    )


def named_tensors(tensors: Any) -> list[tuple[str, Any]]:
    """(name, tensor) pairs from a dict, a list of Parameters, a Cell, or one tensor."""
    if tensors is None:
        return []
    if isinstance(tensors, Mapping):
        return [(str(k), v) for k, v in tensors.items()]
    params = getattr(tensors, "trainable_params", None)
    if callable(params):  # a mindspore Cell
        return [(p.name, p) for p in params()]
    if isinstance(tensors, tuple | list):
        return [(getattr(t, "name", None) or f"tensor_{i}", t) for i, t in enumerate(tensors)]
    return [(getattr(tensors, "name", None) or "tensor", tensors)]


def params_and_grads(
    params: Iterable[Any] | None, grads: Any, targets: Iterable[str] = (".*",)
) -> list[tuple[str, Any]]:
    """``<param>`` and ``<param>.grad`` pairs whose parameter name matches ``targets``."""
    patterns = [re.compile(t) for t in targets]
    params = list(params or [])
    leaves = flatten_tensors(grads) if grads is not None else []
    out = []
    for i, param in enumerate(params):
        name = getattr(param, "name", f"param_{i}")
        if not any(p.search(name) for p in patterns):
            continue
        out.append((name, param))
        if i < len(leaves):
            out.append((f"{name}.grad", leaves[i]))
    return out


class FlightRecorder:
    """The last ``keep`` collected steps' summaries of parameters and gradients."""

    def __init__(self, keep: int = DEFAULT_KEEP, targets: Iterable[str] = (".*",)) -> None:
        self.keep = keep
        self.targets = list(targets)
        self.buffer: collections.deque[tuple[int, list[TensorSummary]]] = collections.deque(
            maxlen=keep
        )
        self.written_up_to: int | None = None

    def record(self, step: int, params: Iterable[Any] | None, grads: Any) -> None:
        """Summarise this step's parameters and gradients (no raw values are kept)."""
        pairs = params_and_grads(params, grads, self.targets)
        if pairs:
            self.buffer.append((step, [summarize(n, t, max_raw=0) for n, t in pairs]))

    def take(self) -> list[tuple[int, list[TensorSummary]]]:
        """Buffered steps not written yet, oldest first; marks them written."""
        fresh = [
            (step, items)
            for step, items in self.buffer
            if self.written_up_to is None or step > self.written_up_to
        ]
        if fresh:
            self.written_up_to = fresh[-1][0]
        return fresh


def activation_entries(series: Mapping[str, Any]) -> list[dict[str, Any]]:
    """Each module's activation statistics at the last step they were recorded, from the
    monitor's live ``series`` (tag -> object with ``steps``/``values``), modules in the
    order first recorded (forward order): ``[{kind, name, label, step, stats}]``, where
    ``name`` is ``act/<module>`` (or ``act_grad/<module>``) and ``stats`` maps each
    statistic to its value (NaN kept: it is what the step had)."""
    found: dict[str, dict[str, Any]] = {}
    for tag in series:
        if not tag.startswith(_ACT_PREFIXES):
            continue
        name, _, stat = tag.rpartition("/")
        s = series[tag]
        steps = s.steps
        if not len(steps):
            continue
        step = int(steps[-1])
        entry = found.setdefault(name, {"step": step, "values": {}})
        if step > entry["step"]:  # a module seen later than its first stat's last step
            entry["step"], entry["values"] = step, {}
        if step == entry["step"]:
            entry["values"][stat] = float(s.values[-1])
    return [
        {
            "kind": ACTIVATIONS,
            "name": name,
            "label": name.partition("/")[2],
            "step": e["step"],
            "stats": e["values"],
        }
        for name, e in found.items()
    ]
