"""Which compiled graphs compile again when the taps go on or off: only those that hold
something the taps wrap, and each once.

The taps (``collect.graph``, ``collect.gradtaps``) are class- and module-level wrappers,
so a graph compiled before they went on keeps the code it was compiled with, and one
compiled while they were on keeps them after they went off. Emptying MindSpore's jit
compile cache (``ms_compile_cache``) at both ends, as we did, recompiled every jit
function of the user's twice, those that hold no optimizer too (a compile is seconds on
a small model, minutes on an LLM). ``Recompiler`` decides per compiled phase instead, in
one place that every way in uses:

* While the taps are on it wraps ``_JitExecutor.compile``, the one call through which
  every ``mindspore.jit`` function gets its phase (the key of its compiled graph). A
  function that holds something the taps wrap compiles under a phase of its own
  (MindSpore's + ``SUFFIX``, through the executor's ``_cell_cache_key_extend``, which
  MindSpore appends to every phase it makes; the executor is made anew for each call),
  so the graph it had before the taps stays cached beside it: after the watch its next
  call finds that graph again and does not compile at all. Every other function keeps
  its phase and its compiled graph.
* Whether a function holds something the taps wrap is decided without running user code:
  by what its code refers to (``holds_taps``: an optimizer, a clip or loss-scale cell,
  a clip or ``mindspore.amp`` function, through closures, globals, the attributes its
  code names, a few calls deep), and, for a graph compiled before the taps, by what that
  graph holds (``optimizer_state``: the Parameters every ``nn.Optimizer`` and
  ``mindspore.experimental.optim`` optimizer creates). Where both say no, the function
  keeps its graph; a graph it compiles under the taps that does hold a wrapper of ours
  (its Parameters are named ``msmon_*``) is dropped when they go off.
* When the taps go off, every phase it saw that holds a wrapper of ours, and every phase
  of its own, is removed from the cache (its graph is not freed: MindSpore's
  ``del_net_res`` on such a phase left a null actor behind, and the next graph step of
  the process crashed -- "The pointer[actor] is null", then a segmentation fault, seen on
  2.10 with the device grad_norm path); the cell graphs it dropped
  for the taps (a train cell run in GRAPH_MODE keeps its graphs in its own
  ``compile_cache``) are dropped again, so nothing of ours stays in a user's graph.

* Activations and attention (``collect.acttaps``) get a graph of their own: while a
  collected step's graph call runs with their classes swapped in, ``variant`` is
  ``ACT_SUFFIX`` and every jit function compiled then, and every prepared or varied
  train cell (``vary_cell``: a ``Model.train`` callback's), gets ``ACT_SUFFIX + SUFFIX``
  after its phase; the other steps keep the graph without them. Being ours, those
  phases end with SUFFIX and are dropped with the rest.

MindSpore 2.7.1 and 2.10 both key jit graphs this way (``compile(self, method_name,
*args, **kwargs)`` returning the phase, ``_cell_cache_key_extend``, ``ms_compile_cache``,
the graph executor's ``get_params`` and ``del_net_res``); each piece is looked up.
Without the cache the graph compiled before the taps keeps running without them (the
watch says so); without ``_cell_cache_key_extend`` such a graph compiles again under its
own phase, and again after the taps, as all did before.
"""

from __future__ import annotations

import inspect
import logging
import types
from collections.abc import Callable, Iterable
from contextlib import AbstractContextManager, nullcontext
from typing import Any

from msmon_nb.collect.hooks import closure_filled, compile_cache, is_optimizer, jit_api
from msmon_nb.collect.patches import Patches
from msmon_nb.collect.tapguard import drop_compiled

log = logging.getLogger(__name__)

# ends the phases our taps compile under: a function's graph from before the taps is
# another cache entry and survives them
SUFFIX = ".msmon_tapped"
# stands before SUFFIX in the phases compiled while a collected step's activation and
# attention classes are swapped in (``collect.acttaps``): that graph is keyed apart from
# the one the other steps run, and ends with SUFFIX like every phase of ours
ACT_SUFFIX = ".msmon_act"
# how many calls deep ``holds_taps`` follows the functions a step calls
DEPTH = 4
# the modules whose functions the taps wrap or that call what they wrap
# (``ops.clip_by_global_norm``/``clip_by_norm``, ``amp.all_finite``, the loss scalers)
TAPPED_MODULES = ("mindspore.ops.function.clip_func", "mindspore.amp")
# what every optimizer keeps in a Parameter of its own, whatever its class: the step
# count of ``nn.Optimizer``, the lr Parameter(s) of both optimizer bases
_STATE = ("global_step", "learning_rate")


def ours(names: Iterable[str]) -> bool:
    """Whether a graph with these Parameter names holds a tap of ours (every tap
    Parameter is named ``msmon_*``: ``collect.graph.tap_scalar``)."""
    return any(name.startswith("msmon_") for name in names)


def optimizer_state(names: Iterable[str]) -> bool:
    """Whether a graph with these Parameter names runs an optimizer update: it holds the
    Parameters each optimizer base creates for itself (``global_step``, ``learning_rate``,
    ``learning_rate_group_<i>``). Evidence, not proof: a user's Parameter of that name
    costs one needless compile, never a wrong value."""
    return any(name.startswith(_STATE) for name in names)


def graph_params(executor: Any, phase: str) -> list[str]:
    """The Parameter names of the graph compiled under ``phase`` (empty where this
    MindSpore cannot tell)."""
    get = getattr(executor, "get_params", None)
    if get is None:
        return []
    try:
        return list(get(phase) or ())
    except Exception:  # a phase MindSpore no longer knows: nothing held
        log.debug("msmon: no params for %s", phase, exc_info=True)
        return []


class Recompiler:
    """The phases and cells our taps made compile, and dropping exactly those.
    ``wrapped``: the Cell classes the taps wrap and the objects they change in place
    (asked once, at the first decision)."""

    def __init__(
        self,
        wrapped: Callable[[], tuple[Any, ...]] = tuple,
        around: Callable[[Any], AbstractContextManager[Any]] | None = None,
    ) -> None:
        self.cache = compile_cache()
        # entered around a keyed train cell's compile (``StepTaps.compiling``)
        self._around = around or (lambda cell: nullcontext())
        self._patches = Patches()
        self._ask = wrapped
        self._wrapped: tuple[tuple[type, ...], tuple[Any, ...]] | None = None
        # per jit function ((fn, obj) ids and its creation stamp): (fn, obj, holds taps)
        self._decided: dict[tuple[int, int, Any], tuple[Any, Any, bool]] = {}
        # phase -> the graph executor that compiled it, for each phase compiled or run
        # while installed
        self._phases: dict[str, Any] = {}
        self._cells: list[Any] = []  # graph-mode cells whose own graphs were dropped
        # graph-mode cells compiling under a phase of their own, and the phases they got
        self._keyed: list[Any] = []
        self._keyed_phases: list[tuple[Any, str]] = []
        self._cell_patches = Patches()
        # the phase (and its graph executor) the watched top-level jit call compiled
        # under (``expect_call``), and per phase whether its graph runs an update
        self._called: tuple[str, Any] | None = None
        self._updates: dict[str, bool] = {}
        # ACT_SUFFIX while a collected step runs with the activation classes swapped in
        # (``acttaps.GraphActivations.begin``): whatever compiles then is keyed apart
        self.variant = ""
        # train cells whose graphs compiled under the variant are keyed apart, their
        # other graphs left as they are (a ``Model.train`` callback keeps both on the
        # cell between calls and drops them itself when its monitor closes)
        self._varied: list[Any] = []

    @property
    def installed(self) -> bool:
        return bool(self._patches)

    def install(self) -> None:
        """Wrap ``_JitExecutor.compile`` (nothing where this MindSpore has no jit cache
        or no ``phase`` argument to give it: the graphs compiled before keep running)."""
        if self._patches or self.cache is None:
            return
        executor = getattr(jit_api(), "_JitExecutor", None)
        original = vars(executor).get("compile") if executor is not None else None
        if original is None:
            return
        self._patches.put(executor, "compile", self._hook(original))

    def uninstall(self) -> None:
        """Put ``compile`` back and drop what holds a tap of ours or is our own copy."""
        self._patches.restore()
        cache = self.cache
        for phase, executor in self._phases.items():
            if cache is None or phase not in cache:
                continue
            if phase.endswith(SUFFIX) or ours(graph_params(executor, phase)):
                cache.discard(phase)
        self._phases.clear()
        self._decided.clear()
        self._updates.clear()
        self._called = None
        drop_compiled(self._cells)
        self._cells.clear()
        self._cell_patches.restore()
        for cell, phase in self._keyed_phases:  # not freed: see the module docstring
            cache = getattr(cell, "compile_cache", None)
            if isinstance(cache, set):
                cache.discard(phase)
        self._keyed.clear()
        self._keyed_phases.clear()
        self._varied.clear()
        self.variant = ""

    def keys_jit(self) -> bool:
        """Whether jit functions compiled under the variant get a phase of their own:
        installed, and this MindSpore's ``_JitExecutor`` takes a cache key extension."""
        if not self._patches:
            return False
        executor = getattr(jit_api(), "_JitExecutor", None)
        try:
            params = inspect.signature(executor.__init__).parameters
        except (TypeError, ValueError, AttributeError):
            return False
        return "cell_cache_key_extend" in params

    def keys(self, cell: Any) -> bool:
        """Whether ``cell``'s graphs compiled under the variant get a phase of their own
        (it was prepared, or varied, with ``_key_cells`` in place)."""
        return bool(self._cell_patches) and any(c is cell for c in (*self._keyed, *self._varied))

    def vary_cell(self, cell: Any) -> bool:
        """Key ``cell``'s graph compiled under the variant apart (its phase + ACT_SUFFIX
        + SUFFIX) and leave its other graphs under its own phase. False where this
        MindSpore cannot key cell graphs."""
        if not isinstance(getattr(cell, "compile_cache", None), set) or not self._key_cells():
            return False
        if not self.keys(cell):
            self._varied.append(cell)
        return True

    def prepare_cell(self, cell: Any) -> bool:
        """A train cell run in GRAPH_MODE under the taps compiles with them once. Where
        the cell executor can be keyed (``_key_cells``), under a phase of its own: the
        graph it had before stays cached beside it, so after the watch its next call
        compiles nothing (a hand-driven cell's first step after close was 0.7-1.0 s, a
        whole compile). Otherwise its own compiled graphs are dropped, so that it
        compiles with the taps, and again when they go off. True when prepared now."""
        cache = getattr(cell, "compile_cache", None)
        if any(c is cell for c in (*self._cells, *self._keyed)) or not isinstance(cache, set):
            return False
        if self._key_cells():
            self._keyed.append(cell)
            return True
        cache.clear()
        self._cells.append(cell)
        return True

    def _key_cells(self) -> bool:
        """Wrap ``_CellGraphExecutor``'s ``compile`` and ``run`` (once): for a prepared
        cell both get the cell's phase + ``SUFFIX``, so MindSpore keys the graph compiled
        with the taps apart from the one it had (``_real_phase`` builds the key from
        that phase, in both). False where this MindSpore has no such pair."""
        if self._cell_patches:
            return True
        executor = getattr(jit_api(), "_CellGraphExecutor", None)
        found = vars(executor) if isinstance(executor, type) else {}
        compile_, run = found.get("compile"), found.get("run")
        if not callable(compile_) or not callable(run):
            return False
        suffix = self._cell_suffix

        def compile(executor, obj, *args, phase="predict", **kwargs):
            extra = suffix(obj, phase)
            if not extra:
                return compile_(executor, obj, *args, phase=phase, **kwargs)
            with self._around(obj):
                out = compile_(executor, obj, *args, phase=phase + extra, **kwargs)
            full = out[0] if isinstance(out, tuple) and out else out
            if isinstance(full, str) and any(c is obj for c in self._keyed):
                self._keyed_phases.append((obj, full))
            return out

        def run_keyed(executor, obj, *args, phase="predict"):
            return run(executor, obj, *args, phase=phase + suffix(obj, phase))

        self._cell_patches.put(executor, "compile", compile)
        self._cell_patches.put(executor, "run", run_keyed)
        return True

    def _cell_suffix(self, obj: Any, phase: Any) -> str:
        """What a prepared or varied cell's phase gets: SUFFIX for a prepared one, the
        variant before it while the variant is on; nothing for any other cell."""
        if not isinstance(phase, str) or phase == "save" or phase.endswith(SUFFIX):
            return ""
        if self.variant and any(c is obj for c in (*self._keyed, *self._varied)):
            return self.variant + SUFFIX
        return SUFFIX if any(c is obj for c in self._keyed) else ""

    def holds(self, executor: Any) -> bool:
        """Whether the function ``executor`` compiles holds something the taps wrap, by
        what its code refers to (``holds_taps``); decided once per function."""
        fn, obj = getattr(executor, "fn", None), getattr(executor, "obj", None)
        key = (id(fn), id(obj), getattr(executor, "_create_time", None))
        known = self._decided.get(key)
        if known is None or known[0] is not fn or known[1] is not obj:
            try:
                holds = holds_taps(fn, obj, self._tapped)
            except Exception:  # unsure: compile it with the taps, as before
                log.debug("msmon: could not tell what %r refers to", fn, exc_info=True)
                holds = True
            known = self._decided[key] = (fn, obj, holds)
        return known[2]

    def _mark(self, executor: Any) -> None:
        fn, obj = getattr(executor, "fn", None), getattr(executor, "obj", None)
        self._decided[(id(fn), id(obj), getattr(executor, "_create_time", None))] = (fn, obj, True)

    def expect_call(self) -> None:
        """A top-level jit call of the user's begins: the first phase compiled from now
        on is its graph's (a nested jit function is inlined, it compiles nothing)."""
        self._called = None

    def call_updates(self) -> bool | None:
        """Whether the graph the last expected call ran holds an optimizer update (by
        its Parameters: ``optimizer_state``), read once per phase; None where no phase
        was seen (not installed, or this MindSpore compiled it elsewhere). A jit step
        called with ``optimizer_update=False`` (MindYOLO's host accumulation) compiles a
        graph of its own without the optimizer's Parameters: that is how the watch
        tells a micro-batch's call from an update without running anything."""
        called = self._called
        if called is None:
            return None
        phase, graphs = called
        known = self._updates.get(phase)
        if known is None:
            known = self._updates[phase] = optimizer_state(graph_params(graphs, phase))
        return known

    def _hook(self, original: Any) -> Any:
        recompiler = self

        def compile(executor, method_name, *args, **kwargs):
            out = recompiler.compile(original, executor, method_name, args, kwargs)
            if recompiler._called is None and isinstance(out, str):
                recompiler._called = (out, getattr(executor, "_graph_executor", None))
            return out

        return compile

    def compile(
        self, original: Any, executor: Any, method_name: str, args: tuple, kwargs: dict
    ) -> str:
        """MindSpore's ``compile``, under our own phase for a function that holds a tap.
        A function the references say nothing about, met with a graph compiled before
        the taps that runs an optimizer update, is compiled again under our phase too."""
        graphs = getattr(executor, "_graph_executor", None)
        if self.variant or self.holds(executor):
            return self._compile_tapped(original, executor, method_name, args, kwargs)
        cached = len(self.cache)
        out = original(executor, method_name, *args, **kwargs)
        if out in self._phases:
            return out
        self._phases[out] = graphs
        if len(self.cache) != cached or not optimizer_state(graph_params(graphs, out)):
            # compiled just now, under the taps (dropped when they go off if it holds
            # one), or a graph from before that runs no optimizer: it stays as it is
            return out
        self._mark(executor)
        return self._compile_tapped(original, executor, method_name, args, kwargs)

    def _compile_tapped(
        self, original: Any, executor: Any, method_name: str, args: tuple, kwargs: dict
    ) -> str:
        graphs = getattr(executor, "_graph_executor", None)
        extend = getattr(executor, "_cell_cache_key_extend", None)
        if isinstance(extend, str):
            executor._cell_cache_key_extend = extend + self.variant + SUFFIX
            try:
                out = original(executor, method_name, *args, **kwargs)
            finally:
                executor._cell_cache_key_extend = extend
        else:  # no way to key our own phase: the graph from before compiles again
            out = original(executor, method_name, *args, **kwargs)
            if not ours(graph_params(graphs, out)):
                self.cache.discard(out)
                out = original(executor, method_name, *args, **kwargs)
        self._phases.setdefault(out, graphs)
        return out

    def _tapped(self, obj: Any) -> bool:
        """Whether ``obj`` is something the taps wrap, or a cell that holds one."""
        from mindspore import nn

        kinds, objects = self._wrapped_now()
        if is_optimizer(obj) or any(obj is o for o in objects):
            return True
        if isinstance(obj, nn.Cell):
            return any(is_optimizer(c) or isinstance(c, kinds) for _, c in obj.cells_and_names())
        if isinstance(obj, type | types.ModuleType):
            return False
        module = getattr(obj, "__module__", None) if callable(obj) else None
        module = module or type(obj).__module__
        return isinstance(module, str) and module.startswith(TAPPED_MODULES)

    def _wrapped_now(self) -> tuple[tuple[type, ...], tuple[Any, ...]]:
        if self._wrapped is None:
            found = tuple(self._ask())
            kinds = tuple(k for k in found if isinstance(k, type))
            self._wrapped = (kinds, tuple(o for o in found if not isinstance(o, type)))
        return self._wrapped


def holds_taps(fn: Any, obj: Any, tapped: Any, depth: int = DEPTH) -> bool:
    """Whether ``tapped`` accepts anything a jit function refers to: its bound object,
    the objects its code names by closure or global, the attributes of those its code
    names (``self.optimizer``, ``ops.clip_by_global_norm``), the items of containers
    among them, and so on through the functions and methods found, ``depth`` calls
    deep. Attributes are read without running code (``inspect.getattr_static``; a
    property is not followed), a Cell's sub-cells as MindSpore lists them."""
    seen: set[int] = set()
    stack: list[tuple[Any, tuple[str, ...], int]] = []
    if obj is not None:
        stack.append((obj, (), depth))
        if isinstance(fn, types.FunctionType):
            fn = types.MethodType(fn, obj)
    stack.append((fn, (), depth))
    while stack:
        item, names, left = stack.pop()
        if item is None or id(item) in seen or _inert(item):
            continue
        seen.add(id(item))
        if tapped(item):
            return True
        if left <= 0:
            continue
        stack.extend((ref, refs, left - 1) for ref, refs in _referred(item, names))
    return False


def _referred(item: Any, names: tuple[str, ...]) -> list[tuple[Any, tuple[str, ...]]]:
    """What ``item`` leads to, each with the names to follow on it."""
    if isinstance(item, types.MethodType):
        own = _code_names(item.__func__)
        out = [(item.__func__, ())]
        out += [(_attribute(item.__self__, n), own) for n in own]
        return out
    if isinstance(item, types.FunctionType):
        own = _code_names(item)
        out = [(c.cell_contents, own) for c in item.__closure__ or () if closure_filled(c)]
        found = item.__globals__
        out += [(found[n], own) for n in own if n in found]
        return out
    if isinstance(item, types.ModuleType):
        return [(getattr(item, n, None), names) for n in names]
    if isinstance(item, list | tuple | set | frozenset):
        return [(v, names) for v in list(item)[:64]]
    if isinstance(item, dict):
        return [(v, names) for v in list(item.values())[:64]]
    construct = _attribute(item, "construct") if _is_cell(item) else None
    out = [(construct, ())] if construct is not None else []
    if not isinstance(item, type):
        out += [(_attribute(item, n), names) for n in names]
    return out


def _code_names(fn: Any) -> tuple[str, ...]:
    """The global and attribute names ``fn``'s code uses, nested functions' included."""
    code = getattr(fn, "__code__", None)
    out: list[str] = []
    stack = [code] if code is not None else []
    while stack:
        code = stack.pop()
        out.extend(code.co_names)
        stack.extend(c for c in code.co_consts if isinstance(c, types.CodeType))
    return tuple(dict.fromkeys(out))


def _attribute(obj: Any, name: str) -> Any:
    """``obj.name`` without running a property or ``__getattr__`` of the user's: a
    function found on the class comes back bound, a Cell's sub-cell from its cells."""
    try:
        value = inspect.getattr_static(obj, name)
    except AttributeError:
        cells = vars(obj).get("_cells") if hasattr(obj, "__dict__") else None
        return cells.get(name) if isinstance(cells, dict) else None
    if isinstance(value, staticmethod | classmethod):
        return value.__func__
    if isinstance(value, types.FunctionType) and not isinstance(obj, type):
        return types.MethodType(value, obj)
    if isinstance(value, property) or type(value).__name__ == "getset_descriptor":
        return None
    return value


def _inert(item: Any) -> bool:
    """Values that lead nowhere: numbers, strings, tensors, classes."""
    if isinstance(item, str | bytes | int | float | bool | complex | type):
        return True
    return type(item).__name__ in ("Tensor", "Parameter", "StubTensor", "ndarray")


def _is_cell(item: Any) -> bool:
    from mindspore import nn

    return isinstance(item, nn.Cell)
