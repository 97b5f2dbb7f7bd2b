"""Activations (opt-in): each selected module's forward output, and optionally its
gradient, summarised every collected step as ``act/<module>/<stat>`` and
``act_grad/<module>/<stat>`` (``stat``: ``metrics.extent.ACT_STATS``).

``track_metrics: [..., activations]`` switches it on, ``act_grad`` adds the gradient of
each output (what flows back into the module). ``module_targets`` (regexes searched in a
module's path) chooses the modules; without it, the modules that hold parameters while
none of their sub-cells does -- the leaves of the parameter tree: ``Dense``, ``Conv2d``,
``LayerNorm``, ``Embedding``..., and a ``Dense(..., activation="relu")``, whose parameterless
ReLU sub-cell runs inside it, so its output is taken after the activation, where a dying
layer's zeros show -- at most ``DEFAULT_MODULES`` of them spread evenly from the first to
the last: a 100-layer model gets 16 series per statistic, not 400, and a user who wants
one block names it.

A module's path is the prefix its parameters are named by (``fc1`` for ``fc1.weight``),
so that ``act/fc1/...`` sits beside ``param/fc1.weight/...``; a module without
parameters takes its place in the cell tree, the wrapping cells' prefix
(``_backbone.``, ``network.``) taken off the same way.

PyNative steps: forward hooks (and backward hooks for ``act_grad``) are registered at the
start of a collected step and removed at its end, so a step that is not collected runs
with no hook of ours at all. A hook only keeps a reference to the output (no copy, no
device sync inside the forward pass); the statistics are taken on the host, in float64,
when the step has ended. A hook returns None: the output and the gradient flow on
unchanged. A module called more than once in a step (accumulation's micro-batches, a
shared layer) is recorded at its first call.

Compiled steps (``@ms.jit`` steps, GRAPH_MODE train cells) run no Python hook: there the
statistics are compiled into a graph of the step's own that only collected steps run
(``collect.acttaps``); the other steps run the graph without them. Their network is the
train cell, or the cell with the most parameters that the jit step refers to
(``compiled_root``). ``act_grad`` is not recorded inside graphs, nor in
``Model.train``'s callback: one warning says so.

MindNLP models (transformers on ``mindtorch``, whose modules are no Cells): the
network is the first mindtorch module called in a collected step's forward pass
(``collect.torchmodules``' root hook), its modules are its ``named_modules()`` and the
default is again the leaves of its parameter tree; the same forward hooks (mindtorch's
``register_forward_hook``) keep the outputs. ``act_grad`` is not recorded there: mindtorch
0.5.1 runs no module backward hook (``_call_impl`` has that code commented out) and its
``Tensor.register_hook`` raises (it reads a ``_data`` the tensor lacks), so there is no
safe way to see an output's gradient; one warning says so. Attention there is
``collect.torchattn``'s.

``attention`` (``collect.attention``) rides on the same arming: its hooks go on the
attention modules of the same network (``collect.attnform``: every
``nn.MultiheadAttention`` and what ``attention_targets`` names) on the same collected
steps, and come off with these; in compiled steps their signals are compiled in beside
the activations' (``collect.attntaps``, the same graph). So does ``moe`` (``collect.moe``:
the routers' gates), in PyNative steps only. ``outputs`` False (``attention`` or ``moe``
without ``activations``) records only those.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Sequence
from typing import Any

from msmon_nb.collect.attention import AttentionHooks, attention_modules
from msmon_nb.collect.attnsoftmax import is_softmax_form
from msmon_nb.collect.hooks import closure_filled, is_optimizer
from msmon_nb.collect.moe import RouterHooks, router_modules
from msmon_nb.collect.tensors import flatten_tensors, to_numpy
from msmon_nb.collect.torchattn import TorchAttention
from msmon_nb.collect.torchattn import attention_modules as torch_attention_modules
from msmon_nb.collect.torchmodules import RootHook, is_leaf_holder, is_module
from msmon_nb.collect.torchmodules import module_class as torch_module_class
from msmon_nb.collect.torchmodules import module_paths as torch_module_paths
from msmon_nb.collect.values import param_tag
from msmon_nb.metrics.extent import ACT_STATS, tensor_extent

# the track_metrics that switch this recorder on
INSIDE_METRICS = ("activations", "act_grad", "attention", "moe")
# how many modules the default selection takes (module_targets unset)
DEFAULT_MODULES = 16


def module_paths(root: Any) -> list[tuple[str, Any]]:
    """``[(path, cell)]`` of every cell under ``root`` (itself excluded), each path
    spelled as its parameters are named where it holds some (``_own_params``), the
    wrapping cells' prefix taken off the others the same way."""
    inside = {
        id(c) for _, o in root.cells_and_names() if is_optimizer(o) for _, c in o.cells_and_names()
    }
    cells = [(n, c) for n, c in root.cells_and_names() if n and id(c) not in inside]
    strip = ""
    for name, cell in cells:
        own = _own_params(cell)
        if own:
            prefix = own[0].rpartition(".")[0]
            if prefix and name.endswith(prefix):
                strip = name[: len(name) - len(prefix)]
            break
    out = []
    for name, cell in cells:
        own = _own_params(cell)
        path = own[0].rpartition(".")[0] if own else name
        if not own and strip and path.startswith(strip):
            path = path[len(strip) :]
        out.append((path or name, cell))
    return out


def _own_params(cell: Any) -> list[str]:
    """Names of the parameters ``cell`` holds itself (not its sub-cells')."""
    held = getattr(cell, "_params", None) or {}
    return [str(getattr(p, "name", key)) for key, p in held.items() if p is not None]


def _leaf(cell: Any) -> bool:
    """Whether no sub-cell of ``cell``, at any depth, holds parameters of its own (an
    activation cell inside a ``Dense`` holds none)."""
    return not any(_own_params(sub) for _, sub in cell.cells_and_names() if sub is not cell)


def network_paths(root: Any) -> list[tuple[str, Any]]:
    """``[(path, module)]`` under ``root``: a Cell's (``module_paths``) or a mindtorch
    module's (``torchmodules.module_paths``)."""
    return torch_module_paths(root) if is_module(root) else module_paths(root)


def select_modules(root: Any, targets: Sequence[str] | None) -> list[tuple[str, Any]]:
    """The modules ``targets`` selects under ``root`` (``module_targets``), each once,
    in the tree's order; None: the default (the module docstring). ``root`` is a Cell or
    a mindtorch module."""
    paths = network_paths(root)
    torch = is_module(root)
    seen: set[int] = set()
    chosen = []
    if targets is None:
        if torch:
            leaves = [(path, m) for path, m in paths if is_leaf_holder(m)]
        else:
            leaves = [(path, cell) for path, cell in paths if _own_params(cell) and _leaf(cell)]
        if len(leaves) > DEFAULT_MODULES:
            last = len(leaves) - 1
            spread = range(DEFAULT_MODULES)
            picks = sorted({round(i * last / (DEFAULT_MODULES - 1)) for i in spread})
            leaves = [leaves[i] for i in picks]
        candidates = leaves
    else:
        patterns = [re.compile(t) for t in targets]
        candidates = [(p, c) for p, c in paths if any(rx.search(p) for rx in patterns)]
    for path, cell in candidates:
        if id(cell) not in seen:
            seen.add(id(cell))
            chosen.append((path, cell))
    return chosen


def graph_mode() -> bool:
    """Whether cells called from Python now run compiled (GRAPH_MODE)."""
    import mindspore as ms

    return ms.get_context("mode") == ms.GRAPH_MODE


def jit_root(executor: Any) -> Any:
    """The network a jit step runs: the Cell it is a method of, else the Cell with the
    most parameters among those its function refers to (closures, globals, three levels
    of the functions it calls: a ``value_and_grad`` over a forward that calls the
    network). Read, never called."""
    from mindspore import nn

    obj = getattr(executor, "obj", None)
    if isinstance(obj, nn.Cell) and not is_optimizer(obj):
        return obj
    found: list[Any] = []

    def keep(item: Any) -> None:
        if isinstance(item, nn.Cell) and not is_optimizer(item):
            found.append(item)

    _walk(getattr(executor, "fn", None), keep, 3, set())
    if not found:
        return None
    return max(found, key=lambda c: len(list(c.get_parameters())))


def _walk(fn: Any, keep: Callable[[Any], None], depth: int, seen: set[int]) -> None:
    """Hand ``keep`` every object ``fn`` refers to by closure or global name, and those
    of the functions among them, ``depth`` levels down."""
    fn = getattr(fn, "__wrapped__", fn)
    code = getattr(fn, "__code__", None)
    if code is None or depth == 0 or id(fn) in seen:
        return
    seen.add(id(fn))
    items = [c.cell_contents for c in (fn.__closure__ or ()) if closure_filled(c)]
    names = getattr(fn, "__globals__", {})
    items += [names[n] for n in code.co_names if n in names]
    for item in items:
        keep(item)
        inner = getattr(item, "fn", None) or getattr(item, "__func__", None) or item
        if callable(inner):
            _walk(inner, keep, depth - 1, seen)


def _hook_state(cell: Any) -> tuple[dict[str, Any], set[str] | None]:
    """What registering a hook changes on ``cell``, as it is now: its hook attributes
    and the names of its primitives.

    ``handle.remove()`` empties the hook dicts but leaves what registering made (MindSpore
    2.10: ``_lazy_*_hook`` dicts where None stood, a ``CellBackwardHook`` primitive in
    ``_cell_backward_hook`` and ``_primitives``); ``_restore_hook_state`` puts the
    cell back as it was, so that its steps between collected ones, and its training after
    the watch, run exactly the code they ran without us."""
    state = {k: v for k, v in vars(cell).items() if "hook" in k}
    primitives = getattr(cell, "_primitives", None)
    return state, (set(primitives) if isinstance(primitives, dict) else None)


def _restore_hook_state(cell: Any, state: dict[str, Any], primitives: set[str] | None) -> None:
    """Undo ``_hook_state``'s changes by writing the instance dict directly (not through
    ``Cell.__setattr__``, which would file a primitive again)."""
    held = vars(cell)
    for key in [k for k in held if "hook" in k]:
        if key in state:
            held[key] = state[key]
        else:
            del held[key]
    table = held.get("_primitives")
    if primitives is not None and isinstance(table, dict):
        for key in [k for k in table if k not in primitives]:
            del table[key]


def _first_tensor(value: Any) -> Any:
    """The first tensor of a module's output (a tuple's first; a dict's first value)."""
    leaves = flatten_tensors(value)
    return leaves[0] if leaves else None


class Activations:
    """One watch's activation recorder (PyNative): hooks on collected steps only."""

    def __init__(
        self,
        targets: Sequence[str] | None,
        grads: bool,
        warn_once: Callable[[str, str], None],
        outputs: bool = True,
        attention: bool = False,
        attention_targets: Sequence[str] | None = None,
        moe: bool = False,
        offer_module: Callable[[Any], None] | None = None,
    ) -> None:
        self.targets = None if targets is None else list(targets)
        self.grads = grads
        self.outputs = outputs or grads  # act/... recorded (else only attn/...)
        self.attention: AttentionHooks | None = AttentionHooks() if attention else None
        self.attention_targets = list(attention_targets or ())
        self.attn_modules: list[tuple[str, Any, Any]] = []  # (path, cell, attnform form)
        # a mindtorch network's attention (collect.torchattn): (tag prefix, path, module)
        self.torch_attn: TorchAttention | None = None
        self.torch_attn_modules: list[tuple[str, str, Any]] = []
        # the watch's judge of a mindtorch module call (collect.torchmodules.RootHook)
        self.offer_module = offer_module
        self.root_hook: RootHook | None = None
        self.moe: RouterHooks | None = RouterHooks() if moe else None
        self.routers: list[tuple[str, Any, int]] = []
        self.warn_once = warn_once
        self.root: Any = None
        self.modules: list[tuple[str, Any]] = []
        self.handles: list[Any] = []
        self.before: list[tuple[Any, dict[str, Any], set[str] | None]] = []  # _hook_state
        self.kept: dict[str, Any] = {}  # tag prefix -> the tensor seen this step
        self.wants_root = False  # a collected step began before the network was known
        self.computed = 0  # statistics computed (one per module and kind, per step)
        self.graph: Any = None  # collect.acttaps.GraphActivations, once a compiled step ran
        self.failed = False  # a compiled step could not compile its taps: none again
        self.collecting = False
        self.calls = 0  # hook calls: only collected steps make any

    def arm(self, collect: bool) -> None:
        """A step begins: on a collected one, hook the modules (once the network is
        known; until then ``see`` waits for its first cell call)."""
        self.disarm()
        self.collecting = collect
        if self.graph is not None:
            self.graph.set_collect(collect)
        if not collect:
            return
        if self.root is None:
            self.wants_root = True
            if self.offer_module is not None and torch_module_class() is not None:
                self.root_hook = RootHook(self.offer_module)  # a MindNLP network, maybe
        else:
            self._hook()

    def see(self, cell: Any) -> None:
        """The first cell a collected step calls (a PyNative forward pass's outer cell):
        the network, whose modules are selected once and hooked now, before its own
        ``construct`` runs them."""
        self.wants_root = False
        self._drop_root_hook()
        if self.root is None:
            self.root = cell
            self.modules = select_modules(cell, self.targets) if self.outputs else []
            if self.attention is not None and is_module(cell):
                self._torch_attention(cell)
            elif self.attention is not None:
                self.attn_modules = self._attention_modules(cell)
            if self.grads and is_module(cell):
                self.grads = False
                self.warn_once(
                    "act_grad torch",
                    "act_grad is not recorded for MindNLP (mindtorch) models: mindtorch 0.5 "
                    "runs no module backward hook (and its Tensor.register_hook fails); "
                    "act/... is recorded; training goes on",
                )
            if self.moe is not None and is_module(cell):
                self.warn_once(
                    "moe torch",
                    "moe: the routers of MindNLP (mindtorch) models are not followed yet; no "
                    "moe/... series are recorded; training goes on",
                )
            elif self.moe is not None:
                self.routers = router_modules(network_paths(cell))
                if not self.routers:
                    self.warn_once(
                        "moe none",
                        f"moe: {type(cell).__name__} holds no router msmon recognises (a cell "
                        "with an expert count and a top-k holding a Dense gate with one output "
                        "per expert, as MindFormers' Router); no moe/... series are recorded",
                    )
            if self.outputs and not self.modules:
                self.warn_once(
                    "activations none",
                    f"activations: module_targets {self.targets} select none of "
                    f"{type(cell).__name__}'s modules (e.g. "
                    f"{[p for p, _ in network_paths(cell)][:5]}); nothing is recorded",
                )
        self._hook()

    def _drop_root_hook(self) -> None:
        if self.root_hook is not None:
            self.root_hook.remove()
            self.root_hook = None

    def _torch_attention(self, root: Any) -> None:
        """A mindtorch network's attention modules (``collect.torchattn``), found once;
        none found, and each pattern naming none, warn once."""
        found, problems = torch_attention_modules(network_paths(root), self.attention_targets)
        for problem in problems:
            self.warn_once(f"attention {problem}", f"{problem}; training goes on")
        self.torch_attn = TorchAttention(self.warn_once)
        self.torch_attn_modules = [(f"attn/{param_tag(p)}", p, m) for p, m in found]
        if not found:
            self.warn_once(
                "attention none",
                f"attention: {type(root).__name__} holds no attention module msmon "
                "recognises (a module with query and key projections: query/key, q_proj/"
                "k_proj..., or a packed qkv_proj/c_attn) and attention_targets names none; "
                "no attn/... series are recorded",
            )

    def _hook(self) -> None:
        for path, cell in self.modules:
            name = param_tag(path)
            if not is_module(cell):  # (mindtorch's handle.remove() leaves nothing behind)
                self.before.append((cell, *_hook_state(cell)))
            self.handles.append(cell.register_forward_hook(self._forward(f"act/{name}")))
            if self.grads:
                self.handles.append(cell.register_backward_hook(self._backward(f"act_grad/{name}")))
        for path, cell, form in self.attn_modules if self.attention is not None else ():
            if is_softmax_form(form):  # no hook: its softmax shadowed for the step
                self.handles.append(
                    self.attention.capture(f"attn/{param_tag(path)}", form, self._count)
                )
                continue
            self.before.append((cell, *_hook_state(cell)))
            hook = self.attention.hook(f"attn/{param_tag(path)}", form, self._count)
            self.handles.append(cell.register_forward_hook(hook, with_kwargs=True))
        for path, gate, k in self.routers if self.moe is not None else ():
            self.before.append((gate, *_hook_state(gate)))
            hook = self.moe.hook(param_tag(path), k, self._count)
            self.handles.append(gate.register_forward_hook(hook))
        if self.torch_attn is not None:
            self.torch_attn.arm(self.torch_attn_modules, self._count)

    def _count(self) -> None:
        self.calls += 1

    def _forward(self, prefix: str) -> Callable[..., None]:
        kept = self.kept

        def forward_hook(cell, inputs, output):
            self.calls += 1
            if prefix not in kept:
                kept[prefix] = _first_tensor(output)

        return forward_hook

    def _backward(self, prefix: str) -> Callable[..., None]:
        kept = self.kept

        def backward_hook(cell, grad_input, grad_output):
            # MindSpore 2.x: grad_output is the gradient of the cell's output
            self.calls += 1
            if prefix not in kept:
                kept[prefix] = _first_tensor(grad_output)

        return backward_hook

    def tap_failed(self) -> None:
        """A compiled step failed compiling a tap of ours (``tapguard``), and its classes
        are back: no graph of this watch taps them again, nothing stale is read."""
        self.failed = True
        if self.graph is not None:
            self.graph.end()
        self.graph = None

    def switched(self) -> bool:
        """Whether this step's graph call must run with the classes swapped in, keyed
        apart (``GraphActivations.begin``): a collected step, a switched graph."""
        graph = self.graph
        return self.collecting and graph is not None and graph.switched

    def close(self) -> None:
        """The watch ends: hooks off, swapped classes back."""
        self.disarm()
        if self.graph is not None:
            self.graph.end()
            self.graph.uninstall()

    def disarm(self) -> None:
        """Remove every hook of ours (a step ended, or the watch closes)."""
        for handle in self.handles:
            handle.remove()
        self.handles.clear()
        for cell, state, primitives in reversed(self.before):
            _restore_hook_state(cell, state, primitives)
        self.before.clear()
        if self.torch_attn is not None:
            self.torch_attn.disarm()
        self._drop_root_hook()
        self.wants_root = False

    def compiled_root(self, root: Any, reuse: Any = None, switched: bool = False) -> None:
        """A compiled step is about to run (compile, the first time) with ``root`` as its
        network: its selected modules' tapped classes are made, once. ``switched``: the
        loop's collected steps can run a graph of their own (``collect.recompile`` keys
        it apart), so the classes go on only around those (``collecting``); else they go
        on now, for the watch, and compute while a flag says so. ``reuse``: the
        ``GraphActivations`` a graph of ``root`` was compiled with (an earlier
        ``Model.train`` call's), whose classes serve again."""
        self.wants_root = False
        if self.graph is not None or root is None or self.failed:
            return
        if self.moe is not None:
            self.warn_once(
                "moe compiled",
                "moe: router signals are recorded in PyNative steps only; this step runs "
                "compiled (a @ms.jit step or a GRAPH_MODE train cell), so they are not "
                "recorded for it; training goes on",
            )
            return
        if reuse is not None:
            self.graph = reuse
            if not reuse.switched:
                reuse.install()
            reuse.set_collect(self.collecting)
            return
        from msmon_nb.collect.acttaps import GraphActivations

        modules = select_modules(root, self.targets) if self.outputs else []
        if self.outputs and not modules:
            self.warn_once("activations none", f"activations: no module selected in {root!r}")
        attn = self._attention_modules(root) if self.attention is not None else []
        self._softmax_compiled([(p, c) for p, c, f in attn if is_softmax_form(f)])
        attn = [item for item in attn if not is_softmax_form(item[2])]
        if not modules and not attn:
            return
        self.graph = GraphActivations(modules, attn, switched)
        self.graph.set_collect(self.collecting)
        if self.grads:
            self.warn_once(
                "act_grad compiled",
                "act_grad is recorded in PyNative steps; inside this compiled step only the "
                "activations are (act/...), not their gradients; training goes on",
            )

    def _softmax_compiled(self, found: list[tuple[str, Any]]) -> None:
        """Modules followed through their softmax (``attnsoftmax``) in a compiled step:
        one warning naming them; the step runs as it is."""
        if found:
            names = ", ".join(f"{p} ({type(c).__name__})" for p, c in found)
            self.warn_once(
                "attention softmax compiled",
                f"attention: {names} are followed through the scores they feed their softmax, "
                "which only a PyNative step shows; this step runs compiled (a @ms.jit step, a "
                "GRAPH_MODE train cell or Model.train), so no attn/... series are recorded for "
                "them. To record them, collect in PyNative (ms.set_context(mode="
                "ms.PYNATIVE_MODE), the step not under @ms.jit); training goes on",
            )

    def _attention_modules(self, root: Any) -> list[tuple[str, Any, Any]]:
        """``root``'s attention modules and their forms (``attention.attention_modules``);
        each named module that does not fit, and none found at all, warn once."""
        found, problems = attention_modules(module_paths(root), self.attention_targets)
        for problem in problems:
            self.warn_once(f"attention {problem}", f"{problem}; training goes on")
        if not found:
            self.warn_once(
                "attention none",
                f"attention: {type(root).__name__} holds no attention module msmon "
                "recognises (nn.MultiheadAttention, in nn.TransformerEncoderLayer and "
                "DecoderLayer; a cell calling its own softmax primitive or nn.Softmax "
                "after a Q K^T matmul, as MindFormers' LLamaAttention) and attention_targets "
                "names none that fits; no attn/... series are recorded",
            )
        return found

    def take(self, compiled: bool = False) -> dict[str, float]:
        """The collected step's ``{tag: value}``; the hooks go and what they kept too.
        ``compiled``: the step ran a graph that holds the tapped modules."""
        self.disarm()
        out: dict[str, float] = {}
        if compiled and self.graph is not None:
            out.update(self.graph.take())
            self.computed += len(out)
            if not out:
                self.warn_once(
                    "activations stale",
                    "activations: this collected step's graph computed none of them (a jit "
                    "function compiled before the watch that holds no optimizer keeps its "
                    "graph, which has no activation taps); nothing is recorded for it",
                )
        for prefix, tensor in self.kept.items():
            if tensor is None:
                continue
            for stat, value in tensor_extent(to_numpy(tensor), ACT_STATS).items():
                out[f"{prefix}/{stat}"] = value
                self.computed += 1
        self.kept.clear()
        if self.attention is not None:
            out.update(self.attention.take())
            missed = self.attention.missed
            if missed and not self.attention.called:  # (an unused sibling is no news)
                names = ", ".join(p[len("attn/") :] for p in missed)
                self.warn_once(
                    "attention missed",
                    f"attention: {names} did not call their softmax in a collected step (a "
                    "flash/fused attention path, the modules did not run, or their scores could "
                    "not be copied), so no attn/... values are recorded for them; training "
                    "goes on",
                )
            self.attention.called = 0
            self.attention.missed.clear()
        if self.torch_attn is not None:
            out.update(self.torch_attn.take())
        if self.moe is not None:
            out.update(self.moe.take())
        return out

    def compiled(self, where: str) -> None:
        """A collected step ran compiled (``where``) and no network of it was found."""
        self.warn_once(
            "activations compiled",
            f"activations: this loop's {where} runs compiled and msmon found no network "
            "cell it runs (a jit step whose cells it cannot see), so no act/... series are "
            "recorded for it; training goes on",
        )
