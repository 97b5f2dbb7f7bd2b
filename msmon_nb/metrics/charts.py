"""Which charts a run's series make, in which order: the one chart plan of every page.

The core charts (loss, grad_norm, learning_rate, throughput, step time), then the rest
grouped by prefix: the other ``train/`` tags, ``opt/``, ``val/``, ``param/`` (one chart
per kind, a line per parameter), ``act/`` and ``act_grad/`` (one heatmap each, see below),
``sys/``, then user prefixes, alphabetical inside a group. Counters
(``train/global_step``) and snapshot stats are not charted.

Activations are a heatmap, not lines: 20 modules x 5 statistics made 100 lines nobody
could read. ``act/`` (and ``act_grad/``) is one chart of ``kind: "heatmap"``: a row per
module in the order its tags were first recorded (the forward order: a PyNative step's
hooks record modules as they run, a compiled step in the network's cell order), a column
per collected step, one statistic at a time (``stats``; the page's selector, ``norm``
first). Its ``tags`` hold every series of the group, row after row, so the panel sends
them all; no per-module line chart is planned beside it.

Two or more optimizers stepping in one iteration (a GAN's D and G) write their own series,
``opt/<name>/<metric>``, and no whole-step ``train/loss``/``grad_norm``/``learning_rate``
(docs/ARCHITECTURE.md, Tags): each joins the chart its ``train/<metric>`` would be drawn
in, one line per optimizer labelled by its name (``Chart.labels``), and the chart's title
says so (``Chart.note`` says why the whole-step line is absent).

Pure (no matplotlib, no numpy): the notebook panel, its matplotlib pictures and
``msmon view`` (``/api/charts``) all plan with it, so the same run shows the same charts
with the same titles in the same order everywhere.

``CHART_ASSETS`` is where the chart component both pages draw with lives (uPlot and
``chart.js``, package data beside this package).
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

CHART_ASSETS = Path(__file__).resolve().parents[1] / "static"
CORE_CHARTS = (
    # "loss": what MindSpore's SummaryCollector and SummaryRecord users write
    ("loss", ("train/loss", "loss")),
    # before clipping, what the optimizer got after it, and the largest micro-batch
    ("grad_norm", ("train/grad_norm", "train/grad_norm_clipped", "train/micro_grad_norm")),
    ("learning_rate", ("train/learning_rate",)),
    ("throughput (samples/s)", ("train/throughput",)),
    # the whole step, and its two parts where the monitor can tell them apart
    ("step time (s)", ("train/step_time", "train/data_time", "train/compute_time")),
)
_CORE = frozenset(t for _, ts in CORE_CHARTS for t in ts)
PLACEHOLDERS = 4  # core charts a live panel shows before their data arrives
LOG_BY_DEFAULT = frozenset({"train/grad_norm", "train/loss_scale"})
MAX_RANK_LINES = 8  # beyond that, a distributed run is drawn as its band only
# counters: shown as numbers elsewhere, a diagonal line as a chart
_NOT_CHARTED = frozenset({"train/global_step", "train/epoch"})
# prefixes in chart order after the core charts; any other prefix follows, alphabetical
_GROUP_ORDER = (
    "train", "opt", "val", "param", "act", "act_grad", "attn", "moe", "moe_load", "sys", "msprobe",
)  # fmt: skip
# per-parameter (per-attention-module) groups drawn as one chart per statistic, a line
# per parameter (module)
_PER_STAT = ("param/", "attn/", "moe/")
# per-module groups drawn as one heatmap each: module x step, one statistic at a time
HEATMAP_PREFIXES = ("act/", "act_grad/", "moe_load/")
HEATMAP_TITLES = {
    "act/": "activations (module x step)",
    "act_grad/": "activation gradients (module x step)",
    "moe_load/": "tokens per expert (router.expert x step)",
}
# a heatmap's statistics in this order (``metrics.extent.ACT_STATS``, which needs numpy:
# a test keeps the two equal), any other after them, alphabetical
HEATMAP_STATS = ("norm", "max_abs", "mean", "nonfinite", "zero_frac")
HEATMAP_NOTE = (
    "a row per module, in the order first recorded (forward order); a column per collected "
    "step (long runs: each column the largest value of its steps); colour: log scale where "
    "the statistic is positive; red cells: non-finite, or the module's nonfinite count > 0"
)
OPT_PREFIX = "opt/"
_MSPROBE = "msprobe/"
MAX_LINES = 6
# tags drawn alone under their own title (another unit than their group's)
_OWN_CHART = {
    "train/linearity": "throughput linearity (throughput / baseline)",
    "train/loss_scale": "loss scale",
    "train/overflow": "loss-scale overflow (1: update skipped)",
    # only per optimizer (opt/<name>/updates): how many updates it applied in the step
    "train/updates": "updates per step",
}


@dataclass
class Chart:
    """One axes: a title, the tags (or series keys) drawn in it, its prefix group.

    ``labels``: each key's legend text, parallel to ``tags`` (the key itself but for an
    optimizer's series, which is named by its optimizer); ``note``: why the chart looks
    as it does, shown on hover over its title (empty: nothing to say).
    """

    title: str
    tags: tuple[str, ...]
    group: str = "train"
    labels: tuple[str, ...] = ()
    note: str = ""
    # "line", or "heatmap": ``rows`` (modules, top to bottom) x steps, one of ``stats``
    # drawn at a time; the tag of a cell is ``<group>/<row>/<stat>``
    kind: str = "line"
    rows: tuple[str, ...] = ()
    stats: tuple[str, ...] = ()

    def __post_init__(self) -> None:
        if not self.labels:
            self.labels = self.tags

    @property
    def log(self) -> bool:
        """Drawn on a log y axis unless the user picks linear (grad_norm, loss scale); a
        heatmap's colours are log wherever its statistic is positive."""
        if self.kind == "heatmap":
            return True
        return any(_home(base_tag(k)) in LOG_BY_DEFAULT for k in self.tags)

    def label(self, key: str) -> str:
        """The legend text of one of its keys."""
        return self.labels[self.tags.index(key)]

    def as_json(self) -> dict[str, Any]:
        out: dict[str, Any] = {
            "title": self.title,
            "tags": list(self.tags),
            "labels": list(self.labels),
            "note": self.note,
            "log": self.log,
            "group": self.group,
            "kind": self.kind,
        }
        if self.kind == "heatmap":
            out["rows"] = list(self.rows)
            out["stats"] = list(self.stats)
        return out


def base_tag(key: str) -> str:
    """The tag of a series key: ``train/loss@rank1`` and ``train/loss@max`` -> ``train/loss``."""
    return key.split("@", 1)[0]


def optimizer_of(tag: str) -> tuple[str, str] | None:
    """``opt/netd/grad_norm`` -> ``("netd", "grad_norm")``: the optimizer a series belongs
    to and what it measures; None for any other tag. (``config.checks.optimizer_series``
    is the same rule for the rooms that may not import this one; a test keeps them equal.)"""
    if not tag.startswith(OPT_PREFIX):
        return None
    name, sep, metric = tag[len(OPT_PREFIX) :].partition("/")
    return (name, metric) if name and sep and metric else None


def _home(tag: str) -> str:
    """The tag whose chart a series is drawn in: for an optimizer's ``opt/<name>/<metric>``
    the whole-step ``train/<metric>`` where that has a chart of its own (core or not),
    ``param/<p>/<kind>`` for its per-parameter series; the tag itself otherwise (an
    optimizer's other series: the ``opt/`` group)."""
    found = optimizer_of(tag)
    if found is None:
        return tag
    metric = found[1]
    if metric.startswith("param/"):
        return metric
    whole = "train/" + metric
    return whole if whole in _CORE or whole in _OWN_CHART else tag


def replaced_by_optimizers(tags: Iterable[str]) -> frozenset[str]:
    """The whole-step tags that per-optimizer series stand for among ``tags`` (present
    or not): a live panel plans no placeholder for them, they will not come."""
    homes = {_home(base_tag(t)) for t in tags if t.startswith(OPT_PREFIX)}
    return frozenset(homes & _CORE)


def _group_of(tag: str) -> str:
    if tag.startswith("param/"):
        return "param"
    return tag.split("/", 1)[0] if "/" in tag else ""


def _key_label(key: str, lead: str | None) -> str:
    """A key's legend text: an optimizer's series by the optimizer's name, plus what it
    measures unless that is the chart's ``lead`` metric (``netd``, ``netd
    grad_norm_clipped``); any other key as it is. A rank suffix is kept."""
    tag, at, suffix = key.partition("@")
    found = optimizer_of(tag)
    if found is None:
        return key
    name, metric = found
    text = name if metric == lead else f"{name} {metric}"
    return f"{text}{at}{suffix}"


def _named(title: str, keys: list[str], lead: str | None, group: str) -> Chart:
    """A chart whose keys may hold optimizers' series: labels by optimizer, and the title
    and note say that each optimizer is a line (and why no whole-step line stands
    beside them)."""
    names = sorted({found[0] for k in keys if (found := optimizer_of(base_tag(k)))})
    labels = tuple(_key_label(k, lead) for k in keys)
    if not names:
        return Chart(title, tuple(keys), group, labels)
    count = len(names)
    title = f"{title} · {count} optimizers: one line each" if count > 1 else f"{title} · {names[0]}"
    note = ""
    whole = f"train/{lead}" if lead else None
    if count > 1 and whole in _CORE and not any(base_tag(k) == whole for k in keys):
        note = (
            f"{', '.join(names[:-1])} and {names[-1]} step in each iteration: a whole-step "
            f"{whole} would mix their networks, so it is not recorded and each optimizer's own "
            f"opt/<name>/{lead} is a line of its own"
        )
    return Chart(title, tuple(keys), group, labels, note)


def _group_rank(group: str) -> tuple[int, str]:
    if group in _GROUP_ORDER:
        return _GROUP_ORDER.index(group), ""
    return len(_GROUP_ORDER) + (group == ""), group


def plan_charts(tags: list[str], placeholders: bool = True) -> list[Chart]:
    """The core charts, then one chart per tag group (see the module docstring).

    Keys may carry a suffix (``train/loss@rank1``, ``@min``, ``@max``): a distributed
    run's ranks and band are drawn together in the chart of their tag. An optimizer's
    ``opt/<name>/<metric>`` is drawn in the chart of ``train/<metric>`` (core or of its
    own), after the whole-step keys, optimizers by name. ``placeholders``: the first
    ``PLACEHOLDERS`` core charts stand before their data arrives (a live panel); without
    it (the viewer, a finished run) a chart is planned only for tags present.
    """
    by_base: dict[str, list[str]] = {}
    for key in sorted(tags):
        by_base.setdefault(base_tag(key), []).append(key)
    # whole-step tag -> the optimizers' tags drawn in its chart, by optimizer name
    by_home: dict[str, list[str]] = {}
    for tag in by_base:
        home = _home(tag)
        if home != tag and (home in _CORE or home in _OWN_CHART):
            by_home.setdefault(home, []).append(tag)
    charts = []
    for i, (title, core_tags) in enumerate(CORE_CHARTS):
        keys = [k for t in core_tags for k in by_base.get(t, [])]
        keys += [k for t in core_tags for o in by_home.get(t, []) for k in by_base[o]]
        if not keys and placeholders and i < PLACEHOLDERS:
            keys = [core_tags[0]]
        if keys:
            charts.append(_named(title, keys, _metric(core_tags[0]), "train"))
    in_core = {t for home, ts in by_home.items() if home in _CORE for t in ts}
    groups: dict[str, list[str]] = {}
    for tag in sorted(by_base, key=_group_order):
        if tag in _CORE or tag in in_core or tag in _NOT_CHARTED or tag.startswith("snap/"):
            continue
        groups.setdefault(_chart_key(tag), []).append(tag)
    first_seen = {}
    for key in tags:
        first_seen.setdefault(base_tag(key), len(first_seen))
    for key, members in groups.items():
        if key in HEATMAP_PREFIXES:
            charts.append(_heatmap(key, members, by_base, first_seen))
            continue
        keys = [k for tag in members for k in by_base[tag]]
        title = key
        if len(members) > MAX_LINES:
            # per-parameter groups (param_stats, optimizer_state) can hold hundreds of
            # tags: one chart per kind, its first lines, and the title says so; every
            # series is still recorded (viewer, load_run)
            shown = {base_tag(k) for k in keys[:MAX_LINES]}
            title = f"{title} (first {len(shown)} of {len(members)})"
        home = _home(members[0])
        lead = _metric(home) if home in _OWN_CHART else None
        charts.append(_named(title, keys[:MAX_LINES], lead, _group_of(home)))
    return charts


def _heatmap(
    prefix: str, members: list[str], by_base: dict[str, list[str]], first_seen: dict[str, int]
) -> Chart:
    """The heatmap of one per-module group: rows in the order the modules' tags came
    first in the caller's list (the panel's series in recording order, the viewer's in
    file order: the forward order), stats in ``HEATMAP_STATS`` order."""
    cells: dict[str, dict[str, str]] = {}
    for tag in sorted(members, key=lambda t: first_seen.get(t, len(first_seen))):
        row, _, stat = tag[len(prefix) :].rpartition("/")
        cells.setdefault(row or stat, {})[stat] = tag
    known = {stat for row in cells.values() for stat in row}
    stats = [s for s in HEATMAP_STATS if s in known] + sorted(known - set(HEATMAP_STATS))
    keys = [k for row in cells.values() for s in stats if s in row for k in by_base[row[s]]]
    group = prefix.rstrip("/")
    return Chart(
        HEATMAP_TITLES.get(prefix, f"{group} (module x step)"),
        tuple(keys),
        group,
        note=HEATMAP_NOTE,
        kind="heatmap",
        rows=tuple(cells),
        stats=tuple(stats),
    )


def as_lines(chart: Chart) -> Chart:
    """A heatmap as the line chart of its first statistic, its first ``MAX_LINES``
    modules (the title says so): the kernel's matplotlib pictures draw lines only."""
    if chart.kind != "heatmap" or not chart.stats:
        return chart
    stat = chart.stats[0]
    prefix = chart.group + "/"
    keys = [k for k in chart.tags if base_tag(k).rpartition("/")[2] == stat]
    keys = [k for k in keys if base_tag(k)[len(prefix) :].rpartition("/")[0] in chart.rows]
    title = f"{chart.group} {stat}"
    if len(chart.rows) > MAX_LINES:
        title = f"{title} (first {MAX_LINES} of {len(chart.rows)})"
    return Chart(title, tuple(keys[:MAX_LINES]), chart.group)


def _group_order(tag: str) -> tuple[tuple[int, str], str, str]:
    home = _home(tag)
    return _group_rank(_group_of(home)), home, tag


def _chart_key(tag: str) -> str:
    """Which chart a tag outside the core charts joins (its title before any cap)."""
    home = _home(tag)
    if home in _OWN_CHART:
        return _OWN_CHART[home]
    if home.startswith(_PER_STAT):
        # param grad_norm / weight_norm / moment1_norm...: one chart per kind, a line
        # per parameter
        return home.split("/", 1)[0] + " " + home.rsplit("/", 1)[-1]
    for prefix in HEATMAP_PREFIXES:
        if home.startswith(prefix):
            return prefix
    if home.startswith(_MSPROBE) and home.count("/") >= 3:
        # what msprobe's output keeps under its own names (events.msprobe),
        # msprobe/<kind>/<name>/<op>: one chart per kind and op, a line per name
        parts = home.split("/")
        return f"msprobe {parts[1]} {parts[-1]}"
    return tag.split("/", 1)[0] + "/" if "/" in tag else tag


def _metric(tag: str) -> str:
    return tag.rsplit("/", 1)[-1]
