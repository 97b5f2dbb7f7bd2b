"""Alert cards: every alert kind declared once, with all that is known about it per kind.

A card says what the rest of the package used to list kind by kind: the severity, each
parameter of ``monitor_config.alerts.<kind>`` with its default, its check and an example
for error messages (``config.alerts`` builds the validation from them), whether
``action: skip`` may hold back a step's update for it (and the reason code the skip
gate writes), how the engine feeds its rule, whether it reads the running level of its
series, the companion tags it reads beside its own, and the chart an alert of it marks
on the pages. The rule classes (``diagnose``) name their card by kind; everything that
iterates over kinds reads ``CARDS``. ``tests/config/test_cards.py`` fails when a kind is
spelled in a list anywhere else, or when cards and rule classes disagree.

The cards live in ``config`` because every room that needs them may import it
(``diagnose``, ``collect``, ``monitor``, ``notebook``, ``sinks``; the viewer reaches them
through ``diagnose``), and because the YAML contract they define is configuration.

Defaults were tuned on healthy curves (synthetic ones and real MindSpore MLP runs with
Momentum, Adam and SGD, see ``tests/diagnose``), so a healthy run raises nothing.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from types import MappingProxyType
from typing import Any, Literal

from msmon_nb.config import params as p
from msmon_nb.config.checks import DATA_TAG as DATA

LOSS = "train/loss"
GRAD = "train/grad_norm"
LR = "train/learning_rate"

# How the engine feeds a kind's rule:
#   series  -- the finite values of the one tag its ``tag`` parameter names
#   values  -- every value of each tag its ``tags`` parameter names, NaN/Inf included
#   steps   -- the step numbers of every series, values unseen
#   several -- two or more series at once, wired by hand in ``diagnose.engine``
#   ranks   -- the series of every rank of a distributed run (``diagnose.rankrules``),
#              not configured under ``monitor_config.alerts``
Feed = Literal["series", "values", "steps", "several", "ranks"]


@dataclass(frozen=True)
class Param:
    """One setting of a kind: its default, the check a given value must pass, and the
    example error messages propose (it must itself pass the check)."""

    default: Any
    check: Callable[[Any], Any]
    example: Any
    # False: read by the monitor's actions, not by the rule (the skip thresholds)
    rule: bool = True
    # True: acts only with ``action: skip``; set with any other action it is an error
    skip_only: bool = False


@dataclass(frozen=True)
class Card:
    """Everything the package knows about one alert kind, in one place."""

    kind: str
    severity: Literal["warning", "critical"]
    feed: Feed
    # the tag of the chart an alert of this kind marks when it carries no tag of its
    # own (an alert with a tag marks that tag's chart); None: every chart of the run
    chart: str | None
    params: Mapping[str, Param] = field(default_factory=dict)
    # ``action: skip`` holds back the update of the step judged, with this reason code
    # written by the skip gate (``collect.skip``); None: the kind cannot be skipped
    # (a whole-run pattern -- a plateau, an lr schedule, a trend -- has no single bad
    # batch to drop)
    skip_code: int | None = None
    # the running level of its series (``diagnose.window.Levels`` keyword arguments),
    # shared by the rules of one tag that read the same kind of window
    level: Mapping[str, bool] | None = None
    # parameters naming tags the rule reads beside its own (``observe(tag, value)``)
    companions: tuple[str, ...] = ()
    # a parameter that must be set (not None) for the rule to run at all
    runs_when: str | None = None
    # alerts of one rank may recur at different onsets: recorded once per onset
    per_onset: bool = False
    # a gradient or loss alert: ``blame`` names the parameters that started it
    blamed: bool = False

    @property
    def configurable(self) -> bool:
        """Whether ``monitor_config.alerts`` has a key for this kind."""
        return self.feed != "ranks"

    @property
    def skippable(self) -> bool:
        """Whether ``action: skip`` is accepted for this kind."""
        return self.skip_code is not None

    def defaults(self) -> dict[str, Any]:
        """Each parameter's default (fresh copies: a list default is not shared)."""
        return {name: _fresh(spec.default) for name, spec in self.params.items()}

    def rule_params(self) -> tuple[str, ...]:
        """The parameters the rule itself reads (not the monitor's skip thresholds)."""
        return tuple(name for name, spec in self.params.items() if spec.rule)


def _fresh(value: Any) -> Any:
    return list(value) if isinstance(value, list) else value


def _tag(default: str) -> Param:
    return Param(default, p.tag, default)


_WINDOWED = {"window": Param(64, p.count(4), 128), "min_history": Param(10, p.count(2), 20)}

_CARDS = (
    Card(
        "grad_explosion",
        "critical",
        "series",
        GRAD,
        {
            "tag": _tag(GRAD),
            "factor": Param(10.0, p.above_one, 100.0),
            "z": Param(5.0, p.positive, 8.0),
            "ceiling": Param(1e6, p.positive, 1e5),
            # with action skip: also skip any step whose grad_norm >= this fixed limit
            # (MindFormers' global_norm_spike_threshold), besides factor x running median
            "skip_above": Param(None, p.optional_positive, 10.0, rule=False, skip_only=True),
            # with action skip: also skip at factor x the running median (false:
            # skip_above and the ceiling only, as MindFormers'
            # use_skip_data_by_global_norm does)
            "skip_relative": Param(True, p.flag, False, rule=False),
            "patience": Param(2, p.count(1), 3),
            **_WINDOWED,
        },
        skip_code=2,
        level={"log": True},
        blamed=True,
    ),
    Card(
        "grad_vanishing",
        "warning",
        "series",
        GRAD,
        {
            "tag": _tag(GRAD),
            "floor": Param(1e-3, p.nonnegative, 1e-4),
            "factor": Param(100.0, p.above_one, 1000.0),
            "patience": Param(3, p.count(1), 5),
            **_WINDOWED,
        },
        level={"log": True},
    ),
    Card(
        "nonfinite",
        "critical",
        "values",
        LOSS,
        {
            "tags": Param([LOSS, GRAD], p.tags, [LOSS, GRAD]),
            "patience": Param(1, p.count(1), 3),
        },
        skip_code=1,
        blamed=True,
    ),
    Card(
        "loss_spike",
        "warning",
        "series",
        LOSS,
        {
            "tag": _tag(LOSS),
            "tail": Param(8.0, p.positive, 10.0),
            "rel": Param(1.0, p.nonnegative, 2.0),
            "hold": Param(3.0, p.nonnegative, 5.0),
            "memory": Param(1000, p.count(1), 5000),
            "scale": Param(0.25, p.nonnegative, 0.5),
            "window": Param(50, p.count(4), 100),
            "min_history": Param(20, p.count(2), 30),
        },
        skip_code=3,
        level={"upper": True},
        blamed=True,
    ),
    Card(
        "loss_divergence",
        "critical",
        "series",
        LOSS,
        {
            "tag": _tag(LOSS),
            "tail": Param(3.0, p.positive, 4.0),
            "rel": Param(0.5, p.nonnegative, 1.0),
            "patience": Param(3, p.count(1), 5),
            "rise": Param(1.0, p.positive, 2.0),
            "giveback": Param(0.5, p.positive, 0.8),
            "span": Param(20, p.count(1), 50),
            "hold": Param(1.0, p.nonnegative, 2.0),
            "memory": Param(1000, p.count(1), 5000),
            "scale": Param(0.25, p.nonnegative, 0.5),
            "window": Param(50, p.count(4), 100),
            "min_history": Param(20, p.count(2), 30),
        },
        level={"upper": True},
        blamed=True,
    ),
    Card(
        "loss_plateau",
        "warning",
        "series",
        LOSS,
        {
            "tag": _tag(LOSS),
            "window": Param(100, p.count(2), 500),
            "min_delta": Param(0.01, p.fraction, 0.001),
            "span": Param(10, p.count(1), 20),
            "max_progress": Param(0.1, p.positive, 1.0),
        },
    ),
    Card(
        "lr_zero",
        "warning",
        "series",
        LR,
        {"tag": _tag(LR), "patience": Param(3, p.count(1), 5)},
    ),
    Card(
        "lr_warmup",
        "warning",
        "series",
        LR,
        {
            "tag": _tag(LR),
            "warmup_steps": Param(None, p.optional_count, 2000),
            "tiny": Param(1e-7, p.nonnegative, 1e-8),
            "patience": Param(3, p.count(2), 5),
        },
    ),
    Card(
        "lr_decay",
        "warning",
        "series",
        LR,
        {
            "tag": _tag(LR),
            "expect_by": Param(None, p.optional_count, 10000),
            "min_drop": Param(0.1, p.fraction, 0.5),
        },
        runs_when="expect_by",
    ),
    Card(
        "lr_rise",
        "warning",
        "series",
        LR,
        {
            "tag": _tag(LR),
            "factor": Param(2.0, p.above_one, 3.0),
            "patience": Param(3, p.count(2), 5),
            "settle": Param(10, p.count(1), 20),
            "until": Param(None, p.optional_count, 5000),
        },
    ),
    Card(
        "rising_trend",
        "warning",
        "series",
        LOSS,
        {
            "tag": _tag(LOSS),
            "grad_tag": _tag(GRAD),
            "lr_tag": _tag(LR),
            "window": Param(30, p.count(5), 50),
            "factor": Param(1.0, p.positive, 1.5),
            "companion_factor": Param(2.0, p.above_one, 3.0),
            "t": Param(6.0, p.positive, 8.0),
            "loss_t": Param(1.0, p.nonnegative, 2.0),
            "lead_t": Param(6.0, p.positive, 7.0),
            "lead_patience": Param(2, p.count(1), 3),
            "patience": Param(3, p.count(1), 5),
            "min_history": Param(30, p.count(2), 50),
        },
        companions=("grad_tag", "lr_tag"),
        blamed=True,
    ),
    Card(
        "layer_rise",
        "warning",
        "several",
        GRAD,
        {
            # tuned on bench/layers.py --tuning (z 6/8, factor 3/5, jump 30/100): the
            # held-out set was frozen before and not looked at while choosing
            "z": Param(6.0, p.positive, 8.0),
            "factor": Param(5.0, p.above_one, 10.0),
            "jump": Param(30.0, p.above_one, 100.0),
            "global_factor": Param(10.0, p.above_one, 5.0),
            "patience": Param(2, p.count(1), 3),
            "window": Param(50, p.count(4), 100),
            "min_history": Param(20, p.count(2), 30),
        },
    ),
    # fed every attn/<module>/max_logit (``track_metrics: [..., attention]``); the alert
    # carries the module's tag, so it marks that module's chart. Tuned on bench/attn.py
    # --tuning (factor 2/3/4, t 3/5, min_logit 5/10, window 8/16, patience 1/2): the
    # held-out set was frozen before and not looked at while choosing
    Card(
        "attention_logit_growth",
        "warning",
        "several",
        None,
        {
            "factor": Param(2.0, p.above_one, 8.0),
            "t": Param(5.0, p.positive, 8.0),
            "min_logit": Param(10.0, p.positive, 20.0),
            "patience": Param(2, p.count(1), 3),
            "window": Param(16, p.count(4), 32),
            "min_history": Param(20, p.count(2), 30),
        },
    ),
    # fed every act/<module>/<stat> (``track_metrics: [..., activations]``), one step's
    # modules in forward order; each alert carries its first module's tag. Tuned on
    # bench/actrules.py --tuning (output: min_logit 2/5/10, factor 1.5/2/3, t 3/5, window
    # 8/16; blowup: factor 1.5/2/3, t 3/5, window 8/16; dying: dead 0.95/0.99, patience
    # 1/2/3): the held-out set was frozen before any rule was written. The tuning set's
    # picks for the growth rules (factor 1.5, min_logit 5: one step earlier there) warned
    # while the networks of tests/diagnose/test_rules_activations.py learned: the growth
    # rules keep the hand-set defaults (factor 2, min_logit 10); dying takes dead 0.95,
    # patience 2
    Card("nonfinite_origin", "critical", "several", None),
    Card(
        "output_logit_divergence",
        "warning",
        "several",
        None,
        {
            "module": Param(None, p.optional_module, "head"),
            "factor": Param(2.0, p.above_one, 4.0),
            "t": Param(5.0, p.positive, 8.0),
            "min_logit": Param(10.0, p.positive, 20.0),
            "patience": Param(2, p.count(1), 3),
            "window": Param(16, p.count(4), 32),
            "min_history": Param(20, p.count(2), 30),
        },
    ),
    Card(
        "activation_blowup",
        "warning",
        "several",
        None,
        {
            "factor": Param(2.0, p.above_one, 4.0),
            "t": Param(5.0, p.positive, 8.0),
            "patience": Param(2, p.count(1), 3),
            "window": Param(16, p.count(4), 32),
            "min_history": Param(20, p.count(2), 30),
        },
    ),
    Card(
        "activation_dying",
        "warning",
        "several",
        None,
        {
            "dead": Param(0.95, p.fraction, 0.99),
            "usual_below": Param(0.9, p.fraction, 0.8),
            "patience": Param(2, p.count(1), 5),
            "window": Param(50, p.count(4), 100),
            "min_history": Param(10, p.count(2), 20),
        },
    ),
    Card(
        "adam_v_stale",
        "warning",
        "several",
        LOSS,
        {
            "grad_tag": _tag(GRAD),
            "factor": Param(10.0, p.above_one, 30.0),
            "z": Param(5.0, p.positive, 8.0),
            "patience": Param(1, p.count(1), 2),
            "window": Param(64, p.count(4), 128),
            "min_history": Param(20, p.count(2), 30),
        },
    ),
    Card("metric_missing", "warning", "several", LOSS, {"patience": Param(100, p.count(1), 500)}),
    Card(
        "data_bound",
        "warning",
        "several",
        DATA,
        {
            "share": Param(0.5, p.fraction, 0.6),
            "window": Param(10, p.count(2), 20),
            "min_wait": Param(0.001, p.nonnegative, 0.005),
        },
    ),
    Card("step_order", "warning", "steps", LOSS),
    # across the ranks of a distributed run (diagnose.rankrules; their thresholds are
    # rankrules.DEFAULTS, not user settings)
    Card("grad_norm_mismatch", "critical", "ranks", GRAD),
    Card("loss_spread", "warning", "ranks", LOSS),
    Card("straggler", "warning", "ranks", None),
    Card("rank_grad_spike", "warning", "ranks", None, per_onset=True),
    Card("rank_loss_spike", "warning", "ranks", None, per_onset=True),
    Card("rank_stopped", "critical", "ranks", None),
)

# kind -> card, in the order the engine evaluates the rules
CARDS: Mapping[str, Card] = MappingProxyType({c.kind: c for c in _CARDS})
# the kinds ``monitor_config.alerts`` configures
KINDS: tuple[str, ...] = tuple(c.kind for c in _CARDS if c.configurable)
# the kinds ``action: skip`` accepts, alphabetical (as error messages list them)
SKIP_KINDS: tuple[str, ...] = tuple(sorted(c.kind for c in _CARDS if c.skippable))
# kinds whose alerts carry a blame (``diagnose.blame``): the gradient and loss families
BLAME_KINDS: tuple[str, ...] = tuple(c.kind for c in _CARDS if c.blamed)
# kind -> "warning" | "critical", every kind
SEVERITY: Mapping[str, str] = MappingProxyType({c.kind: c.severity for c in _CARDS})
# skip gate reason code -> the kind whose criterion failed
SKIP_REASONS: Mapping[int, str] = MappingProxyType(
    {c.skip_code: c.kind for c in _CARDS if c.skip_code is not None}
)


def card(kind: str) -> Card:
    """The card of ``kind``; ``ValueError`` naming the known kinds for an unknown one."""
    found = CARDS.get(kind)
    if found is None:
        raise ValueError(f"unknown alert kind {kind!r}; kinds: {', '.join(CARDS)}")
    return found


def chart_of(kind: str, tag: str | None) -> str | None:
    """The tag of the chart an alert marks: its own tag, else its card's chart (None:
    every chart; an unknown kind, as an alert from a newer version, marks the loss)."""
    if tag:
        return tag
    found = CARDS.get(kind)
    return found.chart if found is not None else LOSS
