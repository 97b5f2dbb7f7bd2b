"""Cross-rank rules on synthetic per-rank series (the msrun tests cover real jobs)."""

from typing import NamedTuple

import numpy as np

from msmon_nb.diagnose.rankrules import grad_norm_mismatch, loss_spread, rank_stopped, straggler


class S(NamedTuple):
    steps: np.ndarray
    values: np.ndarray


def ranks(n, values_of):
    steps = np.arange(200)
    return {r: S(steps, values_of(r, steps)) for r in range(n)}


def test_mismatch_flags_the_first_differing_step_and_the_odd_rank():
    def norm(rank, steps):
        v = 1.0 + 0.01 * np.sin(steps)
        return np.where((rank == 2) & (steps >= 120), v * 1.01, v)

    (alert,) = grad_norm_mismatch(ranks(4, norm), rtol=1e-4, patience=2)
    assert (alert.rank, alert.since_step, alert.step) == (2, 120, 121)
    assert (
        grad_norm_mismatch(ranks(4, lambda r, s: 1.0 + 0.01 * np.sin(s)), rtol=1e-4, patience=2)
        == []
    )


def test_spread_growing_is_flagged_not_noise():
    rng = np.random.default_rng(0)

    def loss(rank, steps):
        base = 2.0 * np.exp(-steps / 80) + rng.normal(0, 0.02, len(steps))
        return base + np.where(steps >= 100, 0.01 * (steps - 100) * (rank == 1), 0.0)

    (alert,) = loss_spread(ranks(3, loss), factor=3.0, floor=0.1, window=20)
    assert alert.rank == 1 and 100 <= alert.since_step <= 140
    quiet = ranks(3, lambda r, s: 2.0 * np.exp(-s / 80) + rng.normal(0, 0.02, len(s)))
    assert loss_spread(quiet, factor=3.0, floor=0.1, window=20) == []


def test_straggler_needs_patience_and_an_absolute_margin():
    def data_time(rank, steps):
        return np.where((rank == 3) & (steps >= 50), 0.05, 0.001) + 0.0001 * rank

    (alert,) = straggler(
        ranks(8, data_time), margin=0.5, min_secs=0.005, patience=3, tag="train/data_time"
    )
    assert (alert.rank, alert.since_step, alert.step) == (3, 50, 52)
    tiny = ranks(8, lambda r, s: np.full(len(s), 0.001 * (1 + r % 2)))  # 2x, but 1 ms apart
    assert straggler(tiny, margin=0.5, min_secs=0.005, patience=3, tag="train/data_time") == []


def test_rank_stopped_only_while_others_go_on():
    (alert,) = rank_stopped({0: 80, 1: 39}, {0: "running", 1: "interrupted"}, lag=5)
    assert (alert.rank, alert.since_step) == (1, 40)
    assert rank_stopped({0: 80, 1: 80}, {0: "finished", 1: "finished"}, lag=5) == []


def test_rank_behind_only_by_an_unflushed_second_is_not_stopped():
    """Ranks flush on their own deadlines: a file 20 steps behind but written 0.5 s ago is
    a buffer, not a hang; the same lag with nothing new for 30 s is a hang."""
    running = {0: "running", 1: "running"}
    fresh = {0: 1000.0, 1: 999.5}
    assert rank_stopped({0: 60, 1: 40}, running, lag=5, last_writes=fresh) == []
    stale = {0: 1000.0, 1: 970.0}
    (alert,) = rank_stopped({0: 60, 1: 40}, running, lag=5, last_writes=stale)
    assert (alert.rank, alert.since_step) == (1, 41)
    gone = {0: "running", 1: "interrupted"}  # a dead process needs no wall-clock proof
    (alert,) = rank_stopped({0: 60, 1: 40}, gone, lag=5, last_writes=fresh)
    assert alert.rank == 1
