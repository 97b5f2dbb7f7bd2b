"""Shared test setup: quiet MindSpore, and helpers that run real subprocesses."""

from __future__ import annotations

import atexit
import importlib.util
import os
import subprocess
import sys
from pathlib import Path

os.environ.setdefault("GLOG_v", "3")  # silence MindSpore's [WARNING] lines

import pytest

ROOT = Path(__file__).resolve().parent.parent

# tests/mindnlp needs MindNLP 0.5.1, which pins MindSpore 2.7.0: it runs in the venv of
# .ci/mindnlp_job, not beside the other tests (whose MindSpore is 2.10)
collect_ignore = [] if importlib.util.find_spec("mindnlp") else ["mindnlp"]


def run_python(code: str, *args: str, timeout: float = 300, check: bool = True, **kw):
    """Run ``code`` in a fresh interpreter of this venv; returns the CompletedProcess."""
    env = dict(os.environ, GLOG_v="3", PYTHONUNBUFFERED="1")
    env.update(kw.pop("env", {}))
    proc = subprocess.run(
        [sys.executable, "-c", code, *args],
        capture_output=True,
        text=True,
        timeout=timeout,
        env=env,
        cwd=kw.pop("cwd", ROOT),
        **kw,
    )
    if check and proc.returncode != 0:
        raise AssertionError(
            f"subprocess failed ({proc.returncode})\nstdout:\n{proc.stdout}\nstderr:\n{proc.stderr}"
        )
    return proc


def run_msmon(*args: str, timeout: float = 60) -> subprocess.CompletedProcess:
    """``msmon ARGS...`` of this checkout in a fresh interpreter (text output captured)."""
    return subprocess.run(
        [sys.executable, "-m", "msmon_nb.cli", *args],
        capture_output=True,
        text=True,
        timeout=timeout,
        cwd=ROOT,
    )


@pytest.fixture
def python():
    """The ``run_python`` helper as a fixture."""
    return run_python


def pytest_sessionfinish(session, exitstatus):
    """Release what can be released, and keep MindSpore's exit-time ``Cell.__del__``
    errors out of the log.

    Cells still alive when the interpreter exits are deleted after the globals of
    ``mindspore.nn.cell`` were cleared, so ``Cell.__del__`` (``Cell.total_instance_count
    -= 1``) raises ``AttributeError: 'NoneType' object has no attribute
    'total_instance_count'`` for each: ~300-1,200 five-line "Exception ignored in" blocks
    after pytest's summary, which then reads as a failure. Only that one message, from
    that one method, is dropped, and only in this test process; every other exception
    ignored at exit is printed as before."""
    import gc

    gc.collect()
    cell = sys.modules.get("mindspore.nn.cell")
    if cell is None:
        return

    # defaults, not globals: at interpreter exit this module's globals are gone too
    def quiet(unraisable, _default=sys.unraisablehook, _del=cell.Cell.__del__, _err=AttributeError):
        if (
            unraisable.exc_type is _err
            and unraisable.object is _del
            and "total_instance_count" in str(unraisable.exc_value)
        ):
            return
        _default(unraisable)

    # set at exit, not now: pytest's own unraisable-exception plugin puts back the hook it
    # found when it cleans up after the session, which is after every hook of ours
    atexit.register(setattr, sys, "unraisablehook", quiet)


@pytest.fixture(autouse=True)
def _execution_mode_restored():
    """Every test ends in PyNative mode (MindSpore's default) unless it began in another:
    a test, or a bench function it calls, that switches to graph mode and does not
    switch back would otherwise hand graph mode to the tests after it (seen: a PyNative
    ``value_and_grad`` over a lambda then fails to parse)."""
    ms = sys.modules.get("mindspore")
    before = ms.get_context("mode") if ms is not None else None
    yield
    ms = sys.modules.get("mindspore")
    if ms is None:
        return
    target = ms.PYNATIVE_MODE if before is None else before
    if ms.get_context("mode") != target:
        ms.set_context(mode=target)
