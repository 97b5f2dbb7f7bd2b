"""The command table, and commands to a live monitor from outside its page.

``SPECS`` is the one place the commands are spelled (name, button label, argument): the
monitor's interpreter (``monitor.controls``) gives each one its handler, ``msmon ctl``
takes its choices from it, and both pages get it as data (the panel from the kernel, the
viewer from ``/api/info``). It lives here, in the standard-library room, because the
``msmon`` command and the viewer may not import the monitor. Adding a command: one
``CommandSpec`` in ``SPECS`` and one handler in ``monitor.controls.HANDLERS``.

Widget clicks reach the kernel as comm messages, which a front end may not deliver to a
busy kernel, and a ``python train.py`` run has no page at all. So the monitor
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
POLL_SECS = 0.2  # how often a monitor looks at the control file (at step boundaries)
LIVENESS_SECS = 1.0  # how often a waiting sender checks that the ranks it waits for live


class ControlError(ValueError):
    """A command that cannot be sent: unknown, missing its argument, or no live monitor."""


@dataclass(frozen=True)
class Argument:
    """What a command's argument is: a number of ``kind`` (``int`` or ``float``), at least
    ``minimum`` (above it when ``above``: a factor of 0 is no factor); ``name`` is how
    usage lines and pages call it (``freq N``); ``example`` is shown in errors;
    ``start`` is where both pages' field starts (default: the example): for ``freq``
    the product's default, 1, so a page never shows a value the run does not have;
    ``prefixes`` may stand before the number and are dropped (``lr x0.5``, ``lr X0.5``
    and ``lr ×0.5`` read as 0.5); a float may be a fraction (``lr x1/3``, the undo of
    ``lr x3``)."""

    name: str
    kind: type
    minimum: float
    example: float
    above: bool = False
    prefixes: str = ""
    start: float | None = None

    def parse(self, command: str, value: Any) -> int | float:
        """``value`` (a number, or its text from a command line) as ``kind``, else a
        ``ControlError`` that names the problem and shows a valid form."""
        whole = self.kind is int
        bound = f"> {self.minimum:g}" if self.above else f">= {self.minimum:g}"
        wanted = "a whole number" if whole else "a finite number"
        example = f"{command} {self.prefixes[:1]}{self.example:g}"
        text = str(value).strip()
        if self.prefixes and text[:1] in self.prefixes:
            text = text[1:].strip()
        try:
            if isinstance(value, bool) or value is None:
                raise ValueError
            if not whole and text.count("/") == 1:  # lr x1/3: the undo of lr x3
                top, bottom = (float(part) for part in text.split("/"))
                number = top / bottom if bottom else None
            else:
                number = int(text) if whole else float(text)
        except ValueError:
            number = None
        low = number is not None and (
            number <= self.minimum if self.above else number < self.minimum
        )
        # NaN fails number != number; inf is no factor either
        if number is None or number != number or low or abs(number) == float("inf"):
            raise ControlError(f"{command} needs {wanted} {bound} (e.g. {example}), got {value!r}")
        return number

    def to_json(self) -> dict[str, Any]:
        return {
            "name": self.name,
            "kind": self.kind.__name__,
            "min": self.minimum,
            "above": self.above,
            "example": self.example,
            "start": self.example if self.start is None else self.start,
            "prefixes": self.prefixes,
        }


@dataclass(frozen=True)
class CommandSpec:
    """One command: its name (as typed after ``msmon ctl RUN_DIR``), the label of its
    control in the pages, its argument (None: it takes none), what it does, and the
    state in which a page offers it (``when``: ``"running"``, ``"paused"``, or None for
    always), so that Pause and Resume share one place on the panel. ``recorded``: the
    command changes training (or what is recorded of it), so each use is an
    intervention, kept in the run's ``interventions.jsonl`` and drawn on its charts; a
    snapshot only reads. ``button``: a command with an argument that acts anew each time
    it is sent (``lr x0.5`` halves again): the pages send it from a button next to its
    field, never on each change of the field (``freq N`` is sent as the field changes)."""

    name: str
    label: str
    help: str
    arg: Argument | None = None
    when: str | None = None
    recorded: bool = True
    button: bool = False

    def to_json(self) -> dict[str, Any]:
        """The command as the pages receive it (panel trait, ``/api/info``)."""
        return {
            "name": self.name,
            "label": self.label,
            "help": self.help,
            "arg": None if self.arg is None else self.arg.to_json(),
            "when": self.when,
            "recorded": self.recorded,
            "button": self.button,
        }


PAUSE = CommandSpec("pause", "Pause", "hold the loop at the next step boundary", when="running")
RESUME = CommandSpec("resume", "Resume", "let a paused loop go on", when="paused")
STOP = CommandSpec("stop", "Stop", "end the loop at the next step boundary (run marked stopped)")
FREQ = CommandSpec(
    "freq",
    "collect every",
    "collect every N-th step from the next step on",
    # start: MonitorConfig.log_interval's default (rundir imports no config; a test
    # holds the two together)
    Argument("N", int, 1, 10, start=1),
)
SNAPSHOT = CommandSpec(
    "snapshot",
    "Snapshot",
    "summarise the watched parameters and gradients at the next step",
    recorded=False,
)
CHECKPOINT = CommandSpec(
    "checkpoint",
    "Checkpoint",
    "save the network and optimizer state at the next step boundary (mindspore."
    "save_checkpoint, into the run's checkpoints/step_<n>.ckpt)",
)
LR = CommandSpec(
    "lr",
    "lr \u00d7",
    "scale the learning rate by F from the next step on (a constant or list lr; "
    "lr x2 undoes lr x0.5 exactly)",
    Argument("xF", float, 0.0, 0.5, above=True, prefixes="xX\u00d7*"),
    button=True,
)
SPECS: dict[str, CommandSpec] = {
    spec.name: spec for spec in (PAUSE, RESUME, STOP, FREQ, SNAPSHOT, CHECKPOINT, LR)
}
COMMANDS = tuple(SPECS)


def command_list() -> list[dict[str, Any]]:
    """Every command as JSON, in table order: what a page builds its controls from."""
    return [spec.to_json() for spec in SPECS.values()]


def usage() -> str:
    """The commands as a usage line: ``pause|resume|stop|freq N|snapshot|checkpoint|lr xF``."""
    return "|".join(
        spec.name if spec.arg is None else f"{spec.name} {spec.arg.name}" for spec in SPECS.values()
    )


@dataclass(frozen=True)
class Command:
    """One command for the monitor owning a run dir."""

    id: str
    cmd: str
    arg: int | float | None = None
    source: str = ""
    time: float = 0.0

    def describe(self) -> str:
        return self.cmd if self.arg is None else f"{self.cmd} {self.arg}"


def check_command(cmd: Any, arg: Any = None) -> tuple[str, int | float | None]:
    """``(cmd, arg)`` when valid (an argument as its ``Argument`` says, none for a command
    without one), else ``ControlError`` naming the problem and a valid form."""
    spec = SPECS.get(cmd) if isinstance(cmd, str) else None
    if spec is None:
        raise ControlError(f"unknown command {cmd!r}; use one of: {usage().replace('|', ', ')}")
    if spec.arg is not None:
        return spec.name, spec.arg.parse(spec.name, arg)
    if arg is not None:
        raise ControlError(f"{spec.name} takes no argument (got {arg!r})")
    return spec.name, None


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
