"""The single-layer set's curves, frozen in one committed file.

Trained once by ``python bench/layers.py --regen`` (real CPU MindSpore training), stored
as ``bench/data/layers_curves.json.gz``: per run its spec, the parameter names, and as
float32 (``bench/detect_data.pack``) the loss, the global grad_norm, and each
parameter's gradient norm and update ratio per step (steps x parameters, row-major).
The tuning set (``--regen --tuning``) is frozen the same way in
``bench/data/layers_tuning.json.gz``.
"""

from __future__ import annotations

import gzip
import json
from dataclasses import asdict
from pathlib import Path
from typing import Any

import numpy as np

from bench.detect_data import pack, unpack
from bench.detect_runs import Spec

ROOT = Path(__file__).resolve().parent
FROZEN = ROOT / "data" / "layers_curves.json.gz"
TUNING = ROOT / "data" / "layers_tuning.json.gz"
FORMAT = 1

Run = tuple[Spec, dict[str, Any]]


def freeze(runs: list[Run], path: Path = FROZEN) -> int:
    """Write the runs' curves to ``path``; its size in bytes."""
    rows = []
    for spec, rec in runs:
        rows.append(
            {
                "spec": asdict(spec),
                "names": rec["names"],
                "loss": pack(rec["loss"], "<f4"),
                "grad_norm": pack(rec["grad_norm"], "<f4"),
                "grads": pack(np.asarray(rec["grads"]).ravel().tolist(), "<f4"),
                "ratios": pack(np.asarray(rec["ratios"]).ravel().tolist(), "<f4"),
            }
        )
    data = json.dumps({"format": FORMAT, "runs": rows}, sort_keys=True).encode()
    path.parent.mkdir(parents=True, exist_ok=True)
    out = gzip.compress(data, compresslevel=9, mtime=0)
    path.write_bytes(out)
    return len(out)


def thaw(path: Path = FROZEN) -> list[Run]:
    """The frozen runs: ``[(spec, {names, loss, grad_norm, lr, grads, ratios}), ...]``,
    ``grads`` and ``ratios`` float64 arrays of steps x parameters."""
    raw = json.loads(gzip.decompress(path.read_bytes()))
    if raw.get("format") != FORMAT:
        raise ValueError(f"{path}: format {raw.get('format')!r}, expected {FORMAT}")
    out = []
    for row in raw["runs"]:
        spec = Spec(**row["spec"])
        names = list(row["names"])
        shape = (spec.steps, len(names))
        rec = {
            "names": names,
            "loss": unpack(row["loss"], "<f4"),
            "grad_norm": unpack(row["grad_norm"], "<f4"),
            "lr": [spec.lr] * spec.steps,
            "grads": np.asarray(unpack(row["grads"], "<f4"), dtype=np.float64).reshape(shape),
            "ratios": np.asarray(unpack(row["ratios"], "<f4"), dtype=np.float64).reshape(shape),
        }
        out.append((spec, rec))
    return out
