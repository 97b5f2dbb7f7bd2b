"""``msmon ctl``'s exit codes: one table, the same in the guide and in ``--help``, and the
codes it names are the ones the command returns (the acknowledgement cases run with real
monitors in ``tests/monitor/test_ctl.py`` and ``tests/distributed/test_rank_dirs.py``)."""

from __future__ import annotations

import subprocess
import sys

from msmon_nb.cli import CTL_EXIT_CODES
from tests.conftest import ROOT


def msmon_ctl(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-m", "msmon_nb.cli", "ctl", *args],
        capture_output=True, text=True, timeout=60, cwd=ROOT,
    )  # fmt: skip


def guide_table() -> list[tuple[str, str]]:
    """The rows of the exit-code table under the viewer page's ``msmon ctl`` heading."""
    text = (ROOT / "docs" / "guide" / "viewer.md").read_text()
    section = text[text.index("## `msmon ctl`") :]
    section = section[: section.index("\n## ")]
    rows = [line for line in section.splitlines() if line.startswith("| ")]
    assert rows[0] == "| exit | when |", rows
    return [tuple(cell.strip() for cell in row.strip("|").split("|")) for row in rows[1:]]


def test_guide_and_help_say_the_same_exit_codes():
    assert [code for code, _ in CTL_EXIT_CODES] == ["0", "1", "2"]
    assert guide_table() == list(CTL_EXIT_CODES)
    shown = msmon_ctl("--help")
    assert shown.returncode == 0
    epilog = shown.stdout[shown.stdout.index("exit codes:") :]
    words = " ".join(epilog.split())
    for code, when in CTL_EXIT_CODES:
        assert f"{code} {when}" in words, (code, epilog)


def test_usage_errors_exit_2_and_refusals_exit_1(tmp_path):
    for args, words in (
        ((str(tmp_path), "jump"), "invalid choice: 'jump'"),
        ((), "the following arguments are required"),
    ):
        done = msmon_ctl(*args)
        assert done.returncode == 2 and words in done.stderr, done.stderr
    done = msmon_ctl(str(tmp_path), "freq", "0")  # parsed, then refused: not usage
    assert done.returncode == 1 and "freq needs a whole number" in done.stderr
    done = msmon_ctl(str(tmp_path), "pause")
    assert done.returncode == 1 and "not a run written by msmon_nb" in done.stderr
