"""The ``msmon`` command: one thin sub-command per job, each delegating to its module."""

from __future__ import annotations

import argparse
import json
import sys
import textwrap
import time
from collections.abc import Sequence
from pathlib import Path

from msmon_nb.rundir.control import COMMANDS, SPECS, usage


def _age(seconds: float | None) -> str:
    if seconds is None:
        return "-"
    delta = max(0.0, time.time() - seconds)
    for unit, size in (("d", 86400), ("h", 3600), ("m", 60)):
        if delta >= size:
            return f"{delta / size:.0f}{unit} ago"
    return f"{delta:.0f}s ago"


def _ranks_cell(summary: dict) -> str:
    """``-`` for a single-process run (a ``0`` there read as "no ranks"); for a
    distributed one each rank with its last step, ``0:120 1:118(interrupted)``."""
    last = summary.get("rank_last_step") or {}
    if not summary.get("distributed"):
        return "-"
    status = summary.get("rank_status") or {}
    cells = []
    for rank, step in last.items():
        state = status.get(rank)
        flag = f"({state})" if state and state not in ("running", "finished") else ""
        cells.append(f"{rank}:{'-' if step is None else step}{flag}")
    return " ".join(cells)


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
            _ranks_cell(s),
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
    mon = train(args.dir, steps=args.steps, progress=True)
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
    if args.no_view:
        return 0
    from msmon_nb.viewer.server import serve

    return serve(args.dir, port=8080, any_port_if_taken=True)


def _port(text: str) -> int:
    port = int(text)
    if not 0 <= port <= 65535:
        raise argparse.ArgumentTypeError(f"{port} is not a port: use 0..65535 (0 = any free)")
    return port


def cmd_view(args: argparse.Namespace) -> int:
    """Serve the web viewer over a summary base dir until Ctrl-C."""
    from msmon_nb.viewer.server import serve

    return serve(args.base, host=args.host, port=args.port)


def cmd_clean(args: argparse.Namespace) -> int:
    """Delete old runs under a base dir, safely."""
    from msmon_nb.clean import main as clean_main

    return clean_main(args)


# ``msmon ctl``'s exit codes, as ``--help`` prints them; the guide's table says the same
# (docs/guide/viewer.md; tests/cli/test_ctl.py compares the two).
CTL_EXIT_CODES = (
    ("0", "every live rank (the one monitor of a single-process run) acknowledged and did it"),
    ("1", "refused: an invalid command, no live monitor owns RUN_DIR, or a rank answered "
     "that it could not do it; or not every live rank acknowledged within --timeout (the "
     "command stays queued for the silent ones, and this says so)"),
    ("2", "usage error (an unknown command, a missing RUN_DIR), as every msmon subcommand"),
)  # fmt: skip


def cmd_ctl(args: argparse.Namespace) -> int:
    """Send a command (``rundir.control.SPECS``) to the live monitor owning a run dir (every
    live rank's, for a distributed run: it returns once each has acknowledged)."""
    from msmon_nb.rundir.control import (
        CONTROL_ACK,
        ControlError,
        live_owner,
        live_ranks,
        send,
        wait_for_ack,
    )

    run_dir = Path(args.run_dir)
    try:
        command = send(run_dir, args.cmd, args.arg)
    except ControlError as exc:
        print(f"msmon ctl: {exc}", file=sys.stderr)
        return 1
    ranks = live_ranks(run_dir)
    got = wait_for_ack(run_dir, command, timeout=args.timeout, ranks=ranks)
    for ack in got:
        state = "ok" if ack.get("ok") else "failed"
        print(f"rank {ack.get('rank')}, step {ack.get('step')}: {state}: {ack.get('message')}")
    answered = {a.get("rank") for a in got}
    missing = sorted(ranks - answered)
    if got and not missing:
        return 0 if all(a.get("ok") for a in got) else 1
    what, within = command.describe(), f"within {args.timeout:g} s"
    if ranks:  # a distributed run: how many of the ranks that were live answered
        print(
            f"msmon ctl: {what} acknowledged by {len(answered & ranks)} of {len(ranks)} ranks "
            f"{within}",
            file=sys.stderr,
        )
        live = live_ranks(run_dir)
        silent = [r for r in missing if r in live]
        ended = [r for r in missing if r not in live]
    else:
        print(f"msmon ctl: {what} was not acknowledged {within}", file=sys.stderr)
        silent, ended = ([0], []) if live_owner(run_dir) is None else ([], [0])

    def names(of: list[int]) -> str:
        return "rank " + ", ".join(map(str, of)) if ranks else "the monitor"

    if ended:
        print(f"msmon ctl: {names(ended)} ended without reading it", file=sys.stderr)
    if silent:
        print(
            f"msmon ctl: still queued for {names(silent)}, which acts on it at its next step "
            "boundary (a long step, such as a first graph compile or an evaluation, delays it); "
            "do not send it again; next time give --timeout more seconds "
            f"(its acknowledgement: id {command.id} in {run_dir / CONTROL_ACK})",
            file=sys.stderr,
        )
    return 1


def cmd_vscode_init(args: argparse.Namespace) -> int:
    """Copy msmon's VSCode tasks, launch configs and settings into a project."""
    from msmon_nb.vscode_init import init

    return init(args.dir)


def cmd_export(args: argparse.Namespace) -> int:
    """Stream a run's scalar points into another format."""
    from msmon_nb.export import export, progress_printer

    try:
        count = export(args.run_dir, args.fmt, args.out, progress=progress_printer())
    except FileNotFoundError as exc:
        print(f"msmon export: {exc}", file=sys.stderr)
        return 2
    print(f"exported {count} points from {args.run_dir} to {args.out} ({args.fmt})")
    return 0


def cmd_kernel_install(args: argparse.Namespace) -> int:
    """Register the current interpreter as a Jupyter kernel, so VSCode/Jupyter can pick it."""
    from ipykernel.kernelspec import install

    display = args.display_name or f"Python (msmon_nb, {Path(sys.prefix).name})"
    path = install(user=True, kernel_name=args.name, display_name=display)
    print(f"installed kernel {args.name!r} ({display}) for {sys.executable} in {path}")
    from msmon_nb.doctor import WARN, check_vscode_widgets

    widgets = check_vscode_widgets()
    if widgets.status == WARN:
        print(f"warning: {widgets.detail}\n  fix: {widgets.fix}")
    else:
        print(f"VS Code finds the panel's widget code in {widgets.value}")
    return 0


def cmd_doctor(args: argparse.Namespace) -> int:
    """Check this environment; exit 1 when something blocks monitoring."""
    from msmon_nb.doctor import run_doctor

    report = run_doctor(base_dir=args.dir, project=args.project)
    if args.json:
        json.dump(report.to_dict(), sys.stdout, indent=2)
        print()
    else:
        print(report.render())
    return report.exit_code


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

    p = sub.add_parser("view", help="serve the web viewer over a summary base dir")
    p.add_argument("base", help="summary base dir, e.g. ./summary")
    p.add_argument("--host", default="127.0.0.1", help="address to bind (default 127.0.0.1)")
    p.add_argument("--port", type=_port, default=8080, help="port (default 8080; 0 = any free)")
    p.set_defaults(func=cmd_view)

    p = sub.add_parser(
        "clean",
        help="delete old runs under a summary base dir, safely",
        description="Delete run dirs under BASE (every run unless --older-than/--keep say "
        "which): only dirs proven to be runs, never BASE, never a live run.",
    )
    p.add_argument("base", help="summary base dir, e.g. ./summary")
    p.add_argument(
        "--older-than", metavar="AGE", help="only runs last written before AGE ago: 3d, 12h, 30m"
    )
    p.add_argument("--keep", type=int, metavar="N", help="always keep the N newest runs")
    p.add_argument("--dry-run", action="store_true", help="print what would go; delete nothing")
    p.add_argument("--yes", action="store_true", help="do not ask before deleting")
    p.add_argument("--force", action="store_true", help="also delete runs still being written")
    p.set_defaults(func=cmd_clean)

    p = sub.add_parser(
        "ctl",
        help=f"act on a live run: {usage()}",
        description=textwrap.fill(
            "Act on the live monitor that owns RUN_DIR at its next step boundary (as the "
            "panel's buttons do, also where widget clicks cannot reach a busy kernel, and for "
            "scripts), and wait until every live rank of a distributed run has acknowledged.",
            88,
        ),
        epilog="exit codes:\n"
        + "\n".join(
            textwrap.fill(text, 88, initial_indent=f"  {code}  ", subsequent_indent="     ")
            for code, text in CTL_EXIT_CODES
        ),
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    p.add_argument("run_dir", help="the run dir, as the panel's footer shows it")
    p.add_argument(
        "cmd",
        choices=COMMANDS,
        help="; ".join(f"{spec.name}: {spec.help}" for spec in SPECS.values()),
    )
    p.add_argument(
        "arg",
        nargs="?",
        help="; ".join(f"for {s.name}: {s.arg.name}" for s in SPECS.values() if s.arg),
    )
    p.add_argument(
        "--timeout", type=float, default=30.0, help="seconds to wait for the acknowledgement"
    )
    p.set_defaults(func=cmd_ctl)

    p = sub.add_parser("vscode", help="VSCode integration")
    vsub = p.add_subparsers(dest="vscode_command", required=True)
    v = vsub.add_parser("init", help="add msmon tasks/launch configs to DIR/.vscode")
    v.add_argument("dir", nargs="?", default=".", help="project dir (default: current dir)")
    v.set_defaults(func=cmd_vscode_init)

    p = sub.add_parser("export", help="write a run's scalars as CSV, JSON lines or tfevents")
    p.add_argument("run_dir", help="the run to export")
    p.add_argument("--to", required=True, choices=("csv", "jsonl", "tensorboard"), dest="fmt")
    p.add_argument("out", help="output file (csv, jsonl) or directory (tensorboard)")
    p.set_defaults(func=cmd_export)

    p = sub.add_parser("kernel", help="Jupyter kernel for this environment")
    ksub = p.add_subparsers(dest="kernel_command", required=True)
    k = ksub.add_parser("install", help="register this interpreter as a Jupyter kernel (user)")
    k.add_argument("--name", default="msmon", help="kernel name (default msmon)")
    k.add_argument(
        "--display-name", default=None, help="name shown in Jupyter/VSCode (default: with the venv)"
    )
    k.set_defaults(func=cmd_kernel_install)

    p = sub.add_parser("doctor", help="check versions, MindSpore, kernel, VSCode, summary dir")
    p.add_argument("--json", action="store_true", help="print JSON instead of a table")
    p.add_argument("--dir", default="./summary", help="summary base dir (default ./summary)")
    p.add_argument(
        "--project", default=None, help="project whose .vscode/ to check (default: current dir)"
    )
    p.set_defaults(func=cmd_doctor)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    """Entry point of the ``msmon`` console script."""
    args = build_parser().parse_args(argv)
    return int(args.func(args) or 0)


if __name__ == "__main__":
    sys.exit(main())
