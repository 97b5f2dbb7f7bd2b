"""The detection benchmark's curves: trained (and cached), or frozen in one committed file.

Training all runs of both sets takes minutes (``bench/detect.py --regen``), so the curves
are frozen into ``bench/data/detect_curves.json.gz``: the tests and the default bench
replay that file through ``msmon_nb.diagnose`` and the baselines in a few seconds, and a
test retrains a few runs to check the file still matches real training.

Compact by construction: loss and grad_norm are stored as the float32 MindSpore computed
(so a replay sees exactly the training's values), the lr is not stored (the spec's
schedule gives it), the data/compute seconds (float16, in ms) only for the runs whose
replay feeds them to ``data_bound``, and of the optimizer state only what a rule reads:
the second-moment norms (``param/<name>/moment2_norm``) of Adam-family runs, float32.
"""

from __future__ import annotations

import base64
import gzip
import json
from collections.abc import Iterable
from dataclasses import asdict
from pathlib import Path
from typing import Any

import numpy as np

from bench.detect_runs import Spec, converged_specs, lr_list, test_specs, train, tuning_specs

ROOT = Path(__file__).resolve().parent
CACHE = ROOT / ".cache" / "detect"
FROZEN = ROOT / "data" / "detect_curves.json.gz"
FORMAT = 1
SETS = ("tuning", "test", "converged")
MOMENT_SUFFIX = "/moment2_norm"

Curves = dict[str, Any]  # loss, grad_norm, lr, data, compute: lists; opt: {tag: list}


def specs_of(which: str) -> list[Spec]:
    """The specs of the ``tuning``, ``test`` or ``converged`` set."""
    return {"tuning": tuning_specs, "test": test_specs, "converged": converged_specs}[which]()


def timed(spec: Spec) -> bool:
    """Whether a replay feeds the run's data/compute seconds (``data_bound``): the
    data-stall runs, and the healthy runs, where it must stay quiet."""
    return spec.failure in (None, "data_stall")


def trained(spec: Spec, regen: bool = False) -> Curves:
    """``spec``'s curves from real training, cached under ``bench/.cache/detect``."""
    path = CACHE / f"{spec.name}-{spec.key()}.json"
    if path.exists() and not regen:
        return json.loads(path.read_text())
    rec = train(spec)
    CACHE.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(rec))
    return rec


def with_frozen(path: Path = FROZEN) -> dict[str, list[tuple[Spec, Curves]]]:
    """Every set's curves, taken from the frozen file where it holds the very same run
    and trained (through the cache) where it does not: adding runs to a set retrains
    only them."""
    frozen = thaw(path) if path.exists() else {}
    known = {
        (which, spec.name, spec.key()): rec
        for which, pairs in frozen.items()
        for spec, rec in pairs
    }
    out = {}
    for which in SETS:
        pairs = []
        for spec in specs_of(which):
            rec = known.get((which, spec.name, spec.key()))
            pairs.append((spec, rec if rec is not None else trained(spec)))
        out[which] = pairs
    return out


def pack(values: Iterable[float], dtype: str) -> str:
    """``values`` as base64 of little-endian ``dtype`` bytes (the frozen files' form)."""
    return base64.b64encode(np.asarray(list(values), dtype=dtype).tobytes()).decode()


def unpack(text: str, dtype: str) -> list[float]:
    """What ``pack`` wrote, as floats."""
    return np.frombuffer(base64.b64decode(text), dtype=dtype).astype(np.float64).tolist()


def freeze(runs: dict[str, list[tuple[Spec, Curves]]], path: Path = FROZEN) -> int:
    """Write both sets' curves to ``path``; returns its size in bytes."""
    out: dict[str, Any] = {"format": FORMAT, "sets": {}}
    for which, pairs in runs.items():
        rows = []
        for spec, rec in pairs:
            row: dict[str, Any] = {
                "spec": asdict(spec),
                "loss": pack(rec["loss"], "<f4"),
                "grad_norm": pack(rec["grad_norm"], "<f4"),
            }
            if timed(spec):
                row["data_ms"] = pack((1e3 * t for t in rec["data"]), "<f2")
                row["compute_ms"] = pack((1e3 * t for t in rec["compute"]), "<f2")
            row["opt"] = {
                tag: pack(v, "<f4") for tag, v in rec["opt"].items() if tag.endswith(MOMENT_SUFFIX)
            }
            rows.append(row)
        out["sets"][which] = rows
    path.parent.mkdir(parents=True, exist_ok=True)
    data = gzip.compress(json.dumps(out, sort_keys=True).encode(), compresslevel=9, mtime=0)
    path.write_bytes(data)
    return len(data)


def _spec(data: dict[str, Any]) -> Spec:
    return Spec(**data)


def thaw(path: Path = FROZEN) -> dict[str, list[tuple[Spec, Curves]]]:
    """Both sets' frozen curves: ``{set: [(spec, curves), ...]}``, curves as ``trained``
    returns them (lr from the spec; seconds as 0 where not stored)."""
    raw = json.loads(gzip.decompress(path.read_bytes()))
    if raw.get("format") != FORMAT:
        raise ValueError(f"{path}: format {raw.get('format')!r}, expected {FORMAT}")
    out: dict[str, list[tuple[Spec, Curves]]] = {}
    for which, rows in raw["sets"].items():
        pairs = []
        for row in rows:
            spec = _spec(row["spec"])
            loss = unpack(row["loss"], "<f4")
            rec: Curves = {
                "loss": loss,
                "grad_norm": unpack(row["grad_norm"], "<f4"),
                "lr": lr_list(spec),
                "opt": {tag: unpack(v, "<f4") for tag, v in row["opt"].items()},
            }
            if "data_ms" in row:
                rec["data"] = [1e-3 * t for t in unpack(row["data_ms"], "<f2")]
                rec["compute"] = [1e-3 * t for t in unpack(row["compute_ms"], "<f2")]
            else:
                rec["data"] = rec["compute"] = [0.0] * len(loss)
            pairs.append((spec, rec))
        out[which] = pairs
    return out
