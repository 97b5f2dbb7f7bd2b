"""Activations inside compiled steps (``@ms.jit`` steps, GRAPH_MODE train cells,
``Model.train``): each selected module's output summarised in the graph, on collected
steps only.

No Python hook runs inside a graph, so the statistics are compiled into it, the way the
optimizer tap (``collect.graph``) compiles the gradient norm: each selected module gets a
subclass of its class whose ``construct`` runs the original (called as a bound method, as
``collect.graph._tapped`` calls an optimizer's), assigns ``[norm, max_abs, mean,
nonfinite, zero_frac]`` of the output (``metrics.extent.ACT_STATS``) to a Parameter of
ours, and passes the output on unchanged (``ops.depend`` on a scalar token, as the
optimizer tap does).

Two graphs, chosen per step by the collect decision: the tapped classes go on only
around a collected step's graph call (``begin``/``end``), and ``collect.recompile``
keys what compiles then under a phase of its own (``ACT_SUFFIX``); there they compute
unconditionally. Every other step runs the graph compiled with the user's classes --
exactly the one that runs without activations (the core taps only). Each graph compiles
once and stays cached until the watch ends (a ``Model.train`` callback keeps both on the
cell until its monitor closes). Where no graph can be keyed apart (sink mode, a MindSpore
without the keys), the classes stay on for the watch and compute under a branch on the
``on`` flag, written before each step (``graph.write_scalar``), as before.

The statistics are reduced in float64 on the CPU (its kernels take it), so that they
match a float64 reference up to summation order; float32 elsewhere. A class swap leaves
the cell tree, the Parameters and their names as they were (a wrapper cell would rename
``parameters_and_names()``, which checkpoints use); ``end``/``uninstall`` swap the
classes back. Our Parameters are named ``msmon_*``.

Cost, ``Model.train`` of the bench MLP (784-512-512-10, Adam, GRAPH_MODE, 2.10, three
Dense layers tapped, every 10th step collected, 8 rounds rotated, 2-core VM at load 8-10):
with the branch, 1.28x the core monitor in wall time [IQR 0.90-1.55], 1.29x in CPU time
[IQR 0.91-1.54] (taps in, flag never set, had measured 1.19x the plain step); with the two
graphs 0.99x [IQR 0.85-1.15] and 1.01x [IQR 0.95-1.18]. Steps not collected run exactly
the graph without activations (``tests/collect/test_act_graphs.py`` checks the phase and
the graph's Parameters); a collected step pays the statistics (float64 on the CPU).
"""

from __future__ import annotations

import itertools
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from typing import Any

import mindspore as ms
import numpy as np
from mindspore import Parameter, Tensor, ops

from msmon_nb.collect.attention import ATTN_STATS
from msmon_nb.collect.attntaps import tapped_attention_class
from msmon_nb.collect.graph import tap_scalar, write_scalar
from msmon_nb.collect.recompile import ACT_SUFFIX
from msmon_nb.collect.values import param_tag
from msmon_nb.metrics.extent import ACT_STATS

_ONE = Tensor(1, ms.int32)
_ZERO = Tensor(0, ms.int32)
_SERIAL = itertools.count()


def _stats(x: Any, wide: Any, serial: Any) -> Any:
    """``ACT_STATS`` of ``x`` and ``serial`` as one vector; graph syntax."""
    x = ops.cast(x, wide)
    norm = ops.sqrt(ops.reduce_sum(x * x))
    top = ops.reduce_max(ops.abs(x))
    mean = ops.reduce_mean(x)
    bad = ops.reduce_sum(ops.cast(ops.logical_not(ops.isfinite(x)), wide))
    zero = ops.reduce_mean(ops.cast(ops.equal(x, 0), wide))
    return ops.stack([norm, top, mean, bad, zero, ops.cast(serial, wide)])


def _tapped_class(
    cls: type, store: Parameter, on: Parameter | None, count: Parameter, wide: Any
) -> type:
    """A subclass of ``cls`` whose ``construct`` also stores its output's statistics:
    always (``on`` None: the graph compiled for collected steps only), or while ``on``
    is 1."""

    # MindSpore parses these functions' source: plain graph syntax, closure variables
    def computing(self, *inputs):
        out = self._msmon_act_inner(*inputs)
        first = out[0] if isinstance(out, tuple) else out
        # the count after this module's run goes with its statistics: the host takes a
        # module's values only when that serial moved
        serial = ops.assign_add(count, _ONE)
        token = ops.depend(_ONE, ops.assign(store, _stats(first, wide, serial)))
        return ops.depend(out, token)

    def branching(self, *inputs):
        out = self._msmon_act_inner(*inputs)
        first = out[0] if isinstance(out, tuple) else out
        if on > 0:
            # the count after this module's run goes with its statistics: the host
            # takes a module's values only when that serial moved (a graph compiled
            # before the taps, or a module the step did not run, leaves it still)
            serial = ops.assign_add(count, _ONE)
            token = ops.depend(_ONE, ops.assign(store, _stats(first, wide, serial)))
        else:
            token = _ZERO
        return ops.depend(out, token)

    construct = computing if on is None else branching
    body = {"construct": construct, "_msmon_act_inner": cls.construct, "_msmon_act_of": cls}
    return type(cls.__name__, (cls,), body)


class GraphActivations:
    """The swapped classes of one watch's selected modules and their Parameters;
    ``attention``: the attention modules whose signals are computed too (``attntaps``),
    with the same count. ``switched``: the classes compute unconditionally and go on
    only around a collected step's graph call (``begin``/``end``), whose graph a
    ``Recompiler`` keys apart; else they stay on and compute while the ``on`` flag is 1
    (where no graph of this loop can be keyed apart)."""

    def __init__(
        self,
        modules: Sequence[tuple[str, Any]],
        attention: Sequence[tuple[str, Any, Any]] = (),
        switched: bool = False,
    ) -> None:
        cpu = ms.get_context("device_target") == "CPU"
        self.dtype = np.float64 if cpu else np.float32
        wide = ms.float64 if cpu else ms.float32
        self.switched = switched
        self.on = None if switched else tap_scalar("msmon_act_on", 0, ms.int32)
        self._keyer: Any = None  # the Recompiler keying the graph between begin and end
        # statistics vectors the graphs computed: a module's branch adds 1 when it runs,
        # so that a test can count that steps not collected compute none
        self.count = tap_scalar("msmon_act_count", 0, ms.int32)
        self._on = False
        self.stores: dict[str, Parameter] = {}
        self.swapped: list[tuple[Any, type, type]] = []  # (cell, its class, the tapped one)
        for path, cell in modules:
            store = Parameter(
                Tensor(np.zeros(len(ACT_STATS) + 1, self.dtype)),
                name=f"msmon_act_{next(_SERIAL)}",
                requires_grad=False,
            )
            self.stores[f"act/{param_tag(path)}"] = store
            original = type(cell)
            self.swapped.append(
                (cell, original, _tapped_class(original, store, self.on, self.count, wide))
            )
        # prefix -> the statistics its vector holds before the serial
        self.stats: dict[str, tuple[str, ...]] = dict.fromkeys(self.stores, ACT_STATS)
        for path, cell, form in attention:
            store = Parameter(
                Tensor(np.zeros(len(ATTN_STATS) + 1, self.dtype)),
                name=f"msmon_attn_{next(_SERIAL)}",
                requires_grad=False,
            )
            prefix = f"attn/{param_tag(path)}"
            self.stores[prefix] = store
            self.stats[prefix] = ATTN_STATS
            # built on the class the cell has then (a tapped one, if it is also a module
            # whose activations are recorded): uninstall puts them back in reverse
            held = [t for c, _, t in self.swapped if c is cell]
            original = held[-1] if held else type(cell)
            tapped = tapped_attention_class(original, form, store, self.on, self.count, wide)
            self.swapped.append((cell, original, tapped))
        if not switched:
            self.install()
        self.reads = 0  # collected steps read
        self.serials: dict[str, float] = {}  # prefix -> the serial its values had last read

    def set_collect(self, collect: bool) -> None:
        """Compute the statistics in the coming graph runs or not (a write on a change;
        switched: nothing to write, ``begin`` puts the classes on)."""
        if collect != self._on:
            if self.on is not None:
                write_scalar(self.on, int(collect))
            self._on = collect

    def begin(self, keyer: Any) -> None:
        """A collected step's graph call begins (switched): the tapped classes go on and
        ``keyer`` (a ``collect.recompile.Recompiler``) keys what compiles now apart, under
        ``ACT_SUFFIX``. Each graph compiles once: later collected steps find it cached."""
        if not self.switched or self._keyer is not None:
            return
        keyer.variant = ACT_SUFFIX
        self._keyer = keyer
        self.install()

    def end(self) -> None:
        """The collected step's graph call ended: the user's classes are back, and the
        next steps run the graph compiled without them."""
        keyer, self._keyer = self._keyer, None
        if keyer is None:
            return
        self.uninstall()
        keyer.variant = ""

    @contextmanager
    def collecting(self, keyer: Any) -> Iterator[None]:
        """``begin`` and ``end`` around a block."""
        self.begin(keyer)
        try:
            yield
        finally:
            self.end()

    def take(self) -> dict[str, float]:
        """The last collected run's ``{tag: value}`` (read after the step: ``asnumpy``
        waits for the graph that writes them)."""
        self.reads += 1
        out: dict[str, float] = {}
        for prefix, store in self.stores.items():
            values = store.asnumpy().astype(np.float64)
            serial = float(values[-1])
            if serial <= self.serials.get(prefix, 0.0):
                continue  # not computed since the last read: stale, not this step's
            self.serials[prefix] = serial
            for stat, value in zip(self.stats[prefix], values[:-1], strict=True):
                out[f"{prefix}/{stat}"] = float(value)
        return out

    def computed(self) -> int:
        """How many statistics vectors the graphs computed so far (``count``)."""
        return int(self.count.asnumpy())

    @property
    def installed(self) -> bool:
        """Whether the tapped classes are on (``tapguard.TapSet``)."""
        return any(type(cell) is tapped for cell, _, tapped in self.swapped)

    def install(self) -> None:
        """Every selected cell takes its tapped class (again: a train cell's graph
        compiled with them is reused by the next ``Model.train`` call, and whatever
        compiles it anew must see them too)."""
        for cell, _, tapped in self.swapped:
            cell.__class__ = tapped

    def uninstall(self) -> None:
        """Every swapped cell gets its own class back."""
        for cell, original, _ in reversed(self.swapped):
            cell.__class__ = original
