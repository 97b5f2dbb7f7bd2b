"""The ``msmon`` command: one thin sub-command per job, each delegating to its module."""

from __future__ import annotations

import argparse
import json
import sys
import time
from collections.abc import Sequence


def _age(seconds: float | None) -> str:
    if seconds is None:
        return "-"
    delta = max(0.0, time.time() - seconds)
    for unit, size in (("d", 86400), ("h", 3600), ("m", 60)):
        if delta >= size:
            return f"{delta / size:.0f}{unit} ago"
    return f"{delta:.0f}s ago"


def cmd_runs(args: argparse.Namespace) -> int:
    """List the runs under a base dir."""
    from msmon_nb.events.runs import load_runs

    try:
        runs = load_runs(args.base)
    except FileNotFoundError as exc:
        print(f"msmon runs: {exc}", file=sys.stderr)
        return 2
    summaries = [run.summary() for run in runs]
    if args.json:
        json.dump(summaries, sys.stdout, indent=2)
        print()
        return 0
    if not summaries:
        print(f"no runs under {args.base}")
        return 0
    header = ("run", "status", "last step", "points", "tags", "ranks", "last write")
    rows = [
        (
            s["name"],
            s["status"],
            "-" if s["last_step"] is None else str(s["last_step"]),
            str(s["points"]),
            str(len(s["tags"])),
            ",".join(map(str, s["ranks"])),
            _age(s["last_write"]),
        )
        for s in summaries
    ]
    widths = [max(len(r[i]) for r in [header, *rows]) for i in range(len(header))]
    for row in [header, *rows]:
        print("  ".join(cell.ljust(w) for cell, w in zip(row, widths, strict=True)).rstrip())
    for s in summaries:
        for problem in s["problems"]:
            print(f"  damaged: {problem}")
    return 0


def cmd_demo(args: argparse.Namespace) -> int:
    """Train the built-in demo model with monitoring."""
    from msmon_nb.demo import train
    from msmon_nb.events.runs import load_run

    started = time.perf_counter()
    mon = train(args.dir, steps=args.steps)
    elapsed = time.perf_counter() - started
    run_dir = mon.run_dir
    run = load_run(run_dir)
    loss = run.scalars("train/loss")
    norm = run.scalars("train/grad_norm")
    lr = run.scalars("train/learning_rate")
    print(f"run written to {run_dir}")
    print(
        f"{len(loss.steps)} steps in {elapsed:.1f} s; loss {loss.values[0]:.3f} -> "
        f"{loss.values[-1]:.3f}; grad_norm {norm.values.min():.3g}..{norm.values.max():.3g}; "
        f"lr peak {lr.values.max():.3g}"
    )
    print(f"list runs: msmon runs {args.dir}")
    return 0


def build_parser() -> argparse.ArgumentParser:
    """The argument parser of ``msmon``."""
    parser = argparse.ArgumentParser(
        prog="msmon", description="Monitor MindSpore training: runs, viewer, cleaner, demo."
    )
    sub = parser.add_subparsers(dest="command", required=True)

    p = sub.add_parser("runs", help="list the runs under a summary base dir")
    p.add_argument("base", help="summary base dir, e.g. ./summary")
    p.add_argument("--json", action="store_true", help="print JSON instead of a table")
    p.set_defaults(func=cmd_runs)

    p = sub.add_parser("demo", help="train a small built-in model, monitored")
    p.add_argument("--steps", type=int, default=300, help="training steps (default 300)")
    p.add_argument("--dir", default="./summary", help="summary base dir (default ./summary)")
    p.add_argument("--no-view", action="store_true", help="do not start the viewer afterwards")
    p.set_defaults(func=cmd_demo)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    """Entry point of the ``msmon`` console script."""
    args = build_parser().parse_args(argv)
    return int(args.func(args) or 0)


if __name__ == "__main__":
    sys.exit(main())
