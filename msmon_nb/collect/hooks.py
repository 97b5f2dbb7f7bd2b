"""Where ``mon.watch()`` can attach in the installed MindSpore, found by feature detection.

MindSpore's private internals move between releases, so each way in lists the places it
may live, tried in order, and the first whose attributes are all present is used. What
differs on the versions we test (2.7.1 and 2.10):

* the PyNative forward pass of a ``grad``/``value_and_grad`` function: a module function
  ``mindspore.ops.composite.base._pynative_forward_run(fn, sens_param, *args)`` (2.10),
  or methods ``_pynative_forward_run(self, fn, grad, weights, *args)`` of ``_Grad`` and
  ``GradOperation`` in the same module (2.7);
* its gradients: ``base._pynative_func_grad_backward`` (2.10), or the executor's
  ``grad``/``grad_aux`` methods, which both versions call (2.7);
* ``_JitExecutor`` and ``ms_compile_cache`` sit in ``mindspore.graph.api`` from 2.9 on
  (the old ``mindspore.common.api`` path logs a deprecation warning there) and in
  ``mindspore.common.api`` before.

Torch-style training on MindSpore (MindNLP's ``mindtorch``) has its own ways in,
``torch_style()``: found in ``sys.modules`` only where the loop imported it, never
imported here.

A way in with no place found is reported by the watch (one ``MonitorWarning`` naming
what is not observed); everything else still works. ``ways_in()`` is what
``msmon doctor`` prints. MindSpore is imported only inside these functions.
"""

from __future__ import annotations

import functools
import importlib
import sys
from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any


@dataclass(frozen=True)
class Target:
    """One attribute we replace while watching; ``skip`` leading arguments are not the
    user's (``fn, sens_param`` of the module function; ``self, fn, grad, weights`` of
    the methods)."""

    owner: Any
    name: str
    path: str
    skip: int = 0


@dataclass(frozen=True)
class WayIn:
    """A way in: what it observes, and where it attaches (empty when not found)."""

    name: str
    observes: str
    targets: tuple[Target, ...]
    tried: tuple[str, ...]
    absent: tuple[str, ...] = ()  # parts missing from the place found (partly observed)

    @property
    def available(self) -> bool:
        return bool(self.targets)

    @property
    def where(self) -> str:
        return ", ".join(t.path for t in self.targets)

    def missing_message(self, version: str) -> str | None:
        """Why this way in observes nothing, or only part; None when complete."""
        if not self.available:
            return (
                f"not observed: {self.observes}; MindSpore {version} has none of "
                f"{' / '.join(self.tried)}"
            )
        if self.absent:
            return (
                f"partly observed: {self.observes}; MindSpore {version} lacks "
                f"{' / '.join(self.absent)}"
            )
        return None


def _module(name: str) -> Any:
    try:
        return importlib.import_module(name)
    except ImportError:
        return None


def _lookup(owner: Any, name: str) -> Any:
    """``owner.name`` without the metaclass (``getattr(cls, "__call__")`` would find
    ``type.__call__`` on a class that lost its own)."""
    if isinstance(owner, type):
        return next((vars(k)[name] for k in owner.__mro__ if name in vars(k)), None)
    return getattr(owner, name, None)


def _target(owner: Any, name: str, path: str, skip: int = 0) -> Target | None:
    if owner is None or not callable(_lookup(owner, name)):
        return None
    return Target(owner, name, path, skip)


def original(target: Target) -> Any:
    """What ``target`` holds now (the function a wrapper must call)."""
    return _lookup(target.owner, target.name)


def jit_api() -> Any:
    """The module holding ``_JitExecutor`` and ``ms_compile_cache`` (None when neither
    candidate has them). ``mindspore.graph.api`` first: importing the old path on 2.9+
    warns about its deprecation in the user's output."""
    for name in ("mindspore.graph.api", "mindspore.common.api"):
        module = _module(name)
        if module is not None and hasattr(module, "_JitExecutor"):
            return module
    return None


def compile_cache() -> set | None:
    """The set of compiled jit phases; a phase removed from it compiles again."""
    api = jit_api()
    cache = getattr(api, "ms_compile_cache", None)
    return cache if isinstance(cache, set) else None


def _forward() -> WayIn:
    base = _module("mindspore.ops.composite.base")
    path = "mindspore.ops.composite.base."
    tried = (path + "_pynative_forward_run", path + "_Grad._pynative_forward_run")
    observes = "the loss (forward output) of value_and_grad/grad functions in PyNative"
    found = _target(base, "_pynative_forward_run", tried[0], skip=2)
    if found is not None:
        return WayIn("forward", observes, (found,), tried)
    fwd = "_pynative_forward_run"
    paths = [f"{path}{cls}.{fwd}" for cls in ("_Grad", "GradOperation")]
    targets = [
        _target(getattr(base, cls, None), fwd, p, skip=4)
        for cls, p in zip(("_Grad", "GradOperation"), paths, strict=True)
    ]
    if targets[0] is None:
        return WayIn("forward", observes, (), tried)
    return _partial("forward", observes, targets, paths, tried)


def _partial(
    name: str, observes: str, targets: list, paths: list[str], tried: tuple[str, ...]
) -> WayIn:
    found = tuple(t for t in targets if t is not None)
    absent = tuple(p for t, p in zip(targets, paths, strict=True) if t is None)
    return WayIn(name, observes, found, tried, absent)


def _backward() -> WayIn:
    base = _module("mindspore.ops.composite.base")
    path = "mindspore.ops.composite.base."
    executor = type(getattr(base, "_pynative_executor", None))
    tried = (path + "_pynative_func_grad_backward", path + "_pynative_executor.grad")
    observes = "the gradients returned by value_and_grad/grad functions in PyNative"
    found = _target(base, "_pynative_func_grad_backward", tried[0])
    if found is not None:
        return WayIn("backward", observes, (found,), tried)
    if executor is type(None) or _target(executor, "grad", tried[1]) is None:
        return WayIn("backward", observes, (), tried)
    # grad_aux (has_aux functions on 2.7) is absent where grad takes has_aux itself
    paths = [f"{path}_pynative_executor.{n}" for n in ("grad", "grad_aux")]
    targets = tuple(t for t in (_target(executor, p.rsplit(".", 1)[1], p) for p in paths) if t)
    return WayIn("backward", observes, targets, tried)


def _jit() -> WayIn:
    api = jit_api()
    tried = ("mindspore.graph.api._JitExecutor", "mindspore.common.api._JitExecutor")
    observes = "steps compiled with mindspore.jit (their loss and returned grad_norm)"
    executor = getattr(api, "_JitExecutor", None)
    found = _target(executor, "__call__", f"{getattr(api, '__name__', '?')}._JitExecutor")
    return WayIn("jit", observes, (found,) if found else (), tried)


def _compile_cache() -> WayIn:
    tried = ("mindspore.graph.api.ms_compile_cache", "mindspore.common.api.ms_compile_cache")
    observes = (
        "grad_norm and lr of jit steps compiled before the watch began "
        "(they must compile again with the optimizer tap)"
    )
    api = jit_api()
    if compile_cache() is None:
        return WayIn("compile_cache", observes, (), tried)
    return WayIn("compile_cache", observes, (Target(api, "ms_compile_cache", tried[0]),), tried)


@functools.cache
def optimizer_bases() -> tuple[type, ...]:
    """The optimizer base classes of this MindSpore: ``nn.Optimizer``, and the
    ``mindspore.experimental.optim.Optimizer`` that ``mint.optim`` builds on (not a
    subclass of it: its lr is a Parameter per group, ``lrs``), where present. Looked up
    once: ``is_optimizer`` asks it on collected steps."""
    from mindspore import nn

    experimental = _module("mindspore.experimental.optim")
    other = getattr(experimental, "Optimizer", None)
    return (nn.Optimizer,) if not isinstance(other, type) else (nn.Optimizer, other)


def subclasses(roots: Iterable[type]) -> list[type]:
    """``roots`` and every class defined so far that derives from one, each once (a class
    with two bases among them too): the classes a patch of a class's own method walks
    (``collect.graph``'s optimizer taps, ``collect.gradtaps``' clip cells)."""
    out: list[type] = []
    stack, seen = list(roots), set()
    while stack:
        cls = stack.pop()
        if cls in seen:
            continue
        seen.add(cls)
        out.append(cls)
        stack.extend(cls.__subclasses__())
    return out


def is_optimizer(obj: Any) -> bool:
    return isinstance(obj, optimizer_bases())


def _classes() -> list[WayIn]:
    from mindspore import nn

    out = []
    bases = optimizer_bases()
    paths = tuple(f"{b.__module__}.{b.__name__}.__call__" for b in bases)
    calls = (_target(b, "__call__", path) for b, path in zip(bases, paths, strict=True))
    optimizer = tuple(t for t in calls if t is not None)
    out.append(WayIn("optimizer", "optimizer calls (step ends, learning rate)", optimizer, paths))
    for name, cls, observes in (
        ("cell", "Cell", "train cells called by hand (TrainOneStepCell, your own Cell)"),
        ("reducer", "DistributedGradReducer", "all-reduced gradients in data parallel"),
    ):
        path = f"mindspore.nn.{cls}.__call__"
        found = _target(getattr(nn, cls, None), "__call__", path)
        out.append(WayIn(name, observes, (found,) if found else (), (path,)))
    return out


def _model() -> WayIn:
    train = _module("mindspore.train")
    model = getattr(train, "Model", None)
    paths = [f"mindspore.train.Model.{n}" for n in ("train", "fit", "eval")]
    targets = [_target(model, p.rsplit(".", 1)[1], p) for p in paths]
    observes = "Model.train/fit/eval calls (the monitor's callback is added)"
    if all(t is None for t in targets):
        return WayIn("model", observes, (), tuple(paths))
    return _partial("model", observes, targets, paths, tuple(paths))


# MindNLP's torch-compatible layer: where its optimizers' global step hooks and its
# ``clip_grad_norm_`` live (``torch.*`` are proxies of these under MindNLP)
TORCH_OPTIMIZER = "mindtorch.optim.optimizer"
TORCH_CLIP = ("mindtorch.nn.utils", "mindtorch.nn.utils.clip_grad")
_STEP_HOOKS = ("register_optimizer_step_pre_hook", "register_optimizer_step_post_hook")


def torch_style() -> WayIn:
    """Torch-style optimizers (``step()``, ``param_groups``) and ``clip_grad_norm_`` of
    MindNLP's ``mindtorch``, where the process has imported it.

    The optimizers are seen through torch's public global step hooks, which every
    ``Optimizer`` subclass's ``step()`` runs (mindtorch wraps each class's ``step`` once,
    at its first instance); ``clip_grad_norm_`` is replaced in the modules that hold it
    (``accelerate``'s and transformers' ``clip_grad_norm_`` call it through
    ``torch.nn.utils``, a proxy of ``mindtorch.nn.utils``). Looked up in ``sys.modules``
    only: msmon_nb does not depend on MindNLP, and importing it replaces parts of
    ``transformers`` and takes seconds, which a loop that does not use it must not pay."""
    optim = sys.modules.get(TORCH_OPTIMIZER)
    paths = tuple(f"{TORCH_OPTIMIZER}.{name}" for name in _STEP_HOOKS)
    observes = "torch-style optimizer updates (MindNLP's mindtorch: step(), param_groups)"
    hooks = [_target(optim, name, path) for name, path in zip(_STEP_HOOKS, paths, strict=True)]
    if optim is None or any(t is None for t in hooks):
        return WayIn("torch_style", observes, (), paths)
    clip_paths = [f"{name}.clip_grad_norm_" for name in TORCH_CLIP]
    clips = [
        _target(sys.modules.get(name), "clip_grad_norm_", path)
        for name, path in zip(TORCH_CLIP, clip_paths, strict=True)
    ]
    return _partial("torch_style", observes, [*hooks, *clips], [*paths, *clip_paths], paths)


def find_ways_in() -> dict[str, WayIn]:
    """Every way in, looked up in the installed MindSpore (imports it)."""
    ways = [_forward(), _backward(), *_classes(), _jit(), _compile_cache(), _model()]
    return {w.name: w for w in ways}


def ways_in() -> dict[str, Any]:
    """``{name: {"available", "where", "observes"}}``: the doctor's report (JSON-able)."""
    return {
        name: {
            "available": w.available,
            "where": w.where or None,
            "absent": list(w.absent),
            "observes": w.observes,
        }
        for name, w in find_ways_in().items()
    }


def closure_filled(cell: Any) -> bool:
    """Whether a function's closure cell holds a value (an empty one raises on read): the
    walks over what a step function refers to (``optstate.find_optimizer``,
    ``recompile.holds_taps``) skip the empty ones."""
    try:
        cell.cell_contents  # noqa: B018 -- an empty closure cell raises
    except ValueError:
        return False
    return True
