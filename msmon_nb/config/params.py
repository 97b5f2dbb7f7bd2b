"""The checks a card's parameter may name: each takes a value as YAML gives it and returns
it typed, or raises ``BadValue`` saying what a valid one looks like.

They sit apart from the cards (``config.cards``) so that a card reads as a table, and
apart from the alert schema (``config.alerts``) because that module only composes them
into error messages that name the key, the value and the card's example.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from typing import Any

from msmon_nb.config.checks import TAG_RULE, ConfigError, check_tag, suggest_tag


class BadValue(Exception):
    """A value failed a check; carries why (the schema adds the key and the fix)."""


def number(value: Any) -> float:
    """A finite number; a string such as '1e-4' too, because PyYAML (YAML 1.1) reads
    1e-4 -- no dot in the mantissa -- as a string."""
    if isinstance(value, str):
        try:
            value = float(value)
        except ValueError:
            raise BadValue("must be a finite number") from None
    if isinstance(value, bool) or not isinstance(value, int | float) or not math.isfinite(value):
        raise BadValue("must be a finite number")
    return float(value)


def positive(value: Any) -> float:
    """A number > 0."""
    out = number(value)
    if out <= 0:
        raise BadValue("must be a number > 0")
    return out


def above_one(value: Any) -> float:
    """A factor: a number > 1."""
    out = number(value)
    if out <= 1:
        raise BadValue("must be a number > 1 (a factor)")
    return out


def fraction(value: Any) -> float:
    """A number strictly between 0 and 1."""
    out = number(value)
    if not 0 < out < 1:
        raise BadValue("must be a fraction strictly between 0 and 1")
    return out


def nonnegative(value: Any) -> float:
    """A number >= 0."""
    out = number(value)
    if out < 0:
        raise BadValue("must be a number >= 0")
    return out


def count(minimum: int) -> Callable[[Any], int]:
    """A check for a whole number >= ``minimum`` (a bool is not one)."""

    def check(value: Any) -> int:
        if isinstance(value, bool) or not isinstance(value, int) or value < minimum:
            raise BadValue(f"must be a whole number >= {minimum}")
        return value

    return check


def tag(value: Any) -> str:
    """A tag that keeps the tag rule, with a suggestion when it does not."""
    try:
        return check_tag(value)
    except ConfigError:
        hint = f" (did you mean {suggest_tag(value)!r}?)" if isinstance(value, str) else ""
        raise BadValue(f"breaks the tag rule{hint}: {TAG_RULE}") from None


def tags(value: Any) -> list[str]:
    """A non-empty list of tags."""
    if not isinstance(value, list | tuple) or not value:
        raise BadValue("must be a non-empty list of tags")
    return [tag(one) for one in value]


def optional_count(value: Any) -> int | None:
    """None (not configured) or a whole number >= 1."""
    if value is None:
        return None
    return count(1)(value)


def flag(value: Any) -> bool:
    """true or false."""
    if not isinstance(value, bool):
        raise BadValue("must be true or false")
    return value


def optional_positive(value: Any) -> float | None:
    """None (not configured) or a number > 0."""
    if value is None:
        return None
    return positive(value)


def optional_module(value: Any) -> str | None:
    """None (the default module) or a module's name as its ``act/<module>/...`` tags
    spell it."""
    if value is None:
        return None
    if not isinstance(value, str) or not value or "/" in value:
        raise BadValue("must be a module name as in its act/<module>/... tags, e.g. 'head'")
    return value
