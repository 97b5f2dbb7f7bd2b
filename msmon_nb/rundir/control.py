"""Commands to a live monitor from outside its page: pause, resume, stop, freq N, snapshot.

Widget clicks reach the kernel as comm messages, which VS Code's notebooks do not deliver
while a cell is busy, and a ``python train.py`` run has no page at all. So the monitor
also reads a control file in its run dir at step boundaries. Writers: ``msmon ctl`` and
the viewer's buttons; the panel shows the ``msmon ctl`` line when a click goes
unanswered.

Files in the run dir (the top dir: every rank of a distributed job reads the same one):

* ``msmon_control.jsonl``: one command per line, appended (``O_APPEND``, one ``write`` of
  a short line: writers never interleave) --
  ``{"id", "cmd", "arg", "source", "time"}``;
* ``msmon_control_ack.jsonl``: one line per command and rank that read it --
  ``{"id", "rank", "step", "ok", "message", "time"}``.

A monitor reads only what was appended after it opened the run, so a command meant for an
earlier run in the same dir is never replayed. Standard library only.
"""

from __future__ import annotations

import json
import os
import time
import uuid
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from msmon_nb.rundir.layout import (
    MARKER,
    append_jsonl,
    marker_alive,
    rank_markers,
    read_jsonl,
    read_marker_file,
)

CONTROL = "msmon_control.jsonl"
CONTROL_ACK = "msmon_control_ack.jsonl"
COMMANDS = ("pause", "resume", "stop", "freq", "snapshot")
POLL_SECS = 0.2  # how often a monitor looks at the control file (at step boundaries)
LIVENESS_SECS = 1.0  # how often a waiting sender checks that the ranks it waits for live


class ControlError(ValueError):
    """A command that cannot be sent: unknown, missing its argument, or no live monitor."""


@dataclass(frozen=True)
class Command:
    """One command for the monitor owning a run dir."""

    id: str
    cmd: str
    arg: int | None = None
    source: str = ""
    time: float = 0.0

    def describe(self) -> str:
        return self.cmd if self.arg is None else f"{self.cmd} {self.arg}"


def check_command(cmd: str, arg: Any = None) -> tuple[str, int | None]:
    """``(cmd, arg)`` when valid (``freq`` takes a whole number >= 1, the rest nothing),
    else ``ControlError`` naming the problem and a valid form."""
    if cmd not in COMMANDS:
        raise ControlError(f"unknown command {cmd!r}; use one of: {', '.join(COMMANDS)}")
    if cmd == "freq":
        text = str(arg).strip()
        if isinstance(arg, bool) or not text.isdigit() or int(text) < 1:
            raise ControlError(f"freq needs a whole number >= 1 (e.g. freq 10), got {arg!r}")
        return cmd, int(text)
    if arg is not None:
        raise ControlError(f"{cmd} takes no argument (got {arg!r})")
    return cmd, None


def live_owner(run_dir: Path) -> str | None:
    """None when a live monitor owns ``run_dir`` (its marker says running and its pid
    lives on this host; any rank's, for a distributed run), else why not."""
    markers = rank_markers(run_dir)
    own = read_marker_file(run_dir / MARKER)
    if own is not None:
        markers = {**markers, -1: own}
    if not markers:
        return f"{run_dir} is not a run written by msmon_nb (no {MARKER})"
    if any(marker_alive(m) for m in markers.values()):
        return None
    statuses = sorted({str(m.get("status", "?")) for m in markers.values()})
    return (
        f"no live monitor owns {run_dir} (status: {', '.join(statuses)}; its process is gone "
        "or runs on another host)"
    )


def send(run_dir: Path, cmd: str, arg: Any = None, source: str = "msmon ctl") -> Command:
    """Append a command for the monitor owning ``run_dir``; ``ControlError`` when the
    command is invalid or no live monitor owns the dir."""
    cmd, n = check_command(cmd, arg)
    why = live_owner(run_dir)
    if why is not None:
        raise ControlError(why)
    command = Command(uuid.uuid4().hex, cmd, n, source, time.time())
    line = (json.dumps(asdict(command)) + "\n").encode()
    fd = os.open(run_dir / CONTROL, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o600)
    try:
        os.write(fd, line)  # one write of a short line with O_APPEND: never interleaved
    finally:
        os.close(fd)
    return command


def acks(run_dir: Path, command_id: str) -> list[dict[str, Any]]:
    """The acknowledgements of one command so far (one per rank that read it)."""
    return [a for a in read_jsonl(run_dir / CONTROL_ACK) if a.get("id") == command_id]


def live_ranks(run_dir: Path) -> set[int]:
    """The ranks of a distributed run whose monitor is alive (its ``rank_<k>`` marker says
    running, its pid lives on this host): each reads every command and acknowledges it.
    Empty for a single-process run."""
    return {rank for rank, marker in rank_markers(run_dir).items() if marker_alive(marker)}


def wait_for_ack(
    run_dir: Path,
    command: Command,
    timeout: float = 30.0,
    every: float = 0.05,
    ranks: set[int] | None = None,
) -> list[dict[str, Any]]:
    """Poll for ``command``'s acknowledgements until each of ``ranks`` answered (default:
    the run's ``live_ranks``; one answer for a single-process run) or ``timeout`` passes;
    the acknowledgements so far, from every rank that answered. A rank whose monitor ends
    meanwhile (its marker no longer running, its pid gone) is not waited for: it never
    will answer, and the caller names it from ``live_ranks`` afterwards."""
    want = live_ranks(run_dir) if ranks is None else set(ranks)
    distributed = bool(want)
    deadline = time.monotonic() + timeout
    recheck = time.monotonic() + LIVENESS_SECS
    while True:
        got = acks(run_dir, command.id)
        answered = {a.get("rank") for a in got}
        now = time.monotonic()
        if distributed and now >= recheck:
            want &= live_ranks(run_dir) | answered
            recheck = now + LIVENESS_SECS
        if ((got or distributed) and want <= answered) or now >= deadline:
            return got
        time.sleep(every)


class ControlReader:
    """The monitor's side: new commands since it opened the run, and their acks.

    ``due()`` is the per-step cost (one clock read); the file is looked at only every
    ``POLL_SECS``, and read only when it grew.
    """

    __slots__ = ("_next", "ack_path", "offset", "path", "rank")

    def __init__(self, run_dir: Path, rank: int = 0) -> None:
        self.path = run_dir / CONTROL
        self.ack_path = run_dir / CONTROL_ACK
        self.rank = rank
        try:
            self.offset = self.path.stat().st_size  # nothing written before us is ours
        except OSError:
            self.offset = 0
        self._next = 0.0

    def due(self, now: float) -> bool:
        """True when the file should be looked at now (``now``: ``time.monotonic()``)."""
        if now < self._next:
            return False
        self._next = now + POLL_SECS
        return True

    def read(self) -> list[Command]:
        """Commands appended since the last read (a torn last line waits for the next)."""
        try:
            size = self.path.stat().st_size
        except OSError:
            return []
        if size <= self.offset:
            return []
        with open(self.path, "rb") as f:
            f.seek(self.offset)
            data = f.read(size - self.offset)
        end = data.rfind(b"\n") + 1
        self.offset += end
        out = []
        for line in data[:end].splitlines():
            try:
                item = json.loads(line)
                cmd, arg = check_command(item.get("cmd"), item.get("arg"))
            except (ValueError, AttributeError):
                continue
            out.append(Command(str(item.get("id", "")), cmd, arg, str(item.get("source", ""))))
        return out

    def ack(self, command: Command, step: int | None, ok: bool, message: str) -> None:
        """Say that this rank read ``command`` (and what came of it)."""
        append_jsonl(
            self.ack_path,
            {
                "id": command.id,
                "rank": self.rank,
                "step": step,
                "ok": ok,
                "message": message,
                "time": time.time(),
            },
        )
