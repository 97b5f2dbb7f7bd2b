"""``Alert``: what a rule found, when it was confirmed and when it began.

An alert carries two steps because the question users need answered is *when did it
start*: a vanishing gradient confirmed after three collected steps began at the first of
them, an explosion confirmed at step 130 left its normal band at step 128. ``step`` is
when the rule became sure; ``since_step`` is the onset.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from msmon_nb.config.cards import chart_of

SEVERITIES = ("warning", "critical")
_ALIASES = {"onset": "since_step", "onset_step": "since_step", "rule": "kind"}


@dataclass(frozen=True)
class Alert:
    """One anomaly, reported once while it lasts (see ``Diagnoser.update``)."""

    step: int
    kind: str
    severity: str
    message: str
    since_step: int
    tag: str = ""
    value: float | None = None
    rank: int | None = None
    # the parameters whose gradient norms rose first and most (``diagnose.blame``), as
    # ``Blamed.to_dict()`` entries; None where no blame was asked or possible
    blame: tuple[dict[str, Any], ...] | None = None

    # Aliases: users reach for "onset" and "rule" as often as for our field names, and
    # alerts read back from disk are dicts; both spellings and both access styles work.
    @property
    def onset(self) -> int:
        """The step the anomaly began (``since_step``)."""
        return self.since_step

    onset_step = onset

    @property
    def rule(self) -> str:
        """The rule that raised it (``kind``)."""
        return self.kind

    def __getitem__(self, key: str) -> Any:
        """``alert["kind"]``, as for the dicts in ``run.alerts``."""
        if key in _ALIASES:
            key = _ALIASES[key]
        return self.to_dict()[key]

    def get(self, key: str, default: Any = None) -> Any:
        """``dict.get`` over ``to_dict()`` and the aliases."""
        try:
            return self[key]
        except KeyError:
            return default

    def to_dict(self) -> dict[str, Any]:
        """Plain JSON-safe data; a NaN or Inf ``value`` becomes the string 'nan'/'inf'/'-inf'.

        Strict JSON has no NaN, and the NaN alert is the one whose value matters most, so
        it is spelled out rather than dropped.
        """
        value: float | str | None = self.value
        if value is not None and not math.isfinite(value):
            value = "nan" if math.isnan(value) else ("inf" if value > 0 else "-inf")
        out = {
            "step": self.step,
            "kind": self.kind,
            "severity": self.severity,
            "message": self.message,
            "since_step": self.since_step,
            "tag": self.tag,
            "value": value,
            "rank": self.rank,
        }
        if self.blame is not None:
            out["blame"] = [dict(entry) for entry in self.blame]
        return out

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> Alert:
        """Inverse of ``to_dict`` (for alerts read back from a run on disk)."""
        value = data.get("value")
        rank = data.get("rank")
        blamed = data.get("blame")
        return cls(
            step=int(data["step"]),
            kind=str(data["kind"]),
            severity=str(data["severity"]),
            message=str(data["message"]),
            since_step=int(data["since_step"]),
            tag=str(data.get("tag", "")),
            value=None if value is None else float(value),
            rank=None if rank is None else int(rank),
            blame=None if blamed is None else tuple(dict(entry) for entry in blamed),
        )


def with_chart(alert: Mapping[str, Any]) -> dict[str, Any]:
    """An alert dict with ``chart``: the tag of the chart it marks (None: every chart of
    the run), from its own tag or its kind's card, so the pages place it without a copy
    of the kinds (alerts read back from older runs included)."""
    return {**alert, "chart": chart_of(str(alert.get("kind", "")), alert.get("tag"))}


def fmt(value: float) -> str:
    """A short human spelling of a number: 3.2e6, 0.043, 1e-5, 12, nan."""
    if not math.isfinite(value):
        return "nan" if math.isnan(value) else ("inf" if value > 0 else "-inf")
    if value == 0:
        return "0"
    text = f"{value:.2g}"
    if "e" in text:
        mantissa, exp = text.split("e")
        return f"{mantissa}e{int(exp)}"
    return text


def fmt_ratio(ratio: float) -> str:
    """'x12', 'x1e4': how many times larger, in the form used by every message."""
    if ratio < 100 and math.isfinite(ratio):
        return f"x{ratio:.0f}" if ratio >= 10 else f"x{ratio:.1f}"
    return "x" + fmt(ratio)
