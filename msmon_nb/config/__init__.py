"""The monitor's configuration: ``MonitorConfig`` and every check on user input.

``checks`` is the leaf every room may import (names, the tag rule, ``ConfigError``,
``MonitorWarning``); ``alerts`` the schema of ``monitor_config.alerts`` (defaults,
validation, resolved thresholds), which the rules in ``diagnose`` read; ``mindformers``
maps MindFormers' ``monitor_config`` keys onto ours; ``model`` is ``MonitorConfig``.
"""

from msmon_nb.config.checks import (
    COMPUTE_TAG,
    CORE_METRICS,
    DATA_TAG,
    KNOWN_METRICS,
    MONITOR_TYPES,
    OPTIONAL_METRICS,
    TAG_RULE,
    ConfigError,
    MonitorWarning,
    check_regex,
    check_tag,
    suggest_tag,
)
from msmon_nb.config.model import ALIASES, MonitorConfig, run_name_from

__all__ = [
    "ALIASES",
    "COMPUTE_TAG",
    "CORE_METRICS",
    "DATA_TAG",
    "KNOWN_METRICS",
    "MONITOR_TYPES",
    "OPTIONAL_METRICS",
    "TAG_RULE",
    "ConfigError",
    "MonitorConfig",
    "MonitorWarning",
    "check_regex",
    "check_tag",
    "run_name_from",
    "suggest_tag",
]
