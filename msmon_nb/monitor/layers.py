"""Which layer started it, for one Monitor: the ring of per-parameter gradient norms,
the blame an alert of the gradient or loss families carries, and the detail recorded
for a while after it.

- Every collected step's per-parameter gradient norms (``collect.collector``'s
  ``param_norms``) go into a ``diagnose.blame.NormRing``: a copy of P floats.
- An alert of ``config.cards.BLAME_KINDS`` (on ``train/loss`` or ``train/grad_norm``
  for ``rising_trend``) gets ``blame``: the parameters that rose first and most
  (``diagnose.blame.blame``), also as a "started in: ..." suffix to its message, so the
  panel's alert line and the viewer's alert list show it as they show the message.
- For ``detail_steps`` steps after such an alert, each collected step also records
  ``param/<name>/grad_norm`` (from the ring), ``param/<name>/weight_norm`` and
  ``param/<name>/update_ratio`` (``||w - w_prev|| / ||w_prev||``, ``w_prev`` the weights
  at the previous collected step: with ``log_interval: 1`` that is the step's own
  update). The weights are read from the Parameters; a host copy of them is kept only
  while the window is open.
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
from msmon_nb.diagnose.blame import NormRing, blame, describe
from msmon_nb.metrics.norms import sum_of_squares

# rising_trend watches any series; only these ones are the gradient and loss families
_TREND_TAGS = ("train/loss", "train/grad_norm")


class LayerBlame:
    """The ring, the blame and the detail window of one run (module docstring)."""

    def __init__(self, config: Any) -> None:
        settings = resolve_blame(config.blame)
        self.on = blame_on(config)
        self.ring = NormRing(int(settings["steps"]))
        self.z = float(settings["z"])
        self.top = int(settings["top"])
        self.detail_steps = int(settings["detail_steps"])
        self.detail_until: int | None = None  # last step of the open detail window
        self._before: dict[str, np.ndarray] = {}  # name -> weights at the last detail step

    def keep(self, step: int, names: Sequence[str], norms: np.ndarray) -> None:
        """One collected step's per-parameter gradient norms."""
        self.ring.push(step, names, norms)

    def wants(self, alert: Alert) -> bool:
        """Whether ``alert`` is of the families a blame is for."""
        if not self.on or alert.kind not in BLAME_KINDS:
            return False
        return alert.kind != "rising_trend" or alert.tag in _TREND_TAGS

    def judge(self, alert: Alert, params: list | None) -> Alert:
        """``alert`` with its blame (``[]`` when no parameter rose over ``z``, or with
        no norms kept); opens the detail window, whose first weights are ``params``."""
        if not self.wants(alert):
            return alert
        found = blame(self.ring, alert.step, alert.since_step, self.z, self.top)
        message = alert.message
        if found:
            message = f"{message.rstrip('.')}; {describe(found)}"
        blamed = tuple(b.to_dict() for b in found)
        if self.detail_steps > 0:
            self.detail_until = alert.step + self.detail_steps
            self._before = self._weights(params) if params else {}
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
        if step >= until:
            self.detail_until, self._before = None, {}
        return out

    @staticmethod
    def _weights(params: list) -> dict[str, np.ndarray]:
        """A host copy of each Parameter's values, by name (``asnumpy`` of a CPU
        Parameter is a view of its memory, which the next update overwrites)."""
        out = {}
        for i, p in enumerate(params):
            out[str(getattr(p, "name", f"param_{i}"))] = np.array(to_numpy(p), copy=True)
        return out
