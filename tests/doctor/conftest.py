"""Real environments for ``msmon doctor``: a numpy-2 venv, a read-only mount, a project dir.

The numpy-2 venv reuses this venv's packages instead of downloading MindSpore again: a
``.pth`` file runs ``site.addsitedir`` on our site-packages (so its own ``.pth`` files,
the editable msmon_nb among them, are processed too), and paths added that way come
after the new venv's own site-packages, where numpy 2 is installed. It is built once per
test session.
"""

from __future__ import annotations

import os
import subprocess
import sys
import sysconfig
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.support.envs import clean_env


@pytest.fixture(scope="session")
def numpy2_python(tmp_path_factory) -> Path:
    """A real venv whose numpy is 2.x and whose everything else is this venv's."""
    venv = tmp_path_factory.mktemp("numpy2_venv")
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(venv)], check=True)
    python = venv / "bin" / "python"
    shared = sysconfig.get_paths()["purelib"]
    own = subprocess.run(
        [str(python), "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"],
        capture_output=True,
        text=True,
        check=True,
    ).stdout.strip()
    (Path(own) / "_msmon_shared.pth").write_text(f"import site; site.addsitedir({shared!r})\n")
    install = subprocess.run(
        [sys.executable, "-m", "pip", "--python", str(python), "install", "-q", "numpy>=2"],
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert install.returncode == 0, install.stderr
    version = subprocess.run(
        [str(python), "-c", "import numpy, msmon_nb; print(numpy.__version__)"],
        capture_output=True,
        text=True,
        cwd=venv,
        env=clean_env(),
    )
    assert version.stdout.startswith("2."), (version.stdout, version.stderr)
    return python


@pytest.fixture
def project(tmp_path) -> Path:
    path = tmp_path / "project"
    path.mkdir()
    return path


@pytest.fixture
def readonly_dir(tmp_path) -> Iterator[Path]:
    """A tmpfs mounted read-only: as root, permission bits would not stop a write."""
    if os.geteuid() != 0:
        pytest.skip("mounting a read-only tmpfs needs root (CI runs as root)")
    path = tmp_path / "ro"
    path.mkdir()
    subprocess.run(["mount", "-t", "tmpfs", "-o", "size=1m", "tmpfs", str(path)], check=True)
    try:
        subprocess.run(["mount", "-o", "remount,ro", str(path)], check=True)
        yield path
    finally:
        subprocess.run(["umount", str(path)], check=True)
