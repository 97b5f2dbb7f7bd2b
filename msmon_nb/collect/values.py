"""Turn what a training step produced into the scalars of one collected step.

Everything here runs only on collected steps; on the others nothing is converted or
synchronised with the device.
"""

from __future__ import annotations

import math
import os
import re
from collections.abc import Iterable, Mapping, Sequence
from typing import TYPE_CHECKING, Any

from msmon_nb.collect.devnorm import launch_global_norm
from msmon_nb.collect.gradsource import GradSeen
from msmon_nb.collect.tensors import flatten_tensors, to_float, to_numpy
from msmon_nb.collect.unscale import received_factor, undo_rule
from msmon_nb.config import MonitorConfig, suggest_tag
from msmon_nb.metrics.extent import tensor_extent
from msmon_nb.metrics.norms import global_norm

if TYPE_CHECKING:
    from msmon_nb.collect.devnorm import DeferredNorm
    from msmon_nb.collect.recorder import StepInputs


def read_lr(optimizer: Any) -> float | None:
    """The optimizer's learning rate for its current step (first group when grouped),
    read from its Parameters alone: None where only running its code would tell.

    Never calls ``get_lr()`` or a schedule cell: ``get_lr()`` can move state (MindCV's
    AdamW, Lion, NAdam and Adan advance ``global_step`` in it) and a schedule is the
    user's code (docs/ARCHITECTURE.md, "Monitoring never touches training"). What is
    read: an lr Parameter (a float
    lr, a group's, one the user sets by hand; ``mindspore.experimental.optim``'s
    ``lrs``), or a list schedule looked up at ``global_step`` (``_listed_lr``). Any
    other form (a ``LearningRateSchedule``) is read where the optimizer computes it, by
    the optimizer tap (``collect.graph``); ``lr_on_host`` tells the two apart.
    """
    first = _first_lr(optimizer)
    if not _readable(optimizer, first):
        return None
    if getattr(optimizer, "dynamic_lr", False):
        return _listed_lr(optimizer, first)
    return to_float(first)


def lr_in_graph(optimizer: Any) -> bool:
    """Whether the optimizer tap sees this optimizer's lr: its class computes it with a
    ``get_lr()`` (``nn.Optimizer``'s, a suite's), which the tap wraps. The experimental
    API's optimizers read per-group lr Parameters in their update instead: only the host
    reads those (``read_lr``)."""
    return callable(getattr(type(optimizer), "get_lr", None))


def lr_on_host(optimizer: Any) -> bool:
    """Whether ``read_lr`` can read this optimizer's lr (an lr Parameter or a list
    schedule), rather than only its own ``get_lr()`` inside its update."""
    return _readable(optimizer, _first_lr(optimizer))


def _readable(optimizer: Any, first: Any) -> bool:
    """``lr_on_host`` for the first-group lr ``first`` (``_first_lr``) it looked up."""
    if first is None:
        return False
    if getattr(optimizer, "dynamic_lr", False):
        return type(first).__name__ == "_IteratorLearningRate" and hasattr(first, "learning_rate")
    return hasattr(first, "asnumpy") and int(getattr(first, "size", 0) or 0) == 1


def _first_lr(optimizer: Any) -> Any:
    """The first group's lr as the optimizer holds it: a Parameter or a schedule cell."""
    lrs = getattr(optimizer, "lrs", None)  # mindspore.experimental.optim, mint.optim
    if isinstance(lrs, list | tuple) and lrs:
        return lrs[0]
    lr = getattr(optimizer, "learning_rate", None)
    if getattr(optimizer, "is_group_lr", False):
        try:
            return lr[0]
        except (TypeError, IndexError):
            return None
    return lr


# schedule Parameter -> its values on the host, for the list schedules _listed_lr reads
_SCHEDULES: dict[int, tuple[Any, Any]] = {}


def _listed_lr(optimizer: Any, cell: Any) -> float | None:
    """The lr of a list schedule (``learning_rate=[...]``, e.g. ``nn.warmup_lr`` or
    ``nn.cosine_decay_lr``), looked up on the host: ``schedule[global_step]``.

    MindSpore keeps such a schedule as ``_IteratorLearningRate``, a gather over a
    Parameter indexed by ``global_step``, and computes it as ``get_lr()`` does (MindCV's
    own ``get_lr`` too: it reads ``global_step``, then moves it). Read before the
    update, ``global_step`` is the index the update uses. The schedule's values are read
    once (MindSpore never writes them; ``lr xF`` does, and says so through
    ``forget_schedule``): about 15 us a read, against 0.67 ms for a
    ``get_lr()`` graph launch under GRAPH_MODE. None past the schedule's end (where the
    optimizer itself would fail).
    """
    table = cell.learning_rate
    known = _SCHEDULES.get(id(table))
    if known is None or known[0] is not table:
        known = (table, to_numpy(table).reshape(-1))
        _SCHEDULES[id(table)] = known
    step = to_float(optimizer.global_step)
    if step is None:
        return None
    values, step = known[1], int(step)
    return float(values[step]) if 0 <= step < len(values) else None


def forget_schedule(table: Any) -> None:
    """Drop the cached values of a list schedule's Parameter: ``lr xF``
    (``collect.lrscale``) just wrote it, so the next ``_listed_lr`` reads it again."""
    _SCHEDULES.pop(id(table), None)


def cell_loss_scale(cell: Any) -> float | None:
    """The loss scale a train cell applies to this step's gradients: ``scale_sense``
    (``TrainOneStepWithLossScaleCell`` and its subclasses: MindCV, MindOCR, MindFormers)
    or ``sens`` (``TrainOneStepCell(sens=...)``, which ``Model`` builds for
    ``FixedLossScaleManager(drop_overflow_update=False)``); None for other cells."""
    if cell is None:
        return None
    scale = getattr(cell, "scale_sense", None)
    if scale is not None and hasattr(scale, "asnumpy"):
        return to_float(scale)
    if getattr(cell, "sense_flag", False) and isinstance(getattr(cell, "sens", None), int | float):
        return float(cell.sens)
    return None


def scaled_by_cell(cell: Any) -> float | None:
    """The loss scale a train cell leaves in the gradients it hands its optimizer:
    ``sens`` of MindSpore's ``TrainOneStepCell`` (what ``Model`` builds for
    ``FixedLossScaleManager(S, drop_overflow_update=False)``), whose ``construct`` seeds
    the backward with it and never divides it out; None for every other cell (those
    that scale, unscale too, or are not known to leave it)."""
    if cell is None or not getattr(cell, "sense_flag", False):
        return None
    from mindspore import nn

    if getattr(type(cell), "construct", None) is not nn.TrainOneStepCell.construct:
        return None
    sens = getattr(cell, "sens", None)
    return float(sens) if isinstance(sens, int | float) and sens not in (0, 1) else None


def unscale_received(
    seen: GradSeen, optimizer: Any, multiply: bool, warn: Any, cell: Any = None
) -> None:
    """Bring ``seen.received`` (what ``optimizer`` received) to the unscaled gradient.

    Where the train ``cell`` is known to leave its scale S in the gradients
    (``scaled_by_cell``), the gradient is what it received over S, whatever the
    optimizer does; where its own undo (``unscale.received_factor``) is not 1/S, its
    update applies the gradients scaled, and ``warn`` says so. Otherwise the optimizer's
    own undo is the one, as its code does it (1 for most). ``multiply``: a norm taken in
    Python (raw); else the tap's, which multiplied inside the graph
    (``UndoRule.tapped``). Where no factor can be proven the value is dropped;
    ``warn(key, message)`` (the recorder's ``warn_once``) says why."""
    if seen.received is None or optimizer is None:
        return
    factor, note = received_factor(optimizer, to_float)
    carried = scaled_by_cell(cell)
    if carried is not None:
        raw = 1.0 if multiply else undo_rule(type(optimizer)).tapped(optimizer, to_float)
        ratio = 1.0 / (raw * carried)
        if factor is None or not math.isclose(factor * carried, 1.0, rel_tol=1e-6):
            applies = "an unknown multiple" if factor is None else f"{factor * carried:g}x"
            note = (
                f"the train cell scales the loss by {carried:g} and leaves the scale in the "
                f"gradients, but {type(optimizer).__name__} does not divide by it (make it "
                f"with loss_scale={carried:g}): its update applies {applies} the loss's own "
                "gradient; train/grad_norm is recorded unscaled"
            )
    elif factor is None:
        seen.received = seen.received_each = None
        ratio = 1.0
    else:
        ratio = factor if multiply else 1.0
    if note is not None:
        warn(note, note)
    if seen.received is not None and ratio != 1.0:
        seen.received *= ratio
        if seen.received_each is not None:
            seen.received_each = seen.received_each * ratio


def norm_now(grads: Any) -> float | None:
    """The global norm of ``grads`` (any nesting of tensors), read at once: on the host
    where that is fastest, else reduced on the device (``norm_on_device``)."""
    leaves = flatten_tensors(grads)
    if not leaves:
        return None
    if norm_on_device(leaves):
        return device_global_norm(leaves)
    return global_norm(to_numpy(g) for g in leaves)


def read_global_step(optimizer: Any) -> int | None:
    """The optimizer's ``global_step`` counter, if it has one."""
    counter = getattr(optimizer, "global_step", None)
    value = to_float(counter) if counter is not None else None
    return None if value is None else int(value)


def param_tag(name: str) -> str:
    """A tag-rule spelling of a parameter name (``fc1.Weight`` -> ``fc1.weight``)."""
    return suggest_tag(name.replace("/", "."))


def param_names(params: Sequence[Any] | None, n: int) -> list[str]:
    """The names of ``n`` gradients: their parameters' (``params`` in the gradients'
    order, as an optimizer and ``value_and_grad`` over its parameters give them), else
    ``grad_<i>`` when there are none or their count differs."""
    if params is not None and len(params) == n:
        return [str(getattr(p, "name", f"grad_{i}")) for i, p in enumerate(params)]
    return [f"grad_{i}" for i in range(n)]


def param_stats(
    names: Sequence[str],
    weights: Sequence[Any] | None,
    grads: Sequence[Any] | None,
    targets: Iterable[str],
    grad_scale: float = 1.0,
    measured: Mapping[str, float] | None = None,
    kinds: Sequence[str] = ("norm",),
) -> dict[str, float]:
    """``param/<name>/weight_<kind>`` and ``.../grad_<kind>`` for names matching
    ``targets``, one per statistic in ``kinds`` (``metrics.extent``: ``norm`` alone
    unless ``param_stat_kinds`` asks for more). A gradient's norm and max |x| are divided
    by ``grad_scale`` (the loss scale still in them); its zero share and non-finite count
    are the gradient's as produced. ``measured``: name -> gradient norm already unscaled,
    where no gradient reached the host (a graph step: the optimizer tap's per-gradient
    norms, ``gradsource.param_norms``); only the norm is measured there."""
    patterns = [re.compile(t) for t in targets]
    out: dict[str, float] = {}
    for i, name in enumerate(names):
        if not any(p.search(name) for p in patterns):
            continue
        tag = param_tag(name)
        if weights is not None and i < len(weights):
            for kind, value in tensor_extent(to_numpy(weights[i]), kinds).items():
                out[f"param/{tag}/weight_{kind}"] = value
        if grads is not None and i < len(grads):
            for kind, value in tensor_extent(to_numpy(grads[i]), kinds).items():
                scaled = kind in ("norm", "max_abs")
                out[f"param/{tag}/grad_{kind}"] = value / grad_scale if scaled else value
        elif measured is not None and name in measured and "norm" in kinds:
            out[f"param/{tag}/grad_norm"] = float(measured[name])
    return out


def norm_on_device(leaves: Sequence[Any]) -> bool:
    """Where the global norm is computed: ``MSMON_GRAD_NORM_PATH=device|host`` decides,
    else the device when the gradients are MindSpore tensors on an accelerator.

    On CPU the host path is fastest (``asnumpy`` shares memory; a BLAS dot per
    gradient). On Ascend/GPU it would copy every gradient over the bus, O(parameters)
    bytes, so there the reduction runs where the gradients live and one scalar is copied.
    """
    forced = os.environ.get("MSMON_GRAD_NORM_PATH", "").strip().lower()
    if forced in ("device", "host"):
        return forced == "device" and hasattr(leaves[0], "asnumpy")
    if not hasattr(leaves[0], "asnumpy"):
        return False
    import mindspore as ms

    return ms.get_context("device_target") != "CPU"


def device_global_norm(leaves: Sequence[Any]) -> float:
    """sqrt(sum ||g||^2) reduced on the device in one launch (float32); read at once.

    The Monitor does not call this: it launches with ``collect.devnorm`` and reads one
    step late (see there). This is for callers that need the value now.
    """
    return float(to_float(launch_global_norm(leaves)))


# the tag each core metric is recorded under
TAGS = {
    "loss": "train/loss",
    "grad_norm": "train/grad_norm",
    "learning_rate": "train/learning_rate",
    "throughput": "train/throughput",
    "step_time": "train/step_time",
    "global_step": "train/global_step",
}


def step_values(
    config: MonitorConfig,
    inputs: StepInputs,
    step: int,
    step_time: float | None = None,
    samples: int = 0,
    deferred: DeferredNorm | None = None,
) -> dict[str, float]:
    """The ``train/...`` (and opt-in ``param/...``, ``sys/...``) scalars of step ``step``.

    On the device path with ``deferred`` given, grad_norm is launched but not read: it
    is left in ``deferred`` for ``step`` and recorded there one step later (the read
    then does not stall the step; see ``collect.devnorm``). The gradients' norms are
    divided by ``inputs.grad_scale`` (the loss scale still in them); a ``grad_norm``
    given is taken as it is. ``train/global_step`` is ``inputs.global_step``, else
    ``step``.
    """
    loss, grads, grad_norm, lr = inputs.loss, inputs.grads, inputs.grad_norm, inputs.lr
    grad_scale, params = inputs.grad_scale, inputs.params
    global_step = step if inputs.global_step is None else inputs.global_step
    tracks = config.tracks
    values: dict[str, float] = {}
    if tracks("loss") and loss is not None:
        value = to_float(loss[0] if isinstance(loss, tuple | list) else loss)
        if value is not None:
            values[TAGS["loss"]] = value
    leaves = flatten_tensors(grads) if grads is not None else None
    if tracks("grad_norm"):
        if grad_norm is not None:
            values[TAGS["grad_norm"]] = float(to_float(grad_norm))
        elif leaves:
            if not norm_on_device(leaves):
                values[TAGS["grad_norm"]] = global_norm(to_numpy(g) for g in leaves) / grad_scale
            elif deferred is not None:
                norm = launch_global_norm(leaves)
                deferred.put(step, norm / grad_scale if grad_scale != 1.0 else norm)
            else:
                values[TAGS["grad_norm"]] = device_global_norm(leaves) / grad_scale
    if tracks("learning_rate") and lr is not None:
        value = to_float(lr)
        if value is not None:
            values[TAGS["learning_rate"]] = value
    if step_time is not None and step_time > 0:
        if tracks("step_time"):
            values[TAGS["step_time"]] = step_time
        if tracks("throughput") and samples:
            values[TAGS["throughput"]] = samples / step_time
            if config.throughput_baseline:
                # this rank's samples/s over the per-device baseline, i.e. the job's
                # throughput / (baseline x ranks): MindFormers' throughput_linearity
                values["train/linearity"] = samples / step_time / config.throughput_baseline
    if tracks("global_step") and global_step is not None:
        values[TAGS["global_step"]] = float(global_step)
    if tracks("param_stats") and params:
        names = [getattr(p, "name", f"param_{i}") for i, p in enumerate(params)]
        measured = None
        if leaves is None and inputs.param_norms is not None:
            measured = dict(zip(*inputs.param_norms, strict=True))
        values.update(
            param_stats(
                names,
                params,
                leaves,
                config.param_targets,
                grad_scale,
                measured,
                config.param_stat_kinds,
            )
        )
    if tracks("system"):
        from msmon_nb.collect.system import system_metrics

        values.update(system_metrics())
    return values
