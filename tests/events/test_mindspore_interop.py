"""Files written by MindSpore itself, read by us; our files read by MindSpore's module."""

import numpy as np
import pytest

from msmon_nb.events.framing import HEADER
from msmon_nb.events.runs import load_run, load_runs
from msmon_nb.events.writer import EventWriter

SCRIPT = r"""
import sys, numpy as np, mindspore as ms
from mindspore.train.summary import SummaryRecord
rng = np.random.default_rng(3)
w = rng.normal(size=(20, 10)).astype(np.float32)
t = np.arange(6, dtype=np.float32).reshape(2, 3)
img = rng.random((1, 3, 8, 8)).astype(np.float32)
with SummaryRecord(sys.argv[1]) as sr:
    for step in range(1, 6):
        sr.add_value("scalar", "loss", ms.Tensor(np.float32(1.0 / step)))
        sr.add_value("scalar", "lr", ms.Tensor(np.float32(0.1 * step)))
        sr.add_value("histogram", "w", ms.Tensor(w * step))
        sr.add_value("tensor", "t", ms.Tensor(t + step))
        sr.add_value("image", "img", ms.Tensor(img))
        sr.record(step)
np.save(sys.argv[1] + "/../w.npy", w)
"""


@pytest.fixture(scope="module")
def ms_run(tmp_path_factory, python_module):
    base = tmp_path_factory.mktemp("ms")
    run_dir = base / "ms_run"
    python_module(SCRIPT, str(run_dir))
    return base, run_dir


@pytest.fixture(scope="module")
def python_module():
    from tests.conftest import run_python

    return run_python


def test_mindspore_summary_record_read_by_load_run(ms_run):
    base, run_dir = ms_run
    w = np.load(base / "w.npy")
    run = load_run(run_dir)
    assert sorted(run.tags()) == ["loss", "lr"]
    loss = run.scalars("loss")
    assert loss.steps.tolist() == [1, 2, 3, 4, 5]
    assert np.array_equal(loss.values, (1.0 / np.arange(1, 6)).astype(np.float32))
    assert np.allclose(run.scalars("lr").values, 0.1 * np.arange(1, 6))
    hists = run.histograms("w")
    assert [h.step for h in hists] == [1, 2, 3, 4, 5]
    h = hists[2].value
    assert h.count == w.size and h.counts.sum() == w.size
    assert h.min == pytest.approx(float((w * 3).min()))
    assert h.sum == pytest.approx(float((w * 3).sum(dtype=np.float64)), rel=1e-6)
    tensors = run.tensors("t")
    assert np.array_equal(tensors[0].value, np.arange(6, dtype=np.float32).reshape(2, 3) + 1)
    image = run.images("img")[0].value
    assert (image.height, image.width) == (8, 8)
    assert image.to_array().shape == (8, 8, 3)
    assert run.status == "finished"  # SummaryRecord leaves its files read-only
    assert run.problems == []
    assert [r.name for r in load_runs(base)] == ["ms_run"]


def test_lineage_files_ignored(ms_run):
    _, run_dir = ms_run
    run = load_run(run_dir)
    assert all(not f.name.endswith("_lineage") for f in run.files)


def test_our_files_parse_with_mindspore_summary_pb2(tmp_path):
    from mindspore.train import summary_pb2

    rng = np.random.default_rng(4)
    w = rng.normal(size=100).astype(np.float32)
    with EventWriter(tmp_path) as writer:
        for step in range(3):
            writer.add_scalars(step, {"train/loss": 0.5 * step, "train/lr": 1e-3})
        writer.add_histogram("w", w, step=3)
        writer.add_tensor("t", w[:6].reshape(2, 3), step=3)
    data = writer.path.read_bytes()
    events = []
    pos = 0
    while pos < len(data):
        length, _ = HEADER.unpack_from(data, pos)
        events.append(summary_pb2.Event.FromString(data[pos + 12 : pos + 12 + length]))
        pos += 16 + length
    assert events[0].version == "MindSpore.Event:1"
    scalars = [(e.step, v.tag, v.scalar_value) for e in events[1:4] for v in e.summary.value]
    assert scalars == [
        (0, "train/loss", 0.0),
        (0, "train/lr", np.float32(1e-3)),
        (1, "train/loss", 0.5),
        (1, "train/lr", np.float32(1e-3)),
        (2, "train/loss", 1.0),
        (2, "train/lr", np.float32(1e-3)),
    ]
    hist = events[4].summary.value[0].histogram
    assert hist.count == 100 and sum(b.count for b in hist.buckets) == 100
    tensor = events[5].summary.value[0].tensor
    assert list(tensor.dims) == [2, 3]
    assert np.array_equal(np.array(tensor.float_data, np.float32), w[:6])
    name = writer.path.name
    assert name.startswith("events.out.events.summary.") and name.endswith("_MS")
