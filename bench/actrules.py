"""The activation rules (``output_logit_divergence``, ``activation_blowup``,
``activation_dying``, ``nonfinite_origin``): each one's warning step against the first
gradient/loss alert of the other rules, whether it names the faulty module, and its false
alarms on healthy runs.

    python bench/actrules.py                  # score the frozen held-out set
    python bench/actrules.py --tuning         # score the tuning set (tune on this one only)
    python bench/actrules.py --smoke          # CI: one run of each kind of the held-out set
    python bench/actrules.py --regen [--tuning] [--jobs N]   # train and freeze a set

The runs (``bench/actrules_runs.py``) are frozen in ``bench/data/actrules_curves.json.gz``
(held out) and ``actrules_tuning.json.gz`` (other seeds: for tuning, never the held-out
file). Both were frozen before any rule was written. Scoring replays each run's recorded
series (loss, grad_norm, lr, every ``act/<module>/<stat>``, the modules in forward order)
through a fresh ``Diagnoser`` with the defaults, every step collected.

Per failing run: the step its loss diverged (``diverged``: 3x its best so far and above
half its first value, or not finite), the first alert of the rule made for its failure
(``EXPECT``) at or after the fault's step, that alert's lead over the first alert of any
gradient or loss kind (``lead``: positive = earlier), and whether the module it names first
is the one the fault is in. Healthy runs: false alarms per 10 k steps, for the activation
rules and for the other rules.
"""

from __future__ import annotations

import argparse
import gzip
import json
import multiprocessing
import sys
from concurrent.futures import ProcessPoolExecutor
from dataclasses import asdict
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

from bench.actrules_runs import Spec, specs, train, tuning_specs  # noqa: E402

# the same divergence test and cells as the attention bench's table
from bench.attn import _at, _n, diverged  # noqa: E402
from bench.detect_data import pack, unpack  # noqa: E402

FROZEN = ROOT / "bench" / "data" / "actrules_curves.json.gz"
TUNING = ROOT / "bench" / "data" / "actrules_tuning.json.gz"
FORMAT = 1
STATS = ("norm", "max_abs", "mean", "nonfinite", "zero_frac")
# failure kind -> the alert kind made for it
EXPECT = {
    "head_lr": "output_logit_divergence",
    "ff_lr": "activation_blowup",
    "dying": "activation_dying",
    "nan": "nonfinite_origin",
}
ACT_KINDS = tuple(EXPECT.values())
GRAD_LOSS = ("train/loss", "train/grad_norm")  # the tags of today's gradient/loss alerts


def freeze(runs: list[tuple[Spec, dict]], path: Path) -> int:
    rows = []
    for spec, rec in runs:
        rows.append(
            {
                "spec": asdict(spec),
                "modules": rec["modules"],
                **{k: pack(rec[k], "<f4") for k in ("loss", "grad_norm", "lr")},
                "act": {s: [pack(v, "<f4") for v in rec["act"][s]] for s in STATS},
            }
        )
    data = json.dumps({"format": FORMAT, "runs": rows}, sort_keys=True).encode()
    out = gzip.compress(data, compresslevel=9, mtime=0)
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_bytes(out)
    return len(out)


def thaw(path: Path) -> list[tuple[Spec, dict]]:
    raw = json.loads(gzip.decompress(path.read_bytes()))
    if raw.get("format") != FORMAT:
        raise ValueError(f"{path}: format {raw.get('format')!r}, expected {FORMAT}")
    out = []
    for row in raw["runs"]:
        rec = {k: unpack(row[k], "<f4") for k in ("loss", "grad_norm", "lr")}
        rec["modules"] = row["modules"]
        rec["act"] = {s: [unpack(v, "<f4") for v in row["act"][s]] for s in STATS}
        out.append((Spec(**row["spec"]), rec))
    return out


def values_at(rec: dict, step: int) -> dict[str, float]:
    """One step's tags as the monitor records them: the step's scalars, then each
    module's statistics, modules in forward order."""
    values = {
        "train/loss": rec["loss"][step],
        "train/grad_norm": rec["grad_norm"][step],
        "train/learning_rate": rec["lr"][step],
    }
    for i, module in enumerate(rec["modules"]):
        for stat in STATS:
            values[f"act/{module}/{stat}"] = rec["act"][stat][i][step]
    return values


def alerts(rec: dict, settings: dict | None = None) -> list:
    """Every alert a fresh ``Diagnoser`` raises over the run's series (``settings``:
    ``monitor_config.alerts``; None: the defaults)."""
    from msmon_nb.diagnose import Diagnoser

    diag = Diagnoser(settings)
    out = []
    for step in range(len(rec["loss"])):
        out += diag.update(step, values_at(rec, step))
    return out


def judge(spec: Spec, found: list) -> dict:
    """One run's figures: the expected rule's first alert at or after the fault (``ours``),
    the first gradient/loss alert (``theirs``), whether ``ours`` names the faulty module
    first, and the activation alerts that should not be there (``stray``: any on a
    healthy run; on a failing one, those before the fault or of another kind)."""
    want = EXPECT.get(spec.kind)
    ours = next((a for a in found if a.kind == want and a.step >= spec.at), None)
    theirs = next((a for a in found if a.kind not in ACT_KINDS and a.tag in GRAD_LOSS), None)
    named = None if ours is None else ours.blame[0]["name"]
    stray = [a for a in found if a.kind in ACT_KINDS and a is not ours]
    if spec.fails:
        stray = [a for a in stray if a.step < spec.at or a.kind != want]
    return {"ours": ours, "theirs": theirs, "named": named, "stray": stray}


def score(runs: list[tuple[Spec, dict]]) -> tuple[list[str], dict]:
    """The table's lines and the totals."""
    lines = [
        f"{'run':28} {'fault':>5} {'diverged':>8} {'warns':>5} {'since':>5} {'first g/l':>9} "
        f"{'lead':>5}  named (right?)  first grad/loss kind"
    ]
    kinds: dict[str, dict] = {k: {"runs": 0, "found": 0, "named": 0, "leads": []} for k in EXPECT}
    totals = {"healthy_steps": 0, "act_false": 0, "other_false": 0, "stray": 0}
    for spec, rec in runs:
        found = alerts(rec)
        got = judge(spec, found)
        ours, theirs = got["ours"], got["theirs"]
        stray = "; stray: " + ", ".join(f"{a.kind}@{a.step}" for a in got["stray"])
        stray = stray if got["stray"] else ""
        if not spec.fails:
            totals["healthy_steps"] += len(rec["loss"])
            totals["act_false"] += sum(a.kind in ACT_KINDS for a in found)
            totals["other_false"] += sum(a.kind not in ACT_KINDS for a in found)
            lines.append(
                f"{spec.name:28} {'-':>5} {'-':>8} {'-':>5} {'':>5} {_at(theirs):>9} {'':>5}  "
                f"{'(healthy)':14}  {theirs.kind if theirs else ''}{stray}"
            )
            continue
        tally = kinds[spec.kind]
        tally["runs"] += 1
        totals["stray"] += len(got["stray"])
        lead = ""
        if ours is not None:
            tally["found"] += 1
            tally["named"] += got["named"] == spec.culprit
            if theirs is not None:
                tally["leads"].append(theirs.step - ours.step)
                lead = f"{theirs.step - ours.step:+d}"
        right = "" if ours is None else ("yes" if got["named"] == spec.culprit else "NO")
        named = f"{got['named'] or '-'} ({right})" if ours is not None else "-"
        lines.append(
            f"{spec.name:28} {spec.at:>5} {_n(diverged(rec['loss'])):>8} {_at(ours):>5} "
            f"{'' if ours is None else ours.since_step:>5} {_at(theirs):>9} {lead:>5}  "
            f"{named:14}  {theirs.kind if theirs else ''}{stray}"
        )
    return lines, {**totals, "kinds": kinds}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--regen", action="store_true", help="train and freeze the set")
    parser.add_argument("--tuning", action="store_true", help="the tuning set")
    parser.add_argument("--smoke", action="store_true", help="one run of each kind (CI)")
    parser.add_argument("--jobs", type=int, default=1, help="--regen: runs trained at once")
    args = parser.parse_args(argv)
    path = TUNING if args.tuning else FROZEN
    if args.regen:
        chosen = tuning_specs() if args.tuning else specs()
        # each run in a fresh process (spawned: MindSpore's state is not fork-safe)
        context = multiprocessing.get_context("spawn")
        with ProcessPoolExecutor(args.jobs, mp_context=context, max_tasks_per_child=1) as pool:
            curves = list(pool.map(train, chosen))
        runs = list(zip(chosen, curves, strict=True))
        print(f"froze {len(runs)} runs in {path.name}: {freeze(runs, path)} bytes")
        return 0
    runs = thaw(path)
    if args.smoke:
        runs = [
            next(r for r in runs if r[0].kind == k) for k in dict.fromkeys(s.kind for s, _ in runs)
        ]
    lines, t = score(runs)
    print(f"activation rules vs today's gradient/loss rules ({path.name}, {len(runs)} runs, "
          "every step collected)")  # fmt: skip
    print("\n".join(line.rstrip() for line in lines))
    for kind, tally in t["kinds"].items():
        if not tally["runs"]:
            continue
        leads = sorted(tally["leads"])
        median = f"{leads[len(leads) // 2]:+d}" if leads else "-"
        print(
            f"{kind:8} {EXPECT[kind]:24} detected {tally['found']}/{tally['runs']}, named "
            f"the faulty module {tally['named']}/{tally['runs']}, median lead over the "
            f"first grad/loss alert {median} ({len(leads)} with both)"
        )
    per10k = 1e4 / max(t["healthy_steps"], 1)
    print(
        f"false alarms per 10k healthy steps ({t['healthy_steps']} steps): activation rules "
        f"{t['act_false'] * per10k:.2f}, other rules {t['other_false'] * per10k:.2f}; "
        f"stray activation alerts on failing runs {t['stray']}"
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
