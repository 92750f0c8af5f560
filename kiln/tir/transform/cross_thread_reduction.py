"""GPU lowering pass: reductions whose reduction loop is bound to ``threadIdx`` (block form).

A row reduction on a GPU gives each row a block of threads: the reduction loop is split, its
outer part bound to ``threadIdx.x`` and the inner part left serial, so every thread reduces a
strided slice of the row and the threads then combine their partial results. In block form
that is a reduction block under a ``threadIdx`` loop bound to one of its reduction variables
(``Schedule.bind`` allows it only for ``threadIdx`` tags). This pass (TVM's
LowerCrossThreadReduction) rewrites such a block into what each thread runs::

    for tx in thread_binding(T, "threadIdx.x"):     # the bound reduction loops, kept
        acc[0] = identity                           # a one-element local accumulator
        for k in range(K / T):                      # the serial reduction loops below them
            if predicate: acc[0] = acc[0] OP value
        red[0] = thread_allreduce(OP, acc[0], over=["threadIdx.x"])
        if tx == 0 and spatial predicate:
            C[i] = red[0]                            # (combined with the init value, or with
                                                     # C[i] under outer serial reduce loops)

A float16/bfloat16 reduction accumulates in float32 (``acc``, ``red`` and the combination;
:func:`accumulator_dtype`), rounded once at the store.
``ThreadAllreduce`` (:mod:`kiln.tir.gpu`) is expanded later, once the kernel's block shape is
known (``kiln.tir.transform.gpu_kernels``): warp shuffles on CUDA, a shared-memory tree on
OpenCL. Requirements (a ``LoweringError`` names the block otherwise): the block is a reduction
``acc = acc OP value`` (OP one of + * min max && ||) that still has its ``init``; below the
first bound reduction loop there are only the other bound reduction loops, then serial
reduction loops, each the whole body of the one above and the block the body of the last.
Serial reduction loops *above* the bound ones are allowed: the write then accumulates into the
output after their first iteration.
"""

from __future__ import annotations

from ...arith import simplify as simplify_expr
from ...ir.dtype import DataType
from ...ir.errors import LoweringError, ScheduleError
from ..buffer import Buffer
from ..expr import (
    Add,
    And,
    BufferLoad,
    CommReducer,
    IterType,
    Max,
    Min,
    Mul,
    Or,
    PrimExpr,
    Var,
    all_of,
    cast,
    const,
    eq,
)
from ..function import PrimFunc
from ..functor import collect_vars, substitute
from ..gpu import ThreadAllreduce, is_thread_tag
from ..schedule.analysis import conjuncts, is_true
from ..schedule.cache import widen
from ..schedule.rfactor import split_reduction_update
from ..schedule.state import SRef, TreeIndex, rewrite_func
from ..stmt import THREAD_TAG, Allocate, BlockRealize, BufferStore, For, ForKind, IfThenElse, Stmt
from ..stmt import seq as seq_stmt


def reducer_identity(combiner: type, dtype) -> PrimExpr:
    """The neutral element of ``combiner`` (an expression class) for ``dtype``."""
    el = dtype.element
    if combiner is Add:
        return const(el, 0)
    if combiner is Mul:
        return const(el, 1)
    if combiner is Max:
        return const(el, el.min_value())
    if combiner is Min:
        return const(el, el.max_value())
    if combiner is And:
        return const(el, True)
    if combiner is Or:
        return const(el, False)
    raise LoweringError(f"no identity for the combiner {combiner.__name__}")


def accumulator_dtype(dtype: DataType) -> DataType:
    """What a cross-thread reduction of ``dtype`` values accumulates in: float32 for float16
    and bfloat16 (each thread's partial sum and the threads' combination stay in float32,
    rounded once at the store, as the GEMM schedules' accumulators do; in 16 bits every
    partial sum was rounded), else ``dtype`` itself."""
    el = dtype.element
    if el.is_float and el.bits < 32:
        return DataType("float32")
    return el


def make_reducer(combiner: type, dtype) -> CommReducer:
    """A CommReducer ``(x, y) -> x OP y`` of ``dtype`` with its identity."""
    x, y = Var("x", dtype), Var("y", dtype)
    return CommReducer(x, y, combiner(x, y), reducer_identity(combiner, dtype))


def _thread_tag(loop: For) -> str | None:
    if loop.kind != ForKind.THREAD_BINDING:
        return None
    return str(loop.annotations.get(THREAD_TAG))


def _candidate(index: TreeIndex) -> tuple[SRef, list[SRef], int] | None:
    """The first reduction block under a ``threadIdx`` loop bound to one of its reduction
    variables: (block, its loops, position of the first such loop)."""
    for b in index.block_list:
        block = b.block
        reduce_vars: set[Var] = set()
        for iv, value in zip(block.iter_vars, b.node.iter_values):
            if iv.iter_type == IterType.COMM_REDUCE:
                reduce_vars |= set(collect_vars(value))
        if not reduce_vars:
            continue
        loops = index.loops_above(b)
        for k, lp in enumerate(loops):
            tag = _thread_tag(lp.loop)
            if tag and is_thread_tag(tag) and lp.loop.loop_var in reduce_vars:
                return b, loops, k
    return None


def _rewrite(index: TreeIndex, b: SRef, loops: list[SRef], first: int) -> PrimFunc:
    realize = b.node
    assert isinstance(realize, BlockRealize)
    block = realize.block
    name = block.name_hint
    try:
        store, combiner, rhs = split_reduction_update(block, "cross-thread reduction")
    except ScheduleError as err:
        raise LoweringError(f"block {name!r} is reduced across threads: {err}") from None
    if block.alloc_buffers:
        raise LoweringError(f"cross-thread reduction of block {name!r}: the block allocates "
                            "buffers")
    spatial_vars: set[Var] = set()
    reduce_vars: set[Var] = set()
    for iv, value in zip(block.iter_vars, realize.iter_values):
        (reduce_vars if iv.iter_type == IterType.COMM_REDUCE else spatial_vars).update(
            collect_vars(value))
    inner = [s.loop for s in loops[first:]]
    bound = [lp for lp in inner if _thread_tag(lp)]
    serial = inner[len(bound):]
    for lp in inner:
        var = lp.loop_var
        if var in spatial_vars or var not in reduce_vars:
            raise LoweringError(
                f"cross-thread reduction of block {name!r}: loop {var.name!r} below its first "
                "thread-bound reduction loop does not run over reduction variables only")
    for lp in bound:
        if not is_thread_tag(_thread_tag(lp) or ""):
            raise LoweringError(f"cross-thread reduction of block {name!r}: loop "
                                f"{lp.loop_var.name!r} is bound to {_thread_tag(lp)}")
    if any(_thread_tag(lp) for lp in serial):
        raise LoweringError(f"cross-thread reduction of block {name!r}: its thread-bound "
                            "reduction loops must be directly nested, above its serial ones")
    for outer, nested in zip(inner, inner[1:] + [None]):
        body = outer.body
        if (nested is None and body is not realize) or (nested is not None
                                                         and body is not nested):
            raise LoweringError(
                f"cross-thread reduction of block {name!r}: loop {outer.loop_var.name!r} holds "
                "more than the reduction (the block must be alone under its thread-bound "
                "reduction loops)")
    vmap = {iv.var: value for iv, value in zip(block.iter_vars, realize.iter_values)}
    dtype = store.buffer.dtype
    wide = accumulator_dtype(dtype)
    reducer = make_reducer(combiner, wide)
    acc = Buffer(f"{name}_acc", (const("int64", 1),), wide, scope="local")
    red = Buffer(f"{name}_red", (const("int64", 1),), wide, scope="local")
    zero = (const("int64", 0),)
    inner_vars = {lp.loop_var for lp in inner}
    pred_all = substitute(realize.predicate, vmap)
    write_terms = [c for c in conjuncts(pred_all) if not (set(collect_vars(c)) & inner_vars)]

    value = widen(substitute(rhs, vmap), store.buffer, acc) if wide != dtype else substitute(
        rhs, vmap)
    update: Stmt = BufferStore(acc, combiner(BufferLoad(acc, zero), value), zero)
    if not is_true(pred_all):
        update = IfThenElse(pred_all, update)
    for lp in reversed(serial):
        update = lp.replace(body=update)

    # the first iteration of the reduction loops above the bound ones, if any
    at_start = {lp.loop_var: lp.min for lp in inner}
    first_terms = [
        simplify_expr(eq(substitute(value, at_start), iv.dom.min))
        for iv, value in zip(block.iter_vars, realize.iter_values)
        if iv.iter_type == IterType.COMM_REDUCE
    ]
    first_terms = [t for t in first_terms if not is_true(t)]
    indices = tuple(substitute(i, vmap) for i in store.indices)
    init_value = substitute(block.init.value, vmap)  # type: ignore[union-attr]
    result = BufferLoad(red, zero)
    is_identity = simplify_expr(eq(init_value, reducer_identity(combiner, dtype)))
    fresh = result if is_true(is_identity) else combiner(cast(wide, init_value), result)
    write: Stmt = BufferStore(store.buffer, cast(dtype, fresh), indices)
    if first_terms:
        write = IfThenElse(all_of(first_terms), write, BufferStore(store.buffer, cast(
            dtype, combiner(cast(wide, BufferLoad(store.buffer, indices)), result)), indices))
    leader = [eq(lp.loop_var, lp.min) for lp in bound]
    write = IfThenElse(all_of(leader + write_terms), write)
    tags = tuple(_thread_tag(lp) or "" for lp in bound)
    reduce_stmt = Allocate(red, seq_stmt(
        ThreadAllreduce(reducer, BufferLoad(acc, zero), red, tags), write))
    body: Stmt = Allocate(acc, seq_stmt(BufferStore(acc, reducer.identity, zero), update,
                                        reduce_stmt))
    for lp in reversed(bound):
        body = lp.replace(body=body)
    return rewrite_func(index.func, {id(inner[0]): body})


def lower_cross_thread_reduction(func: PrimFunc) -> PrimFunc:
    """Return ``func`` (block form) with every reduction bound to ``threadIdx`` rewritten into
    per-thread accumulation plus a :class:`~kiln.tir.gpu.ThreadAllreduce` (module docstring)."""
    if not isinstance(func.body, BlockRealize):
        return func
    while True:
        index = TreeIndex(func)
        found = _candidate(index)
        if found is None:
            return func
        func = _rewrite(index, *found)
