"""What a monitor replaces on MindSpore's (and the suites') classes and modules, seen
from outside: snapshots of their attributes, compared by identity.

A snapshot holds, for every loaded module of MindSpore and the suites, every class they
define and every subclass of ``nn.Cell`` and of the experimental API's ``Optimizer``
wherever defined, each function, class, method or descriptor the owner holds itself
(``vars``), and any attribute whose name says it is ours (``msmon``).
``leftovers(before, after)`` names what is not the same object again after a monitor
closed (replaced, added, removed): a patch never undone, whoever made it, without a list
of who patches what. ``replaced(before, during)`` names what an open monitor replaced:
the list ``docs/CONFORMANCE.md`` keeps (``test_patched.py`` checks it equals this).

Data attributes are left out: MindSpore's modules keep caches and counters that change
as it trains (its compile cache is a set changed in place, whose identity stays).
Nothing here imports msmon_nb.
"""

from __future__ import annotations

import sys
import types
from typing import Any

PACKAGES = ("mindspore", "mindcv", "mindone", "mindocr_shipped", "mindyolo")


def owners() -> dict[tuple[str, int], Any]:
    """Every module of ``PACKAGES`` loaded so far, the classes they define, and every
    ``Cell``/``Optimizer`` subclass defined anywhere (a test's, a suite's cell made in a
    function), by (dotted name, id)."""
    out: dict[tuple[str, int], Any] = {}
    for name, module in list(sys.modules.items()):
        if module is None or name.split(".")[0] not in PACKAGES:
            continue
        out[(name, id(module))] = module
        for value in list(vars(module).values()):
            if isinstance(value, type) and getattr(value, "__module__", None) == name:
                out[(f"{name}.{value.__qualname__}", id(value))] = value
    from mindspore import nn
    from mindspore.experimental import optim

    stack: list[type] = [nn.Cell, optim.Optimizer]
    seen: set[int] = set()
    while stack:
        cls = stack.pop()
        if id(cls) in seen:
            continue
        seen.add(id(cls))
        out[(f"{getattr(cls, '__module__', '?')}.{cls.__qualname__}", id(cls))] = cls
        stack.extend(cls.__subclasses__())
    return out


def snapshot() -> dict[tuple[str, int], dict[str, Any]]:
    """{(owner, id): a copy of its ``vars``} for every owner (copied, not filtered: the
    comparison looks only at what differs, which keeps a snapshot at a few ms)."""
    out: dict[tuple[str, int], dict[str, Any]] = {}
    for key, owner in owners().items():
        try:
            out[key] = dict(vars(owner))
        except TypeError:
            continue
    return out


def _tracked(attr: str, value: Any) -> bool:
    if "msmon" in attr:
        return True
    if isinstance(value, types.ModuleType):
        return False
    return callable(value) or hasattr(type(value), "__get__")


_MISSING = object()


def changed(
    before: dict[tuple[str, int], dict[str, Any]], after: dict[tuple[str, int], dict[str, Any]]
) -> list[str]:
    """``owner.attribute`` of every tracked attribute not the same object in ``after``:
    replaced, removed, or added to an owner that existed ``before`` (owners loaded
    since are new code, not patches)."""
    out = set()
    for key, old in before.items():
        new = after.get(key)
        if new is None:
            continue  # (a class that is gone: nothing of it to restore)
        if _same(old, new):
            continue
        differ = [k for k, v in old.items() if new.get(k, _MISSING) is not v]
        differ = [k for k in differ if _tracked(k, old[k]) or _tracked(k, new.get(k))]
        # added: ours by name or by code; MindSpore adds its own while it compiles
        # (``__ms_tensor_func__`` on the modules a graph's operators come from)
        differ += [k for k in new.keys() - old.keys() if _ours(k, new[k])]
        out.update(f"{key[0]}.{attr}" for attr in differ)
    return sorted(out)


def _ours(attr: str, value: Any) -> bool:
    if "msmon" in attr:
        return True
    module = getattr(value, "__module__", None) or ""
    return _tracked(attr, value) and module.split(".")[0] not in PACKAGES


def _same(old: dict[str, Any], new: dict[str, Any]) -> bool:
    """The fast path: list equality compares identical items without calling ``__eq__``
    (CPython's ``PyObject_RichCompareBool``), so an unchanged owner costs C time only."""
    if old.keys() != new.keys():
        return False
    try:
        return list(old.values()) == list(new.values())
    except Exception:  # noqa: BLE001 -- a value whose == raises (a Tensor): look closer
        return False


def leftovers(before: dict, after: dict) -> list[str]:
    """What is not the original again: ``changed`` from before a monitor to after it."""
    return changed(before, after)


def replaced(before: dict, during: dict) -> list[str]:
    """What an open monitor replaced or added."""
    return changed(before, during)
