"""The detection benchmark's scorer and its published baselines, shared by
``bench/detect.py`` and ``tests/bench/test_detect_frozen.py`` (one implementation, so a
guide's figure and the test guarding it cannot disagree on how they count).

Detectors map a run ``(spec, curves)`` to ``[(step, kind), ...]``: every alert, in order.

* ``ours``: ``msmon_nb.diagnose`` with its defaults over the series the monitor records
  (loss, grad_norm, lr; Adam's ``param/<name>/moment2_norm``; data/compute seconds).
* ``GlobalNorm``: MindFormers' global-norm check (``global_norm_spike_threshold``):
  grad_norm > a threshold. MindFormers' default (1.0) is not scaled to any model; users
  set it from the norms they see early in a healthy run, so here it is ``multiple`` x the
  largest grad_norm of the run's first ``calib`` steps (before any failure's onset: the
  first onset in either set is step 100). The max and not a percentile: a threshold
  below a value already seen in healthy training would stop training on day one, which
  is what makes users raise it. ``multiple`` is the smallest in ``MULTIPLES`` whose false
  alarms on the tuning set do not exceed ours (``calibrate``).
* ``ZClip`` (arXiv 2504.02507): EMA mean and variance of grad_norm (alpha 0.97, seeded
  by the mean and variance of the first 25 steps); a spike when z = (g - mean) / std >
  2.5; the EMA is then fed the clipped value mean + (2.5^2 / z) std, as ZClip does.
* ``Turbulence``: msprobe's ``AnomalyTurbulence`` (``{"rule_name": "AnomalyTurbulence",
  "args": {"threshold": 0.5}}``): grad_norm > (1 + 0.5) x the mean of its history (every
  earlier value, ``statistics.mean(history)`` as msprobe's scanner computes it).

Every baseline also has a NaN/Inf check (MindFormers' ``check_for_nan_in_loss_and_grad``,
msprobe's ``AnomalyNan``), and like ours reports an episode once: a new alert only after
``QUIET`` (10) steps without the condition. ZClip and Turbulence run with their published
thresholds, and again with the threshold raised until their false alarms on the tuning
set do not exceed ours (``*@FA``), so recall and lead are compared at equal false alarms.

Scoring (``evaluate``): a failure run is detected when an alert of a kind that *names*
its failure (``ACCEPT``, ``BASE_ACCEPT``) comes at or after the onset; a NaN alert after
a blow-up is not an early warning of it and does not count for explosions or
divergences. Delay: onset -> first such alert, in collected steps. Lead (slow failures):
the first such alert -> the loss's blow-up point (``blowup_step``). False alarms: every
alert on a healthy run (per 10 k healthy steps), and, reported apart, every alert before
the onset of a failure run.
"""

from __future__ import annotations

import math
import statistics
from collections.abc import Callable, Iterable, Sequence
from typing import Any

from bench.detect_runs import is_converged
from msmon_nb.diagnose import diagnose

DATA_TAG, COMPUTE_TAG = "train/data_time", "train/compute_time"
QUIET = 10  # steps without the condition that end a baseline's episode (ours: base.QUIET)

Alerts = list[tuple[int, str]]
Run = tuple[Any, dict[str, Any]]  # (Spec, curves)
Detector = Callable[[Any, dict[str, Any]], Alerts]

# failure kind -> our alert kinds that name it
ACCEPT: dict[str, set[str]] = {
    "explosion": {"grad_explosion", "loss_divergence"},
    "outlier": {"loss_spike"},
    "vanishing": {"grad_vanishing"},
    "nonfinite": {"nonfinite"},
    "lr_zero": {"lr_zero"},
    "lr_ramp": {"lr_rise", "rising_trend", "loss_divergence", "grad_explosion"},
    "slow_divergence": {"rising_trend", "loss_divergence", "grad_explosion"},
    "plateau": {"loss_plateau"},
    "data_stall": {"data_bound"},
    "adam_spike": {"adam_v_stale", "loss_spike", "loss_divergence", "grad_explosion"},
}
# a baseline's grad_norm alert names every failure that drives grad_norm up; its NaN
# check names only non-finite values
_UP = ("explosion", "outlier", "lr_ramp", "slow_divergence", "adam_spike")
BASE_ACCEPT: dict[str, set[str]] = {
    kind: ({"grad_norm"} if kind in _UP else set()) | ({"nan"} if kind == "nonfinite" else set())
    for kind in ACCEPT
}
LEAD_KINDS = ("lr_ramp", "slow_divergence", "adam_spike")


# --- our rules --------------------------------------------------------------------------


def series(spec: Any, rec: dict[str, Any]) -> dict[str, tuple[list[int], list[float]]]:
    """The tags the monitor records for this run, as ``diagnose`` takes them."""
    steps = list(range(len(rec["loss"])))
    out = {
        "train/loss": (steps, rec["loss"]),
        "train/grad_norm": (steps, rec["grad_norm"]),
        "train/learning_rate": (steps, rec["lr"]),
    }
    if spec.failure in (None, "data_stall") and "data" in rec:  # not timed: not fed
        out[DATA_TAG] = (steps, rec["data"])
        out[COMPUTE_TAG] = (steps, rec["compute"])
    for tag, values in rec.get("opt", {}).items():
        out[tag] = (steps, values)
    return out


def ours_detail(spec: Any, rec: dict[str, Any]) -> list:
    """Our alerts (``Alert`` objects) over the run."""
    return diagnose(series(spec, rec))


def ours(spec: Any, rec: dict[str, Any]) -> Alerts:
    """``msmon_nb.diagnose`` with its defaults."""
    return [(a.step, a.kind) for a in ours_detail(spec, rec)]


# --- baselines --------------------------------------------------------------------------


class _Episodes:
    """One alert per episode: a new one only after ``QUIET`` steps without the condition."""

    def __init__(self) -> None:
        self.active = False
        self.calm = 0

    def hit(self) -> bool:
        self.calm = 0
        if self.active:
            return False
        self.active = True
        return True

    def miss(self) -> None:
        self.calm += 1
        if self.calm >= QUIET:
            self.active = False


def _scan(rec: dict[str, Any], judge: Callable[[int, float], bool]) -> Alerts:
    """Run ``judge(step, grad_norm)`` over the finite steps, plus the NaN/Inf check."""
    out: Alerts = []
    spikes, nans = _Episodes(), _Episodes()
    for s, (loss, g) in enumerate(zip(rec["loss"], rec["grad_norm"], strict=True)):
        if not (math.isfinite(loss) and math.isfinite(g)):
            if nans.hit():
                out.append((s, "nan"))
            continue
        nans.miss()
        if judge(s, g):
            if spikes.hit():
                out.append((s, "grad_norm"))
        else:
            spikes.miss()
    return out


class GlobalNorm:
    """grad_norm > ``multiple`` x max(grad_norm over the first ``calib`` steps)."""

    def __init__(self, multiple: float, calib: int = 50) -> None:
        self.multiple = multiple
        self.calib = calib
        self.name = f"global-norm {multiple:g}x max{calib}"

    def __call__(self, spec: Any, rec: dict[str, Any]) -> Alerts:
        first = [g for g in rec["grad_norm"][: self.calib] if math.isfinite(g)]
        limit = self.multiple * max(first) if first else math.inf
        return _scan(rec, lambda s, g: s >= self.calib and g > limit)


class ZClip:
    """ZClip's spike test: z-score of grad_norm against EMA mean and variance."""

    def __init__(self, z: float = 2.5, alpha: float = 0.97, warmup: int = 25) -> None:
        self.z, self.alpha, self.warmup = z, alpha, warmup
        self.name = f"ZClip z={z:g}"

    def __call__(self, spec: Any, rec: dict[str, Any]) -> Alerts:
        alpha, z_thr = self.alpha, self.z
        seen: list[float] = []
        state = {"mean": 0.0, "var": 0.0}

        def judge(s: int, g: float) -> bool:
            if len(seen) < self.warmup:
                seen.append(g)
                if len(seen) == self.warmup:
                    state["mean"] = statistics.fmean(seen)
                    state["var"] = statistics.pvariance(seen)
                return False
            mean, std = state["mean"], math.sqrt(state["var"])
            z = (g - mean) / std if std > 0 else 0.0
            spike = z > z_thr
            fed = mean + (z_thr * z_thr / z) * std if spike else g
            mean = alpha * mean + (1 - alpha) * fed
            state["mean"] = mean
            state["var"] = alpha * state["var"] + (1 - alpha) * (fed - mean) ** 2
            return spike

        return _scan(rec, judge)


class Turbulence:
    """msprobe's AnomalyTurbulence: grad_norm > (1 + threshold) x the mean of its history."""

    def __init__(self, threshold: float = 0.5) -> None:
        self.threshold = threshold
        self.name = f"Turbulence {threshold:g}"

    def __call__(self, spec: Any, rec: dict[str, Any]) -> Alerts:
        total = [0.0, 0]

        def judge(s: int, g: float) -> bool:
            hit = total[1] > 0 and g > (1 + self.threshold) * total[0] / total[1]
            total[0] += g
            total[1] += 1
            return hit

        return _scan(rec, judge)


# grids the calibration walks, smallest (most sensitive) first
MULTIPLES = (1.5, 2.0, 3.0, 5.0, 10.0, 20.0, 50.0, 100.0)
ZS = (2.5, 3.0, 4.0, 5.0, 6.0, 8.0, 10.0, 15.0, 20.0, 30.0, 50.0)
TURBULENCE = (0.5, 1.0, 2.0, 3.0, 5.0, 10.0, 20.0, 50.0, 100.0)


def calibrate(
    make: Callable[[float], Detector], grid: Sequence[float], runs: Sequence[Run], budget: float
) -> Detector:
    """The most sensitive ``make(p)`` over ``grid`` whose healthy false alarms per 10 k
    steps on ``runs`` (the tuning set) do not exceed ``budget`` (ours there); the least
    sensitive when none does."""
    healthy = [(spec, rec) for spec, rec in runs if spec.failure is None]
    for p in grid:
        det = make(p)
        if false_alarm_rate(det, healthy) <= budget:
            return det
    return make(grid[-1])


# --- scoring ----------------------------------------------------------------------------


def _rolling_median(values: Sequence[float], end: int, width: int) -> float:
    window = [v for v in values[max(0, end - width + 1) : end + 1] if math.isfinite(v)]
    return statistics.median(window) if window else math.inf


def blowup_step(spec: Any, loss: Sequence[float]) -> int | None:
    """Where a slow failure has visibly blown up, the end point of its lead.

    lr ramps and slow divergences: the first step at or after the onset whose loss is not
    finite or 10x the lowest loss before it. Adam spikes (a bounded bump, not a blow-up):
    the first step at or after the onset where the median of the last 5 losses is 3x the
    median of the 50 before the onset (a minibatch is noisy, 5 in a row are not).
    """
    onset = spec.onset or 0
    if spec.failure == "adam_spike":
        base = statistics.median(loss[max(0, onset - 50) : onset])
        for s in range(onset, len(loss)):
            if _rolling_median(loss, s, 5) > 3.0 * base:
                return s
        return None
    best = min((v for v in loss[:onset] if math.isfinite(v)), default=math.inf)
    for s in range(onset, len(loss)):
        v = loss[s]
        if not math.isfinite(v) or v > 10.0 * best:
            return s
        best = min(best, v)
    return None


def false_alarm_rate(detector: Detector, healthy: Iterable[Run]) -> float:
    """Alerts per 10 k steps over healthy runs."""
    alerts = steps = 0
    for spec, rec in healthy:
        alerts += len(detector(spec, rec))
        steps += len(rec["loss"])
    return 1e4 * alerts / max(steps, 1)


def evaluate(
    runs: Iterable[Run],
    detector: Detector,
    accept: dict[str, set[str]],
    lead_kinds: Sequence[str] = LEAD_KINDS,
    blowup: Callable[[Any, Sequence[float]], int | None] = blowup_step,
) -> dict:
    """Per failure kind (in ``accept``'s order): runs, hits, delays, leads before the
    ``blowup`` of the ``lead_kinds`` (and runs that blew up); healthy false alarms and
    their steps; alerts before the onset of failure runs."""
    kinds: dict[str, dict[str, Any]] = {}
    out: dict[str, Any] = {"fa": 0, "healthy_steps": 0, "early": 0, "pre_onset_steps": 0}
    out["fa_converged"] = out["converged_steps"] = 0  # the converged runs' share (issue 36)
    out["fa_list"] = []  # (run, step, alert kind, loss at step 0, best loss up to the step)
    for spec, rec in runs:
        alerts = detector(spec, rec)
        if spec.failure is None:
            out["fa"] += len(alerts)
            for step, kind in alerts:
                seen = [v for v in rec["loss"][: step + 1] if math.isfinite(v)]
                best = min(seen, default=math.nan)
                out["fa_list"].append((spec.name, step, kind, rec["loss"][0], best))
            out["healthy_steps"] += len(rec["loss"])
            if is_converged(spec):
                out["fa_converged"] += len(alerts)
                out["converged_steps"] += len(rec["loss"])
            continue
        k = kinds.setdefault(
            spec.failure, {"runs": 0, "hits": 0, "delay": [], "lead": [], "blowups": 0}
        )
        k["runs"] += 1
        out["early"] += sum(1 for s, _ in alerts if s < spec.onset)
        out["pre_onset_steps"] += spec.onset
        good = [s for s, kind in alerts if s >= spec.onset and kind in accept[spec.failure]]
        blow = blowup(spec, rec["loss"]) if spec.failure in lead_kinds else None
        k["blowups"] += blow is not None
        if good:
            k["hits"] += 1
            k["delay"].append(good[0] - spec.onset)
            if blow is not None:
                k["lead"].append(blow - good[0])
    out["kinds"] = {kind: kinds[kind] for kind in accept if kind in kinds}
    out["fa_per_10k"] = 1e4 * out["fa"] / max(out["healthy_steps"], 1)
    return out


def median(xs: Sequence[float]) -> float | None:
    """The median, or None for no values."""
    return statistics.median(xs) if xs else None


def summary(result: dict) -> dict[str, Any]:
    """Per kind: recall, median delay, median and min lead (None where undefined)."""
    out: dict[str, Any] = {}
    for kind, k in result["kinds"].items():
        out[kind] = {
            "runs": k["runs"],
            "hits": k["hits"],
            "recall": k["hits"] / k["runs"],
            "delay": median(k["delay"]),
            "lead": median(k["lead"]) if k["lead"] else None,
            "lead_min": min(k["lead"]) if k["lead"] else None,
            "blowups": k["blowups"],
        }
    return out


def detectors(tuning: Sequence[Run]) -> dict[str, tuple[Detector, dict[str, set[str]]]]:
    """Ours and the baselines: the published settings, and each calibrated on the tuning
    set to ours' false-alarm rate there (``@FA``); global-norm has no published multiple,
    so only its calibrated form."""
    healthy = [(s, r) for s, r in tuning if s.failure is None]
    budget = false_alarm_rate(ours, healthy)
    gn = calibrate(GlobalNorm, MULTIPLES, healthy, budget)
    zc = calibrate(ZClip, ZS, healthy, budget)
    tb = calibrate(Turbulence, TURBULENCE, healthy, budget)
    return {
        "msmon_nb": (ours, ACCEPT),
        gn.name: (gn, BASE_ACCEPT),
        "ZClip z=2.5": (ZClip(), BASE_ACCEPT),
        f"{zc.name} @FA": (zc, BASE_ACCEPT),
        "Turbulence 0.5": (Turbulence(), BASE_ACCEPT),
        f"{tb.name} @FA": (tb, BASE_ACCEPT),
    }


def _cell(k: dict[str, Any] | None, lead: bool) -> str:
    if k is None:
        return "-"
    text = f"{k['hits']}/{k['runs']}"
    if k["hits"]:
        text += f" d{k['delay']:g}"
    if lead and k["lead"] is not None:
        text += f" L{k['lead']:g}({k['lead_min']:g})"
    return text


def _rate(alerts: int, steps: int) -> str:
    return f"{1e4 * alerts / max(steps, 1):.1f} ({alerts} in {steps})"


def table(results: dict[str, dict], title: str, lead_kinds: Sequence[str] = LEAD_KINDS) -> str:
    """The detection table of one set: a row per failure kind, a column per detector
    (leads shown for ``lead_kinds``); a set of healthy runs only has the false-alarm row
    alone."""
    names = list(results)
    sums = {name: summary(r) for name, r in results.items()}
    kinds = list(next(iter(sums.values())))
    width = 22
    lines = [title]
    head = f"{'failure kind':16} {'runs':>4} {'blew':>4}"
    head += "".join(f" | {name[:width]:>{width}}" for name in names)
    lines += [head, "-" * len(head)]
    for kind in kinds:
        first = sums[names[0]][kind]
        blew = str(first["blowups"]) if kind in lead_kinds else ""
        line = f"{kind:16} {first['runs']:>4} {blew:>4}"
        for name in names:
            line += f" | {_cell(sums[name].get(kind), kind in lead_kinds):>{width}}"
        lines.append(line)
    if kinds:
        lines.append("-" * len(head))
    ours = results[names[0]]
    # false alarms with and without the converged healthy runs (issue 36), when a set
    # has both kinds of healthy runs
    apart = 0 < ours["converged_steps"] < ours["healthy_steps"]
    rows: dict[str, str] = {}
    if kinds:
        rows["all failures"] = f"{sum(s['runs'] for s in sums[names[0]].values()):>4} {'':>4}"
    rows["false alarms/10k"] = f"{'':>4} {'':>4}"
    if apart:
        rows["w/o converged"] = rows["converged runs"] = f"{'':>4} {'':>4}"
    if kinds:
        rows["before onset/10k"] = f"{'':>4} {'':>4}"
    for name in names:
        r = results[name]
        hits = sum(s["hits"] for s in sums[name].values())
        runs = sum(s["runs"] for s in sums[name].values())
        pre = 1e4 * r["early"] / max(r["pre_onset_steps"], 1)
        cells = {
            "all failures": f"{hits}/{runs} {100 * hits / max(runs, 1):.0f}%",
            "false alarms/10k": f"{r['fa_per_10k']:.1f} ({r['fa']} in {r['healthy_steps']})",
            "w/o converged": _rate(
                r["fa"] - r["fa_converged"], r["healthy_steps"] - r["converged_steps"]
            ),
            "converged runs": _rate(r["fa_converged"], r["converged_steps"]),
            "before onset/10k": f"{pre:.1f} ({r['early']})",
        }
        for label in rows:
            rows[label] += f" | {cells[label]:>{width}}"
    lines += [f"{label:16} {row}" for label, row in rows.items()]
    first = ours["fa_list"]
    if first:
        lines.append("")
    for run, step, kind, start, best in first[:5]:
        lines.append(
            f"{names[0]}'s alert on a healthy run: {kind} at step {step} of {run} "
            f"(loss {start:.3g} at step 0, best {best:.3g} up to step {step})"
        )
    if len(first) > 5:
        lines.append(f"... and {len(first) - 5} more")
    return "\n".join(lines)


LEGEND = (
    "cell: detected/runs, d = median delay onset -> first alert naming the failure "
    "(collected steps), L = median (min) lead of that alert before the blow-up point "
    "(lr_ramp, slow_divergence: loss 10x its best or NaN; adam_spike: 5-step median loss "
    "3x its pre-onset median), over the runs that blew up ('blew')"
)
