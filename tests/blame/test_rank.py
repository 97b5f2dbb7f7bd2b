"""``diagnose.blame``: the robust z-score ranking, and the ``blame`` config checks."""

from __future__ import annotations

import numpy as np
import pytest

from msmon_nb.config import ConfigError, MonitorConfig
from msmon_nb.config.blame import BLAME_DEFAULTS, resolve_blame
from msmon_nb.diagnose.alert import Alert
from msmon_nb.diagnose.blame import NormRing, blame, describe

NAMES = ["a.weight", "b.weight", "c.weight", "d.weight"]


def healthy(rows: int, seed: int = 0) -> np.ndarray:
    rng = np.random.default_rng(seed)
    usual = np.array([0.5, 0.1, 2.0, 0.01])
    return usual * np.exp(rng.normal(scale=0.15, size=(rows, len(usual))))


def ring_of(rows: np.ndarray, first_step: int = 0, size: int = 32) -> NormRing:
    ring = NormRing(size)
    for i, row in enumerate(rows):
        ring.push(first_step + i, NAMES, row)
    return ring


def test_first_riser_is_ranked_first_even_when_another_rose_more():
    rows = healthy(30)
    rows[22:, 2] *= np.geomspace(10, 1000, 8)  # c rises from step 22
    rows[25:, 1] *= 1e4  # b rises later, much more
    got = blame(ring_of(rows), step=29, since_step=25, z=6.0, top=3)
    assert [b.name for b in got[:2]] == ["c.weight", "b.weight"]
    assert got[0].step == 22 and got[1].step == 25  # c's lead: 3 steps before the onset
    assert got[1].z > got[0].z


def test_nothing_is_blamed_on_a_healthy_history():
    assert blame(ring_of(healthy(32, seed=3)), step=31, since_step=31, z=6.0, top=3) == []


def test_nan_norm_counts_as_a_rise_and_its_z_is_inf():
    rows = healthy(20)
    rows[19, 3] = np.nan
    got = blame(ring_of(rows), step=19, since_step=19, z=6.0, top=3)
    assert got[0].name == "d.weight" and got[0].z == float("inf")
    assert got[0].to_dict()["z"] == "inf"
    assert describe(got) == "started in: d.weight (z=inf at step 19)"


def test_ring_keeps_the_last_rows_in_order_and_starts_over_on_new_names():
    ring = ring_of(healthy(40), size=8)
    steps, rows = ring.rows()
    assert steps.tolist() == list(range(32, 40)) and rows.shape == (8, 4)
    ring.push(40, ["x"], np.array([1.0]))
    assert len(ring) == 1 and ring.names == ["x"]
    with pytest.raises(ValueError):
        ring.push(41, ["x", "y"], np.array([1.0]))


def test_alert_blame_round_trips_through_its_dict():
    alert = Alert(
        5,
        "grad_explosion",
        "critical",
        "m",
        4,
        "train/grad_norm",
        3.0,
        None,
        ({"name": "a", "z": 9.0, "step": 4, "norm": 3.0, "usual": 0.1},),
    )
    data = alert.to_dict()
    assert data["blame"][0]["name"] == "a"
    assert Alert.from_dict(data) == alert
    assert "blame" not in Alert(5, "lr_zero", "warning", "m", 5).to_dict()


def test_config_defaults_and_clear_errors():
    assert resolve_blame({}) == BLAME_DEFAULTS
    assert MonitorConfig(blame={"steps": 64, "z": "8"}).blame == {"steps": 64, "z": "8"}
    for bad, words in [
        ({"steps": 4}, "blame.steps=4: must be a whole number >= 8"),
        ({"z": -1}, "blame.z=-1: must be a finite number > 0"),
        ({"detail_steps": 1.5}, "blame.detail_steps=1.5"),
        ({"enabled": "yes"}, "must be true or false"),
        ({"stepz": 3}, "did you mean 'steps'?"),
    ]:
        with pytest.raises(ConfigError, match=words.replace("(", r"\(").replace("?", r"\?")):
            MonitorConfig(blame=bad)
    with pytest.raises(ConfigError, match="must be a mapping"):
        MonitorConfig(blame=[1])
