"""``lr xF``: scale an optimizer's learning rate in place, where that is exact.

Two lr forms are Parameters MindSpore reads at every update, so multiplying them by F
changes the lr from the next step on and nothing else: a constant lr (a float lr, each
group's in a grouped optimizer, ``mindspore.experimental.optim``'s ``lrs``) and a list
schedule (``learning_rate=[...]``: ``_IteratorLearningRate`` gathers from a Parameter
at ``global_step``; the whole list is scaled, so the rest of the schedule keeps its
shape). A ``LearningRateSchedule`` cell is the user's code: scaling what it returns
would mean changing that code, so it is refused, as is any form not recognised. Every
group is checked before any is changed, so a refusal has no partial effect.

An in-place ``ops.assign`` at a step boundary is the only write (``set_data`` is not
seen by a graph compiled before it); the lr tap and
``collect.values.read_lr`` then read the new value (the list cache is dropped here).
Scaling by a power of two and back (``lr x0.5``, then ``lr x2``) is exact in binary
floating point; other factors may leave the last bit changed.
"""

from __future__ import annotations

from typing import Any

from msmon_nb.collect.active import quiet
from msmon_nb.collect.tensors import to_numpy
from msmon_nb.collect.values import forget_schedule, read_global_step


class CannotScale(ValueError):
    """This optimizer's lr cannot be scaled exactly; the text says why."""


def lr_parameters(optimizer: Any) -> list[Any]:
    """The Parameters holding ``optimizer``'s lr (one per group), each once; raises
    ``CannotScale`` naming the first form that is not a Parameter or a list schedule."""
    if optimizer is None:
        raise CannotScale(
            "no optimizer is known to this monitor: pass optimizer= to mon.step "
            "(e.g. mon.step(loss=l, optimizer=opt)), or monitor with mon.watch() / "
            "%%msmonitor or Model.train with mon.callback()"
        )
    if hasattr(optimizer, "param_groups") and not hasattr(optimizer, "learning_rate"):
        raise CannotScale(
            f"{type(optimizer).__name__} is a torch-style optimizer (MindNLP's mindtorch): its "
            "lr is param_groups[i]['lr'], which a torch scheduler (transformers' LambdaLR) "
            "sets again at its next step, so a scaled lr would not last; scale it in your "
            "schedule. Nothing was changed"
        )
    lrs = getattr(optimizer, "lrs", None)  # mindspore.experimental.optim, mint.optim
    if isinstance(lrs, list | tuple) and lrs:
        forms = list(lrs)
    else:
        lr = getattr(optimizer, "learning_rate", None)
        forms = list(lr) if getattr(optimizer, "is_group_lr", False) else [lr]
    out: list[Any] = []
    for i, form in enumerate(forms):
        param = _parameter_of(form)
        if param is None:
            group = f" (group {i})" if len(forms) > 1 else ""
            raise CannotScale(
                f"{type(optimizer).__name__}'s lr{group} is a {type(form).__name__}, "
                "computed by code (a LearningRateSchedule): scaling it exactly would change "
                "that code; only a constant lr or a list (learning_rate=[...]) is scaled. "
                "Nothing was changed"
            )
        if all(param is not p for p in out):
            out.append(param)
    return out


def _parameter_of(form: Any) -> Any:
    """The Parameter an lr form is read from: itself (a constant), the table of a list
    schedule (``_IteratorLearningRate.learning_rate``), or the constant a grouped
    optimizer with a dynamic group wraps (``_ConvertToCell.learning_rate``); None for
    anything else."""
    if type(form).__name__ in ("_IteratorLearningRate", "_ConvertToCell"):
        form = getattr(form, "learning_rate", None)
    if type(form).__name__ == "Parameter" or (
        hasattr(form, "set_data") and hasattr(form, "asnumpy") and hasattr(form, "name")
    ):
        return form
    return None


def scale_lr(optimizer: Any, factor: float) -> list[tuple[str, float, float, int]]:
    """Multiply every lr Parameter of ``optimizer`` by ``factor`` (checked all first:
    ``CannotScale`` changes nothing); ``[(name, before, after, entries)]``: the lr the
    next update would have used and will use, ``entries`` > 1 for a list schedule (its
    entry at the optimizer's ``global_step``, a Parameter read: the list's first value
    would tell a user of a warmup nothing about the lr in use)."""
    import mindspore

    params = lr_parameters(optimizer)
    step = read_global_step(optimizer)
    done = []
    with quiet():  # our framework calls are no step of the user's
        for param in params:
            before = to_numpy(param).copy()  # may share the Parameter's memory
            after = (before * before.dtype.type(factor)).astype(before.dtype)
            # in place on the device (as MindSpore's own LearningRateScheduler does):
            # set_data would give the Parameter new memory, which a graph compiled
            # before keeps not reading
            mindspore.ops.assign(param, mindspore.Tensor(after, dtype=param.dtype))
            forget_schedule(param)
            size = before.size
            at = min(max(step or 0, 0), size - 1)  # past the end: its last entry
            was, now = before.reshape(-1)[at], after.reshape(-1)[at]
            done.append((param.name, float(was), float(now), int(size)))
    return done
