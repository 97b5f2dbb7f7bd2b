"""Diagnosis: alert rules over a run's scalar series, with the step each anomaly began.

Rules are small objects over one numeric series each (``grad.py``, ``loss.py``,
``lr.py``, ``steps.py``; ``optim.py`` and ``pipeline.py`` read two or more), configured
by ``monitor_config.alerts`` (``config/alerts.py``, built from the cards of
``config/cards.py``: one card per kind),
run incrementally by ``Diagnoser`` (``engine.py``) or over whole series by ``detect``
(one rule) and ``diagnose`` (all of them). Nothing here imports MindSpore or numpy:
the hot path is plain Python, O(1) per step, about 9-15 us a step for the default
rules on six scalars (``bench/diagnose.py``; a reference MLP step is ~25 ms).

Kinds, default thresholds (``config.cards.CARDS`` has all of them) and onset
(``since_step``; "exact" = the first step of the scripted anomaly in the tests):

=================  ========  ==========================================  ===================
kind               severity  fires when (defaults)                       onset
=================  ========  ==========================================  ===================
grad_explosion     critical  grad_norm >= 10x its running median (and    first step out of
                             5 robust sigmas) 2 steps in a row, or       its noise band:
                             >= 1e6 once                                 exact once visible
grad_vanishing     warning   grad_norm < 1e-3, or 100x below its         exact
                             median, 3 steps in a row
nonfinite          critical  NaN/Inf in train/loss or train/grad_norm    exact
loss_spike         warning   one step far above median, q90 spread and   exact (the step)
                             3x the largest recent excess
loss_divergence    critical  3 steps in a row far above the median       exact (jump);
                             (jump), or the smoothed (winsorised) loss   change point (drift)
                             risen well above its best (drift)
loss_plateau       warning   no significant improvement in 100 steps     exact (first step)
                             while < 10 % below the start                 when not learning
lr_zero            warning   lr <= 0 for 3 steps                         exact
lr_warmup          warning   lr unchanged over the first 3 steps while   exact (first step)
                             a warmup is configured, or tiny (<= 1e-7)
lr_decay           warning   lr within 10 % of its peak at ``expect_by``  last lr change
                             (only when ``expect_by`` is configured)
lr_rise            warning   lr up at each of 3 collected steps and      exact (first step
                             >= 2x its earlier peak, after its warmup    of the rise)
                             (undeclared; ``until`` declares one)
rising_trend       warning   log-loss and log grad_norm (or lr x         change point of a
                             grad_norm) rising together over 30 steps:   flat-then-rising
                             loss slope t >= 1, partner x2 with t >= 6,  fit, late end of
                             3 steps in a row; or grad_norm alone flat   its interval
                             then rising x2 (hinge fit over 60 steps,
                             t >= 6, 2 steps) while the loss is not
                             falling, after grad_norm's early growth
data_bound         warning   median data share >= 50 % over 10 steps     first data-bound
                             and median wait >= 1 ms                     step of the window
adam_v_stale       warning   grad_norm^2 / ||v|| (Adam's second moment,  first step out of
                             param/*/moment2_norm, optimizer_state       its band: exact
                             tracked) >= 10x its running median and 5    for a sudden
                             robust sigmas: updates g/sqrt(v) far larger return of the
                             than usual, a loss spike follows            gradient
layer_rise         warning   one parameter's gradient norm or update     first step of the
                             ratio, less the model-wide move, >= 5x      parameter's rise
                             its own level and 6 robust sigmas, 2 steps
                             (or x30 once), while grad_norm rose
                             < x10; fed per-parameter rows by the
                             monitor (``update_layers``)
nonfinite_origin   critical  an act/<module>/nonfinite > 0 (or a NaN     exact; names the
                             max_abs): the first module in forward        first module in
                             order whose output is not finite             forward order
output_logit_      warning   the output module's act max_abs (last in    step after it left
divergence                   forward order, or ``module``) x2 over 16    its own band
                             steps, t >= 5, past x2 its earlier peak,
                             >= 10, 2 steps in a row
activation_blowup  warning   a module's act max_abs rising that way      step after it left
                             and x2 faster than every module before it   its own band
                             (the output module left to the rule above)
activation_dying   warning   a module's act zero_frac >= 0.95 for 2      first step of the
                             steps while usually < 0.9                   climb
metric_missing     warning   a tracked 'group/tag' absent after 100      first step
                             collected steps
step_order         warning   a series' step <= its previous step         exact
=================  ========  ==========================================  ===================

"Steps" are collected steps. An anomaly is reported once; it clears after the rule's
hysteresis (for most rules 10 normal steps in a row) and is reported again if it
recurs. Each rule's docstring states exactly when it fires and how its onset is
defined, including the approximate cases.

How a ``Monitor`` uses it (``msmon_nb/monitor/actions.py`` does this)::

    diag = Diagnoser(cfg.alerts, tracked=cfg.track_metrics, rank=rank)   # at open
    for alert in diag.update(step, values):    # each collected step; only NEW alerts
        ...record alert.to_dict(), log alert.message once...
        action = diag.action(alert.kind)       # 'warn' | 'snapshot' | 'stop' | 'debug'
    diag.active()                              # alerts still ongoing, for a panel

Contract for callers:

* ``update(step, values)`` once per collected step, with that step's scalars by tag;
  NaN/Inf are passed as they are (``nonfinite`` looks for them; every other rule
  skips them). Extra calls at the same step with other tags (``mon.log``) are fine;
  the same tag twice at one step is a ``step_order`` alert.
* ``alert.step`` is the confirming step (the current one); ``alert.since_step`` the
  onset (<= step). For a sudden anomaly they are ``patience - 1`` collected steps
  apart (0 for nonfinite, spike, step_order and the ceiling; 1 for explosions; 2 for
  vanishing, divergence, lr_zero); slow growth, drifts and the window rules (plateau,
  metric_missing, lr_decay) can reach further back, so a flight recorder holding the
  last K collected steps shows the onset when K > step - since_step.
* A learning rate changed at step k drives the update *at* step k, so the first loss
  and grad_norm computed on the changed weights are those of step k + 1: that is the
  onset a scenario should expect for an lr spike.
* ``update`` does no I/O and never raises on numeric values, NaN and Inf included.
* ``Diagnoser(settings)`` and ``resolve_settings(alerts)`` raise
  ``msmon_nb.config.ConfigError`` on a bad value, naming key, value and a valid
  example. Numbers may be given as strings ('1e-4'), because PyYAML reads ``1e-4``
  (no dot in the mantissa) as one.
* Two or more optimizers stepping in one iteration record ``opt/<name>/<metric>``
  instead of ``train/loss``/``grad_norm``/``learning_rate``: every rule configured on
  one of those three (and ``nonfinite``'s) is made again for each optimizer when its
  first ``opt/`` series arrives, renamed with its companions and with a convergence
  judge of its own, so one optimizer's series is never compared with another's; the
  alert's tag is the optimizer's series and its message names it ("netd grad_norm
  exploding since step 128 ..."). ``rule(kind, tag)`` is that optimizer's rule.
* ``diagnose(series)`` replays whole series (``mon.series``, ``{tag: run.scalars(tag)}``,
  ``(steps, values)`` tuples) through a fresh engine: the alerts of a run on disk,
  MindSpore-written ones included (remap tags with each rule's ``tag``/``tags``).
"""

from msmon_nb.config.alerts import ACTIONS, KINDS, SCHEMA, defaults, resolve_settings
from msmon_nb.diagnose.alert import Alert
from msmon_nb.diagnose.engine import Diagnoser, diagnose
from msmon_nb.diagnose.rules import SEVERITY, detect

__all__ = [
    "ACTIONS",
    "KINDS",
    "SCHEMA",
    "SEVERITY",
    "Alert",
    "Diagnoser",
    "defaults",
    "detect",
    "diagnose",
    "resolve_settings",
]
