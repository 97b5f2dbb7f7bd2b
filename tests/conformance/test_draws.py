"""The randomised test's draw (``cases.drawn``): repeatable, stable when the table grows,
never a case the matrix already trains, and a failure printed as a ready case line."""

from __future__ import annotations

import ast

from tests.conformance import cases
from tests.conformance.harness import Case


def test_draws_repeat_no_matrix_case():
    drawn = cases.drawn(300)
    assert len(drawn) == len(set(drawn)) == 300
    assert not set(drawn) & cases.matrix()
    assert drawn[:12] == cases.drawn(12), "the first draws of a longer run are make test's"


def test_a_draw_keeps_its_place_when_the_table_grows(monkeypatch):
    """Cases added to the space (here: a new optimizer's) can only rank before or after
    a drawn case; every case drawn before that is not displaced by one is drawn again."""
    before = cases.drawn(12)
    grown = [*cases.space(), *(Case(f"new:{i}", "cell", "float") for i in range(500))]
    monkeypatch.setattr(cases, "space", lambda: grown)
    after = cases.drawn(12)
    newcomers = [c for c in after if c.optimizer.startswith("new:")]
    assert [c for c in after if c not in newcomers] == before[: 12 - len(newcomers)]


def test_a_drawn_case_prints_as_a_line_that_builds_it():
    for case in cases.drawn(40):
        call = ast.parse(case.line, mode="eval").body
        args = [ast.literal_eval(a) for a in call.args]
        kwargs = {k.arg: ast.literal_eval(k.value) for k in call.keywords}
        assert Case(*args, **kwargs) == case
