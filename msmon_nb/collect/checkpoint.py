"""``checkpoint``: the network and optimizer state saved with MindSpore's own
``save_checkpoint``, at a step boundary, into the run.

What is saved is what the way in knows it trains, reached without calling user code:
``Model.train``'s train network (its network and optimizer are sub-cells: every weight,
buffer, moment, ``global_step`` and lr), or for a watched loop the optimizer the watch
saw (its Parameters are the net's trainable weights and its own state) plus the train
cell it ran, when the loop calls one. The names are MindSpore's own Parameter names, so
``mindspore.load_checkpoint`` + ``load_param_into_net`` put them back into a fresh net
and a fresh optimizer, which then continue exactly where the run was. Saving reads the
Parameters (``asnumpy``); it writes none.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

from msmon_nb.collect.active import quiet


class NothingToSave(ValueError):
    """No network or optimizer is known: the text says how to make one known."""


NOTHING = (
    "nothing known to save: this loop records with mon.step(...) and passed no optimizer; "
    "pass optimizer= to mon.step (e.g. mon.step(loss=l, optimizer=opt)), or monitor it "
    "with mon.watch() / %%msmonitor or Model.train with mon.callback()"
)


def parameters_of(network: Any, optimizer: Any) -> list[Any]:
    """Every Parameter of ``network`` and ``optimizer`` (either may be None), each once,
    by its own name: the optimizer's ``parameters`` are the net's weights, seen twice.
    Our own taps' scalars (``msmon_...``, ``collect.graph.tap_scalar``) are no state of
    the model's and are left out."""
    seen: dict[str, Any] = {}
    for owner in (network, optimizer):
        if owner is None:
            continue
        if not hasattr(owner, "parameters_and_names"):  # a torch-style optimizer's
            raise NothingToSave(
                f"{type(owner).__name__} is not a MindSpore Cell or optimizer (a torch-style "
                "one: MindNLP's mindtorch): save it your framework's way, e.g. "
                "trainer.save_model() or torch.save(optimizer.state_dict(), path)"
            )
        for _, param in owner.parameters_and_names():
            if not param.name.startswith("msmon_"):
                seen.setdefault(param.name, param)
    return list(seen.values())


def save(network: Any, optimizer: Any, path: Path) -> tuple[int, int]:
    """Save ``network``'s and ``optimizer``'s Parameters to ``path`` (written to a
    temporary name, then renamed: a half-written file never looks like a checkpoint);
    ``(parameters, bytes)``. ``NothingToSave`` when both are None."""
    import mindspore

    params = parameters_of(network, optimizer)
    if not params:
        raise NothingToSave(NOTHING)
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.stem}.{os.getpid()}.ckpt")
    items = [{"name": p.name, "data": p} for p in params]
    with quiet():  # our framework calls are no step of the user's
        mindspore.save_checkpoint(items, str(tmp))
    tmp.replace(path)
    return len(params), path.stat().st_size
