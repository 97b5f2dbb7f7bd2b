"""The narrow interface every way in records into; ``Monitor`` implements it.

The adapters in ``collect/`` (``watch()``, the ``Model.train`` callback) turn framework
objects into numbers and step boundaries. They never import ``monitor.py``: they are
handed a ``Recorder`` and use only what is declared here, so a test (or another front
end) can drive them with any object that has these members.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Protocol

from msmon_nb.config import MonitorConfig


@dataclass
class StepInputs:
    """What one finished step produced, as a way in hands it to the recorder: MindSpore
    tensors, numpy arrays or numbers, read only on collected steps.

    ``grads``: any nesting of gradient tensors (their global norm is recorded unless
    ``grad_norm`` is given), still carrying the loss scale ``grad_scale`` (their norms are
    divided by it). ``params``: the parameters ``param_stats`` reads; ``optimizer``: where
    ``optimizer_state`` reads moments; ``extra``: more scalars of the step by tag.
    ``param_norms``: ``(names, norms)``, each parameter's gradient norm where a graph tap
    already measured them (loss scale undone, before clipping); without it they are
    taken from ``grads`` on the host, in the same pass as their global norm.
    """

    loss: Any = None
    grads: Any = None
    grad_norm: Any = None
    grad_scale: float = 1.0
    lr: Any = None
    batch_size: int | None = None
    global_step: int | None = None
    params: list | None = None
    optimizer: Any = None
    extra: Mapping[str, float] | None = None
    param_norms: tuple[Sequence[str], Any] | None = None


class StopTraining(BaseException):
    """Raised at a step boundary to end the user's loop (stop button, alert action).

    A ``BaseException``, so a user's ``except Exception`` does not swallow it.
    """


class Recorder(Protocol):
    """What a way in may read from, and call on, the session it records into."""

    config: MonitorConfig
    step_count: int  # the index the next recorded step gets
    last_step: int | None
    paused: bool

    @property
    def stop_requested(self) -> bool: ...

    def will_collect(self, step: int) -> bool:
        """True when ``step`` is collected (its scalars computed and emitted)."""
        ...

    def record_step(self, inputs: StepInputs, *, collect: bool, ended: float | None = None) -> None:
        """Count a finished step (index ``step_count``); on collected steps, emit what
        ``inputs`` holds (on the others only its ``batch_size`` counts). ``ended``: when
        it ended, where that was before now (its step time ends there)."""
        ...

    def part_values(self, inputs: StepInputs) -> dict[str, float]:
        """The ``train/...`` values of one optimizer's part of a step, without counting
        a step (``collect.parts``: two or more optimizers in one iteration)."""
        ...

    def hold_emits(self, on: bool) -> None:
        """Let collected steps' scalars go on in batches (fast steps; no user code reads
        the recorder between steps); off: what is held goes on now."""
        ...

    def add_timing(self, data_secs: float, compute_secs: float) -> None:
        """Where the step's time went: waiting for the next batch, or framework work."""
        ...

    def mark_step_start(self) -> None:
        """The first step begins now (throughput and step time count from here)."""
        ...

    def boundary(self, raise_stop: bool) -> bool:
        """Step-boundary controls (panel events, pause, stop, debugger); True to stop."""
        ...

    def guard(self, what: str, fn: Callable[..., Any], *args: Any) -> Any:
        """``fn(*args)``; a failure is warned about once and returns None."""
        ...

    def trains(self, network: Any = None, optimizer: Any = None) -> None:
        """What the loop trains, as far as the way in knows it without calling user
        code (a train network, the optimizer it saw): what the ``checkpoint`` command
        saves and ``lr xF`` scales."""
        ...

    def skip_gate(self) -> Any:
        """The ``collect.skip.SkipGate`` to put before the optimizer update when the
        alerts ask for ``action: skip``, else None. After each step the recorder reads
        from it (in ``record_step``) whether the update was skipped."""
        ...

    def warn_once(self, key: str, message: str) -> None:
        """One ``MonitorWarning`` per ``key``."""
        ...

    def attached(self, how: str) -> None:
        """A way in is active (the verbose notice names it)."""
        ...

    def log(self, metrics: Mapping[str, float], step: int | None = None) -> None:
        """Extra scalars at ``step`` (default: the last step)."""
        ...

    def flush(self) -> None:
        """Push what was recorded to the outputs."""
        ...

    def callback(self) -> Any:
        """A ``mindspore.train.Callback`` recording ``Model.train`` into this recorder."""
        ...
