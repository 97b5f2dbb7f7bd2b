"""Two or more optimizers stepping inside one call of the user's: which norm is whose.

The DCGAN tutorial's shape: one outer cell whose ``construct`` steps the discriminator's
train cell, then the generator's, called once per iteration (by hand, or by
``Model.train``). Inside one graph the optimizer tap stores each call's norm in a slot
with a fingerprint of what that optimizer updates (``collect.graph.fingerprint``: how
many gradients, their total size); in PyNative the watch sees each inner optimizer call
itself. Here the calls are given to the optimizers the outer cell holds, and become one
step's ``opt/<name>/...`` values (docs/ARCHITECTURE.md, Tags): one step is the call, one
iteration of the loop.

Where a call cannot be given to one optimizer (two that update the same number of
gradients of the same total size, an optimizer the cell does not hold), nothing is
given: the way in says so and records no loss, grad_norm or lr for the step.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from typing import Any

from msmon_nb.collect.gradsource import SEVERAL_UNTOLD
from msmon_nb.collect.graph import optimizer_key
from msmon_nb.collect.hooks import is_optimizer
from msmon_nb.collect.tensors import to_float

Calls = list[tuple[Any, list[float]]]  # (optimizer, its norms in this step), first first


def optimizers_held(owner: Any) -> list[Any]:
    """Every optimizer a train cell (or a jit step's bound cell) holds, in the order of
    its sub-cells: read only."""
    from mindspore import nn

    cell = owner if isinstance(owner, nn.Cell) else getattr(owner, "obj", None)
    if not isinstance(cell, nn.Cell):
        return []
    out: list[Any] = []
    for _, sub in cell.cells_and_names():
        if is_optimizer(sub) and not any(sub is o for o in out):
            out.append(sub)
    return out


def attribute(calls: Sequence[tuple[int, float]], candidates: Sequence[Any]) -> Calls | None:
    """Give each ``(fingerprint, norm)`` call to the one candidate optimizer with that
    fingerprint; None where one cannot be told (no candidate, or two share it)."""
    by_key: dict[int, Any] = {}
    for optimizer in candidates:
        key = optimizer_key(optimizer)
        if key in by_key:
            return None  # two optimizers of the same shape: which is which is unknown
        by_key[key] = optimizer
    given = [(by_key.get(key), norm) for key, norm in calls]
    if any(optimizer is None for optimizer, _ in given):
        return None
    return grouped(given)


def grouped(calls: Sequence[tuple[Any, float]]) -> Calls:
    """``(optimizer, norm)`` calls as each optimizer's norms, in the order they first
    stepped."""
    out: Calls = []
    for optimizer, norm in calls:
        for known, norms in out:
            if known is optimizer:
                norms.append(norm)
                break
        else:
            out.append((optimizer, [norm]))
    return out


def step_values(
    calls: Calls,
    names: Mapping[int, str],
    outputs: Any,
    lrs: Mapping[int, float | None],
) -> dict[str, float]:
    """The step's ``opt/<name>/...``: each optimizer's grad_norm (the largest where it
    stepped more than once), its lr as read before the step (``lrs``, by ``id``), and
    its loss where the call returned one scalar per optimizer, in the order they
    stepped (the tutorial's ``return netD_loss, netG_loss``)."""
    losses = _scalars(outputs)
    by_position = losses is not None and len(losses) == len(calls)
    out: dict[str, float] = {}
    for i, (optimizer, norms) in enumerate(calls):
        name = names[id(optimizer)]
        out[f"opt/{name}/grad_norm"] = max(norms)
        lr = lrs.get(id(optimizer))
        if lr is not None:
            out[f"opt/{name}/learning_rate"] = lr
        if by_position:
            out[f"opt/{name}/loss"] = losses[i]
    return out


def values_for(
    calls: Calls | None,
    count: int,
    outputs: Any,
    lrs: Mapping[int, float | None],
    namer: Callable[[list[Any]], Mapping[int, str]],
    warn: Callable[[str, str], None],
) -> dict[str, float]:
    """The step's ``opt/<name>/...`` from ``calls`` (None: they could not be told apart,
    ``count`` calls in all), said once to the user through ``warn(key, message)``."""
    if calls is None:
        why = "two optimizers it holds update as many gradients of the same size"
        note = SEVERAL_UNTOLD.format(calls=count, why=why)
        warn(note, note)
        return {}
    optimizers = [o for o, _ in calls]
    names = namer(optimizers)
    listed = ", ".join(names[id(o)] for o in optimizers)
    loss = (
        "its loss the call's output in that order"
        if losses_given(calls, outputs)
        else "no loss (the call does not return one scalar per optimizer)"
    )
    warn(
        "several inside",
        f"{len(optimizers)} optimizers step inside each call of this loop ({listed}): "
        "one step is one call, and each optimizer's grad_norm and learning_rate are "
        f"recorded as opt/<name>/..., with {loss}; train/loss, train/grad_norm and "
        "train/learning_rate are not recorded (they would mix networks). Name them with "
        "mon.watch(names={...})",
    )
    return step_values(calls, names, outputs, lrs)


def losses_given(calls: Calls, outputs: Any) -> bool:
    """Whether ``step_values`` gives each optimizer a loss from ``outputs``."""
    losses = _scalars(outputs)
    return losses is not None and len(losses) == len(calls)


def _scalars(outputs: Any) -> list[float] | None:
    if not isinstance(outputs, tuple | list) or not outputs:
        return None
    values = []
    for item in outputs:
        if int(getattr(item, "size", 0) or 0) != 1:
            return None
        value = to_float(item)
        if value is None:
            return None
        values.append(value)
    return values


def read_lrs(optimizers: Sequence[Any], read: Callable[[Any], float | None]) -> dict[int, float]:
    """Each optimizer's lr as its Parameters tell it (``values.read_lr``), by ``id``."""
    out = {}
    for optimizer in optimizers:
        lr = read(optimizer)
        if lr is not None:
            out[id(optimizer)] = lr
    return out
