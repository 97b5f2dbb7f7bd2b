"""What a user may change in a running training, and only when they ask: save a
checkpoint now, scale the learning rate.

The ways in tell the monitor what the loop trains (``trains``: the train network and
the optimizer, held weakly so the monitor keeps nobody's model alive). A lever acts on
those at a step boundary, where the command interpreter (``monitor.controls``) and the
alert actions call it, so it never races the step. The file and Parameter work itself
is collect's (``collect.checkpoint``, ``collect.lrscale``: MindSpore's own
``save_checkpoint``; an exact in-place scale or a refusal with nothing changed).
"""

from __future__ import annotations

import weakref
from collections.abc import Callable
from pathlib import Path
from typing import Any

from msmon_nb.collect import checkpoint as checkpoints
from msmon_nb.collect import lrscale
from msmon_nb.rundir import CHECKPOINTS


def _none() -> Any:
    return None


def _ref(obj: Any) -> Callable[[], Any]:
    """A weak reference to ``obj`` where it takes one, else a strong one."""
    try:
        return weakref.ref(obj)
    except TypeError:
        return lambda: obj


class Levers:
    """The train network and optimizer a run knows of, and what may be done to them."""

    def __init__(self) -> None:
        self._network: Callable[[], Any] = _none
        self._optimizer: Callable[[], Any] = _none

    def trains(self, network: Any = None, optimizer: Any = None) -> None:
        """Remember what the loop trains (either may be None: kept as it was)."""
        if network is not None and self._network() is not network:
            self._network = _ref(network)
        if optimizer is not None and self._optimizer() is not optimizer:
            self._optimizer = _ref(optimizer)

    def checkpoint(self, write_dir: Path | None, step: int | None) -> dict[str, Any]:
        """Save the known network and optimizer state into
        ``<write_dir>/checkpoints/step_<step>.ckpt``; ``{step, path, bytes, params,
        message}`` (``message``: the one sentence every road answers with: the panel,
        ``msmon ctl``, the viewer and the ``checkpoint`` alert action). ``ValueError``
        saying why when there is nowhere to save or nothing known."""
        if write_dir is None:
            raise ValueError("this run writes nothing to disk (disabled, or its dir failed)")
        if step is None:
            raise ValueError("no step has finished yet; checkpoint after the first step")
        path = write_dir / CHECKPOINTS / f"step_{step}.ckpt"
        params, size = checkpoints.save(self._network(), self._optimizer(), path)
        message = f"checkpoint of step {step} saved: {path} ({size / 1e6:.3g} MB)"
        return {
            "step": step,
            "path": str(path),
            "bytes": size,
            "params": params,
            "message": message,
        }

    def scale_lr(self, factor: float) -> str:
        """Multiply the known optimizer's lr by ``factor`` from the next step on, where
        that is exact; what changed. ``ValueError`` saying why not (nothing changed)."""
        done = lrscale.scale_lr(self._optimizer(), factor)
        _, before, after, entries = done[0]
        whole = f" (the whole {entries}-entry list)" if entries > 1 else ""
        groups = f" ({len(done)} lr Parameters)" if len(done) > 1 else ""
        return f"lr x{factor:g}: {before:.6g} -> {after:.6g}{whole}{groups} from the next step on"


def recorded(saved: dict[str, Any]) -> dict[str, Any]:
    """What an intervention record keeps of a saved checkpoint (the viewer lists it)."""
    return {"path": saved["path"], "bytes": saved["bytes"]}
