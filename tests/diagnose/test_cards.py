"""The alert cards are the one list of kinds (issue 33, item 3): every kind has one card
and one rule class, the schema is the cards' parameters, and no other module or page
script spells a list of kinds."""

from __future__ import annotations

import ast
import re
from pathlib import Path

import pytest

from msmon_nb.config.alerts import SCHEMA, resolve_settings
from msmon_nb.config.cards import CARDS, KINDS, SKIP_KINDS, SKIP_REASONS, chart_of
from msmon_nb.config.checks import ConfigError
from msmon_nb.diagnose.alert import Alert, with_chart
from msmon_nb.diagnose.rules import RULES, SERIES_RULES, SEVERITY

PACKAGE = Path(__file__).resolve().parents[2] / "msmon_nb"
CARDS_FILE = PACKAGE / "config" / "cards.py"
# (file, line of the literal's start) allowed to hold kind names, and why
ALLOWED = {
    # the cross-rank rules' thresholds per rule function: its keys are the settings
    # groups of ``rank_alerts`` (``straggler_wait`` and ``rank_spike`` are not kinds),
    # a programmatic contract that is not ``monitor_config.alerts``
    ("diagnose/rankrules.py", "DEFAULTS"),
}


def test_every_configurable_kind_has_one_rule_class_and_every_rule_class_a_card():
    assert set(RULES) == set(KINDS)
    for kind, cls in RULES.items():
        assert cls.kind == kind and cls.card is CARDS[kind]
    assert list(SERIES_RULES) == [k for k in KINDS if CARDS[k].feed == "series"]
    assert all(CARDS[k].feed == "ranks" for k in set(CARDS) - set(KINDS))


def test_the_schema_is_the_cards_parameters():
    settings = resolve_settings(None)
    for kind in KINDS:
        card = CARDS[kind]
        assert set(SCHEMA[kind]) == set(card.params)
        assert set(settings[kind]) == {*card.params, "action"}
        assert {k: v for k, v in settings[kind].items() if k != "action"} == card.defaults()
        assert SEVERITY[kind] == card.severity
        for spec in card.params.values():
            spec.check(spec.example)  # the example an error proposes is itself valid
    assert set(SKIP_KINDS) == set(SKIP_REASONS.values())
    assert len(SKIP_REASONS) == len(SKIP_KINDS)  # one reason code per skippable kind


def test_a_bad_value_names_the_key_and_the_cards_example():
    with pytest.raises(ConfigError) as err:
        resolve_settings({"lr_rise": {"factor": 0.5}})
    text = str(err.value)
    assert "lr_rise.factor=0.5" in text and "> 1" in text
    assert "alerts: {lr_rise: {factor: 3.0}}" in text
    with pytest.raises(ConfigError, match=r"skip_above: 10\.0"):
        resolve_settings({"grad_explosion": {"skip_above": "x"}})
    with pytest.raises(ConfigError, match="only the kinds that judge a single step"):
        resolve_settings({"lr_zero": {"action": "skip"}})


def test_an_alert_marks_the_chart_its_tag_or_card_names():
    assert chart_of("grad_vanishing", "") == "train/grad_norm"
    assert chart_of("data_bound", None) == "train/data_time"
    assert chart_of("rank_stopped", "") is None  # every chart of the run
    assert chart_of("loss_spike", "val/loss") == "val/loss"
    alert = Alert(5, "lr_zero", "warning", "m", 3, "", None, None)
    assert with_chart(alert.to_dict())["chart"] == "train/learning_rate"


def _kind_literals(node: ast.AST) -> list[str]:
    """Kind names among the string constants directly inside a literal collection."""
    items: list[ast.AST] = []
    if isinstance(node, ast.Tuple | ast.List | ast.Set):
        items = list(node.elts)
    elif isinstance(node, ast.Dict):
        items = [k for k in node.keys if k is not None] + list(node.values)
    return [i.value for i in items if isinstance(i, ast.Constant) and i.value in CARDS]


def test_no_module_but_the_cards_lists_kinds():
    """A tuple, list, set or dict holding two or more kind names outside
    ``config/cards.py`` is a second list of kinds to keep in step: read the cards."""
    bad = []
    for path in sorted(PACKAGE.rglob("*.py")):
        if path == CARDS_FILE:
            continue
        name = str(path.relative_to(PACKAGE))
        tree = ast.parse(path.read_text())
        allowed = {
            id(node.value)
            for node in ast.walk(tree)
            if isinstance(node, ast.AnnAssign | ast.Assign)
            for target in (node.targets if isinstance(node, ast.Assign) else [node.target])
            if isinstance(target, ast.Name) and (name, target.id) in ALLOWED
        }
        for node in ast.walk(tree):
            kinds = _kind_literals(node)
            if len(kinds) >= 2 and id(node) not in allowed:
                bad.append(f"{name}:{node.lineno}: {kinds}")
    assert not bad, bad


def test_no_page_script_lists_kinds():
    """The pages take the chart an alert marks from its ``chart`` field: no script maps
    kinds (or kind prefixes) to charts."""
    quoted = re.compile(r"""["'`]([a-z_]+)["'`]""")
    bad = []
    for path in sorted(PACKAGE.rglob("*.js")):
        if path.name.endswith(".min.js"):
            continue
        text = re.sub(r"^\s*//.*$", "", path.read_text(), flags=re.M)  # code, not comments
        kinds = {m for m in quoted.findall(text) if m in CARDS}
        prefixes = re.findall(r"""startsWith\(["'`](\w+)["'`]""", text)
        by_prefix = [p for p in prefixes if any(kind.startswith(p) for kind in CARDS)]
        if len(kinds) >= 2 or by_prefix:
            bad.append(f"{path.relative_to(PACKAGE)}: {sorted(kinds)} {by_prefix}")
    assert not bad, bad
