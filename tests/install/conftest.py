"""The wheel job (``.ci/wheel_job``): msmon_nb as a user gets it, from its wheel, in a new venv.

``make test`` skips these (``MSMON_WHEEL_JOB`` unset): they build the wheel, install it with
its dependencies (MindSpore's 800 MB wheel comes from pip's cache after the first run) and
use it for a minute or two. ``MSMON_WHEEL_PYTHON=/path/to/python3.X`` builds the venv on
another interpreter (how the Python range in docs/guide/setup.md was checked).
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import time
import zipfile
from dataclasses import dataclass
from pathlib import Path

import pytest

from tests.conftest import ROOT

HERE = Path(__file__).resolve().parent
TIMINGS: dict[str, float] = {}
INSTALLED: list[str] = []  # what the fresh venv got: its Python and the key dependencies
# not part of a build: caches, venvs, VCS, earlier build output
_NOT_SOURCE = shutil.ignore_patterns(
    ".git", ".venv*", "build", "dist", "*.egg-info", "__pycache__", "*.pyc", ".pytest_cache",
    ".ruff_cache", ".hypothesis", "node_modules", "summary",
)  # fmt: skip


def pytest_collection_modifyitems(config, items):
    if os.environ.get("MSMON_WHEEL_JOB") == "1":
        return
    skip = pytest.mark.skip(reason="the wheel job runs these: .ci/wheel_job")
    for item in items:
        if item.path.is_relative_to(HERE):
            item.add_marker(skip)


def pytest_terminal_summary(terminalreporter):
    if INSTALLED:
        terminalreporter.write_sep("-", "fresh venv")
        terminalreporter.write_line(" ".join(INSTALLED))
    if TIMINGS:
        terminalreporter.write_sep("-", "wheel job timings")
        for name, seconds in TIMINGS.items():
            terminalreporter.write_line(f"{name:<40} {seconds:6.1f} s")


def timed(name: str, cmd: list[str], **kw) -> subprocess.CompletedProcess:
    """Run ``cmd``, record how long it took, raise with its output when it fails."""
    started = time.perf_counter()
    proc = subprocess.run(cmd, capture_output=True, text=True, **kw)
    TIMINGS[name] = time.perf_counter() - started
    if proc.returncode != 0:
        raise AssertionError(f"{cmd} exited {proc.returncode}\n{proc.stdout}\n{proc.stderr}")
    return proc


@pytest.fixture(scope="session")
def wheel(tmp_path_factory) -> Path:
    """The wheel `pip wheel .` builds from a copy of this tree (the shared tree stays clean)."""
    src = tmp_path_factory.mktemp("src") / "msmon_nb_src"
    shutil.copytree(ROOT, src, ignore=_NOT_SOURCE, symlinks=True)
    out = tmp_path_factory.mktemp("wheelhouse")
    timed("pip wheel --no-deps .", [sys.executable, "-m", "pip", "wheel", "--no-deps", "-q",
                                   str(src), "-w", str(out)], timeout=600)  # fmt: skip
    (built,) = out.glob("msmon_nb-*.whl")
    with zipfile.ZipFile(built) as zf:
        assert zf.testzip() is None
    return built


@dataclass(frozen=True)
class Venv:
    """A fresh venv holding the wheel, and how to run its commands outside the source tree."""

    prefix: Path
    work: Path  # the cwd of every command: outside the source tree
    env: dict[str, str]

    @property
    def python(self) -> Path:
        return self.prefix / "bin" / "python"

    def run(self, name: str, *args: str, timeout: float = 300, **kw):
        exe = self.prefix / "bin" / args[0]
        return timed(name, [str(exe), *args[1:]], cwd=kw.pop("cwd", self.work), env=self.env,
                     timeout=timeout, **kw)  # fmt: skip


@pytest.fixture(scope="session")
def venv(tmp_path_factory, wheel) -> Venv:
    base = os.environ.get("MSMON_WHEEL_PYTHON") or sys._base_executable
    prefix = tmp_path_factory.mktemp("venv") / "fresh"
    # no --system-site-packages: only what the wheel's dependencies bring
    timed("python -m venv", [base, "-m", "venv", "--without-pip", str(prefix)], timeout=120)
    # this venv's pip installs into it (--python), so both share pip's download cache
    timed(
        "pip install <wheel> (deps from pip cache)",
        [sys.executable, "-m", "pip", "--python", str(prefix / "bin" / "python"), "install",
         "-q", str(wheel)],
        timeout=900,
    )  # fmt: skip
    versions = subprocess.run(
        [str(prefix / "bin" / "python"), "-c",
         "import sys, importlib.metadata as md; print('python', sys.version.split()[0], *("
         "f'{n} {md.version(n)}' for n in ('msmon_nb', 'mindspore', 'numpy', 'ipykernel')))"],
        capture_output=True, text=True, check=True, timeout=60,
    )  # fmt: skip
    INSTALLED[:] = [versions.stdout.strip()]
    work = tmp_path_factory.mktemp("work")
    assert not work.resolve().is_relative_to(ROOT)
    bin_dir = str(Path(sys.executable).parent)
    path = [p for p in os.environ.get("PATH", "").split(os.pathsep) if p and p != bin_dir]
    env = {k: v for k, v in os.environ.items() if not k.startswith(("PYTHON", "VIRTUAL_ENV"))}
    env.update(
        PATH=os.pathsep.join([str(prefix / "bin"), *path]),
        VIRTUAL_ENV=str(prefix),
        GLOG_v="3",
        PYTHONNOUSERSITE="1",
        JUPYTER_DATA_DIR=str(tmp_path_factory.mktemp("jupyter_data")),
        JUPYTER_CONFIG_DIR=str(tmp_path_factory.mktemp("jupyter_config")),
        IPYTHONDIR=str(tmp_path_factory.mktemp("ipython")),
        MPLBACKEND="Agg",
    )
    return Venv(prefix, work, env)
