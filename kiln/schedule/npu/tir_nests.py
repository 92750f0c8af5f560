"""The NPU's lowering of last resort: an injective op's own TIR, nest by nest onto the units.

An op with no hand-written NPU lowering (``pad``, ``where``, ``broadcast_to``, comparisons,
...) would run on the CPU, with a copy of its operands out of the NPU's DRAM and of its result
back. Most such ops are data movement -- each output element a copy of an input element at an
index the loops compute, or a constant -- which the DMA engine and the vector unit do well
once the loops are in a form an instruction matches. This lowering gets that form from the
op's own PrimFunc (the TE compute the C target lowers, ``LegalizeOps``' route):

1. :func:`op_prim_func`: the op's compute over placeholders of its operands' static shapes,
   ``create_prim_func``, ``convert_blocks_to_loops``;
2. :func:`~kiln.tir.transform.npu_prepare.npu_prepare`: loops from 0, a pad's window and an
   edge pad's clamps turned into branches (``select_to_branch``) and the loops partitioned
   where they change, so each piece is branch-free -- a constant fill or a copy --, one store
   per nest, contiguous loops merged;
3. :func:`leaf_nests`: every store with the loops around it (an injective op writes each
   element once and reads no output, so each store and its loops are a kernel of their own);
4. :func:`select_nest`: each nest matched against the vector unit's forms, its accesses first
   analysed (:func:`affine_access`: the element offset of every load and of the store an
   affine function of the loops, whose coefficients are the DMA strides, 0 where a loop
   repeats an element):

   - ``out[..] = in[..]``: a copy -- strided DMAs through an L0 slot
     (:func:`~.movement.copy_kernel`, whose cost model picks the blocks);
   - ``out[..] = c``: a ``vfill`` of the block, a DMA out;
   - ``out[..] = cast(in[..])``: a ``vcast``;
   - ``out[..] = a[..] <cmp> b``: a ``vcmp`` (the 0/1 mask is the bool result's bytes);
   - ``out[..] = select(m[..], a, b)`` (``where``): a ``vsel`` on the mask block;
   - ``and`` / ``or`` / ``not`` of bool loads: ``vmin`` / ``vmax`` of the 0/1 bytes, a
     ``vcmp`` with 0;

5. what matches none of them -- an index that is no affine function of the loops (a gather's
   run-time index, a resize's scaled index), arithmetic no form above computes, a dtype the
   vector unit lacks -- runs on the scalar unit (:func:`emit_scalar_nest`): a loop over the
   nest's elements (the cores split them) that evaluates the store's index and value
   expressions in registers -- loads at computed addresses, ``s.alu`` arithmetic, a branch
   per select -- and stores the element. Correct and slow; its kernel says so with the
   reason (``scalar unit (<reason>)``), which ``kiln show --stage npu`` and
   :func:`~.nest_analysis.unit_shares` list.

A nest neither can run (a float function the scalar unit lacks, an intermediate buffer, more
registers than the unit has) raises NotSupported for the whole op, before anything is emitted:
the op stays on the CPU with that reason, as without this lowering. The ops it serves are
:data:`LAST_RESORT_OPS` (registered at import with :func:`~.lowering.register_lowering`, so
``AnnotateTarget``'s probe runs it: an op goes to the NPU only where it succeeds); it runs the
same on both lowering routes (it is TIR already).

bool tensors are the bytes 0 and 1 in DRAM: the kernels read and write them as ``uint8``.
"""

from __future__ import annotations

import os
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import numpy as np

from ... import te
from ...arith import Analyzer
from ...arith.expr_utils import const_int
from ...graph.op_registry import OpPattern, get_op_def
from ...ir.errors import KilnError
from ...ir.node import structural_equal
from ...target.npu.config import DRAM
from ...tir import expr as E
from ...tir.buffer import Buffer
from ...tir.function import PrimFunc
from ...tir.functor import substitute
from ...tir.stmt import BufferStore, For, IfThenElse, SeqStmt, Stmt
from ...tir.transform.convert_blocks_to_loops import convert_blocks_to_loops
from ...tir.transform.npu_prepare import npu_prepare
from .emit import DramTensor, DramView, KernelInfo, itemsize
from .lowering import LoweringContext, NotSupported, register_lowering
from .movement import copy_kernel
from .nest_analysis import SCALAR_TILING
from .scalar import SCALAR_DTYPES, SCALAR_FN
from .vector import VecStep, emit_elementwise

__all__ = ["LAST_RESORT_OPS", "Access", "LeafNest", "affine_access", "emit_scalar_nest",
           "last_resort_enabled", "leaf_nests", "lower_last_resort", "op_prim_func", "select_nest"]

#: The ops the lowering of last resort serves: injective ops with a TE compute and no NPU
#: lowering of their own whose work is moving, selecting or comparing elements. Arithmetic
#: ops without a lowering (``mod``, ``floor_divide``, ``power``) are left to the CPU: their
#: float forms need functions (``fmod``) neither unit has, and the CPU side of the
#: heterogeneous-graph tests is ``mod``.
LAST_RESORT_OPS = ("pad", "where", "broadcast_to", "greater", "greater_equal", "less",
                   "less_equal", "equal", "not_equal", "logical_not", "logical_and",
                   "logical_or", "gather_elements", "gather_nd")
_CMP = {E.LT: "lt", E.LE: "le", E.GT: "gt", E.GE: "ge", E.EQ: "eq", E.NE: "ne"}
_SWAP = {"lt": "gt", "le": "ge", "gt": "lt", "ge": "le", "eq": "eq", "ne": "ne"}
_ALU = {E.Add: "add", E.Sub: "sub", E.Mul: "mul", E.Min: "min", E.Max: "max",
        E.FloorDiv: "div", E.FloorMod: "rem", E.BitwiseAnd: "and", E.BitwiseOr: "or",
        E.BitwiseXor: "xor", E.And: "and", E.Or: "or"}


def _dt(dtype: Any) -> str:
    """An NPU dtype name of a TIR/graph dtype (bool is its bytes: uint8)."""
    s = str(dtype)
    return "uint8" if s == "bool" else s


def _as_bytes(t: DramTensor) -> DramTensor:
    """``t`` with bool reinterpreted as uint8 (the same bytes, 0 and 1)."""
    return DramTensor(t.addr, t.shape, "uint8") if t.dtype == "bool" else t


# ---- the op's PrimFunc -------------------------------------------------------------------------
def op_prim_func(call: Any, operands: list[Any], out: DramTensor
                 ) -> tuple[PrimFunc, dict[Buffer, DramTensor]]:
    """The loop-form PrimFunc of op ``call`` over ``operands`` (DRAM tensors, a list of them
    for a tuple argument) and where each of its buffers lives. NotSupported for an op that is
    not injective, has no TE compute or returns several tensors."""
    opdef = get_op_def(call.op.name)
    if opdef.pattern > OpPattern.INJECTIVE or opdef.compute is None or \
            opdef.legalize is not None:
        raise NotSupported(f"{opdef.name}: no injective TE compute to lower")
    names = iter("ABCDEFGHIJKLMNOPQRSTUVWXYZ")
    grouped: list[Any] = []
    flat: list[tuple[te.Tensor, DramTensor]] = []

    def placeholder(t: DramTensor) -> te.Tensor:
        p = te.placeholder(tuple(t.shape), t.dtype, name=next(names, "X"))
        flat.append((p, t))
        return p

    for a in operands:
        grouped.append([placeholder(t) for t in a] if isinstance(a, list) else placeholder(a))
    try:
        res = opdef.compute(*grouped, attrs=call.attrs)
    except KilnError as err:
        raise NotSupported(f"{opdef.name}: {err}") from err
    if isinstance(res, (list, tuple)):
        if len(res) != 1:
            raise NotSupported(f"{opdef.name}: {len(res)} results")
        res = res[0]
    if any(res is p for p, _ in flat):  # an identity: the result needs its own buffer
        src = res
        res = te.compute(src.shape, lambda *i: src(*i), name="copy")
    if tuple(int(getattr(d, "value", d)) for d in res.shape) != tuple(out.shape) or \
            str(res.dtype) != out.dtype:
        raise NotSupported(f"{opdef.name}: the compute's result is {res.dtype}{res.shape}, "
                           f"the call's {out.dtype}{out.shape}")
    func = te.create_prim_func([*(p for p, _ in flat), res])
    func = convert_blocks_to_loops(func)
    where = {func.buffer_map[p]: t for p, t in zip(func.params, [*(t for _, t in flat), out])}
    return func, where


# ---- the nests ---------------------------------------------------------------------------------
@dataclass(frozen=True)
class LeafNest:
    """One store of a prepared PrimFunc, the loops around it (outermost first) and the
    conditions of the branches around it that the pre-passes could not remove (``guards``:
    the store runs where all hold; only the scalar unit runs a guarded nest)."""

    loops: tuple[tuple[E.Var, int], ...]
    store: BufferStore
    guards: tuple[E.PrimExpr, ...] = ()

    @property
    def extents(self) -> tuple[int, ...]:
        return tuple(n for _, n in self.loops) or (1,)

    @property
    def elements(self) -> int:
        return int(np.prod(self.extents, dtype=np.int64))


def _one_store(s: Stmt) -> BufferStore | None:
    """``if c: B[i] = x else: B[i] = y`` (nested alike) as the store ``B[i] = select(c, x,
    y)``: one nest that writes every element once (a reflect pad's arms differ in what they
    read); None when the arms store elsewhere."""
    if isinstance(s, BufferStore):
        return s
    if not isinstance(s, IfThenElse) or s.else_case is None:
        return None
    a, b = _one_store(s.then_case), _one_store(s.else_case)
    if a is None or b is None or a.buffer is not b.buffer or \
            not structural_equal(a.indices, b.indices):
        return None
    return BufferStore(a.buffer, E.Select(s.condition, a.value, b.value), a.indices)


def leaf_nests(func: PrimFunc) -> list[LeafNest]:
    """Every store of ``func`` (loop form, after :func:`npu_prepare`) with its loops and
    guards (a branch the pre-passes could not remove: a reflect pad's, whose condition is no
    affine comparison). NotSupported for a statement that is no loop of constant extent,
    sequence, branch or store (an allocation)."""
    out: list[LeafNest] = []

    def walk(s: Stmt, loops: tuple[tuple[E.Var, int], ...],
             guards: tuple[E.PrimExpr, ...]) -> None:
        if isinstance(s, SeqStmt):
            for x in s.seq:
                walk(x, loops, guards)
        elif isinstance(s, For):
            lo, n = const_int(s.min), const_int(s.extent)
            if lo != 0 or n is None:
                raise NotSupported("a loop of symbolic range")
            if n > 0:
                walk(s.body, (*loops, (s.loop_var, n)), guards)
        elif isinstance(s, IfThenElse) and _one_store(s) is not None:
            walk(_one_store(s), loops, guards)
        elif isinstance(s, IfThenElse):
            walk(s.then_case, loops, (*guards, s.condition))
            if s.else_case is not None:
                walk(s.else_case, loops, (*guards, E.Not(s.condition)))
        elif isinstance(s, BufferStore):
            out.append(LeafNest(loops, s, guards))
        else:
            raise NotSupported(f"a {type(s).__name__} the loop pre-passes left in the nest")

    walk(func.body, (), ())
    return out


@dataclass(frozen=True)
class Access:
    """An affine access of a DRAM tensor by a nest: element ``offset`` at the loops' origin,
    ``strides`` the elements one step of each loop moves (0: the loop repeats it)."""

    tensor: DramTensor
    offset: int
    strides: tuple[int, ...]

    def view(self, extents: tuple[int, ...]) -> DramView:
        return DramView(self.tensor, self.offset, extents, self.strides or (0,))


def _flat_index(buf: Buffer, indices: tuple[E.PrimExpr, ...]) -> E.PrimExpr:
    """The row-major element offset of ``buf[indices]`` (int64)."""
    off: E.PrimExpr = E.IntImm("int64", 0)
    for d, i in zip(buf.shape, indices):
        off = off * E.IntImm("int64", int(d.value)) + E.Cast("int64", i)
    return off


def affine_access(nest: LeafNest, buf: Buffer, indices: tuple[E.PrimExpr, ...],
                  tensor: DramTensor, ana: Analyzer) -> Access | None:
    """The :class:`Access` of ``buf[indices]`` in ``nest`` (``tensor`` where ``buf`` lives);
    None when the element offset is no affine function of the loops (checked by simplifying
    the difference to 0 over the loops' ranges)."""
    flat = _flat_index(buf, indices)
    vars_ = [v for v, _ in nest.loops]
    zero = {v: E.IntImm(v.dtype, 0) for v in vars_}
    c0 = const_int(ana.simplify(substitute(flat, zero)))
    if c0 is None:
        return None
    strides = []
    for v in vars_:
        c = const_int(ana.simplify(substitute(flat, {**zero, v: E.IntImm(v.dtype, 1)})))
        if c is None:
            return None
        strides.append(c - c0)
    lin: E.PrimExpr = E.IntImm("int64", c0)
    for v, s in zip(vars_, strides):
        lin = lin + E.Cast("int64", v) * E.IntImm("int64", s)
    if const_int(ana.simplify(flat - lin)) != 0:
        return None
    return Access(_as_bytes(tensor), c0, tuple(strides))


# ---- the vector unit's forms -------------------------------------------------------------------
Emit = Callable[[LoweringContext, str], None]


def _analyzer(nest: LeafNest) -> Analyzer:
    ana = Analyzer()
    for v, n in nest.loops:
        ana.bind(v, E.Range(E.IntImm(v.dtype, 0), E.IntImm(v.dtype, n)))
    return ana


def _immediate(e: E.PrimExpr) -> float | int | None:
    if isinstance(e, (E.IntImm, E.FloatImm)):
        return int(e.value) if isinstance(e.value, (bool, np.bool_)) else e.value
    if isinstance(e, E.Cast) and isinstance(e.value, (E.IntImm, E.FloatImm)):
        v = e.value.value
        return float(v) if str(e.dtype).startswith(("float", "bfloat")) else int(v)
    return None


def select_nest(ctx: LoweringContext, nest: LeafNest, where: dict[Buffer, DramTensor]
                ) -> tuple[Emit | None, str]:
    """The vector-unit kernel of ``nest`` (a function emitting it) or None and the reason
    none of the forms of the module docstring matches."""
    cfg = ctx.config
    ana = _analyzer(nest)
    st = nest.store
    ext = nest.extents
    if nest.guards:
        return None, "a branch on a condition that is no affine comparison of the loops"
    out = affine_access(nest, st.buffer, st.indices, where[st.buffer], ana)
    if out is None:
        return None, "the result's index is no affine function of the loops"
    odt = out.tensor.dtype
    loads: list[Access] = []

    def operand(e: E.PrimExpr) -> tuple[Any, ...] | None:
        """A step source: ("in", k) for an affine load, ("imm", v) for a constant."""
        v = _immediate(e)
        if v is not None:
            return ("imm", v)
        if isinstance(e, E.BufferLoad) and e.buffer in where:
            acc = affine_access(nest, e.buffer, e.indices, where[e.buffer], ana)
            if acc is None:
                return None
            loads.append(acc)
            return ("in", len(loads) - 1)
        return None

    def kernel(steps: list[VecStep]) -> Emit:
        views = [a.view(ext) for a in loads]

        def run(c: LoweringContext, op: str) -> None:
            emit_elementwise(c, op, out.view(ext), views, steps)
        return run

    value = st.value
    if not cfg.supports_vector_dtype(odt) and not (isinstance(value, E.BufferLoad)):
        return None, f"{odt} is no vector dtype"
    if isinstance(value, E.BufferLoad) or _immediate(value) is not None:
        src = operand(value)
        if src is None:
            return None, "an index that is no affine function of the loops"
        if src[0] == "imm":
            return kernel([VecStep("vfill", (), (("value", src[1]),))]), ""
        if loads[0].tensor.dtype != odt:
            return None, "a copy between dtypes"
        view = loads[0].view(ext)

        def copy(c: LoweringContext, op: str) -> None:
            copy_kernel(c, op, out.view(ext), view)
        return copy, ""
    if isinstance(value, E.Cast):
        src = operand(value.value)
        if src is None or src[0] != "in":
            return None, "a cast of a value no load holds"
        sdt = loads[0].tensor.dtype
        if not cfg.supports_vector_dtype(sdt) or str(value.value.dtype) == "bool":
            return None, f"a cast from {value.value.dtype}"
        mode = "rtz" if str(value.value.dtype).startswith(("float", "bfloat")) else "rne"
        return kernel([VecStep("vcast", (src,), (("mode", mode),))]), ""
    if type(value) in _CMP:
        cond = _CMP[type(value)]
        a, b = operand(value.a), operand(value.b)
        if a is None or b is None:
            return None, "a comparison of values no load holds"
        if a[0] == "imm":
            a, b, cond = b, a, _SWAP[cond]
        if a[0] == "imm":
            return None, "a comparison of constants"
        cdt = loads[0].tensor.dtype
        if not cfg.supports_vector_dtype(cdt) or \
                (b[0] == "in" and loads[b[1]].tensor.dtype != cdt):
            return None, f"a comparison of {cdt}"
        return kernel([VecStep("vcmp", (a, b), (("cond", cond),))]), ""
    bools = (isinstance(value, (E.And, E.Or, E.Not)) and str(st.buffer.dtype) == "bool")
    if bools:  # bool tensors are bytes 0/1: and = min, or = max, not = (x == 0)
        srcs = [operand(x) for x in ((value.a,) if isinstance(value, E.Not)
                                     else (value.a, value.b))]
        if any(x is None for x in srcs) or any(
                x[0] == "in" and str(loads[x[1]].tensor.dtype) != "uint8" for x in srcs) or \
                srcs[0][0] != "in":
            return None, "a logical operation of values no bool load holds"
        if isinstance(value, E.Not):
            return kernel([VecStep("vcmp", (srcs[0], ("imm", 0)), (("cond", "eq"),))]), ""
        return kernel([VecStep("vmin" if isinstance(value, E.And) else "vmax",
                               tuple(srcs))]), ""
    if isinstance(value, E.Select) and isinstance(value.condition, E.BufferLoad):
        m = operand(value.condition)
        a, b = operand(value.true_value), operand(value.false_value)
        if m is None or a is None or b is None or m[0] != "in":
            return None, "a select of values no load holds"
        for s in (a, b):
            if s[0] == "in" and loads[s[1]].tensor.dtype != odt:
                return None, "a select between dtypes"
        return kernel([VecStep("vsel", (m, a, b))]), ""
    if isinstance(value, E.Select):
        return None, "a select whose condition is no affine comparison of the loops"
    return None, f"{type(value).__name__}: no vector form of the value"


# ---- the scalar unit ---------------------------------------------------------------------------
class _ScalarCode:
    """One core's scalar program of a nest: registers handed out as a stack, branches fixed up
    once their targets are known."""

    def __init__(self, ctx: LoweringContext, where: dict[Buffer, DramTensor], first_free: int):
        self.ctx, self.where = ctx, where
        self.code: list[list[Any]] = []
        self.top = first_free
        self.limit = ctx.config.scalar_registers
        self.loads = 0

    def emit(self, op: str, **fields: Any) -> int:
        self.code.append([op, fields])
        return len(self.code) - 1

    def reg(self) -> int:
        if self.top >= self.limit:
            raise NotSupported("the scalar unit has too few registers for the expression")
        self.top += 1
        return self.top - 1

    def free(self, r: int) -> None:
        self.top = min(self.top, r)

    def gen(self, e: E.PrimExpr, env: dict[E.Var, int]) -> int:
        """A register holding ``e`` (in its dtype; bool as uint8 0/1)."""
        dt = _dt(e.dtype)
        if isinstance(e, E.Var):  # copied: the expression overwrites its registers
            if e not in env:
                raise NotSupported(f"variable {e.name} bound outside the nest")
            r = self.reg()
            self.emit("s.alui", fn="add", dtype="int64", rd=r, rs1=env[e], value=0)
            return r
        if isinstance(e, (E.IntImm, E.FloatImm)):
            v = e.value
            if isinstance(v, (bool, np.bool_)):
                v = int(v)
            if isinstance(v, int) and not -(2 ** 31) <= v < 2 ** 31:
                raise NotSupported(f"constant {v} wider than an immediate")
            r = self.reg()
            self.emit("s.li", dtype=dt, rd=r, value=v)
            return r
        if isinstance(e, E.BufferLoad):
            if e.buffer not in self.where:
                raise NotSupported(f"buffer {e.buffer.name} is no operand (an intermediate)")
            t = self.where[e.buffer]
            if _dt(t.dtype) not in SCALAR_DTYPES:
                raise NotSupported(f"the scalar unit loads no {t.dtype}")
            r = self.address(e.buffer, e.indices, env)
            self.emit("s.ld", dtype=_dt(t.dtype), rd=r, mem=0, base=r, offset=t.addr)
            self.loads += 1
            return r
        if isinstance(e, E.Cast):
            src = _dt(e.value.dtype)
            r = self.gen(e.value, env)
            if str(e.dtype) == "bool":  # x != 0
                z = self.reg()
                self.emit("s.li", dtype=src, rd=z, value=0)
                self.emit("s.alu", fn="ne", dtype=src, rd=r, rs1=r, rs2=z)
                self.free(z)
            elif src != dt:
                mode = "rtz" if src.startswith(("float", "bfloat")) else "rne"
                self.emit("s.cvt", mode=mode, to=dt, **{"from": src}, rd=r, rs=r)
            return r
        if type(e) in _CMP:
            a, b = self.gen(e.a, env), self.gen(e.b, env)
            fn, x, y = _CMP[type(e)], a, b
            if fn in ("gt", "ge"):  # the unit compares lt, le, eq, ne
                x, y, fn = b, a, _SWAP[fn]
            self.emit("s.alu", fn=fn, dtype=_dt(e.a.dtype), rd=a, rs1=x, rs2=y)
            self.free(b)
            return a
        if isinstance(e, E.Not):
            r = self.gen(e.a, env)
            z = self.reg()
            self.emit("s.li", dtype="uint8", rd=z, value=0)
            self.emit("s.alu", fn="eq", dtype="uint8", rd=r, rs1=r, rs2=z)
            self.free(z)
            return r
        if type(e) in _ALU:
            fn = _ALU[type(e)]
            if fn in ("div", "rem", "and", "or", "xor") and dt.startswith(("float", "bfloat")):
                raise NotSupported(f"{type(e).__name__} of floats")
            a = self.gen(e.a, env)
            b = self.gen(e.b, env)
            self.emit("s.alu", fn=fn, dtype=dt, rd=a, rs1=a, rs2=b)
            self.free(b)
            return a
        if isinstance(e, E.Div) and dt.startswith(("float", "bfloat")):
            a, b = self.gen(e.a, env), self.gen(e.b, env)
            self.emit("s.alu", fn="div", dtype=dt, rd=a, rs1=a, rs2=b)
            self.free(b)
            return a
        if E.is_check(e):  # an index checked at run time: s.trap outside [lo, n)
            v, lo, n = (self.gen(x, env) for x in e.args[:3])
            self.emit("s.br", cond="lt", rs1=v, rs2=lo, target=3)
            self.emit("s.br", cond="ge", rs1=v, rs2=n, target=2)
            self.emit("s.jmp", target=2)
            self.emit("s.trap", code="index", rs=v)
            self.emit("s.li", dtype="int64", rd=lo, value=0)
            self.emit("s.br", cond="ge", rs1=v, rs2=lo, target=2)
            self.emit("s.alu", fn="add", dtype="int64", rd=v, rs1=v, rs2=n)  # from the end
            self.free(lo)
            return v
        if isinstance(e, E.Call) and e.op in SCALAR_FN and len(e.args) == 1:
            fn = SCALAR_FN[e.op]
            if fn not in self.ctx.config.scalar_functions:
                raise NotSupported(f"the scalar unit has no {fn}")
            r = self.gen(e.args[0], env)
            self.emit("s.fn", fn=fn, dtype=dt, rd=r, rs=r)
            return r
        if isinstance(e, E.Select):
            res = self.reg()
            c = self.gen(e.condition, env)
            z = self.reg()
            self.emit("s.li", dtype="int64", rd=z, value=0)
            br = self.emit("s.br", cond="eq", rs1=c, rs2=z, target=0)
            self.free(c)
            a = self.gen(e.true_value, env)
            self.emit("s.alu", fn="max", dtype=dt, rd=res, rs1=a, rs2=a)  # a move
            self.free(a)
            jmp = self.emit("s.jmp", target=0)
            self.code[br][1]["target"] = len(self.code) - br
            b = self.gen(e.false_value, env)
            self.emit("s.alu", fn="max", dtype=dt, rd=res, rs1=b, rs2=b)
            self.free(b)
            self.code[jmp][1]["target"] = len(self.code) - jmp
            return res
        raise NotSupported(f"{type(e).__name__ if not isinstance(e, E.Call) else e.op}: "
                           "the scalar unit has no form of it either")

    def address(self, buf: Buffer, indices: tuple[E.PrimExpr, ...], env: dict[E.Var, int]
                ) -> int:
        """A register holding the byte offset of ``buf[indices]`` in its tensor."""
        r = self.gen(E.Cast("int64", _flat_index(buf, indices)), env)
        self.emit("s.alui", fn="mul", dtype="int64", rd=r, rs1=r,
                  value=itemsize(_dt(self.where[buf].dtype)))
        return r


def emit_scalar_nest(ctx: LoweringContext, op: str, nest: LeafNest,
                     where: dict[Buffer, DramTensor], reason: str) -> None:
    """``nest`` on the scalar units (the cores split its elements): per element, the loop
    indices from a flat counter (``div``/``rem`` by the inner extents), the store's value and
    address evaluated in registers, one ``s.st``. ``reason``: why not the vector unit (the
    kernel's description). NotSupported -- before anything is emitted -- for an expression
    the unit cannot evaluate."""
    cfg = ctx.config
    st = nest.store
    n = nest.elements
    odt = _dt(where[st.buffer].dtype) if st.buffer in where else ""
    if odt not in SCALAR_DTYPES:
        raise NotSupported(f"{op}: the scalar unit stores no {odt or 'intermediate buffer'}")
    ext = [e for _, e in nest.loops]
    inner = [int(np.prod(ext[k + 1:], dtype=np.int64)) for k in range(len(ext))]
    per = -(-n // cfg.cores)
    programs: list[list[list[Any]]] = []
    body_len = loads = 0
    for core in range(cfg.cores):
        lo, hi = core * per, min(n, (core + 1) * per)
        if lo >= hi:
            continue
        # r1: the flat counter, r2: its end, r3..: the loop indices, then the expression stack
        sc = _ScalarCode(ctx, where, 3 + len(ext))
        if sc.limit < 4 + len(ext):
            raise NotSupported(f"{op}: the scalar unit has too few registers")
        sc.emit("s.li", dtype="int64", rd=1, value=lo)
        sc.emit("s.li", dtype="int64", rd=2, value=hi)
        start = len(sc.code)
        env: dict[E.Var, int] = {}
        for k, (v, e) in enumerate(nest.loops):
            r = 3 + k
            env[v] = r
            sc.emit("s.alui", fn="div", dtype="int64", rd=r, rs1=1, value=inner[k])
            if k:
                sc.emit("s.alui", fn="rem", dtype="int64", rd=r, rs1=r, value=e)
        skips = []
        for cond in nest.guards:  # a guard that fails skips the element
            c = sc.gen(cond, env)
            z = sc.reg()
            sc.emit("s.li", dtype="int64", rd=z, value=0)
            skips.append(sc.emit("s.br", cond="eq", rs1=c, rs2=z, target=0))
            sc.free(c)
        val = sc.gen(st.value, env)
        addr = sc.address(st.buffer, st.indices, env)
        sc.emit("s.st", dtype=odt, rs=val, mem=0, base=addr, offset=where[st.buffer].addr)
        step = sc.emit("s.alui", fn="add", dtype="int64", rd=1, rs1=1, value=1)
        for at in skips:
            sc.code[at][1]["target"] = step - at
        sc.emit("s.br", cond="lt", rs1=1, rs2=2, target=start - len(sc.code))
        body_len, loads = len(sc.code) - start, sc.loads
        programs.append([core, sc.code])
    for core, code in programs:
        for opcode, fields in code:
            ctx.kb.emit(core, opcode, **fields)
    dram = cfg.memory(DRAM)
    estimate = per * (body_len * cfg.scalar_latency +
                      (loads + 1) * (cfg.scalar_memory_latency + dram.latency))
    ctx.kb.end_kernel(KernelInfo(ctx.label(op), op, SCALAR_TILING.format(reason=reason, n=n)
                                 + f", {body_len} instructions each", estimate, estimate))


# ---- the lowering ------------------------------------------------------------------------------
def last_resort_enabled() -> bool:
    """Whether the lowering runs (``KILN_NPU_LAST_RESORT`` unset or not ``0``; off, its ops go
    to the CPU as before it existed -- what ``benchmarks/npu_last_resort.py`` compares)."""
    return os.environ.get("KILN_NPU_LAST_RESORT", "1") != "0"


@register_lowering(LAST_RESORT_OPS)
def lower_last_resort(ctx: LoweringContext, call: Any, args: list[Any], out: DramTensor
                      ) -> None:
    """Op ``call`` through its own TIR (see the module docstring): each prepared nest on the
    vector unit where a form matches, else on the scalar unit with the reason."""
    op = call.op.name
    if not last_resort_enabled():
        raise NotSupported(f"{op}: the lowering of last resort is off (KILN_NPU_LAST_RESORT=0)")
    operands = [[ctx.tensor(x) for x in a] if isinstance(a, list) else ctx.tensor(a)
                for a in args]
    func, where = op_prim_func(call, operands, out)
    nests = leaf_nests(npu_prepare(func))
    for nest in nests:
        if nest.store.buffer not in where:
            raise NotSupported(f"{op}: an intermediate buffer {nest.store.buffer.name}")
    mark = ctx.checkpoint()
    try:
        for nest in nests:
            fn, why = select_nest(ctx, nest, where)
            if fn is not None:
                inner = ctx.checkpoint()
                try:
                    fn(ctx, op)
                    continue
                except NotSupported as err:  # a limit of the description: the scalar unit
                    ctx.rollback(inner)
                    why = str(err)
            emit_scalar_nest(ctx, op, nest, where,
                             why if why.startswith(f"{op}: ") else f"{op}: {why}")
    except NotSupported:
        ctx.rollback(mark)
        raise
