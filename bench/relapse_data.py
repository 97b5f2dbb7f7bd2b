"""The "converged, then broken" set's curves, frozen in one committed file.

Trained once by ``python bench/relapse.py --regen`` (real CPU MindSpore training, about
ten minutes on one core), stored as ``bench/data/relapse_curves.json.gz`` in the form of
``bench/data/detect_curves.json.gz`` (float32 loss and grad_norm as MindSpore computed
them, Adam-family second-moment norms; the lr is the spec's, ``relapse_runs.lrs_of``).
The file stores each run's spec beside its curves: ``tests/detection/test_relapse.py``
checks that they are ``relapse_runs.specs()`` exactly and retrains a run against them.
"""

from __future__ import annotations

import gzip
import json
from dataclasses import asdict
from pathlib import Path
from typing import Any

from bench.detect_data import MOMENT_SUFFIX, pack, unpack
from bench.detect_runs import Spec
from bench.relapse_runs import lrs_of

FROZEN = Path(__file__).resolve().parent / "data" / "relapse_curves.json.gz"
# the tuning set (``relapse_runs.specs(tuning=True)``): rules are tuned on this one only
FROZEN_TUNING = FROZEN.with_name("relapse_tuning.json.gz")
FORMAT = 1

Run = tuple[Spec, dict[str, Any]]


def freeze(runs: list[Run], path: Path = FROZEN) -> int:
    """Write the runs' curves to ``path``; its size in bytes."""
    rows = []
    for spec, rec in runs:
        rows.append(
            {
                "spec": asdict(spec),
                "loss": pack(rec["loss"], "<f4"),
                "grad_norm": pack(rec["grad_norm"], "<f4"),
                "opt": {
                    tag: pack(v, "<f4")
                    for tag, v in rec["opt"].items()
                    if tag.endswith(MOMENT_SUFFIX)
                },
            }
        )
    data = json.dumps({"format": FORMAT, "runs": rows}, sort_keys=True).encode()
    path.parent.mkdir(parents=True, exist_ok=True)
    out = gzip.compress(data, compresslevel=9, mtime=0)
    path.write_bytes(out)
    return len(out)


def thaw(path: Path = FROZEN) -> list[Run]:
    """The frozen runs: ``[(spec, {loss, grad_norm, lr, opt}), ...]`` in ``specs()`` order."""
    raw = json.loads(gzip.decompress(path.read_bytes()))
    if raw.get("format") != FORMAT:
        raise ValueError(f"{path}: format {raw.get('format')!r}, expected {FORMAT}")
    out = []
    for row in raw["runs"]:
        spec = Spec(**row["spec"])
        rec = {
            "loss": unpack(row["loss"], "<f4"),
            "grad_norm": unpack(row["grad_norm"], "<f4"),
            "lr": lrs_of(spec),
            "opt": {tag: unpack(v, "<f4") for tag, v in row["opt"].items()},
        }
        out.append((spec, rec))
    return out
