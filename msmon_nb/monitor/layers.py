"""Which layer started it, for one Monitor: the ring of per-parameter gradient norms and
update ratios, the per-layer rule, the blame an alert of the gradient or loss families
carries, and the detail recorded for a while after it.

- Every collected step's per-parameter gradient norms (``collect.collector``'s
  ``param_norms``) go into a ``diagnose.blame.NormRing`` (``steps`` rows: 128 by
  default, so an alert confirmed 40 steps after a layer rose still has the rise) with
  each parameter's update ratio ``||w - w_prev|| / ||w_prev||`` of the same step
  (``UpdateRatios``: read from the Parameters the optimizer wrote, ``w_prev`` a float32
  host copy kept from the previous collected step -- with ``log_interval: 1`` the step's
  own update, a weight written between steps included). Then ``layer_rise``
  (``diagnose.layers``) judges the two rows. No user code runs: the Parameters are read.
- A ``layer_rise`` alert is remembered (``recent``, ``memory`` steps): a gradient or
  loss alert whose onset comes that long after it names its layers first, rings
  rolled over or not.
- An alert of ``config.cards.BLAME_KINDS`` (on ``train/loss`` or ``train/grad_norm``
  for ``rising_trend``) gets ``blame``: the parameters that rose first and most
  (``diagnose.blame.blame``), also as a "started in: ..." suffix to its message, so the
  panel's alert line and the viewer's alert list show it as they show the message.
- For ``detail_steps`` steps after such an alert, each collected step also records
  ``param/<name>/grad_norm`` (from the ring), ``param/<name>/weight_norm`` and
  ``param/<name>/update_ratio`` (``||w - w_prev|| / ||w_prev||``, ``w_prev`` the weights
  at the previous collected step: with ``log_interval: 1`` that is the step's own
  update). The weights are read from the Parameters; a host copy of them is kept only
  while the window is open (the update ratios themselves come from ``UpdateRatios``
  when it runs).
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Sequence
from typing import Any

import numpy as np

from msmon_nb.collect.tensors import to_numpy
from msmon_nb.collect.values import param_tag
from msmon_nb.config.blame import blame_on, resolve_blame
from msmon_nb.config.cards import BLAME_KINDS
from msmon_nb.diagnose.alert import Alert
from msmon_nb.diagnose.blame import Blamed, NormRing, blame, describe
from msmon_nb.metrics.norms import sum_of_squares

# rising_trend watches any series; only these ones are the gradient and loss families
_TREND_TAGS = ("train/loss", "train/grad_norm")
_MB = 1 << 20


class UpdateRatios:
    """Each parameter's ``||w - w_prev|| / ||w_prev||`` between two collected steps, read
    from the Parameters (``to_numpy``: a view of a CPU Parameter's memory, a device copy
    elsewhere) against a float32 host copy of the previous collected step's weights.

    Memory: one float32 copy of the parameters measured, at most ``limit_mb`` (those
    past it, in the optimizer's order, get NaN: said once through ``warn``), and one
    scratch buffer of the largest. Time: per parameter a subtraction, two dot products
    and a copy, on collected steps only (``bench/layers.py`` prints the figure).
    ``weight_sq`` holds each parameter's ``||w||^2`` of the last step measured (the
    detail window's ``weight_norm``).
    """

    def __init__(self, limit_mb: int, warn: Any = None) -> None:
        self.limit = limit_mb * _MB
        self.warn = warn
        self._given: object = None
        self._order: list[Any] = []
        self._prev: dict[int, np.ndarray] = {}
        self.weight_sq = np.zeros(0)
        self._buf = np.empty(0, np.float32)

    def measure(self, names: Sequence[str], params: Sequence[Any] | None) -> np.ndarray | None:
        """The ratios of this collected step, one per name (NaN: not known yet, or not
        measured); None without Parameters."""
        if not params:
            return None
        if names is not self._given:
            by_name = {str(getattr(p, "name", "")): p for p in params}
            order = [by_name.get(n) for n in names]
            if order != self._order:
                self._order, self._prev = order, {}
                self.weight_sq = np.full(len(names), np.nan)
            self._given = names
        out = np.full(len(names), np.nan)
        used = 0
        dropped = []
        for j, param in enumerate(self._order):
            if param is None:
                continue
            flat = np.asarray(to_numpy(param), dtype=np.float32).reshape(-1)
            used += flat.nbytes
            if used > self.limit:
                dropped.append(names[j])
                continue
            prev = self._prev.get(j)
            if prev is None or prev.size != flat.size:
                self._prev[j] = flat.copy()
                self.weight_sq[j] = float(np.dot(flat, flat))
                continue
            if self._buf.size < flat.size:
                self._buf = np.empty(flat.size, np.float32)
            diff = self._buf[: flat.size]
            np.subtract(flat, prev, out=diff)
            base = self.weight_sq[j]
            if base > 0:
                out[j] = math.sqrt(float(np.dot(diff, diff)) / base)
            np.copyto(prev, flat)
            self.weight_sq[j] = float(np.dot(flat, flat))
        if dropped and self.warn is not None:
            self.warn(
                "update_ratio limit",
                f"update ratio not measured for {len(dropped)} parameters ({dropped[0]}, ...): "
                f"their float32 copies would pass blame.ratio_mb={self.limit // _MB}; raise it "
                "(the copy is host memory) or accept that layer_rise judges their gradient "
                "norms only",
            )
        return out


class LayerBlame:
    """The ring, the per-layer judgement, the blame and the detail window of one run
    (module docstring)."""

    def __init__(self, config: Any, warn: Any = None) -> None:
        settings = resolve_blame(config.blame)
        self.on = blame_on(config)
        self.ring = NormRing(int(settings["steps"]))
        self.z = float(settings["z"])
        self.top = int(settings["top"])
        self.detail_steps = int(settings["detail_steps"])
        self.detail_until: int | None = None  # last step of the open detail window
        self._before: dict[str, np.ndarray] = {}  # name -> weights at the last detail step
        self.ratios = (
            UpdateRatios(int(settings["ratio_mb"]), warn) if settings["update_ratio"] else None
        )
        # the layer_rise alerts of the last ``steps`` steps: (step, what they named)
        self.recent: list[tuple[int, list[Blamed]]] = []

    def measure(self, names: Sequence[str], params: Sequence[Any] | None) -> np.ndarray | None:
        """The update ratios of this step, read from ``params`` now (the optimizer writes
        them again next step); None when ``update_ratio`` is off."""
        return None if self.ratios is None else self.ratios.measure(names, params)

    def keep(
        self,
        step: int,
        names: Sequence[str],
        norms: np.ndarray,
        ratios: np.ndarray | None = None,
    ) -> None:
        """One collected step's per-parameter gradient norms and update ratios (``measure``,
        or as measured elsewhere: a replay of recorded curves; None: not known) as the
        ring's row."""
        self.ring.push(step, names, norms, ratios)

    def remember(self, alert: Alert) -> None:
        """A ``layer_rise`` alert: a gradient or loss alert soon after names its layers."""
        named = [_blamed(b) for b in alert.blame or ()]
        horizon = alert.step - self.ring.size
        self.recent = [r for r in self.recent if r[0] >= horizon] + [(alert.step, named)]

    def wants(self, alert: Alert) -> bool:
        """Whether ``alert`` is of the families a blame is for."""
        if not self.on or alert.kind not in BLAME_KINDS:
            return False
        return alert.kind != "rising_trend" or alert.tag in _TREND_TAGS

    def judge(self, alert: Alert, params: list | None) -> Alert:
        """``alert`` with its blame (``[]`` when no parameter rose over ``z``, or with
        no norms kept): the layers a ``layer_rise`` alert named in the ``steps`` steps
        before its onset first, then those of ``diagnose.blame.blame``; opens the
        detail window, whose first weights are ``params``."""
        if not self.wants(alert):
            return alert
        found = blame(self.ring, alert.step, alert.since_step, self.z, self.top)
        early = [
            b
            for at, named in self.recent
            if alert.since_step - self.ring.size <= at <= alert.step
            for b in named
        ]
        if early:
            seen = {b.name for b in early}
            found = list({b.name: b for b in early}.values()) + [
                b for b in found if b.name not in seen
            ]
            found = found[: self.top]
        message = alert.message
        if found:
            message = f"{message.rstrip('.')}; {describe(found)}"
        blamed = tuple(b.to_dict() for b in found)
        if self.detail_steps > 0:
            self.detail_until = alert.step + self.detail_steps
            self._before = self._weights(params) if params and self.ratios is None else {}
        return dataclasses.replace(alert, message=message, blame=blamed)

    def detail(self, step: int, params: list | None) -> dict[str, float]:
        """The ``param/<name>/...`` scalars of collected step ``step`` while a detail
        window is open (module docstring); {} otherwise. The window closes (and the
        weight copies go) after its last step."""
        until = self.detail_until
        if until is None:
            return {}
        if step > until:
            self.detail_until, self._before = None, {}
            return {}
        out: dict[str, float] = {}
        last = self.ring.last()
        if last is not None and last[0] == step:
            for name, norm in zip(self.ring.names, last[1], strict=True):
                out[f"param/{param_tag(name)}/grad_norm"] = float(norm)
            if self.ratios is not None:
                out.update(self._measured())
        if self.ratios is None or not out:
            out.update(self._copied(params))
        if step >= until:
            self.detail_until, self._before = None, {}
        return out

    def _measured(self) -> dict[str, float]:
        """weight_norm and update_ratio of the last row, as ``UpdateRatios`` measured them."""
        out: dict[str, float] = {}
        _, ratios = self.ring.ratio_rows()
        row = ratios[-1]
        for j, name in enumerate(self.ring.names):
            tag = param_tag(name)
            sq = self.ratios.weight_sq[j] if j < len(self.ratios.weight_sq) else math.nan
            if math.isfinite(sq):
                out[f"param/{tag}/weight_norm"] = math.sqrt(sq)
            if math.isfinite(row[j]):
                out[f"param/{tag}/update_ratio"] = float(row[j])
        return out

    def _copied(self, params: list | None) -> dict[str, float]:
        """weight_norm and update_ratio from host copies kept while the window is open
        (``update_ratio: false``, or no norms this step)."""
        out: dict[str, float] = {}
        now = self._weights(params) if params else {}
        for name, w in now.items():
            tag = param_tag(name)
            norm = math.sqrt(sum_of_squares(w))
            out[f"param/{tag}/weight_norm"] = norm
            prev = self._before.get(name)
            if prev is not None and prev.shape == w.shape:
                base = math.sqrt(sum_of_squares(prev))
                if base > 0:
                    out[f"param/{tag}/update_ratio"] = math.sqrt(sum_of_squares(w - prev)) / base
        self._before = now
        return out

    @staticmethod
    def _weights(params: list) -> dict[str, np.ndarray]:
        """A host copy of each Parameter's values, by name (``asnumpy`` of a CPU
        Parameter is a view of its memory, which the next update overwrites)."""
        out = {}
        for i, p in enumerate(params):
            out[str(getattr(p, "name", f"param_{i}"))] = np.array(to_numpy(p), copy=True)
        return out


def _blamed(entry: Any) -> Blamed:
    """A ``Blamed`` back from its ``to_dict()`` form ('inf' and 'nan' as strings)."""
    return Blamed(
        str(entry["name"]),
        float(entry["z"]),
        int(entry["step"]),
        float(entry["norm"]),
        float(entry["usual"]),
    )
