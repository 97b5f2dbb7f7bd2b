"""Round trips through our writer and reader."""

import numpy as np

from msmon_nb.events.reader import read_events
from msmon_nb.events.runs import load_run
from msmon_nb.events.writer import EventWriter

TAGS = ("train/loss", "train/grad_norm", "train/learning_rate", "train/throughput", "x/y")


def test_million_scalars_bit_for_bit(tmp_path):
    steps = 200_000
    rng = np.random.default_rng(1)
    values = rng.standard_normal((steps, len(TAGS))).astype(np.float32)
    values *= np.float32(10.0) ** rng.integers(-30, 30, size=values.shape).astype(np.float32)
    values[7, 1] = np.inf
    values[9, 2] = -np.inf
    values[11, 3] = np.nan
    values[13, 0] = np.float32(3.4e38)
    with EventWriter(tmp_path) as writer:
        for step in range(steps):
            row = values[step].tolist()
            writer.add_scalars(step, dict(zip(TAGS, row, strict=True)), wall_time=1e9 + step)
    run = load_run(tmp_path)
    assert run.num_points == steps * len(TAGS)
    for j, tag in enumerate(TAGS):
        got = run.scalars(tag)
        assert np.array_equal(got.steps, np.arange(steps))
        assert got.values.dtype == np.float32
        assert np.array_equal(got.values.view(np.uint32), values[:, j].view(np.uint32))
        assert np.array_equal(got.wall_times, 1e9 + np.arange(steps))


def test_every_kind_round_trips(tmp_path):
    rng = np.random.default_rng(2)
    weights = rng.normal(size=(16, 8)).astype(np.float32)
    img = rng.integers(0, 255, size=(6, 7, 3), dtype=np.uint8)
    with EventWriter(tmp_path) as writer:
        writer.add_scalar("a", 1.5, step=1)
        writer.add_histogram("w", weights, step=1)
        writer.add_tensor("t", weights, step=1)
        writer.add_image("img", img, step=1)
    run = load_run(tmp_path)
    assert run.tags() == ["a"]
    assert run.tags == ["a"] and "a" in run.tags  # a field too, as /api/runs shows it
    assert run.tags("histogram") == ["w"] and run.tags("tensor") == ["t"]
    assert run.tags("image") == ["img"] and run.run_dir == run.path == tmp_path
    (hist,) = run.histograms("w")
    assert hist.step == 1
    assert hist.value.count == weights.size
    assert hist.value.counts.sum() == weights.size
    assert hist.value.min == float(weights.min()) and hist.value.max == float(weights.max())
    (tensor,) = run.tensors("t")
    assert np.array_equal(tensor.value, weights)
    (image,) = run.images("img")
    assert np.array_equal(image.value.to_array(), img)


def test_read_events_first_record_is_version(tmp_path):
    with EventWriter(tmp_path) as writer:
        writer.add_scalar("a", 2.0, step=3)
    records = list(read_events(writer.path))
    assert records[0].version == "MindSpore.Event:1"
    assert records[1].step == 3 and records[1].values[0].value == 2.0


def test_repeated_steps_later_write_wins_and_orphans_purged(tmp_path):
    with EventWriter(tmp_path) as writer:
        for step in range(10):
            writer.add_scalar("loss", step, step)
        for step in range(5, 8):  # restart from a checkpoint at step 5
            writer.add_scalar("loss", 100 + step, step)
    run = load_run(tmp_path)
    series = run.scalars("loss")
    assert series.steps.tolist() == [0, 1, 2, 3, 4, 5, 6, 7]
    assert series.values.tolist() == [0, 1, 2, 3, 4, 105, 106, 107]
    raw = run.scalars("loss", raw=True)
    assert raw.steps.tolist() == [*range(10), 5, 6, 7]


def test_mixed_tags_and_layouts_keep_write_order(tmp_path):
    with EventWriter(tmp_path) as writer:
        for step in range(300):  # step varint grows from 1 to 2 bytes at 128
            values = {"a": step}
            if step % 3 == 0:
                values["b"] = -step
            writer.add_scalars(step, values)
            if step % 50 == 0:
                writer.add_histogram("h", np.arange(step + 1), step)
    run = load_run(tmp_path)
    assert run.scalars("a").steps.tolist() == list(range(300))
    assert run.scalars("b").values.tolist() == [-s for s in range(0, 300, 3)]
    assert [p.step for p in run.histograms("h")] == list(range(0, 300, 50))


def test_job_with_only_rank_markers_is_one_run(tmp_path):
    import json

    from msmon_nb.rundir import find_run_dirs

    for rank in (0, 1):
        rank_dir = tmp_path / "job" / f"rank_{rank}"
        rank_dir.mkdir(parents=True)
        (rank_dir / "msmon_run.json").write_text(json.dumps({"rank": rank, "ranks": 2}))
    assert find_run_dirs(tmp_path) == [tmp_path / "job"]


def test_records_of_many_lengths_and_runs_between_read_in_order(tmp_path):
    """One scalar per event under tags of different lengths (records alternate in size,
    as TensorBoard-style writers emit them), with runs of equal records between: every
    value comes back, in order. (The reader used to scan the whole rest of the buffer at
    each record of a new length: 200 k such records took 27 s; bench/events.py.)"""
    tags = ("a", "loss", "train/grad_norm", "sys/memory_used_bytes")
    expected: dict[str, list[tuple[int, float]]] = {t: [] for t in tags}
    with EventWriter(tmp_path / "run") as writer:
        for step in range(3000):
            if 1000 <= step < 1500:  # a run of equal-length records
                writer.add_scalars(step, {"a": float(step)})
                expected["a"].append((step, float(step)))
                continue
            for i, tag in enumerate(tags):
                writer.add_scalars(step, {tag: step * 0.5 + i})
                expected[tag].append((step, step * 0.5 + i))
    run = load_run(tmp_path / "run")
    for tag in tags:
        series = run.scalars(tag)
        got = list(zip(series.steps.tolist(), series.values.tolist(), strict=True))
        assert got == expected[tag], tag
    (events,) = (tmp_path / "run").glob("*summary*")
    records = [r for r in read_events(events) if r.values]
    assert sum(len(r.values) for r in records) == sum(map(len, expected.values()))
