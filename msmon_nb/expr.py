"""``break_on`` expressions: a tiny, safe language over a step's scalars.

``grad_norm > 1e4``, ``isnan(loss) or step >= 500``, ``val_f1 < 0.2 and step > 100``.
Names are the step's scalars by short name (``loss``, ``grad_norm``, ``learning_rate``
alias ``lr``, ``throughput``, ``step_time``), every tag with ``/`` as ``_``
(``val/f1`` -> ``val_f1``), and ``step``. Only comparisons, ``and``/``or``/``not``,
arithmetic, numbers and the functions below are allowed, checked when the expression is
compiled, so a typo is a clear error before training starts, never an ``eval`` of
arbitrary code. A name missing at a step (not collected yet) makes the expression false.
"""

from __future__ import annotations

import ast
import math
from collections.abc import Mapping
from typing import Any

FUNCTIONS = {
    "isnan": math.isnan,
    "isinf": math.isinf,
    "isfinite": math.isfinite,
    "abs": abs,
    "min": min,
    "max": max,
    "log10": math.log10,
}
_ALLOWED = (
    ast.Expression,
    ast.BoolOp,
    ast.And,
    ast.Or,
    ast.UnaryOp,
    ast.Not,
    ast.USub,
    ast.UAdd,
    ast.BinOp,
    ast.Add,
    ast.Sub,
    ast.Mult,
    ast.Div,
    ast.Pow,
    ast.Compare,
    ast.Lt,
    ast.LtE,
    ast.Gt,
    ast.GtE,
    ast.Eq,
    ast.NotEq,
    ast.Name,
    ast.Load,
    ast.Constant,
    ast.Call,
)


class ExpressionError(ValueError):
    """A break_on expression that cannot be used; the message says why and gives an example."""


class _Missing(Exception):
    pass


def compile_expression(text: str) -> Expression:
    """Parse and check ``text``; raises ``ExpressionError`` naming the problem."""
    if not isinstance(text, str) or not text.strip():
        raise ExpressionError(f"break_on={text!r} is empty; for example 'grad_norm > 1e4'")
    try:
        tree = ast.parse(text.strip(), mode="eval")
    except SyntaxError as exc:
        raise ExpressionError(
            f"break_on={text!r} is not an expression ({exc.msg}); for example 'grad_norm > 1e4'"
        ) from None
    for node in ast.walk(tree):
        if not isinstance(node, _ALLOWED):
            raise ExpressionError(
                f"break_on={text!r}: {type(node).__name__} is not allowed; use comparisons, "
                "and/or/not, arithmetic and isnan/isinf/isfinite/abs/min/max/log10"
            )
        if isinstance(node, ast.Call):
            if not isinstance(node.func, ast.Name) or node.func.id not in FUNCTIONS:
                raise ExpressionError(
                    f"break_on={text!r}: only {', '.join(FUNCTIONS)} can be called"
                )
            if node.keywords:
                raise ExpressionError(f"break_on={text!r}: keyword arguments are not allowed")
        if isinstance(node, ast.Constant) and not isinstance(node.value, int | float):
            raise ExpressionError(f"break_on={text!r}: only numbers can be constants")
    return Expression(text.strip(), tree)


def names_for(step: int, values: Mapping[str, float]) -> dict[str, float]:
    """The names an expression sees for one step."""
    env: dict[str, float] = {"step": float(step)}
    for tag, value in values.items():
        env[tag.replace("/", "_").replace("-", "_").replace(".", "_")] = value
        short = tag.split("/", 1)[1] if tag.startswith("train/") else None
        if short:
            env[short] = value
    if "learning_rate" in env:
        env["lr"] = env["learning_rate"]
    return env


class Expression:
    """A checked expression; call ``evaluate(step, values)``."""

    def __init__(self, text: str, tree: ast.Expression) -> None:
        self.text = text
        self._tree = tree

    def __repr__(self) -> str:
        return f"Expression({self.text!r})"

    def evaluate(self, step: int, values: Mapping[str, float]) -> bool:
        """True when the expression holds at ``step``; False when a name is missing."""
        env = names_for(step, values)
        try:
            return bool(self._eval(self._tree.body, env))
        except _Missing:
            return False
        except (ArithmeticError, ValueError, TypeError):
            return False

    def _operand(self, node: ast.AST, env: Mapping[str, float]) -> Any:
        try:
            return self._eval(node, env)
        except _Missing:
            return False

    def _eval(self, node: ast.AST, env: Mapping[str, float]) -> Any:
        if isinstance(node, ast.Constant):
            return node.value
        if isinstance(node, ast.Name):
            if node.id in env:
                return env[node.id]
            raise _Missing(node.id)
        if isinstance(node, ast.BoolOp):  # an operand with a missing name counts as false
            results = (self._operand(v, env) for v in node.values)
            return all(results) if isinstance(node.op, ast.And) else any(results)
        if isinstance(node, ast.UnaryOp):
            operand = self._eval(node.operand, env)
            if isinstance(node.op, ast.Not):
                return not operand
            return -operand if isinstance(node.op, ast.USub) else +operand
        if isinstance(node, ast.BinOp):
            left, right = self._eval(node.left, env), self._eval(node.right, env)
            ops = {
                ast.Add: "__add__",
                ast.Sub: "__sub__",
                ast.Mult: "__mul__",
                ast.Div: "__truediv__",
                ast.Pow: "__pow__",
            }
            return getattr(left, ops[type(node.op)])(right)
        if isinstance(node, ast.Compare):
            left = self._eval(node.left, env)
            for op, comparator in zip(node.ops, node.comparators, strict=True):
                right = self._eval(comparator, env)
                if not _compare(op, left, right):
                    return False
                left = right
            return True
        if isinstance(node, ast.Call):
            fn = FUNCTIONS[node.func.id]  # type: ignore[attr-defined]
            return fn(*(self._eval(a, env) for a in node.args))
        raise ExpressionError(f"cannot evaluate {type(node).__name__}")


_BINARY = {
    ast.Add: lambda a, b: a + b,
    ast.Sub: lambda a, b: a - b,
    ast.Mult: lambda a, b: a * b,
    ast.Div: lambda a, b: a / b,
    ast.Pow: lambda a, b: a**b,
}


def _compare(op: ast.cmpop, left: Any, right: Any) -> bool:
    if isinstance(op, ast.Lt):
        return left < right
    if isinstance(op, ast.LtE):
        return left <= right
    if isinstance(op, ast.Gt):
        return left > right
    if isinstance(op, ast.GtE):
        return left >= right
    if isinstance(op, ast.Eq):
        return left == right
    return left != right
