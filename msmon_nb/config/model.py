"""``MonitorConfig``: what to collect, how often, where to write; every check on user input.

Loaded from keyword arguments, a dict, or YAML (fields at top level or under a
``monitor_config:`` key, as MindFormers configs hold them). MindFormers' own field names
are accepted as aliases. A bad value raises ``ConfigError`` naming the field, the value
and a valid example; code past this module trusts the config.
"""

from __future__ import annotations

import dataclasses
import difflib
import hashlib
import json
import math
import warnings
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from msmon_nb.config.alerts import resolve_settings
from msmon_nb.config.blame import resolve_blame
from msmon_nb.config.checks import (
    CORE_METRICS,
    KNOWN_METRICS,
    MONITOR_TYPES,
    NAME_RE,
    PARAM_STAT_KINDS,
    TAG_RULE,
    ConfigError,
    MonitorWarning,
    check_regex,
    check_regexes,
    check_tag,
    fail,
)
from msmon_nb.config.mindformers import (
    KEYS,
    NO_BLOCK,
    apply_mindformers,
    from_pynative,
    is_mindformers_config,
    warn_ignored,
)
from msmon_nb.expr import ExpressionError, compile_expression

# MindFormers monitor_config names -> ours
ALIASES = {
    "monitor_on": "enable_monitor",
    "dump_path": "save_dir",
    "step_interval": "log_interval",
    "collect_freq": "log_interval",
    "target": "param_targets",
    "summary_dir": "save_dir",
}


@dataclass
class MonitorConfig:
    """How a ``Monitor`` collects and where it writes (docs/guide/configuration.md: every key).

    ``log_interval`` is the collection frequency: loss, grad_norm and lr are read from the
    device only every ``log_interval``-th step, so other steps cost nothing.
    """

    enable_monitor: bool = True
    monitor_type: str | list[str] = "summary"
    project_name: str = "default"
    run_name: str | None = None
    model_name: str | None = None
    log_interval: int = 1
    track_metrics: list[str] = field(default_factory=lambda: list(CORE_METRICS))
    save_dir: str = "./summary"
    use_callback: bool = True
    verbose: bool = False
    param_targets: list[str] = field(default_factory=lambda: [".*"])
    # what param_stats and optimizer_state record of each tensor (metrics.extent): the
    # L2 norm alone by default, so that nothing costs more unless asked
    param_stat_kinds: list[str] = field(default_factory=lambda: ["norm"])
    # the modules whose outputs ``activations`` (and ``act_grad``) record, by regex over
    # their paths; None: the leaves of the parameter tree (modules holding parameters
    # while none of their sub-cells does), at most
    # collect.activations.DEFAULT_MODULES of them, spread over the model's depth
    module_targets: list[str] | None = None
    # modules whose attention signals ``attention`` records beside every
    # nn.MultiheadAttention, by regex over their paths (collect.attnform: the shape they
    # must have)
    attention_targets: list[str] | None = None
    # ``stable_rank`` (collect.stablerank): every how many collected steps the selected
    # weight matrices are read, and which (regexes over parameter names; None:
    # param_targets). Counted in collected steps, so it is a share of collection's cost;
    # 100 as MindFormers' step_interval: one read of every weight is a few training
    # steps' worth of passes over them (bench/stablerank.py)
    stable_rank_every: int = 100
    stable_rank_targets: list[str] | None = None
    batch_size: int | None = None
    alerts: dict[str, Any] = field(default_factory=dict)
    snapshot: dict[str, Any] = field(default_factory=dict)
    break_on: str | None = None
    max_file_size: int | None = None
    flush_secs: float = 1.0
    mlflow_tracking_uri: str | None = None
    throughput_baseline: float | None = None
    # share of training time the monitor may spend collecting (0.02 = 2 %); over it the
    # collection interval doubles (never below log_interval). Off by default: the user's
    # interval is what they asked to see, and on a machine shared with other jobs a
    # noisy timing must not thin their curves unasked (collect.budget).
    overhead_budget: float | None = None
    # which layer started a gradient or loss alert (config.blame: keys and defaults)
    blame: dict[str, Any] = field(default_factory=dict)
    # two or more optimizers in one iteration: the variable of an optimizer, a train
    # cell holding it or the network it trains, in the loop's code -> its series name
    # (opt/<name>/...; collect.parts), e.g. {optD: critic, netG: actor}
    optimizer_names: dict[str, str] = field(default_factory=dict)

    def __post_init__(self) -> None:
        # YAML 1.1 (PyYAML) reads the key ``on`` as the boolean true, so ``snapshot: {on:
        # alert}``, as the guide and our own error messages spell it, arrives as {True: ...}
        snap = self.snapshot
        if isinstance(snap, Mapping) and any(k is True for k in snap) and "on" not in snap:
            self.snapshot = {("on" if k is True else k): v for k, v in snap.items()}
        self.validate()

    # --- construction -----------------------------------------------------------------

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> MonitorConfig:
        """Build from a dict; a nested ``monitor_config`` key is unwrapped.

        MindFormers' ``TrainingStateMonitor`` keys are mapped (``config_mindformers``);
        those we do not support yet are named in one ``MonitorWarning`` and ignored.
        """
        if not isinstance(data, Mapping):
            raise ConfigError(
                f"monitor_config must be a mapping of field names to values, got "
                f"{type(data).__name__}; for example {{'log_interval': 10}}"
            )
        names = {f.name for f in dataclasses.fields(cls)}
        pynative: dict[str, Any] = {}
        ignored: list[str] = []
        if "monitor_config" not in data and is_mindformers_config(data, names | set(ALIASES)):
            if "monitor" in data:  # MindFormers' PyNative trainer's section
                pynative, ignored = from_pynative(data["monitor"])
            else:
                warnings.warn(NO_BLOCK.format(save_dir=cls.save_dir), MonitorWarning, stacklevel=2)
            data = {}
        if "monitor_config" in data:
            inner = data["monitor_config"]
            if not isinstance(inner, Mapping):
                raise ConfigError(
                    f"monitor_config={inner!r} must be a mapping; for example "
                    "monitor_config: {log_interval: 10, save_dir: ./summary}"
                )
            skip = data.get("use_skip_data_by_global_norm")
            data = inner
            if skip is not None and "use_skip_data_by_global_norm" not in data:
                # MindFormers keeps this switch at the top level of its YAML, beside
                # monitor_config, whose global_norm_spike_* keys it reads
                data = {**data, "use_skip_data_by_global_norm": skip}
        kwargs: dict[str, Any] = dict(pynative)
        given: dict[str, str] = {}  # field -> alias the user wrote
        mindformers: dict[str, Any] = {}
        for key, value in data.items():
            if key in KEYS:
                mindformers[key] = value
                continue
            if key == "target" and value in (None, []):
                continue  # MindFormers: no target selects every parameter
            name = ALIASES.get(key, key)
            if name not in names:
                close = difflib.get_close_matches(str(key), sorted(names | set(ALIASES)), n=1)
                hint = f"; did you mean {close[0]!r}?" if close else ""
                raise ConfigError(
                    f"monitor_config has no field {key!r}{hint} "
                    f"(fields: {', '.join(sorted(names))})"
                )
            if name in kwargs:
                raise ConfigError(f"monitor_config sets {name!r} twice ({key!r} is an alias)")
            kwargs[name] = value
            if name != key:
                given[name] = key
        ignored += apply_mindformers(mindformers, kwargs)
        try:
            config = cls(**kwargs)
        except ConfigError as exc:
            for name, key in given.items():
                if f"monitor_config.{name}=" in str(exc):
                    raise ConfigError(f"{exc} (set as {key!r}, an alias of {name!r})") from None
            raise
        warn_ignored(ignored, stacklevel=3)
        return config

    @classmethod
    def from_yaml(cls, path: str | Path) -> MonitorConfig:
        """Load from a YAML file (top level or under ``monitor_config:``)."""
        import yaml

        p = Path(path)
        try:
            text = p.read_text(encoding="utf-8")
        except OSError as exc:
            raise ConfigError(f"cannot read monitor config {str(path)!r}: {exc.strerror}") from exc
        try:
            data = yaml.safe_load(text) or {}
        except yaml.YAMLError as exc:
            raise ConfigError(f"{str(path)!r} is not valid YAML: {exc}") from exc
        config = cls.from_dict(data)
        config._source = str(p.resolve())
        return config

    @classmethod
    def coerce(cls, value: MonitorConfig | Mapping[str, Any] | str | Path | None) -> MonitorConfig:
        """A config from whatever the user passed (config, dict, YAML path or None)."""
        if value is None:
            return cls()
        if isinstance(value, MonitorConfig):
            return value
        if isinstance(value, str | Path):
            return cls.from_yaml(value)
        return cls.from_dict(value)

    def replace(self, **changes: Any) -> MonitorConfig:
        """A validated copy with ``changes`` applied (aliases accepted)."""
        data = self.to_dict()
        for key, value in changes.items():
            data[ALIASES.get(key, key)] = value
        return MonitorConfig.from_dict(data)

    def to_dict(self) -> dict[str, Any]:
        """Plain-data form, as recorded in ``msmon_run.json``."""
        return dataclasses.asdict(self)

    # --- derived ------------------------------------------------------------------------

    @property
    def sink_types(self) -> list[str]:
        """Output kinds; ``summary`` always first (``mindinsight`` is its alias)."""
        kinds = [self.monitor_type] if isinstance(self.monitor_type, str) else self.monitor_type
        out = ["summary"]
        for kind in kinds:
            kind = "summary" if kind == "mindinsight" else kind
            if kind not in out:
                out.append(kind)
        return out

    def tracks(self, metric: str) -> bool:
        """True when ``metric`` is collected.

        ``step_time`` comes with ``throughput``: throughput is samples over step time,
        so a config listing only the DESIGN core metrics still records where time goes.
        """
        if metric == "step_time" and "throughput" in self.track_metrics:
            return True
        return metric in self.track_metrics

    # --- validation ---------------------------------------------------------------------

    def validate(self) -> None:
        """Raise ``ConfigError`` on the first invalid field."""
        for name in ("enable_monitor", "use_callback", "verbose"):
            value = getattr(self, name)
            if not isinstance(value, bool):
                raise fail(name, value, "must be true or false", f"{name}: true")
        kinds = [self.monitor_type] if isinstance(self.monitor_type, str) else self.monitor_type
        if not isinstance(kinds, list | tuple) or not kinds:
            raise fail("monitor_type", self.monitor_type, "must be a name or a list", "'summary'")
        for kind in kinds:
            if kind not in MONITOR_TYPES:
                close = difflib.get_close_matches(str(kind), MONITOR_TYPES, n=1)
                hint = f" (did you mean {close[0]!r}?)" if close else ""
                raise fail(
                    "monitor_type",
                    kind,
                    f"unknown type{hint}; use one of {MONITOR_TYPES}",
                    "'summary'",
                )
        names = self.optimizer_names
        if not isinstance(names, Mapping) or not all(isinstance(k, str) for k in names):
            raise fail(
                "optimizer_names", names, "must map variable names to names", "{optD: critic}"
            )
        for variable, name in names.items():
            if not isinstance(name, str) or not name or "/" in name or name != name.lower():
                raise fail(
                    "optimizer_names",
                    {variable: name},
                    f"the name must be one lowercase tag group ({TAG_RULE})",
                    "{optD: critic}",
                )
            check_tag(f"opt/{name}/loss", "monitor_config.optimizer_names")
        li = self.log_interval
        if isinstance(li, bool) or not isinstance(li, int) or li <= 0:
            raise fail("log_interval", li, "must be a whole number >= 1", "log_interval: 10")
        if not isinstance(self.track_metrics, list | tuple) or isinstance(self.track_metrics, str):
            raise fail(
                "track_metrics", self.track_metrics, "must be a list", "['loss', 'grad_norm']"
            )
        for metric in self.track_metrics:
            if isinstance(metric, str) and (metric in KNOWN_METRICS):
                continue
            if isinstance(metric, str) and "/" in metric:
                check_tag(metric, "monitor_config.track_metrics[]")
                continue
            close = difflib.get_close_matches(str(metric), KNOWN_METRICS, n=1)
            hint = f" (did you mean {close[0]!r}?)" if close else ""
            raise fail(
                "track_metrics",
                metric,
                f"unknown metric{hint}; known: {', '.join(KNOWN_METRICS)}, or a tag you log "
                f"yourself ({TAG_RULE})",
                "['loss', 'grad_norm', 'val/f1']",
            )
        self._check_save_dir()
        for name in ("project_name", "run_name", "model_name"):
            value = getattr(self, name)
            if value is None and name != "project_name":
                continue
            if not isinstance(value, str) or not NAME_RE.match(value):
                raise fail(
                    name,
                    value,
                    "must be ASCII letters, digits, '_', '-' or '.', with no spaces or '/'",
                    f"{name}: 'gpt2_finetune-01'",
                )
        if not isinstance(self.param_targets, list | tuple) or isinstance(self.param_targets, str):
            raise fail("param_targets", self.param_targets, "must be a list of regexes", "['fc.*']")
        for pattern in self.param_targets:
            check_regex("param_targets", pattern, "['layers\\\\.0\\\\..*']")
        kinds = self.param_stat_kinds
        if not isinstance(kinds, list | tuple) or isinstance(kinds, str) or not kinds:
            raise fail("param_stat_kinds", kinds, "must be a non-empty list", "['norm', 'max_abs']")
        for kind in kinds:
            if kind not in PARAM_STAT_KINDS:
                close = difflib.get_close_matches(str(kind), PARAM_STAT_KINDS, n=1)
                hint = f" (did you mean {close[0]!r}?)" if close else ""
                raise fail(
                    "param_stat_kinds",
                    kind,
                    f"unknown statistic{hint}; known: {', '.join(PARAM_STAT_KINDS)}",
                    "['norm', 'max_abs', 'nonfinite', 'zero_frac']",
                )
        if len(set(kinds)) != len(kinds):
            raise fail("param_stat_kinds", kinds, "lists a statistic twice", "['norm', 'max_abs']")
        check_regexes(
            "module_targets",
            self.module_targets,
            "module paths",
            "the modules holding parameters while none of their sub-cells does",
            "['layers\\\\.0\\\\.', 'head']",
        )
        check_regexes(
            "attention_targets",
            self.attention_targets,
            "module paths",
            "only nn.MultiheadAttention modules",
            "['layers\\\\.\\\\d+\\\\.attention$']",
        )
        self._check_stable_rank()
        bs = self.batch_size
        if bs is not None and (isinstance(bs, bool) or not isinstance(bs, int) or bs <= 0):
            raise fail("batch_size", bs, "must be a whole number >= 1 or null", "batch_size: 64")
        mfs = self.max_file_size
        if mfs is not None and (isinstance(mfs, bool) or not isinstance(mfs, int) or mfs < 4096):
            raise fail(
                "max_file_size", mfs, "must be bytes >= 4096 or null", "max_file_size: 268435456"
            )
        tb = self.throughput_baseline
        if tb is not None and (
            isinstance(tb, bool) or not isinstance(tb, int | float) or not 0 < tb < math.inf
        ):
            raise fail(
                "throughput_baseline",
                tb,
                "must be samples/s per device > 0, or null (YAML reads 1e3 without a dot "
                "as text: write 1.0e3)",
                "throughput_baseline: 1200.0",
            )
        ob = self.overhead_budget
        if ob is not None and (
            isinstance(ob, bool) or not isinstance(ob, int | float) or not 0 < ob < 1
        ):
            raise fail(
                "overhead_budget",
                ob,
                "must be a share of step time in (0, 1), or null (off)",
                "overhead_budget: 0.02",
            )
        fs = self.flush_secs
        if isinstance(fs, bool) or not isinstance(fs, int | float) or not 0 < fs <= 1:
            raise fail("flush_secs", fs, "must be seconds in (0, 1]", "flush_secs: 1.0")
        resolve_blame(self.blame)
        for name in ("alerts", "snapshot"):
            if not isinstance(getattr(self, name), dict):
                raise fail(name, getattr(self, name), "must be a mapping", f"{name}: {{}}")
        if self.break_on is not None:
            if not isinstance(self.break_on, str):
                raise fail(
                    "break_on", self.break_on, "must be an expression string", "'grad_norm > 1e4'"
                )
            try:
                compile_expression(self.break_on)
            except ExpressionError as exc:
                raise ConfigError(f"monitor_config.{exc}") from None
        self._check_snapshot()
        if self.alerts:
            resolve_settings(self.alerts)

    def _check_stable_rank(self) -> None:
        every = self.stable_rank_every
        if isinstance(every, bool) or not isinstance(every, int) or every < 1:
            raise fail(
                "stable_rank_every",
                every,
                "must be a whole number of collected steps >= 1",
                "stable_rank_every: 10",
            )
        check_regexes(
            "stable_rank_targets",
            self.stable_rank_targets,
            "parameter names",
            "param_targets",
            "['attention', 'mlp']",
        )

    @property
    def stable_rank_selection(self) -> list[str]:
        """The regexes that select stable rank's matrices (its own, else param_targets)."""
        targets = self.stable_rank_targets
        return list(targets) if targets is not None else list(self.param_targets)

    def _check_snapshot(self) -> None:
        snap = self.snapshot
        known = {"on": ("never", "alert"), "keep": int, "max_raw": int, "targets": list}
        for key, value in snap.items():
            if key not in known:
                close = difflib.get_close_matches(str(key), list(known), n=1)
                hint = f" (did you mean {close[0]!r}?)" if close else ""
                raise fail(
                    f"snapshot.{key}",
                    value,
                    f"unknown key{hint}",
                    "snapshot: {on: alert, keep: 20}",
                )
        on = snap.get("on", "never")
        if on not in ("never", "alert"):
            raise fail("snapshot.on", on, "must be 'alert' or 'never'", "snapshot: {on: alert}")
        for key in ("keep", "max_raw"):
            value = snap.get(key)
            minimum = 1 if key == "keep" else 0
            if value is not None and (
                isinstance(value, bool) or not isinstance(value, int) or value < minimum
            ):
                raise fail(
                    f"snapshot.{key}", value, f"must be a whole number >= {minimum}", f"{key}: 20"
                )
        targets = snap.get("targets")
        if targets is not None:
            if not isinstance(targets, list):
                raise fail("snapshot.targets", targets, "must be a list of regexes", "['fc.*']")
            for pattern in targets:
                check_regex("snapshot.targets", pattern, "['fc.*']")

    def _check_save_dir(self) -> None:
        value = self.save_dir
        if not isinstance(value, str | Path) or not str(value).strip():
            raise fail("save_dir", value, "must be a directory path", "save_dir: ./summary")
        text = str(value)
        if not text.isascii():
            raise fail(
                "save_dir",
                text,
                "holds non-ASCII characters, which some summary viewers cannot load",
                "save_dir: ./summary",
            )
        if any(ch.isspace() for ch in text):
            raise fail(
                "save_dir",
                text,
                "holds whitespace, which some summary viewers mishandle",
                "save_dir: ./my_runs",
            )
        self.save_dir = text


def run_name_from(params: Mapping[str, Any], model: str = "run", length: int = 8) -> str:
    """``<model>_<hash>``: the same hyper-parameters always give the same short name."""
    blob = json.dumps(params, sort_keys=True, default=str).encode()
    return f"{model}_{hashlib.sha1(blob).hexdigest()[:length]}"
