"""``metrics.extent``: each statistic beyond the norm, exactly, on values whose answer is
known by hand (NaN, +-Inf, zeros, empty, integer and float16 input)."""

import math

import numpy as np
import pytest

from msmon_nb.config.checks import PARAM_STAT_KINDS
from msmon_nb.metrics.extent import ACT_STATS, STAT_KINDS, tensor_extent


def test_known_values():
    x = np.array([[0.0, -3.0], [4.0, 0.0], [0.0, 1.0]], np.float32)
    got = tensor_extent(x, ACT_STATS)
    assert got == {"norm": math.sqrt(26.0), "max_abs": 4.0, "mean": 1.0 / 3.0,
                   "nonfinite": 0.0, "zero_frac": 0.5}  # fmt: skip


def test_nonfinite_counted_and_never_hidden():
    x = np.array([1.0, np.nan, -np.inf, 0.0, np.inf], np.float32)
    got = tensor_extent(x, STAT_KINDS)
    assert got["nonfinite"] == 3.0
    assert got["zero_frac"] == 0.2
    assert math.isnan(got["max_abs"]) and math.isnan(got["norm"])  # a NaN is not skipped
    inf_only = tensor_extent(np.array([1.0, -np.inf], np.float32), ["max_abs", "mean"])
    assert inf_only == {"max_abs": math.inf, "mean": -math.inf}


def test_empty_integer_and_half():
    empty = tensor_extent(np.zeros((0, 3), np.float32), STAT_KINDS)
    assert empty["nonfinite"] == 0.0 and empty["norm"] == 0.0
    assert math.isnan(empty["max_abs"]) and math.isnan(empty["zero_frac"])
    assert tensor_extent(np.array([0, -7, 2], np.int32), ["max_abs", "zero_frac"]) == {
        "max_abs": 7.0,
        "zero_frac": 1 / 3,
    }
    half = np.array([65504.0, -65504.0], np.float16)  # its square overflows float16
    assert tensor_extent(half, ["norm", "max_abs"]) == {
        "norm": pytest.approx(65504.0 * math.sqrt(2), rel=1e-12),
        "max_abs": 65504.0,
    }


def test_unknown_kind_is_named():
    with pytest.raises(ValueError, match="'median'"):
        tensor_extent(np.ones(3), ["median"])


def test_config_twin_list_is_the_same():
    assert PARAM_STAT_KINDS == STAT_KINDS
