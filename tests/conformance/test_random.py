"""Randomised conformance: cases drawn from every axis at once (any optimizer, lr form,
loop shape, scaling, frequency), beyond the all-pairs cover.

The draw is derandomised (the same cases every run, so CI is repeatable); its size is
``MSMON_CONFORMANCE_EXAMPLES`` (12 in ``make test``; ``make conformance`` draws 300).
A failure it finds is printed as a ``Case(...)``: add it to
``cases.FOUND``, fix it, keep it.
"""

from __future__ import annotations

import os
import tempfile

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from tests.conformance.harness import (
    FREQS,
    LOOPS,
    LR_FORMS,
    SCALINGS,
    Case,
    check,
    run_case,
    supported,
)
from tests.conformance.optimizers import BUILD

EXAMPLES = int(os.environ.get("MSMON_CONFORMANCE_EXAMPLES", "12"))

cases = st.builds(
    Case,
    optimizer=st.sampled_from(sorted(BUILD)),
    loop=st.sampled_from(LOOPS),
    lr=st.sampled_from(LR_FORMS),
    scaling=st.sampled_from(SCALINGS),
    freq=st.sampled_from(FREQS),
).filter(supported)


@settings(
    max_examples=EXAMPLES,
    derandomize=True,
    deadline=None,
    database=None,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.filter_too_much],
    print_blob=True,
)
@given(case=cases)
def test_random_cases_conform(case):
    with tempfile.TemporaryDirectory() as tmp:
        plain, monitored = run_case(case, tmp)
        check(case, plain, monitored)
