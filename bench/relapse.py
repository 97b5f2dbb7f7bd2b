"""Converged, then broken (issue 43): does a run that reached its floor and then breaks get
warned as early as any other, and does its unbroken twin stay quiet?

The set (``bench/relapse_runs.py``): 8 healthy runs that converge (MLP regression to its
noise floor, MLP/conv/transformer memorising 64 samples, fine-tuning from converged
weights; SGD, Momentum, Adam, AdamW), each kept unbroken as a control and broken once per
failure kind at a random step after it converged. Held out: frozen in
``bench/data/relapse_curves.json.gz`` before any rule changed for issue 43, never tuned on.

Scored as ``bench/detect.py`` scores its sets (``bench/detect_score``): recall, delay,
the lead of the first alert naming the failure before the loss passes 10x its best, and
false alarms per 10 k steps of the controls; for today's rules, for the rules of commit
``BEFORE`` (dabdbaa, before the convergence judge of issue 36: taken with ``git archive``
and replayed in a process of their own) and for the three published baselines of the
detection bench, calibrated as there on its tuning set.

    GLOG_v=3 python bench/relapse.py            # replay; retrain 2 runs to check the file
    GLOG_v=3 python bench/relapse.py --smoke    # replay; retrain 1 run
    GLOG_v=3 python bench/relapse.py --regen    # retrain every run, rewrite the frozen file
    GLOG_v=3 python bench/relapse.py --tuning [--regen]   # the tuning set (other seeds and
                                                # draws, bench/data/relapse_tuning.json.gz):
                                                # tune on this one, never on the held-out
    options: --verbose (every alert of ours), --no-before (skip the dabdbaa column)
"""

from __future__ import annotations

import argparse
import io
import json
import math
import os
import statistics
import subprocess
import sys
import tarfile
import tempfile
import time
from pathlib import Path

os.environ.setdefault("GLOG_v", "3")
ROOT = Path(__file__).resolve().parent.parent
if str(ROOT) not in sys.path:  # the child of ``before_alerts`` puts an older msmon_nb first
    sys.path.append(str(ROOT))

from bench.detect_data import thaw as thaw_detect  # noqa: E402
from bench.detect_score import (  # noqa: E402
    BASE_ACCEPT,
    detectors,
    evaluate,
    series,
    table,
)
from bench.relapse_data import FROZEN, FROZEN_TUNING, freeze, thaw  # noqa: E402
from bench.relapse_runs import FAILURES, specs, train  # noqa: E402

BEFORE = "dabdbaa"  # the last commit before the convergence judge (issue 36)
CHECK_RUNS = (
    "rl-regress-mlp-momentum-s431-grad_compound",
    "rl-memorise-mlp-adam-regress-s432-control",
)
# our alert kinds that name each failure: anything that warns of a rise, a jump or a
# blow-up (the lr's own rule for an lr ramp); a NaN after the blow-up is no warning
_RISE = {"rising_trend", "loss_divergence", "grad_explosion", "loss_spike"}
ACCEPT: dict[str, set[str]] = {
    kind: _RISE | ({"lr_rise"} if kind == "lr_ramp" else set()) for kind in FAILURES
}
# a baseline's grad_norm alert names every one of them (each drives grad_norm up)
BASELINE_ACCEPT = {kind: {"grad_norm"} for kind in FAILURES}
LEGEND = (
    "cell: detected/runs, d = median delay onset -> first alert naming the failure "
    "(collected steps), L = median (min) lead of that alert before the loss (5-step "
    "median) passes 10x its unbroken control's (or NaN), over the runs whose loss did "
    "('blew'); false alarms: every alert on the unbroken controls"
)


def alerts_of(runs: list, diagnose) -> dict[str, list[tuple[int, str]]]:
    """Every run's alerts ``[(step, kind), ...]`` from ``diagnose`` over what the monitor
    records (loss, grad_norm, lr, Adam's second-moment norms)."""
    return {
        spec.name: [(a.step, a.kind) for a in diagnose(series(spec, rec))] for spec, rec in runs
    }


def _child() -> None:
    """In the ``before_alerts`` child: the older msmon_nb is first on sys.path."""
    from msmon_nb.diagnose import diagnose

    json.dump(alerts_of(thaw(), diagnose), sys.stdout)


def before_alerts(commit: str = BEFORE) -> dict[str, list[tuple[int, str]]]:
    """The alerts of ``commit``'s rules on every run: its ``msmon_nb`` from ``git
    archive``, replayed in a child process so that it does not meet today's package."""
    with tempfile.TemporaryDirectory() as tmp:
        archive = subprocess.run(
            ["git", "archive", commit, "msmon_nb"], cwd=ROOT, capture_output=True, check=True
        ).stdout
        with tarfile.open(fileobj=io.BytesIO(archive)) as tar:
            tar.extractall(tmp, filter="data")
        code = (
            f"import sys; sys.path[:0] = [{tmp!r}, {str(ROOT)!r}]; "
            "import bench.relapse as r; r._child()"
        )
        env = dict(os.environ, GLOG_v="3", PYTHONPATH="")
        out = subprocess.run(
            [sys.executable, "-c", code], cwd=ROOT, env=env, capture_output=True, text=True
        )
        if out.returncode:
            raise RuntimeError(f"replaying {commit}'s rules failed:\n{out.stderr[-2000:]}")
    return {name: [tuple(a) for a in alerts] for name, alerts in json.loads(out.stdout).items()}


def _median5(loss: list[float], s: int) -> float:
    window = loss[max(0, s - 4) : s + 1]
    if any(not math.isfinite(v) for v in window):
        return math.inf
    return statistics.median(window)


def twin_blowup(runs: list):
    """The blow-up point of a broken run: the first step from its onset where its loss
    (the median of its last 5 steps; NaN/Inf: at once) is 10x its unbroken control's
    over the same steps. Not "10x its best", as ``bench/detect.py`` counts: at a
    converged floor one lucky batch's loss is often 10-1000x below the usual one, and
    on this set the controls themselves passed 10x their best before-the-break batch
    within 3 steps of the break in 19 of 48 runs (``tests/detection/test_relapse_set.py``);
    the control says what the loss would have been."""
    controls = {spec.name.removesuffix("-control"): rec for spec, rec in runs if not spec.failure}

    def blowup(spec, loss: list[float]) -> int | None:
        twin = controls[spec.name.removesuffix("-" + spec.failure)]["loss"]
        for s in range(spec.onset, len(loss)):
            if _median5(loss, s) >= 10.0 * _median5(twin, s):
                return s
        return None

    return blowup


def frozen_detector(alerts: dict[str, list[tuple[int, str]]]):
    """A detector that answers from alerts computed elsewhere (another commit's rules)."""
    return lambda spec, rec: alerts[spec.name]


def drift(frozen: dict, fresh: dict) -> float:
    """Largest relative difference of loss, grad_norm and moment norms (NaN = NaN)."""
    worst = 0.0
    pairs = [(frozen["loss"], fresh["loss"]), (frozen["grad_norm"], fresh["grad_norm"])]
    pairs += [(v, fresh["opt"][t]) for t, v in frozen["opt"].items()]
    for a, b in pairs:
        if len(a) != len(b):
            return math.inf
        for x, y in zip(a, b, strict=True):
            if x == y or (math.isnan(x) and math.isnan(y)):
                continue
            if not (math.isfinite(x) and math.isfinite(y)):
                return math.inf
            worst = max(worst, abs(x - y) / max(abs(x), abs(y), 1e-12))
    return worst


def verbose(runs: list) -> None:
    from bench.detect_score import ours_detail

    for spec, rec in runs:
        blow = twin_blowup(runs)(spec, rec["loss"]) if spec.failure else None
        print(f"{spec.name} failure={spec.failure} onset={spec.onset} blowup={blow}")
        for a in ours_detail(spec, rec):
            print(f"    {a.kind} step={a.step} since={a.since_step}: {a.message[:110]}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--regen", action="store_true", help="retrain every run, refreeze")
    parser.add_argument("--smoke", action="store_true", help="CI size: retrain one run")
    parser.add_argument("--verbose", action="store_true", help="every run's alerts")
    parser.add_argument("--no-before", action="store_true", help=f"no {BEFORE} column")
    parser.add_argument("--tuning", action="store_true", help="the tuning set, not the held-out")
    args = parser.parse_args()
    t0 = time.perf_counter()
    frozen = FROZEN_TUNING if args.tuning else FROZEN
    if args.regen:
        runs = []
        for spec in specs(tuning=args.tuning):
            runs.append((spec, train(spec)))
        size = freeze(runs, frozen)
        print(f"trained {len(runs)} runs in {time.perf_counter() - t0:.0f} s", file=sys.stderr)
        print(f"froze {frozen} ({size / 1e6:.2f} MB)", file=sys.stderr)
    runs = thaw(frozen)
    if args.verbose:
        verbose(runs)
    dets = detectors(thaw_detect()["tuning"])
    columns = {"msmon_nb": (dets["msmon_nb"][0], ACCEPT)}
    if not args.no_before:
        columns[f"msmon_nb {BEFORE}"] = (frozen_detector(before_alerts()), ACCEPT)
    for name, (det, accept) in dets.items():
        if accept is BASE_ACCEPT:
            columns[name] = (det, BASELINE_ACCEPT)
    blowup = twin_blowup(runs)
    results = {
        name: evaluate(runs, det, accept, lead_kinds=FAILURES, blowup=blowup)
        for name, (det, accept) in columns.items()
    }
    steps = sum(len(r["loss"]) for _, r in runs)
    healthy = sum(len(r["loss"]) for s, r in runs if s.failure is None)
    title = (
        f"converged-then-broken set: {len(runs)} runs "
        f"({sum(1 for s, _ in runs if s.failure)} broken after converging, "
        f"{len(runs) - sum(1 for s, _ in runs if s.failure)} unbroken controls), "
        f"{steps} steps, {healthy} of them the controls'"
    )
    print(table(results, title, lead_kinds=FAILURES))
    print()
    print(LEGEND)
    if not args.regen and not args.tuning:
        by_name = {spec.name: (spec, rec) for spec, rec in runs}
        for name in CHECK_RUNS[:1] if args.smoke else CHECK_RUNS:
            spec, rec = by_name[name]
            t = time.perf_counter()
            fresh = train(spec)
            print(
                f"retrained {name} in {time.perf_counter() - t:.1f} s: largest relative "
                f"difference from the frozen curves {drift(rec, fresh):.2g}"
            )
    print(f"bench took {time.perf_counter() - t0:.1f} s")


if __name__ == "__main__":
    main()
