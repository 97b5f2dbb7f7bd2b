"""The fixed set of files the viewer serves.

Static files are a whitelist built at start-up: URL path -> file. A request path is
looked up verbatim (no decoding, no joining with a directory), so ``..``, ``%2e%2e``,
double encoding or backslashes can never reach another file: they are simply not keys.

The page's own files are ``static/``; the chart component it shares with the notebook
panel (``chart.js``, ``chart.css``) and uPlot come from ``msmon_nb/static/`` (package
data, the same files the panel's widget joins), so the page works offline.
"""

from __future__ import annotations

import gzip
import threading
from dataclasses import dataclass, field
from pathlib import Path

from msmon_nb.metrics.charts import CHART_ASSETS

STATIC_DIR = Path(__file__).resolve().parent / "static"
_TYPES = {
    ".html": "text/html; charset=utf-8",
    ".js": "text/javascript; charset=utf-8",
    ".css": "text/css; charset=utf-8",
}
# the chart component's files, served under /vendor/ (cached: they change with the wheel)
SHARED = ("uPlot.iife.min.js", "uPlot.min.css", "chart.js", "chart.css")


class MissingAsset(RuntimeError):
    """A file the page needs is not installed (the message says how to fix it)."""


@dataclass
class StaticFile:
    """One servable file; its bytes (and gzip form) are read once, on first request."""

    path: Path
    content_type: str
    cache_secs: int
    _data: bytes | None = field(default=None, repr=False)
    _gzipped: bytes | None = field(default=None, repr=False)
    _lock: threading.Lock = field(default_factory=threading.Lock, repr=False)

    def body(self, gzip_ok: bool) -> tuple[bytes, bool]:
        """The bytes to send and whether they are gzip-encoded."""
        with self._lock:
            if self._data is None:
                self._data = self.path.read_bytes()
            if not gzip_ok or len(self._data) < 2048:
                return self._data, False
            if self._gzipped is None:
                self._gzipped = gzip.compress(self._data, compresslevel=6)
            return self._gzipped, True


def static_files(static_dir: Path = STATIC_DIR) -> dict[str, StaticFile]:
    """URL path -> file: the page's own files, and the shared chart component's."""
    files: dict[str, StaticFile] = {}
    for path in sorted(static_dir.iterdir()):
        kind = _TYPES.get(path.suffix)
        if kind and path.is_file():
            files[f"/{path.name}"] = StaticFile(path, kind, cache_secs=0)
    if "/index.html" in files:
        files["/"] = files["/index.html"]
    for name in SHARED:
        path = CHART_ASSETS / name
        if not path.is_file():
            raise MissingAsset(
                f"{path} is missing: the installed msmon_nb is incomplete; reinstall it "
                "(pip install --force-reinstall msmon_nb)"
            )
        files[f"/vendor/{name}"] = StaticFile(path, _TYPES[path.suffix], cache_secs=0)
    return files
