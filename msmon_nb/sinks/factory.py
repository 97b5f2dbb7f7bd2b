"""Opening the outputs a config names (``monitor_type``), each behind the fan-out.

Apart from the sinks so that ``sinks.base`` (the protocol and the fan-out) imports no
sink and every sink imports only the base. MLflow itself is imported only when an
MLflow sink opens.
"""

from __future__ import annotations

import warnings
from pathlib import Path
from typing import Any

from msmon_nb.config.checks import MonitorWarning
from msmon_nb.sinks.base import Fanout
from msmon_nb.sinks.jsonl import JsonlSink
from msmon_nb.sinks.mlflow import MlflowSink
from msmon_nb.sinks.summary import SummarySink
from msmon_nb.sinks.tensorboard import TensorboardSink


def make_sinks(kinds: list[str], run_dir: Path, *, rank: int = 0, config: Any = None) -> Fanout:
    """Open the sinks named in ``kinds``; one that cannot open is warned about and skipped."""
    factories = {
        "summary": lambda: SummarySink(
            run_dir,
            rank=rank,
            max_file_size=getattr(config, "max_file_size", None),
            flush_secs=getattr(config, "flush_secs", 1.0),
        ),
        "file": lambda: JsonlSink(run_dir / f"metrics.rank{rank}.jsonl"),
        "mlflow": lambda: MlflowSink(run_dir, config),
        "tensorboard": lambda: TensorboardSink(run_dir / "tensorboard", rank=rank),
    }
    fanout = Fanout([])
    for kind in kinds:
        try:
            fanout.sinks.append(factories[kind]())
        except Exception as exc:  # noqa: BLE001 - an output that cannot open is skipped
            fanout.failed[kind] = f"{type(exc).__name__}: {exc}"
            warnings.warn(
                f"msmon: cannot open the {kind} output, continuing without it "
                f"({type(exc).__name__}: {exc})",
                MonitorWarning,
                stacklevel=3,
            )
    return fanout
