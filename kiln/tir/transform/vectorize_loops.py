"""Lowering pass: turn ``ForKind.VECTORIZED`` loops into vector expressions.

A vectorized loop ``for i in [m, m + L)`` with a constant power-of-two extent ``L`` is replaced
by its body evaluated once on vectors: the loop variable becomes ``Ramp(m, 1, L)``, loop
invariant operands become ``Broadcast``, contiguous loads/stores (index ``Ramp(base, 1, L)``)
become vector loads/stores, and arithmetic, comparisons, selects and casts act lane-wise. Index
arithmetic keeps Ramps symbolic (``Ramp(b, s, L) * c + d`` is ``Ramp(b * c + d, s * c, L)``) so
that ``A[i * 8 + j]`` vectorized over ``j`` is recognised as contiguous.

When the body cannot be written with vectors -- a gather or scatter (non-contiguous index), a
store to a location that does not depend on the loop variable (a reduction over the vectorized
axis), an intrinsic without a vector form (``tanh``, float64 ``exp``...; ``exp`` and ``sigmoid``
of float32 and narrower floats are expanded into branch-free formulas,
:mod:`kiln.tir.math_formulas`), a nested loop, a branch on a condition
that differs between lanes, or an extent that is not a small power of two -- the loop stays a
scalar loop, annotated with the reason (``"kiln.not_vectorized"``) and, when it is safe to
execute its iterations as SIMD lanes, with ``"kiln.simd": True`` so that the C code generator
emits ``#pragma omp simd`` and lets GCC vectorize it (e.g. with libmvec's vector ``tanhf``).
Safety means: every store goes to a distinct address per iteration (an index affine in the loop
variable with a non-zero step) and every load of a stored buffer reads the very element the
iteration stores, so no iteration depends on another.

float16/bfloat16 values vectorize like any other type: the C backend holds them as float32
vectors, widened by its loads and rounded by its stores (or as ``_Float16`` vectors where the
target computes in float16).
"""

from __future__ import annotations

from ...arith import simplify
from ...ir.node import structural_equal
from ..expr import (
    Add,
    BinaryOp,
    Broadcast,
    BufferLoad,
    Call,
    Cast,
    FloatImm,
    IntImm,
    Let,
    Mul,
    Not,
    PrimExpr,
    Ramp,
    Reduce,
    Select,
    StringImm,
    Sub,
    Var,
    add,
    is_check,
    mul,
    sub,
)
from ..function import PrimFunc
from ..functor import Mutator, post_order_visit, substitute
from ..math_formulas import expand_call
from ..stmt import (
    Allocate,
    AssertStmt,
    BufferStore,
    Evaluate,
    For,
    ForKind,
    IfThenElse,
    LetStmt,
    SeqStmt,
    Stmt,
)

#: Largest vector a vectorized loop is turned into; longer loops use ``#pragma omp simd``.
MAX_LANES = 64

#: Intrinsics the C code generator can apply to a whole vector without a per-lane loop. Others
#: with a formula in :data:`kiln.tir.math_formulas.EXPANSIONS` (``exp``, ``sigmoid``) are
#: expanded into it.
VECTOR_INTRINSICS = frozenset({"fabs", "reinterpret", "rounded"})


def _has_vector_form(call: Call) -> bool:
    """Whether ``call`` is in :data:`VECTOR_INTRINSICS` for its types. ``reinterpret`` of a
    float narrower than 32 bits is not: its vector form goes through float32 values, and a
    signalling NaN's bits would come back quiet (the scalar form reads the stored bits)."""
    if call.op == "reinterpret":
        return not any(t.is_float and t.bits < 32 for t in (call.dtype, call.args[0].dtype))
    return call.op in VECTOR_INTRINSICS


class CannotVectorize(Exception):
    """Raised inside the vectorizer with the reason the body needs a scalar loop."""


def _ramp(base: PrimExpr, stride: PrimExpr, lanes: int) -> Ramp:
    """A Ramp whose stride is folded (contiguity tests look for the constant 1)."""
    if not isinstance(stride, IntImm):
        stride = simplify(stride)
    return Ramp(base, stride, lanes)


def _structural_eq(a, b) -> bool:
    return structural_equal(a, b, map_free_vars=False)


class _Vectorizer:
    """Vectorizes one loop body over ``var`` (``lanes`` lanes starting at ``start``)."""

    def __init__(self, var: Var, start: PrimExpr, lanes: int, lanewise_calls: bool = False):
        self.var = var
        self.lanes = lanes
        self.lanewise_calls = lanewise_calls
        self.vmap: dict[Var, PrimExpr] = {var: Ramp(start, IntImm(var.dtype, 1), lanes)}

    # ---- helpers -------------------------------------------------------------------------
    def bcast(self, e: PrimExpr) -> PrimExpr:
        return e if e.dtype.lanes == self.lanes else Broadcast(e, self.lanes)

    # ---- expressions ---------------------------------------------------------------------
    def expr(self, e: PrimExpr) -> PrimExpr:
        return self._expr(e)

    def _expr(self, e: PrimExpr) -> PrimExpr:
        if isinstance(e, Var):
            return self.vmap.get(e, e)
        if isinstance(e, (IntImm, FloatImm, StringImm)):
            return e
        if isinstance(e, BinaryOp):
            return self.binary(e)
        if isinstance(e, Not):
            a = self.expr(e.a)
            return e if a is e.a else Not(a)
        if isinstance(e, Select):
            c, t, f = self.expr(e.condition), self.expr(e.true_value), self.expr(e.false_value)
            if all(x.dtype.lanes == 1 for x in (c, t, f)):
                if c is e.condition and t is e.true_value and f is e.false_value:
                    return e
                return Select(c, t, f)
            return Select(self.bcast(c), self.bcast(t), self.bcast(f))
        if isinstance(e, Cast):
            v = self.expr(e.value)
            if v.dtype.lanes == 1:
                return e if v is e.value else Cast(e.dtype, v)
            if isinstance(v, Broadcast):
                return Broadcast(Cast(e.dtype, v.value), self.lanes)
            return Cast(e.dtype.with_lanes(self.lanes), v)
        if isinstance(e, BufferLoad):
            return self.load(e)
        if isinstance(e, Call):
            args = [self.expr(a) for a in e.args]
            if all(a.dtype.lanes == 1 for a in args):
                if all(a is b for a, b in zip(args, e.args)):
                    return e
                return Call(e.dtype, e.op, tuple(args))
            if not (self.lanewise_calls or _has_vector_form(e)):
                formula = expand_call(e)
                if formula is None:
                    raise CannotVectorize(f"intrinsic {e.op} has no vector form for {e.dtype}")
                return self.expr(formula)
            return Call(e.dtype.with_lanes(self.lanes), e.op, tuple(self.bcast(a) for a in args))
        if isinstance(e, Let):
            value = self.expr(e.value)
            if value.dtype.lanes != 1:
                nv = Var(e.var.name, value.dtype)
                self.vmap[e.var] = nv
                return Let(nv, value, self.bcast(self.expr(e.body)))
            body = self.expr(e.body)
            if value is e.value and body is e.body:
                return e
            return Let(e.var, value, body)
        if isinstance(e, (Ramp, Broadcast)):
            raise CannotVectorize("the body already contains vector expressions")
        if isinstance(e, Reduce):
            raise CannotVectorize("Reduce must be lowered before vectorization")
        raise CannotVectorize(f"{type(e).__name__} expressions are not vectorized")

    def binary(self, e: BinaryOp) -> PrimExpr:
        a, b = self.expr(e.a), self.expr(e.b)
        if a.dtype.lanes == 1 and b.dtype.lanes == 1:
            if a is e.a and b is e.b:
                return e
            return type(e)(a, b)
        # Keep affine index arithmetic as Ramps.
        if isinstance(e, (Add, Sub)):
            op = add if isinstance(e, Add) else sub
            if isinstance(a, Ramp) and b.dtype.lanes == 1:
                return _ramp(op(a.base, b), a.stride, self.lanes)
            if isinstance(a, Ramp) and isinstance(b, Broadcast):
                return _ramp(op(a.base, b.value), a.stride, self.lanes)
            if isinstance(b, Ramp) and a.dtype.lanes == 1 and isinstance(e, Add):
                return _ramp(add(a, b.base), b.stride, self.lanes)
            if isinstance(a, Ramp) and isinstance(b, Ramp):
                return _ramp(op(a.base, b.base), op(a.stride, b.stride), self.lanes)
        if isinstance(e, Mul):
            if isinstance(a, Ramp) and b.dtype.lanes == 1:
                return _ramp(mul(a.base, b), mul(a.stride, b), self.lanes)
            if isinstance(b, Ramp) and a.dtype.lanes == 1:
                return _ramp(mul(a, b.base), mul(a, b.stride), self.lanes)
        if isinstance(a, Broadcast) and isinstance(b, Broadcast):
            return Broadcast(type(e)(a.value, b.value), self.lanes)
        return type(e)(self.bcast(a), self.bcast(b))

    def load(self, e: BufferLoad) -> PrimExpr:
        if len(e.indices) != 1:
            raise CannotVectorize(f"buffer {e.buffer.name} is not flattened")
        idx = self.expr(e.indices[0])
        if idx.dtype.lanes == 1:
            return e if idx is e.indices[0] else BufferLoad(e.buffer, (idx,))
        if isinstance(idx, Ramp) and isinstance(idx.stride, IntImm):
            if idx.stride.value == 1:
                return BufferLoad(e.buffer, (idx,))
            if idx.stride.value == 0:
                return Broadcast(BufferLoad(e.buffer, (idx.base,)), self.lanes)
        if isinstance(idx, Broadcast):
            return Broadcast(BufferLoad(e.buffer, (idx.value,)), self.lanes)
        raise CannotVectorize(f"non-contiguous (gather) load from {e.buffer.name}")

    # ---- statements ----------------------------------------------------------------------
    def stmt(self, s: Stmt) -> Stmt:
        if isinstance(s, BufferStore):
            if len(s.indices) != 1:
                raise CannotVectorize(f"buffer {s.buffer.name} is not flattened")
            idx = self.expr(s.indices[0])
            value = self.expr(s.value)
            if idx.dtype.lanes == 1:
                raise CannotVectorize(
                    f"store to {s.buffer.name} does not depend on the vectorized loop variable"
                )
            if not (isinstance(idx, Ramp) and isinstance(idx.stride, IntImm)
                    and idx.stride.value == 1):
                raise CannotVectorize(f"non-contiguous (scatter) store to {s.buffer.name}")
            value = self.bcast(value)
            return BufferStore(s.buffer, value, (idx,))
        if isinstance(s, SeqStmt):
            return SeqStmt(tuple(self.stmt(x) for x in s.seq))
        if isinstance(s, IfThenElse):
            cond = self.expr(s.condition)
            if cond.dtype.lanes != 1:
                raise CannotVectorize("branch condition differs between lanes")
            then_case = self.stmt(s.then_case)
            else_case = None if s.else_case is None else self.stmt(s.else_case)
            return IfThenElse(cond, then_case, else_case)
        if isinstance(s, LetStmt):
            value = self.expr(s.value)
            if isinstance(value, (Ramp, Broadcast)):  # an index: keep it affine (contiguous)
                self.vmap[s.var] = value
                return self.stmt(s.body)
            if value.dtype.lanes != 1:
                nv = Var(s.var.name, value.dtype)
                self.vmap[s.var] = nv
                return LetStmt(nv, value, self.stmt(s.body))
            return LetStmt(s.var, value, self.stmt(s.body))
        if isinstance(s, For):
            raise CannotVectorize("the body contains a loop")
        if isinstance(s, Allocate):
            raise CannotVectorize("the body allocates a buffer")
        if isinstance(s, (Evaluate, AssertStmt)):
            raise CannotVectorize(f"{type(s).__name__} in the body")
        raise CannotVectorize(f"{type(s).__name__} statements are not vectorized")


def _index_step(index: PrimExpr, var: Var) -> PrimExpr | None:
    """The Ramp form of ``index`` over ``var`` (None when it is not affine in ``var``)."""
    try:
        v = _Vectorizer(var, IntImm(var.dtype, 0), 2)._expr(index)
    except CannotVectorize:
        return None
    return v if isinstance(v, Ramp) else None


def simd_safe(loop: For) -> bool:
    """True when the iterations of ``loop`` may run as SIMD lanes (see the module docstring)."""
    stores: list[BufferStore] = []
    loads: list[BufferLoad] = []
    nested = [False]

    def f(n) -> None:
        if isinstance(n, BufferStore):
            stores.append(n)
        elif isinstance(n, BufferLoad):
            loads.append(n)
        elif isinstance(n, (For, Allocate, AssertStmt)) or is_check(n):
            nested[0] = True  # (a run-time check records a failure: not a SIMD lane's work)

    post_order_visit(loop.body, f)
    if nested[0]:
        return False
    stored: dict[object, list[tuple[PrimExpr, ...]]] = {}
    for s in stores:
        if len(s.indices) != 1:
            return False
        ramp = _index_step(s.indices[0], loop.loop_var)
        if ramp is None or not isinstance(ramp.stride, IntImm) or ramp.stride.value == 0:
            return False
        stored.setdefault(s.buffer.data, []).append(s.indices)
    for ld in loads:
        targets = stored.get(ld.buffer.data)
        if targets is None:
            continue
        if not all(_structural_eq(ld.indices, t) for t in targets):
            return False
    return True


def _is_pow2(n: int) -> bool:
    return n > 0 and (n & (n - 1)) == 0


class _VectorizeLoops(Mutator):
    def __init__(self, lanewise_calls: bool = False):
        self.lanewise_calls = lanewise_calls

    def visit_For(self, loop: For) -> Stmt:
        body = self.visit(loop.body)
        if body is not loop.body:
            loop = For(loop.loop_var, loop.min, loop.extent, loop.kind, body, loop.annotations)
        if loop.kind != ForKind.VECTORIZED:
            return loop
        try:
            if not isinstance(loop.extent, IntImm):
                raise CannotVectorize("the extent is not a constant")
            lanes = loop.extent.value
            if lanes == 1:
                return substitute(loop.body, {loop.loop_var: loop.min})
            if not _is_pow2(lanes) or lanes > MAX_LANES:
                raise CannotVectorize(
                    f"extent {lanes} is not a power of two up to {MAX_LANES}"
                )
            return _Vectorizer(loop.loop_var, loop.min, lanes, self.lanewise_calls).stmt(
                loop.body)
        except CannotVectorize as why:
            ann = dict(loop.annotations)
            ann["kiln.not_vectorized"] = str(why)
            if simd_safe(loop):
                ann["kiln.simd"] = True
            return For(loop.loop_var, loop.min, loop.extent, ForKind.SERIAL, loop.body, ann)


def vectorize_loops(func: PrimFunc, lanewise_calls: bool = False) -> PrimFunc:
    """Return ``func`` with vectorized loops lowered (see the module docstring).

    ``lanewise_calls``: every intrinsic call keeps its vector form (the GPU code generator
    evaluates vector expressions lane by lane), none is expanded into a formula."""
    body = _VectorizeLoops(lanewise_calls).visit(func.body)
    return func if body is func.body else func.with_body(body)


__all__ = ["CannotVectorize", "MAX_LANES", "VECTOR_INTRINSICS", "simd_safe", "vectorize_loops"]
