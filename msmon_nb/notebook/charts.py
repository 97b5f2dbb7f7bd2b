"""Which charts a run's series make: the four core charts, then one per tag group.

Pure (no matplotlib), shared by the browser panel's plan and the matplotlib pictures so
both show the same charts with the same titles.
"""

from __future__ import annotations

from dataclasses import dataclass

CORE_CHARTS = (
    ("loss", ("train/loss",)),
    # before clipping, what the optimizer got after it, and the largest micro-batch
    ("grad_norm", ("train/grad_norm", "train/grad_norm_clipped", "train/micro_grad_norm")),
    ("learning_rate", ("train/learning_rate",)),
    ("throughput (samples/s)", ("train/throughput",)),
)
LOG_BY_DEFAULT = frozenset({"train/grad_norm", "train/loss_scale"})
MAX_RANK_LINES = 8  # beyond that, a distributed run is drawn as its band only
# shown as numbers elsewhere (global_step) or the inverse of a core chart (step_time)
_NOT_CHARTED = frozenset({"train/global_step", "train/step_time"})
MAX_LINES = 6
# tags drawn alone under their own title (another unit than their group's)
_OWN_CHART = {
    "train/linearity": "throughput linearity (throughput / baseline)",
    "train/loss_scale": "loss scale",
    "train/overflow": "loss-scale overflow (1: update skipped)",
}
# groups whose prefix alone says little
_GROUP_TITLES = {
    ("train/compute_time", "train/data_time"): "step time (s): waiting for data vs compute",
}


@dataclass
class Chart:
    """One axes: a title and the tags drawn in it."""

    title: str
    tags: tuple[str, ...]


def base_tag(key: str) -> str:
    """The tag of a series key: ``train/loss@rank1`` and ``train/loss@max`` -> ``train/loss``."""
    return key.split("@", 1)[0]


def plan_charts(tags: list[str]) -> list[Chart]:
    """The four core charts, then one chart per tag prefix (``val/``, ``sys/``...).

    Keys may carry a suffix (``train/loss@rank1``, ``@min``, ``@max``): a distributed
    run's ranks and band are drawn together in the chart of their tag.
    """
    by_base: dict[str, list[str]] = {}
    for key in sorted(tags):
        by_base.setdefault(base_tag(key), []).append(key)
    # a core chart stands before its data arrives; its companions join once recorded
    charts = [
        Chart(title, tuple(k for t in tags_ for k in by_base.get(t, [t] if t == tags_[0] else [])))
        for title, tags_ in CORE_CHARTS
    ]
    core = {t for _, ts in CORE_CHARTS for t in ts}
    groups: dict[str, list[str]] = {}
    for tag in sorted(by_base):
        if tag in core or tag in _NOT_CHARTED or tag.startswith("snap/"):
            continue
        if tag in _OWN_CHART:
            key = _OWN_CHART[tag]
        elif tag.startswith("param/"):
            # param grad_norm / weight_norm / moment1_norm...: one chart per kind
            key = "param " + tag.rsplit("/", 1)[-1]
        else:
            key = tag.split("/", 1)[0] + "/" if "/" in tag else tag
        groups.setdefault(key, []).append(tag)
    for key, members in groups.items():
        keys = [k for tag in members for k in by_base[tag]]
        title = _GROUP_TITLES.get(tuple(members), key)
        if len(members) > MAX_LINES:
            # per-parameter groups (param_stats, optimizer_state) can hold hundreds of
            # tags: one chart per kind, its first lines, and the title says so; every
            # series is still recorded (viewer, load_run)
            shown = {base_tag(k) for k in keys[:MAX_LINES]}
            title = f"{title} (first {len(shown)} of {len(members)})"
        charts.append(Chart(title, tuple(keys[:MAX_LINES])))
    return charts
