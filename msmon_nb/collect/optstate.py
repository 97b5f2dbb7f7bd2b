"""Optimizer state (opt-in): the L2 norm of each optimizer moment, per selected parameter.

With ``optimizer_state`` in ``track_metrics`` every collected step records
``param/<parameter>/moment1_norm`` and ``.../moment2_norm`` (Adam's m and v) or
``.../momentum_norm`` (a momentum buffer), for the parameters ``param_targets`` selects
(MindFormers' ``target``/``invert``, mapped in ``config_mindformers``). The tags sit next
to ``param_stats``' ``param/<parameter>/weight_norm`` and ``grad_norm``, so one
parameter's weight, gradient and moments group together and the panel draws one chart
per kind with a line per parameter.

Which attributes hold moments was checked on MindSpore 2.7.1 and 2.10 (they agree):

* ``nn.Adam``, ``AdamOffload``, ``LazyAdam``, ``AdaMax``: ``moment1``/``moment2``;
* ``nn.AdamWeightDecay`` (``adam_m``/``adam_v``), ``nn.Lamb`` (``lamb_m``/``lamb_v``) and
  MindFormers' ``AdamW``: ``moments1``/``moments2``;
* ``mindspore.mint.optim``/``experimental.optim`` Adam(W): ``exp_avg``/``exp_avg_sq``;
* ``nn.Momentum``: ``moments``; ``nn.SGD`` with momentum > 0: ``accum``.

Each is a ``ParameterTuple`` cloned from the optimizer's parameters, in their order, so
moment ``i`` belongs to parameter ``i``; parameters are selected by their own names
(MindFormers searches the moment's name, ``adam_m.<parameter>``, which only differs for
targets anchored with ``^``). An optimizer with none of these (plain SGD, Adagrad...)
gets one warning and nothing else; training goes on.

The norms are computed where the moments live. On Ascend/GPU one compiled graph squares
and sums every selected moment (float32) and copies one small array to the host. On the
CPU the moments already are host memory: ``asnumpy`` shares it and BLAS dots in float64
chunks are 10-30x faster than MindSpore's CPU reduction kernels (10.5 M-parameter Adam,
``bench/optstate.py``: 5-15 ms against 130-180 ms). ``MSMON_OPTSTATE_PATH=device|host``
forces either path. Nothing is read on steps that are not collected: the ways in hand
the optimizer over only then.

The graph binds the moments' buffers when it compiles, as the optimizer's own graph
does: both keep using them after in-place updates (``assign``, every optimizer step) but
neither sees a buffer swapped in later with ``Parameter.set_data``.
"""

from __future__ import annotations

import os
import re
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field
from typing import Any

from msmon_nb.collect.active import quiet
from msmon_nb.collect.hooks import closure_filled, is_optimizer
from msmon_nb.collect.tensors import to_float, to_numpy
from msmon_nb.collect.values import param_tag
from msmon_nb.metrics.extent import tensor_extent
from msmon_nb.metrics.norms import norms

# (attributes holding the moments, the name each gets in its tag); first match wins
ADAM_LIKE = (
    (("moment1", "moment2"), ("moment1", "moment2")),
    (("moments1", "moments2"), ("moment1", "moment2")),
    (("exp_avg", "exp_avg_sq"), ("moment1", "moment2")),
)
MOMENT_NAMES = ("moment1", "moment2", "momentum")
PATH_ENV = "MSMON_OPTSTATE_PATH"


def moment_tag(param_name: str, moment: str, kind: str = "norm") -> str:
    """``param/<parameter tag>/<moment>_<kind>`` (``kind`` one of ``param_stat_kinds``),
    the parameter spelled as ``param_stats`` does."""
    return f"param/{param_tag(param_name)}/{moment}_{kind}"


def find_moments(optimizer: Any) -> list[tuple[str, Sequence[Any]]] | str:
    """``[(moment name, one tensor per parameter), ...]``, or why there are none.

    Feature detection first (attribute names, as MindFormers does), so subclasses and
    look-alikes (MindFormers' AdamW) work; the momentum buffers are recognised by class,
    because ``moments``/``accum`` mean an accumulator of squares elsewhere (FTRL,
    Adagrad).
    """
    params = list(getattr(optimizer, "parameters", None) or ())
    kind = type(optimizer).__name__
    if not params:
        return f"{kind} holds no parameters"
    found: list[tuple[str, Sequence[Any]]] = []
    for attrs, names in ADAM_LIKE:
        if all(hasattr(optimizer, a) for a in attrs):
            found = [(n, list(getattr(optimizer, a))) for a, n in zip(attrs, names, strict=True)]
            break
    if not found:
        from mindspore import nn

        if isinstance(optimizer, nn.Momentum) and hasattr(optimizer, "moments"):
            found = [("momentum", list(optimizer.moments))]
        elif isinstance(optimizer, nn.SGD) and hasattr(optimizer, "accum"):
            momentum = to_float(getattr(optimizer, "momentum", 0.0)) or 0.0
            if momentum <= 0.0:
                return f"{kind} without momentum keeps no moments"
            found = [("momentum", list(optimizer.accum))]
    if not found:
        return (
            f"{kind} keeps no moments msmon knows (Adam-like moment1/moment2, moments1/"
            "moments2 or exp_avg/exp_avg_sq; Momentum's moments; SGD's momentum buffer)"
        )
    for name, tensors in found:
        if len(tensors) != len(params):
            return f"{kind}'s {name} holds {len(tensors)} tensors for {len(params)} parameters"
    return found


@dataclass
class Plan:
    """What one optimizer's collected steps read: the tags and their tensors, in order."""

    optimizer: Any
    tags: list[str] = field(default_factory=list)  # len(tensors) x len(kinds), tensor-major
    tensors: list[Any] = field(default_factory=list)
    kinds: tuple[str, ...] = ("norm",)
    why_empty: str | None = None
    cell: Any = None  # the compiled reduction (device path), built at the first read


def plan_for(optimizer: Any, targets: Iterable[str], kinds: Sequence[str] = ("norm",)) -> Plan:
    """Select the moments of the parameters whose names a target is found in; each gets
    one tag per statistic of ``kinds``."""
    plan = Plan(optimizer, kinds=tuple(kinds))
    moments = find_moments(optimizer)
    if isinstance(moments, str):
        plan.why_empty = moments
        return plan
    patterns = [re.compile(t) for t in targets]
    names = [str(getattr(p, "name", f"param_{i}")) for i, p in enumerate(optimizer.parameters)]
    chosen = [i for i, n in enumerate(names) if any(p.search(n) for p in patterns)]
    if not chosen:
        plan.why_empty = (
            f"param_targets select none of {type(optimizer).__name__}'s {len(names)} "
            f"parameters (e.g. {names[0]!r})"
        )
        return plan
    for moment, tensors in moments:
        for i in chosen:
            plan.tags.extend(moment_tag(names[i], moment, kind) for kind in plan.kinds)
            plan.tensors.append(tensors[i])
    return plan


def on_device() -> bool:
    """Reduce on the device unless the moments are host memory (the CPU target)."""
    forced = os.environ.get(PATH_ENV, "").strip().lower()
    if forced in ("device", "host"):
        return forced == "device"
    import mindspore as ms

    return ms.get_context("device_target") != "CPU"


def _norm_cell(tensors: list[Any], kinds: Sequence[str] = ("norm",)) -> Any:
    """A Cell whose compiled ``construct`` returns, for each tensor in turn, its
    statistics of ``kinds`` (``metrics.extent``'s definitions), as one flat array."""
    import mindspore as ms
    from mindspore import ParameterTuple, nn, ops

    wanted = tuple(kinds)

    class MomentStats(nn.Cell):
        """Every selected moment's statistics in one graph; float32 throughout."""

        def __init__(self, moments: list[Any]) -> None:
            super().__init__(auto_prefix=False)
            self.moments = ParameterTuple(moments)

        @ms.jit
        def construct(self):
            out = []
            for m in self.moments:
                x = ops.cast(m, ms.float32)
                for kind in wanted:
                    if kind == "norm":
                        out.append(ops.sqrt(ops.reduce_sum(ops.square(x))))
                    elif kind == "max_abs":
                        out.append(ops.reduce_max(ops.abs(x)))
                    elif kind == "nonfinite":
                        bad = ops.logical_not(ops.isfinite(x))
                        out.append(ops.reduce_sum(ops.cast(bad, ms.float32)))
                    else:
                        zero = ops.cast(ops.equal(x, 0), ms.float32)
                        out.append(ops.reduce_mean(zero))
            return ops.stack(out)

    return MomentStats(tensors)


class OptimizerState:
    """One monitor's reader: a plan per optimizer, built once, read on collected steps."""

    def __init__(
        self,
        targets: Iterable[str],
        warn_once: Callable[[str, str], None],
        kinds: Sequence[str] = ("norm",),
    ) -> None:
        self.targets = list(targets)
        self.kinds = tuple(kinds)
        self.warn_once = warn_once
        self.plans: dict[int, Plan] = {}
        self.reads = 0  # reductions run (one per collected step with a plan)

    def read(self, optimizer: Any) -> dict[str, float]:
        """``{tag: norm}`` for ``optimizer``'s selected moments, now."""
        plan = self.plans.get(id(optimizer))
        if plan is None or plan.optimizer is not optimizer:
            plan = plan_for(optimizer, self.targets, self.kinds)
            self.plans[id(optimizer)] = plan
        if plan.why_empty is not None:
            self.warn_once(
                f"optimizer_state {type(optimizer).__name__}",
                f"optimizer_state: {plan.why_empty}, so no moment norms are recorded for it; "
                "training goes on",
            )
            return {}
        self.reads += 1
        if on_device():
            if plan.cell is None:
                plan.cell = _norm_cell(plan.tensors, plan.kinds)
            with quiet():
                values = [float(v) for v in plan.cell().asnumpy().reshape(-1)]
        elif plan.kinds == ("norm",):
            values = norms(to_numpy(t) for t in plan.tensors)
        else:
            values = [
                v for t in plan.tensors for v in tensor_extent(to_numpy(t), plan.kinds).values()
            ]
        return dict(zip(plan.tags, values, strict=True))


def missing_optimizer_message() -> str:
    """What to do when optimizer_state is tracked but a collected step names no optimizer."""
    return (
        "optimizer_state is tracked but this loop's optimizer is not known, so no moment "
        "norms are recorded; with mon.step pass it: mon.step(..., optimizer=opt) (a watched "
        "loop finds it when an nn.Optimizer is called, or is held by the train cell or "
        "referred to by the jit step)"
    )


def find_optimizer(owner: Any) -> Any:
    """The optimizer (``collect.hooks.optimizer_bases``) a step's top-level object uses,
    or None.

    ``owner`` is what the watch saw start the step: a train cell (searched for an
    optimizer sub-cell), or a jit executor (its bound Cell, else the objects its
    function refers to by closure or global name, and those of the functions it refers
    to, three levels deep). Called on collected
    steps only, when the optimizer itself was not called from Python.

    None for a train cell holding a boost ``FreezeOpt`` (what ``Model(...,
    boost_level="O1"/"O2")`` builds): the update is done by one of its per-group copies,
    which the cell picks inside its graph by the train strategy, each with its own lr
    share and ``global_step``; the ``single_opt`` found under it never steps (its lr
    stays the schedule's first), so only the optimizer tap knows the step's lr.
    """
    from mindspore import nn

    def in_cell(cell: Any) -> Any:
        if is_optimizer(cell):
            return cell
        if isinstance(cell, nn.Cell):
            for _, sub in cell.cells_and_names():
                if _picks_in_graph(sub):
                    return None
                if is_optimizer(sub):
                    return sub
        return None

    found = in_cell(owner)
    if found is not None:
        return found
    found = in_cell(getattr(owner, "obj", None))
    if found is not None:
        return found
    return _referred(getattr(owner, "fn", None), in_cell, depth=3, seen=set())


def _picks_in_graph(cell: Any) -> bool:
    """Whether ``cell`` is a boost ``FreezeOpt``, whose train cell runs a different copy
    of the optimizer at each step (``find_optimizer``)."""
    try:
        from mindspore.boost import FreezeOpt
    except ImportError:  # a MindSpore without boost: no such cell
        return False
    return isinstance(cell, FreezeOpt)


def _referred(fn: Any, test: Callable[[Any], Any], depth: int, seen: set[int]) -> Any:
    """The first object ``test`` accepts among those ``fn`` refers to by closure or
    global name, and (``depth`` levels down) those the functions among them refer to:
    a step that calls a helper holding the optimizer (``apply(loss, grads)``)."""
    fn = getattr(fn, "__wrapped__", fn)
    code = getattr(fn, "__code__", None)
    if code is None or depth == 0 or id(fn) in seen:
        return None
    seen.add(id(fn))
    candidates = [c.cell_contents for c in (fn.__closure__ or ()) if closure_filled(c)]
    globals_ = getattr(fn, "__globals__", {})
    candidates += [globals_[n] for n in code.co_names if n in globals_]
    for obj in candidates:
        found = test(obj)
        if found is not None:
            return found
    for obj in candidates:
        found = _referred(obj, test, depth - 1, seen)
        if found is not None:
            return found
    return None
