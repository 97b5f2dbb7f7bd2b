"""``mon.callback()``: a real ``mindspore.train.Callback`` for ``Model.train``.

Loss comes from ``net_outputs`` (the first element when the train cell returns a tuple),
the learning rate from the optimizer tap, which keeps what the update's own ``get_lr()``
returned inside the graph (we never call it: ``collect.graph``); where no ``get_lr()``
ran (an update skipped for an overflow, an optimizer without one) it is read from the
optimizer's Parameters (``collect.values.read_lr``), the batch size from the dataset.
Steps are numbered
as MindSpore numbers them (``cur_step_num``, from 1), so our records line up with
``LossMonitor`` output and ``SummaryCollector`` files. MindSpore restarts that count at
1 on every ``Model.train``/``fit`` call; a later call under the same monitor ("train a
bit more") continues after the run's last step instead, so nothing recorded is
overwritten and the steps stay in order.

Gradients never leave the train cell's graph, so at ``on_train_begin`` the optimizer
classes, the clip functions and the loss-scale hooks are wrapped (``collect.gradtaps``;
restored at ``on_train_end``) and the train cell's compiled graph is dropped once, so
it compiles with them. The wrappers store, on collected steps only, the norm of what
the optimizer received (its own ``loss_scale`` undone), of what a clip call received,
the loss scale in force and whether it overflowed; ``collect.gradsource`` turns that
into ``train/grad_norm`` as docs/ARCHITECTURE.md defines it (unscaled, before clipping) and the
``grad_norm_clipped``/``loss_scale``/``overflow``/``micro_grad_norm`` tags. The loss
scale of a cell whose graph never reports it (a fixed ``scale_sense`` or ``sens``) is
read from the cell. A graph compiled while wrapped keeps the (dormant) wrappers between
``Model.train`` calls, so a second one does not compile again: the train cell keeps the
taps its graph holds (``_msmon_taps``), and a later callback on that cell -- the same
one, or another open monitor's -- reads those taps instead of making its own (each
compile of the bench MLP's train graph costs 0.5-2 s; ``bench/overhead.py`` alternating
two monitors on one model paid it at every ``Model.train`` call, 1.46x plain). When the
monitor closes (``close``), that graph is dropped: nothing of ours stays in the user's
graph, and the cell's next ``Model.train`` compiles it once without us. Other compiled
graphs (the jit ``construct`` of an optimizer in a PyNative ``Model.train``) are the
recompiler's (``collect.recompile``), installed with the taps.
"""

from __future__ import annotations

import logging
import time
from typing import TYPE_CHECKING, Any

from mindspore.train import Callback

from msmon_nb.collect.accumulation import holds_buffer
from msmon_nb.collect.activations import INSIDE_METRICS, Activations, graph_mode
from msmon_nb.collect.gradsource import param_norms, resolve, scaling_artifact
from msmon_nb.collect.gradtaps import Reading, StepTaps, tapped_names
from msmon_nb.collect.graph import probe_host_writes
from msmon_nb.collect.parts import Namer
from msmon_nb.collect.recorder import StepInputs
from msmon_nb.collect.several import attribute, optimizers_held, read_lrs, values_for
from msmon_nb.collect.tapguard import (
    ACTS_FAILED,
    TapSet,
    drop_compiled,
    failed_in_our_wrapper,
    first_line,
    run_unwrapped_on_failure,
)
from msmon_nb.collect.tensors import to_float
from msmon_nb.collect.values import cell_loss_scale, lr_in_graph, read_lr, unscale_received
from msmon_nb.config import suggest_tag
from msmon_nb.config.blame import keeps_param_norms

if TYPE_CHECKING:
    from msmon_nb.collect.recorder import Recorder

log = logging.getLogger(__name__)


class MonitorCallback(Callback):
    """Records every collected ``Model.train`` step into its ``Monitor``."""

    def __init__(self, monitor: Recorder) -> None:
        super().__init__()
        self.monitor = monitor
        self.tap: Any = None  # collect.gradtaps.StepTaps while installed
        self.network: Any = None
        # what this callback learnt reading the taps (they may be another callback's)
        self._reading: Reading | None = None
        self._scale: float | None = None
        # steps this callback saw (its own count: a monitor's step numbers also move for
        # other callbacks of the same monitor, on other models), and at its last
        # collected one: what ran through its taps in between
        self._seen = 0
        self._collected: int | None = None
        self.optimizer: Any = None
        self.batch_size: int | None = None
        self._collect = False
        self._lr: float | None = None
        self._t_begin: float | None = None
        self._t_end: float | None = None  # end of the previous step, after our own work
        self._offset = 0  # steps the run had before this Model.train call
        self._loss_cell: Any = None  # the train cell whose network has a LossTap
        # whether the train cell has a loss scale of its own to read (an attribute of
        # its class: looked up once per Model.train call, not at every step)
        self._scaled = False
        self._compile_first = False  # the train cell's graph was dropped for our taps
        # per-parameter gradient norms for diagnose.blame: the optimizer's parameter
        # names (read once per Model.train call) and the collected step's norms
        self._blame = keeps_param_norms(monitor.config)  # blame, param_stats
        self._names: tuple[str, ...] = ()
        self._norms: tuple[list[str], Any] | None = None
        self._mixed = False  # several optimizers stepped in the last step's graph
        self._lrs: dict[int, float] = {}  # each held optimizer's lr before the step
        self._namer = Namer(by_variable=monitor.config.optimizer_names)
        self._held: tuple[Any, list[Any]] | None = None
        self._calls: list[tuple[int, float]] = []
        self._compiled: list[Any] = []  # train cells whose graph this callback's taps hold
        # whether the train cell accumulates gradients (read once per Model.train call):
        # without a buffer, a step that calls no optimizer skipped its update
        self._buffer: bool | None = None
        self.acts: Any = None  # collect.activations.Activations while activations are on
        # the recompiler keying the graph of collected steps apart (switched activations)
        self._keyer: Any = None
        self._acts_compile = False  # that graph is compiled at the next collected step
        self._act_cells: list[Any] = []  # train cells compiled with activation taps

    def on_train_begin(self, run_context: Any) -> None:
        mon = self.monitor
        cb = run_context.original_args()
        network = cb.get("train_network")
        self.optimizer = cb.get("optimizer") or getattr(network, "optimizer", None)
        dataset = cb.get("train_dataset")
        if dataset is not None and self.batch_size is None:
            self.batch_size = mon.guard("reading the batch size", dataset.get_batch_size)
        self.network = network
        if self._blame:
            self._names = mon.guard("naming the parameters", tapped_names, self.optimizer) or ()
        mon.trains(network, self.optimizer)  # what checkpoint saves and lr xF scales
        mon.guard("checking in-place writes", probe_host_writes)
        self._scaled = mon.guard("reading the loss scale", cell_loss_scale, network) is not None
        self._buffer = mon.guard("reading the train cell", holds_buffer, network)
        self._install_taps(network)
        sink = bool(cb.get("dataset_sink_mode"))
        mon.guard("tapping the activations", self._tap_activations, network, sink)
        self._gate_loss(network)
        mon.attached("Model.train callback")
        # no user code reads the monitor between steps: fast steps' scalars go in batches
        mon.guard("holding fast steps' scalars", mon.hold_emits, True)
        mon.mark_step_start(restart=True)
        self._offset = 0 if mon.last_step is None else mon.last_step
        self._t_end = None

    def _tap_activations(self, network: Any, sink: bool = False) -> None:
        """``activations``: in GRAPH_MODE the train cell's selected modules get tapped
        classes (``collect.acttaps``). Where the recompiler can key the cell's graph
        compiled with them apart (``Recompiler.vary_cell``; not in sink mode, whose
        graph runs several steps), they go on only around collected steps, which run
        that graph; the other steps run the graph with the core taps only, which they
        do not recompile. Else they go on for the call and compute while a flag says so,
        and the cell's graph is dropped to compile with them. Either way, taps of the
        same selection that a graph of the cell was compiled with (an earlier
        ``Model.train`` call's, kept on the cell as ``_msmon_acts``: their Parameters
        are the graph's) serve again, so that a loop of ``model.train(1, ...)`` calls
        compiles once; in PyNative the hooks go on at each collected step's begin."""
        config = self.monitor.config
        if network is None or not any(config.tracks(m) for m in INSIDE_METRICS):
            return
        acts = Activations(
            config.module_targets,
            config.tracks("act_grad"),
            self.monitor.warn_once,
            outputs=config.tracks("activations"),
            attention=config.tracks("attention"),
            attention_targets=config.attention_targets,
            moe=config.tracks("moe"),
        )
        self.acts = acts
        self._keyer = None
        if graph_mode():
            tap = self.tap
            if tap is not None and not sink and tap.recompiler.vary_cell(network):
                self._keyer = tap.recompiler
            switched = self._keyer is not None
            kept = getattr(network, "_msmon_acts", None)
            # the selection a kept graph was compiled with: what it taps, and how
            targets = (
                config.module_targets,
                config.tracks("activations"),
                config.attention_targets if config.tracks("attention") else False,
                switched,
            )
            reuse = kept[1] if kept is not None and kept[0] == targets else None
            acts.compiled_root(network, reuse, switched)
            if acts.graph is not None and reuse is None:
                if kept is not None or not switched:
                    # a graph compiled with other taps of ours, or one to compile with
                    # these classes on: compiled again (with the core taps in force)
                    drop_compiled([network])
                    network._msmon_taps = self.tap
                    self._compile_first = True
                network._msmon_acts = (targets, acts.graph)
            self._acts_compile = switched
            if acts.graph is not None and not any(c is network for c in self._act_cells):
                self._act_cells.append(network)

    def on_train_step_begin(self, run_context: Any) -> None:
        if self._compile_first:
            self._compile_first = False
            self._compile_with_taps(run_context.original_args())
        self._t_begin = time.perf_counter()
        mon = self.monitor
        step = self._offset + int(run_context.original_args().cur_step_num)
        self._seen += 1
        mon.step_count = step
        self._collect = mon.will_collect(step)
        tap = self.tap
        if tap is not None:  # the graph computes norms only on collected steps
            mon.guard("switching the grad_norm tap", tap.set_collect, self._collect)
            if self._collect:
                last = self._collected
                between = self._seen - last - 1 if last is not None else 0
                self._collected = self._seen
                mon.guard("reading the taps", tap.begin, between)
        self._lr = None
        self._scale = None
        acts = self.acts
        if acts is not None:
            mon.guard("arming the activations", acts.arm, self._collect)
            if self._collect and acts.graph is None and not acts.failed:  # PyNative: hooks
                mon.guard("hooking the activations", acts.see, self.network)
            if acts.switched() and self._keyer is not None:
                mon.guard("switching the activations in", self._acts_in, run_context)
        if self._collect:
            held = self._held_optimizers()
            if len(held) > 1:  # each one's, should several step (collect.several)
                self._lrs = mon.guard("reading the learning rates", read_lrs, held, read_lr) or {}
            if self._wants_lr() and (self.tap is None or not lr_in_graph(self.optimizer)):
                # before the update moves global_step (or a callback changes the lr)
                self._lr = mon.guard("reading the learning rate", read_lr, self.optimizer)
            if self._scaled:
                self._scale = mon.guard("reading the loss scale", cell_loss_scale, self.network)

    def _acts_in(self, run_context: Any) -> None:
        """A collected step begins (switched activations): the tapped classes go on and
        the train cell's graph compiled with them is keyed apart until the step ends.
        The first time in a ``Model.train`` call it is compiled here, on the step's
        inputs, as ``_compile_with_taps`` compiles the other: should a tap of ours fail
        to compile, the activations go off with one warning and the step runs the graph
        the others run; ``Model.train`` then finds it compiled (or cached: once)."""
        acts, network = self.acts, self.network
        acts.graph.begin(self._keyer)
        if not self._acts_compile:
            return
        self._acts_compile = False
        cb = run_context.original_args()
        inputs = cb.get("train_dataset_element")
        if not isinstance(inputs, list | tuple):
            return
        try:
            network.compile(*inputs)
        except Exception as exc:
            acts.graph.end()  # the step runs the other graph
            if not failed_in_our_wrapper(exc):  # the user's own: Model.train meets it
                log.debug("msmon: the train cell did not compile", exc_info=True)
                return
            acts.tap_failed()
            network._msmon_acts = None
            where = "train cell"
            self.monitor.warn_once(
                "acts failed", ACTS_FAILED.format(where=where, error=first_line(exc))
            )

    def on_train_step_end(self, run_context: Any) -> None:
        mon = self.monitor
        cb = run_context.original_args()
        now = time.perf_counter()
        acts = self.acts
        if acts is not None and acts.graph is not None:
            mon.guard("switching the activations out", acts.graph.end)
        if self._t_begin is not None:
            waited = self._t_begin - self._t_end if self._t_end is not None else 0.0
            mon.add_timing(waited, now - self._t_begin)
        collect = self._collect
        grad_norm, extra = None, None
        if collect and self.tap is not None:
            got = mon.guard("reading the grad_norm taps", self._grads)
            if got is not None:
                grad_norm, extra = got
            if self._lr is None and self._wants_lr():
                # no get_lr() ran this step (an overflow skipped the update, so
                # global_step stayed; or the optimizer has none): from its Parameters
                self._lr = mon.guard("reading the learning rate", read_lr, self.optimizer)
        loss = cb.net_outputs if collect else None
        if extra and mon.guard("reading the loss", scaling_artifact, extra, loss):
            loss = None
        if self._mixed:  # each optimizer's values instead (collect.several)
            held = mon.guard("finding the optimizers", optimizers_held, self.network) or []
            calls = mon.guard("telling the optimizers apart", attribute, self._calls, held)
            outputs = cb.net_outputs
            got = mon.guard(
                "recording each optimizer",
                values_for,
                calls,
                len(self._calls),
                outputs,
                self._lrs,
                self._namer,
                mon.warn_once,
            )
            extra = {**(extra or {}), **(got or {})}
            loss = self._lr = None
        if collect and self.acts is not None:
            got = mon.guard("reading the activations", self.acts.take, self.acts.graph is not None)
            extra = {**(extra or {}), **(got or {})}
        # the parameters (references, no copy): param_stats and stable_rank read them,
        # and blame's detail after an alert reads their weights
        wants_params = (
            collect
            and self.optimizer is not None
            and (
                self._blame or mon.config.tracks("param_stats") or mon.config.tracks("stable_rank")
            )
        )
        inputs = StepInputs(
            loss=loss,
            grad_norm=grad_norm,
            lr=self._lr,
            batch_size=self.batch_size,
            params=list(self.optimizer.parameters) if wants_params else None,
            global_step=self._offset + int(cb.cur_step_num),
            optimizer=self.optimizer if collect else None,
            extra=extra,
            param_norms=self._norms if collect else None,
        )
        self._norms = None
        self._mixed = False
        mon.record_step(inputs, collect=collect)
        if mon.boundary(raise_stop=False):
            run_context.request_stop()
        self._t_end = time.perf_counter()

    def on_eval_end(self, run_context: Any) -> None:
        """Metrics MindSpore computed on the validation set, as ``val/<name>``."""
        cb = run_context.original_args()
        # cb_params is a dict whose __getattr__ raises KeyError for absent keys
        results = cb.get("eval_results") or cb.get("metrics") or {}
        values = {}
        for name, value in results.items():
            number = to_float(value) if not isinstance(value, dict) else None
            if number is not None:
                tag = "val/loss" if name == "eval_loss" else f"val/{suggest_tag(str(name))}"
                values[tag] = number
        mon = self.monitor
        if values:
            mon.guard("recording validation metrics", mon.log, values)

    def on_train_end(self, run_context: Any) -> None:
        self.release()
        self.monitor.guard("flushing", self.monitor.flush)

    def _held_optimizers(self) -> list[Any]:
        """The optimizers the train network holds (looked up once per network)."""
        if self._held is None or self._held[0] is not self.network:
            found = self.monitor.guard("finding the optimizers", optimizers_held, self.network)
            self._held = (self.network, found or [])
        return self._held[1]

    def _wants_lr(self) -> bool:
        return self.optimizer is not None and self.monitor.config.tracks("learning_rate")

    def _grads(self) -> tuple[float | None, dict[str, float]]:
        """grad_norm and the other gradient tags of the collected step that just ended;
        the lr the optimizer used goes to ``self._lr``."""
        self.tap.each = len(self._names) if self._blame else 0
        seen, lr = self.tap.end(buffer=self._buffer)
        if lr is not None and self.monitor.config.tracks("learning_rate"):
            self._lr = lr
        mon = self.monitor
        unscale = unscale_received
        mon.guard("unscaling", unscale, seen, self.optimizer, False, mon.warn_once, self.network)
        if not self.monitor.config.tracks("grad_norm"):
            return None, {}
        if seen.loss_scale is None:
            seen.loss_scale = self._scale
        self._calls = seen.calls
        got = resolve(seen, clip_per_micro=self.tap.pattern.per_micro_clip)
        if got.note is not None:
            self.monitor.warn_once(got.note, got.note)
        self._mixed = got.mixed  # several optimizers in the graph: no loss or lr either
        if self._blame:
            self._norms = param_norms(seen, got.grad_norm, self._names)
        return got.grad_norm, got.values

    def _install_taps(self, network: Any) -> None:
        """Wrap the optimizers, clip functions and loss-scale hooks (``collect.gradtaps``)
        for this ``Model.train`` call, and drop the train cell's compiled graph unless it
        was compiled with the taps installed now: taps the cell's graph already holds
        are reused when they carry the same skip gate (none, usually), whichever
        callback made them. With ``action: skip`` the optimizer wrapper also holds the
        skip gate (unless a watch's wrapper already does)."""
        mon = self.monitor
        if network is None:
            return
        gate = mon.skip_gate()
        tracks = mon.config.tracks
        wants = tracks("grad_norm") or tracks("learning_rate") or gate is not None
        if not wants:
            return
        own_gate = gate if gate is not None and gate.active == 0 else None
        compiled = getattr(network, "_msmon_taps", None)  # what its graph was compiled with
        if (
            compiled is not None
            and compiled is not self.tap
            and compiled.optimizer.gate is own_gate
            and compiled.optimizer.keeps_each == self._blame
            and not compiled.installed
        ):
            # another callback's taps (another run, or a cell run again in a notebook):
            # the same wrappers over the same Parameters, so the compiled graph serves
            # as it is. Making new ones would drop it and compile again at every
            # Model.train call that changes callback (0.5-2 s each for the bench MLP)
            self.tap = compiled
        if self.tap is None:
            # no jit cache to drop: the train cell's own graph is dropped below, and
            # PyNative runs the wrappers as they are (other jit functions keep theirs)
            self.tap = mon.guard("making the grad_norm taps", StepTaps, own_gate, self._blame)
            if self.tap is None:
                return
        if self._reading is None:
            self._reading = self.tap.reading if self.tap is not compiled else Reading()
        self.tap.read_for(self._reading)
        if mon.guard("installing the grad_norm taps", self.tap.install) is None and not (
            self.tap.installed
        ):
            self.tap = None
            return
        if compiled is not self.tap:
            drop_compiled([network])
            network._msmon_taps = self.tap
            self._compile_first = True
        if not any(c is network for c in self._compiled):
            self._compiled.append(network)

    def _compile_with_taps(self, cb: Any) -> None:
        """Compile the train cell with our taps before its first step, on that step's
        inputs (``train_dataset_element``): ``Model.train`` then finds it compiled. If
        it fails compiling a tap of ours, the taps come off and it compiles without them
        (``collect.tapguard``); training goes on, unmonitored in the graph. Any other
        compile error is the user's own: ``Model.train`` meets it itself."""
        import mindspore as ms

        network, tap, mon = self.network, self.tap, self.monitor
        inputs = cb.get("train_dataset_element")
        if tap is None or not isinstance(inputs, list | tuple) or cb.get("dataset_sink_mode"):
            return
        if ms.get_context("mode") != ms.GRAPH_MODE:
            return

        acts = self.acts
        taps = TapSet(tap, acts.graph if acts is not None else None)

        def warn(message: str) -> None:
            self.tap = None
            network._msmon_taps = None
            if acts is not None and acts.graph is not None:
                acts.tap_failed()
                network._msmon_acts = None
            mon.warn_once("tap failed", message)

        def compile_() -> Any:
            with tap.compiling(network):  # (MindOCR's accumulation: collect.opsview)
                return network.compile(*inputs)

        try:
            run_unwrapped_on_failure(compile_, taps, [network], warn, "train cell")
        except Exception:  # the user's own: their Model.train meets it and raises it
            log.debug("msmon: the train cell did not compile", exc_info=True)

    def _gate_loss(self, network: Any) -> None:
        """With ``action: skip`` on the loss: a LossTap on the train cell's network, so
        the gate in its graph can judge the loss (its compiled graph dropped once)."""
        mon = self.monitor
        gate = mon.skip_gate()
        if gate is None or network is None or not gate.wants_loss:
            return
        from msmon_nb.collect.skip import install_loss_tap

        self._loss_cell = network
        if mon.guard("tapping the loss for skip", install_loss_tap, network, gate) is None:
            self._loss_cell = None
            if gate.uses_loss:
                mon.warn_once(
                    "skip loss",
                    f"{type(network).__name__} has no `network` cell, so its loss cannot "
                    "be judged inside the graph; loss_spike skip does not act on it "
                    "(grad_explosion and nonfinite on grad_norm still do)",
                )
            return
        drop_compiled([network])

    def release(self) -> None:
        """Undo what ``on_train_begin`` wrapped: the user's classes come back (also when
        the monitor closes after a ``Model.train`` that raised, where ``on_train_end``
        never ran). The train cell's compiled graph keeps the wrappers, switched off."""
        from msmon_nb.collect.skip import remove_loss_tap

        mon = self.monitor
        mon.guard("passing on held scalars", mon.hold_emits, False)
        if self.tap is not None:
            mon.guard("switching the grad_norm tap off", self.tap.set_collect, False)
            mon.guard("unwrapping the optimizers", self.tap.uninstall)
        cell, self._loss_cell = self._loss_cell, None
        if cell is not None:
            mon.guard("removing the loss tap", remove_loss_tap, cell)
            drop_compiled([cell])  # its graph held the loss tap
        acts, self.acts = self.acts, None
        if acts is not None:
            mon.guard("switching the activations off", acts.arm, False)
            mon.guard("putting the modules' classes back", acts.close)

    def close(self) -> None:
        """The monitor closes: ``release``, and the train cells whose graph holds the taps
        this callback used lose that graph (their next ``Model.train`` compiles once,
        without us), so nothing of ours stays in them."""
        self.release()
        act_cells, self._act_cells = self._act_cells, []
        drop_compiled(act_cells)  # their graphs hold the activation taps
        for cell in act_cells:
            cell._msmon_acts = None
        cells, self._compiled = self._compiled, []
        for cell in cells:
            taps = getattr(cell, "_msmon_taps", None)
            if taps is not None and taps is self.tap:
                drop_compiled([cell])
                vars(cell).pop("_msmon_taps", None)
