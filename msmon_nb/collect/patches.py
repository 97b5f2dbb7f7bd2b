"""Attributes replaced on MindSpore's classes and modules, and put back exactly.

What the watch and the graph taps replace (``Cell.__call__``, an optimizer class's
``construct``, ``mindspore.amp._all_finite``...) is recorded with whether the owner had
it itself (not inherited), so ``restore`` leaves every owner as it found it: the old
value set again, or the attribute deleted so the inherited one shows through.
"""

from __future__ import annotations

from typing import Any


class Patches:
    """A stack of ``setattr``s to undo, last first."""

    def __init__(self) -> None:
        self.saved: list[tuple[Any, str, Any, bool]] = []

    def __bool__(self) -> bool:
        return bool(self.saved)

    def names(self) -> list[str]:
        """The attribute names replaced, in order."""
        return [name for _, name, _, _ in self.saved]

    def put(self, owner: Any, name: str, value: Any) -> None:
        """``setattr(owner, name, value)``, remembered."""
        had = name in vars(owner)
        old = vars(owner).get(name)
        setattr(owner, name, value)  # first: a refused setattr leaves nothing to undo
        self.saved.append((owner, name, old, had))

    def restore(self) -> None:
        """Undo every ``put``, last first."""
        for owner, name, old, had in reversed(self.saved):
            if had:
                setattr(owner, name, old)
            else:
                delattr(owner, name)
        self.saved.clear()
