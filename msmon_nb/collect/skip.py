"""``action: skip``: hold back the parameter update of a bad step, inside the graph.

A ``SkipGate`` is the device half of the skip action (the host half is in
``msmon_nb.monitor.actions``). It is a handful of non-trainable Parameters:

* ``limit`` and ``loss_limit``: the grad_norm and loss at or above which a step's update
  is skipped. The host computes them from the rules' running statistics (grad_explosion:
  min(skip_above, ceiling, factor x running median); loss_spike: the spike rule's bar)
  and writes them on collected steps; until there is enough history they are +inf.
* ``loss`` and ``fresh``: the step's loss, stored before the optimizer runs -- by
  ``LossTap`` in a train cell's graph, or by the watch in a PyNative loop -- and a flag
  saying it belongs to this step (the optimizer wrapper clears it), so a loop whose
  loss never reaches the gate (a ``@ms.jit`` step) is judged by its grad_norm alone.
* ``skipped``, ``reason``, ``skip_norm``: what the gate did, read by the host after each
  step (one int32 copied to the host per step; the rest only when it moved).

The decision is taken where the update is: ``collect.graph.OptimizerTap`` wraps every
optimizer class's ``construct`` with ``if ok: <original update>``, compiled into
whatever graph calls the optimizer (a jit step, a graph-mode train cell, ``Model.train``)
and compiled on its own (``ms.jit``, as the original construct is) when PyNative calls
the optimizer, so no loop shape needs a host round trip between the gradients and the
update.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

import mindspore as ms
from mindspore import Tensor, nn, ops

from msmon_nb.collect.graph import tap_scalar
from msmon_nb.config.cards import SKIP_REASONS

# reason codes written by the wrapper (collect.graph) -> the alert kind they answer to:
# each skippable card's ``skip_code``
REASONS = SKIP_REASONS


@dataclass(frozen=True)
class SkipEvent:
    """What the gate skipped since the host last looked."""

    count: int  # updates skipped since the last poll (1 unless a step ran several)
    total: int  # updates skipped since the gate was made
    kind: str  # the alert kind whose criterion failed (REASONS)
    grad_norm: float
    loss: float | None  # None when the step's loss did not reach the gate
    grad_limit: float
    loss_limit: float


class SkipGate:
    """The Parameters an optimizer wrapper reads to decide whether its update runs.

    Args:
        nonfinite: skip a step whose grad_norm (or stored loss) is NaN/Inf.
        grad: skip on grad_norm >= ``limit``.
        loss: skip on a stored loss >= ``loss_limit``.
        local: False in a distributed job: then no loss is stored for the gate (a NaN
            loss still makes NaN gradients, which every rank sees after the all-reduce).
    """

    def __init__(self, *, nonfinite: bool, grad: bool, loss: bool, local: bool = True) -> None:
        self.nonfinite = nonfinite
        self.uses_grad = grad
        self.uses_loss = loss
        # whether the loss may be judged at all: not in data parallel, where each rank's
        # loss is its own and ranks must take the same decision
        self.wants_loss = (loss or nonfinite) and local
        self.limit = tap_scalar("msmon_skip_limit", math.inf, ms.float32)
        self.loss_limit = tap_scalar("msmon_skip_loss_limit", math.inf, ms.float32)
        self.loss = tap_scalar("msmon_skip_loss", 0.0, ms.float32)
        self.fresh = tap_scalar("msmon_skip_loss_fresh", 0, ms.int32)
        self.skipped = tap_scalar("msmon_skip_count", 0, ms.int32)
        self.reason = tap_scalar("msmon_skip_reason", 0, ms.int32)
        self.skip_norm = tap_scalar("msmon_skip_norm", 0.0, ms.float32)
        self.active = 0  # OptimizerTaps holding this gate that are installed now
        self.taps: list[Any] = []  # those taps (release() unwinds what a crash left)
        self.loss_cells: list[Any] = []  # train cells whose network has a LossTap
        self._limits = (math.inf, math.inf)
        self._seen = 0

    @property
    def limits(self) -> tuple[float, float]:
        """(grad_norm limit, loss limit) the gate applies now."""
        return self._limits

    def set_limits(self, grad_limit: float, loss_limit: float) -> None:
        """Write new limits (only those that changed: each write is a host-to-device copy).

        Written with ``ops.assign`` into the Parameters' own buffers: ``set_data`` swaps
        the buffer, and a ``@ms.jit`` step compiled earlier keeps reading the old one.
        """
        grad_limit = grad_limit if self.uses_grad else math.inf
        loss_limit = loss_limit if self.uses_loss else math.inf
        old_grad, old_loss = self._limits
        if grad_limit != old_grad:
            ops.assign(self.limit, Tensor(grad_limit, ms.float32))
        if loss_limit != old_loss:
            ops.assign(self.loss_limit, Tensor(loss_limit, ms.float32))
        self._limits = (grad_limit, loss_limit)

    def feed_loss(self, loss: Any) -> None:
        """Store this step's loss for the gate (PyNative loops: before the optimizer call)."""
        value = loss[0] if isinstance(loss, tuple | list) else loss
        if not isinstance(value, Tensor) or value.size < 1:
            return
        # assign, not set_data: a jit graph keeps the buffer it was compiled with
        ops.assign(self.loss, ops.cast(value.mean(), ms.float32))
        ops.assign(self.fresh, Tensor(1, ms.int32))

    def release(self) -> None:
        """Unwrap every optimizer class and train cell still holding this gate.

        The ways in undo their own wrapping when they end (watch exit, ``on_train_end``);
        a ``Model.train`` that raised never reaches ``on_train_end``, so the monitor calls
        this when it closes: no class stays gated by a monitor that is gone.
        """
        for tap in reversed(list(self.taps)):
            tap.uninstall()
        for cell in list(self.loss_cells):
            remove_loss_tap(cell)

    def poll(self) -> SkipEvent | None:
        """The skips since the last poll, or None (one int32 read)."""
        total = int(self.skipped.item())
        if total <= self._seen:
            return None
        count, self._seen = total - self._seen, total
        kind = REASONS.get(int(self.reason.item()), "grad_explosion")
        loss = float(self.loss.item())
        if not (kind == "loss_spike" or (kind == "nonfinite" and not math.isfinite(loss))):
            loss = None  # the stored loss was not this skip's reason (or is stale)
        grad_limit, loss_limit = self._limits
        return SkipEvent(
            count=count,
            total=total,
            kind=kind,
            grad_norm=float(self.skip_norm.item()),
            loss=loss,
            grad_limit=grad_limit,
            loss_limit=loss_limit,
        )


class LossTap(nn.Cell):
    """Wraps a train cell's ``network`` (its forward pass with the loss) and stores the
    loss in the gate before the gradients are taken, so the optimizer wrapper can judge
    it in the same graph. The output passes through unchanged."""

    def __init__(self, network: Any, gate: SkipGate) -> None:
        super().__init__(auto_prefix=False)
        self.network = network
        self.store = gate.loss
        self.fresh = gate.fresh
        self.gate = gate  # a plain object (no Cells in it): remove_loss_tap unregisters
        self.one = Tensor(1, ms.int32)

    def construct(self, *inputs):
        out = self.network(*inputs)
        loss = out
        if isinstance(out, tuple):
            loss = out[0]
        stored = ops.assign(self.store, ops.cast(ops.reduce_mean(loss), ms.float32))
        stored = ops.depend(stored, ops.assign(self.fresh, self.one))
        return ops.depend(out, stored)


def install_loss_tap(train_cell: Any, gate: SkipGate) -> LossTap | None:
    """Put a ``LossTap`` around ``train_cell.network``; None when it has none (a user's
    own train cell): the gate then judges that cell's steps by grad_norm only."""
    network = getattr(train_cell, "network", None)
    if isinstance(network, LossTap):
        return network
    if not isinstance(network, nn.Cell):
        return None
    tap = LossTap(network, gate)
    train_cell.network = tap
    gate.loss_cells.append(train_cell)
    return tap


def remove_loss_tap(train_cell: Any) -> None:
    """Undo ``install_loss_tap`` (the user's cell is left as it was given)."""
    network = getattr(train_cell, "network", None)
    if isinstance(network, LossTap):
        train_cell.network = network.network
        cells = network.gate.loss_cells
        cells[:] = [c for c in cells if c is not train_cell]
