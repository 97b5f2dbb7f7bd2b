"""``msmon clean`` on a real tree: what goes, what stays, and why."""

import json
import os
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest

from msmon_nb.clean import parse_age
from msmon_nb.events.writer import EventWriter
from msmon_nb.rundir import MARKER

DAY = 86400
OLD = time.time() - 5 * DAY


def msmon_clean(*args, stdin=None):
    return subprocess.run(
        [sys.executable, "-m", "msmon_nb.cli", "clean", *map(str, args)],
        capture_output=True,
        text=True,
        input=stdin,
        timeout=120,
        env=dict(os.environ, GLOG_v="3"),
    )


def make_run(path: Path, steps: int = 20, age: float | None = None, marker=None) -> int:
    """A run written by our writer; returns its size in bytes."""
    with EventWriter(path) as writer:
        for step in range(steps):
            writer.add_scalars(step, {"train/loss": 1.0})
    if marker is not None:
        (path / MARKER).write_text(json.dumps(marker))
    if age is not None:
        age_tree(path, age)
    return tree_size(path)


def age_tree(path: Path, when: float) -> None:
    for p in [path, *path.rglob("*")]:
        os.utime(p, (when, when), follow_symlinks=False)


def tree_size(path: Path) -> int:
    return sum(p.lstat().st_size for p in path.rglob("*") if not p.is_dir())


@pytest.fixture
def tree(tmp_path):
    """A base dir with every kind of neighbour, plus a sleeping process to be 'alive'."""
    base = tmp_path / "summary"
    sizes = {}
    sizes["old"] = make_run(base / "old", age=OLD)
    sizes["nested/deep_old"] = make_run(base / "nested" / "deep_old", age=OLD)
    sizes["new"] = make_run(base / "new")
    finished = {"status": "finished", "pid": 1, "host": socket.gethostname()}
    sizes["old_finished"] = make_run(base / "old_finished", age=OLD, marker=finished)
    (base / "notes").mkdir()
    (base / "notes" / "todo.txt").write_text("not a run")
    age_tree(base / "notes", OLD)
    make_run(base / "mixed", age=OLD)
    (base / "mixed" / "train.py").write_text("print('my code')")
    age_tree(base / "mixed", OLD)
    sleeper = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(120)"])
    alive = {"status": "running", "pid": sleeper.pid, "host": socket.gethostname()}
    sizes["alive"] = make_run(base / "alive", age=OLD, marker=alive)
    outside = tmp_path / "elsewhere" / "precious_run"
    make_run(outside, age=OLD)
    (base / "link_to_outside").symlink_to(outside)
    yield base, sizes, outside
    sleeper.kill()
    sleeper.wait()


def test_old_runs_removed_everything_else_kept(tree):
    base, sizes, outside = tree
    proc = msmon_clean(base, "--older-than", "3d", "--yes")
    assert proc.returncode == 0, proc.stderr
    remaining = sorted(p.relative_to(base).as_posix() for p in base.iterdir())
    assert remaining == ["alive", "link_to_outside", "mixed", "nested", "new", "notes"]
    assert not (base / "nested" / "deep_old").exists()
    assert (base / "nested").is_dir()  # only the run dir goes, not its parents
    assert (outside / MARKER).exists() or any(outside.iterdir())
    assert (base / "mixed" / "train.py").exists() and (base / "notes" / "todo.txt").exists()
    out = proc.stdout
    for name in ("old", "nested/deep_old", "old_finished"):
        assert f"removed {name} (" in out
    assert "kept alive: running (marker pid" in out and "--force" in out
    assert "kept mixed: holds files no run writes (train.py)" in out
    freed = sizes["old"] + sizes["nested/deep_old"] + sizes["old_finished"]
    assert f"({freed} bytes)" in out
    assert base.is_dir()


def test_no_filter_means_every_run_but_the_safety_rules_hold(tree):
    """`msmon clean BASE` replaces `rm -rf BASE`: every run goes, nothing else does."""
    base, _, outside = tree
    proc = msmon_clean(base, stdin="n\n")  # asks first; "n" deletes nothing
    assert proc.returncode == 1 and "every run under" in proc.stdout
    assert (base / "old").exists()
    proc = msmon_clean(base, "--yes")
    assert proc.returncode == 0, proc.stderr
    remaining = sorted(p.relative_to(base).as_posix() for p in base.iterdir())
    # `new` has no marker and was written seconds ago: it may still be written to
    assert remaining == ["alive", "link_to_outside", "mixed", "nested", "new", "notes"]
    assert any(outside.iterdir()) and base.is_dir()


def test_force_removes_a_live_run_but_never_unknown_files(tree):
    base, _, _ = tree
    proc = msmon_clean(base, "--older-than", "3d", "--yes", "--force")
    assert proc.returncode == 0, proc.stderr
    assert not (base / "alive").exists()
    assert (base / "mixed" / "train.py").exists()


def test_dry_run_deletes_nothing(tree):
    base, sizes, _ = tree
    before = sorted(str(p) for p in base.rglob("*"))
    proc = msmon_clean(base, "--older-than", "3d", "--dry-run")
    assert proc.returncode == 0
    assert sorted(str(p) for p in base.rglob("*")) == before
    assert "would remove old (" in proc.stdout and "nothing deleted" in proc.stdout
    total = sizes["old"] + sizes["nested/deep_old"] + sizes["old_finished"]
    assert "would free" in proc.stdout and f"({total} bytes)" in proc.stdout


def test_keep_n_keeps_the_newest(tmp_path):
    base = tmp_path / "b"
    for i in range(5):
        make_run(base / f"run{i}", age=time.time() - (10 - i) * 60)  # run4 newest
    proc = msmon_clean(base, "--keep", "2", "--yes")
    assert proc.returncode == 0, proc.stderr
    assert sorted(p.name for p in base.iterdir()) == ["run3", "run4"]


def test_keep_and_older_than_combine(tmp_path):
    base = tmp_path / "b"
    make_run(base / "ancient", age=OLD)
    make_run(base / "old_but_newest", age=OLD + DAY)
    make_run(base / "fresh")
    proc = msmon_clean(base, "--keep", "1", "--older-than", "10d", "--yes")
    assert proc.returncode == 0  # beyond the newest one, but none is 10 days old
    assert sorted(p.name for p in base.iterdir()) == ["ancient", "fresh", "old_but_newest"]
    proc = msmon_clean(base, "--keep", "2", "--older-than", "1d", "--yes")
    assert proc.returncode == 0
    assert sorted(p.name for p in base.iterdir()) == ["fresh", "old_but_newest"]


def test_asks_unless_yes(tree):
    base, _, _ = tree
    proc = msmon_clean(base, "--older-than", "3d", stdin="n\n")
    assert proc.returncode == 1 and "nothing deleted" in proc.stdout
    assert (base / "old").exists()
    proc = msmon_clean(base, "--older-than", "3d", stdin="")  # no terminal, no answer
    assert proc.returncode == 1 and (base / "old").exists()
    proc = msmon_clean(base, "--older-than", "3d", stdin="y\n")
    assert proc.returncode == 0 and not (base / "old").exists()
    assert "remove 3 runs" in proc.stdout


def test_base_itself_never_deleted_even_when_a_run(tmp_path):
    base = tmp_path / "run_as_base"
    make_run(base, age=OLD)
    proc = msmon_clean(base, "--older-than", "1s", "--yes")
    assert proc.returncode == 0
    assert base.is_dir() and any(base.iterdir())
    assert "nothing to remove" in proc.stdout


def test_base_given_through_a_symlink_and_link_inside_pointing_out(tmp_path):
    real = tmp_path / "real_base"
    make_run(real / "old", age=OLD)
    outside = tmp_path / "outside_run"
    make_run(outside, age=OLD)
    (real / "alias").symlink_to(outside)
    link = tmp_path / "summary_link"
    link.symlink_to(real)
    proc = msmon_clean(link, "--older-than", "3d", "--yes")
    assert proc.returncode == 0, proc.stderr
    assert not (real / "old").exists()
    assert (real / "alias").is_symlink() and any(outside.iterdir())
    assert link.is_symlink()


def test_run_held_open_by_a_process_is_kept(tmp_path):
    base = tmp_path / "b"
    make_run(base / "held", age=OLD)
    (summary,) = (base / "held").glob("*summary*")
    holder = subprocess.Popen(
        [sys.executable, "-c", "import sys, time; f = open(sys.argv[1], 'rb'); "
         "print('open', flush=True); time.sleep(60)", str(summary)],
        stdout=subprocess.PIPE, text=True,
    )  # fmt: skip
    try:
        assert holder.stdout.readline().strip() == "open"
        proc = msmon_clean(base, "--older-than", "3d", "--yes")
        assert (base / "held").exists()
        assert f"kept held: open by process {holder.pid}" in proc.stdout
    finally:
        holder.kill()
        holder.wait()


def test_recent_run_without_marker_counts_as_live(tmp_path):
    base = tmp_path / "b"
    make_run(base / "just_written")
    proc = msmon_clean(base, "--keep", "0", "--yes")
    assert (base / "just_written").exists()
    assert "written" in proc.stdout and "no marker" in proc.stdout


def test_arguments_checked(tmp_path):
    proc = msmon_clean(tmp_path, "--older-than", "3 days")
    assert proc.returncode == 2 and "e.g. 3d" in proc.stderr
    proc = msmon_clean(tmp_path / "missing", "--keep", "3")
    assert proc.returncode == 0 and "does not exist" in proc.stdout
    assert parse_age("3d") == 3 * DAY and parse_age("12h") == 12 * 3600
    assert parse_age("1.5w") == 1.5 * 7 * DAY
