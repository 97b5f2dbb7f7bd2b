"""``msmon export`` on a 10-million-point run: wall time, points/s and peak memory.

The run (``--steps`` x 5 tags, one summary file, scalar events exactly as our writer
emits them) is generated fast with the helpers of ``tests/viewer/synth.py``, a block of
steps at a time, so generating it needs little memory too. Each format is then exported
by ``msmon export`` (``msmon_nb.cli.main``) in a fresh interpreter, which reports its own
peak RSS (``ru_maxrss``, interpreter and imports included) and the time the export took
(imports excluded; the whole process's time is printed too). CSV and JSONL rows are
counted back from the output.
Target: peak RSS < 300 MB for every format. Exit status 1 when a target is missed or a
point is lost. The generated run and the exports live in a temporary dir, removed at the
end (``--keep DIR`` keeps them there instead).

    python bench/export.py [--steps 2000000] [--formats csv,jsonl,tensorboard] [--keep DIR]
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
os.environ.setdefault("GLOG_v", "3")

TAGS = ("train/loss", "train/grad_norm", "train/learning_rate", "train/throughput", "sys/cpu")
TARGET_RSS_MB = 300
BLOCK = 250_000  # steps generated at a time

# Runs in the fresh interpreter: the real command, then its own peak memory. VmHWM (this
# process image's peak) is printed beside ru_maxrss as a cross-check: Linux carries the
# parent's high-water mark into ru_maxrss across fork + exec, which is why this script's
# own process stays small (the run is generated in a subprocess of its own).
CHILD = r"""
import json, resource, sys, time
from msmon_nb.cli import main
import msmon_nb.export
started = time.perf_counter()
code = main(["export", sys.argv[1], "--to", sys.argv[2], sys.argv[3]])
wall = time.perf_counter() - started
peak_kb = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
with open("/proc/self/status") as f:
    hwm_kb = next(int(line.split()[1]) for line in f if line.startswith("VmHWM:"))
out = {"code": code, "wall": wall, "peak_kb": peak_kb, "hwm_kb": hwm_kb}
print("BENCH " + json.dumps(out), flush=True)
"""


def write_big_run(run_dir: Path, steps: int, seed: int = 0) -> tuple[Path, int]:
    """One summary file holding ``steps`` x ``len(TAGS)`` points; (file, points)."""
    sys.path.insert(0, str(ROOT))
    import numpy as np

    from msmon_nb.events import wire
    from msmon_nb.events.framing import frame
    from tests.support.synth import records

    run_dir.mkdir(parents=True)
    wall0 = 1.7e9
    path = run_dir / f"events.out.events.summary.{int(wall0)}.0.bench_MS"
    rng = np.random.default_rng(seed)
    with open(path, "wb") as file:
        file.write(frame(wire.version_event(wall0)))
        for lo in range(0, steps, BLOCK):
            block = np.arange(lo, min(steps, lo + BLOCK), dtype=np.int64)
            walls = wall0 + block * 0.01
            columns = {t: rng.standard_normal(len(block)).astype(np.float32) for t in TAGS}
            # the record template differs by the step's varint length: cut where it grows
            nbytes = 1 + sum((block >= (1 << (7 * k))).astype(np.int64) for k in range(1, 9))
            cuts = (np.flatnonzero(np.diff(nbytes)) + 1).tolist()
            for a, b in zip([0, *cuts], [*cuts, len(block)], strict=True):
                part = {t: v[a:b] for t, v in columns.items()}
                file.write(records(block[a:b], walls[a:b], part))
    return path, steps * len(TAGS)


def export_once(run_dir: Path, fmt: str, out: Path) -> dict:
    """``msmon export`` in a fresh interpreter: its figures, plus the process wall time."""
    env = dict(os.environ, GLOG_v="3")
    started = time.perf_counter()
    proc = subprocess.run(
        [sys.executable, "-c", CHILD, str(run_dir), fmt, str(out)],
        capture_output=True,
        text=True,
        env=env,
        cwd=ROOT,
        timeout=3600,
    )
    process_wall = time.perf_counter() - started
    if proc.returncode != 0:
        raise RuntimeError(f"export to {fmt} failed:\n{proc.stdout}\n{proc.stderr}")
    line = next(x for x in proc.stdout.splitlines() if x.startswith("BENCH "))
    figures = json.loads(line[len("BENCH ") :])
    said = next(x for x in proc.stdout.splitlines() if x.startswith("exported "))
    figures.update(process_wall=process_wall, points=int(said.split()[1]))
    if out.is_dir():
        figures["out_bytes"] = sum(p.stat().st_size for p in out.rglob("*"))
    else:
        figures["out_bytes"] = out.stat().st_size
        with open(out, "rb") as f:  # count the rows really written, not only the claim
            lines = sum(chunk.count(b"\n") for chunk in iter(lambda: f.read(1 << 24), b""))
        figures["rows"] = lines - (fmt == "csv")
    return figures


def generate(run_dir: Path, steps: int) -> tuple[Path, int, float]:
    """``write_big_run`` in a subprocess: (file, points, seconds)."""
    started = time.perf_counter()
    proc = subprocess.run(
        [sys.executable, __file__, "--steps", str(steps), "--generate", str(run_dir)],
        capture_output=True,
        text=True,
        check=True,
    )
    path, points = json.loads(proc.stdout)
    return Path(path), points, time.perf_counter() - started


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--steps", type=int, default=2_000_000, help="steps of 5 tags each")
    parser.add_argument("--formats", default="csv,jsonl,tensorboard")
    parser.add_argument("--keep", type=Path, default=None, help="keep the data in this dir")
    parser.add_argument("--generate", type=Path, default=None, help=argparse.SUPPRESS)
    args = parser.parse_args()
    formats = [f for f in args.formats.split(",") if f]
    if args.generate:
        path, points = write_big_run(args.generate, args.steps)
        print(json.dumps([str(path), points]))
        return 0

    base = args.keep or Path(tempfile.mkdtemp(prefix="msmon_bench_export_"))
    base.mkdir(parents=True, exist_ok=True)
    failed = False
    try:
        path, points, secs = generate(base / "run", args.steps)
        mb = path.stat().st_size / 2**20
        print(
            f"run: {points:,} points ({args.steps:,} steps x {len(TAGS)} tags), "
            f"{mb:.0f} MB, written in {secs:.1f} s"
        )
        print(f"target: peak RSS < {TARGET_RSS_MB} MB per export (fresh process each)")
        for fmt in formats:
            out = base / ("out_tb" if fmt == "tensorboard" else f"out.{fmt}")
            r = export_once(base / "run", fmt, out)
            peak_mb, hwm_mb = r["peak_kb"] / 1024, r["hwm_kb"] / 1024
            ok = peak_mb < TARGET_RSS_MB and r["points"] == r.get("rows", points) == points
            failed |= not ok
            rate = r["points"] / r["wall"] / 1e6
            print(
                f"  {fmt:11s}: {r['points']:,} points in {r['wall']:.1f} s "
                f"({rate:.2f} M points/s; process {r['process_wall']:.1f} s), "
                f"peak RSS {peak_mb:.0f} MB ({'ok' if ok else 'MISSED'}; VmHWM {hwm_mb:.0f}), "
                f"output {r['out_bytes'] / 2**20:.0f} MB"
            )
            if not args.keep:
                if out.is_dir():
                    shutil.rmtree(out)
                else:
                    out.unlink()
    finally:
        if not args.keep:
            shutil.rmtree(base, ignore_errors=True)
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
