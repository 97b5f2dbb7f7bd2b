"""``msmon doctor`` in real environments: healthy, numpy 2 forced, a read-only base dir.

Each doctor runs as a user runs it (``python -m msmon_nb.cli doctor``), MindSpore imported
for real in its probe. Next to two of them a monitored no-op runs in the same
interpreter, so the run marker and the ``verbose`` line are checked for real as well.
"""

from __future__ import annotations

import json
import subprocess
import sys
from importlib import metadata

from tests.support.envs import (
    by_name,
    clean_env,
    doctor_json,
    finish,
    start_doctor,
    start_monitor,
)


def test_healthy_venv(tmp_path, project):
    jupyter_data = tmp_path / "jupyter"
    env = clean_env(JUPYTER_DATA_DIR=str(jupyter_data))
    installed = subprocess.run(
        [sys.executable, "-m", "msmon_nb.cli", "kernel", "install", "--name", "msmon-doctor"],
        capture_output=True,
        text=True,
        env=env,
        timeout=120,
    )
    assert installed.returncode == 0, installed.stderr
    (project / ".vscode").mkdir()
    (project / ".vscode" / "settings.json").write_text(
        "// written by the test\n{\n  /* the venv under test */\n"
        f'  "python.defaultInterpreterPath": {json.dumps(sys.executable)},\n}}\n'
    )
    doctor = start_doctor(sys.executable, "--dir", str(tmp_path / "summary"), env=env, cwd=project)
    monitor = start_monitor(sys.executable, tmp_path / "runs", env=env, cwd=project)
    code, report = doctor_json(doctor)
    checks = by_name(report)
    assert code == 0, report["problems"]
    assert report["ok"] is True and report["exit_code"] == 0
    assert not [c for c in report["checks"] if c["status"] == "fail"]
    assert checks["mindspore"]["status"] == "ok"
    facts = report["facts"]
    assert facts["mindspore"] == metadata.version("mindspore")
    assert facts["device"] == "CPU"
    assert facts["numpy"] == metadata.version("numpy") and facts["numpy"].startswith("1.")
    assert checks["numpy"]["status"] == "ok"
    assert facts["protobuf"] == metadata.version("protobuf")
    # the probe saw `import mindspore` switch protobuf to pure Python; said, not blocking
    assert facts["protobuf_implementation_under_mindspore"] == "python"
    assert checks["protobuf"]["status"] == "info"
    assert "PROTOCOL_BUFFERS_PYTHON_IMPLEMENTATION" in checks["protobuf"]["detail"]
    for name in ("ipywidgets", "ipykernel", "jupyterlab"):
        assert checks[name]["status"] == "ok" and facts[name] == metadata.version(name)
    assert checks["jupyter kernel"]["status"] == "ok"
    assert facts["kernels"] == ["msmon-doctor"]
    assert checks["vscode settings"]["status"] == "ok"
    assert checks["summary dir"]["status"] == "ok" and facts["base_dir_writable"] is True
    assert not (tmp_path / "summary").exists()  # checked, not created
    assert facts["disk_free_bytes"] > 0

    code, out, err = finish(monitor)
    assert code == 0, err
    assert f"MindSpore {facts['mindspore']} on CPU" in out
    (run_dir,) = (tmp_path / "runs").iterdir()
    marker = json.loads((run_dir / "msmon_run.json").read_text())
    assert marker["mindspore"] == facts["mindspore"] and marker["device"] == "CPU"
    assert marker["numpy"] == facts["numpy"]
    assert marker["protobuf"] == facts["protobuf"]
    assert marker["protobuf_implementation"] == "python"  # inside a training process
    assert marker["ipykernel"] == facts["ipykernel"]
    assert marker["env_problems"] == []


def test_numpy2_forced(numpy2_python, tmp_path, project):
    env = clean_env(JUPYTER_DATA_DIR=str(tmp_path / "jupyter"))
    doctor = start_doctor(numpy2_python, "--dir", str(tmp_path / "s"), env=env, cwd=project)
    monitor = start_monitor(numpy2_python, tmp_path / "runs", env=env, cwd=project)
    code, report = doctor_json(doctor)
    checks = by_name(report)
    assert code == 1
    assert report["ok"] is False and report["exit_code"] == 1
    assert report["interpreter"] == str(numpy2_python)
    assert report["facts"]["numpy"].startswith("2.")
    numpy = checks["numpy"]
    assert numpy["status"] == "fail"
    assert numpy["fix"] == "pip install 'numpy<2'"
    # what MindSpore really printed in the probe, not only the version rule
    assert "compiled using NumPy 1.x" in numpy["detail"]
    assert "Numpy init failed" in numpy["detail"]
    assert [p["name"] for p in report["problems"] if p["status"] == "fail"] == ["numpy"]
    assert checks["mindspore"]["status"] == "ok"  # importing works; the conversion does not
    assert checks["jupyter kernel"]["status"] == "warn"
    assert checks["jupyter kernel"]["fix"] == "msmon kernel install"

    code, out, err = finish(monitor)
    assert code == 0, err
    assert f"MindSpore {report['facts']['mindspore']} on CPU" in out
    (run_dir,) = (tmp_path / "runs").iterdir()
    marker = json.loads((run_dir / "msmon_run.json").read_text())
    assert marker["numpy"].startswith("2.")
    assert [p["name"] for p in marker["env_problems"]] == ["numpy"]
    assert marker["env_problems"][0]["fix"] == "pip install 'numpy<2'"


def test_unwritable_base_dir(readonly_dir, tmp_path, project):
    env = clean_env(JUPYTER_DATA_DIR=str(tmp_path / "jupyter"))
    base = readonly_dir / "summary"
    code, out, err = finish(
        start_doctor(sys.executable, "--dir", str(base), env=env, cwd=project, json_out=False)
    )
    assert code == 1, out + err
    lines = out.splitlines()
    row = next(i for i, line in enumerate(lines) if "summary dir" in line)
    assert lines[row].split()[0] == "FAIL"
    assert str(readonly_dir) in lines[row]
    below = " ".join(lines[row + 1 : row + 4])
    assert "Read-only file system" in below
    assert f"fix: make {readonly_dir} writable" in below
    disk = next(line for line in lines if "disk free" in line)
    assert disk.split()[0] == "warn"  # a 1 MB tmpfs is under the 1 GB threshold
    assert lines[-1] == "1 problem(s) block monitoring: summary dir"
    assert not base.exists()
