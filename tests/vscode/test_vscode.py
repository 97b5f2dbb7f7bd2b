"""The VSCode templates: they parse, their references resolve, their commands run from a shell.

The packaged ``msmon_nb/vscode_templates/`` is the source of truth (a wheel install reads it);
the repository's ``vscode/`` is a copy for readers and must match it byte for byte.
"""

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
from msmon_nb.vscode_init import TEMPLATE_DIR, TEMPLATES, has_comments, parse_jsonc, template_dir
from tests.conftest import ROOT

VSCODE = ROOT / "msmon_nb" / "vscode_templates"


def load(name: str):
    return parse_jsonc((VSCODE / name).read_text())


def tasks_by_label() -> dict:
    return {t["label"]: t for t in load("tasks.json")["tasks"]}


def inputs(name: str) -> dict:
    """``${input:<id>}`` -> its default, for the inputs ``name`` declares."""
    return {f"${{input:{i['id']}}}": i["default"] for i in load(name).get("inputs", [])}


def fill(text: str, project: Path, file: Path | None = None, extra: dict | None = None) -> str:
    """``text`` with VSCode's variables substituted as it would for ``project``."""
    subst = {
        "${command:python.interpreterPath}": sys.executable,
        "${workspaceFolder}": str(project),
        "${env:PATH}": os.environ.get("PATH", ""),
        **({"${file}": str(file)} if file else {}),
        **(extra or {}),
    }
    for var, value in subst.items():
        text = text.replace(var, value)
    assert "${" not in text, f"unsubstituted variable in {text!r}"
    return text


def shell_line(task: dict, project: Path, file: Path | None = None) -> str:
    """The task's command line as VSCode would run it, variables substituted."""
    extra = inputs("tasks.json")
    if task.get("type") == "shell" and not task.get("args"):  # run by the shell as written
        return fill(task["command"], project, file, extra)
    return shlex.join(
        [fill(task["command"], project, file, extra)]
        + [fill(a, project, file, extra) for a in task.get("args", [])]
    )


def test_repository_vscode_dir_is_the_packaged_templates():
    copy = ROOT / "vscode"
    assert sorted(p.name for p in VSCODE.iterdir()) == sorted(TEMPLATES)
    assert sorted(p.name for p in copy.iterdir()) == sorted(TEMPLATES)
    for name in TEMPLATES:
        assert (copy / name).read_bytes() == (VSCODE / name).read_bytes(), (
            f"vscode/{name} differs from msmon_nb/vscode_templates/{name}, the source of "
            "truth: edit that one, then cp msmon_nb/vscode_templates/*.json vscode/"
        )


def test_templates_are_packaged_and_all_parse():
    assert template_dir() == VSCODE == TEMPLATE_DIR
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
    by_name = {c["name"]: c for c in launch}
    assert set(by_name) == {
        "msmon: debug current file",
        "msmon: debug the demo",
        "msmon: debug current file under msrun",
    }
    for config in launch:
        assert config["preLaunchTask"] in tasks
        assert config["justMyCode"] is False and config["type"] == "debugpy"
    current = next(c for c in launch if c["program" if "program" in c else "name"] == "${file}")
    assert current["request"] == "launch"
    demo = by_name["msmon: debug the demo"]
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
    # application scope in ms-toolsai.jupyter: ignored in a folder's settings (see below)
    assert "jupyter.runStartupCommands" not in settings
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
    assert matcher["activeOnStart"] is True  # VSCode's schema name ("activeBegins" is not)
    assert set(matcher) == {"activeOnStart", "beginsPattern", "endsPattern"}
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
            if code == 2:  # a usage error of the task's own args: argparse's line, no dir
                assert "-1 is not a port" in clash.stderr
                continue
            found = error.search(clash.stderr.strip().splitlines()[-1])
            assert found, clash.stderr
            # the groups VSCode reads (problemMatcher.ts): kind "file" puts the problem on
            # the whole file (no line groups needed), a marker needs a file and a message,
            # severity text goes through Severity.fromValue ("error"/"warning"/"info"), and
            # fileLocation "absolute" takes the file group as the path, unchanged
            pattern = task["problemMatcher"]["pattern"]
            assert pattern["kind"] == "file"
            assert task["problemMatcher"]["fileLocation"] == ["absolute"]
            assert found.group(pattern["severity"]) == "error"
            assert Path(found.group(pattern["file"])) == tmp_path.resolve()
            assert Path(found.group(pattern["file"])).is_absolute()
            assert found.group(pattern["message"]).strip()
            assert {"line", "location", "column"}.isdisjoint(pattern)
            assert "--port" in found.group(pattern["message"])


def launch_config(name: str) -> dict:
    return next(c for c in load("launch.json")["configurations"] if c["name"] == name)


def test_msrun_task_and_launch_preset_are_wired(tmp_path):
    """Inputs declared, clean + viewer first, PATH with this interpreter's bin first."""
    import re as re_

    tasks = tasks_by_label()
    for name, entries in (
        ("tasks.json", tasks.values()),
        ("launch.json", load("launch.json")["configurations"]),
    ):
        used = set(re_.findall(r"\$\{input:(\w+)\}", json.dumps(list(entries))))
        declared = {i["id"] for i in load(name).get("inputs", [])}
        assert used <= declared, f"{name} uses undeclared inputs {used - declared}"
    assert inputs("tasks.json")["${input:msmonWorkers}"] == "2"
    task = tasks["msmon: msrun current file"]
    assert task["dependsOn"] == ["msmon: clean + viewer"]
    line = shell_line(task, tmp_path, tmp_path / "train.py")
    bin_dir = str(Path(sys.executable).parent)
    assert f"PATH=\"$(dirname '{sys.executable}'):$PATH\"" in line
    for flag in (
        "--worker_num=2",
        "--local_worker_num=2",
        "--master_addr=127.0.0.1",
        "--join=True",
    ):
        assert flag in line
    assert line.endswith(f"'{tmp_path / 'train.py'}'") and Path(bin_dir, "msrun").is_file()
    preset = launch_config("msmon: debug current file under msrun")
    assert preset["preLaunchTask"] == "msmon: clean + viewer"
    assert preset["subProcess"] is True and preset["module"] == "mindspore.parallel.cluster.run"
    assert preset["env"]["PATH"].startswith("${workspaceFolder}/.venv/bin:")
    assert preset["args"][-1] == "${file}"
    # msrun's own parser takes the preset's arguments
    args = [fill(a, tmp_path, tmp_path / "train.py", inputs("launch.json")) for a in preset["args"]]
    code = (
        "import sys; sys.argv = ['msrun', *sys.argv[1:]]\n"
        "from mindspore.parallel.cluster.run import get_args\n"
        "a = get_args(); print(a.worker_num, a.local_worker_num, a.master_port, a.join)"
    )
    proc = subprocess.run(
        [sys.executable, "-c", code, *args], capture_output=True, text=True, timeout=120,
        env=dict(os.environ, GLOG_v="3"),
    )  # fmt: skip
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.split()[-4:] == ["2", "2", "8118", "True"]


def test_demo_launch_configuration_runs_from_a_shell(tmp_path):
    demo = launch_config("msmon: debug the demo")
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
                    "files.watcherExclude": {"**/node_modules/**": True}})
    )  # fmt: skip
    launch_text = '// my launch configs\n{"version": "0.2.0", "configurations": []}\n'
    (vs / "launch.json").write_text(launch_text)
    proc = msmon_vscode_init(tmp_path)
    assert proc.returncode == 1  # launch.json was refused
    tasks = json.loads((vs / "tasks.json").read_text())
    labels = [t["label"] for t in tasks["tasks"]]
    assert labels[0] == "build" and set(tasks_by_label()) <= set(labels)
    assert tasks["inputs"] == load("tasks.json")["inputs"]  # what the msrun task prompts for
    assert "input 'msmonWorkers'" in proc.stdout
    settings = json.loads((vs / "settings.json").read_text())
    assert settings["python.defaultInterpreterPath"] == "/opt/py/bin/python"  # theirs kept
    assert settings["files.watcherExclude"] == {"**/node_modules/**": True, "**/summary/**": True}
    assert (vs / "launch.json").read_text() == launch_text
    assert "left" in proc.stdout and "has comments" in proc.stdout
    assert "'msmon: debug current file'" in proc.stdout
    assert (vs / "extensions.json").exists()


TINY_DP = """
from mindspore.communication import get_group_size, get_rank, init
from msmon_nb.monitor import Monitor

init()
with Monitor(save_dir="summary", model_name="tiny") as mon:
    for step in range(5):
        mon.step(loss=1.0 + get_rank(), grad_norm=2.0)
print(f"rank {get_rank()} of {get_group_size()} done", flush=True)
"""
BARE_PATH = "/usr/bin:/bin"  # this venv is not on it: the task and the preset must add it


def run_job(cmd: list[str], cwd: Path, env: dict) -> subprocess.CompletedProcess:
    """Run an msrun job to its end; its whole process group is killed if it hangs."""
    proc = subprocess.Popen(
        cmd, cwd=cwd, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
        start_new_session=True,
    )  # fmt: skip
    try:
        out, _ = proc.communicate(timeout=300)
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait(30)
    return subprocess.CompletedProcess(cmd, proc.returncode, out, "")


def assert_two_rank_run(project: Path, job: subprocess.CompletedProcess) -> None:
    from msmon_nb.events.index import RunIndex
    from msmon_nb.events.runs import load_run

    logs = project / "msrun_logs"
    worker_logs = {p.name: p.read_text()[-1500:] for p in logs.glob("worker_*.log")}
    assert job.returncode == 0, (job.stdout[-2000:], worker_logs)
    assert "rank 1 of 2 done" in worker_logs["worker_1.log"]
    (info,) = RunIndex(project / "summary").scan()  # both ranks in one run, as the viewer lists it
    assert info.ranks == (0, 1)
    assert info.rank_status == {0: "finished", 1: "finished"}
    assert info.rank_last_step == {0: 4, 1: 4}
    run = load_run(info.path)
    assert run.scalars("train/loss", rank=1).values.tolist() == [2.0] * 5
    assert run.merged("train/loss").mean.tolist() == [1.5] * 5


@pytest.mark.slow
def test_msrun_task_runs_the_current_file_as_two_ranks(tmp_path):
    script = tmp_path / "train.py"
    script.write_text(TINY_DP)
    task = tasks_by_label()["msmon: msrun current file"]
    line = shell_line(task, tmp_path, script)
    shell = task["options"]["shell"]
    env = dict(os.environ, PATH=BARE_PATH, **task["options"]["env"])
    cwd = Path(fill(task["options"]["cwd"], tmp_path))
    job = run_job([shell["executable"], *shell["args"], line], cwd, env)
    assert_two_rank_run(tmp_path, job)


@pytest.mark.slow
def test_msrun_launch_preset_runs_from_a_shell(tmp_path):
    (tmp_path / ".venv").symlink_to(Path(sys.executable).parent.parent)  # the project's venv
    script = tmp_path / "train.py"
    script.write_text(TINY_DP)
    preset = launch_config("msmon: debug current file under msrun")
    with socket.socket() as sock:  # not the default 8118: tests may run side by side
        sock.bind(("127.0.0.1", 0))
        port = str(sock.getsockname()[1])
    values = {**inputs("launch.json"), "${input:msmonMasterPort}": port, "${env:PATH}": BARE_PATH}
    args = [fill(a, tmp_path, script, values) for a in preset["args"]]
    env = dict(
        os.environ, **{k: fill(v, tmp_path, script, values) for k, v in preset["env"].items()}
    )
    job = run_job([sys.executable, "-m", preset["module"], *args], tmp_path, env)
    assert_two_rank_run(tmp_path, job)


def test_init_names_the_fix_when_package_data_is_missing(tmp_path, monkeypatch, capsys):
    import msmon_nb.vscode_init as vscode_init

    monkeypatch.setattr(vscode_init, "TEMPLATE_DIR", tmp_path / "lost")
    assert vscode_init.init(tmp_path / "project") == 1
    err = capsys.readouterr().err
    assert "tasks.json" in err and "reinstall" in err and "pip install -e" not in err
    assert not (tmp_path / "project").exists()


# Where a setting may be set (VS Code's ConfigurationScope): a folder's .vscode/settings.json
# applies only these; "application" and "machine" ones are user settings.
FOLDER_SCOPES = {"window", "resource", "language-overridable", "machine-overridable"}


def test_preset_settings_of_extensions_apply_in_a_folder():
    """Each extension setting the preset sets has a scope a folder's settings may set, per
    the extension's own manifest (copied verbatim into tests/vscode/python_stub/package.json,
    which test_code_server.py also installs into VS Code): jupyter.runStartupCommands
    (application scope) was set here and silently ignored; VS Code itself marks it "can be
    set only in the user settings file"."""
    stub = json.loads((ROOT / "tests" / "vscode" / "python_stub" / "package.json").read_text())
    declared = {
        key: spec
        for part in stub["contributes"]["configuration"]
        for key, spec in part["properties"].items()
    }
    assert declared["jupyter.runStartupCommands"]["scope"] == "application"  # why it went
    settings = load("settings.json")
    ours = [key for key in settings if key.split(".")[0] in ("python", "jupyter")]
    assert ours  # the interpreter path at least
    for key in ours:
        assert key in declared, f"{key}: copy its declaration from the extension's package.json"
        scope = declared[key].get("scope", "window")
        assert scope in FOLDER_SCOPES, f"{key} has scope {scope}: a folder cannot set it"
