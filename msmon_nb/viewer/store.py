"""The runs of one base dir as the viewer serves them.

Listing uses the cheap ``RunIndex`` (a few file reads per run), so a base dir of a hundred
long runs lists in well under a second. A run is fully loaded (``Run``) only when a
client asks for its data; from then on the watcher's ``poll()`` tails it, so requests
never read files and two requests never load the same run twice.

Thread model: ``ThreadingHTTPServer`` runs one thread per connection plus the watcher.
Each loaded run has its own lock, held while it is refreshed or while a series is taken
out of it; the arrays handed out are never modified afterwards (new data is appended to
new chunks), so downsampling and JSON encoding run outside the lock.
"""

from __future__ import annotations

import threading
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from msmon_nb.events.index import RunIndex, RunInfo
from msmon_nb.events.runs import ALERTS, SNAPSHOTS, Run, ScalarSeries


class UnknownRun(KeyError):
    """No run of that name under the base dir."""


@dataclass
class _Loaded:
    run: Run
    lock: threading.Lock = field(default_factory=threading.Lock)
    loaded: bool = False
    signature: tuple = ()


class RunStore:
    """Run listing and run data of one base dir; safe to use from many threads."""

    def __init__(self, base: str | Path) -> None:
        self.base = Path(base)
        self.index = RunIndex(self.base)
        self._index_lock = threading.Lock()
        self._lock = threading.Lock()
        self._loaded: dict[str, _Loaded] = {}
        self._infos: dict[str, RunInfo] = {}
        self._side_files: dict[str, tuple] = {}
        self._polled: dict[str, RunInfo] = {}  # what the last poll() saw, for its diffs

    # --- listing ----------------------------------------------------------------------

    def scan(self) -> list[RunInfo]:
        """Rescan the base dir (cheap once warm) and remember what was found."""
        with self._index_lock:
            infos = self.index.scan()
        with self._lock:
            self._infos = {i.name: i for i in infos}
        return infos

    def list_runs(self) -> list[dict[str, Any]]:
        """``/api/runs``: one dict per run; exact data for runs already loaded."""
        out = []
        for info in self.scan():
            entry = self._loaded_entry(info.name)
            if entry is not None and entry.loaded:
                with entry.lock:
                    run = entry.run
                    item = {
                        "name": info.name,
                        "path": info.path,
                        "tags": run.tags(),
                        "last_step": run.last_step,
                        "status": run.status,
                        "ranks": run.ranks,
                        "last_write": run.last_write,
                        "exact": True,
                    }
            else:
                item = {
                    "name": info.name,
                    "path": info.path,
                    "tags": list(info.tags),
                    "last_step": info.last_step,
                    "status": info.status,
                    "ranks": list(info.ranks),
                    "last_write": info.last_write,
                    "exact": info.exact,
                }
            out.append(item)
        return out

    def _loaded_entry(self, name: str) -> _Loaded | None:
        with self._lock:
            return self._loaded.get(name)

    # --- one run ----------------------------------------------------------------------

    def _entry(self, name: str) -> _Loaded:
        with self._lock:
            entry = self._loaded.get(name)
            info = self._infos.get(name)
        if entry is not None:
            return entry
        if info is None:  # maybe created since the last scan
            self.scan()
            with self._lock:
                info = self._infos.get(name)
        if info is None:
            raise UnknownRun(name)
        with self._lock:
            entry = self._loaded.setdefault(name, _Loaded(Run(info.path, name=name)))
        return entry

    def run(self, name: str) -> _Loaded:
        """The loaded run ``name`` (loading it on first use); raises ``UnknownRun``."""
        entry = self._entry(name)
        if not entry.loaded:
            with entry.lock:
                if not entry.loaded:
                    entry.run.refresh()
                    entry.loaded = True
                    with self._lock:
                        info = self._infos.get(name)
                    entry.signature = info.signature if info else ()
        return entry

    def scalars(self, name: str, tag: str, rank: int | None = None) -> ScalarSeries:
        """The series of ``tag`` (KeyError naming the known tags when absent)."""
        entry = self.run(name)
        with entry.lock:
            return entry.run.scalars(tag, rank=rank)

    def alerts(self, name: str) -> list[dict[str, Any]]:
        """The run's alerts (read from disk each time: the file is small and appended)."""
        entry = self._entry(name)
        return entry.run.alerts

    def snapshots(self, name: str) -> list[dict[str, Any]]:
        """The run's tensor snapshots with their stats and histograms."""
        entry = self.run(name)
        with entry.lock:
            return entry.run.snapshots

    # --- watching ---------------------------------------------------------------------

    def poll(self) -> list[tuple[str, dict[str, Any]]]:
        """Rescan, tail loaded runs that changed; returns the events to broadcast.

        Events: ``("runs", {names})`` when runs appear, vanish or change status;
        ``("data", {run, last_step})`` when a run's files grew; ``("alerts", {run})``
        when its alerts or snapshots files changed.
        """
        before = self._polled
        infos = {i.name: i for i in self.scan()}
        self._polled = infos
        events: list[tuple[str, dict[str, Any]]] = []
        listed = {n: i.status for n, i in infos.items()}
        if listed != {n: i.status for n, i in before.items()}:
            events.append(("runs", {"names": sorted(infos)}))
        with self._lock:
            for gone in set(self._loaded) - set(infos):
                del self._loaded[gone]
        for gone in set(self._side_files) - set(infos):
            del self._side_files[gone]
        for name, info in infos.items():
            old = before.get(name)
            entry = self._loaded_entry(name)
            changed = old is not None and old.signature[0] != info.signature[0]
            if entry is not None and entry.loaded and entry.signature != info.signature:
                with entry.lock:
                    grew = entry.run.refresh()
                    entry.signature = info.signature
                    last_step = entry.run.last_step
                if grew:
                    events.append(("data", {"run": name, "last_step": last_step}))
            elif changed:
                events.append(("data", {"run": name, "last_step": info.last_step}))
            side = _side_signature(Path(info.path))
            if self._side_files.get(name, side) != side:
                events.append(("alerts", {"run": name}))
            self._side_files[name] = side
        return events


def _side_signature(run_dir: Path) -> tuple:
    """Sizes and mtimes of the run's alerts and snapshots files (all ranks)."""
    sig = []
    for name in (ALERTS, SNAPSHOTS):
        for path in (run_dir / name, *sorted(run_dir.glob(f"rank_*/{name}"))):
            try:
                st = path.stat()
            except OSError:
                continue
            sig.append((str(path), st.st_size, st.st_mtime_ns))
    return tuple(sig)
