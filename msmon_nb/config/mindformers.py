"""MindFormers' ``monitor_config`` keys read as ours (``TrainingStateMonitor``, mindformers 2.1.0).

A MindFormers YAML loads unchanged. Keys we have a meaning for are mapped onto
``MonitorConfig`` fields (``step_interval``, ``monitor_on``, ``dump_path`` and ``target``
are plain aliases in ``config.ALIASES``); keys asking for something we do not do yet are
named together in one ``MonitorWarning`` and ignored; a value MindFormers itself rejects
is a ``ConfigError`` naming the key, the value and a valid example. A key left at its
"off" value (a ``null`` format, a ``false`` switch) asks for nothing and passes silently,
because MindFormers' templates spell every key out.
"""

from __future__ import annotations

import math
import re
import warnings
from collections.abc import Mapping
from typing import Any

from msmon_nb.config.checks import CORE_METRICS, ConfigError, MonitorWarning, check_regex

# key -> what MindFormers does with it, as the warning names it
UNSUPPORTED = {
    "local_norm_format": "per-parameter local grad norms",
    "max_attention_logit_format": "max attention logits",
    "print_struct": "print the parameter names and stop",
    # its global_norm_spike_threshold is mapped (apply_mindformers); this is the rest
    "health_checkpoint": "checkpoint health by embedding norm (embedding_local_norm_threshold)",
}
FORMAT_KEYS = (
    "local_norm_format",
    "device_local_norm_format",
    "local_loss_format",
    "device_local_loss_format",
    "optimizer_state_format",
    "max_attention_logit_format",
    "weight_state_format",
)
MAPPED = (
    "invert",
    "device_local_norm_format",  # train/local_grad_norm per rank (collect/comm.py)
    "local_loss_format",  # train/local_loss per rank
    "device_local_loss_format",
    "optimizer_state_format",
    "weight_state_format",
    "check_for_global_norm",
    "global_norm_spike_threshold",
    "global_norm_spike_count_threshold",
    "use_skip_data_by_global_norm",
    "stable_rank_config",  # track_metrics stable_rank (collect/stablerank.py)
)
# asked for inside a mapped key, not done: named in the same warning
NESTED_UNSUPPORTED = {
    "stable_rank_config.do_aggregation": (
        "stable rank of weights merged across model-parallel shards (each rank's own "
        "shard is measured)"
    ),
}
KEYS = frozenset(UNSUPPORTED) | frozenset(MAPPED)
# TrainingStateMonitor's threshold when check_for_global_norm is on and none is given
DEFAULT_SPIKE_THRESHOLD = 3.0
# the train-step wrapper's threshold when use_skip_data_by_global_norm is on and none is
# given (BaseTrainer.create_model_wrapper's default)
DEFAULT_SKIP_THRESHOLD = 1.0
_LEADING_FLAGS = re.compile(r"^\(\?([aiLmsux]+)\)")


def _fail(key: str, value: Any, why: str, example: str) -> ConfigError:
    return ConfigError(
        f"monitor_config.{key}={value!r}: {why} (a MindFormers TrainingStateMonitor key); "
        f"for example {example}"
    )


def _format(key: str, value: Any) -> bool:
    """True when the format asks for output; raises on what MindFormers rejects."""
    if value is None:
        return False
    formats = [value] if isinstance(value, str) else value
    if not isinstance(formats, list | tuple) or any(
        f not in ("tensorboard", "log") for f in formats
    ):
        raise _fail(
            key, value, "must be 'tensorboard', 'log', a list of them, or null", f"{key}: ['log']"
        )
    return bool(formats)


def _bool(key: str, value: Any) -> bool:
    if value is None:
        return False
    if not isinstance(value, bool):
        raise _fail(key, value, "must be true or false", f"{key}: true")
    return value


def _threshold(value: Any) -> float:
    key = "global_norm_spike_threshold"
    number = value
    if isinstance(number, str):  # PyYAML (YAML 1.1) reads 1e4 as text
        try:
            number = float(number)
        except ValueError:
            pass
    if (
        isinstance(number, bool)
        or not isinstance(number, int | float)
        or not math.isfinite(number)
        or number <= 0
    ):
        raise _fail(key, value, "must be a number > 0", f"{key}: 3.0")
    return float(number)


def invert_targets(targets: list[str]) -> str:
    """One regex that ``re.search`` finds in a name exactly when none of ``targets`` does.

    MindFormers selects a parameter when any target is found in its name (``re.search``),
    and with ``invert`` selects the others; our consumers search a list of regexes, so the
    inversion is a start-anchored negative lookahead per target. A leading global flag
    group such as ``(?i)`` becomes a scoped one, since Python rejects global flags inside.
    """
    parts = []
    for pattern in targets:
        check_regex("target", pattern, "['layers.[01]']", fail=_fail)
        flags = _LEADING_FLAGS.match(pattern)
        if flags:
            pattern = f"(?{flags.group(1)}:{pattern[flags.end() :]})"
        parts.append(f"(?![\\s\\S]*?(?:{pattern}))")
    return "^" + "".join(parts)


def apply_mindformers(mf: Mapping[str, Any], kwargs: dict[str, Any]) -> list[str]:
    """Map the MindFormers-only keys ``mf`` into ``kwargs`` (our field names).

    Returns the keys that ask for something unsupported, in the order given.
    """
    for key in FORMAT_KEYS:
        if key in mf:
            _format(key, mf[key])
    for key in ("invert", "check_for_global_norm", "use_skip_data_by_global_norm", "print_struct"):
        if key in mf:
            _bool(key, mf[key])
    threshold = None
    if mf.get("global_norm_spike_threshold") is not None:
        threshold = _threshold(mf["global_norm_spike_threshold"])
    count = mf.get("global_norm_spike_count_threshold")
    if count is not None and (isinstance(count, bool) or not isinstance(count, int) or count < 1):
        raise _fail(
            "global_norm_spike_count_threshold",
            count,
            "must be a whole number >= 1",
            "global_norm_spike_count_threshold: 10",
        )
    for key in ("stable_rank_config", "health_checkpoint"):
        if mf.get(key) is not None and not isinstance(mf[key], Mapping):
            raise _fail(key, mf[key], "must be a mapping or null", f"{key}: null")
    ignored = _stable_rank(mf.get("stable_rank_config") or {}, kwargs)

    check = _bool("check_for_global_norm", mf.get("check_for_global_norm"))
    health = mf.get("health_checkpoint") or {}
    if health.get("global_norm_spike_threshold") is not None:
        # 2.1.0's place for the threshold: it also switches the check on, and wins over
        # the deprecated top-level pair (TrainingStateMonitor._init_global_norm_monitor_config)
        threshold = _threshold(health["global_norm_spike_threshold"])
        check = True
    skip = _bool("use_skip_data_by_global_norm", mf.get("use_skip_data_by_global_norm"))
    if check and skip:
        raise ConfigError(
            "monitor_config sets both check_for_global_norm (or "
            "health_checkpoint.global_norm_spike_threshold) and use_skip_data_by_global_norm; "
            "MindFormers allows one of them; for example check_for_global_norm: true, "
            "use_skip_data_by_global_norm: false"
        )
    if check:
        _set_ceiling(kwargs, DEFAULT_SPIKE_THRESHOLD if threshold is None else threshold)
    if skip:
        _set_skip(kwargs, DEFAULT_SKIP_THRESHOLD if threshold is None else threshold, count)
    targets = kwargs.get("param_targets", [".*"])
    if _bool("invert", mf.get("invert")) and isinstance(targets, list | tuple):
        kwargs["param_targets"] = [invert_targets(list(targets))]  # else validate() names it
    for key, metric in (
        ("weight_state_format", "param_stats"),
        ("optimizer_state_format", "optimizer_state"),  # collect/optstate.py
        # each rank records its local norm/loss whenever it tracks the global one
        ("device_local_norm_format", "grad_norm"),
        ("local_loss_format", "loss"),
        ("device_local_loss_format", "loss"),
    ):
        if _format(key, mf.get(key)):
            metrics = kwargs.get("track_metrics", list(CORE_METRICS))
            if isinstance(metrics, list | tuple) and metric not in metrics:
                kwargs["track_metrics"] = [*metrics, metric]

    for key, value in mf.items():
        if key not in UNSUPPORTED:
            continue
        asks = _format(key, value) if key in FORMAT_KEYS else bool(value)
        if key == "health_checkpoint":
            asks = bool(value) and value.get("embedding_local_norm_threshold") is not None
        if asks:
            ignored.append(key)
    return ignored


def _positive(key: str, value: Any, default: int) -> int:
    if value is None:
        return default
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        raise _fail(
            key, value, "must be a whole number >= 1", f"{key.replace('.', ': {')}: {default}}}"
        )
    return value


def _stable_rank(sr: Mapping[str, Any], kwargs: dict[str, Any]) -> list[str]:
    """``stable_rank_config`` as ``track_metrics: [..., stable_rank]``: its
    ``step_interval`` (steps) becomes ``stable_rank_every`` (collected steps: rounded up
    where ``log_interval`` does not divide it), its ``target`` (every parameter when
    null, whatever the monitor's own ``target``) ``stable_rank_targets``. Its
    ``power_iteration_num`` is checked and has no use here: ``metrics.spectral`` stops on
    its own residual. Returns what it asks for that is not done (``do_aggregation``)."""
    interval = _positive("stable_rank_config.step_interval", sr.get("step_interval"), 100)
    _positive("stable_rank_config.power_iteration_num", sr.get("power_iteration_num"), 5)
    target = sr.get("target") or [".*"]
    if not isinstance(target, list | tuple) or isinstance(target, str):
        raise _fail(
            "stable_rank_config.target", target, "must be a list of regexes or null",
            "stable_rank_config: {target: ['attention']}",
        )  # fmt: skip
    for pattern in target:
        check_regex("stable_rank_config.target", pattern, "['attention']", fail=_fail)
    if not _format("stable_rank_config.format", sr.get("format")):
        return []
    metrics = kwargs.get("track_metrics", list(CORE_METRICS))
    if isinstance(metrics, list | tuple) and "stable_rank" not in metrics:
        kwargs["track_metrics"] = [*metrics, "stable_rank"]
    log = kwargs.get("log_interval", 1)
    log = log if isinstance(log, int) and not isinstance(log, bool) and log > 0 else 1
    kwargs["stable_rank_every"] = max(1, math.ceil(interval / log))
    kwargs["stable_rank_targets"] = list(target)
    return ["stable_rank_config.do_aggregation"] if sr.get("do_aggregation") else []


def _explosion(kwargs: dict[str, Any]) -> tuple[dict[str, Any], dict[str, Any]] | None:
    """Copies of the ``alerts`` mapping and its ``grad_explosion`` entry, which the
    MindFormers global-norm keys map onto; None when the user's entry is not a mapping
    (``resolve_settings`` names that bad value)."""
    alerts = kwargs.get("alerts")
    alerts = dict(alerts) if isinstance(alerts, Mapping) else {}
    if alerts.get("grad_explosion") is not None and not isinstance(
        alerts["grad_explosion"], Mapping
    ):
        return None
    return alerts, dict(alerts.get("grad_explosion") or {})


def _set_ceiling(kwargs: dict[str, Any], threshold: float) -> None:
    found = _explosion(kwargs)
    if found is None:
        return
    alerts, explosion = found
    if explosion.get("ceiling", threshold) != threshold:
        raise ConfigError(
            f"monitor_config sets the grad_norm ceiling twice: check_for_global_norm with "
            f"global_norm_spike_threshold={threshold!r} and alerts.grad_explosion.ceiling="
            f"{explosion['ceiling']!r}; keep one, for example alerts: "
            "{grad_explosion: {ceiling: 3.0}}"
        )
    if "grad_explosion" in (alerts.get("disabled") or []):
        raise ConfigError(
            "monitor_config sets check_for_global_norm: true but alerts.disabled lists "
            "grad_explosion, the alert it maps to; for example alerts: {disabled: []}"
        )
    explosion["ceiling"] = threshold
    alerts["grad_explosion"] = explosion
    kwargs["alerts"] = alerts


def _set_skip(kwargs: dict[str, Any], threshold: float, count: int | None) -> None:
    """use_skip_data_by_global_norm: skip the update of a step whose global norm is at or
    above the threshold (fixed, as MindFormers does: no relative criterion), and stop
    after ``global_norm_spike_count_threshold`` such steps in a row."""
    found = _explosion(kwargs)
    if found is None:
        return
    alerts, explosion = found
    for key, value in (("action", "skip"), ("skip_above", threshold)):
        if explosion.get(key, value) != value:
            raise ConfigError(
                f"monitor_config sets use_skip_data_by_global_norm (grad_explosion {key} "
                f"{value!r}) and alerts.grad_explosion.{key}={explosion[key]!r}; keep one, "
                f"for example alerts: {{grad_explosion: {{action: skip, skip_above: "
                f"{threshold!r}}}}}"
            )
    if "grad_explosion" in (alerts.get("disabled") or []):
        raise ConfigError(
            "monitor_config sets use_skip_data_by_global_norm: true but alerts.disabled "
            "lists grad_explosion, the alert it maps to; for example alerts: {disabled: []}"
        )
    explosion.setdefault("skip_relative", False)
    explosion.update(action="skip", skip_above=threshold)
    alerts["grad_explosion"] = explosion
    if count is not None:
        given = alerts.get("max_skips_in_a_row", count)
        if given != count:
            raise ConfigError(
                f"monitor_config sets global_norm_spike_count_threshold={count!r} and "
                f"alerts.max_skips_in_a_row={given!r}; keep one, for example alerts: "
                f"{{max_skips_in_a_row: {count!r}}}"
            )
        alerts["max_skips_in_a_row"] = count
    kwargs["alerts"] = alerts


def warn_ignored(keys: list[str], stacklevel: int = 3) -> None:
    """One ``MonitorWarning`` naming every ignored MindFormers key."""
    if not keys:
        return
    what = {**UNSUPPORTED, **NESTED_UNSUPPORTED, **PYNATIVE_UNSUPPORTED}
    listed = "; ".join(f"{key} ({what.get(key, 'not mapped')})" for key in keys)
    warnings.warn(
        f"msmon: MindFormers monitor_config keys not supported yet, ignored: {listed}. "
        "The rest of the block is used (docs/guide/suites.md, 'Coming from MindFormers').",
        MonitorWarning,
        stacklevel=stacklevel,
    )


# Top-level sections of MindFormers' YAMLs: graph mode (tools/register/template.py) and
# PyNative (pynative/config/config.py ``TrainConfig``). A file with one of them and none of
# our fields is a MindFormers config, whatever else it holds.
SECTIONS = frozenset(
    {
        "run_mode", "trainer", "runner_config", "runner_wrapper", "parallel_config",
        "train_dataset", "train_dataset_task", "lr_schedule", "callbacks", "context",
        "parallel", "recompute_config", "moe_config",
        "training", "parallelism", "lr_scheduler", "checkpoint", "monitor", "recompute",
        "recompute_comm", "profiler", "lora_config", "inference",
    }
)  # fmt: skip
NO_BLOCK = (
    "msmon: this MindFormers config has no monitor_config: (graph mode) or monitor: "
    "(PyNative) block, so it asks msmon_nb for nothing: the defaults are used (every "
    "step, {save_dir!r}). Add a monitor_config: block to set them (docs/guide/suites.md, "
    "'Coming from MindFormers')."
)
# MindFormers 2.1.0's PyNative ``monitor:`` section (pynative/config/config.py):
# sub-section -> its keys
PYNATIVE = {
    "train_state": ("local_norm", "local_loss", "device_norm", "device_loss"),
    "health_checkpoint": (
        "embedding_local_norm_threshold",
        "global_norm_skip_threshold",
        "global_norm_skip_time",
    ),
    "tensorboard": ("output_dir", "log_interval", "queue_size"),
    "moe_monitor": ("save_tokens_per_expert_interval", "target_layers"),
}
PYNATIVE_UNSUPPORTED = {
    "monitor.train_state.local_norm": "per-parameter gradient norms of each micro-batch",
    # declared by 2.1.0's PyNative config; nothing in its trainer reads them
    "monitor.health_checkpoint": (
        "skip and checkpoint-health thresholds, which MindFormers 2.1.0's PyNative trainer "
        "does not act on either"
    ),
    "monitor.moe_monitor": "tokens per expert",
}


def is_mindformers_config(data: Mapping[str, Any], fields: set[str]) -> bool:
    """A MindFormers YAML: one of its top-level sections, none of our field names."""
    return bool(SECTIONS & set(data)) and not fields & set(data)


def _pyfail(key: str, value: Any, why: str, example: str) -> ConfigError:
    return ConfigError(
        f"monitor.{key}={value!r}: {why} (MindFormers' PyNative monitor section); "
        f"for example monitor: {{{example}}}"
    )


def _section(monitor: Mapping[str, Any], name: str) -> Mapping[str, Any]:
    value = monitor.get(name)
    if value is None:
        return {}
    if not isinstance(value, Mapping):
        raise _pyfail(name, value, "must be a mapping", f"{name}: {{}}")
    unknown = sorted(set(value) - set(PYNATIVE[name]))
    if unknown:
        raise _pyfail(
            f"{name}.{unknown[0]}", value[unknown[0]], f"{name} has keys {PYNATIVE[name]}",
            f"{name}: {{{PYNATIVE[name][0]}: ...}}",
        )  # fmt: skip
    return value


def _norm_targets(key: str, value: Any) -> tuple[bool, list[str]]:
    """``local_norm``/``device_norm``: a bool, a name fragment or a list of them, as
    MindFormers reads them (``TrainStateMonitor._parse_norm_config``)."""
    if isinstance(value, bool):
        return value, []
    if isinstance(value, str):
        return bool(value), [value] if value else []
    if isinstance(value, list | tuple) and all(isinstance(v, str) for v in value):
        names = [v for v in value if v]
        return bool(names), names
    raise _pyfail(f"train_state.{key}", value, "must be true/false, a name or a list of names",
                  f"train_state: {{{key}: ['layers.0']}}")  # fmt: skip


def from_pynative(monitor: Any) -> tuple[dict[str, Any], list[str]]:
    """MindFormers' PyNative ``monitor:`` section as our fields, and the keys it asks for
    that we do not do (for ``warn_ignored``).

    ``train_state.device_norm`` (each selected parameter's gradient norm on this device,
    after accumulation) is ``param_stats``' per-parameter ``grad_norm``, its name
    fragments matched as MindFormers matches them (found anywhere in the name);
    ``local_loss``/``device_loss`` track the loss (each rank's ``train/local_loss`` in a
    distributed job); ``tensorboard.output_dir``/``log_interval`` (where and how often
    MindFormers writes its records) are ``save_dir``/``log_interval``. ``queue_size`` is
    its writer's buffer: accepted, no meaning here.
    """
    if not isinstance(monitor, Mapping):
        raise _pyfail("", monitor, "the section must be a mapping", "train_state: {}")
    unknown = sorted(set(monitor) - set(PYNATIVE))
    if unknown:
        raise _pyfail(unknown[0], monitor[unknown[0]], f"the section has {sorted(PYNATIVE)}",
                      "train_state: {device_loss: true}")  # fmt: skip
    kwargs: dict[str, Any] = {}
    ignored: list[str] = []
    state = _section(monitor, "train_state")
    metrics = list(CORE_METRICS)
    for key in ("local_loss", "device_loss"):
        if key in state and not isinstance(state[key], bool):
            raise _pyfail(f"train_state.{key}", state[key], "must be true or false",
                          f"train_state: {{{key}: true}}")  # fmt: skip
    device, names = _norm_targets("device_norm", state.get("device_norm", False))
    if device:
        metrics.append("param_stats")
        if names:
            kwargs["param_targets"] = [re.escape(n) for n in names]
    if metrics != list(CORE_METRICS):
        kwargs["track_metrics"] = metrics
    if _norm_targets("local_norm", state.get("local_norm", ""))[0]:
        ignored.append("monitor.train_state.local_norm")
    board = _section(monitor, "tensorboard")
    if board.get("output_dir"):
        kwargs["save_dir"] = str(board["output_dir"])
        if board.get("log_interval") is not None:
            kwargs["log_interval"] = board["log_interval"]  # validated as ours
    if any(v is not None for v in _section(monitor, "health_checkpoint").values()):
        ignored.append("monitor.health_checkpoint")
    if any(v is not None for v in _section(monitor, "moe_monitor").values()):
        ignored.append("monitor.moe_monitor")
    return kwargs, ignored
