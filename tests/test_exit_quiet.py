"""The test log ends on pytest's summary (issue 36): the filter for MindSpore's exit-time
``Cell.__del__`` error must still be the unraisable hook when the interpreter exits, after
pytest's own plugin has put back the hook it found (it did not, at first: the wall came
back whenever cells outlived a session)."""

import subprocess
import sys

from tests.conftest import ROOT

PROBE = """import atexit
import sys

import mindspore.nn.cell  # noqa: F401

atexit.register(lambda: print("hook at exit:", getattr(sys.unraisablehook, "__name__", "?")))


def test_nothing():
    pass
"""


def test_the_exit_filter_is_the_hook_at_interpreter_exit(tmp_path):
    probe = ROOT / "tests" / f"test_zz_exit_probe_{tmp_path.name}.py"
    probe.write_text(PROBE)
    try:
        out = subprocess.run(
            [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", str(probe)],
            cwd=ROOT,
            capture_output=True,
            text=True,
            timeout=120,
        ).stdout
    finally:
        probe.unlink()
    assert "hook at exit: quiet" in out, out[-2000:]
