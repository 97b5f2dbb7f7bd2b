"""msprobe monitor output read as a run (``events.msprobe``), on files msprobe itself wrote.

``tests/data/msprobe/run`` is what mindstudio-probe 26.2.0's ``TrainerMon`` wrote for two
ranks of a tiny MLP on the CPU (``tests/data/msprobe/generate.py`` says how). The expected
values are read from its CSV files here with the ``csv`` module, by column name.
"""

from __future__ import annotations

import csv
import shutil
from pathlib import Path

import numpy as np
import pytest

import msmon_nb as mm
from msmon_nb.events.index import RunIndex
from msmon_nb.events.writer import EventWriter
from tests.conftest import ROOT

DATA = ROOT / "tests" / "data" / "msprobe" / "run"
STEPS = list(range(12))


def rank_dir(rank: int) -> Path:
    [path] = [p for p in DATA.iterdir() if f"-rank{rank}-" in p.name]
    return path


def column(rank: int, kind: str, name: str, op: str) -> dict[int, float]:
    """step -> msprobe's value of ``op`` for row ``name`` in the ``kind`` CSVs of a rank."""
    out = {}
    for path in sorted(rank_dir(rank).glob(f"{kind}_*.csv")):
        if not path.name[len(kind) + 1].isdigit():  # exp_avg_* must not take exp_avg_sq_*
            continue
        with open(path, newline="") as fh:
            rows = list(csv.reader(fh))
        header = rows[0]
        for row in rows[1:]:
            if len(row) == len(header) - 1:  # msprobe's moment rows: no vpp_stage field
                fields = dict(zip(["name", header[3], "step", *header[4:]], row, strict=True))
            else:
                fields = dict(zip(header, row, strict=True))
            if fields["name"] == name and fields.get("micro_step", "0") == "0":
                out[int(fields["step"])] = float(fields[op])
    return out


def series(run, tag: str, rank: int = 0) -> dict[int, float]:
    steps, values, _ = run.scalars(tag, rank=rank)
    return dict(zip(steps.tolist(), values.tolist(), strict=True))


def close(got: dict[int, float], want: dict[int, float]) -> None:
    assert sorted(got) == sorted(want)
    np.testing.assert_allclose([got[s] for s in sorted(got)], [want[s] for s in sorted(got)],
                               rtol=1e-6, atol=1e-12)  # fmt: skip


def test_load_run_maps_msprobe_columns_onto_our_tags_per_rank():
    run = mm.load_run(DATA)
    assert run.is_msprobe and run.ranks == [0, 1] and run.distributed
    assert run.last_step == 11
    for rank in (0, 1):
        # gradients after the reduce -> param/<name>/grad_<kind>
        grad = series(run, "param/fc1.weight/grad_norm", rank)
        assert sorted(grad) == STEPS
        close(grad, column(rank, "grad_reduced", "fc1.weight", "norm"))
        low = column(rank, "grad_reduced", "fc2.bias", "min")
        high = column(rank, "grad_reduced", "fc2.bias", "max")
        close(
            series(run, "param/fc2.bias/grad_max_abs", rank),
            {s: max(abs(low[s]), abs(high[s])) for s in low},
        )
        # weights after the update -> weight_<kind>
        close(
            series(run, "param/fc2.weight/weight_norm", rank),
            column(rank, "param_updated", "fc2.weight", "norm"),
        )
        # Adam's moments, read by msprobe before the update: its step k is our step k - 1
        for kind, ours in (("exp_avg", "moment1"), ("exp_avg_sq", "moment2")):
            theirs = column(rank, kind, f"{kind}.fc1.weight", "norm")
            assert sorted(theirs) == STEPS
            close(
                series(run, f"param/fc1.weight/{ours}_norm", rank),
                {s - 1: v for s, v in theirs.items() if s >= 1},
            )
        # module outputs -> act/<module>/<stat>, their gradients -> act_grad/...
        close(series(run, "act/fc1/norm", rank), column(rank, "actv", "fc1.output", "norm"))
        close(series(run, "act/act/mean", rank), column(rank, "actv", "act.output", "mean"))
        close(
            series(run, "act_grad/fc2/norm", rank),
            column(rank, "actv_grad", "fc2.output", "norm"),
        )
        # what has no tag of ours stays under msprobe/<kind>/<name>/<op>
        close(
            series(run, "msprobe/actv/act.output/zeros", rank),
            column(rank, "actv", "act.output", "zeros"),
        )
        close(
            series(run, "msprobe/actv/fc1.input/norm", rank),
            column(rank, "actv", "fc1.input", "norm"),
        )
        close(
            series(run, "msprobe/grad_unreduced/fc1.bias/norm", rank),
            column(rank, "grad_unreduced", "fc1.bias", "norm"),
        )
    # the two ranks trained on different data: their series differ
    assert series(run, "act/fc1/norm", 0) != series(run, "act/fc1/norm", 1)
    # what we do not claim to measure the same way is not under our tags
    assert not [t for t in run.tags if t.endswith(("/zero_frac", "/nonfinite"))]
    assert all(t.split("/")[0] in ("param", "act", "act_grad", "msprobe") for t in run.tags)


def test_one_rank_dir_is_a_run_of_its_rank():
    run = mm.load_run(rank_dir(1))
    assert run.ranks == [1] and not run.distributed
    close(series(run, "act/fc2/norm", 1), column(1, "actv", "fc2.output", "norm"))


def test_listed_beside_our_runs_and_tailed_while_msprobe_appends(tmp_path):
    shutil.copytree(DATA, tmp_path / "monitor_output")
    with EventWriter(tmp_path / "ours") as writer:
        writer.add_scalars(0, {"train/loss": 1.0})
    runs = {r.name: r for r in mm.load_runs(tmp_path)}
    assert sorted(runs) == ["monitor_output", "ours"]
    assert runs["monitor_output"].ranks == [0, 1]
    [info] = [i for i in RunIndex(tmp_path).scan() if i.name == "monitor_output"]
    assert info.ranks == (0, 1) and info.last_step == 11 and "act/fc1/norm" in info.tags

    # msprobe appends the next step's rows to its window file: refresh reads them
    run = runs["monitor_output"]
    [window] = (tmp_path / "monitor_output").glob("*-rank0-*/actv_10-14.csv")
    with open(window, encoding="utf-8") as fh:
        last = [row for row in csv.reader(fh) if row[1] == "fc1.output"][-1]
    last[2], last[4] = "12", "123.5"
    with open(window, "a", encoding="utf-8", newline="") as fh:
        csv.writer(fh).writerow(last)
    assert run.refresh()
    steps, values, _ = run.scalars("act/fc1/norm", rank=0)
    assert steps[-1] == 12 and values[-1] == pytest.approx(123.5)
    assert run.last_step == 12
    assert not run.refresh()  # nothing new


def test_two_jobs_in_one_output_dir_are_two_runs(tmp_path):
    out = tmp_path / "monitor_output"
    out.mkdir()
    shutil.copytree(rank_dir(0), out / "Dec07_10-00-00-rank0-aaaaaaaa")
    shutil.copytree(rank_dir(0), out / "Dec07_11-00-00-rank0-bbbbbbbb")
    names = sorted(r.name for r in mm.load_runs(tmp_path))
    assert names == [
        "monitor_output/Dec07_10-00-00-rank0-aaaaaaaa",
        "monitor_output/Dec07_11-00-00-rank0-bbbbbbbb",
    ]


def test_detection_is_by_content_and_other_dirs_get_the_clear_error(tmp_path):
    # CSV files with msprobe's names but another header are not msprobe's
    fake = tmp_path / "Dec07_10-00-00-rank0-cccccccc"
    fake.mkdir()
    (fake / "actv_0-4.csv").write_text("step,loss\n0,1.0\n")
    (fake / "notes.txt").write_text("hello\n")
    for path in (fake, tmp_path):
        with pytest.raises(FileNotFoundError, match="no msprobe monitor output"):
            mm.load_run(path)
    assert mm.load_runs(tmp_path) == []
    # msprobe's header in a file named otherwise is not enough either
    (fake / "actv.csv").write_text("vpp_stage,name,step,micro_step,norm\n0,fc1.output,0,0,1\n")
    with pytest.raises(FileNotFoundError, match="no run at"):
        mm.load_run(fake)


def test_rows_it_cannot_read_are_skipped(tmp_path):
    out = tmp_path / "Dec07_10-00-00-rank3-dddddddd"
    out.mkdir()
    (out / "grad_reduced_0-4.csv").write_text(
        "vpp_stage,name,step,norm,min,max,mean,zeros,nans,shape,dtype\n"
        '0,fc1.weight,0,0.5,-0.2,0.3,0.0,0.0,0.0,"(2, 2)",Float32\n'
        "0,fc1.weight,garbage\n"
        '0,fc1.weight,1,nan,nan,0.3,0.0,0.0,1.0,"(2, 2)",Float32\n'
    )
    run = mm.load_run(out)
    assert run.ranks == [3]
    steps, values, _ = run.scalars("param/fc1.weight/grad_norm", rank=3)
    assert steps.tolist() == [0, 1] and values[0] == 0.5 and np.isnan(values[1])
    assert np.isnan(run.scalars("param/fc1.weight/grad_max_abs", rank=3).values[1])
    assert run.scalars("msprobe/grad_reduced/fc1.weight/nans", rank=3).values.tolist() == [0, 1]


def test_export_says_it_converts_summary_runs_only(tmp_path):
    from msmon_nb.export import load_run_lazily

    with pytest.raises(FileNotFoundError, match="msprobe monitor output"):
        load_run_lazily(DATA)


def test_new_window_files_are_appended_and_a_rewritten_one_is_reread(tmp_path):
    out = tmp_path / rank_dir(0).name
    out.mkdir()
    for path in rank_dir(0).glob("*_0-4.csv"):
        shutil.copy(path, out / path.name)
    run = mm.load_run(out)
    assert sorted(series(run, "act/fc1/norm")) == [0, 1, 2, 3, 4]
    for path in rank_dir(0).glob("*_5-9.csv"):  # msprobe starts the next window
        shutil.copy(path, out / path.name)
    assert run.refresh()
    want = column(0, "actv", "fc1.output", "norm")
    close(series(run, "act/fc1/norm"), {s: want[s] for s in range(10)})
    assert run.last_step == 9
    # a window file rewritten with fewer rows: the rank is rebuilt from what is on disk
    window = out / "actv_5-9.csv"
    window.write_text("".join(window.read_text().splitlines(keepends=True)[:7]))
    assert run.refresh()
    assert sorted(series(run, "act/fc1/norm")) == [0, 1, 2, 3, 4, 5]
    grads = column(0, "grad_reduced", "fc1.weight", "norm")
    close(series(run, "param/fc1.weight/grad_norm"), {s: v for s, v in grads.items() if s < 10})
