"""How an optimizer's own code undoes the loss scale of the gradients it receives.

``train/grad_norm`` has every loss scale undone (docs/ARCHITECTURE.md, Tags). Where a train cell
hands the optimizer gradients still scaled -- MindSpore's ``TrainOneStepCell(sens=S)``,
which ``Model`` builds for ``FixedLossScaleManager(S, drop_overflow_update=False)`` --
the optimizer undoes the scale itself, and the optimizer tap sees the gradients before
it does. How it does it is the optimizer's business, and the suites do not agree:

* ``nn.Optimizer``'s convention: ``loss_scale=`` passed to ``__init__`` sets
  ``need_scale`` and ``reciprocal_scale``, and ``construct`` calls ``self.scale_grad``,
  which multiplies by ``reciprocal_scale`` where ``need_scale`` (MindSpore's own
  optimizers, MindCV's Adan);
* MindCV 0.3.0's AdamW and Lion keep ``loss_scale`` from ``nn.Optimizer`` (so
  ``need_scale`` is False), set ``self.reciprocal_scale = 1 / loss_scale`` themselves and
  multiply by it unconditionally in their own ``construct``: trusting ``need_scale``
  recorded 1024x the gradient norm there;
* MindCV's NAdam passes ``loss_scale`` to ``nn.Optimizer`` but its ``construct`` never
  calls ``scale_grad``: its update applies the gradients as scaled.

So the way is read from the code, once per class, from the source of its ``construct``
and the methods of its own it calls (``UndoRule``), and applied per instance with the
values it holds (``UndoRule.factor``). What the code does not show plainly (no source; a
``reciprocal_scale`` used under a condition other than ``need_scale``; a scale kept
under another name) is ``UNKNOWN``: where such an optimizer holds a scale, the factor is
None and the ways in record no norm from what it received (warned once).

Pure Python (``ast``, ``inspect``): no MindSpore here; the values are read by the
caller's ``to_float``.
"""

from __future__ import annotations

import ast
import inspect
import textwrap
from dataclasses import dataclass
from typing import Any

# how a class's construct treats a loss scale
CONVENTION = "convention"  # nn.Optimizer's: reciprocal_scale where need_scale
OWN = "own"  # multiplies by its own reciprocal_scale, whatever need_scale says
UNKNOWN = "unknown"  # the code does not show it plainly

# names that hold a loss scale in an optimizer; a construct that reads another one of
# these than its rule explains is UNKNOWN (``scale_parameter``/``scale_lr`` of
# AdaFactor, ``_scaler_one`` of MindCV's NAdam are not loss scales)
_SCALE_NAMES = ("loss_scale", "reciprocal_scale", "grad_scale", "inv_scale", "unscale")
_DEPTH = 3  # own methods followed from construct


@dataclass(frozen=True)
class UndoRule:
    """What a class's ``construct`` does with a loss scale (``kind``), and whether its
    code undoes one at all (``undoes``: False for MindCV's NAdam, whose update applies
    the scaled gradients it was told about)."""

    kind: str
    undoes: bool

    def factor(self, optimizer: Any, to_float: Any) -> float | None:
        """What the gradients ``optimizer`` receives are multiplied by to undo the loss
        scale they carry by its own account; None where that cannot be proven (an
        ``UNKNOWN`` class that holds a scale). ``to_float`` reads a tensor's value."""
        need = bool(getattr(optimizer, "need_scale", False))
        if self.kind == CONVENTION and not need:
            return 1.0  # (most optimizers, every collected step: no tensor read)
        reciprocal = _value(getattr(optimizer, "reciprocal_scale", None), to_float)
        if self.kind == OWN:
            return reciprocal
        if self.kind == UNKNOWN and (need or (reciprocal is not None and reciprocal != 1.0)):
            return None
        return reciprocal if need and reciprocal is not None else 1.0

    def tapped(self, optimizer: Any, to_float: Any) -> float:
        """What the optimizer tap multiplied its norm by inside the graph
        (``collect.graph._tapped``: ``reciprocal_scale`` where ``OWN`` or
        ``need_scale``), to take it back out."""
        if self.kind == OWN or getattr(optimizer, "need_scale", False):
            value = _value(getattr(optimizer, "reciprocal_scale", None), to_float)
            return value if value else 1.0
        return 1.0


_RULES: dict[type, UndoRule] = {}


def undo_rule(cls: type) -> UndoRule:
    """The rule of the ``construct`` that ``cls`` runs (its own or inherited), found once
    per class."""
    rule = _RULES.get(cls)
    if rule is None:
        rule = _RULES[cls] = _read(cls)
    return rule


def _read(cls: type) -> UndoRule:
    construct = getattr(cls, "construct", None)
    found = _Found()
    if construct is None or not _scan(cls, construct, found, _DEPTH):
        return UndoRule(UNKNOWN, undoes=False)
    if found.unexplained or found.conditional:
        return UndoRule(UNKNOWN, undoes=False)
    if found.own:
        return UndoRule(OWN, undoes=True)
    return UndoRule(CONVENTION, undoes=found.convention)


class _Found:
    """What the scan saw across construct and the own methods it calls."""

    def __init__(self) -> None:
        self.convention = False  # self.scale_grad(...), or reciprocal_scale under need_scale
        self.own = False  # reciprocal_scale used unconditionally
        self.conditional = False  # reciprocal_scale under another condition
        self.unexplained = False  # another loss-scale name read
        self.seen: set[str] = set()


def _scan(cls: type, function: Any, found: _Found, depth: int) -> bool:
    """Read ``function``'s source into ``found``; False where there is no source."""
    try:
        tree = ast.parse(textwrap.dedent(inspect.getsource(function)))
    except (OSError, TypeError, SyntaxError, IndentationError):
        return False
    _visit(tree, found, under=())
    if depth > 0:
        for name in _own_calls(tree):
            method = getattr(cls, name, None)
            if name in found.seen or name == "scale_grad" or method is None:
                continue
            found.seen.add(name)
            if _defined_by_base(cls, name):
                continue  # nn.Optimizer's own helpers (decay_weight, get_lr...): no scale
            _scan(cls, method, found, depth - 1)
    return True


def _visit(node: ast.AST, found: _Found, under: tuple[ast.AST, ...]) -> None:
    """Walk ``node`` keeping the ``if`` tests above each point (``under``)."""
    if isinstance(node, ast.Call) and _self_attr(node.func) == "scale_grad":
        found.convention = True  # nn.Optimizer.scale_grad: the convention itself
    name = _self_attr(node)
    if name == "reciprocal_scale":
        if not under:
            found.own = True
        elif all(_mentions(test, "need_scale") for test in under):
            found.convention = True
        else:
            found.conditional = True
    elif name is not None and name != "need_scale" and name in _SCALE_NAMES:
        found.unexplained = True
    for child in ast.iter_child_nodes(node):
        inside = isinstance(node, ast.If | ast.IfExp) and child is not node.test
        _visit(child, found, (*under, node.test) if inside else under)


def _self_attr(node: ast.AST) -> str | None:
    """``x`` for a ``self.x`` node."""
    if (
        isinstance(node, ast.Attribute)
        and isinstance(node.value, ast.Name)
        and node.value.id == "self"
    ):
        return node.attr
    return None


def _mentions(test: ast.AST, attr: str) -> bool:
    return any(_self_attr(n) == attr for n in ast.walk(test))


def _own_calls(tree: ast.AST) -> list[str]:
    """Names of ``self.<name>(...)`` calls in ``tree``, in order."""
    out = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Call):
            name = _self_attr(node.func)
            if name is not None and name not in out:
                out.append(name)
    return out


def _defined_by_base(cls: type, name: str) -> bool:
    """Whether ``name`` comes from a MindSpore optimizer base (``nn.Optimizer``'s
    helpers), not from the class or a suite's class between them."""
    for klass in cls.__mro__:
        if name in vars(klass):
            return klass.__module__.startswith("mindspore.") and klass.__name__ == "Optimizer"
    return False


def _value(value: Any, to_float: Any) -> float | None:
    if value is None:
        return None
    if isinstance(value, int | float):
        return float(value)
    try:
        return float(to_float(value))
    except (TypeError, ValueError):
        return None


def received_factor(optimizer: Any, to_float: Any) -> tuple[float | None, str | None]:
    """(the factor that brings what ``optimizer`` receives to the unscaled gradient, or
    None where it cannot be proven; a note for the user, or None): ``UndoRule.factor``,
    with a note where the factor is unknown (no number is recorded from what it received)
    or where the optimizer holds a scale its code never undoes (the number is recorded:
    it is the scale MindSpore's ``loss_scale=`` says the gradients carry; the note says
    that the update applies them scaled)."""
    rule = undo_rule(type(optimizer))
    factor = rule.factor(optimizer, to_float)
    name = type(optimizer).__name__
    if factor is None:
        return None, (
            f"{name} holds a loss scale but its code does not show how it undoes it (no "
            "self.scale_grad(...) call and no unconditional reciprocal_scale): "
            "train/grad_norm is not recorded from the gradients it receives; unscale them "
            "before the optimizer (a loss-scale train cell, amp's unscale) or pass the scale "
            "as nn.Optimizer's loss_scale="
        )
    if not rule.undoes and factor != 1.0:
        return factor, (
            f"{name} was given loss_scale={1.0 / factor:g} but its construct never divides "
            "the gradients by it (no scale_grad call, no reciprocal_scale): its update uses "
            f"them as scaled, {1.0 / factor:g}x the loss's own; train/grad_norm is recorded "
            "unscaled"
        )
    return factor, None
