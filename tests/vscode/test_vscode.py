"""``vscode/``: the files parse, their references resolve, their commands run from a shell."""

import json
import os
import re
import shlex
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest

from msmon_nb.cli import build_parser
from msmon_nb.vscode_init import TEMPLATES, has_comments, parse_jsonc, template_dir
from tests.conftest import ROOT

VSCODE = ROOT / "vscode"


def load(name: str):
    return parse_jsonc((VSCODE / name).read_text())


def tasks_by_label() -> dict:
    return {t["label"]: t for t in load("tasks.json")["tasks"]}


def shell_line(task: dict, project: Path) -> str:
    """The task's command line as VSCode would run it, variables substituted."""
    subst = {
        "${command:python.interpreterPath}": sys.executable,
        "${workspaceFolder}": str(project),
    }

    def fill(text: str) -> str:
        for var, value in subst.items():
            text = text.replace(var, value)
        assert "${" not in text, f"unsubstituted variable in {text!r}"
        return text

    return shlex.join([fill(task["command"]), *(fill(a) for a in task.get("args", []))])


def test_templates_are_the_vscode_dir_and_all_parse():
    assert template_dir() == VSCODE
    for name in TEMPLATES:
        text = (VSCODE / name).read_text()
        assert has_comments(text), f"{name} explains itself"
        assert isinstance(parse_jsonc(text), dict)
    # strings holding comment markers survive; trailing commas are accepted
    assert parse_jsonc('{"a": "http://x/*y*/", /* c */ "b": [1, 2,], // d\n}') == {
        "a": "http://x/*y*/",
        "b": [1, 2],
    }
    with pytest.raises(ValueError):
        parse_jsonc('{"a": 1 /* never closed')


def test_every_reference_resolves():
    tasks = tasks_by_label()
    for task in tasks.values():
        for dep in task.get("dependsOn", []):
            assert dep in tasks, f"{task['label']} depends on missing {dep!r}"
    launch = load("launch.json")["configurations"]
    assert {c["name"] for c in launch} == {"msmon: debug current file", "msmon: debug the demo"}
    for config in launch:
        assert config["preLaunchTask"] in tasks
        assert config["justMyCode"] is False and config["type"] == "debugpy"
    current = next(c for c in launch if c["program" if "program" in c else "name"] == "${file}")
    assert current["request"] == "launch"
    demo = next(c for c in launch if c.get("module"))
    assert demo["module"] == "msmon_nb.cli"
    build_parser().parse_args(demo["args"])  # a valid msmon command line
    prelaunch = tasks["msmon: clean + viewer"]
    assert prelaunch["dependsOrder"] == "sequence"
    assert prelaunch["dependsOn"] == ["msmon: clean old runs", "msmon: viewer"]
    assert "msmon: install Jupyter kernel" in tasks
    kernel = tasks["msmon: install Jupyter kernel"]["args"]
    assert kernel[:4] == ["-m", "msmon_nb.cli", "kernel", "install"]
    settings = load("settings.json")
    assert settings["python.defaultInterpreterPath"] == "${workspaceFolder}/.venv/bin/python"
    assert "%load_ext msmon_nb" in settings["jupyter.runStartupCommands"]
    recommended = load("extensions.json")["recommendations"]
    assert {"ms-python.python", "ms-python.debugpy", "ms-toolsai.jupyter"} <= set(recommended)


def test_clean_task_runs_from_a_shell(tmp_path):
    from msmon_nb.events.writer import EventWriter

    line = shell_line(tasks_by_label()["msmon: clean old runs"], tmp_path)
    first = subprocess.run(line, shell=True, capture_output=True, text=True, timeout=120)
    assert first.returncode == 0 and "nothing to clean" in first.stdout  # fresh project
    with EventWriter(tmp_path / "summary" / "old") as writer:
        writer.add_scalar("train/loss", 1.0, 0)
    old = time.time() - 10 * 86400
    for p in [tmp_path / "summary" / "old", *(tmp_path / "summary" / "old").iterdir()]:
        os.utime(p, (old, old))
    for i in range(11):  # ten newer runs are kept by --keep 10, so add eleven
        with EventWriter(tmp_path / "summary" / f"new{i:02d}") as writer:
            writer.add_scalar("train/loss", 1.0, 0)
    second = subprocess.run(line, shell=True, capture_output=True, text=True, timeout=120)
    assert second.returncode == 0, second.stderr
    assert not (tmp_path / "summary" / "old").exists()
    assert len(list((tmp_path / "summary").iterdir())) == 11


def test_viewer_task_matches_its_problem_matcher_and_serves(tmp_path):
    task = tasks_by_label()["msmon: viewer"]
    assert task["isBackground"] is True
    matcher = task["problemMatcher"]["background"]
    begins, ends = re.compile(matcher["beginsPattern"]), re.compile(matcher["endsPattern"])
    error = re.compile(task["problemMatcher"]["pattern"]["regexp"])
    line = shell_line(task, tmp_path).replace(" --port 8080", " --port 0")
    proc = subprocess.Popen(
        line, shell=True, stdout=subprocess.PIPE, text=True, start_new_session=True
    )
    try:
        seen = []
        for out in proc.stdout:
            seen.append(out.rstrip("\n"))
            if ends.search(seen[-1]):
                break
        assert begins.search(seen[0]), seen
        url = ends.search(seen[-1]).group(2)
        import urllib.request

        with urllib.request.urlopen(url + "api/runs", timeout=10) as resp:
            assert json.load(resp) == []
    finally:
        os.killpg(proc.pid, signal.SIGINT)
        proc.wait(10)
    with socket.socket() as other:  # a port held by some other program: a reported error
        other.bind(("127.0.0.1", 0))
        other.listen()
        port = str(other.getsockname()[1])
        for bad_port, code in ((port, 1), ("-1", 2)):
            clash = subprocess.run(
                [sys.executable, "-m", "msmon_nb.cli", "view", str(tmp_path), "--port", bad_port],
                capture_output=True,
                text=True,
                timeout=60,
            )
            assert clash.returncode == code
            assert error.search(clash.stderr.strip().splitlines()[-1]), clash.stderr


def test_demo_launch_configuration_runs_from_a_shell(tmp_path):
    demo = next(c for c in load("launch.json")["configurations"] if c.get("module"))
    args = [a.replace("${workspaceFolder}", str(tmp_path)) for a in demo["args"]]
    proc = subprocess.run(
        [sys.executable, "-m", demo["module"], *args, "--steps", "15"],
        capture_output=True,
        text=True,
        timeout=300,
        env=dict(os.environ, **demo["env"]),
    )
    assert proc.returncode == 0, proc.stderr
    assert "run written to " + str(tmp_path / "summary") in proc.stdout


def msmon_vscode_init(project: Path):
    return subprocess.run(
        [sys.executable, "-m", "msmon_nb.cli", "vscode", "init", str(project)],
        capture_output=True,
        text=True,
        timeout=60,
    )


def test_init_copies_then_is_idempotent(tmp_path):
    proc = msmon_vscode_init(tmp_path)
    assert proc.returncode == 0, proc.stderr
    for name in TEMPLATES:
        assert (tmp_path / ".vscode" / name).read_text() == (VSCODE / name).read_text()
        assert f"created {tmp_path / '.vscode' / name}" in proc.stdout
    again = msmon_vscode_init(tmp_path)
    assert again.returncode == 0 and again.stdout.count("already has everything") == 4


def test_init_merges_plain_json_and_refuses_commented_files(tmp_path):
    vs = tmp_path / ".vscode"
    vs.mkdir()
    mine = {"version": "2.0.0", "tasks": [{"label": "build", "type": "shell", "command": "make"}]}
    (vs / "tasks.json").write_text(json.dumps(mine))
    (vs / "settings.json").write_text(
        json.dumps({"python.defaultInterpreterPath": "/opt/py/bin/python",
                    "jupyter.runStartupCommands": ["%matplotlib inline"]})
    )  # fmt: skip
    launch_text = '// my launch configs\n{"version": "0.2.0", "configurations": []}\n'
    (vs / "launch.json").write_text(launch_text)
    proc = msmon_vscode_init(tmp_path)
    assert proc.returncode == 1  # launch.json was refused
    tasks = json.loads((vs / "tasks.json").read_text())
    labels = [t["label"] for t in tasks["tasks"]]
    assert labels[0] == "build" and set(tasks_by_label()) <= set(labels)
    settings = json.loads((vs / "settings.json").read_text())
    assert settings["python.defaultInterpreterPath"] == "/opt/py/bin/python"  # theirs kept
    assert settings["jupyter.runStartupCommands"] == ["%matplotlib inline", "%load_ext msmon_nb"]
    assert (vs / "launch.json").read_text() == launch_text
    assert "left" in proc.stdout and "has comments" in proc.stdout
    assert "'msmon: debug current file'" in proc.stdout
    assert (vs / "extensions.json").exists()
