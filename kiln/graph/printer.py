"""Text form of graph IR, close to Relax's TVMScript::

    def main(x: Tensor((5, 64), "float32")) -> Tensor((5, 10), "float32"):
        # meta[Constant][0]: Tensor((64, 10), "float32")
        with dataflow():
            lv: Tensor((5, 10), "float32") = matmul(x, meta[Constant][0])
            gv: Tensor((5, 10), "float32") = nn.relu(lv)
            output(gv)
        return gv

Names are deterministic: each variable prints as its name hint made into an identifier, with a
``_1``, ``_2``... suffix when two distinct variables would print the same. Scalar constants print
inline; other constants as ``meta[Constant][i]``, summarized by shape and dtype at the top of the
function. Operator attributes print as keyword arguments.
"""

from __future__ import annotations

import dataclasses
import enum
import json
import keyword
import math
import re
from collections.abc import Callable
from typing import Any

import numpy as np

from .. import tir
from ..ir.dtype import DataType
from ..ir.node import Node, register_printer
from .expr import (
    Binding,
    BindingBlock,
    Call,
    Constant,
    DataflowBlock,
    DataflowVar,
    Expr,
    ExternFunc,
    Function,
    GlobalVar,
    If,
    MatchCast,
    Op,
    PrimValue,
    SeqExpr,
    ShapeExpr,
    StringImm,
    Tuple,
    TupleGetItem,
    Var,
    VarBinding,
)
from .struct_info import (
    FuncStructInfo,
    ObjectStructInfo,
    OptionalStructInfo,
    PrimStructInfo,
    SequenceStructInfo,
    ShapeStructInfo,
    StructInfo,
    TensorStructInfo,
    TupleStructInfo,
)

_INDENT = "    "

# ---------------------------------------------------------------------------------------------
# PrimExprs in shapes and attributes
# ---------------------------------------------------------------------------------------------
_BINARY: dict[type, tuple[str, int]] = {
    tir.Add: ("+", 2),
    tir.Sub: ("-", 2),
    tir.Mul: ("*", 3),
    tir.FloorDiv: ("//", 3),
    tir.FloorMod: ("%", 3),
    tir.Div: ("/", 3),
    tir.EQ: ("==", 1),
    tir.NE: ("!=", 1),
    tir.LT: ("<", 1),
    tir.LE: ("<=", 1),
    tir.GT: (">", 1),
    tir.GE: (">=", 1),
}


def format_prim(
    e: Any, name_of: Callable[[tir.Var], str] | None = None, prec: int = 0
) -> str:
    """Compact text of a (shape) PrimExpr: ``n * 2 + 1``, ``min(n, 4)``, ``cast("int32", n)``."""
    name_of = name_of or (lambda v: v.name)
    if isinstance(e, (int, np.integer)):
        return str(int(e))
    if isinstance(e, tir.IntImm):
        if e.dtype.is_bool:
            return "True" if e.value else "False"
        if e.dtype == "int64" or e.dtype == "int32":
            return str(e.value)
        return f"{e.dtype}({e.value})"
    if isinstance(e, tir.FloatImm):
        text = _float_text(e.value)
        return text if e.dtype == "float32" else f"{e.dtype}({text})"
    if isinstance(e, tir.Var):
        return name_of(e)
    op = _BINARY.get(type(e))
    if op is not None:
        sym, p = op
        text = f"{format_prim(e.a, name_of, p)} {sym} {format_prim(e.b, name_of, p + 1)}"
        return f"({text})" if p < prec else text
    if isinstance(e, (tir.Min, tir.Max)):
        fn = "min" if isinstance(e, tir.Min) else "max"
        return f"{fn}({format_prim(e.a, name_of)}, {format_prim(e.b, name_of)})"
    if isinstance(e, tir.Cast):
        return f'cast("{e.dtype}", {format_prim(e.value, name_of)})'
    return str(e)


def _float_text(v: float) -> str:
    if math.isnan(v):
        return 'float("nan")'
    if math.isinf(v):
        return 'float("inf")' if v > 0 else 'float("-inf")'
    return repr(float(v))


def format_shape(shape: Any, name_of: Callable[[tir.Var], str] | None = None) -> str:
    """``(n, 4)``, ``(5,)``, ``()``; ``?`` for an unknown shape."""
    if shape is None:
        return "?"
    dims = [format_prim(d, name_of) for d in shape]
    if len(dims) == 1:
        return f"({dims[0]},)"
    return "(" + ", ".join(dims) + ")"


# ---------------------------------------------------------------------------------------------
# the printer
# ---------------------------------------------------------------------------------------------
_IDENT_RE = re.compile(r"\W")


def _identifier(name: str) -> str:
    text = _IDENT_RE.sub("_", name or "")
    if not text:
        text = "v"
    if text[0].isdigit():
        text = "v" + text
    if keyword.iskeyword(text):
        text += "_"
    return text


class _Printer:
    def __init__(self):
        self.names: dict[int, str] = {}
        self.used: set[str] = set()
        self.constants: list[Constant] = []
        self.const_index: dict[int, int] = {}

    # ---- names ---------------------------------------------------------------------------
    def name(self, v: Any) -> str:
        key = id(v)
        got = self.names.get(key)
        if got is not None:
            return got
        base = _identifier(getattr(v, "name", "v"))
        text, k = base, 1
        while text in self.used:
            text = f"{base}_{k}"
            k += 1
        self.used.add(text)
        self.names[key] = text
        return text

    def prim(self, e: Any) -> str:
        return format_prim(e, self.name)

    # ---- struct info ---------------------------------------------------------------------
    def sinfo(self, s: Any) -> str:
        if s is None:
            return "?"
        if isinstance(s, TensorStructInfo):
            if s.shape is not None:
                return f'Tensor({format_shape(s.shape, self.name)}, "{s.dtype}")'
            if s.ndim >= 0:
                return f'Tensor(dtype="{s.dtype}", ndim={s.ndim})'
            return f'Tensor(dtype="{s.dtype}")'
        if isinstance(s, TupleStructInfo):
            return "Tuple(" + ", ".join(self.sinfo(f) for f in s.fields) + ")"
        if isinstance(s, SequenceStructInfo):
            length = "" if s.length is None else f", length={self.prim(s.length)}"
            return f"Sequence({self.sinfo(s.elem)}{length})"
        if isinstance(s, OptionalStructInfo):
            return f"Optional({self.sinfo(s.elem)})"
        if isinstance(s, ShapeStructInfo):
            if s.values is not None:
                return f"Shape({format_shape(s.values, self.name)})"
            return f"Shape(ndim={s.ndim})" if s.ndim >= 0 else "Shape()"
        if isinstance(s, PrimStructInfo):
            if s.value is not None:
                return f'Prim("{s.dtype}", value={self.prim(s.value)})'
            return f'Prim("{s.dtype}")'
        if isinstance(s, FuncStructInfo):
            params = "..." if s.params is None else self._tuple([self.sinfo(p) for p in s.params])
            return f"Callable({params}, {self.sinfo(s.ret)})"
        if isinstance(s, ObjectStructInfo):
            return "Object"
        return f"<{type(s).__name__}>"

    @staticmethod
    def _tuple(items: list[str]) -> str:
        return f"({items[0]},)" if len(items) == 1 else "(" + ", ".join(items) + ")"

    # ---- values (attributes) -------------------------------------------------------------
    def value(self, v: Any) -> str:
        if v is None or isinstance(v, bool):
            return str(v)
        if isinstance(v, (int, np.integer)):
            return str(int(v))
        if isinstance(v, (float, np.floating)):
            return _float_text(float(v))
        if isinstance(v, str):
            return json.dumps(v)
        if isinstance(v, DataType):
            return json.dumps(str(v))
        if isinstance(v, enum.Enum):
            return f"{type(v).__name__}.{v.name}"
        if isinstance(v, tuple):
            return self._tuple([self.value(x) for x in v]) if v else "()"
        if isinstance(v, list):
            return "[" + ", ".join(self.value(x) for x in v) + "]"
        if isinstance(v, dict):
            return "{" + ", ".join(f"{self.value(k)}: {self.value(x)}" for k, x in v.items()) + "}"
        if isinstance(v, tir.PrimExpr):
            return self.prim(v)
        if isinstance(v, Expr):
            return self.expr(v)
        if isinstance(v, StructInfo):
            return self.sinfo(v)
        if isinstance(v, np.ndarray):
            return f'array({format_shape(v.shape)}, "{DataType.from_numpy(v.dtype)}")'
        if dataclasses.is_dataclass(v) and not isinstance(v, type):
            inner = ", ".join(
                f"{f.name}={self.value(getattr(v, f.name))}" for f in dataclasses.fields(v)
            )
            return f"{type(v).__name__}({inner})"
        return repr(v)

    def attrs_kwargs(self, attrs: Any) -> list[str]:
        if attrs is None:
            return []
        if dataclasses.is_dataclass(attrs) and not isinstance(attrs, type):
            return [f"{f.name}={self.value(getattr(attrs, f.name))}"
                    for f in dataclasses.fields(attrs)]
        if isinstance(attrs, dict):
            return [f"{k}={self.value(v)}" for k, v in attrs.items()]
        return [f"attrs={self.value(attrs)}"]

    # ---- expressions ---------------------------------------------------------------------
    def expr(self, e: Any) -> str:
        if isinstance(e, Var):
            return self.name(e)
        if isinstance(e, Constant):
            return self.constant(e)
        if isinstance(e, Call):
            return self.call(e)
        if isinstance(e, Tuple):
            return self._tuple([self.expr(f) for f in e.fields]) if e.fields else "()"
        if isinstance(e, TupleGetItem):
            return f"{self.expr(e.tuple_value)}[{e.index}]"
        if isinstance(e, GlobalVar):
            return e.name
        if isinstance(e, Op):
            return f'op("{e.name}")'
        if isinstance(e, ExternFunc):
            return f'extern_func("{e.symbol}")'
        if isinstance(e, ShapeExpr):
            return f"shape({format_shape(e.values, self.name)})"
        if isinstance(e, PrimValue):
            return f"prim_value({self.prim(e.value)})"
        if isinstance(e, StringImm):
            return json.dumps(e.value)
        if isinstance(e, SeqExpr) and not e.blocks:
            return self.expr(e.body)
        if isinstance(e, If):
            return (f"if_then_else({self.expr(e.cond)}, {self.expr(e.true_branch)}, "
                    f"{self.expr(e.false_branch)})")
        if isinstance(e, (SeqExpr, Function)):
            return "{\n" + "\n".join(self.lines(e, 1)) + "\n}"
        return f"<{type(e).__name__}>"

    def constant(self, c: Constant) -> str:
        data = c.data
        if data.ndim == 0:
            item = data.item()
            if isinstance(item, bool):
                text = str(item)
            elif isinstance(item, float):
                text = _float_text(item)
            else:
                text = repr(item)
            return f'const({text}, "{c.dtype}")'
        idx = self.const_index.get(id(c))
        if idx is None:
            idx = self.const_index[id(c)] = len(self.constants)
            self.constants.append(c)
        return f"meta[Constant][{idx}]"

    def call(self, c: Call) -> str:
        op = c.op
        args = [self.expr(a) for a in c.args]
        extra = self.attrs_kwargs(c.attrs)
        if isinstance(op, Op) and op.name == "call_tir" and len(c.args) == 2 and c.sinfo_args:
            return f"call_tir({args[0]}, {args[1]}, out_sinfo={self.sinfo(c.sinfo_args[0])})"
        if c.sinfo_args:
            extra.append("sinfo_args=" + self._tuple([self.sinfo(s) for s in c.sinfo_args]))
        if isinstance(op, Op):
            head = op.name
        elif isinstance(op, GlobalVar):
            head = op.name
        elif isinstance(op, ExternFunc):
            head = "call_extern"
            args.insert(0, json.dumps(op.symbol))
        else:
            head = self.expr(op)
        return f"{head}({', '.join(args + extra)})"

    # ---- statements ----------------------------------------------------------------------
    def lines(self, n: Any, depth: int) -> list[str]:
        """Statement lines for a function, a sequence, a block or a binding."""
        if isinstance(n, Function):
            return self.function(n, None, depth)
        if isinstance(n, SeqExpr):
            return self.seq(n, depth, lambda t: f"return {t}")
        if isinstance(n, BindingBlock):
            return self.block(n, depth)
        if isinstance(n, Binding):
            return self.binding(n, depth)
        return [_INDENT * depth + self.expr(n)]

    def function(self, f: Function, name: str | None, depth: int) -> list[str]:
        name = name or str(f.attrs.get("global_symbol", "func"))
        first_const = len(self.constants)
        params = ", ".join(f"{self.name(p)}: {self.sinfo(p.struct_info)}" for p in f.params)
        ret = f" -> {self.sinfo(f.ret_struct_info)}" if f.ret_struct_info is not None else ""
        body = self.seq(f.body, depth + 1, lambda t: f"return {t}")
        pad = _INDENT * (depth + 1)
        head = [_INDENT * depth + f"def {_identifier(name)}({params}){ret}:"]
        if f.attrs:
            head.append(pad + f"func_attr({self.value(dict(f.attrs))})")
        for i in range(first_const, len(self.constants)):
            c = self.constants[i]
            head.append(pad + f"# meta[Constant][{i}]: {self.sinfo(c.struct_info)}")
        return head + body

    def seq(self, e: Expr, depth: int, sink: Callable[[str], str]) -> list[str]:
        """Lines of a sequence whose result is written by ``sink(text)`` (return / assign)."""
        out: list[str] = []
        body = e
        if isinstance(e, SeqExpr):
            for b in e.blocks:
                out += self.block(b, depth)
            body = e.body
        if isinstance(body, If):
            out += self.if_lines(body, depth, sink)
        elif isinstance(body, SeqExpr):
            out += self.seq(body, depth, sink)
        else:
            out.append(_INDENT * depth + sink(self.expr(body)))
        return out

    def if_lines(self, e: If, depth: int, sink: Callable[[str], str]) -> list[str]:
        pad = _INDENT * depth
        return (
            [pad + f"if {self.expr(e.cond)}:"]
            + self.seq(e.true_branch, depth + 1, sink)
            + [pad + "else:"]
            + self.seq(e.false_branch, depth + 1, sink)
        )

    def block(self, b: BindingBlock, depth: int) -> list[str]:
        if not isinstance(b, DataflowBlock):
            out: list[str] = []
            for binding in b.bindings:
                out += self.binding(binding, depth)
            return out
        out = [_INDENT * depth + "with dataflow():"]
        for binding in b.bindings:
            out += self.binding(binding, depth + 1)
        outputs = [self.name(x.var) for x in b.bindings if not isinstance(x.var, DataflowVar)]
        out.append(_INDENT * (depth + 1) + f"output({', '.join(outputs)})")
        return out

    def binding(self, b: Binding, depth: int) -> list[str]:
        pad = _INDENT * depth
        if isinstance(b, MatchCast):
            # print the value first so a symbolic var defined here is named after its uses
            value = self.expr(b.value)
            target = f"{self.name(b.var)}: {self.sinfo(b.var.struct_info)}"
            return [pad + f"{target} = match_cast({value}, {self.sinfo(b.struct_info)})"]
        if isinstance(b, VarBinding):
            if isinstance(b.value, Function):
                return self.function(b.value, self.name(b.var), depth)
            if isinstance(b.value, If):
                target = f"{self.name(b.var)}: {self.sinfo(b.var.struct_info)}"
                return self.if_lines(b.value, depth, lambda t: f"{target} = {t}")
            value = self.expr(b.value)
            return [pad + f"{self.name(b.var)}: {self.sinfo(b.var.struct_info)} = {value}"]
        return [pad + f"<{type(b).__name__}>"]


def script(n: Node, name: str | None = None) -> str:
    """Text of any graph node (``name``: print a Function under this module-level name)."""
    p = _Printer()
    if isinstance(n, StructInfo):
        return p.sinfo(n)
    if isinstance(n, Function):
        return "\n".join(p.function(n, name, 0))
    if isinstance(n, Var):
        return f"{p.name(n)}: {p.sinfo(n.struct_info)}"
    if isinstance(n, (SeqExpr, BindingBlock, Binding)):
        return "\n".join(p.lines(n, 0))
    if isinstance(n, Expr):
        return p.expr(n)
    return f"<{type(n).__name__}>"


register_printer("kiln.graph", script)
