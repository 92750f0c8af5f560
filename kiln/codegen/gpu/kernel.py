"""CUDA C and OpenCL C for one kernel of a lowered GPU function: one renderer, two dialects.

:class:`KernelEmitter` is the C backend's :class:`~kiln.codegen.c.func.FunctionEmitter` (and
through it its expression emitter) with what GPU code does differently:

- the function is a kernel (``__global__`` / ``__kernel``) over the buffers, symbolic dims and
  scalars its body uses; thread indices are read once into ``const int32_t`` variables;
- shared memory is declared at the top of the kernel (CUDA's dynamic shared memory when it
  exceeds the default per-block amount), private arrays as local arrays;
- barriers and warp shuffles are the dialect's; loops have ``#pragma unroll`` where asked;
- vector expressions (what ``vectorize_loops`` made of a vectorized loop) are written lane by
  lane: a contiguous load of a type with a built-in vector type (``float4``, ``ushort2``...)
  is one vector load (``*(const float4*)`` in CUDA where the address is provably aligned,
  ``vload4`` in OpenCL) whose lanes feed scalar arithmetic, and a contiguous store of such a
  type is one vector store; anything else is loaded and stored one lane at a time. Scalar
  arithmetic is the C backend's (its float16/bfloat16 widening, floor division, NaN-propagating
  min/max...), so GPU and CPU compute the same values.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from ...arith.analyzer import simplify
from ...ir.dtype import DataType
from ...ir.errors import CodegenError
from ...tir import expr as E
from ...tir import stmt as S
from ...tir.buffer import Buffer
from ...tir.function import PrimFunc
from ...tir.functor import post_order_visit
from ...tir.gpu import (
    ASYNC_COMMIT,
    ASYNC_COPY,
    ASYNC_WAIT,
    ATOMIC_ADD,
    BARRIER,
    SHFL,
    SHFL_DOWN,
    KernelLaunch,
    axis_of,
    is_block_tag,
)
from ...tir.tensor_intrin import ADDRESS_OF, ELEM_OFFSET
from ...tir.tensor_intrin.gpu import MMA_SYNC, MMA_TILE, WGMMA
from ...tir.tensor_intrin.wgmma import SharedOperand
from ...tir.transform.async_copies import NOT_ASYNC
from ...tir.transform.hoist_allocations import alloc_size
from ..c import externs
from ..c.func import FunctionEmitter, strip_parens
from ..c.types import soft_float_storage, value_ctype
from .dialect import Dialect
from .helpers import GpuHelpers


@dataclass(frozen=True)
class KernelParam:
    """One parameter of a kernel: a buffer (``buffer``), a scalar variable (``var``: a symbolic
    dim or a scalar parameter of the function), or by ``role`` the fresh seed (``"seed"``),
    the check record (``"checks"``) or the call's tag (``"call"``)."""

    var: E.Var | None = None
    buffer: Buffer | None = None
    role: str = ""


#: The names the check record and the call's tag have inside a kernel.
CHECK_RECORD_PARAM, CALL_PARAM = "kiln_checks", "kiln_call"


def uses_fresh_seed(stmt: S.Stmt) -> bool:
    found = [False]

    def visit(n: Any) -> None:
        if isinstance(n, E.Call) and n.op == "fresh_seed":
            found[0] = True

    post_order_visit(stmt, visit)
    return found[0]


def uses_checks(stmt: S.Stmt) -> bool:
    """Whether ``stmt`` checks an index at run time (``kiln.tir.check_index``)."""
    found = [False]

    def visit(n: Any) -> None:
        if E.is_check(n):
            found[0] = True

    post_order_visit(stmt, visit)
    return found[0]


def written_buffers(stmt: S.Stmt) -> set[E.Var]:
    """The data variables of the buffers ``stmt`` stores to (atomics included)."""
    out: set[E.Var] = set()

    def visit(n: Any) -> None:
        if isinstance(n, S.BufferStore):
            out.add(n.buffer.data)
        elif isinstance(n, E.Call) and n.op == ATOMIC_ADD and isinstance(n.args[0],
                                                                          E.BufferLoad):
            out.add(n.args[0].buffer.data)

    post_order_visit(stmt, visit)
    return out


class KernelEmitter(FunctionEmitter):
    """Writes one :class:`~kiln.tir.gpu.KernelLaunch` as a kernel of ``dialect``."""

    def __init__(self, func: PrimFunc, launch: KernelLaunch, params: list[KernelParam],
                 dialect: Dialect, helpers: GpuHelpers, analyzer: Any = None,
                 dynamic_shared: bool = False, checks: list[str] | None = None):
        super().__init__(func, launch.name, launch.name, helpers, 0, analyzer)
        self.launch = launch
        self.params = params
        self.dialect = dialect
        self.dynamic_shared = dynamic_shared
        #: per-lane scalar variables of the vector variables (lets) in scope
        self.lane_vars: dict[E.Var, list[E.PrimExpr]] = {}
        #: contiguous vector loads of the store being written, loaded once into a vector
        self.hoisted: dict[int, list[E.PrimExpr]] = {}
        self.shared_data = {b.data for b in launch.shared}
        #: the messages of the function's index checks, by number (shared by its kernels)
        self.checks = [] if checks is None else checks
        #: whether the kernel issues wgmma, whose shared-memory reads go through the async
        #: proxy: every barrier is then preceded by a proxy fence (PTX ISA, "Async Proxy"), so
        #: the tiles a thread wrote (its cp.async copies waited for, or plain stores) are
        #: visible to the warpgroups' wgmma once the barrier lets them read
        self.async_proxy_reads = False

        def find(n: Any) -> None:
            if isinstance(n, E.Call) and n.op == WGMMA:
                self.async_proxy_reads = True

        post_order_visit(launch.body, find)

    # ---- the kernel -------------------------------------------------------------------------
    def emit(self) -> str:
        d = self.dialect
        written = written_buffers(self.launch.body)
        decls: list[str] = []
        for p in self.params:
            if p.buffer is not None:
                buf = p.buffer
                name = self.define_var(buf.data)
                decls.append(d.pointer_param(self.storage_ctype(buf.dtype), name,
                                             const=buf.data not in written))
            elif p.var is not None:
                decls.append(self._scalar_param(p.var))
            elif p.role == "checks":
                self.names.reserve(CHECK_RECORD_PARAM)
                decls.append(d.pointer_param("long", CHECK_RECORD_PARAM))
            elif p.role == "call":
                self.names.reserve(CALL_PARAM)
                decls.append(f"long {CALL_PARAM}")
            else:
                self.names.reserve("kiln_seed")
                decls.append(d.pointer_param("uint64_t", "kiln_seed", const=True))
        self._declare_shared()
        for v, tag in self.launch.env:
            self.line(f"const int32_t {self.define_var(v)} = {d.thread_index(tag)};")
            extent = self.launch.grid[axis_of(tag)] if is_block_tag(tag) else \
                self.launch.block[axis_of(tag)]
            if not isinstance(extent, E.IntImm):
                extent = E.IntImm("int32", 2**31 - 1)
            self.bind_range(v, E.IntImm("int32", 0), E.IntImm("int32", extent.value))
        self.stmt(self.launch.body)
        block = tuple(int(b.value) for b in self.launch.block)  # type: ignore[attr-defined]
        header = d.kernel_decl(self.symbol, decls, block)  # type: ignore[arg-type]
        return "\n".join([header + " {", *self.lines, "}", ""])

    def _scalar_param(self, v: E.Var) -> str:
        """A symbolic dim or scalar parameter, passed by value (a float16 one as its bits)."""
        name = self.define_var(v)
        big = E.IntImm(v.dtype, v.dtype.max_value()) if v.dtype.is_integer else None
        if big is not None and v in self.signature.sym_vars:
            self.bind_range(v, E.IntImm(v.dtype, 0), big)
        if self.widened(v.dtype):
            raw = f"{name}_bits"
            self.names.reserve(raw)
            self.line(f"const float {name} = {self.widen_scalar(v.dtype, raw)};")
            return f"{value_ctype(soft_float_storage(v.dtype))} {raw}"
        return f"{self.scalar_ctype(v.dtype)} {name}"

    def _declare_shared(self) -> None:
        d = self.dialect
        offset = 0
        if self.dynamic_shared:
            self.line("extern __shared__ __align__(16) unsigned char kiln_dyn_shared[];")
        for buf in self.launch.shared:
            ct = self.storage_ctype(buf.dtype)
            name = self.define_var(buf.data)
            size = int(simplify(alloc_size(buf)).value)  # type: ignore[attr-defined]
            if self.dynamic_shared:
                self.line(d.dynamic_shared_decl(ct, name, offset))
                offset += (size * max(1, buf.dtype.element.itemsize) + 15) // 16 * 16
            else:
                self.line(d.shared_decl(ct, name, size))

    # ---- types ------------------------------------------------------------------------------
    def scalar_ctype(self, dt: DataType) -> str:
        ct = super().scalar_ctype(dt)
        return self.dialect.bool_type if ct == "_Bool" else ct

    # ---- expressions --------------------------------------------------------------------------
    def expr_Call(self, e: E.Call) -> str:
        if e.op == "fresh_seed":
            return "kiln_seed[0]"
        if e.op in (SHFL, SHFL_DOWN):
            return self._shuffle(e)
        if e.op == ATOMIC_ADD:
            return self._atomic_add(e)
        if E.is_check(e):
            value, lo, n, what = e.args
            args = ", ".join(f"(long)({strip_parens(self.expr(a))})" for a in (value, lo, n))
            self.checks.append(str(what.value))  # type: ignore[attr-defined]
            return (f"{self.helpers.check_index()}({CHECK_RECORD_PARAM}, {CALL_PARAM}, {args}, "
                    f"{len(self.checks) - 1})")
        if e.op in (BARRIER, ASYNC_COPY, ASYNC_COMMIT, ASYNC_WAIT):
            raise CodegenError(f"{self.name}: {e.op} is a statement, not a value")
        if e.op == "rounded":
            return self._rounded(e.args[0])
        if e.op in (ADDRESS_OF, ELEM_OFFSET):
            return externs.emit(self, e)
        if e.op == MMA_SYNC:
            return self._mma_sync(e)
        if e.op == MMA_TILE:
            return self._mma_tile(e)
        if e.op == WGMMA:
            return self._wgmma(e)
        if e.op in externs.EXTERN_OPS:
            raise CodegenError(f"{self.name}: CPU tensor intrinsics cannot run in GPU kernels")
        if e.dtype.lanes > 1:
            raise CodegenError(f"{self.name}: vector call {e.op} outside a vector store")
        return super().expr_Call(e)

    def expr_Let(self, e: E.Let) -> str:
        """CUDA: a lambda called in place (NVRTC rejects GNU statement expressions, the C
        backend's ``({ T x = v; body; })``, which OpenCL compilers accept)."""
        if not self.dialect.is_cuda:
            return super().expr_Let(e)
        name = self.define_var(e.var)
        ct, rt = self.ctype_of(e.value), self.ctype_of(e.body)
        return (f"([&]() -> {rt} {{ {ct} {name} = {strip_parens(self.expr(e.value))}; "
                f"return {strip_parens(self.expr(e.body))}; }}())")

    def _mma_sync(self, e: E.Call) -> str:
        """One thread's part of a tensor-core ``mma`` (:mod:`kiln.tir.tensor_intrin.gpu`)."""
        dtype, *args = e.args
        ldmatrix = len(args) == 8  # the ldmatrix variant's flag, after L
        if ldmatrix:
            args = args[:7]
        fn = self.helpers.mma_m16n8k16(str(dtype.value), ldmatrix)  # type: ignore[attr-defined]
        return f"{fn}({', '.join(strip_parens(self.expr(a)) for a in args)})"

    def _mma_tile(self, e: E.Call) -> str:
        """One thread's part of a warp's tensor-core tile for a 16-deep step
        (:func:`kiln.tir.tensor_intrin.gpu.register_mma_tile_intrinsic`)."""
        dtype, *args, mi, ni = e.args
        fn = self.helpers.mma_tile(  # type: ignore[attr-defined]
            str(dtype.value), int(mi.value), int(ni.value))
        return f"{fn}({', '.join(strip_parens(self.expr(a)) for a in args)})"

    def _wgmma(self, e: E.Call) -> str:
        """One thread's part of its warpgroup's ``wgmma`` products for a step of the reduction
        (:func:`kiln.tir.tensor_intrin.gpu.register_wgmma_intrinsic`)."""
        dtype, c, a, b, ldc, lda, ldb, *consts = e.args
        pending = consts[9:]  # a pipelined step's: whether its products stay in flight
        mi, nj, a_mn, a_lbo, a_sbo, b_mn, b_lbo, b_sbo, depth = (
            int(x.value) for x in consts[:9])  # type: ignore[attr-defined]
        majors = ("k", "mn")
        fn = self.helpers.wgmma(  # type: ignore[attr-defined]
            str(dtype.value), mi, nj, SharedOperand(majors[a_mn], a_lbo, a_sbo),  # type: ignore[attr-defined]
            SharedOperand(majors[b_mn], b_lbo, b_sbo), depth, bool(pending))
        args = (c, a, b, ldc, lda, ldb, *pending)
        return f"{fn}({', '.join(strip_parens(self.expr(x)) for x in args)})"

    def _rounded(self, value: E.PrimExpr) -> str:
        """A product rounded before use (``kiln.tir.rounded``): CUDA's ``__fmul_rn`` /
        ``__dmul_rn``, which nvcc never contracts into an FMA. OpenCL C has no such function
        (its ``FP_CONTRACT`` pragma covers whole kernels): the product as it is."""
        dt = self.compute_dtype(value.dtype)
        if (self.dialect.is_cuda and isinstance(value, E.Mul) and dt.lanes == 1
                and dt.is_float and dt.bits in (32, 64)):
            fn = "__fmul_rn" if dt.bits == 32 else "__dmul_rn"
            return f"{fn}({strip_parens(self.expr(value.a))}, {strip_parens(self.expr(value.b))})"
        return f"({self.expr(value)})"

    def _shuffle(self, e: E.Call) -> str:
        if not self.dialect.is_cuda:
            raise CodegenError(f"{self.name}: warp shuffles are CUDA only")
        value, lane, width = e.args
        dt = self.compute_dtype(e.dtype)
        v = self.expr(value)
        if dt.is_bool or (dt.is_integer and dt.bits < 32):
            v = f"(int)({v})"
        text = self.dialect.shuffle(e.op == SHFL_DOWN, v, self.expr(lane), self.expr(width))
        if dt.is_bool:
            return f"({text} != 0)"
        if dt.is_integer and dt.bits < 32:
            return f"(({self.scalar_ctype(dt)}){text})"
        return text

    def _atomic_add(self, e: E.Call) -> str:
        target, value = e.args
        el = target.dtype
        if not isinstance(target, E.BufferLoad) or el.lanes != 1 or el.is_bool or (
                el.is_float and el.bits < 32) or (el.is_integer and el.bits < 32):
            raise CodegenError(f"{self.name}: atomic_add on {el} (32/64-bit ints and floats)")
        address = f"&{self.buffer_ptr(target.buffer)}[{strip_parens(self.expr(target.indices[0]))}]"
        v = f"({self.scalar_ctype(el)})({strip_parens(self.expr(value))})"
        if el.is_float and not self.dialect.is_cuda:
            return f"{self.helpers.atomic_add_float(el)}({address}, {v})"
        return self.dialect.atomic_add(address, v, el)

    def expr_Ramp(self, e: E.Ramp) -> str:
        raise CodegenError(f"{self.name}: vector index outside a vector load or store")

    def expr_Broadcast(self, e: E.Broadcast) -> str:
        raise CodegenError(f"{self.name}: vector value outside a vector store")

    def expr_BufferLoad(self, e: E.BufferLoad) -> str:
        if e.dtype.lanes > 1:
            raise CodegenError(f"{self.name}: vector load outside a vector store")
        return super().expr_BufferLoad(e)

    # ---- lanes of vector expressions ----------------------------------------------------------
    def lane(self, e: E.PrimExpr, k: int) -> E.PrimExpr:
        """Lane ``k`` of the vector expression ``e``, as a scalar expression."""
        if e.dtype.lanes == 1:
            return e
        if isinstance(e, E.Ramp):
            return e.base if k == 0 else E.add(e.base, E.mul(e.stride, k))
        if isinstance(e, E.Broadcast):
            return e.value
        if isinstance(e, E.Var):
            try:
                return self.lane_vars[e][k]
            except KeyError:
                raise CodegenError(f"{self.name}: vector variable {e.name!r} is not "
                                   "defined") from None
        if isinstance(e, E.BufferLoad):
            if id(e) in self.hoisted:
                return self.hoisted[id(e)][k]
            return E.BufferLoad(e.buffer, (self.lane(e.indices[0], k),))
        if isinstance(e, E.BinaryOp):
            return type(e)(self.lane(e.a, k), self.lane(e.b, k))
        if isinstance(e, E.Not):
            return E.Not(self.lane(e.a, k))
        if isinstance(e, E.Select):
            return E.Select(self.lane(e.condition, k), self.lane(e.true_value, k),
                            self.lane(e.false_value, k))
        if isinstance(e, E.Cast):
            return E.Cast(e.dtype.element, self.lane(e.value, k))
        if isinstance(e, E.Call):
            return E.Call(e.dtype.element, e.op, tuple(self.lane(a, k) for a in e.args))
        if isinstance(e, E.Let):
            if e.var.dtype.lanes == 1:
                return E.Let(e.var, e.value, self.lane(e.body, k))
            lanes = self.lane_vars.setdefault(e.var, [
                E.Var(f"{e.var.name}_{j}", e.var.dtype.element) for j in range(e.dtype.lanes)])
            return E.Let(lanes[k], self.lane(e.value, k), self.lane(e.body, k))  # type: ignore
        raise CodegenError(f"{self.name}: cannot split {type(e).__name__} into lanes")

    def _vector_type(self, buf: Buffer, lanes: int) -> str | None:
        """The built-in vector type for ``lanes`` elements of ``buf``, when vector memory
        operations apply to it (global or shared memory; not bool or sub-byte types)."""
        el = buf.dtype.element
        if el.is_bool or (el.is_integer and el.bits < 8) or (el.is_float and el.bits < 16):
            return None
        if buf.data not in self.shared_data and buf.data not in {
                p.buffer.data for p in self.params if p.buffer is not None}:
            return None  # a private array, or workspace passed differently
        return self.dialect.vector_type(self.storage_ctype(el), lanes)

    def _vector_address(self, buf: Buffer, index: E.PrimExpr, lanes: int) -> str | None:
        """``ptr + base`` of a contiguous vector access that may use a vector type."""
        base = self.contiguous_base(index)
        if base is None:
            return None
        if self.dialect.vector_needs_alignment and not self._multiple_of(base, lanes):
            return None
        return f"{self.buffer_ptr(buf)} + {strip_parens(self.expr(base))}"

    def _vector_copy_source(self, value: E.PrimExpr, el: DataType, lanes: int) -> str | None:
        """The vector address of ``value`` when it is a plain load of ``el`` elements that a
        vector store may copy as they are (a tile copied into shared memory): no per-lane
        conversion (float16 would go through float32 and back)."""
        if not (isinstance(value, E.BufferLoad) and value.buffer.dtype.element == el):
            return None
        if self._vector_type(value.buffer, lanes) is None:
            return None
        return self._vector_address(value.buffer, value.indices[0], lanes)

    def _hoist_loads(self, value: E.PrimExpr) -> None:
        """Load each contiguous vector load of ``value`` once, as a built-in vector."""
        loads: list[E.BufferLoad] = []

        def visit(n: Any) -> None:
            if isinstance(n, E.BufferLoad) and n.dtype.lanes > 1:
                loads.append(n)

        post_order_visit(value, visit)
        for ld in loads:
            lanes = ld.dtype.lanes
            vt = self._vector_type(ld.buffer, lanes)
            address = None if vt is None else self._vector_address(ld.buffer, ld.indices[0],
                                                                   lanes)
            if address is None or vt is None:
                continue
            name = self.fresh("v")
            self.line(f"const {vt} {name} = {self.dialect.vector_load(vt, lanes, address)};")
            el = ld.buffer.dtype.element
            lane_vars = []
            for k in range(lanes):
                v = E.Var(f"{name}_{k}", el)
                text = self.dialect.lane(name, k)
                self.var_names[v] = self.widen_scalar(el, text) if self.widened(el) else text
                lane_vars.append(v)
            self.hoisted[id(ld)] = lane_vars

    # ---- statements ---------------------------------------------------------------------------
    def stmt_BufferStore(self, s: S.BufferStore) -> None:
        if s.value.dtype.lanes == 1:
            self.line(self.scalar_store(s))
            return
        buf, index, value = s.buffer, s.indices[0], s.value
        lanes = value.dtype.lanes
        self.line("{")
        self.depth += 1
        el = buf.dtype.element
        vt = self._vector_type(buf, lanes)
        address = None if vt is None else self._vector_address(buf, index, lanes)
        source = None if address is None else self._vector_copy_source(value, el, lanes)
        if source is None:
            self._hoist_loads(value)
        if vt is not None and address is not None and source is not None:
            self.line(self.dialect.vector_copy(vt, lanes, address, source))
        elif vt is not None and address is not None:
            values = []
            for k in range(lanes):
                lane = self.lane(value, k)
                if self.widened(el):
                    values.append(self.narrow_scalar(el, strip_parens(self.float32_value(lane))))
                else:
                    values.append(strip_parens(self.expr(lane)))
            self.line(self.dialect.vector_store(vt, lanes, address, values))
        else:
            for k in range(lanes):
                lane = S.BufferStore(buf, self.lane(value, k), (self.lane(index, k),))
                self.line(self.scalar_store(lane))
        self.hoisted.clear()
        self.depth -= 1
        self.line("}")

    def stmt_LetStmt(self, s: S.LetStmt) -> None:
        if s.var.dtype.lanes == 1:
            if s.var.dtype.is_integer and self.analyzer is not None:
                self.analyzer.bind(s.var, s.value)  # alignment proofs see through indices
            super().stmt_LetStmt(s)
            return
        lanes = []
        for k in range(s.var.dtype.lanes):
            v = E.Var(f"{s.var.name}_{k}", s.var.dtype.element)
            value = self.lane(s.value, k)
            ct = self.ctype_of(value)
            self.line(f"const {ct} {self.define_var(v)} = {strip_parens(self.expr(value))};")
            lanes.append(v)
        self.lane_vars[s.var] = lanes
        self.stmt(s.body)

    def stmt_For(self, s: S.For) -> None:
        if s.kind == S.ForKind.THREAD_BINDING:
            raise CodegenError(f"{self.name}: loop {s.loop_var.name!r} is still bound to a "
                               "thread index (lower the function first)")
        for key, what in (("kiln.not_vectorized", "not vectorized"),
                          (NOT_ASYNC, "a synchronous copy")):
            reason = s.annotations.get(key)
            if reason:
                self.line(f"/* {what}: {str(reason).replace('*/', '* /')} */")
        if s.kind == S.ForKind.UNROLLED and isinstance(s.extent, E.IntImm):
            self.line("#pragma unroll")
        elif 1 < int(s.annotations.get(S.UNROLL_BY, 0)) <= 65534:
            self.line(f"#pragma unroll {int(s.annotations[S.UNROLL_BY])}")
        self.emit_for(s)

    def stmt_Allocate(self, s: S.Allocate) -> None:
        buf = s.buffer
        size = alloc_size(buf)
        if buf.scope == "shared" or not isinstance(size, E.IntImm):
            raise CodegenError(f"{self.name}: buffer {buf.name!r} (scope {buf.scope!r}) is "
                               "allocated inside the kernel (lower the function first)")
        self.line(f"{self.storage_ctype(buf.dtype)} {self.define_var(buf.data)}[{size.value}];")
        self.stmt(s.body)

    def stmt_Evaluate(self, s: S.Evaluate) -> None:
        if isinstance(s.value, E.Call) and s.value.op == BARRIER:
            if self.async_proxy_reads and self.dialect.is_cuda:
                self.line('asm volatile("fence.proxy.async.shared::cta;" ::: "memory");')
            self.line(self.dialect.barrier)
            return
        if isinstance(s.value, E.Call) and s.value.op == ASYNC_COPY:
            self._async_copy(s.value)
            return
        if isinstance(s.value, E.Call) and s.value.op in (ASYNC_COMMIT, ASYNC_WAIT):
            if self.dialect.is_cuda:  # OpenCL's copies were plain ones: nothing in flight
                n = int(s.value.args[0].value) if s.value.args else 0  # type: ignore[attr-defined]
                self.line("asm volatile(\"cp.async.commit_group;\" ::: \"memory\");"
                          if s.value.op == ASYNC_COMMIT else
                          f"asm volatile(\"cp.async.wait_group {n};\" ::: \"memory\");")
            return
        super().stmt_Evaluate(s)

    def _async_copy(self, e: E.Call) -> None:
        """``gpu.async_copy(dst, src, bytes)`` (:mod:`kiln.tir.transform.async_copies`): CUDA
        ``cp.async`` (``.cg``, bypassing L1, for 16 bytes; ``.ca`` for 4 and 8), OpenCL the
        same bytes copied element by element at once."""
        dst, src, nbytes = e.args
        loads = [a.args[0] if isinstance(a, E.Call) and a.op == ADDRESS_OF else None
                 for a in (dst, src)]
        if not all(isinstance(ld, E.BufferLoad) for ld in loads):
            raise CodegenError(f"{self.name}: async_copy needs kiln.address_of operands")
        d, src_load = loads
        size = int(nbytes.value)  # type: ignore[attr-defined]
        if d.buffer.data not in self.shared_data or src_load.buffer.data in self.shared_data:
            raise CodegenError(f"{self.name}: async_copy copies global to shared memory, not "
                               f"{src_load.buffer.name!r} to {d.buffer.name!r}")
        to, frm = (strip_parens(self.expr(a)) for a in (dst, src))
        if self.dialect.is_cuda:
            self.line(f"{self.helpers.cp_async(size)}({to}, {frm});")  # type: ignore[attr-defined]
            return
        n = size // max(1, d.buffer.dtype.element.itemsize)
        self.line(f"for (int kiln_e = 0; kiln_e < {n}; ++kiln_e) "
                  f"({to})[kiln_e] = ({frm})[kiln_e];")

    def stmt_AssertStmt(self, s: S.AssertStmt) -> None:
        if not self.dialect.is_cuda:
            raise CodegenError(f"{self.name}: assertions cannot be checked in OpenCL kernels "
                               f"({s.message})")
        self.line(f"if (!{self.expr(s.condition)}) __trap();")
        self.stmt(s.body)

    def stmt_KernelLaunch(self, s: KernelLaunch) -> None:
        raise CodegenError(f"{self.name}: kernel {s.name!r} nested in a kernel")

    def stmt_ThreadAllreduce(self, s: Any) -> None:
        raise CodegenError(f"{self.name}: a cross-thread reduction was not lowered")
