"""A real MindInsight 2.3.1 in a venv of its own, for the interop test and bench/viewer.py.

MindInsight pins protobuf 3.20.1 and drops events silently under numpy 2, so it cannot
share the project's venv: it gets ``pip install mindinsight==2.3.1 'numpy<2' 'pandas<3'``
in ``~/.cache/msmon_nb/mindinsight-2.3.1`` (or ``$MSMON_MINDINSIGHT_VENV``), created on
first use and reused after; a ``.complete`` stamp marks a finished install and a lock file
keeps two test processes from installing at once. ``mindinsight start`` runs gunicorn,
which it finds on PATH, so the venv's ``bin`` goes first on PATH.
"""

from __future__ import annotations

import fcntl
import json
import os
import shutil
import socket
import subprocess
import sys
import time
import urllib.error
import urllib.parse
import urllib.request
from pathlib import Path

VERSION = "2.3.1"
PACKAGES = [f"mindinsight=={VERSION}", "numpy<2", "pandas<3"]
API = "/v1/mindinsight/datavisual"


def venv_dir() -> Path:
    """Where the MindInsight venv lives."""
    default = Path.home() / ".cache" / "msmon_nb" / f"mindinsight-{VERSION}"
    return Path(os.environ.get("MSMON_MINDINSIGHT_VENV", default))


def ensure_venv(log=print) -> Path:
    """The venv's ``bin`` dir, installing MindInsight first when needed (minutes, once)."""
    venv = venv_dir()
    venv.parent.mkdir(parents=True, exist_ok=True)
    with open(venv.parent / f".{venv.name}.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        if not (venv / ".complete").exists():
            shutil.rmtree(venv, ignore_errors=True)
            log(f"installing MindInsight {VERSION} into {venv} (once; takes minutes)")
            base_python = getattr(sys, "_base_executable", None) or sys.executable
            subprocess.run([base_python, "-m", "venv", str(venv)], check=True)
            pip = [str(venv / "bin" / "python"), "-m", "pip", "install", "--quiet"]
            subprocess.run([*pip, "--upgrade", "pip"], check=True)
            subprocess.run([*pip, *PACKAGES], check=True)
            (venv / ".complete").write_text(VERSION)
    return venv / "bin"


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


class MindInsight:
    """``with MindInsight(base) as mi: mi.get(...)``: started on a free port, then stopped."""

    def __init__(self, base: Path, workspace: Path, reload_secs: int = 1) -> None:
        self.bin = ensure_venv()
        self.base, self.workspace = base, workspace
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        self.reload_secs = reload_secs
        self.env = dict(os.environ, PATH=f"{self.bin}{os.pathsep}{os.environ.get('PATH', '')}")
        for name in ("PYTHONPATH", "VIRTUAL_ENV", "PYTHONHOME"):
            self.env.pop(name, None)
        self.started_at: float | None = None

    def start(self) -> MindInsight:
        """Run ``mindinsight start`` (it returns once gunicorn is up)."""
        self.started_at = time.monotonic()
        proc = subprocess.run(
            [
                str(self.bin / "mindinsight"),
                "start",
                "--port",
                str(self.port),
                "--summary-base-dir",
                str(self.base),
                "--workspace",
                str(self.workspace),
                "--reload-interval",
                str(self.reload_secs),
            ],
            capture_output=True,
            text=True,
            env=self.env,
            timeout=300,
        )
        if proc.returncode != 0 or "success" not in proc.stdout:
            raise RuntimeError(f"mindinsight start failed:\n{proc.stdout}\n{proc.stderr}")
        return self

    def stop(self) -> None:
        """``mindinsight stop --port``: it ends the gunicorn processes it started."""
        subprocess.run(
            [str(self.bin / "mindinsight"), "stop", "--port", str(self.port)],
            capture_output=True,
            env=self.env,
            timeout=120,
        )

    def __enter__(self) -> MindInsight:
        return self.start()

    def __exit__(self, *exc) -> None:
        self.stop()

    def get(self, path: str) -> dict:
        """GET a MindInsight REST path; its JSON body (error bodies included)."""
        try:
            with urllib.request.urlopen(self.url + path, timeout=60) as resp:
                return json.load(resp)
        except urllib.error.HTTPError as exc:
            return json.load(exc)

    def train_jobs(self) -> dict:
        return self.get(f"{API}/train-jobs?offset=0&limit=100")

    def scalars(self, train_id: str, tag: str) -> list[dict]:
        """The points MindInsight serves for one of our tags (it appends ``/scalar``)."""
        query = urllib.parse.urlencode({"train_id": train_id, "tag": f"{tag}/scalar"})
        return self.get(f"{API}/scalar/metadata?{query}").get("metadatas", [])
