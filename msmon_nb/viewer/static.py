"""The fixed set of files the viewer serves, and where plotly.js comes from.

Static files are a whitelist built at start-up: URL path -> file. A request path is
looked up verbatim (no decoding, no joining with a directory), so ``..``, ``%2e%2e``,
double encoding or backslashes can never reach another file: they are simply not keys.

plotly.js is served from the installed ``plotly`` wheel (``package_data/plotly.min.js``),
found without importing plotly, so the page works offline and nothing third-party is
copied into this repository.
"""

from __future__ import annotations

import gzip
import importlib.util
import threading
from dataclasses import dataclass, field
from pathlib import Path

STATIC_DIR = Path(__file__).resolve().parent / "static"
PLOTLY_URL = "/vendor/plotly.min.js"
_TYPES = {
    ".html": "text/html; charset=utf-8",
    ".js": "text/javascript; charset=utf-8",
    ".css": "text/css; charset=utf-8",
}


class MissingAsset(RuntimeError):
    """A file the page needs is not installed (the message says how to install it)."""


def plotly_js() -> Path:
    """Path of ``plotly.min.js`` inside the installed plotly package."""
    spec = importlib.util.find_spec("plotly")
    if spec is None or not spec.submodule_search_locations:
        raise MissingAsset(
            "the viewer draws with plotly.js from the 'plotly' package, which is not "
            "installed: pip install plotly"
        )
    for location in spec.submodule_search_locations:
        path = Path(location) / "package_data" / "plotly.min.js"
        if path.is_file():
            return path
    raise MissingAsset(
        "the installed plotly package holds no package_data/plotly.min.js: "
        "pip install --force-reinstall plotly"
    )


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
    """URL path -> file: the page's own files, and plotly.js from its package."""
    files: dict[str, StaticFile] = {}
    for path in sorted(static_dir.iterdir()):
        kind = _TYPES.get(path.suffix)
        if kind and path.is_file():
            files[f"/{path.name}"] = StaticFile(path, kind, cache_secs=0)
    if "/index.html" in files:
        files["/"] = files["/index.html"]
    files[PLOTLY_URL] = StaticFile(plotly_js(), _TYPES[".js"], cache_secs=86400)
    return files
