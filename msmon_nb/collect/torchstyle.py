"""Torch-style training on MindSpore (MindNLP's ``mindtorch``, transformers' ``Trainer``):
its optimizer updates, learning rate and gradient clipping, as ``mon.watch()`` sees them.

Under MindNLP the gradients still come from a ``mindspore.value_and_grad`` (the Trainer's
``training_step`` as MindNLP replaces it, or a hand loop), which the watch sees as usual;
but the update is a torch-style optimizer's ``step()``, not an ``nn.Optimizer`` call, its
lr lives in ``param_groups`` (moved between updates by transformers' ``LambdaLR``), and
clipping is ``clip_grad_norm_`` on the parameters' ``.grad``. So (docs/ARCHITECTURE.md,
Tags):

* one step is one optimizer update: torch's global step pre/post hooks
  (``hooks.torch_style``) begin and end it where the watch's ``nn.Optimizer`` hook does,
  so the micro-batches of gradient accumulation join the update that applies them, and
  two or more optimizers make parts of one iteration (``collect.parts``) the same way;
* ``train/learning_rate`` is ``param_groups[0]["lr"]``, read just before the update
  (the first group's where groups differ, as ``values.read_lr``); no scheduler is called;
* ``clip_grad_norm_`` is wrapped: the total norm it returns is the gradient's before
  clipping (the accumulated one: it clips ``.grad``), and ``train/grad_norm_clipped`` is
  that norm times the factor it applied, ``min(1, max_norm / (norm + 1e-6))`` as its
  code computes it: no norm is taken again, nothing is clipped again. Without a clip,
  the accumulated gradient is the parameters' ``.grad`` as ``step()`` receives them;
* the loss of an update that accumulated is the sum of the micro-batch losses the grad
  function returned: the loss whose gradient the update applies. The Trainer (and the
  usual torch recipe) divides each by the accumulation steps, so this is the mean of
  the micro-batch losses, which is what the Trainer logs.

What cannot be read is not recorded, and one warning names it: an lr that is not one
number; a clip whose norm is not the update's whole L2 norm (another ``norm_type``,
another set of parameters, several clip calls before one update); a skip that cannot
hold back a torch-style update.

The hooks act on the watch's step bookkeeping (``collect.watch``), which hands itself
in; nothing here imports MindNLP (``hooks.torch_style`` finds it in ``sys.modules``).
"""

from __future__ import annotations

import math
import sys
from dataclasses import dataclass, field
from typing import Any

from msmon_nb.collect.gradsource import GradSeen
from msmon_nb.collect.hooks import TORCH_OPTIMIZER, original, torch_style
from msmon_nb.collect.tensors import to_float

# what mindtorch's clip_grad_norm_ (as torch's) adds to the norm it divides max_norm by
EPS = 1e-6

LR_UNREAD = (
    "train/learning_rate is not recorded: {cls}.param_groups[0]['lr'] is {kind}, not one "
    "number; record it with mon.step(lr=...) or mon.log"
)
SEVERAL_CLIPS = (
    "clip_grad_norm_ was called {n} times before one optimizer update: which call saw the "
    "update's whole gradient before clipping is unknown, so train/grad_norm_clipped is not "
    "recorded{accumulated}; clip once, right before optimizer.step()"
)
NORM_TYPE = (
    "clip_grad_norm_ clips by the {p}-norm: its norm is not train/grad_norm (an L2 norm), "
    "so train/grad_norm_clipped is not recorded{accumulated}"
)
OTHER_PARAMS = (
    "clip_grad_norm_ clips other parameters than the optimizer updates ({clipped} with a "
    "gradient against {updated}): its norm is not the update's gradient norm, so "
    "train/grad_norm_clipped is not recorded{accumulated}"
)
ACCUMULATED = (
    ", and neither is train/grad_norm on updates that accumulate micro-batches (the "
    "accumulated gradient is seen only after that clip)"
)
NO_SKIP = (
    "alerts ask for action: skip, but a torch-style optimizer's step() ({cls}) cannot be "
    "held back from outside: its updates are not skipped (the alert is still raised)"
)


def imported() -> bool:
    """Whether the process has imported mindtorch (MindNLP): a dict lookup, asked at each
    step's begin until it has."""
    return TORCH_OPTIMIZER in sys.modules


def is_torch_optimizer(obj: Any) -> bool:
    """Whether ``obj`` is one of mindtorch's optimizers (where mindtorch is imported)."""
    base = getattr(sys.modules.get(TORCH_OPTIMIZER), "Optimizer", None)
    return isinstance(base, type) and isinstance(obj, base)


@dataclass
class ClipCall:
    """One collected ``clip_grad_norm_`` call."""

    norm: Any  # the total norm it returned (a tensor; read when the step ends)
    max_norm: float | None
    norm_type: float | None
    params: frozenset[int] | None  # ids of the parameters with a gradient it clipped


@dataclass
class Update:
    """What one torch-style update showed; values only on collected steps."""

    optimizer: Any
    top: bool  # called from the user's code (not from inside a framework call of ours)
    collect: bool
    lr: float | None = None
    grads: list[Any] | None = None  # each parameter's ``.grad`` as step() received it
    params: frozenset[int] = frozenset()  # ids of the parameters with a gradient
    clips: list[ClipCall] = field(default_factory=list)
    clip_calls: int = 0  # counted on every step


def read_torch_lr(optimizer: Any) -> tuple[float | None, str | None]:
    """``(lr, None)`` from ``param_groups[0]["lr"]`` (a number or a one-element tensor,
    as LambdaLR and a user set it), else ``(None, what it is)``."""
    groups = getattr(optimizer, "param_groups", None)
    first = groups[0] if isinstance(groups, list | tuple) and groups else None
    lr = first.get("lr") if isinstance(first, dict) else None
    if isinstance(lr, int | float) and not isinstance(lr, bool):
        return float(lr), None
    if hasattr(lr, "shape") and int(getattr(lr, "size", 0) or 0) == 1:
        return to_float(lr), None
    return None, "missing" if lr is None else f"a {type(lr).__name__}"


def received(optimizer: Any) -> tuple[list[Any], frozenset[int]]:
    """The gradients ``step()`` is about to apply (each parameter's ``.grad``, held as
    references: step() reads them, never writes them) and their parameters' ids."""
    grads, ids = [], set()
    for group in optimizer.param_groups:
        for param in group["params"]:
            grad = getattr(param, "grad", None)
            if grad is not None:
                grads.append(grad)
                ids.add(id(param))
    return grads, frozenset(ids)


def clip_reading(update: Update) -> tuple[float | None, float | None, str | None]:
    """``(norm before clipping, clipped norm, why not)`` from an update's clip calls;
    all None where it made none."""
    if update.clip_calls == 0:
        return None, None, None
    accumulated = ACCUMULATED
    if update.clip_calls > 1 or len(update.clips) != 1:
        return None, None, SEVERAL_CLIPS.format(n=update.clip_calls, accumulated=accumulated)
    clip = update.clips[0]
    if clip.norm_type != 2.0:
        return None, None, NORM_TYPE.format(p=clip.norm_type, accumulated=accumulated)
    if clip.params is not None and clip.params != update.params:
        return (
            None,
            None,
            OTHER_PARAMS.format(
                clipped=len(clip.params), updated=len(update.params), accumulated=accumulated
            ),
        )
    norm = to_float(clip.norm)
    if norm is None or clip.max_norm is None:
        return None, None, None
    if not math.isfinite(norm):  # its factor is 0 or nan: the clipped values are nan
        return norm, None, None
    return norm, norm * min(1.0, clip.max_norm / (norm + EPS)), None


def step_loss(losses: list[Any], last: Any) -> float | None:
    """The loss of an update over ``losses`` then ``last`` (the grad function's outputs,
    a tuple's first item where it returns more): their sum (module docstring)."""
    total = 0.0
    for loss in [*losses, last]:
        if isinstance(loss, tuple | list):
            loss = loss[0] if loss else None
        value = to_float(loss)
        if value is None:
            return None
        total += value
    return total


def _arg(args: tuple, kwargs: dict, index: int, name: str, default: Any) -> Any:
    return args[index] if len(args) > index else kwargs.get(name, default)


class TorchStyle:
    """The torch-style ways in of one watch: registered on ``attach`` (at the watch's
    start, or at its first framework call once the loop has imported MindNLP), undone
    on ``detach``. ``update`` is what the last update showed, for the watch's step end."""

    def __init__(self, watch: Any) -> None:
        self.watch = watch
        self.attached = False
        self._handles: list[Any] = []
        self._replaced: list[tuple[Any, str, Any, Any]] = []  # (module, name, old, ours)
        self._running: list[Update | None] = []  # step() calls under way (None: nested)
        self._clips: list[ClipCall] = []
        self._clip_calls = 0

    # --- attaching ----------------------------------------------------------------------

    def attach(self) -> bool:
        """Register the step hooks and wrap ``clip_grad_norm_``, where mindtorch is
        imported; False where it is not (yet). Cheap then: the watch asks at each step
        begin until the loop has imported it."""
        if self.attached:
            return True
        if not imported():
            return False
        way = torch_style()
        if not way.available:
            return False
        pre, post, *clips = way.targets
        self._handles.append(original(pre)(self._pre))
        self._handles.append(original(post)(self._post))
        functions = {id(original(t)): original(t) for t in clips}
        for function in functions.values():
            self._wrap_everywhere(function)
        self.attached = True
        return True

    def _wrap_everywhere(self, function: Any) -> None:
        """Replace ``function`` in every module that holds it (mindtorch's, a user's
        ``from torch.nn.utils import clip_grad_norm_`` in ``__main__``): callers look it
        up there at each call (``torch.nn.utils`` is a proxy that reads mindtorch's)."""
        ours = self._clip(function)
        for module in list(sys.modules.values()):
            space = getattr(module, "__dict__", None)
            if not isinstance(space, dict):
                continue
            for name in ("clip_grad_norm_", "clip_grad_norm"):
                if space.get(name) is function:
                    setattr(module, name, ours)
                    self._replaced.append((module, name, function, ours))

    def detach(self) -> None:
        """Undo ``attach``: a name the user rebound meanwhile is left as they set it."""
        for handle in self._handles:
            handle.remove()
        self._handles.clear()
        for module, name, old, ours in reversed(self._replaced):
            if getattr(module, "__dict__", {}).get(name) is ours:
                setattr(module, name, old)
        self._replaced.clear()
        self._running.clear()
        self.attached = False

    # --- the hooks ----------------------------------------------------------------------

    def _clip(self, function: Any) -> Any:
        def clip_grad_norm_(parameters, *args, **kwargs):
            watch = self.watch
            if not self.attached or watch.busy() or self._running:
                return function(parameters, *args, **kwargs)
            params = None
            if watch.collect:
                if not hasattr(parameters, "shape"):  # an iterable (a generator) of them
                    parameters = list(parameters)  # the clip iterates it once, as before
                params = watch.monitor.guard(
                    "reading what clip_grad_norm_ clips", _with_grad, parameters
                )
            out = function(parameters, *args, **kwargs)
            self._clip_calls += 1  # (one that raised clipped nothing: error_if_nonfinite)
            if watch.collect:
                max_norm = _number(_arg(args, kwargs, 0, "max_norm", None))
                norm_type = _number(_arg(args, kwargs, 1, "norm_type", 2.0))
                self._clips.append(ClipCall(out, max_norm, norm_type, params))
            return out

        clip_grad_norm_.__wrapped__ = function  # type: ignore[attr-defined]
        clip_grad_norm_.__doc__ = function.__doc__
        return clip_grad_norm_

    def _pre(self, optimizer: Any, args: tuple, kwargs: dict) -> None:
        watch = self.watch
        if any(u is not None and u.optimizer is optimizer for u in self._running):
            self._running.clear()  # a step() of it that raised: its post hook never ran
        if watch.busy() or self._running:
            self._running.append(None)  # inside another step() (a wrapper's): not a step
            return
        top = watch.update_begins()
        update = Update(optimizer, top, watch.collect, clip_calls=self._clip_calls)
        update.clips, self._clips, self._clip_calls = self._clips, [], 0
        rec = watch.monitor
        if update.collect:
            if rec.config.tracks("learning_rate"):
                got = rec.guard("reading param_groups' lr", read_torch_lr, optimizer)
                if got is not None:
                    update.lr, kind = got
                    if kind is not None:
                        cls = type(optimizer).__name__
                        rec.warn_once("torch lr", LR_UNREAD.format(cls=cls, kind=kind))
            got = rec.guard("reading the gradients step() applies", received, optimizer)
            if got is not None:
                update.grads, update.params = got
        if watch.gate is not None:
            rec.warn_once("torch skip", NO_SKIP.format(cls=type(optimizer).__name__))
        self._running.append(update)

    def _post(self, optimizer: Any, args: tuple, kwargs: dict) -> None:
        if not self._running:
            return
        update = self._running.pop()
        if update is None or update.optimizer is not optimizer:
            return
        # after a clip, .grad holds the clipped gradient: the clip's own reading (fill)
        self.watch.update_ends(update, update.grads if update.clip_calls == 0 else None)

    # --- the step's values --------------------------------------------------------------

    def fill(self, seen: GradSeen, update: Update) -> None:
        """What the update's clip call says, into ``seen`` (``gradsource.resolve`` then
        applies the contract); one warning where it cannot be read."""
        seen.optimizer_ran = True
        before, clipped, why = clip_reading(update)
        if why is not None:
            self.watch.monitor.warn_once("torch clip", why)
            return
        if before is not None:
            seen.clip_input, seen.received = before, clipped


def _number(value: Any) -> float | None:
    """``float(value)`` for a number or a one-element tensor, else None."""
    try:
        return float(value)
    except (TypeError, ValueError):
        return None


def _with_grad(parameters: Any) -> frozenset[int]:
    """The ids of the parameters ``clip_grad_norm_`` clips (those with a gradient)."""
    items = [parameters] if hasattr(parameters, "shape") else parameters
    return frozenset(id(p) for p in items if getattr(p, "grad", None) is not None)
