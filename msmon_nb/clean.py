"""``msmon clean``: delete old runs under a summary base dir, and nothing else.

``rm -rf ./summary`` before each debug run destroys every other experiment in it. This
cleaner deletes a directory only when all of these hold:

* it is a run dir: it holds our marker or MindSpore summary files (``find_run_dirs``,
  which never descends through a symlink);
* it lies strictly inside the base dir once every link is resolved, and is not itself a
  symlink: the base dir itself is never deleted, nor anything a link points to;
* everything in it is something a run writes (summary and lineage files, the marker,
  alerts/snapshots/metrics JSONL, ``config_backup/``, ``tensorboard/``, ``rank_<k>/``);
  a stray ``train.py`` means the user put the run somewhere unexpected, so it is kept;
* its writer is not alive: the marker's pid on this host, any process holding one of its
  files open (``/proc/*/fd``), or, for runs without a marker, a write in the last minute
  (``--force`` overrides this one rule only);
* it matches the user's filter: last written before ``--older-than`` and not among the
  ``--keep`` newest (no filter: every run, after the question or ``--yes``).

``shutil.rmtree`` removes with file descriptors relative to the opened directory on Linux,
so a directory swapped for a symlink after the checks is not followed either.
"""

from __future__ import annotations

import argparse
import os
import re
import shutil
import sys
import time
from dataclasses import dataclass
from pathlib import Path

from msmon_nb.rundir import (
    ALERTS,
    MARKER,
    OVERVIEW_DATA,
    OVERVIEW_INDEX,
    RECENT_SECS,
    SNAPSHOTS,
    find_run_dirs,
    marker_alive,
    rank_of_dir,
    read_marker,
)
from msmon_nb.rundir.control import CONTROL, CONTROL_ACK

_UNITS = {"s": 1, "m": 60, "h": 3600, "d": 86400, "w": 7 * 86400}
_AGE_RE = re.compile(r"^\s*(\d+(?:\.\d+)?)\s*([smhdw])\s*$")
_RUN_FILE_RES = [
    re.compile(r"summary\.\d+"),  # summary files and MindSpore's *_lineage side files
    re.compile(r"^\.msmon_run\.json\.\d+\.tmp$"),  # a marker being replaced
    re.compile(r"^metrics\.rank\d+\.jsonl$"),  # the "file" output
]
# the control file and its acks (msmon ctl, the viewer's buttons), the writer's overview
_RUN_FILES = {MARKER, ALERTS, SNAPSHOTS, CONTROL, CONTROL_ACK, OVERVIEW_DATA, OVERVIEW_INDEX,
              OVERVIEW_INDEX + ".tmp"}  # fmt: skip
_RUN_SUBDIRS = {"config_backup", "tensorboard"}


def parse_age(text: str) -> float:
    """``3d``, ``12h``, ``30m``, ``45s``, ``2w`` -> seconds; ValueError with an example."""
    match = _AGE_RE.match(text)
    if not match:
        raise ValueError(f"--older-than {text!r}: give a number and a unit s/m/h/d/w, e.g. 3d")
    return float(match.group(1)) * _UNITS[match.group(2)]


@dataclass(frozen=True)
class RunDir:
    """One run dir found under the base, with what decides its fate."""

    path: Path
    name: str
    last_write: float
    size: int
    unknown: tuple[str, ...]  # entries no run writes (so the dir is never deleted)
    alive: str | None  # why its writer seems alive, or None


def _scan_contents(path: Path, free: bool = False) -> tuple[int, float, list[str]]:
    """Total bytes, newest mtime, and unrecognised entries of a run dir (no link followed).

    ``free``: inside ``config_backup/`` or ``tensorboard/``, where the run writes what it
    likes. ``rank_<k>/`` dirs follow the same rules as the run dir itself.
    """
    size, newest, unknown = 0, 0.0, []
    try:
        entries = list(os.scandir(path))
    except OSError as exc:
        return 0, 0.0, [f"unreadable ({exc.strerror})"]
    for entry in entries:
        st = entry.stat(follow_symlinks=False)
        newest = max(newest, st.st_mtime)
        if not entry.is_dir(follow_symlinks=False):
            size += st.st_size
            if not free and not _is_run_file(entry.name):
                unknown.append(entry.name)
            continue
        sub_free = free or entry.name in _RUN_SUBDIRS
        sub_size, sub_newest, sub_unknown = _scan_contents(Path(entry.path), sub_free)
        size += sub_size
        newest = max(newest, sub_newest)
        if sub_free:
            continue
        if rank_of_dir(entry.name) is not None:
            unknown += [f"{entry.name}/{u}" for u in sub_unknown]
        else:
            unknown.append(entry.name + "/")
    return size, newest, unknown


def _is_run_file(name: str) -> bool:
    return name in _RUN_FILES or any(r.search(name) for r in _RUN_FILE_RES)


def open_files_by_pid() -> dict[str, int]:
    """Path -> pid of every file some process of ours holds open (Linux ``/proc``)."""
    found: dict[str, int] = {}
    me = os.getpid()
    try:
        procs = [p for p in Path("/proc").iterdir() if p.name.isdigit()]
    except OSError:
        return found
    for proc in procs:
        pid = int(proc.name)
        if pid == me:
            continue
        try:
            fds = list((proc / "fd").iterdir())
        except OSError:  # gone, or another user's process
            continue
        for fd in fds:
            try:
                target = str(fd.readlink())
            except OSError:
                continue
            if target.startswith("/"):
                found.setdefault(target, pid)
    return found


def _liveness(path: Path, last_write: float, open_files: dict[str, int], now: float) -> str | None:
    marker = read_marker(path)
    if marker_alive(marker):
        return f"running (marker pid {marker['pid']} is alive)"
    prefix = str(path.resolve()) + os.sep
    for target, pid in open_files.items():
        if target.startswith(prefix):
            return f"open by process {pid}"
    if marker is None and now - last_write < RECENT_SECS:
        return f"written {now - last_write:.0f} s ago (no marker tells whether it finished)"
    return None


def find(base: Path, now: float | None = None) -> list[RunDir]:
    """The run dirs strictly inside ``base`` (links resolved), newest first."""
    now = time.time() if now is None else now
    root = base.resolve()
    open_files = open_files_by_pid()
    out = []
    for path in find_run_dirs(base):
        resolved = path.resolve()
        if path.is_symlink() or resolved == root or root not in resolved.parents:
            continue
        size, newest, unknown = _scan_contents(path)
        newest = newest or path.lstat().st_mtime
        name = path.relative_to(base).as_posix()
        alive = _liveness(path, newest, open_files, now)
        out.append(RunDir(path, name, newest, size, tuple(sorted(unknown)), alive))
    return sorted(out, key=lambda r: r.last_write, reverse=True)


def plan(
    runs: list[RunDir],
    older_than: float | None,
    keep: int | None,
    force: bool,
    now: float,
) -> tuple[list[RunDir], list[tuple[RunDir, str]]]:
    """(runs to delete, [(run kept for safety, why)]); ``runs`` newest first."""
    remove: list[RunDir] = []
    refused: list[tuple[RunDir, str]] = []
    for i, run in enumerate(runs):
        if keep is not None and i < keep:
            continue
        if older_than is not None and now - run.last_write < older_than:
            continue
        if run.unknown:
            shown = ", ".join(run.unknown[:5]) + (" ..." if len(run.unknown) > 5 else "")
            refused.append((run, f"holds files no run writes ({shown}); delete it by hand"))
        elif run.alive and not force:
            refused.append((run, f"{run.alive}; --force deletes it anyway"))
        else:
            remove.append(run)
    return remove, refused


def human(size: float) -> str:
    """Bytes as B/KB/MB/GB with one decimal."""
    for unit in ("B", "KB", "MB", "GB"):
        if size < 1024 or unit == "GB":
            return f"{size:.0f} {unit}" if unit == "B" else f"{size:.1f} {unit}"
        size /= 1024
    return f"{size:.1f} GB"


def _ago(secs: float) -> str:
    for unit, size in (("d", 86400), ("h", 3600), ("m", 60)):
        if secs >= size:
            return f"{secs / size:.1f}{unit}"
    return f"{secs:.0f}s"


def main(args: argparse.Namespace, now: float | None = None) -> int:
    """``msmon clean``: 0 done (or nothing to do), 1 refused or failed, 2 bad arguments."""
    now = time.time() if now is None else now
    base = Path(args.base)
    try:
        older_than = parse_age(args.older_than) if args.older_than is not None else None
    except ValueError as exc:
        print(f"msmon clean: {exc}", file=sys.stderr)
        return 2
    if args.keep is not None and args.keep < 0:
        print(f"msmon clean: --keep {args.keep}: give 0 or more, e.g. --keep 5", file=sys.stderr)
        return 2
    if not base.is_dir():
        print(f"msmon clean: {base} does not exist; nothing to clean")
        return 0
    runs = find(base, now)
    if older_than is None and args.keep is None:
        # no filter: every run may go (what `rm -rf ./summary` meant, minus the damage);
        # live runs and unknown files are still kept, and the question below still comes
        print(f"no --older-than/--keep given: every run under {base} is a candidate")
    remove, refused = plan(runs, older_than, args.keep, args.force, now)
    for run, why in refused:
        print(f"kept {run.name}: {why}")
    if not remove:
        print(f"nothing to remove under {base} ({len(runs)} runs kept)")
        return 0
    total = sum(r.size for r in remove)
    verb = "would remove" if args.dry_run else "remove"
    for run in remove:
        print(
            f"{verb} {run.name} ({human(run.size)}, last written {_ago(now - run.last_write)} ago)"
        )
    if args.dry_run:
        print(f"would free {human(total)} ({total} bytes) from {len(remove)} runs; nothing deleted")
        return 0
    if not args.yes:
        try:
            answer = input(f"remove {len(remove)} runs, {human(total)}? [y/N] ")
        except EOFError:
            answer = ""
        if answer.strip().lower() not in ("y", "yes"):
            print("nothing deleted (pass --yes to skip this question)")
            return 1
    freed, failed = 0, 0
    open_files = open_files_by_pid()
    for run in remove:
        alive = _liveness(run.path, run.last_write, open_files, time.time())
        if alive and not args.force:  # it started writing while we asked
            print(f"kept {run.name}: {alive}")
            continue
        try:
            shutil.rmtree(run.path)
        except OSError as exc:
            failed += 1
            print(f"could not remove {run.name}: {exc}", file=sys.stderr)
            continue
        freed += run.size
        print(f"removed {run.name} ({human(run.size)})")
    print(f"freed {human(freed)} ({freed} bytes)")
    return 1 if failed else 0
