"""What only the gradient all-reduce shows, per rank: how long this rank waited in it,
and its own gradients' norm before it.

In data parallel every rank hands its local gradients to ``nn.DistributedGradReducer``
and gets their mean back. Two things are visible there and nowhere else:

* **the wait.** A synchronous all-reduce completes when the last rank arrives, so the
  time from this rank's gradients being ready to the reduced ones being ready is the
  time it waited for the others (plus the transfer, the same on every rank). The slow
  rank is the one the others wait for: it waits least. Step time cannot tell the ranks
  apart (every rank's step lasts as long as the slowest one's) and ``data_time`` misses
  slowness outside the input pipeline. Recorded as ``train/comm_wait`` (seconds per
  all-reduce, averaged since the last collected step).
* **the busy time.** The wait alone also holds the transfer, which is not symmetric:
  on this machine's loopback ``mccl`` one rank of a healthy job can wait 30-40 ms more
  than the other, step after step. The time from the end of one all-reduce to the start
  of the next is this rank's own work (Python, data, forward and backward) with no
  transfer in it, so ``train/comm_busy`` (seconds, same averaging) says who is slow;
  the cross-rank rule asks both: the straggler is busy longest and waits least.
* **the local gradient norm.** After the reduce every rank holds the same gradients,
  so the rank whose batch produced a spike can only be found before it. Recorded on
  collected steps as ``train/local_grad_norm``; ``train/local_loss`` is the loss this
  rank itself recorded (as the forward pass returned it, before any all-reduce the user
  may apply to it), so the cross-rank rules (``diagnose.rankrules``) can name the rank.

While a distributed ``Monitor`` is open, ``CommTap`` replaces
``nn.DistributedGradReducer.__call__`` class-level, so reducers created before see it and
every loop shape calling one from Python is measured: explicit ``mon.step`` loops,
``mon.watch()`` (whose own reducer hook wraps this one while it is active), and
``Model.train`` in PyNative mode, whose ``TrainOneStepCell`` calls its ``grad_reducer``
from Python. Close restores the class.

PyNative dispatch is asynchronous (checked on 2.10 and 2.7.1: the reducer call returns
in ~0.6 ms and the wait appears when the result is read), so the wrapper synchronises
twice: on the incoming gradients before the call (the backward pass is finished; its
time is not a wait) and on the smallest output after it (the reduce is finished).
``mindspore.runtime.synchronize`` exists on both versions but does nothing on the CPU,
so we read tensors: on the CPU ``asnumpy`` shares memory (no copy, it only waits); on a
device, ``synchronize`` and then a read of the smallest tensor (a few bytes).

In GRAPH mode and inside ``mindspore.jit`` steps the all-reduce runs in a compiled
graph, where none of this can be seen: after two steps without a reducer call from
Python one warning names what is missing.
"""

from __future__ import annotations

import sys
import time
from typing import Any

from msmon_nb.collect.recorder import Recorder
from msmon_nb.collect.tensors import flatten_tensors, to_numpy
from msmon_nb.collect.values import device_global_norm, norm_on_device
from msmon_nb.metrics.norms import global_norm

WAIT_TAG = "train/comm_wait"
BUSY_TAG = "train/comm_busy"
LOCAL_NORM_TAG = "train/local_grad_norm"
LOCAL_LOSS_TAG = "train/local_loss"
LOSS_TAG = "train/loss"

NOT_OBSERVED = (
    "no nn.DistributedGradReducer call was seen from Python in this distributed job "
    "(GRAPH mode, a mindspore.jit step, or an all-reduce of your own), so "
    f"{WAIT_TAG}, {BUSY_TAG} and {LOCAL_NORM_TAG} are not recorded: a straggler is then found from "
    "data/step time only and a grad_norm spike cannot be traced to its rank; run the step "
    "in PyNative mode, or record them yourself with "
    f"mon.step(..., **{{'{LOCAL_NORM_TAG}': mm.global_norm(local_grads)}})"
)


def _leaves(value: Any) -> list[Any]:
    return [t for t in flatten_tensors(value) if hasattr(t, "asnumpy")]


def _size(tensor: Any) -> int:
    return int(getattr(tensor, "size", 0) or 0)


class CommTap:
    """Wraps ``nn.DistributedGradReducer.__call__`` while a distributed monitor is open."""

    def __init__(self, recorder: Recorder) -> None:
        self.rec = recorder
        self.calls = 0  # reducer calls measured since install
        self.installed = False
        self.active = False  # False: the wrapper (if someone kept it) only passes through
        self._wait_secs = 0.0  # summed since the last collected step
        self._waits = 0
        self._busy_secs = 0.0
        self._busies = 0
        self._last_end: float | None = None  # when the previous all-reduce finished
        self._local_norm: float | None = None
        self._cls: Any = None
        self._had = False
        self._old: Any = None
        self._wrapper: Any = None
        self._on_cpu = True
        self._sync_device: Any = None

    # --- install / uninstall ------------------------------------------------------------

    def try_install(self) -> bool:
        """Install once MindSpore is in the process (a monitor opened before ``import
        mindspore`` must not import it: reading and tests without it stay fast)."""
        if self.installed:
            return True
        if "mindspore" not in sys.modules:
            return False
        self.rec.guard("wrapping the gradient all-reduce", self._install)
        return self.installed

    def _install(self) -> None:
        import mindspore as ms
        from mindspore import nn

        cls = getattr(nn, "DistributedGradReducer", None)
        if cls is None:
            self.rec.warn_once("comm", NOT_OBSERVED)
            return
        original = next(vars(k)["__call__"] for k in cls.__mro__ if "__call__" in vars(k))
        self._on_cpu = ms.get_context("device_target") == "CPU"
        if not self._on_cpu:
            self._sync_device = getattr(getattr(ms, "runtime", None), "synchronize", None)
        tap = self

        def reducer_call(reducer: Any, *args: Any, **kwargs: Any) -> Any:
            if not tap.active:
                return original(reducer, *args, **kwargs)
            return tap._measure(original, reducer, args, kwargs)

        self._cls, self._had = cls, "__call__" in vars(cls)
        self._old = vars(cls).get("__call__")
        self._wrapper = reducer_call
        cls.__call__ = reducer_call
        self.installed = self.active = True

    def uninstall(self) -> None:
        """Restore the class; a wrapper someone else still holds becomes a pass-through."""
        self.active = False
        if not self.installed:
            return
        self.installed = False
        cls = self._cls
        if vars(cls).get("__call__") is not self._wrapper:
            return  # another wrapper sits on ours: it restores ours, which passes through
        if self._had:
            cls.__call__ = self._old
        else:
            delattr(cls, "__call__")

    # --- the hot path -------------------------------------------------------------------

    def _sync(self, leaves: list[Any], every: bool) -> bool:
        """Wait until ``leaves`` are computed. On the CPU every read is free (shared
        memory), so all are read when ``every`` (the backward pass writes the gradients
        one by one); on a device the streams are synchronised and one scalar is read."""
        if not leaves:
            return True
        if self._on_cpu:
            for leaf in leaves if every else (min(leaves, key=_size),):
                leaf.asnumpy()
            return True
        if self._sync_device is not None:
            self._sync_device()
        min(leaves, key=_size).asnumpy()
        return True

    def _measure(self, original: Any, reducer: Any, args: tuple, kwargs: dict) -> Any:
        """One reducer call: sync the inputs, (local norm), call, sync the output."""
        rec = self.rec
        leaves = _leaves(args[0] if args else kwargs.get("grads"))
        if rec.guard("measuring the all-reduce wait", self._sync, leaves, True) is None:
            self.active = False  # warned once: stop measuring, training goes on
            return original(reducer, *args, **kwargs)
        arrived = time.perf_counter()
        if self._last_end is not None:
            self._busy_secs += arrived - self._last_end
            self._busies += 1
        if leaves and rec.will_collect(rec.step_count) and rec.config.tracks("grad_norm"):
            self._local_norm = rec.guard("computing the local grad norm", self._norm, leaves)
        began = time.perf_counter()
        out = original(reducer, *args, **kwargs)
        if rec.guard("measuring the all-reduce wait", self._sync, _leaves(out), False) is None:
            self.active = False
            return out
        self._last_end = time.perf_counter()
        self._wait_secs += self._last_end - began
        self._waits += 1
        self.calls += 1
        return out

    def _norm(self, leaves: list[Any]) -> float:
        """sqrt(sum ||g||^2) of this rank's gradients, where the global grad_norm is
        computed (``values.norm_on_device``): a host BLAS dot per gradient on the CPU (no
        copy), one fused reduction on a device with one scalar to the host (read now: the
        inputs were just synchronised, so it does not stall the step further)."""
        if norm_on_device(leaves):
            return device_global_norm(leaves)
        return global_norm(to_numpy(g) for g in leaves)

    # --- at collected steps -------------------------------------------------------------

    def add_values(self, values: dict[str, float]) -> None:
        """Add this rank's wait, local norm and local loss to a collected step's values."""
        rec = self.rec
        if LOSS_TAG in values:  # the loss as this rank recorded it, whatever the loop
            values[LOCAL_LOSS_TAG] = values[LOSS_TAG]
        if not self.try_install():
            return
        if self._waits and rec.config.tracks("step_time"):
            values[WAIT_TAG] = self._wait_secs / self._waits
            if self._busies:
                values[BUSY_TAG] = self._busy_secs / self._busies
        if self._local_norm is not None:
            values[LOCAL_NORM_TAG] = self._local_norm
        self._wait_secs, self._waits, self._local_norm = 0.0, 0, None
        self._busy_secs, self._busies = 0.0, 0
        if self.calls == 0 and rec.step_count >= 2:
            rec.warn_once("comm", NOT_OBSERVED)


def attach(recorder: Recorder) -> CommTap:
    """A ``CommTap`` for a distributed monitor, installed now if MindSpore is loaded."""
    tap = CommTap(recorder)
    tap.try_install()
    return tap
