"""The checks one by one, in this process: kernels, VSCode settings, base dir, report."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from msmon_nb import doctor
from msmon_nb.doctor import (
    FAIL,
    INFO,
    OK,
    WARN,
    Check,
    Report,
    check_base_dir,
    check_kernel,
    check_vscode,
    numpy_problem,
    quick_facts,
    same_interpreter,
)


@pytest.fixture
def jupyter_data(tmp_path, monkeypatch) -> Path:
    """An empty user Jupyter dir: kernels registered elsewhere by a developer stay out."""
    path = tmp_path / "jupyter"
    monkeypatch.setenv("JUPYTER_DATA_DIR", str(path))
    monkeypatch.delenv("JUPYTER_PATH", raising=False)
    return path


def add_kernel(data_dir: Path, name: str, argv0: str) -> None:
    spec = data_dir / "kernels" / name
    spec.mkdir(parents=True)
    argv = [argv0, "-m", "ipykernel_launcher", "-f", "{connection_file}"]
    (spec / "kernel.json").write_text(json.dumps({"argv": argv, "display_name": name}))


def test_no_kernel_for_this_interpreter(jupyter_data):
    add_kernel(jupyter_data, "base", str(Path(sys.base_prefix) / "bin" / "python3"))
    add_kernel(jupyter_data, "bare", "python3")  # outside this env: runs someone else's python
    result = check_kernel()
    assert result.status == WARN
    assert result.fix == "msmon kernel install"
    assert sys.executable in result.detail
    assert result.facts["kernels"] == []


def test_kernel_for_this_interpreter(jupyter_data):
    add_kernel(jupyter_data, "other", "/usr/bin/python3")
    add_kernel(jupyter_data, "mine", sys.executable)
    result = check_kernel()
    assert result.status == OK
    assert result.facts["kernels"] == ["mine"]


def test_kernel_by_its_sibling_name(jupyter_data):
    sibling = Path(sys.executable).with_name(f"python{sys.version_info[0]}")
    assert sibling.exists()
    add_kernel(jupyter_data, "sib", str(sibling))
    assert check_kernel().facts["kernels"] == ["sib"]


def test_same_interpreter_does_not_follow_the_venv_link(tmp_path):
    exe = Path(sys.executable)
    assert same_interpreter(exe)
    assert same_interpreter(exe.with_name("python3"))
    # another venv's bin/python links to the same base binary, yet is another environment
    other = tmp_path / "bin" / "python"
    other.parent.mkdir()
    other.symlink_to(exe.resolve())
    assert not same_interpreter(other)
    assert not same_interpreter("python")
    # a symlinked project dir still reaches this venv
    link = tmp_path / "venv_link"
    link.symlink_to(Path(sys.prefix))
    assert same_interpreter(link / "bin" / "python")


def write_settings(project: Path, text: str) -> None:
    (project / ".vscode").mkdir(exist_ok=True)
    (project / ".vscode" / "settings.json").write_text(text)


def test_vscode_missing_file_is_info(project):
    result = check_vscode(project)
    assert result.status == INFO
    assert "settings.json" in result.value
    assert sys.executable in result.fix  # project/.venv is not this interpreter


def test_vscode_init_is_the_fix_for_a_project_venv(project):
    (project / ".venv").symlink_to(Path(sys.prefix))
    assert check_vscode(project).fix == f"msmon vscode init {project}"


def test_vscode_points_here_with_comments_and_variables(project):
    (project / ".venv").symlink_to(Path(sys.prefix))
    write_settings(
        project,
        '// interpreter\n{\n  /* "python.defaultInterpreterPath": "/nowhere" */\n'
        '  "python.defaultInterpreterPath": "${workspaceFolder}/.venv/bin/python", // here\n'
        '  "url": "http://example.invalid/x",\n}\n',
    )
    result = check_vscode(project)
    assert result.status == OK, result
    assert result.facts["vscode_interpreter"] == str(project / ".venv" / "bin" / "python")


def test_vscode_relative_path_is_from_the_project(project):
    (project / "env").symlink_to(Path(sys.prefix))
    write_settings(project, '{"python.defaultInterpreterPath": "env/bin/python"}')
    assert check_vscode(project).status == OK


def test_vscode_mismatch_is_a_warning_with_the_fix(project):
    write_settings(project, '{"python.defaultInterpreterPath": "/usr/bin/python3"}')
    result = check_vscode(project)
    assert result.status == WARN
    assert "/usr/bin/python3" in result.detail
    assert f'"python.defaultInterpreterPath": "{sys.executable}"' in result.fix


def test_vscode_unset_and_broken(project):
    write_settings(project, '{"editor.tabSize": 4}')
    assert check_vscode(project).status == INFO
    write_settings(project, '{"python.defaultInterpreterPath": ')
    assert check_vscode(project).status == WARN


def test_vscode_project_defaults_to_cwd(project, monkeypatch):
    write_settings(project, json.dumps({"python.defaultInterpreterPath": sys.executable}))
    monkeypatch.chdir(project)
    assert check_vscode().status == OK


def test_base_dir_missing_is_checked_where_it_would_go(tmp_path):
    writable, disk = check_base_dir(tmp_path / "a" / "b")
    assert writable.status == OK
    assert str(tmp_path) in writable.value
    assert not (tmp_path / "a").exists()
    assert list(tmp_path.iterdir()) == []  # the probe file is gone
    assert disk.status == OK and disk.facts["disk_free_bytes"] > 0


def test_base_dir_that_is_a_file(tmp_path):
    path = tmp_path / "summary"
    path.write_text("not a dir")
    writable, _ = check_base_dir(path / "run")
    assert writable.status == FAIL
    assert "not a directory" in writable.detail
    assert writable.fix


def test_base_dir_behind_a_dangling_link(tmp_path):
    (tmp_path / "summary").symlink_to(tmp_path / "gone")
    writable, _ = check_base_dir(tmp_path / "summary")
    assert writable.status == FAIL


def test_numpy_rule():
    assert numpy_problem("2.1.0", "2.10.0")
    assert numpy_problem("2.1.0", "2.3.0rc1")
    assert numpy_problem("1.26.4", "2.10.0") is None
    assert numpy_problem("2.1.0", None) is None  # no MindSpore, nothing to break
    assert numpy_problem("2.1.0", "2.11.0") is None  # judged by the probe instead


def test_quick_facts_start_no_process(monkeypatch):
    def refuse(*args, **kwargs):
        raise AssertionError("quick_facts must not start a process")

    monkeypatch.setattr(subprocess, "Popen", refuse)
    facts = quick_facts()
    assert facts["numpy"] == __import__("numpy").__version__
    assert facts["protobuf"]
    assert set(facts) >= {"ipykernel", "ipywidgets", "protobuf_implementation"}
    assert isinstance(facts["env_problems"], list)


def test_report_exit_code_and_table():
    checks = (
        Check("python", OK, "3.11.7"),
        Check("summary dir", FAIL, "/ro", "cannot create a file", "make /ro writable"),
        Check("jupyter kernel", WARN, "none", "no kernel", "msmon kernel install"),
    )
    report = Report(checks, "/x/bin/python")
    assert report.exit_code == 1
    text = report.render().splitlines()
    assert text[0] == "msmon doctor: /x/bin/python"
    assert text[1] == "  ok    python          3.11.7"
    assert text[2] == "  FAIL  summary dir     /ro"
    assert text[3].strip() == "cannot create a file"
    assert text[4].strip() == "fix: make /ro writable"
    assert text[-1] == "1 problem(s) block monitoring: summary dir"
    data = report.to_dict()
    assert data["exit_code"] == 1 and data["ok"] is False
    assert [p["name"] for p in data["problems"]] == ["summary dir", "jupyter kernel"]
    assert Report(checks[2:], "p").exit_code == 0


def test_a_crashing_check_is_reported_not_raised():
    def broken() -> Check:
        raise RuntimeError("half-installed package")

    result = doctor._guarded("ipywidgets", broken)
    assert result.status == WARN
    assert "half-installed package" in result.detail


def test_ways_in_all_available_and_partly():
    from msmon_nb.doctor import OK, WARN, check_ways_in

    way = {"available": True, "where": "x.y", "absent": [], "observes": "o"}
    full = {"forward": way, "jit": way}
    check = check_ways_in({"ok": True, "ways_in": full})
    assert check.status == OK and check.value.startswith("2/2 available")
    partly = dict(full, forward=dict(way, absent=["m.GradOperation._pynative_forward_run"]))
    partly["jit"] = dict(way, available=False, where=None)
    check = check_ways_in({"ok": True, "ways_in": partly})
    assert check.status == WARN and check.value.startswith("0/2")
    assert "GradOperation._pynative_forward_run absent" in check.detail
    assert "jit: missing" in check.detail and "mon.step" in check.fix
    assert check_ways_in({"ok": False}).status != OK


def test_vscode_widgets_finds_anywidgets_front_end_where_vscode_looks(tmp_path):
    from msmon_nb.doctor import check_vscode_widgets

    missing = check_vscode_widgets(tmp_path)
    assert missing.status == WARN and "CDN" in missing.detail
    assert missing.fix == "pip install --force-reinstall --no-deps anywidget"
    where = tmp_path / "share" / "jupyter" / "nbextensions" / "anywidget"
    where.mkdir(parents=True)
    (where / "index.js").write_text("define([], () => ({}));")
    found = check_vscode_widgets(tmp_path)
    assert found.status == OK and found.value == str(where)
    # this environment's own anywidget install put it there
    assert check_vscode_widgets().status == OK
