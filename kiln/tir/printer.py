"""Readable text for TIR: expressions, statements, blocks, buffers and PrimFuncs.

The text is Python-flavoured (loops are ``for i in range(n):``, blocks are ``with
block("C"):``) so that a reader of TVMScript feels at home, but it is kiln's own and is meant
for reading, not parsing. It is deterministic: variables and buffers are named in the order
they are first printed, and distinct objects with the same name get ``_1``, ``_2`` suffixes.
Expressions get parentheses only where precedence requires them, so ``(a + b) * c`` and
``a + b * c`` read as they should. ``//`` and ``%`` are floor division and modulo, ``/`` is
float division; truncated integer division prints as ``truncdiv``/``truncmod``.
"""

from __future__ import annotations

import json
import math
from collections.abc import Sequence
from enum import Enum
from typing import Any

from ..ir.dtype import DataType
from ..ir.node import Node, register_printer
from . import expr as E
from .buffer import Buffer, BufferRegion
from .function import PrimFunc
from .functor import collect_vars
from .stmt import (
    Allocate,
    AssertStmt,
    Block,
    BlockRealize,
    BufferStore,
    Evaluate,
    For,
    ForKind,
    IfThenElse,
    LetStmt,
    SeqStmt,
)

INDENT = "    "

# Precedence levels (higher binds tighter).
P_LET, P_OR, P_AND, P_NOT, P_CMP, P_ADD, P_MUL, P_UNARY, P_ATOM = 0, 1, 2, 3, 4, 5, 6, 7, 9

_BINARY: dict[type, tuple[str, int]] = {
    E.Add: ("+", P_ADD), E.Sub: ("-", P_ADD), E.Mul: ("*", P_MUL),
    E.FloorDiv: ("//", P_MUL), E.FloorMod: ("%", P_MUL),
    E.EQ: ("==", P_CMP), E.NE: ("!=", P_CMP), E.LT: ("<", P_CMP), E.LE: ("<=", P_CMP),
    E.GT: (">", P_CMP), E.GE: (">=", P_CMP), E.And: ("and", P_AND), E.Or: ("or", P_OR),
}
_FUNC_BINARY: dict[type, str] = {
    E.Min: "min", E.Max: "max", E.Mod: "truncmod", E.BitwiseAnd: "bitwise_and",
    E.BitwiseOr: "bitwise_or", E.BitwiseXor: "bitwise_xor", E.ShiftLeft: "shift_left",
    E.ShiftRight: "shift_right",
}

_FOR_KIND = {
    ForKind.SERIAL: "range", ForKind.PARALLEL: "parallel", ForKind.VECTORIZED: "vectorized",
    ForKind.UNROLLED: "unroll",
}
_ITER_KIND = {
    E.IterType.DATA_PAR: "spatial", E.IterType.COMM_REDUCE: "reduce",
    E.IterType.ORDERED: "ordered", E.IterType.OPAQUE: "opaque",
}


def _fmt_float(v: float) -> str:
    if math.isnan(v):
        return "nan"
    if math.isinf(v):
        return "inf" if v > 0 else "-inf"
    return repr(float(v))


class TIRPrinter:
    """Prints TIR nodes; one instance keeps one consistent naming of variables and buffers."""

    def __init__(self) -> None:
        self._names: dict[int, str] = {}
        self._used: set[str] = set()
        self._alive: list[Any] = []  # keep named objects alive so their ids stay unique

    # ---- naming ---------------------------------------------------------------------------
    def name(self, obj: Any) -> str:
        """The printed name of a Var or Buffer (unique within this printer)."""
        key = id(obj)
        got = self._names.get(key)
        if got is not None:
            return got
        base = (getattr(obj, "name", "") or "v").strip() or "v"
        name = base
        k = 1
        while name in self._used:
            name = f"{base}_{k}"
            k += 1
        self._used.add(name)
        self._names[key] = name
        self._alive.append(obj)
        if isinstance(obj, Buffer) and obj.data is not None and id(obj.data) not in self._names:
            self._names[id(obj.data)] = name  # the data pointer reads as the buffer itself
            self._alive.append(obj.data)
        return name

    # ---- expressions ----------------------------------------------------------------------
    def expr(self, e: Any) -> str:
        return self._expr(e)[0]

    def _wrap(self, e: Any, min_prec: int) -> str:
        text, prec = self._expr(e)
        return f"({text})" if prec < min_prec else text

    def _expr(self, e: Any) -> tuple[str, int]:  # noqa: C901 - one dispatch table
        if not isinstance(e, Node):
            return self.value(e), P_ATOM
        t = type(e)
        if isinstance(e, E.Var):
            return self.name(e), P_ATOM
        if t is E.IntImm:
            return self._int(e)
        if t is E.FloatImm:
            text = _fmt_float(e.value)
            if e.dtype != "float32":
                return f"{e.dtype}({text})", P_ATOM
            return text, (P_UNARY if text.startswith("-") else P_ATOM)
        if t is E.StringImm:
            return json.dumps(e.value), P_ATOM
        if t in _BINARY:
            op, prec = _BINARY[t]
            left_min = prec + 1 if prec == P_CMP else prec
            return f"{self._wrap(e.a, left_min)} {op} {self._wrap(e.b, prec + 1)}", prec
        if t is E.Div:
            if e.dtype.element.is_float:
                return f"{self._wrap(e.a, P_MUL)} / {self._wrap(e.b, P_MUL + 1)}", P_MUL
            return f"truncdiv({self.expr(e.a)}, {self.expr(e.b)})", P_ATOM
        if t in _FUNC_BINARY:
            return f"{_FUNC_BINARY[t]}({self.expr(e.a)}, {self.expr(e.b)})", P_ATOM
        if t is E.Not:
            return f"not {self._wrap(e.a, P_NOT)}", P_NOT
        if t is E.Select:
            args = ", ".join(self.expr(x) for x in (e.condition, e.true_value, e.false_value))
            return f"select({args})", P_ATOM
        if t is E.Cast:
            return f"cast({e.dtype}, {self.expr(e.value)})", P_ATOM
        if t is E.Ramp:
            return f"ramp({self.expr(e.base)}, {self.expr(e.stride)}, {e.lanes})", P_ATOM
        if t is E.Broadcast:
            return f"broadcast({self.expr(e.value)}, {e.lanes})", P_ATOM
        if t is E.Let:
            return (
                f"let {self.name(e.var)} = {self.expr(e.value)} in {self._wrap(e.body, P_LET)}",
                P_LET,
            )
        if t is E.Call:
            args = ", ".join(self.expr(a) for a in e.args)
            if e.op == "reinterpret":
                return f"reinterpret({e.dtype}, {args})", P_ATOM
            return f"{e.op}({args})", P_ATOM
        if t is E.BufferLoad:
            return f"{self.name(e.buffer)}{self._indices(e.indices)}", P_ATOM
        if t is E.Reduce:
            return self._reduce(e), P_ATOM
        if t is E.CommReducer:
            return self._comm_reducer(e), P_ATOM
        if t is E.Range:
            return f"Range(min={self.expr(e.min)}, extent={self.expr(e.extent)})", P_ATOM
        if t is E.IterVar:
            dom = self._dom(e.dom)
            return f"iter_var({self.name(e.var)}, {dom}, {_ITER_KIND[e.iter_type]})", P_ATOM
        if t is Buffer:
            return self.name(e), P_ATOM
        if t is BufferRegion:
            return self.region(e), P_ATOM
        return f"<{t.__name__}>", P_ATOM

    def _int(self, e: E.IntImm) -> tuple[str, int]:
        if e.dtype.is_bool:
            return ("True" if e.value else "False"), P_ATOM
        text = str(e.value)
        if e.dtype not in ("int32", "int64"):
            return f"{e.dtype}({text})", P_ATOM
        return text, (P_UNARY if e.value < 0 else P_ATOM)

    def _indices(self, indices: Sequence[Any]) -> str:
        if not indices:
            return "[()]"
        return "[" + ", ".join(self.expr(i) for i in indices) + "]"

    def _end(self, lo: Any, extent: Any) -> str:
        """Text of ``lo + extent``, folded when both are constants."""
        if isinstance(lo, E.IntImm) and isinstance(extent, E.IntImm):
            return str(lo.value + extent.value)
        if isinstance(lo, E.IntImm) and lo.value == 0:
            return self.expr(extent)
        return f"{self._wrap(lo, P_ADD)} + {self._wrap(extent, P_ADD + 1)}"

    def _dom(self, r: E.Range) -> str:
        """``range(64)`` or ``range(lo, hi)``."""
        if isinstance(r.min, E.IntImm) and r.min.value == 0:
            return f"range({self.expr(r.extent)})"
        return f"range({self.expr(r.min)}, {self._end(r.min, r.extent)})"

    def _comm_reducer(self, c: E.CommReducer) -> str:
        x, y = self.name(c.lhs), self.name(c.rhs)
        return (
            f"comm_reducer(lambda {x}, {y}: {self.expr(c.result)}, "
            f"identity={self.expr(c.identity)})"
        )

    def _reduce(self, r: E.Reduce) -> str:
        c = r.combiner
        kind = None
        if isinstance(c.result, (E.Add, E.Max, E.Min)) and c.result.a is c.lhs \
                and c.result.b is c.rhs:
            kind = {E.Add: "sum", E.Max: "max", E.Min: "min"}[type(c.result)]
        axes = ", ".join(f"{self.name(iv.var)} in {self._dom(iv.dom)}" for iv in r.axis)
        parts = [self.expr(r.source), f"axis=[{axes}]"]
        if r.condition is not None:
            parts.append(f"where={self.expr(r.condition)}")
        if kind is None:
            return f"reduce({self._comm_reducer(c)}, {', '.join(parts)})"
        parts.append(f"init={self.expr(c.identity)}")
        return f"{kind}({', '.join(parts)})"

    # ---- buffers and regions --------------------------------------------------------------
    def buffer_type(self, b: Buffer) -> str:
        shape = ", ".join(self.expr(s) for s in b.shape)
        if len(b.shape) == 1:
            shape += ","
        parts = [f"({shape})", json.dumps(str(b.dtype))]
        if b.strides:
            parts.append("strides=(" + ", ".join(self.expr(s) for s in b.strides) + ")")
        if b.elem_offset is not None:
            parts.append(f"elem_offset={self.expr(b.elem_offset)}")
        if b.scope != "global":
            parts.append(f"scope={json.dumps(b.scope)}")
        return f"Buffer({', '.join(parts)})"

    def buffer_decl(self, b: Buffer) -> str:
        return f"{self.name(b)}: {self.buffer_type(b)}"

    def region(self, r: BufferRegion) -> str:
        dims = []
        for rg in r.region:
            if isinstance(rg.extent, E.IntImm) and rg.extent.value == 1:
                dims.append(self.expr(rg.min))
            else:
                dims.append(f"{self.expr(rg.min)}:{self._end(rg.min, rg.extent)}")
        return f"{self.name(r.buffer)}[{', '.join(dims) if dims else '()'}]"

    # ---- other values ---------------------------------------------------------------------
    def value(self, v: Any) -> str:
        """Attribute/annotation values: nodes print as IR, python values like JSON/python."""
        if isinstance(v, Node):
            return self.node(v)
        if isinstance(v, str):
            return json.dumps(v)
        if isinstance(v, Enum):
            return f"{type(v).__name__}.{v.name}"
        if isinstance(v, DataType):
            return json.dumps(str(v))
        if isinstance(v, float):
            return _fmt_float(v)
        if isinstance(v, dict):
            return "{" + ", ".join(f"{self.value(k)}: {self.value(x)}" for k, x in v.items()) + "}"
        if isinstance(v, tuple):
            inner = ", ".join(self.value(x) for x in v)
            return f"({inner},)" if len(v) == 1 else f"({inner})"
        if isinstance(v, list):
            return "[" + ", ".join(self.value(x) for x in v) + "]"
        return repr(v)

    # ---- statements -----------------------------------------------------------------------
    def stmt(self, s: Any, indent: int = 0) -> list[str]:
        out: list[str] = []
        self._stmt(s, indent, out)
        return out

    def _line(self, out: list[str], indent: int, text: str) -> None:
        out.append(INDENT * indent + text)

    def _stmt(self, s: Any, ind: int, out: list[str]) -> None:  # noqa: C901 - dispatch
        t = type(s)
        if t is SeqStmt:
            for x in s.seq:
                self._stmt(x, ind, out)
            if not s.seq:
                self._line(out, ind, "pass")
        elif t is BufferStore:
            self._line(
                out, ind, f"{self.name(s.buffer)}{self._indices(s.indices)} = {self.expr(s.value)}"
            )
        elif t is For:
            var = self.name(s.loop_var)
            fn = _FOR_KIND.get(s.kind, str(s.kind))
            if isinstance(s.min, E.IntImm) and s.min.value == 0:
                args = [self.expr(s.extent)]
            else:
                args = [self.expr(s.min), self._end(s.min, s.extent)]
            if s.annotations:
                args.append(f"annotations={self.value(s.annotations)}")
            self._line(out, ind, f"for {var} in {fn}({', '.join(args)}):")
            self._stmt(s.body, ind + 1, out)
        elif t is BlockRealize:
            self._block(s.block, s.iter_values, s.predicate, ind, out)
        elif t is Block:
            self._block(s, None, None, ind, out)
        elif t is IfThenElse:
            self._line(out, ind, f"if {self.expr(s.condition)}:")
            self._stmt(s.then_case, ind + 1, out)
            if s.else_case is not None:
                self._line(out, ind, "else:")
                self._stmt(s.else_case, ind + 1, out)
        elif t is LetStmt:
            v = self.name(s.var)
            self._line(out, ind, f"{v}: {s.var.dtype} = {self.expr(s.value)}")
            self._stmt(s.body, ind, out)
        elif t is Allocate:
            self._line(out, ind, f"allocate {self.buffer_decl(s.buffer)}")
            self._stmt(s.body, ind, out)
        elif t is AssertStmt:
            self._line(out, ind, f"assert {self.expr(s.condition)}, {json.dumps(s.message)}")
            self._stmt(s.body, ind, out)
        elif t is Evaluate:
            self._line(out, ind, f"evaluate({self.expr(s.value)})")
        elif s is None:
            self._line(out, ind, "pass")
        else:
            self._line(out, ind, f"<{t.__name__}>")

    def _block(
        self, b: Block, values: Sequence[Any] | None, predicate: Any, ind: int, out: list[str]
    ) -> None:
        self._line(out, ind, f"with block({json.dumps(b.name_hint)}):")
        inner = ind + 1
        for k, iv in enumerate(b.iter_vars):
            dom = iv.dom
            if isinstance(dom.min, E.IntImm) and dom.min.value == 0:
                d = self.expr(dom.extent)
            else:
                d = f"({self.expr(dom.min)}, {self._end(dom.min, dom.extent)})"
            kind = _ITER_KIND.get(iv.iter_type, str(iv.iter_type))
            bind = ""
            if values is not None and k < len(values):
                bind = f", {self.expr(values[k])}"
            self._line(out, inner, f"{self.name(iv.var)} = axis.{kind}({d}{bind})")
        if predicate is not None and not (
            isinstance(predicate, E.IntImm) and predicate.dtype.is_bool and predicate.value == 1
        ):
            self._line(out, inner, f"where({self.expr(predicate)})")
        if b.reads or b.writes or b.iter_vars:
            self._line(out, inner, f"reads({', '.join(self.region(r) for r in b.reads)})")
            self._line(out, inner, f"writes({', '.join(self.region(r) for r in b.writes)})")
        for buf in b.alloc_buffers:
            self._line(out, inner, f"alloc_buffer({self.buffer_decl(buf)})")
        if b.annotations:
            self._line(out, inner, f"annotations({self.value(b.annotations)})")
        if b.init is not None:
            self._line(out, inner, "with init():")
            self._stmt(b.init, inner + 1, out)
        self._stmt(b.body, inner, out)

    # ---- functions ------------------------------------------------------------------------
    def prim_func(self, f: PrimFunc, name: str | None = None) -> str:
        fname = name or f.attrs.get("global_symbol") or "main"
        params = []
        for p in f.params:
            buf = f.buffer_map.get(p)
            if buf is not None:
                params.append(self.buffer_decl(buf))
            else:
                params.append(f"{self.name(p)}: {p.dtype}")
        lines = []
        if f.attrs:
            lines.append(f"@prim_func(attrs={self.value(f.attrs)})")
        else:
            lines.append("@prim_func")
        lines.append(f"def {fname}({', '.join(params)}):")
        # Symbolic dimensions (vars in buffer shapes that are not parameters) with their dtype.
        declared = {id(p) for p in f.params}
        sym: list[E.Var] = []

        for buf in f.buffers:
            for v in collect_vars((buf.shape, buf.strides, buf.elem_offset)):
                if id(v) not in declared:
                    declared.add(id(v))
                    sym.append(v)
        for v in sym:
            kind = "size_var" if isinstance(v, E.SizeVar) else "var"
            lines.append(f"{INDENT}{self.name(v)} = {kind}({json.dumps(str(v.dtype))})")
        lines.extend(self.stmt(f.body, 1))
        return "\n".join(lines)

    def node(self, n: Any, name: str | None = None) -> str:
        if isinstance(n, PrimFunc):
            return self.prim_func(n, name)
        if isinstance(n, E.Var):
            return self.name(n)
        if isinstance(n, Buffer):
            return self.buffer_decl(n)
        if isinstance(n, (E.PrimExpr, E.Range, E.IterVar, E.CommReducer, BufferRegion)):
            return self.expr(n)
        if isinstance(n, Node):
            if type(n).__module__.startswith("kiln.tir"):
                return "\n".join(self.stmt(n))
            return repr(n)  # another layer's node: its own printer
        return self.value(n)


def script(node: Any, name: str | None = None) -> str:
    """The text of any TIR node (a fresh, deterministic naming per call)."""
    return TIRPrinter().node(node, name)


register_printer("kiln.tir", script)

__all__ = ["TIRPrinter", "script"]
