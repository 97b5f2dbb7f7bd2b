"""Where real train steps clip gradients and undo loss scales, seen from inside graphs.

``train/grad_norm`` is the norm of the gradient *as the model produced it*: loss scale
undone, before clipping (docs/ARCHITECTURE.md, Tags). The optimizer tap (``collect.graph``) sees
what the optimizer receives, which is neither when a train step clips (MindCV's
``TrainStep``, MindYOLO, MindOCR, MindFormers all can) or hands the optimizer a scaled
gradient (``FixedLossScaleManager(drop_overflow_update=False)`` with ``loss_scale=`` on
the optimizer). ``GraphTaps`` wraps, class- or module-level, the few MindSpore functions
every such step goes through, so the wrappers are compiled into whatever graph calls
them (a ``Model.train`` cell, a ``@ms.jit`` step) and also run when PyNative calls them:

* clipping: every Cell class that clips by norm or clips gradients by value
  (``clip_cells``: MindSpore's
  ``_ClipByGlobalNorm`` behind ``ops.clip_by_global_norm``, ``nn.ClipByNorm`` (one
  tensor a call, so the squares add up over the calls of a step), MindFormers'
  ``ClipGradNorm``...) and ``ops.clip_by_norm`` (its ``_cal_total_norm``): the sum of
  squares of what came *in*, i.e. the norm before clipping, and the number of calls;
* loss scaling: ``TrainOneStepWithLossScaleCell.process_loss_scale(overflow)`` (MindSpore's
  own cell and every subclass that calls it), ``nn.DynamicLossScaleUpdateCell`` (which
  a train cell of the user's calls with its own overflow check) and ``mindspore.amp``'s
  ``_grad_unscale_map`` and ``_all_finite`` (behind ``StaticLossScaler``/
  ``DynamicLossScaler.unscale`` and ``amp.all_finite``): the scale in force and whether
  the gradients overflowed.

Call counters and the loss scale are written on every call; the norms (the costly part)
only while ``on`` is 1 (collected steps), and the host zeroes the clip sum after reading
it. No wrapper puts a branch between the user's values and their use: a gated branch
yields a scalar token and the values pass through ``ops.depend(values, token)``. (Seen
on 2.10: a wrapper returning ``out`` from an ``if`` changed a float16 jit step's weights
in the last bits -- the branch moved where MindSpore fused the unscale -- and a branch
whose result nothing used was dropped from an AdamWeightDecay graph.)

A graph compiled before ``install`` keeps its old code, and one compiled while they are
on keeps them: which graphs compile again and which are dropped when the taps go off,
``collect.recompile.Recompiler`` decides, for every jit function and train cell, as for
the optimizer tap (``StepTaps`` installs it with them).
"""

from __future__ import annotations

import importlib
import inspect
import re
from collections.abc import Iterator
from contextlib import AbstractContextManager, contextmanager, nullcontext
from dataclasses import dataclass
from typing import Any

import mindspore as ms
from mindspore import Tensor, ops

from msmon_nb.collect.gradsource import GradSeen, StepPattern
from msmon_nb.collect.graph import (
    EACH_CAPACITY,
    OptimizerTap,
    square_sum,
    tap_scalar,
    write_scalar,
)
from msmon_nb.collect.hooks import subclasses
from msmon_nb.collect.opsview import swapped
from msmon_nb.collect.patches import Patches
from msmon_nb.collect.recompile import Recompiler

_ONE = Tensor(1, ms.int32)
_ZERO = Tensor(0, ms.int32)


@dataclass(frozen=True)
class Counts:
    """Counters the wrappers move on every call (collected or not)."""

    optimizer: int = 0  # optimizer calls (the optimizer tap)
    clips: int = 0  # clip calls
    checks: int = 0  # loss-scale overflow checks
    overflows: int = 0  # checks that found inf/nan
    accumulated: int = 0  # gradients added into an accumulation buffer (one per tensor)

    def __sub__(self, other: Counts) -> Counts:
        return Counts(*(a - b for a, b in zip(self.astuple(), other.astuple(), strict=True)))

    def astuple(self) -> tuple[int, int, int, int, int]:
        return (self.optimizer, self.clips, self.checks, self.overflows, self.accumulated)


class GraphTaps:
    """The Parameters the clip and loss-scale wrappers write, and the wrappers."""

    def __init__(self) -> None:
        self.on = tap_scalar("msmon_taps_on", 0, ms.int32)
        self.clip_sq = tap_scalar("msmon_clip_sq", 0.0, ms.float32)
        self.clip_calls = tap_scalar("msmon_clip_calls", 0, ms.int32)
        self.overflows = tap_scalar("msmon_overflows", 0, ms.int32)
        self.checks = tap_scalar("msmon_overflow_checks", 0, ms.int32)
        self.scale = tap_scalar("msmon_loss_scale", 0.0, ms.float32)
        self.scales = tap_scalar("msmon_loss_scale_reads", 0, ms.int32)
        self.micro_sq = tap_scalar("msmon_micro_sq", 0.0, ms.float32)
        self.micro_calls = tap_scalar("msmon_micro_calls", 0, ms.int32)
        self._on = [False]  # what ``on`` holds (see OptimizerTap.set_collect)
        self._patches = Patches()
        self._overloads = Overloads()

    @property
    def installed(self) -> bool:
        return bool(self._patches) or bool(self._overloads)

    def install(self) -> None:
        """Wrap what exists in this MindSpore (each piece is looked up, not assumed).
        PyNative calls see the wrappers at once; graphs, as ``collect.recompile`` decides."""
        if self._patches:
            return
        clip = _module("mindspore.ops.function.clip_func")
        amp = _module("mindspore.amp")
        nn = _module("mindspore.nn")
        plan = [(cls, "construct", self._clip_cell) for cls in clip_cells()]
        plan += [
            (clip, "_cal_total_norm", self._clip_total),
            (getattr(nn, "TrainOneStepWithLossScaleCell", None), "process_loss_scale", self._ls),
            (getattr(nn, "DynamicLossScaleUpdateCell", None), "construct", self._ls_update),
            (amp, "_grad_unscale_map", self._unscale),
            (amp, "_all_finite", self._all_finite),
        ]
        for owner, name, make in plan:
            original = _own(owner, name)
            if original is None:
                continue
            self._patches.put(owner, name, make(original))
            if isinstance(owner, type):
                # a method's original is called bound (``getattr(self, ...)``), as the
                # optimizer tap does: MindSpore's parser treats ``self`` specially
                self._patches.put(owner, self._attr(name), original)
        # MindSpore's gradient accumulation op (``mindspore.boost``'s, which MindCV's
        # and mindone's train steps import by name: the one object they all hold is
        # changed in place, by overloading its signature again)
        boost = _module("mindspore.boost.grad_accumulation")
        accumulate = getattr(boost, "gradient_accumulation_op", None)
        self._overloads.put(accumulate, ACCUMULATE, self._accumulate)

    def _attr(self, name: str) -> str:
        return f"_msmon_original_{name}_{id(self):x}"

    def uninstall(self) -> None:
        """Restore what ``install`` wrapped."""
        if not self.installed:
            return
        self._patches.restore()
        self._overloads.restore()

    def set_collect(self, collect: bool) -> None:
        """Write in the coming steps or not (a 4-byte write when it changes)."""
        if collect != self._on[0]:
            write_scalar(self.on, int(collect))  # in place: see clip_norm()
            self._on[0] = collect

    def counts(self) -> tuple[int, int, int, int]:
        """(clip calls, overflow checks, overflows found, gradients accumulated) so far."""
        return (
            int(self.clip_calls.item()),
            int(self.checks.item()),
            int(self.overflows.item()),
            int(self.micro_calls.item()),
        )

    def micro_norm(self) -> float:
        """The norm of the gradients accumulated since the last call (then zeroed): the
        micro-batch's, where one step accumulates one."""
        norm = float(self.micro_sq.item()) ** 0.5
        write_scalar(self.micro_sq, 0.0)  # in place: see clip_norm()
        return norm

    def clip_norm(self) -> float:
        """The norm of what the clip calls received since the last call (then zeroed)."""
        norm = float(self.clip_sq.item()) ** 0.5
        # written into the Parameter's memory: ``set_data`` gives the Parameter a new
        # tensor, and a Model.train graph compiled before kept adding into the old one
        # (seen on 2.10: every read after the first gave 0)
        write_scalar(self.clip_sq, 0.0)
        return norm

    def scale_count(self) -> int:
        return int(self.scales.item())

    def loss_scale(self) -> float:
        """The loss scale the graph wrote last."""
        return float(self.scale.item())

    # --- the wrappers: plain graph syntax (MindSpore parses them when it compiles) ----

    def _clip_cell(self, original: Any) -> Any:
        on, total, calls, attr = self.on, self.clip_sq, self.clip_calls, self._attr("construct")

        def construct(self, x, *args):
            token = ops.assign_add(calls, _ONE)
            if on > 0:
                if isinstance(x, (tuple, list)):
                    added = ops.assign_add(total, ops.addn([square_sum(g) for g in x]))
                else:
                    added = ops.assign_add(total, square_sum(x))
                token = ops.depend(_ONE, added)
            else:
                token = ops.depend(_ZERO, token)
            return getattr(self, attr)(ops.depend(x, token), *args)

        return construct

    def _clip_total(self, original: Any) -> Any:
        on, total, calls = self.on, self.clip_sq, self.clip_calls

        def _cal_total_norm(x, norm_type):
            norm = original(x, norm_type)
            if norm_type == 2.0:
                token = ops.assign_add(calls, _ONE)
                if on > 0:
                    f32 = ops.cast(norm, ms.float32)
                    token = ops.depend(_ONE, ops.assign_add(total, f32 * f32))
                else:
                    token = ops.depend(_ZERO, token)
                norm = ops.depend(norm, token)
            return norm

        return _cal_total_norm

    def _ls(self, original: Any) -> Any:
        flag, checks, scale, scales = self.overflows, self.checks, self.scale, self.scales
        attr = self._attr("process_loss_scale")

        def process_loss_scale(self, overflow):
            mark = ops.assign_add(flag, ops.cast(overflow, ms.int32))
            mark = ops.depend(mark, ops.assign_add(checks, _ONE))
            used = ops.assign(scale, ops.cast(ops.reshape(self.scale_sense, ()), ms.float32))
            used = ops.depend(used, ops.assign_add(scales, _ONE))
            return getattr(self, attr)(ops.depend(overflow, ops.depend(mark, used)))

        return process_loss_scale

    def _ls_update(self, original: Any) -> Any:
        scale, scales = self.scale, self.scales
        attr = self._attr("construct")

        # the scale in force, before the update cell moves it (a train cell of the user's
        # calls it with its own overflow check; overflows are counted where they are
        # checked, ``_all_finite``/``_ls``). ``loss_scale`` is passed on as the Parameter
        # itself: the original assigns the new scale into it
        def construct(self, loss_scale, overflow):
            used = ops.assign(scale, ops.cast(ops.reshape(loss_scale, ()), ms.float32))
            used = ops.depend(used, ops.assign_add(scales, _ONE))
            return getattr(self, attr)(loss_scale, ops.depend(overflow, used))

        return construct

    def _unscale(self, original: Any) -> Any:
        scale, scales = self.scale, self.scales

        def _grad_unscale_map(scale_value, inputs):
            used = ops.assign(scale, ops.cast(scale_value, ms.float32))
            used = ops.depend(used, ops.assign_add(scales, _ONE))
            return original(ops.depend(scale_value, used), inputs)

        return _grad_unscale_map

    def _accumulate(self, original: Any) -> Any:
        on, total, calls = self.on, self.micro_sq, self.micro_calls

        # one call per gradient tensor, before it is added into the buffer (MindCV and
        # mindone unscale first): the micro-batch's own gradient
        def accumulate(accumulation_step, cumulative_grad, grad):
            token = ops.assign_add(calls, _ONE)
            if on > 0:
                token = ops.depend(_ONE, ops.assign_add(total, square_sum(grad)))
            else:
                token = ops.depend(_ZERO, token)
            return original(accumulation_step, cumulative_grad, ops.depend(grad, token))

        return accumulate

    def assign_add(self, original: Any, factor: float) -> Any:
        """``ops.assign_add`` as a train cell that accumulates with it sees it while it
        compiles for the taps (``collect.opsview``): each floating gradient counted, its
        squares times ``factor``**2 (the cell divided it by N before adding) added to the
        micro-batch sum on collected steps; an integer (the cell's step counter) passes."""
        on, total, calls = self.on, self.micro_sq, self.micro_calls
        squared = factor * factor

        def assign_add(variable, value):
            if variable.dtype == ms.int32 or variable.dtype == ms.int64:
                return original(variable, value)
            token = ops.assign_add(calls, _ONE)
            if on > 0:
                token = ops.depend(_ONE, ops.assign_add(total, square_sum(value) * squared))
            else:
                token = ops.depend(_ZERO, token)
            return original(variable, ops.depend(value, token))

        return assign_add

    def _all_finite(self, original: Any) -> Any:
        flag, checks = self.overflows, self.checks

        def _all_finite(inputs, check_overflow_mode, enable_allfinite):
            finite = original(inputs, check_overflow_mode, enable_allfinite)
            bad = ops.cast(ops.logical_not(finite), ms.int32)
            mark = ops.depend(ops.assign_add(flag, bad), ops.assign_add(checks, _ONE))
            return ops.depend(finite, mark)

        return _all_finite


# the signature of ``mindspore.boost.grad_accumulation.gradient_accumulation_op``:
# (accumulation steps, buffer, gradient)
ACCUMULATE = ("Int64", "Tensor", "Tensor")


class Overloads:
    """Overloads of MindSpore ``MultitypeFuncGraph`` objects replaced in place, and put
    back: ``register`` again for a signature replaces its function inside MindSpore
    (checked on 2.10: a graph compiled after calls the new one), so every module that
    imported the object by name sees the wrapper, and the original after ``restore``."""

    def __init__(self) -> None:
        self.saved: list[tuple[Any, tuple[str, ...], Any, list]] = []

    def __bool__(self) -> bool:
        return bool(self.saved)

    def put(self, graph: Any, signature: tuple[str, ...], make: Any) -> None:
        """Overload ``graph`` for ``signature`` with ``make(original)``; nothing where
        ``graph`` has no function for it."""
        original = overloaded(graph, signature)
        if original is None:
            return
        entries = list(graph.entries)
        graph.register(*signature)(make(original))
        self.saved.append((graph, signature, original, entries))

    def restore(self) -> None:
        for graph, signature, original, entries in reversed(self.saved):
            graph.register(*signature)(original)
            graph.entries[:] = entries
        self.saved.clear()


def overloaded(graph: Any, signature: tuple[str, ...]) -> Any:
    """The function ``graph`` (a ``MultitypeFuncGraph``) runs for ``signature``; None
    where it has none, or this MindSpore keeps its overloads otherwise (feature
    detection: ``entries`` and ``typing.str_to_type`` as MindSpore's own ``register``
    uses them)."""
    entries = getattr(graph, "entries", None)
    to_type = getattr(getattr(ms.dtype, "typing", None), "str_to_type", None)
    if not isinstance(entries, list) or to_type is None:
        return None
    wanted = tuple(to_type(name) for name in signature)
    for types, fn in reversed(entries):  # (a later register replaces an earlier one)
        if tuple(types) == wanted:
            return fn
    return None


# a cell that clips by norm (MindSpore's ClipByNorm, MindFormers' ClipGradNorm) or one
# that clips gradients by its name (MindAudio's ClipGradients clips each by value)
_CLIP_NAME = re.compile(r"clip.*(norm|grad)|(norm|grad).*clip", re.IGNORECASE)


def clip_cells() -> list[type]:
    """Every Cell class defined so far that clips by norm or clips gradients (by value
    too: MindAudio 0.3.0's ``ClipGradients``), found by its name, with a
    ``construct`` of its own whose first argument is what it clips: MindSpore's
    ``_ClipByGlobalNorm`` (behind ``ops.clip_by_global_norm``) and ``nn.ClipByNorm``,
    and the suites' own (MindFormers' ``ClipGradNorm``, which returns the clipped
    gradients and their norm). A class is wrapped once (its subclasses inherit it)."""
    nn = _module("mindspore.nn")
    if nn is None:
        return []
    out = []
    for cls in subclasses([nn.Cell]):
        construct = vars(cls).get("construct")
        if construct is None or not _CLIP_NAME.search(cls.__name__):
            continue
        if any(_CLIP_NAME.search(base.__name__) for base in cls.__mro__[1:]):
            continue  # a subclass of a clip cell calls it: counted there
        if _positional(construct) >= 2:  # (self, x, ...)
            out.append(cls)
    return out


def tapped_things() -> tuple[Any, ...]:
    """The Cell classes whose methods ``GraphTaps`` wraps, and the objects it overloads in
    place (``gradient_accumulation_op``): a graph holding one compiles with the wrappers
    (``collect.recompile``)."""
    nn = _module("mindspore.nn")
    names = ("TrainOneStepWithLossScaleCell", "DynamicLossScaleUpdateCell")
    found = [getattr(nn, n, None) for n in names]
    boost = _module("mindspore.boost.grad_accumulation")
    found.append(getattr(boost, "gradient_accumulation_op", None))
    return (*clip_cells(), *(k for k in found if k is not None))


def _positional(function: Any) -> int:
    try:
        params = inspect.signature(function).parameters.values()
    except (TypeError, ValueError):
        return 0
    return sum(p.kind is p.POSITIONAL_OR_KEYWORD for p in params)


def _module(name: str) -> Any:
    try:
        return importlib.import_module(name)
    except ImportError:
        return None


def _own(owner: Any, name: str) -> Any:
    """``owner.name`` when it is a callable defined there (or inherited, for classes)."""
    if owner is None:
        return None
    value = getattr(owner, name, None)
    return value if callable(value) else None


def tapped_names(optimizer: Any) -> tuple[str, ...]:
    """The names of the parameters whose gradient norms the optimizer tap keeps for
    ``optimizer``: its parameters in the order its update receives their gradients, the
    first ``EACH_CAPACITY``. A tuple: the ways in hand the same one over every step,
    and ``diagnose.blame.NormRing`` knows an unchanged tuple by identity."""
    params = list(getattr(optimizer, "parameters", ()) or ())[:EACH_CAPACITY]
    return tuple(str(getattr(p, "name", f"grad_{i}")) for i, p in enumerate(params))


class Reading:
    """What one reader of a ``StepTaps`` (a callback, a watch) keeps between reads: the
    step pattern it learnt, the counts at its last collected step's end and at the
    current one's begin, and the loss-scale writes it has seen."""

    __slots__ = ("begun", "last", "pattern", "scales")

    def __init__(self) -> None:
        self.pattern = StepPattern()
        self.last: Counts | None = None  # at the end of the previous collected step
        self.begun: Counts | None = None
        self.scales = 0


class StepTaps:
    """The optimizer tap and the clip/loss-scale taps, read around one collected step.

    ``set_collect`` before every step; on a collected one ``begin()`` before it and
    ``end()`` after it give a ``GradSeen`` (what the optimizer received, what the clip
    calls received, overflow, loss scale) and the lr the optimizer used. Reading costs a
    few 4-byte copies per collected step; uncollected steps pay one counter increment
    per wrapped call inside the graph.
    """

    def __init__(self, gate: Any = None, each: bool = False) -> None:
        self.optimizer = OptimizerTap(gate, each)
        self.graph = GraphTaps()
        # which compiled graphs compile again with the taps, and are dropped without them
        self.recompiler = Recompiler(tapped_things, self.compiling)
        self.reading = Reading()  # the reader whose steps the counters are read for
        # read the optimizer's per-gradient norms too (diagnose.blame): the count of
        # them, the optimizer's parameter count; 0 reads none
        self.each = 0

    @property
    def pattern(self) -> StepPattern:
        """The current reader's step pattern (``gradsource.StepPattern``)."""
        return self.reading.pattern

    def read_for(self, reading: Reading) -> None:
        """Read the counters for ``reading`` from now on (a ``Model.train`` callback
        reusing taps that another callback's graph was compiled with: see
        ``collect.callback``). If another reader used the taps since ``reading`` last
        did, the counters moved for that reader's steps: the gap since ``reading.last``
        is not ``reading``'s own and is not learnt from, and the loss-scale writes so far
        count as seen, so the scale is read once the graph writes it again -- as with
        new taps, whose counters start at 0."""
        if reading is self.reading:
            return
        reading.last = reading.begun = None
        reading.scales = self.graph.scale_count()
        self.reading = reading

    @property
    def installed(self) -> bool:
        return self.optimizer.installed or self.graph.installed

    @property
    def begun(self) -> bool:
        """``begin()`` was called for a step that has not ended."""
        return self.reading.begun is not None

    def install(self, optimizer: bool = True) -> None:
        """Wrap the clip and loss-scale functions and (``optimizer``) the optimizers;
        from then on the recompiler picks the graphs that compile with them."""
        self.recompiler.install()
        self.graph.install()
        if optimizer:
            self.optimizer.install()

    def compiling(self, cell: Any) -> AbstractContextManager[bool]:
        """Around the one compile of a train cell the taps make: a cell that accumulates
        with ``ops.assign_add`` compiles with it tapped (``collect.opsview``); any other
        compiles as it is."""
        if not self.graph.installed:
            return nullcontext(False)
        return swapped(cell, self.graph.assign_add)

    def uninstall(self) -> None:
        self.optimizer.uninstall()
        self.graph.uninstall()
        # last: a graph compiled with the wrappers is dropped once they are gone
        self.recompiler.uninstall()

    @contextmanager
    def suspended(self) -> Iterator[None]:
        """Unwrapped for the block (a ``Model.train`` inside a watch: its callback's own
        taps measure it), wrapped again after."""
        graph, optimizer = self.graph.installed, self.optimizer.installed
        self.uninstall()
        try:
            yield
        finally:
            if graph or optimizer:
                self.install(optimizer=optimizer)

    def set_collect(self, collect: bool) -> None:
        self.optimizer.set_collect(collect)
        self.graph.set_collect(collect)

    def counts(self) -> Counts:
        return Counts(self.optimizer.read_count(), *self.graph.counts())

    def begin(self, steps_between: int = 0) -> None:
        """Before a collected step; ``steps_between``: uncollected steps since the last
        collected one (their counts tell how the loop clips and accumulates)."""
        now = self.counts()
        reading = self.reading
        if reading.last is not None and steps_between > 0:
            gap = now - reading.last
            reading.pattern.update(steps_between, gap.clips, gap.optimizer, gap.overflows)
        reading.begun = now
        if self.optimizer.installed:
            self.optimizer.arm_lr()

    def end(
        self, python_optimizer_calls: int = 0, buffer: bool | None = None
    ) -> tuple[GradSeen, float | None]:
        """After a collected step; ``python_optimizer_calls``: optimizer calls the watch
        saw in Python this step (the tap does not count those); ``buffer``: whether the
        step's train cell holds an accumulation buffer (``collect.accumulation``; None:
        not known)."""
        now = self.counts()
        reading = self.reading
        reading.pattern.buffer = buffer
        step = now - (reading.begun or now)
        reading.last, reading.begun = now, None
        calls = step.optimizer + python_optimizer_calls
        pattern = reading.pattern
        pattern.update(1, step.clips, calls, step.overflows)
        seen = GradSeen(optimizer_ran=step.optimizer > 0, accumulating=pattern.accumulating)
        # no update, no overflow, and a cell that accumulates nothing: a skipped update
        if step.optimizer > 1:  # which optimizers they were (collect.several)
            seen.calls = self.optimizer.read_calls(now.optimizer - step.optimizer, now.optimizer)
        if step.optimizer == 0 and self.optimizer.installed:
            # (read only then: a model's sparse gradients are sparse at every step)
            seen.sparse = self.optimizer.read_sparse() > 0
        # (a sparse update passes the tap uncounted: it ran, it was not skipped)
        seen.skipped = (
            calls == 0
            and step.overflows == 0
            and pattern.buffer is False
            and self.optimizer.installed
            and not seen.sparse
        )
        if seen.optimizer_ran:
            _, seen.received = self.optimizer.read()
            if self.each:
                seen.received_each = self.optimizer.read_each(self.each)
        lr = self.optimizer.read_lr()
        if step.clips > 0:
            seen.clip_input = self.graph.clip_norm()
        if step.checks > 0:
            seen.overflow = step.overflows > 0
        if step.accumulated > 0:  # this step added its gradient into a buffer
            seen.accumulating = True
            seen.micro_in_graph = self.graph.micro_norm()
        scales = self.graph.scale_count()
        if scales > reading.scales:
            reading.scales = scales
            seen.loss_scale = self.graph.loss_scale()
        return seen, lr
