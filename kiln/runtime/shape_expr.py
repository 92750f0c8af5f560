"""Serializable shape expressions: symbolic output shapes evaluated at run time.

A graph function with symbolic dimensions (``n``) has intermediate shapes such as ``(n, 2*n)``.
The executor stores each dimension as a small prefix-form list (``["mul", 2, ["var", "n"]]``)
that survives the executable file, and evaluates it once the inputs bind ``n``.
"""

from __future__ import annotations

from typing import Any

from .. import tir
from ..ir.errors import KilnError

_OPS = {
    tir.Add: "add",
    tir.Sub: "sub",
    tir.Mul: "mul",
    tir.FloorDiv: "floordiv",
    tir.FloorMod: "floormod",
    tir.Min: "min",
    tir.Max: "max",
    # conditions on symbolic dims (a kernel's kiln.assume checks): 1 or 0
    tir.EQ: "eq",
    tir.NE: "ne",
    tir.LT: "lt",
    tir.LE: "le",
    tir.GT: "gt",
    tir.GE: "ge",
    tir.And: "and",
    tir.Or: "or",
}


_COMPARE = {
    "eq": lambda a, b: a == b, "ne": lambda a, b: a != b, "lt": lambda a, b: a < b,
    "le": lambda a, b: a <= b, "gt": lambda a, b: a > b, "ge": lambda a, b: a >= b,
    "and": lambda a, b: bool(a) and bool(b), "or": lambda a, b: bool(a) or bool(b),
}


def encode(expr: Any) -> Any:
    """PrimExpr (or int) -> JSON-compatible prefix form."""
    if isinstance(expr, int):
        return expr
    if isinstance(expr, tir.IntImm):
        return expr.value
    if isinstance(expr, tir.Var):
        return ["var", expr.name]
    if isinstance(expr, tir.Cast):
        return encode(expr.value)
    if isinstance(expr, tir.Not):
        return ["eq", encode(expr.a), 0]
    name = _OPS.get(type(expr))
    if name is None:
        raise KilnError(f"shape expression {expr} is not supported at run time")
    return [name, encode(expr.a), encode(expr.b)]


def evaluate(code: Any, env: dict[str, int]) -> int:
    """Evaluate an encoded dimension with symbolic variables bound in ``env``."""
    if isinstance(code, int):
        return code
    op = code[0]
    if op == "var":
        try:
            return env[code[1]]
        except KeyError:
            raise KilnError(f"symbolic dimension {code[1]!r} is not bound by any input") from None
    a, b = evaluate(code[1], env), evaluate(code[2], env)
    if op == "add":
        return a + b
    if op == "sub":
        return a - b
    if op == "mul":
        return a * b
    if op == "floordiv":
        return a // b
    if op == "floormod":
        return a % b
    if op == "min":
        return min(a, b)
    if op == "max":
        return max(a, b)
    compare = _COMPARE.get(op)
    if compare is not None:
        return int(compare(a, b))
    raise KilnError(f"unknown shape operation {op!r}")


def to_str(code: Any) -> str:
    """Readable form of an encoded dimension: ``4``, ``batch``, ``mul(2, n)``."""
    if isinstance(code, int):
        return str(code)
    if code[0] == "var":
        return code[1]
    return f"{code[0]}({', '.join(to_str(c) for c in code[1:])})"


def is_static(code: Any) -> bool:
    return isinstance(code, int)
