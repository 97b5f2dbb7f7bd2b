"""Graph-safe pieces: a global norm usable inside ``mindspore.jit``, and the optimizer tap.

Gradients inside a compiled step (``Model.train``'s train cell, a ``@ms.jit`` step)
never reach Python, so ``OptimizerTap`` wraps every optimizer class's ``construct``
with a wrapper MindSpore compiles into those graphs: it stores the global norm of the
gradients the optimizer receives (its own ``loss_scale`` undone) in a non-trainable
Parameter read on collected steps. Where the gradient is clipped or loss-scaled before
it reaches the optimizer, ``collect.gradtaps`` sees it there.

The lr is never asked for: ``get_lr()`` can move state (MindCV's AdamW, Lion, NAdam and
Adan advance ``global_step`` inside it; a second call ran their schedule at double pace
and crashed at its end), and a schedule cell is the user's code. Instead every class's
own ``get_lr`` is wrapped too: the wrapper calls the original exactly once per call the
optimizer makes, and keeps the first value of a collected step -- the lr the update
used, as the optimizer's own graph computed it. Nothing of ours calls user code.
"""

from __future__ import annotations

import inspect
import itertools
from typing import Any

import mindspore as ms
import numpy as np
from mindspore import Parameter, Tensor, nn, ops

from msmon_nb.collect.hooks import optimizer_bases, subclasses
from msmon_nb.collect.unscale import OWN, undo_rule
from msmon_nb.config.cards import CARDS

# how many per-gradient norms the optimizer tap keeps (16 KB); an optimizer with more
# parameters keeps the first ones (diagnose.blame then judges those)
EACH_CAPACITY = 4096
_INDICES = Tensor(np.arange(EACH_CAPACITY, dtype=np.int32).reshape(-1, 1))


def keep_each(param: Parameter, each: Tensor, n: int) -> Tensor:
    """Write ``each`` (``n`` per-gradient norms) into the first ``n`` entries of
    ``param`` (``OptimizerTap.each``; the first ``EACH_CAPACITY`` when there are more).
    Graph syntax, ``n`` a constant where a graph compiles it. A scatter into the
    Parameter, not a concat with zeros: where a sparse gradient makes a dead branch's
    types undetermined, Concat of (undetermined, tensor) and Pad did not compile
    (LazyAdam, 2.10)."""
    if n > EACH_CAPACITY:
        return ops.scatter_nd_update(param, _INDICES, each[:EACH_CAPACITY])
    return ops.scatter_nd_update(param, _INDICES[:n], each)


def global_norm(grads: Any) -> Tensor:
    """sqrt(sum ||g||^2) over a tuple of gradients; works in PyNative and inside jit.

    Return it from a jit-compiled train step (``return loss, mm.global_norm(grads)``) and
    ``mon.watch()`` records it as grad_norm.
    """
    return ops.sqrt(ops.addn([square_sum(g) for g in grads]))


def all_dense(values: Any) -> bool:
    """Whether every gradient is a dense Tensor; constant where a graph compiles it.

    A sparse gradient (a ``RowTensor`` from ``nn.EmbeddingLookup(sparse=True)`` for
    ``LazyAdam``, ``FTRL``, ``ProximalAdagrad``) is passed on to the optimizer untouched,
    with no norm and no ``depend`` around it: seen on 2.10, ``ops.depend`` over a tuple
    holding a RowTensor made its type "Undetermined" and LazyAdam's graph failed to
    compile. (Its norm is not the norm of its values where indices repeat.)
    """
    for value in values:  # noqa: SIM110 -- graph syntax: no generator expressions
        if not _dense(value):
            return False
    return True


# dispatched on the value's type as MindSpore's optimizers dispatch theirs (an
# ``isinstance`` of RowTensor does not compile; one of Tensor held for an undetermined
# sparse gradient)
_dense = ops.MultitypeFuncGraph("msmon_dense")


@_dense.register("Tensor")
def _dense_tensor(value):
    return True


def _sparse(value):
    return False


for _kind in ("RowTensor", "COOTensor", "CSRTensor"):
    _dense.register(_kind)(_sparse)


def square_sum(g: Tensor) -> Tensor:
    """``sum(g**2)`` in float32, graph-safe: a tensor of more than two axes is first
    viewed as 2-D (its first axis, then the rest), then summed along the last
    (contiguous) axis, then over what is left.

    Why not one flat ReduceSum: inside a train graph, reshaping a gradient to 1-D made
    MindSpore's CPU runtime copy it (Reshape kernels of 0.09-0.12 ms per large gradient
    in its profiler; why it does not alias the buffer there, we did not find), and a ReduceSum
    of a 2-D tensor over every axis is several times slower than over its last axis.
    Kernel times summed by MindSpore's profiler, ``Model.train`` of the MLP
    784-512-512-10 on 2.10: 695-772 us a step for flatten-then-sum, 221-226 us for
    this (one read of its 2.7 MB of gradients at this VM's copy bandwidth: ~186 us).
    Why 2-D first: a conv kernel's last axis is its kernel width (3), and summing along
    it was the slowest way of all -- ResNet-18's 62 gradients (11.2 M values) in one jit
    graph on 2.10: 65-69 ms summed along the last axis, 12 ms viewed as 2-D, 17-20 ms as
    a matmul of the flattened gradient with itself, 2.3-3.4 ms for numpy's dot on the host
    (``bench/trainers.py`` prints the in-graph cost at that size).
    ``x * x`` beats ``Square`` on these kernels. Measured again in that ``Model.train``
    (MindSpore's profiler, op totals over 100 steps, one process per form): this form
    190-280 us a step (Mul 110-162, ReduceSum 78-89), at the one-read floor; slower:
    ``ops.square`` (its Square alone 206-286), a flat reshape + MatMul of the gradient
    with itself (Reshape copies 151-233 on top), a BatchMatMul of its rows (1.2 ms),
    ``L2Loss`` (1.1 ms: one thread), ``LpNorm`` (3.4 ms), a ReduceSum over every axis
    (3.2 ms); ``ops.einsum`` does not compile on CPU. Computing it on every step without
    the ``on`` branch (``_tapped``) made the step slower, not faster (bench MLP, three
    models a side: 1.091x plain against 1.034x with the branch).
    """
    sq = ops.cast(g, ms.float32)
    if len(g.shape) > 2:
        sq = ops.reshape(sq, (g.shape[0], -1))
    sq = sq * sq
    if len(g.shape) > 1:
        sq = ops.reduce_sum(sq, -1)
    return ops.reduce_sum(sq)


def _optimizer_classes(method: str) -> list[type]:
    """The optimizer bases (``hooks.optimizer_bases``) and every subclass defined so far
    that defines ``method`` itself."""
    return [cls for cls in subclasses(optimizer_bases()) if method in vars(cls)]


class OptimizerTap:
    """Records the global norm of the gradients every optimizer receives, and its lr,
    also inside compiled graphs (a ``@ms.jit`` step holding the optimizer call).

    ``install()`` replaces ``construct`` on each optimizer class (so optimizers created
    earlier see it) with a wrapper that assigns ``sqrt(sum ||g||^2)`` and a call counter
    to non-trainable Parameters, then runs the original update on the same gradients;
    and ``get_lr`` on each class that defines one with a wrapper that passes the
    original's value through, keeping the first one after ``arm_lr()`` (``_lr_tapped``).
    MindSpore compiles the wrappers into any graph that calls the optimizer. Functions
    compiled before keep their graphs: ``install`` removes their
    phases from the compile cache so that their next call compiles again, and
    ``uninstall`` does the same so that nothing of ours stays in the user's graphs.
    ``read()`` copies two scalars to the host, ``read_lr()`` one or two.
    """

    def __init__(self, cache: set | None, gate: Any = None, each: bool = False) -> None:
        self.cache = cache
        self.gate = gate  # a collect.skip.SkipGate: the update runs only when it passes
        # keep each gradient's norm too (``each``): a constant of the wrapper, so a run
        # without blame compiles the graph it compiled before
        self.keeps_each = each
        self.norm = tap_scalar("msmon_tap_grad_norm", 0.0, ms.float32)
        self.lr = tap_scalar("msmon_tap_lr", 0.0, ms.float32)
        self.count = tap_scalar("msmon_tap_count", 0, ms.int32)
        self.sparse = tap_scalar("msmon_tap_sparse", 0, ms.int32)  # calls with sparse grads
        # each gradient's norm (the squares the global norm sums, kept rather than thrown
        # away), for diagnose.blame; the first len(gradients) entries hold them
        self.each = Parameter(
            Tensor(np.zeros(EACH_CAPACITY, np.float32)),
            name=f"msmon_tap_each_{next(_SERIAL)}",
            requires_grad=False,
        )
        # each call's norm and its optimizer's fingerprint (``fingerprint``), in the
        # slot of its count (mod SLOTS): which optimizers stepped inside one graph (a
        # GAN's D and G), and each one's norm (``read_calls``)
        self.slots = Parameter(
            Tensor(np.zeros(SLOTS, np.float32)),
            name=f"msmon_tap_slots_{next(_SERIAL)}",
            requires_grad=False,
        )
        self.keys = Parameter(
            Tensor(np.zeros(SLOTS, np.int32)),
            name=f"msmon_tap_keys_{next(_SERIAL)}",
            requires_grad=False,
        )
        # norm and lr are computed only while ``on`` is 1 (collected steps; the skip
        # gate needs the norm on every step, so a gated wrapper always computes it);
        # ``count`` moves on every call
        self.on = tap_scalar("msmon_tap_on", 0, ms.int32)
        self._on = [False]
        # 1 from a collected step's begin until the first get_lr() call after it stores
        # the lr and writes 0: that call is the step's (the optimizer's own, or MindCV's
        # accumulation step moving the schedule), a later one (a user's logging call) is not
        self.lr_armed = tap_scalar("msmon_tap_lr_armed", 0, ms.int32)
        self._armed = False
        self._saved: list[tuple[type, str, Any]] = []
        # read by the wrapper: constant (False) where a graph compiles it; True while a
        # PyNative optimizer call runs it in Python, where the watch already sees the
        # gradients and the lr, and the norm would cost one op launch per gradient
        self.mode = TapMode()

    @property
    def installed(self) -> bool:
        return bool(self._saved)

    def _attr(self, name: str) -> str:
        """Where a class's original ``name`` is kept while wrapped: one name per tap, so
        two taps stacked on a class (a watch and a Model.train callback) unwind."""
        return f"_msmon_original_{name}_{id(self):x}"

    def install(self) -> None:
        for cls in _optimizer_classes("get_lr"):
            original = vars(cls)["get_lr"]
            if _positional(original) == 1:
                self._saved.append((cls, "get_lr", original))
                setattr(cls, self._attr("get_lr"), original)
                cls.get_lr = _lr_tapped(self._attr("get_lr"), self)
        for cls in _optimizer_classes("construct"):
            original = vars(cls)["construct"]
            if _takes_gradients_only(original):
                self._saved.append((cls, "construct", original))
                setattr(cls, self._attr("construct"), original)
                # how its construct undoes a loss scale (collect.unscale); the experimental
                # API's optimizers hold none
                undo = undo_rule(cls).kind if issubclass(cls, nn.Optimizer) else None
                wrapper = _tapped(self._attr("construct"), self, self.gate, undo)
                if self.gate is not None:
                    # PyNative calls run it as one compiled graph, like the original
                    # (jit-decorated) construct, not op by op (about 3x the step time of
                    # a tiny MLP when run op by op); inside a graph it is inlined. Not
                    # without a gate: there ``mode.python`` must be read at each call
                    wrapper = ms.jit(wrapper)
                cls.construct = wrapper
        if self.gate is not None:
            self.gate.active += 1
            self.gate.taps.append(self)
        self._recompile()

    def uninstall(self) -> None:
        if not self._saved:
            return
        for cls, name, original in reversed(self._saved):
            setattr(cls, name, original)
            if self._attr(name) in vars(cls):
                delattr(cls, self._attr(name))
        self._saved.clear()
        if self.gate is not None:
            self.gate.active -= 1
            self.gate.taps.remove(self)
        self._recompile()

    def _recompile(self) -> None:
        if self.cache is not None:
            self.cache.clear()

    def set_collect(self, collect: bool) -> None:
        """Compute norm and lr in the coming calls or not (a 4-byte write on a change)."""
        on = self._on
        if collect != on[0]:
            # into the Parameter's own memory: ``set_data`` swaps in a new tensor,
            # which a graph compiled before may not see (collect.skip says the same)
            write_scalar(self.on, int(collect))
            on[0] = collect

    def read_count(self) -> int:
        return int(self.count.item())

    def read_sparse(self) -> int:
        """Calls so far whose gradients were sparse (``all_dense``): not measured."""
        return int(self.sparse.item())

    def read(self) -> tuple[int, float]:
        """(calls so far, the last collected call's gradient norm with the optimizer's
        own ``loss_scale`` undone)."""
        return self.read_count(), float(self.norm.item())

    def read_each(self, n: int) -> np.ndarray:
        """The last collected call's per-gradient norms, the first ``n`` (the optimizer's
        parameter count; at most ``EACH_CAPACITY``), its ``loss_scale`` undone: a copy.

        Read through the Parameter's kept host view once ``probe_host_writes`` has shown
        that view is the memory the graphs use (as ``write_scalar`` writes): on the
        bench MLP in ``Model.train``, ``asnumpy()`` here cost 70-120 us a step, the view
        about 1 us. The graph's write is complete by then: the step's ``read()`` (an
        ``item()`` of the norm the same branch stores, which waits for the graph) came
        first (``gradtaps.StepTaps.end``)."""
        n = min(n, EACH_CAPACITY)
        if _HOST_WRITES == [True]:
            return _host_view(self.each)[:n].astype(np.float64)
        return self.each.asnumpy()[:n].astype(np.float64)

    def read_calls(self, first: int, last: int) -> list[tuple[int, float]]:
        """``(fingerprint, norm)`` of each collected call numbered ``first`` to
        ``last`` (``read_count`` before and after a step; the last ``SLOTS`` of them)."""
        first = max(first, last - SLOTS)
        if last <= first:
            return []
        at = [i % SLOTS for i in range(first, last)]
        if _HOST_WRITES == [True]:  # the kept CPU views, as read_each reads
            keys, norms = _host_view(self.keys), _host_view(self.slots)
        else:
            keys, norms = self.keys.asnumpy(), self.slots.asnumpy()
        return [(int(keys[i]), float(norms[i])) for i in at]

    def arm_lr(self) -> None:
        """Keep the lr of the next ``get_lr()`` call (a collected step begins). A 4-byte
        write, only when the last armed call happened (else it is still armed)."""
        if not self._armed:
            write_scalar(self.lr_armed, 1)
            self._armed = True

    def read_lr(self) -> float | None:
        """The lr the first ``get_lr()`` since ``arm_lr()`` returned; None when no
        ``get_lr()`` ran since (an update skipped for an overflow, an optimizer that
        computes its lr without ``get_lr``)."""
        if not self._armed:
            return None
        if int(self.lr_armed.item()) != 0:
            return None
        self._armed = False
        return float(self.lr.item())


_SERIAL = itertools.count()

# calls of the optimizers a step's graph makes that the tap tells apart (``keep_call``)
SLOTS = 16
_KEY_BASE = 100003


def fingerprint(gradients: Any) -> int:
    """An optimizer told apart from another by what it updates: its number of
    gradients and their total size. Graph syntax; a constant where a graph compiles it;
    ``optimizer_key`` gives the same for an optimizer on the host."""
    size = 0
    for g in gradients:
        size = size + g.size
    return len(gradients) * _KEY_BASE + size % _KEY_BASE


def optimizer_key(optimizer: Any) -> int:
    """``fingerprint`` of the gradients ``optimizer`` receives, from its parameters."""
    params = list(getattr(optimizer, "parameters", ()) or ())
    return len(params) * _KEY_BASE + sum(int(p.size) for p in params) % _KEY_BASE


def keep_call(slots: Parameter, keys: Parameter, called: Tensor, total: Tensor, key: int) -> Any:
    """Write one call's norm and optimizer fingerprint into its slot (``called``: the
    call count after it). Graph syntax."""
    at = ops.reshape(ops.floor_mod(called - 1, SLOTS), (1, 1))
    done = ops.scatter_nd_update(slots, at, ops.reshape(total, (1,)))
    return ops.depend(done, ops.scatter_nd_update(keys, at, ops.fill(ms.int32, (1,), key)))


def tap_scalar(name: str, value: Any, dtype: Any) -> Parameter:
    """A non-trainable scalar Parameter a wrapper writes from inside a graph. Its name is
    unique in the process: two taps stacked in one graph (a watch's and a
    ``Model.train`` callback's) would otherwise fail to compile ("its name ... already
    exists")."""
    return Parameter(Tensor(value, dtype), name=f"{name}_{next(_SERIAL)}", requires_grad=False)


def write_scalar(param: Parameter, value: int | float) -> None:
    """Write ``value`` into a scalar Parameter that compiled graphs read, in place.

    ``ops.assign`` from Python is one PyNative op launch: 0.2-1.5 ms when it follows a
    graph run (measured in ``Model.train`` on 2.10, where toggling the taps on and off
    around every 10th step cost 0.3 ms a step, more than the collected steps' reads).
    ``set_data`` is cheap but swaps the buffer, which a ``@ms.jit`` graph compiled
    earlier never sees again. On CPU the Parameter's buffer is host memory and
    ``asnumpy()`` returns a view of it, so writing the view is the same in-place write;
    ``probe_host_writes`` proves that once per process (a compiled graph reads back what
    the view wrote) and until it has, this stays ``ops.assign``. The view is taken once
    per Parameter and kept: ``asnumpy()`` itself cost 70-80 us a call between
    ``Model.train`` steps (the bench MLP on 2.10; 7 us alone), a write through the kept
    view 0.2 us. Only our own tap Parameters come here, and nothing gives them a new
    buffer (no ``set_data``), so the view stays theirs.
    """
    if _HOST_WRITES == [True]:
        _host_view(param)[...] = value
    else:
        ops.assign(param, Tensor(value, param.dtype))


_HOST_WRITES: list[bool] = []
_VIEWS: dict[int, tuple[Parameter, Any]] = {}  # id -> (our tap Parameter, its host view)


def _host_view(param: Parameter) -> np.ndarray:
    """``param``'s host memory, the view taken once and kept (``write_scalar``: only
    after ``probe_host_writes``, and only for our own tap Parameters)."""
    kept = _VIEWS.get(id(param))
    if kept is None or kept[0] is not param:  # (keyed by id: == on a Tensor is an op)
        kept = _VIEWS[id(param)] = (param, param.asnumpy())
    return kept[1]


def probe_host_writes() -> bool:
    """Whether a write through a CPU Parameter's ``asnumpy()`` view is what a compiled
    graph reads (checked once per process: write 1, then 0, and read each back through
    a jit graph; ~0.1 s). False off the CPU, where ``asnumpy()`` is a copy, or if the
    check fails. Called where no hook of ours is in place yet (the watch's jit hook
    would take the probe's graph for a training step): before the watch patches, at a
    ``Model.train`` callback's begin."""
    if not _HOST_WRITES:
        ok = False
        try:
            if ms.get_context("device_target") == "CPU":
                probe = Parameter(Tensor(0, ms.int32), name=f"msmon_probe_{next(_SERIAL)}")

                @ms.jit
                def read(x):
                    return ops.add(probe, x)

                zero = Tensor(0, ms.int32)
                read(zero)  # compiled before the writes, as the train graphs are
                ok = True
                for value in (1, 0):
                    probe.asnumpy()[...] = value
                    ok = ok and int(read(zero).asnumpy()) == value
        except Exception:  # noqa: BLE001 -- any failure means: use ops.assign
            ok = False
        _HOST_WRITES.append(ok)
    return _HOST_WRITES[0]


def _takes_gradients_only(construct: Any) -> bool:
    return _positional(construct) == 2


def _positional(function: Any) -> int:
    """How many parameters ``function`` has, all positional-or-keyword; -1 otherwise."""
    try:
        params = list(inspect.signature(function).parameters.values())
    except (TypeError, ValueError):
        return -1
    if all(p.kind is p.POSITIONAL_OR_KEYWORD for p in params):
        return len(params)
    return -1


class TapMode:
    """Whether the tap wrapper runs in Python (PyNative optimizer call): then it skips
    the norm, unless a skip gate needs it to decide whether the update runs."""

    python = False


_ONE = Tensor(1, ms.int32)
_ZERO = Tensor(0, ms.int32)
# SkipGate reason codes (collect.skip.REASONS): the skippable cards' skip_code
_NONFINITE = Tensor(CARDS["nonfinite"].skip_code, ms.int32)
_GRAD = Tensor(CARDS["grad_explosion"].skip_code, ms.int32)
_LOSS = Tensor(CARDS["loss_spike"].skip_code, ms.int32)


def _tapped(attr: str, tap: OptimizerTap, gate: Any = None, undo: str | None = None) -> Any:
    """The wrapper put in place of an optimizer class's ``construct``.

    The original is called as a method (``getattr(self, attr)``), never as
    ``original(self, ...)``: MindSpore's graph parser treats ``self.beta1_power = ...``
    inside an optimizer's construct as a Parameter update only when ``self`` is the
    cell the method is bound to; called as a plain function, Adam's beta powers stopped
    advancing after the first step (seen on 2.10 and 2.7.1, PyNative and graph).

    The stored norm is of the gradients with the optimizer's own loss scale undone
    (``FixedLossScaleManager(drop_overflow_update=False)`` hands the optimizer gradients
    scaled by it, and the optimizer divides them itself), the way its class's code does
    it (``undo``, ``collect.unscale``): times ``reciprocal_scale`` where ``need_scale``
    (``nn.Optimizer``'s convention), or always (``OWN``: MindCV's AdamW and Lion keep their
    own). None: the class holds no loss scale (the experimental API's optimizers). Where
    the code does not show it, the host drops the value (``unscale.received_factor``).

    With a ``gate`` (``collect.skip.SkipGate``) the update is conditional: it runs when
    the gradients' global norm is below the gate's limit and the step's loss (when a
    loss was stored this step) is below its limit, and both are finite (if
    ``nonfinite`` skips); otherwise no line of the original runs -- parameters, moments,
    ``global_step`` and Adam's beta powers stay as they were -- and the gate records the
    skip. The limits are Parameters the host refreshes on collected steps, so the
    decision itself needs no host round trip. It then returns a bool tensor (True when
    the update ran) instead of the original's result.
    """
    norm, count, on, mode, sparse = tap.norm, tap.count, tap.on, tap.mode, tap.sparse
    each, keeps = tap.each, tap.keeps_each
    slots, keys = tap.slots, tap.keys
    scaled, own = undo is not None, undo == OWN
    gated = gate is not None
    if gated:
        limit, loss_limit, loss, fresh = gate.limit, gate.loss_limit, gate.loss, gate.fresh
        skipped, reason, skip_norm = gate.skipped, gate.reason, gate.skip_norm
        check_nonfinite, check_loss = gate.nonfinite, gate.uses_loss
    else:  # unused, but graph closures must name something
        limit = loss_limit = loss = skip_norm = norm
        fresh = skipped = reason = count
        check_nonfinite = check_loss = False

    # MindSpore parses these functions' source when it compiles a graph that calls the
    # optimizer: they must stay plain graph syntax (closure variables, no try/with).
    def store_norms(self, gradients, called):
        # the global norm, the optimizer's loss scale undone, stored into ``norm``, and
        # with the call's optimizer's fingerprint into the call's slot (``called``: the
        # count after this call); with blame (``keeps``, a constant: without it the graph
        # is the one it was) each gradient's norm into ``each`` too. (total, the stores'
        # token); both branches of ``construct`` call it, inlined where the graph compiles
        squares = [square_sum(g) for g in gradients]
        total = ops.sqrt(ops.addn(squares))
        if own or (scaled and self.need_scale):
            total = total * self.reciprocal_scale
        stored = ops.assign(norm, total)
        stored = ops.depend(stored, keep_call(slots, keys, called, total, fingerprint(gradients)))
        if keeps:
            norms = ops.sqrt(ops.stack(squares))
            if own or (scaled and self.need_scale):
                norms = norms * self.reciprocal_scale
            stored = ops.depend(stored, keep_each(each, norms, len(squares)))
        return total, stored

    def construct(self, gradients):
        if mode.python and not gated:
            return getattr(self, attr)(gradients)
        if not all_dense(gradients):  # decided at compile time: see all_dense
            done = getattr(self, attr)(gradients)
            return ops.depend(done, ops.assign_add(sparse, _ONE))
        called = ops.assign_add(count, _ONE)
        if not gated:
            # the branch yields a scalar the update's result then depends on: a branch
            # yielding the gradients themselves can change how MindSpore fuses the update
            # (float16 bits), one whose result is unused was dropped (AdamWeightDecay,
            # 2.10), and a ``depend`` over the gradients turned a sparse one's type
            # "Undetermined" (LazyAdam's graph then failed to compile)
            if on > 0:
                _, stored = store_norms(self, gradients, called)
                token = ops.depend(_ONE, stored)
            else:
                token = _ZERO
            done = getattr(self, attr)(gradients)
            return ops.depend(done, ops.depend(token, called))
        gradients = ops.depend(gradients, called)
        total, stored = store_norms(self, gradients, called)
        gradients = ops.depend(gradients, stored)
        has_loss = fresh > _ZERO
        finite = ops.logical_and(
            ops.isfinite(total), ops.logical_or(ops.logical_not(has_loss), ops.isfinite(loss))
        )
        ok = total < limit
        if check_loss:
            ok = ops.logical_and(ok, ops.logical_or(ops.logical_not(has_loss), loss < loss_limit))
        if check_nonfinite:
            ok = ops.logical_and(ok, finite)
        else:
            ok = ops.logical_or(ok, ops.logical_not(finite))  # NaN is not ours to skip
        done = ok
        if ok:
            done = ops.depend(done, getattr(self, attr)(gradients))
        else:
            why = ops.select(
                ops.logical_not(finite), _NONFINITE, ops.select(total >= limit, _GRAD, _LOSS)
            )
            mark = ops.assign(reason, why)
            mark = ops.depend(mark, ops.assign(skip_norm, total))
            done = ops.depend(done, ops.depend(ops.assign_add(skipped, _ONE), mark))
        return ops.depend(done, ops.assign(fresh, _ZERO))

    return construct


def _lr_tapped(attr: str, tap: OptimizerTap) -> Any:
    """The wrapper put in place of an optimizer class's ``get_lr``: the original runs
    once per call, as without us, and while ``lr_armed`` is 1 in a collected step (``on``)
    its value (the first group's, for group lrs) is stored and ``lr_armed`` set to 0 (an
    armed step without a ``get_lr()`` call, e.g. an overflow, leaves it armed for the
    next collected one; uncollected steps never store). No branch stands
    between the original's value and the caller: the store yields a token the value
    depends on (see ``_tapped`` on why). Called as a bound method, like ``_tapped``."""
    store, armed, on = tap.lr, tap.lr_armed, tap.on

    # plain graph syntax: MindSpore parses it inside the optimizer's graph
    def get_lr(self):
        lr = getattr(self, attr)()
        if armed * on > 0:
            first = lr[0] if self.is_group_lr else lr
            token = ops.assign(store, ops.cast(ops.reshape(first, ()), ms.float32))
            token = ops.depend(_ONE, ops.depend(token, ops.assign(armed, _ZERO)))
        else:
            token = _ZERO
        if self.is_group_lr:
            return (ops.depend(lr[0], token),) + lr[1:]  # noqa: RUF005 -- graph syntax
        return ops.depend(lr, token)

    return get_lr
