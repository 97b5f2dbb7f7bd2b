"""Every bench, one command: ``make bench`` (full size) and CI's smoke run.

    python bench/all.py [--smoke] [--only NAME,...] [--jobs N] [--out bench/results.json]
    python bench/all.py --update-docs        # the guide's blocks from bench/results.json

Each bench runs as its own process (as a user runs it), at its full size or, with
``--smoke``, at a size that only proves it still runs (CI: every bench, about two minutes
in all on two jobs). Its command, exit status, wall time and printed output go into one
JSON results file. The user guide's benchmark blocks (``<!-- bench:NAME -->`` ... ``<!--
/bench:NAME -->``, in ``docs/guide/benchmarks.md`` and beside the rules they measure in
``docs/guide/alerts.md``) are that output, pasted by ``--update-docs``, which also pastes
the detection tables quoted beside the rules (``<!-- detect:tables -->``, read by
``tests/detection``); ``tests/test_bench_results.py`` fails when a block and the results
file disagree, when a bench is missing from either, or when the file holds smoke results.

A bench that exits non-zero (several do when they miss their target) is reported, kept
in the results with its status, and makes this command exit 1.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import re
import subprocess
import sys
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
RESULTS = ROOT / "bench" / "results.json"
# the pages holding bench blocks: the benchmarks page, and the alerts page, which quotes the
# detection tables and the benches of two rules beside those rules
PAGES = (ROOT / "docs" / "guide" / "benchmarks.md", ROOT / "docs" / "guide" / "alerts.md")
CACHE = ROOT / "bench" / ".cache"


@dataclass(frozen=True)
class Bench:
    """One bench script: its full-size and smoke-size arguments."""

    name: str
    full: tuple[str, ...]
    smoke: tuple[str, ...]
    timeout: float = 1800.0


BENCHES = (
    Bench("events", (), ("--steps", "300", "--scalars", "20000", "--repeat", "1")),
    Bench("control", (), ("--steps", "20000", "--rounds", "2")),
    Bench("diagnose", (), ("--steps", "2000", "--rounds", "1", "--mlp-steps", "5")),
    Bench("detect", (), ("--smoke",)),
    Bench("relapse", (), ("--smoke",)),
    Bench("blame", (), ("--smoke",)),
    Bench("layers", (), ("--smoke",)),
    Bench("attn", (), ("--smoke",)),
    Bench("actrules", (), ("--smoke",)),
    Bench("attn_cost", (), ("--train-steps", "3", "--rounds", "1")),
    Bench("overhead", ("--rounds", "10"),
          ("--steps", "5", "--rounds", "2", "--train-steps", "10", "--instances", "1")),
    # msprobe's arms run where MSMON_MSPROBE_PATH names a dir it is installed in (else
    # they are skipped with a line saying how to install it)
    Bench("msprobe_cost", (), ("--steps", "3", "--rounds", "1")),
    Bench("scale", ("--repeats", "5"), ("--repeats", "1", "--sizes", "1M")),
    Bench("optstate", (), ("--size", "1M", "--repeats", "1")),
    Bench("stablerank", (), ("--size", "1M", "--rounds", "1", "--steps", "12")),
    Bench("trainers", (), ("--steps", "1", "--rounds", "1", "--arms", "plain,every,ring,off")),
    Bench("relay", (), ("--series", "3", "--steps", "20000")),
    # 200 k points: long enough (~2 s) that the page samples the cell while it runs, also
    # beside make test in CI (20 k could end before the page drew it running)
    Bench("panel", (), ("--blocks", "1", "--secs", "2", "--points", "200000")),
    Bench("viewer", ("--no-mindinsight", "--data", str(CACHE / "viewer")),
          ("--no-mindinsight", "--runs", "5", "--steps", "2000", "--repeat", "2")),
    Bench("ranks", ("--data", str(CACHE / "ranks")),
          ("--ranks", "4", "--steps", "2000", "--repeat", "2")),
    Bench("export", (), ("--steps", "20000")),
    Bench("compile", ("--repeats", "5"), ("--repeats", "1", "--hidden", "64", "--steps", "2")),
    # full size: the training part (a million steps twice, side by side: hours on two
    # shared cores) stops after 40 minutes, as Ctrl-C would, and its figures say the
    # steps reached. The smoke: the training and rank parts at a size that only proves
    # they run, 40 ranks (more than the page's 32 rank rows); the panel part is left to
    # make bench (JupyterLab's start alone is half a smoke's budget; bench/panel.py's
    # smoke drives the same page)
    Bench("long", ("--data", str(CACHE / "long"), "--stop-after", "40"),
          ("--steps", "500", "--monitor-steps", "5000", "--parts", "train,ranks",
           "--ranks", "40", "--rank-steps", "200"),
          timeout=6 * 3600.0),
)  # fmt: skip


def run(bench: Bench, smoke: bool) -> dict:
    """Run one bench in its own process; its record for the results file."""
    args = bench.smoke if smoke else bench.full
    cmd = [sys.executable, f"bench/{bench.name}.py", *args]
    env = dict(os.environ, GLOG_v="3", PYTHONPATH=str(ROOT))
    started = time.perf_counter()
    try:
        proc = subprocess.run(
            cmd, cwd=ROOT, env=env, capture_output=True, text=True, timeout=bench.timeout
        )
        code, out, err = proc.returncode, proc.stdout, proc.stderr
    except subprocess.TimeoutExpired as exc:
        code, out = -1, (exc.stdout or b"").decode() if isinstance(exc.stdout, bytes) else ""
        err = f"timed out after {bench.timeout:.0f} s"
    return {
        "command": "python " + " ".join(cmd[1:]),
        "exit": code,
        "seconds": round(time.perf_counter() - started, 1),
        "output": out.rstrip("\n"),
        "stderr_tail": err[-2000:] if code else "",
    }


def block(name: str) -> re.Pattern[str]:
    return re.compile(
        rf"(<!-- bench:{re.escape(name)} -->\n)(.*?)(<!-- /bench:{re.escape(name)} -->)", re.S
    )


def page_block(record: dict) -> str:
    """What the guide shows of a bench: its command and its output, as printed."""
    return f"```text\n$ {record['command']}\n{record['output']}\n```\n"


def update_pages(results: dict) -> list[str]:
    """Replace every bench block of the guide's pages with the results; the names missing."""
    texts = {page: page.read_text() for page in PAGES}
    missing = []
    for name, record in results["benches"].items():
        pattern = block(name)
        found = [page for page, text in texts.items() if pattern.search(text)]
        if not found:
            missing.append(name)
        for page in found:
            texts[page] = pattern.sub(
                lambda m, r=record: m.group(1) + page_block(r) + m.group(3), texts[page]
            )
    if "detect" in results["benches"] and not results["smoke"]:
        # the detection tables quoted near the rules (tests/detection reads them): the
        # detect bench's output up to its legend
        tables = results["benches"]["detect"]["output"].split("\n\ncell:")[0].strip()
        pattern = re.compile(r"(<!-- detect:tables -->\n)(.*?)(<!-- /detect:tables -->)", re.S)
        for page, text in texts.items():
            texts[page] = pattern.sub(
                lambda m: m.group(1) + f"```text\n{tables}\n```\n" + m.group(3), text
            )
    for page, text in texts.items():
        if text != page.read_text():
            page.write_text(text)
    return missing


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--smoke", action="store_true", help="CI size: prove each bench runs")
    parser.add_argument("--only", default="", help="comma-separated bench names")
    parser.add_argument("--jobs", type=int, default=1, help="benches run side by side")
    parser.add_argument("--out", type=Path, default=None, help="results file")
    parser.add_argument(
        "--update-docs", action="store_true", help="paste the results into the guide's blocks"
    )
    args = parser.parse_args()
    if args.update_docs:
        missing = update_pages(json.loads(RESULTS.read_text()))
        pages = ", ".join(str(p.relative_to(ROOT)) for p in PAGES)
        print(f"{pages} updated from {RESULTS.name}; no block for: {missing or 'none'}")
        return 1 if missing else 0
    only = {n for n in args.only.split(",") if n}
    unknown = only - {b.name for b in BENCHES}
    if unknown:
        parser.error(f"no bench {sorted(unknown)}; benches: {[b.name for b in BENCHES]}")
    chosen = [b for b in BENCHES if not only or b.name in only]
    out = args.out or (Path("/tmp/msmon_bench_smoke.json") if args.smoke else RESULTS)
    started = time.perf_counter()
    with ThreadPoolExecutor(max_workers=max(1, args.jobs)) as pool:
        done = pool.map(lambda b: run(b, args.smoke), chosen)
        records = dict(zip([b.name for b in chosen], done, strict=True))
    failed = [name for name, r in records.items() if r["exit"] != 0]
    for name, r in records.items():
        status = "ok" if r["exit"] == 0 else f"EXIT {r['exit']}"
        print(f"{name:10s} {r['seconds']:7.1f} s  {status}")
        if r["exit"] != 0:
            print("   " + r["stderr_tail"].strip().replace("\n", "\n   ")[-1500:])
    total = time.perf_counter() - started
    results = {
        "smoke": args.smoke,
        "machine": f"{platform.machine()}, {os.cpu_count()} cores, "
        f"Python {platform.python_version()}",
        "seconds": round(total, 1),
        "benches": records,
    }
    if not args.smoke and only and RESULTS.exists():  # a partial run updates its benches
        previous = json.loads(RESULTS.read_text())
        previous["benches"].update(records)
        results = previous
    out.write_text(json.dumps(results, indent=1) + "\n")
    print(f"{len(records)} benches in {total:.0f} s -> {out}; failed: {failed or 'none'}")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
