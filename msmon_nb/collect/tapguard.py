"""A tap of ours that cannot compile inside the user's graph is switched off, and the
user's step runs without it: a monitor failure never ends training.

The taps (``collect.graph``, ``collect.gradtaps``) are compiled into the user's own
graphs. Should one fail to compile there (a MindSpore release parsing differently, a
gradient type we never met), the error surfaces from the user's call. MindSpore's compile
errors name every file of the graph's code ("In file .../msmon_nb/collect/graph.py:..."),
and a compile error means no line of the graph ran, so the call is run again, once,
with every wrapper removed and the compiled graphs dropped: it then runs exactly once.
A failure of the user's own code that passes through a wrapper of ours names our file
too; the retry then fails as it would have, and that error is the one raised.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from pathlib import Path
from typing import Any

_OURS = str(Path(__file__).resolve().parent)

ACTS_FAILED = (
    "the activation/attention taps of msmon_nb could not compile inside your {where} "
    "({error}); they are switched off and your step ran without them: act/... and "
    "attn/... of compiled steps are not recorded from here on in this run (the rest is). "
    "Please report this with the error"
)

TAP_FAILED = (
    "a grad_norm/lr tap of msmon_nb could not compile inside your {where} ({error}); it "
    "is switched off and your step compiled and ran without it: train/grad_norm and "
    "train/learning_rate (and act/..., attn/... where they were on) of compiled steps are "
    "not recorded from here on in this run (the rest is). Please report this with the error"
)


class TapSet:
    """The taps installed in one step's graphs (the optimizer taps, the activation and
    attention classes), switched off together when one fails to compile: the retry must
    compile none of ours."""

    def __init__(self, *taps: Any) -> None:
        self.taps = [t for t in taps if t is not None]

    @property
    def installed(self) -> bool:
        return any(t.installed for t in self.taps)

    def uninstall(self) -> None:
        for tap in self.taps:
            if tap.installed:
                tap.uninstall()


def failed_in_our_wrapper(exc: BaseException) -> bool:
    """Whether a graph failed to compile with a wrapper of ours in it."""
    return _OURS in str(exc)


def first_line(exc: BaseException) -> str:
    """The error's type and first non-blank line, short enough for a warning."""
    text = next((line.strip() for line in str(exc).splitlines() if line.strip()), "")
    return f"{type(exc).__name__}: {text[:200]}"


def run_unwrapped_on_failure(
    call: Callable[[], Any],
    taps: Any,
    cells: Iterable[Any],
    warn: Callable[[str], None],
    where: str,
) -> Any:
    """``call()``; if it fails compiling a wrapper of the installed ``taps``: uninstall
    them, drop the compiled graphs of ``cells`` (their ``compile_cache``), call again,
    and ``warn`` (once the retry has run, so the warning is only given when it was ours)."""
    try:
        return call()
    except Exception as exc:
        if taps is None or not taps.installed or not failed_in_our_wrapper(exc):
            raise
        taps.uninstall()
        drop_compiled(cells)
        out = call()
        warn(TAP_FAILED.format(where=where, error=first_line(exc)))
        return out


def run_collected(
    call: Callable[[], Any],
    graph: Any,
    keyer: Any,
    switch_off: Callable[[], None],
    warn: Callable[[str], None],
    where: str,
) -> Any:
    """``call()`` with ``graph``'s activation and attention classes swapped in and what
    compiles keyed apart (``acttaps.GraphActivations.collecting``: a collected step). If
    it fails compiling a wrapper of ours, the classes are back, ``switch_off()`` keeps
    them off, and ``call()`` runs again with the graph the other steps run (a compile
    error means nothing ran), then ``warn``: training goes on without them."""
    try:
        with graph.collecting(keyer):
            return call()
    except Exception as exc:
        if not failed_in_our_wrapper(exc):
            raise
        error = exc
    switch_off()
    out = call()
    warn(ACTS_FAILED.format(where=where, error=first_line(error)))
    return out


def drop_compiled(cells: Iterable[Any]) -> None:
    """Empty each cell's own compile cache, so its next call compiles again."""
    for cell in cells:
        cache = getattr(cell, "compile_cache", None)
        if isinstance(cache, set):
            cache.clear()
