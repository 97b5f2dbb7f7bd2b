"""The watch active in this process, and a way for the monitor's own framework calls
to pass through it unseen.

A module of its own so that the pieces the watch calls (``optstate``'s compiled
reduction) can say "this call is ours" without importing the watch itself.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import AbstractContextManager, contextmanager
from typing import Protocol


class Passable(Protocol):
    def ours(self) -> AbstractContextManager[None]:
        """Framework calls inside are the monitor's: every hook passes them through."""
        ...


ACTIVE: list[Passable] = []  # the watches entered and not yet exited (one at most)


def active_watch() -> Passable | None:
    """The watch currently active in this process, if any."""
    return ACTIVE[-1] if ACTIVE else None


@contextmanager
def quiet() -> Iterator[None]:
    """Framework calls the monitor itself makes (a reduction compiled for the optimizer
    state) are not the user's steps: inside this block the active watch's hooks pass
    every call through, as they do inside an optimizer call."""
    watch = active_watch()
    if watch is None:
        yield
        return
    with watch.ours():
        yield
