"""Randomised conformance: cases drawn from every axis at once (any optimizer, lr form,
loop shape, scaling, frequency, precision), beyond the cases the matrix already trains.

The draw (``cases.drawn``) ranks every possible case by a hash of its id and takes the
first ``MSMON_CONFORMANCE_EXAMPLES`` (12 in ``make test``; ``make conformance`` draws
300) that the matrix does not already train. A case keeps its rank whatever else is in
the table, so a draw changes only when a case added to the table ranks before it, and
the same cases run on every machine. ``MSMON_CONFORMANCE_SALT`` draws another sample.
A failure prints the case as a ready line for ``cases.FOUND``: add it there, fix it,
keep it.
"""

from __future__ import annotations

import os

import pytest

from tests.conformance.cases import drawn
from tests.conformance.harness import check, run_case

EXAMPLES = int(os.environ.get("MSMON_CONFORMANCE_EXAMPLES", "12"))
SALT = os.environ.get("MSMON_CONFORMANCE_SALT", "")


@pytest.mark.parametrize("case", drawn(EXAMPLES, SALT), ids=lambda c: c.id)
def test_random_cases_conform(case, tmp_path):
    try:
        plain, monitored = run_case(case, tmp_path)
        check(case, plain, monitored)
    except Exception as failure:
        raise AssertionError(
            f"{failure}\nkeep this case in tests/conformance/cases.py FOUND:\n    {case.line},"
        ) from failure
