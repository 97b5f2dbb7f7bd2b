"""``mon.callback()``: a real ``mindspore.train.Callback`` for ``Model.train``.

Loss comes from ``net_outputs`` (the first element when the train cell returns a tuple),
the learning rate from ``optimizer.get_lr()`` read when a collected step begins (before
the update moves ``global_step``), the batch size from the dataset. Steps are numbered
as MindSpore numbers them (``cur_step_num``, from 1), so our records line up with
``LossMonitor`` output and ``SummaryCollector`` files. MindSpore restarts that count at
1 on every ``Model.train``/``fit`` call; a later call under the same monitor ("train a
bit more") continues after the run's last step instead, so nothing recorded is
overwritten and the steps stay in order.

Gradients never leave ``TrainOneStepCell``'s graph, so at ``on_train_begin`` the train
cell's ``grad_reducer`` is wrapped by ``GradNormTap`` (see ``collect.graph``), which
stores the global norm of the (reduced) gradients in a Parameter read on collected steps;
the tap computes it only when told that the coming step is collected (``set_collect``).
A custom train cell without ``grad_reducer`` gets no grad_norm; a warning says how to
report it (``mon.step(grad_norm=...)`` or return ``mm.global_norm(grads)``).
"""

from __future__ import annotations

import time
from typing import TYPE_CHECKING, Any

from mindspore.train import Callback

from msmon_nb.collect.tensors import to_float
from msmon_nb.collect.values import read_lr
from msmon_nb.config import suggest_tag

if TYPE_CHECKING:
    from msmon_nb.collect.recorder import Recorder


class MonitorCallback(Callback):
    """Records every collected ``Model.train`` step into its ``Monitor``."""

    def __init__(self, monitor: Recorder) -> None:
        super().__init__()
        self.monitor = monitor
        self.tap: Any = None
        self.optimizer: Any = None
        self.batch_size: int | None = None
        self._collect = False
        self._lr: float | None = None
        self._t_begin: float | None = None
        self._t_end: float | None = None  # end of the previous step, after our own work
        self._offset = 0  # steps the run had before this Model.train call
        self._gate_tap: Any = None  # OptimizerTap holding the skip gate, while installed
        self._loss_cell: Any = None  # the train cell whose network has a LossTap

    def on_train_begin(self, run_context: Any) -> None:
        mon = self.monitor
        cb = run_context.original_args()
        network = cb.get("train_network")
        self.optimizer = cb.get("optimizer") or getattr(network, "optimizer", None)
        dataset = cb.get("train_dataset")
        if dataset is not None and self.batch_size is None:
            self.batch_size = mon.guard("reading the batch size", dataset.get_batch_size)
        if mon.config.tracks("grad_norm") and self.tap is None:
            from msmon_nb.collect.graph import install_tap

            self.tap = mon.guard("installing the grad_norm tap", install_tap, network)
            if self.tap is None:
                mon.warn_once(
                    "no tap",
                    f"{type(network).__name__} has no grad_reducer, so grad_norm cannot be "
                    "read from Model.train; pass it yourself with mon.step(grad_norm=...)",
                )
        self._gate_updates(network)
        mon.attached("Model.train callback")
        mon.mark_step_start(restart=True)
        self._offset = 0 if mon.last_step is None else mon.last_step
        self._t_end = None

    def on_train_step_begin(self, run_context: Any) -> None:
        self._t_begin = time.perf_counter()
        mon = self.monitor
        step = self._offset + int(run_context.original_args().cur_step_num)
        mon.step_count = step
        self._collect = mon.will_collect(step)
        if self.tap is not None:  # the graph computes the norm only on collected steps
            mon.guard("switching the grad_norm tap", self.tap.set_collect, self._collect)
        self._lr = None
        if self._collect and self.optimizer is not None and mon.config.tracks("learning_rate"):
            self._lr = mon.guard("reading the learning rate", read_lr, self.optimizer)

    def on_train_step_end(self, run_context: Any) -> None:
        mon = self.monitor
        cb = run_context.original_args()
        now = time.perf_counter()
        if self._t_begin is not None:
            waited = self._t_begin - self._t_end if self._t_end is not None else 0.0
            mon.add_timing(waited, now - self._t_begin)
        collect = self._collect
        mon.record_step(
            loss=cb.net_outputs if collect else None,
            grad_norm=self.tap.norm if collect and self.tap is not None else None,
            lr=self._lr,
            batch_size=self.batch_size,
            params=list(self.optimizer.parameters)
            if collect and self.optimizer is not None and mon.config.tracks("param_stats")
            else None,
            global_step=self._offset + int(cb.cur_step_num),
            optimizer=self.optimizer if collect else None,
            collect=collect,
        )
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
        self._ungate()
        self.monitor.guard("flushing", self.monitor.flush)

    def _gate_updates(self, network: Any) -> None:
        """With ``action: skip``: wrap the optimizers' ``construct`` with the skip gate
        (unless a watch already did) and tap the train cell's loss, then drop the train
        cell's compiled graph so that its next step compiles with both."""
        mon = self.monitor
        gate = mon.skip_gate()
        if gate is None or network is None:
            return
        from msmon_nb.collect.graph import OptimizerTap
        from msmon_nb.collect.hooks import compile_cache
        from msmon_nb.collect.skip import install_loss_tap

        if gate.active == 0:
            tap = OptimizerTap(compile_cache(), gate)
            if mon.guard("wrapping the optimizers to skip bad updates", tap.install) is None:
                self._gate_tap = tap if tap.installed else None
        if gate.wants_loss:
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
        cache = getattr(network, "compile_cache", None)
        if isinstance(cache, set):
            cache.clear()

    def _ungate(self) -> None:
        """Undo ``_gate_updates`` at the end of ``Model.train``: the user's objects come back."""
        from msmon_nb.collect.skip import remove_loss_tap

        if self._gate_tap is not None:
            self.monitor.guard("unwrapping the optimizers", self._gate_tap.uninstall)
            self._gate_tap = None
        cell, self._loss_cell = self._loss_cell, None
        if cell is not None:
            self.monitor.guard("removing the loss tap", remove_loss_tap, cell)
            cache = getattr(cell, "compile_cache", None)
            if isinstance(cache, set):  # its graph held the tap and the gate
                cache.clear()
