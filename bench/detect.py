"""A labelled detection benchmark: real CPU MindSpore training runs with known failures,
on a tuning set (what the rules were designed on) and a held-out test set.

The runs (``bench/detect_runs.py``): tiny MLPs, conv nets and transformer blocks trained
with SGD, Momentum/Nesterov, RMSProp, Adam and AdamWeightDecay under several schedules
and batch sizes, with a failure scripted at a known step (lr jump, corrupted batch,
saturating re-init, NaN loss, lr 0, lr ramp, growing gradient scale, tiny lr, data
loader stall, and a quiet-gradient stretch that leaves Adam's v stale), and healthy runs.
Their curves are frozen in ``bench/data/detect_curves.json.gz`` (``bench/detect_data.py``)
and replayed through ``msmon_nb.diagnose`` and three published baselines, calibrated
on the tuning set (``bench/detect_score.py`` says how, and how it counts).

    GLOG_v=3 python bench/detect.py            # replay both sets, retrain 4 runs to check the file
    GLOG_v=3 python bench/detect.py --smoke    # replay, retrain 1 run (CI, <= 30 s)
    GLOG_v=3 python bench/detect.py --regen    # retrain every run, rewrite the frozen file
    GLOG_v=3 python bench/detect.py --freeze-new   # train only the runs the file lacks
    options: --only PREFIX (runs), --verbose (every alert), --json PATH (results)
"""

from __future__ import annotations

import argparse
import json
import math
import os
import sys
import time
from pathlib import Path

os.environ.setdefault("GLOG_v", "3")
sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from bench.detect_data import FROZEN, SETS, freeze, specs_of, thaw, trained, with_frozen
from bench.detect_runs import train
from bench.detect_score import (
    LEGEND,
    blowup_step,
    detectors,
    evaluate,
    ours_detail,
    summary,
    table,
)

# retrained by the full bench (and the smoke, the first) to check the frozen file
CHECK_RUNS = (
    "plateau-adam",
    "outlier-adam",
    "t-adam-spike-regress-conv",
    "t-healthy-adamw95-warmup_linear-b16-blobs-transformer-s214",
    "slow-div-sgd-1.04",
    "cv-memorise-mlp-adam-regress-s303",
)


def drift(frozen: dict, fresh: dict) -> float:
    """Largest relative difference of loss, grad_norm and stored moment norms between a
    frozen run and the same run retrained (NaN where both are NaN counts as equal)."""
    worst = 0.0
    pairs = [("loss", frozen["loss"], fresh["loss"])]
    pairs.append(("grad_norm", frozen["grad_norm"], fresh["grad_norm"]))
    pairs += [(t, v, fresh["opt"][t]) for t, v in frozen["opt"].items()]
    for _, a, b in pairs:
        if len(a) != len(b):
            return math.inf
        for x, y in zip(a, b, strict=True):
            if math.isnan(x) and math.isnan(y):
                continue
            if x == y:
                continue
            if not (math.isfinite(x) and math.isfinite(y)):
                return math.inf
            worst = max(worst, abs(x - y) / max(abs(x), abs(y), 1e-12))
    return worst


def check(frozen: dict, names: tuple[str, ...]) -> None:
    """Retrain ``names`` and print how far they are from the frozen curves."""
    by_name = {spec.name: (spec, rec) for pairs in frozen.values() for spec, rec in pairs}
    for name in names:
        spec, rec = by_name[name]
        t = time.perf_counter()
        fresh = train(spec)
        print(
            f"retrained {name} in {time.perf_counter() - t:.1f} s: largest relative "
            f"difference from the frozen curves {drift(rec, fresh):.2g}"
        )


def verbose(runs: list) -> None:
    for spec, rec in runs:
        blow = blowup_step(spec, rec["loss"]) if spec.failure else None
        print(f"{spec.name} failure={spec.failure} onset={spec.onset} blowup={blow}")
        for a in ours_detail(spec, rec):
            print(f"    {a.kind} step={a.step} since={a.since_step}: {a.message[:100]}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--regen", action="store_true", help="retrain every run, refreeze")
    parser.add_argument(
        "--freeze-cache", action="store_true", help="refreeze from bench/.cache (train missing)"
    )
    parser.add_argument(
        "--freeze-new", action="store_true", help="train the runs the frozen file lacks, refreeze"
    )
    parser.add_argument("--smoke", action="store_true", help="CI size: retrain one run")
    parser.add_argument("--only", default="", help="runs whose name starts with this")
    parser.add_argument("--verbose", action="store_true", help="every run's alerts")
    parser.add_argument("--json", type=Path, help="write the per-kind results here")
    args = parser.parse_args()
    t0 = time.perf_counter()
    if args.freeze_new:
        t = time.perf_counter()
        size = freeze(with_frozen())
        print(f"new runs trained in {time.perf_counter() - t:.1f} s", file=sys.stderr)
        print(f"froze {FROZEN} ({size / 1e6:.2f} MB)", file=sys.stderr)
    elif args.regen or args.freeze_cache:
        runs = {}
        for which in SETS:
            t = time.perf_counter()
            runs[which] = [(spec, trained(spec, regen=args.regen)) for spec in specs_of(which)]
            print(f"{which} set: curves in {time.perf_counter() - t:.1f} s", file=sys.stderr)
        size = freeze(runs)
        print(f"froze {FROZEN} ({size / 1e6:.2f} MB)", file=sys.stderr)
    frozen = thaw()
    results: dict[str, dict] = {}
    dets = detectors(frozen["tuning"])
    for which in SETS:
        runs = [(s, r) for s, r in frozen[which] if s.name.startswith(args.only)]
        if args.verbose:
            verbose(runs)
        steps = sum(len(r["loss"]) for _, r in runs)
        healthy = sum(len(r["loss"]) for s, r in runs if s.failure is None)
        title = (
            f"{which} set: {len(runs)} runs ({sum(1 for s, _ in runs if s.failure)} with a "
            f"failure), {steps} steps, {healthy} of them healthy"
        )
        results[which] = {name: evaluate(runs, det, acc) for name, (det, acc) in dets.items()}
        print(table(results[which], title))
        print()
    print(LEGEND)
    if not args.regen:
        check(frozen, CHECK_RUNS[:1] if args.smoke else CHECK_RUNS)
    if args.json:
        out = {
            which: {
                name: {"kinds": summary(r), "fa_per_10k": r["fa_per_10k"], "fa": r["fa"]}
                for name, r in res.items()
            }
            for which, res in results.items()
        }
        args.json.write_text(json.dumps(out, indent=1))
    print(f"bench took {time.perf_counter() - t0:.1f} s")


if __name__ == "__main__":
    main()
