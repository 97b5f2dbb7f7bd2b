"""Steps made of parts: two or more optimizers stepping in one iteration of the loop.

A way in ends a *part* where it would end a step (an optimizer call returns, a train cell
returns). With one optimizer a part is a step. When two or more optimizers step in the
user's loop (a GAN's discriminator and generator, an actor and a critic), one step is one
iteration of that loop, and each optimizer's values are its own series,
``opt/<name>/<metric>`` (docs/ARCHITECTURE.md, Tags): ``train/*`` never mixes two networks.

Where an iteration ends, without reading the user's code: the optimizer that stepped
first opens every iteration, so an iteration ends where it steps again after another one
did. Once one iteration has been seen whole, its sequence of optimizers (its *cycle*:
D then G; a WGAN critic k times then the generator) closes the next ones as soon as they
have stepped the same sequence, so a step is recorded when its last update returns.

A run whose second optimizer shows up only later (its first steps train one network) has
those steps recorded as plain steps; from the first part of another optimizer on, steps
are iterations (the way in warns once, naming the step). To start clean in the usual
case, the first part is held until the second arrives where the loop's namespace holds
two or more optimizers (``Parts(hold_first=True)``), and so are the next ones of the same
optimizer, up to ``HOLD`` (a critic's k steps before the generator's first).

An optimizer stepping k times in one iteration (``merge``): its loss is the mean of its k
losses, its grad_norm, clipped and micro-batch norms the largest of its k (a spike in any
update shows), its lr and loss scale the last update's, overflow 1 if any update
overflowed, and ``opt/<name>/updates`` says k.

Pure Python: the way in turns tensors into numbers (``Recorder.part_values``).
"""

from __future__ import annotations

import re
import sys
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from types import ModuleType
from typing import Any

# the whole-step tags an optimizer's part gives, recorded as opt/<name>/<metric>
PER_OPTIMIZER = (
    "loss",
    "grad_norm",
    "grad_norm_clipped",
    "micro_grad_norm",
    "learning_rate",
    "loss_scale",
    "overflow",
)
_MEAN = frozenset({"loss"})
# parts of one optimizer held at the start while the namespace holds several (a WGAN
# critic's k steps before the generator's first); past it they are plain steps
HOLD = 32
_LAST = frozenset({"learning_rate", "loss_scale"})


@dataclass
class Part:
    """One optimizer's share of a step: what the way in would have recorded as a step."""

    key: Any  # the optimizer (compared by identity), or None where none is known
    inputs: Any  # collect.recorder.StepInputs
    collect: bool
    data_secs: float = 0.0  # waiting for data before it, and its own compute time
    compute_secs: float = 0.0
    ended: float | None = None  # perf_counter() when it returned
    # held while the loop's shape was unknown: taken as collected then (the step count
    # stood still), so its own step decides when it is recorded as a plain step
    held: bool = False


@dataclass
class Parts:
    """Groups parts into steps (module docstring). ``add`` returns the steps to record
    now, each a list of parts, in order."""

    hold_first: bool = False
    multi: bool = False  # two or more optimizers step in this loop
    switched_at: int | None = None  # parts recorded as plain steps before the switch
    order: list[Any] = field(default_factory=list)  # optimizers, first seen first
    _held: list[Part] = field(default_factory=list)
    _current: list[Part] = field(default_factory=list)
    _cycle: list[int] | None = None  # indices into ``order`` of one whole iteration
    _plain: int = 0  # parts recorded as plain steps

    def add(self, part: Part) -> list[list[Part]]:
        if part.key is not None and not any(part.key is k for k in self.order):
            self.order.append(part.key)
        if self.multi:
            return self._iterate(part)
        if len(self.order) > 1:  # a second optimizer: its loop steps several
            self.multi = True
            if not self._held:
                self.switched_at = self._plain  # the steps before were recorded plain
            self._current, self._held = self._held, []
            return self._iterate(part)
        if self.hold_first and self._plain == 0 and len(self._held) < HOLD:
            # the next part of another optimizer tells (a critic may step k times first)
            part.held = True
            self._held.append(part)
            return []
        out = [[p] for p in (*self._held, part)]
        self._held = []
        self._plain += len(out)
        return out

    def flush(self) -> list[list[Part]]:
        """What is left when the loop ends: the held parts, or the open iteration."""
        if self._held:
            held, self._held = self._held, []
            return [[p] for p in held]
        current, self._current = self._current, []
        return [current] if current else []

    def index(self, key: Any) -> int:
        """Where ``key`` stands in ``order`` (-1: not an optimizer seen)."""
        for i, known in enumerate(self.order):
            if known is key:
                return i
        return -1

    def _iterate(self, part: Part) -> list[list[Part]]:
        out = []
        first = self.order[0]
        opens = part.key is first and any(p.key is not first for p in self._current)
        if opens and self._current:
            done, self._current = self._current, []
            if self._cycle is None and done[0].key is first:  # a whole iteration
                self._cycle = [self.index(p.key) for p in done]
            out.append(done)
        self._current.append(part)
        if self._cycle is not None and [self.index(p.key) for p in self._current] == self._cycle:
            out.append(self._current)
            self._current = []
        return out


def merge(named: Sequence[tuple[str, Mapping[str, float]]]) -> dict[str, float]:
    """One step's values from its parts' ``(optimizer name, part values)``: each part's
    ``train/<metric>`` as ``opt/<name>/<metric>`` (several parts of one optimizer merged
    as the module docstring says); other tags (``param/...``) as they are."""
    grouped: dict[str, dict[str, list[float]]] = {}
    counts: dict[str, int] = {}
    out: dict[str, float] = {}
    for name, values in named:
        counts[name] = counts.get(name, 0) + 1
        for tag, value in values.items():
            metric = tag[len("train/") :] if tag.startswith("train/") else None
            if metric in PER_OPTIMIZER:
                grouped.setdefault(f"opt/{name}/{metric}", {}).setdefault(metric, []).append(
                    float(value)
                )
            elif metric is None:
                out[tag] = float(value)
    for tag, by_metric in grouped.items():
        ((metric, values),) = by_metric.items()
        if metric in _MEAN:
            out[tag] = sum(values) / len(values)
        elif metric in _LAST:
            out[tag] = values[-1]
        else:
            out[tag] = max(values)
    for name, count in counts.items():
        if count > 1:
            out[f"opt/{name}/updates"] = float(count)
    return out


_UNSAFE = re.compile(r"[^a-z0-9_.-]+")


def tag_name(text: str) -> str:
    """``text`` as one group of a tag (``config.checks.TAG_RULE``): ``netD`` -> ``netd``."""
    name = _UNSAFE.sub("_", text.lower()).strip("_")
    return name or "opt"


def unique_names(wanted: Iterable[str]) -> list[str]:
    """``wanted`` with repeats numbered (``critic``, ``critic_1``)."""
    out: list[str] = []
    for name in wanted:
        candidate, n = name, 0
        while candidate in out:
            n += 1
            candidate = f"{name}_{n}"
        out.append(candidate)
    return out


# frameworks whose frames sit between the user's loop and a way in (a torch-style
# optimizer's step() calls the hooks from mindtorch's own wrapper)
FRAMEWORKS = ("msmon_nb", "mindspore", "mindtorch")


def user_namespaces(skip: tuple[str, ...] = FRAMEWORKS) -> list[Mapping[str, Any]]:
    """The local then global names of the innermost frame of the user's code on the
    stack (the first whose module is none of ``skip``), then its callers' locals: where
    the loop's optimizers and networks have names. Read only."""
    frame = sys._getframe(1)
    while frame is not None and str(frame.f_globals.get("__name__", "")).startswith(skip):
        frame = frame.f_back
    if frame is None:
        return []
    spaces: list[Mapping[str, Any]] = [frame.f_locals, frame.f_globals]
    outer = frame.f_back
    while outer is not None and len(spaces) < 8:
        spaces.append(outer.f_locals)
        outer = outer.f_back
    # one level into the user's own objects (``self`` of a trainer's method, a ``gan``
    # holding ``netD`` and ``optD``): their attributes are names too
    owners = [v for space in spaces[:2] for v in list(space.values()) if _users_object(v)]
    spaces += [vars(v) for v in owners[:64]]
    return spaces


def _users_object(value: Any) -> bool:
    """An instance of a class of the user's (not a module, class or function, not a
    framework's or the standard library's object)."""
    kind = type(value)
    module = getattr(kind, "__module__", "") or ""
    if module.split(".", 1)[0] in ("builtins", "mindspore", "numpy", "msmon_nb", "typing"):
        return False
    return hasattr(value, "__dict__") and not isinstance(value, type | ModuleType | Callable)


class Namer:
    """Each optimizer's series name, given once and kept (``derive_names``; ``given``:
    the user's, name -> optimizer, train cell or network; ``by_variable``: the
    config's ``optimizer_names``, the variable of one of those in the loop's code ->
    name)."""

    def __init__(
        self, given: Mapping[str, Any] | None = None, by_variable: Mapping[str, str] | None = None
    ) -> None:
        self.given = dict(given or {})
        self.by_variable = dict(by_variable or {})
        self.names: dict[int, str] = {}  # id(optimizer) -> name

    def __call__(self, optimizers: Sequence[Any]) -> dict[int, str]:
        if any(id(o) not in self.names for o in optimizers):
            taken = list(self.names.values())
            spaces = user_namespaces()
            given = dict(self.given)
            for variable, name in self.by_variable.items():
                for space in spaces:
                    if variable in space and name not in given:
                        given[name] = space[variable]
                        break
            fresh = derive_names(optimizers, spaces, given)
            for optimizer, name in zip(optimizers, fresh, strict=True):
                if id(optimizer) not in self.names:
                    while name in taken:
                        name += "_"
                    self.names[id(optimizer)] = name
                    taken.append(name)
        return self.names


def derive_names(
    optimizers: Sequence[Any],
    spaces: Sequence[Mapping[str, Any]],
    given: Mapping[str, Any] | None = None,
) -> list[str]:
    """A series name for each optimizer, stable from run to run: the user's where given
    (``given``: name -> the optimizer, a train cell holding it, or the network it
    trains), else the variable of the network it trains (``netD`` -> ``netd``), else the
    optimizer's own variable, else ``opt<i>`` in the order they first stepped."""
    wanted = []
    for i, optimizer in enumerate(optimizers):
        params = _ids(_updated(optimizer))
        name = None
        for label, value in (given or {}).items():
            if _names(value, optimizer, params, network_only=False):
                name = label
                break
        for space in spaces if name is None else ():
            name = _first(space, lambda v, o=optimizer, p=params: _names(v, o, p, True))
            if name is not None:
                break
        for space in spaces if name is None else ():
            name = _first(space, lambda v, o=optimizer: v is o)
            if name is not None:
                break
        wanted.append(tag_name(name) if name is not None else f"opt{i}")
    return unique_names(wanted)


def _first(space: Mapping[str, Any], match: Any) -> str | None:
    for label, value in list(space.items()):
        if label.startswith("_"):
            continue
        try:
            if match(value):
                return label
        except Exception:  # noqa: BLE001 -- a user object that cannot be read is no match
            continue
    return None


def _names(value: Any, optimizer: Any, params: frozenset[int], network_only: bool) -> bool:
    """Whether ``value`` names ``optimizer``: the network whose trainable parameters it
    updates (not an optimizer, not a train cell), or -- unless ``network_only`` -- the
    optimizer itself or a train cell holding it."""
    if value is optimizer:
        return not network_only
    held = getattr(value, "optimizer", None) if hasattr(value, "__dict__") else None
    if held is not None:
        return held is optimizer and not network_only
    if hasattr(value, "parameters") and not callable(getattr(value, "parameters", None)):
        return False  # another optimizer (its parameters are a tuple, not a method)
    trainable = getattr(value, "trainable_params", None)
    if not callable(trainable) or not params:
        return False
    return _ids(trainable()) == params


def _updated(optimizer: Any) -> list[Any]:
    """The parameters ``optimizer`` updates: an ``nn.Optimizer``'s ``parameters``, or a
    torch-style one's (MindNLP's mindtorch) ``param_groups``."""
    groups = getattr(optimizer, "param_groups", None)
    if not hasattr(optimizer, "parameters") and isinstance(groups, list | tuple):
        return [p for g in groups if isinstance(g, dict) for p in g.get("params", ())]
    return list(getattr(optimizer, "parameters", ()) or ())


def _ids(params: Any) -> frozenset[int]:
    return frozenset(id(p) for p in params or ())
