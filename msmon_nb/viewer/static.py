"""The fixed set of files the viewer serves.

Static files are a whitelist built at start-up: URL path -> file. A request path is
looked up verbatim (no decoding, no joining with a directory), so ``..``, ``%2e%2e``,
double encoding or backslashes can never reach another file: they are simply not keys.

The page's own files are ``static/``; the chart component it shares with the notebook
panel (``chart.js``, ``chart.css``) and uPlot come from ``msmon_nb/static/`` (package
data, the same files the panel's widget joins), so the page works offline.

None of them is cached without asking: every file is served ``no-cache`` with an ETag
(a hash of its bytes), so the browser revalidates each load and an unchanged file costs
a bodiless 304. The URLs carry no version (``index.html`` names ``vendor/chart.js``), so
a ``max-age`` would keep an upgraded package's page running the old chart code beside
the new ``app.js``.
"""

from __future__ import annotations

import gzip
import hashlib
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
# the chart component's files, served under /vendor/ (no-cache, like the page's own)
SHARED = ("uPlot.iife.min.js", "uPlot.min.css", "chart.js", "heatmap.js", "chart.css")


class MissingAsset(RuntimeError):
    """A file the page needs is not installed (the message says how to fix it)."""


@dataclass
class StaticFile:
    """One servable file; its bytes (and gzip form) are read once, on first request."""

    path: Path
    content_type: str
    _data: bytes | None = field(default=None, repr=False)
    _gzipped: bytes | None = field(default=None, repr=False)
    _etag: str | None = field(default=None, repr=False)
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

    @property
    def etag(self) -> str:
        """A weak validator of the file's bytes: weak, because its gzip form (another
        byte sequence, the same file) carries it too."""
        if self._etag is None:
            data, _ = self.body(False)
            self._etag = 'W/"' + hashlib.sha256(data).hexdigest()[:20] + '"'
        return self._etag


def static_files(static_dir: Path = STATIC_DIR) -> dict[str, StaticFile]:
    """URL path -> file: the page's own files, and the shared chart component's."""
    files: dict[str, StaticFile] = {}
    for path in sorted(static_dir.iterdir()):
        kind = _TYPES.get(path.suffix)
        if kind and path.is_file():
            files[f"/{path.name}"] = StaticFile(path, kind)
    if "/index.html" in files:
        files["/"] = files["/index.html"]
    for name in SHARED:
        path = CHART_ASSETS / name
        if not path.is_file():
            raise MissingAsset(
                f"{path} is missing: the installed msmon_nb is incomplete; reinstall it "
                "(pip install --force-reinstall msmon_nb)"
            )
        files[f"/vendor/{name}"] = StaticFile(path, _TYPES[path.suffix])
    return files
