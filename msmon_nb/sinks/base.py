"""The sink protocol and the fan-out that keeps training alive when a sink fails.

A sink that raises (disk full, permission denied, mlflow down) is reported once with a
``MonitorWarning`` naming the sink and the error, then dropped; the other sinks and the
training go on.
"""

from __future__ import annotations

import logging
import warnings
from collections.abc import Mapping
from typing import Any

import numpy as np

from msmon_nb.config.checks import MonitorWarning

log = logging.getLogger(__name__)


class Sink:
    """Base class: override what the output supports; the rest is ignored."""

    name = "sink"

    def scalars(self, step: int, wall: float, values: Mapping[str, float]) -> None:
        """Record scalars at ``step``."""

    def histogram(self, step: int, wall: float, tag: str, values: np.ndarray | Any) -> None:
        """Record a histogram (of an array, or a ready ``Histogram``)."""

    def tensor(self, step: int, wall: float, tag: str, values: np.ndarray) -> None:
        """Record a tensor."""

    def flush(self) -> None:
        """Push buffered records out."""

    def close(self) -> None:
        """Release files and connections."""


class Fanout:
    """Calls every live sink; a sink that raises is warned about once and disabled."""

    def __init__(self, sinks: list[Sink]) -> None:
        self.sinks = list(sinks)
        self.failed: dict[str, str] = {}

    def _call(self, method: str, *args: Any) -> None:
        for sink in list(self.sinks):
            try:
                getattr(sink, method)(*args)
            except Exception as exc:  # noqa: BLE001 - a failing output must not stop training
                self._disable(sink, exc)

    def _disable(self, sink: Sink, exc: BaseException) -> None:
        self.sinks.remove(sink)
        self.failed[sink.name] = f"{type(exc).__name__}: {exc}"
        message = (
            f"msmon: the {sink.name} output failed and is switched off; training goes on "
            f"({type(exc).__name__}: {exc})"
        )
        log.debug(message)
        warnings.warn(message, MonitorWarning, stacklevel=4)
        try:
            sink.close()
        except Exception:  # already reported; closing is best effort
            log.debug("closing the failed %s sink raised too", sink.name, exc_info=True)

    def scalars(self, step: int, wall: float, values: Mapping[str, float]) -> None:
        self._call("scalars", step, wall, values)

    def histogram(self, step: int, wall: float, tag: str, values: Any) -> None:
        self._call("histogram", step, wall, tag, values)

    def tensor(self, step: int, wall: float, tag: str, values: np.ndarray) -> None:
        self._call("tensor", step, wall, tag, values)

    def flush(self) -> None:
        self._call("flush")

    def close(self) -> None:
        self._call("close")
        self.sinks.clear()
