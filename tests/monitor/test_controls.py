"""The one command interpreter (``monitor.controls``): every command, bad arguments,
refusals, and that the command names are spelled in one Python place only."""

from __future__ import annotations

import ast
import json
import re

import mindspore as ms
import pytest

from msmon_nb.events.runs import load_run
from msmon_nb.monitor import Monitor, StopTraining
from msmon_nb.monitor.controls import HANDLERS, Result, interpret, state_of
from msmon_nb.notebook.session import NotebookSession
from msmon_nb.rundir import read_marker
from msmon_nb.rundir.control import COMMANDS, SPECS, ControlError, command_list, usage
from tests.conftest import ROOT
from tests.support import tiny

PACKAGE = ROOT / "msmon_nb"


def test_every_command_of_the_table_has_one_handler_and_travels_as_json():
    assert set(HANDLERS) == set(SPECS.values())
    assert tuple(spec["name"] for spec in command_list()) == COMMANDS
    assert json.loads(json.dumps(command_list())) == command_list()
    # msmon ctl's documented form
    assert usage() == "pause|resume|stop|freq N|snapshot|checkpoint|lr xF"


def test_both_pages_fields_start_at_the_tables_start_freq_at_the_products_default():
    """One "collect every" default for panel and viewer: the table's ``start``, which for
    freq is ``MonitorConfig.log_interval``'s default (the viewer's field began at 10, the
    panel's at 1); lr's field starts at its example."""
    from msmon_nb.config import MonitorConfig

    args = {spec["name"]: spec["arg"] for spec in command_list() if spec["arg"]}
    assert args["freq"]["start"] == MonitorConfig().log_interval == 1
    assert args["lr"]["start"] == args["lr"]["example"] == 0.5
    for script in ("notebook/static/panel.js", "viewer/static/app.js"):
        text = (PACKAGE / script).read_text()
        assert "value: String(spec.arg.start)" in text, script
        assert "arg.example)" not in text and "arg.min :" not in text, script


def test_each_command_acts_answers_and_is_refused_once_stopping(tmp_path):
    with Monitor(save_dir=str(tmp_path), run_name="cmds") as mon:
        for step in range(100):
            mon.step(loss=1.0 / (step + 1))
            if step < 4:
                continue
            assert interpret(mon, "pause") == Result(True, "paused at step 4")
            assert mon.paused and state_of(mon) == "paused"
            assert interpret(mon, "pause").message == "already paused at step 4"
            assert interpret(mon, "resume") == Result(True, "resumed")
            assert not mon.paused and state_of(mon) == "running"
            assert interpret(mon, "resume") == Result(True, "not paused: the loop is running")
            assert interpret(mon, "freq", "7") == Result(True, "collecting every 7 steps")
            assert interpret(mon, "freq", 3) == Result(True, "collecting every 3 steps")
            assert mon.collect_freq == 3
            # an explicit loop hands the monitor no parameters: nothing to summarise
            refused = interpret(mon, "snapshot")
            assert not refused.ok and refused.message.startswith("snapshot refused: ")
            assert "nothing to summarise" in refused.message
            assert interpret(mon, "stop", source="tests") == Result(
                True,
                "stopping at the next step boundary",
            )
            assert mon.stop_requested and state_of(mon) == "stopping"
            late = interpret(mon, "pause")
            assert late == Result(
                False, "pause refused: the run is stopping at the next step boundary"
            )
            assert not mon.paused
        pytest.fail("the stop should have ended the loop")  # pragma: no cover
    assert issubclass(StopTraining, BaseException)
    marker = read_marker(mon.run_dir)
    assert marker["status"] == "stopped"
    assert marker["stop_reason"] == "stop requested (tests)"


@pytest.mark.parametrize(
    ("cmd", "arg", "words"),
    [
        ("freq", None, "freq needs a whole number >= 1 (e.g. freq 10), got None"),
        ("freq", "0", "freq needs a whole number >= 1 (e.g. freq 10), got '0'"),
        ("freq", "x", "freq needs a whole number >= 1"),
        ("freq", "2.5", "freq needs a whole number >= 1"),
        ("freq", True, "freq needs a whole number >= 1"),
        ("pause", 3, "pause takes no argument (got 3)"),
        ("jump", None, "unknown command 'jump'; use one of: pause, resume, stop, freq N, snap"),
        (None, None, "unknown command None"),
    ],
)
def test_bad_commands_are_answered_with_the_fix_and_change_nothing(tmp_path, cmd, arg, words):
    with Monitor(save_dir=str(tmp_path), log_interval=2) as mon:
        mon.step(loss=1.0)
        result = interpret(mon, cmd, arg)
        assert not result.ok and words in result.message, result.message
        assert mon.collect_freq == 2 and not mon.paused and not mon.stop_requested
        with pytest.raises(ControlError, match=re.escape(words)):
            mon.command(cmd, arg)  # the Python form raises what the result says


def test_a_disabled_monitor_refuses_a_snapshot_and_says_why(tmp_path):
    with Monitor(save_dir=str(tmp_path), enable_monitor=False) as mon:
        result = interpret(mon, "snapshot")
    assert not result.ok and "disabled (enable_monitor: false)" in result.message


def test_snapshot_of_a_watched_loop_is_recorded_in_the_run(tmp_path):
    x, y = tiny.data()
    net = tiny.mlp()
    loss_fn = tiny.loss_fn()
    opt = ms.nn.SGD(net.trainable_params(), 0.05)
    grad_fn = ms.value_and_grad(lambda a, b: loss_fn(net(a), b), None, opt.parameters)
    with Monitor(save_dir=str(tmp_path), run_name="snap") as mon, mon.watch():
        for i, (a, b) in enumerate(tiny.batches(x, y, steps=6)):
            _, grads = grad_fn(a, b)
            opt(grads)
            if i == 3:
                result = interpret(mon, "snapshot", source="tests")
    assert result.ok, result.message
    tensors = len(net.trainable_params()) * 2  # each parameter and its gradient
    assert result.message == f"snapshot of {tensors} tensors at step {3}"
    entries = load_run(mon.run_dir).snapshots
    assert len(entries) == tensors
    assert {e["reason"] for e in entries} == {"ctl (tests)"} and {e["step"] for e in entries} == {3}


def test_the_line_magic_goes_through_the_interpreter(tmp_path, capsys):
    session = NotebookSession()
    with Monitor(save_dir=str(tmp_path)) as mon:
        mon.step(loss=1.0)
        session.command("freq", ["4"])
        assert mon.collect_freq == 4
        assert "msmon: collecting every 4 steps" in capsys.readouterr().out
        with pytest.raises(Exception, match=r"%msmonitor freq needs a whole number >= 1"):
            session.command("freq", ["0"])
        with pytest.raises(Exception, match="unknown command; use status, pause, resume, stop"):
            session.command("jump", [])
        session.command("pause", [])
        assert mon.paused and ", paused" in capsys.readouterr().out
        mon.resume()


# --- command names are spelled in one Python place --------------------------------------

# string constants that equal a command name but belong to another vocabulary
OTHER_VOCABULARIES = {
    "msmon_nb/__init__.py": {"snapshot"},  # mm.snapshot, a lazy export
    "msmon_nb/monitor/__init__.py": {"snapshot"},  # its __all__
    # alert actions (action: stop)
    "msmon_nb/config/alerts.py": {"stop", "snapshot", "checkpoint"},
    "msmon_nb/monitor/actions.py": {"stop", "snapshot", "checkpoint"},  # carried out
    "msmon_nb/config/model.py": {"snapshot"},  # the monitor_config key
    "msmon_nb/expr.py": {"lr"},  # break_on's name for the learning rate
    "msmon_nb/config/mindformers.py": {"checkpoint"},  # a section of MindFormers' YAML
    "msmon_nb/collect/torchstyle.py": {"lr"},  # torch's param_groups key
}
TABLE = "msmon_nb/rundir/control.py"


def test_command_names_are_spelled_only_in_the_table():
    spelled = {}
    for path in sorted(PACKAGE.rglob("*.py")):
        rel = path.relative_to(ROOT).as_posix()
        for node in ast.walk(ast.parse(path.read_text())):
            is_name = isinstance(node, ast.Constant) and node.value in COMMANDS
            if is_name and node.value not in OTHER_VOCABULARIES.get(rel, ()):
                spelled.setdefault(rel, set()).add(node.value)
    assert spelled.pop(TABLE) == set(COMMANDS)
    assert spelled == {}, f"command names spelled outside {TABLE}: {spelled}"


def test_the_page_scripts_spell_no_command_name():
    names = "|".join(COMMANDS)
    quoted = re.compile(rf"""["'`]({names})["'`]""")
    scripts = sorted(PACKAGE.rglob("*.js"))
    assert {p.name for p in scripts} >= {"panel.js", "app.js", "chart.js"}
    found = {
        p.relative_to(ROOT).as_posix(): quoted.findall(p.read_text())
        for p in scripts
        if quoted.search(p.read_text())
    }
    assert found == {}, f"the pages take the commands from the kernel or /api/info: {found}"
