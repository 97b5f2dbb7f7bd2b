"""``monitor_type: mlflow``: metrics into an MLflow tracking server or file store.

Uses the real client (``pip install 'msmon_nb[mlflow]'``). Each step's metrics go in one
``log_batch`` call made on a single worker thread, so a slow server does not hold up
training; an error there is raised on the sink's next call, and the fan-out then warns
once and drops the sink. Without ``mlflow_tracking_uri`` the run goes to a file store
at ``<save_dir>/mlruns`` (MLflow 3 keeps file stores behind ``MLFLOW_ALLOW_FILE_STORE``,
which this sets for that default only).
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from concurrent.futures import Future, ThreadPoolExecutor
from pathlib import Path
from typing import Any

from msmon_nb.sinks.base import Sink


class MlflowSink(Sink):
    """Logs scalars as MLflow metrics; the MLflow run is named after the msmon run."""

    name = "mlflow"

    def __init__(self, run_dir: Path, config: Any) -> None:
        from mlflow.tracking import MlflowClient

        uri = getattr(config, "mlflow_tracking_uri", None)
        if not uri:
            uri = (run_dir.parent / "mlruns").resolve().as_uri()
            os.environ.setdefault("MLFLOW_ALLOW_FILE_STORE", "true")
        registry = uri if uri.startswith("file:") else None
        self.client = MlflowClient(tracking_uri=uri, registry_uri=registry)
        project = getattr(config, "project_name", "default") or "default"
        experiment = self.client.get_experiment_by_name(project)
        experiment_id = (
            experiment.experiment_id if experiment else self.client.create_experiment(project)
        )
        self.run_id = self.client.create_run(experiment_id, run_name=run_dir.name).info.run_id
        self.tracking_uri = uri
        self._pool = ThreadPoolExecutor(max_workers=1, thread_name_prefix="msmon-mlflow")
        self._futures: list[Future] = []

    def _check(self) -> None:
        done = [f for f in self._futures if f.done()]
        self._futures = [f for f in self._futures if not f.done()]
        for future in done:
            future.result()  # re-raises the worker's error here

    def scalars(self, step: int, wall: float, values: Mapping[str, float]) -> None:
        from mlflow.entities import Metric

        self._check()
        stamp = int(wall * 1000)
        metrics = [Metric(tag, float(v), stamp, step) for tag, v in values.items()]
        self._futures.append(self._pool.submit(self.client.log_batch, self.run_id, metrics))

    def flush(self) -> None:
        for future in self._futures:
            future.result()
        self._futures.clear()

    def close(self) -> None:
        try:
            self.flush()
            self.client.set_terminated(self.run_id)
        finally:
            self._pool.shutdown(wait=True)
