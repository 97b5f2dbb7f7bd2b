"""``msmon view`` and ``msmon demo`` as a user runs them: ready lines, port clashes, Ctrl-C."""

import json
import os
import re
import signal
import socket
import subprocess
import urllib.request
from pathlib import Path

import psutil
import pytest

from msmon_nb.events.writer import EventWriter
from tests.viewer.conftest import msmon_cmd

READY = re.compile(r"^msmon view: (serving|already serving) (.*) at (http://\S+)$")


def start_view(*args, cwd=None) -> tuple[subprocess.Popen, str, list[str]]:
    """Start ``msmon view`` and read until its ready line; (process, url, lines)."""
    proc = subprocess.Popen(
        msmon_cmd("view", *args),
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        cwd=cwd,
        env=dict(os.environ, GLOG_v="3"),
    )
    lines = []
    for line in proc.stdout:
        lines.append(line.rstrip("\n"))
        if m := READY.match(lines[-1]):
            return proc, m.group(3), lines
    raise AssertionError(f"no ready line: {lines} {proc.stderr.read()}")


def stop(proc: subprocess.Popen) -> tuple[int, str]:
    proc.send_signal(signal.SIGINT)
    out, _ = proc.communicate(timeout=10)
    return proc.returncode, out


@pytest.fixture
def base(tmp_path):
    with EventWriter(tmp_path / "run1") as writer:
        for step in range(5):
            writer.add_scalars(step, {"train/loss": 1.0})
    return tmp_path


def test_view_prints_ready_line_binds_loopback_and_stops_on_ctrl_c(base):
    proc, url, lines = start_view(str(base), "--port", "0")
    try:
        assert lines[0] == f"msmon view: starting on {base.resolve()}"
        assert url.startswith("http://127.0.0.1:")
        process = psutil.Process(proc.pid)
        connections = getattr(process, "net_connections", process.connections)  # psutil < 6
        listening = [c.laddr for c in connections(kind="inet") if c.status == psutil.CONN_LISTEN]
        assert listening and all(addr.ip == "127.0.0.1" for addr in listening)
        with urllib.request.urlopen(url + "api/runs", timeout=10) as resp:
            assert [r["name"] for r in json.load(resp)] == ["run1"]
    finally:
        code, out = stop(proc)
    assert code == 0 and "msmon view: stopped" in out


def test_second_view_of_same_base_reuses_it_other_base_fails(base, tmp_path_factory):
    proc, url, _ = start_view(str(base), "--port", "0")
    port = url.rsplit(":", 1)[1].strip("/")
    try:
        again = subprocess.run(
            msmon_cmd("view", str(base), "--port", port), capture_output=True, text=True, timeout=60
        )
        assert again.returncode == 0
        assert f"msmon view: already serving {base.resolve()} at {url}" in again.stdout
        other = tmp_path_factory.mktemp("other")
        clash = subprocess.run(
            msmon_cmd("view", str(other), "--port", port),
            capture_output=True,
            text=True,
            timeout=60,
        )
        assert clash.returncode == 1
        assert "msmon view: error: cannot listen" in clash.stderr and "--port" in clash.stderr
    finally:
        stop(proc)


def test_view_of_missing_base_waits_for_runs(tmp_path):
    proc, url, lines = start_view(str(tmp_path / "summary"), "--port", "0")
    try:
        assert any("does not exist yet" in line for line in lines)
        with EventWriter(tmp_path / "summary" / "late") as writer:
            writer.add_scalar("train/loss", 1.0, 0)
        with urllib.request.urlopen(url + "api/runs", timeout=10) as resp:
            assert [r["name"] for r in json.load(resp)] == ["late"]
    finally:
        stop(proc)


def test_demo_ends_serving_its_run_until_ctrl_c(tmp_path):
    with socket.socket() as sock:  # whether 8080 is free or not, demo must find a port
        proc = subprocess.Popen(
            msmon_cmd("demo", "--steps", "12", "--dir", str(tmp_path)),
            stdout=subprocess.PIPE,
            text=True,
            env=dict(os.environ, GLOG_v="3"),
        )
        sock.close()
        lines = []
        for line in proc.stdout:
            lines.append(line.rstrip("\n"))
            if READY.match(lines[-1]):
                break
        try:
            url = READY.match(lines[-1]).group(3)
            assert any(line.startswith("run written to") for line in lines)
            with urllib.request.urlopen(url + "api/runs", timeout=10) as resp:
                runs = json.load(resp)
            assert len(runs) == 1 and runs[0]["last_step"] == 11
            assert "train/grad_norm" in runs[0]["tags"]
            assert proc.poll() is None  # still serving
        finally:
            code, _ = stop(proc)
        assert code == 0


def test_view_with_a_chart_file_missing_says_how_to_fix(tmp_path):
    """An install that lost msmon_nb/static/chart.js (a copy of the package without it)."""
    import shutil

    import msmon_nb

    copy = tmp_path / "site" / "msmon_nb"
    shutil.copytree(Path(msmon_nb.__file__).parent, copy)
    (copy / "static" / "chart.js").unlink()
    proc = subprocess.run(
        msmon_cmd("view", str(tmp_path), "--port", "0"),
        capture_output=True,
        text=True,
        timeout=60,
        env=dict(os.environ, PYTHONPATH=str(tmp_path / "site")),
        cwd=tmp_path,
    )
    assert proc.returncode == 1, proc.stderr
    assert "msmon view: error:" in proc.stderr and "chart.js is missing" in proc.stderr
    assert "pip install --force-reinstall msmon_nb" in proc.stderr
    assert "Traceback" not in proc.stderr
