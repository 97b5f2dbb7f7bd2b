"""The cross-rank rules of ``diagnose/ranks.py`` on cases a 2-rank msrun job cannot stage
cheaply: four ranks, two ranks rising together, a non-finite local norm, an uneven
transfer, two outlier batches from one rank. The series are built here (the rules are pure
numpy); the msrun tests (test_msrun.py) cover what real jobs record."""

import json
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from msmon_nb.diagnose.rankrules import DEFAULTS, rank_spike, straggler_by_wait
from msmon_nb.events.runs import load_runs
from msmon_nb.events.writer import EventWriter
from msmon_nb.monitor.rankwatch import CrossRankRecorder
from msmon_nb.rundir import write_marker


@dataclass
class Series:
    steps: np.ndarray
    values: np.ndarray


def series(values) -> Series:
    values = np.asarray(values, dtype=np.float64)
    return Series(np.arange(len(values)), values)


def norms(ranks: int, steps: int, seed: int = 0) -> np.ndarray:
    """Healthy local grad norms: noisy around a slowly falling level."""
    rng = np.random.default_rng(seed)
    level = 1.0 + 0.5 * np.exp(-np.arange(steps) / 40)
    return level * (1 + 0.15 * rng.standard_normal((ranks, steps)))


def spikes(local: np.ndarray, kind: str = "rank_grad_spike"):
    per_rank = {r: series(v) for r, v in enumerate(local)}
    glob = {r: series(np.linalg.norm(local, axis=0) / len(local)) for r in range(len(local))}
    return rank_spike(
        per_rank, glob if kind == "rank_grad_spike" else None, kind, **DEFAULTS["rank_spike"]
    )


def test_one_rank_of_four_named_at_its_step():
    local = norms(4, 80)
    local[2, 50] *= 60
    (alert,) = spikes(local)
    assert (alert.rank, alert.since_step, alert.step) == (2, 50, 50)
    assert "came from rank 2: local norm x" in alert.message


def test_healthy_noise_and_ranks_rising_together_name_no_rank():
    assert spikes(norms(4, 200, seed=1)) == []
    local = norms(2, 80)
    local[:, 50:] *= 10  # every rank at once: an lr or data-wide problem, not one batch
    assert spikes(local) == []


def test_non_finite_local_norm_named():
    local = norms(4, 60)
    local[1, 30] = np.inf
    (alert,) = spikes(local)
    assert (alert.rank, alert.since_step) == (1, 30)
    assert "local norm non-finite" in alert.message


def test_loss_spike_against_the_ranks_mean():
    loss = 0.7 + 0.03 * np.random.default_rng(3).standard_normal((2, 60))
    loss[0, 45] = 20.0
    (alert,) = spikes(loss, "rank_loss_spike")
    assert (alert.kind, alert.rank, alert.since_step) == ("rank_loss_spike", 0, 45)
    assert alert.message.startswith("loss spike at step 45")


def test_uneven_transfer_without_a_slow_rank_is_no_straggler():
    # seen on loopback mccl: one rank of a healthy job waits 30-40 ms more than the other
    # in every all-reduce, while both are busy equally long
    rng = np.random.default_rng(0)
    busy = {r: series(0.03 + 0.005 * rng.standard_normal(60)) for r in (0, 1)}
    waits = {0: series(np.full(60, 0.04)), 1: series(np.full(60, 0.005))}
    assert straggler_by_wait(busy, waits, **DEFAULTS["straggler_wait"]) == []
    busy[1].values[30:] += 0.15  # now rank 1 works 150 ms longer, and rank 0 waits for it
    waits[0].values[30:] += 0.15
    (alert,) = straggler_by_wait(busy, waits, **DEFAULTS["straggler_wait"])
    assert (alert.rank, alert.since_step) == (1, 30)


def test_straggler_onset_survives_host_hiccups():
    # seen in a Model.train job at load 15 on 2 cores: rank 1 stalls 1.2 s at step 25,
    # rank 0 stalls at step 30 (so step 30 is no straggler step), rank 1 is slow from 30
    rng = np.random.default_rng(1)
    busy = {r: series(0.04 + 0.01 * rng.random(60)) for r in (0, 1)}
    waits = {r: series(0.01 + 0.01 * rng.random(60)) for r in (0, 1)}
    busy[1].values[25] = 1.2
    waits[0].values[25] = 1.2
    busy[1].values[30:] += 0.15
    waits[0].values[31:] += 0.15
    busy[0].values[30] = 0.36
    waits[1].values[30] = 0.2
    busy[0].values[35:37] = 0.3  # two more hiccups inside the slow stretch
    (alert,) = straggler_by_wait(busy, waits, **DEFAULTS["straggler_wait"])
    assert (alert.rank, alert.since_step) == (1, 31)
    assert alert.step < 45
    # a burst (a loaded host, seen at load 13 on 2 cores): rank 0 at 2.5x the other's
    # busy time in 9 of 16 steps, then fine again
    busy = {r: series(0.1 + 0.01 * rng.random(100)) for r in (0, 1)}
    waits = {r: series(0.02 + 0.01 * rng.random(100)) for r in (0, 1)}
    for step in (60, 61, 64, 66, 67, 68, 70, 72, 75):
        busy[0].values[step] += 0.15
        waits[1].values[step] += 0.15
    assert straggler_by_wait(busy, waits, **DEFAULTS["straggler_wait"]) == []


def write_rank(job: Path, rank: int, columns: dict[str, np.ndarray]) -> None:
    rank_dir = job / f"rank_{rank}"
    steps = len(next(iter(columns.values())))
    with EventWriter(rank_dir, rank=rank, block_secs=None) as writer:
        for step in range(steps):
            writer.add_scalars(step, {tag: float(v[step]) for tag, v in columns.items()})
    write_marker(
        rank_dir,
        {"run_name": job.name, "status": "finished", "rank": rank, "ranks": 2},
    )


def test_two_outlier_batches_from_one_rank_recorded_once_each(tmp_path):
    job = tmp_path / "job"
    local = norms(2, 90)
    local[1, 40] *= 50
    local[1, 70] *= 50
    glob = np.linalg.norm(local, axis=0) / 2
    for rank in (0, 1):
        write_rank(job, rank, {"train/grad_norm": glob, "train/local_grad_norm": local[rank]})
    alerts_file = job / "rank_0" / "alerts.jsonl"
    recorder = CrossRankRecorder(job, alerts_file)
    found = recorder.check()
    assert [(a.kind, a.rank, a.since_step) for a in found] == [
        ("rank_grad_spike", 1, 40),
        ("rank_grad_spike", 1, 70),
    ]
    assert recorder.check() == []  # each onset once, also across recorders
    assert CrossRankRecorder(job, alerts_file).check() == []
    lines = [json.loads(line) for line in alerts_file.read_text().splitlines()]
    assert [(a["rank"], a["since_step"], a["cross_rank"]) for a in lines] == [
        (1, 40, True),
        (1, 70, True),
    ]
    (run,) = load_runs(tmp_path)
    assert sorted(a["since_step"] for a in run.alerts if a.get("cross_rank")) == [40, 70]
