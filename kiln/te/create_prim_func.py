"""``create_prim_func``: tensor expressions -> a block-based TIR PrimFunc.

The function follows the PrimFunc conventions of docs/internals.md: one handle parameter per
listed tensor (inputs, then outputs) mapped to the tensor's buffer; a root block named "root"
that allocates the intermediate tensors; one loop nest per compute stage in topological order,
each a nest of serial loops (output axes, then reduce axes) around the stage's block.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from ..ir.dtype import DataType
from ..ir.errors import KilnError
from ..ir.node import Node, structural_equal, structural_hash
from ..tir.buffer import Buffer, BufferRegion
from ..tir.expr import (
    BufferLoad,
    IntImm,
    IterVar,
    Let,
    PrimExpr,
    Range,
    Reduce,
    Select,
    Var,
    const,
)
from ..tir.function import ASSUME_ATTR, PrimFunc
from ..tir.functor import Mutator, collect_vars, post_order_visit, substitute
from ..tir.stmt import Block, BlockRealize, BufferStore, For, ForKind, Stmt, seq, true_predicate
from .tensor import ComputeOp, PlaceholderOp, Tensor


class _NameTable:
    """Hands out names unique within one function (``T_add``, ``T_add_1``, ...)."""

    def __init__(self, reserved: Sequence[str] = ()):
        self.used: set[str] = set(reserved)

    def get(self, name: str) -> str:
        if name not in self.used:
            self.used.add(name)
            return name
        k = 1
        while f"{name}_{k}" in self.used:
            k += 1
        self.used.add(f"{name}_{k}")
        return f"{name}_{k}"


class _Rewrite(Mutator):
    """Replace the compute's axis vars by block iter vars and tensor buffers by function ones."""

    def __init__(self, vmap: dict[Var, PrimExpr], bmap: dict[int, Buffer]):
        self.vmap, self.bmap = vmap, bmap

    def visit_Var(self, v: Var) -> PrimExpr:
        return self.vmap.get(v, v)

    visit_SizeVar = visit_Var

    def visit_Buffer(self, b: Buffer) -> Buffer:
        return self.bmap.get(id(b), b)


def _split_outputs(
    args: list[Tensor | Var], num_outputs: int | None
) -> int:
    """How many trailing arguments are outputs (see :func:`create_prim_func`)."""
    tensors = [a for a in args if isinstance(a, Tensor)]
    if num_outputs is not None:
        if not isinstance(num_outputs, int) or not 1 <= num_outputs <= len(args):
            raise KilnError(
                f"create_prim_func: num_outputs={num_outputs!r} must be between 1 and the number "
                f"of arguments ({len(args)})"
            )
        for a in args[len(args) - num_outputs:]:
            if not (isinstance(a, Tensor) and isinstance(a.op, ComputeOp)):
                what = a.name if isinstance(a, (Tensor, Var)) else repr(a)
                raise KilnError(
                    f"create_prim_func: output {what!r} is not a te.compute tensor; outputs are "
                    f"the last {num_outputs} argument(s)"
                )
        return num_outputs
    # Default: every compute tensor that no other listed compute depends on.
    ancestors: set[int] = set()
    for t in tensors:
        if isinstance(t.op, ComputeOp):
            stack = list(t.op.input_tensors)
            while stack:
                x = stack.pop()
                if id(x) in ancestors:
                    continue
                ancestors.add(id(x))
                stack.extend(x.op.input_tensors)
    is_out = [
        isinstance(a, Tensor) and isinstance(a.op, ComputeOp) and id(a) not in ancestors
        for a in args
    ]
    n = sum(is_out)
    if n == 0:
        raise KilnError("create_prim_func: the argument list has no output (te.compute) tensor")
    if not all(is_out[len(args) - n:]):
        order = ", ".join(
            f"{a.name}({'out' if o else 'in'})" for a, o in zip(args, is_out)
        )
        raise KilnError(
            "create_prim_func: arguments must be inputs first, then outputs; got " + order +
            " (pass num_outputs= to say how many trailing tensors are outputs)"
        )
    return n


def _stages(outputs: list[Tensor], inputs: set[int]) -> list[Tensor]:
    """Compute tensors to generate, producers before consumers (iterative post-order DFS)."""
    order: list[Tensor] = []
    done: set[int] = set()
    for out in outputs:
        stack: list[tuple[Tensor, bool]] = [(out, False)]
        while stack:
            t, expanded = stack.pop()
            if id(t) in done or id(t) in inputs:
                continue
            if expanded:
                done.add(id(t))
                order.append(t)
                continue
            if isinstance(t.op, PlaceholderOp):
                raise KilnError(
                    f"create_prim_func: placeholder {t.name!r} is used by the outputs but is not "
                    "in the argument list"
                )
            stack.append((t, True))
            for x in reversed(t.op.input_tensors):
                if id(x) not in done and id(x) not in inputs:
                    stack.append((x, False))
    return order


def _point(buffer: Buffer, indices: Sequence[PrimExpr]) -> BufferRegion:
    region = []
    for idx in indices:
        dt = idx.dtype.element if idx.dtype.element.is_integer else DataType("int64")
        region.append(Range(idx, const(dt, 1)))
    return BufferRegion(buffer, tuple(region))


def _reads(exprs: Sequence[Any]) -> tuple[BufferRegion, ...]:
    """One point region per distinct load (structurally, without renaming), first-use order."""
    loads: list[BufferLoad] = []
    by_hash: dict[int, list[BufferLoad]] = {}

    def f(n: Node) -> None:
        if isinstance(n, BufferLoad):
            h = structural_hash((n.buffer, n.indices))
            for other in by_hash.get(h, ()):
                if structural_equal(
                    (n.buffer, n.indices), (other.buffer, other.indices), map_free_vars=False
                ):
                    return
            by_hash.setdefault(h, []).append(n)
            loads.append(n)

    for e in exprs:
        if e is not None:
            post_order_visit(e, f)
    return tuple(_point(ld.buffer, ld.indices) for ld in loads)


def _stage(t: Tensor, out: Buffer, bmap: dict[int, Buffer], block_name: str) -> Stmt:
    op = t.op
    assert isinstance(op, ComputeOp)
    axes = list(op.axis) + list(op.reduce_axis)
    if isinstance(op.body, Reduce) and any(_static_empty(iv) for iv in op.reduce_axis):
        # An empty reduction is its identity. As a reduction block its init would sit inside
        # the zero-trip reduction loops and never run, leaving the output uninitialized.
        axes = list(op.axis)
    loop_vars = [Var(iv.var.name, iv.var.dtype) for iv in axes]
    block_ivs = [
        IterVar(iv.dom, Var("v_" + iv.var.name, iv.var.dtype), iv.iter_type) for iv in axes
    ]
    rw = _Rewrite({iv.var: b.var for iv, b in zip(axes, block_ivs)}, bmap)
    idx = tuple(b.var for b in block_ivs[: len(op.axis)])
    init: Stmt | None = None
    if isinstance(op.body, Reduce) and len(axes) == len(op.axis) and op.reduce_axis:
        value = rw.visit(op.body.combiner.identity)
        reads = _reads([value])
    elif isinstance(op.body, Reduce):
        red = op.body
        source = rw.visit(red.source)
        cond = rw.visit(red.condition) if red.condition is not None else None
        identity = rw.visit(red.combiner.identity)
        acc = BufferLoad(out, idx)
        comb = red.combiner
        value: PrimExpr = substitute(comb.result, {comb.lhs: acc, comb.rhs: source})
        if cond is not None and not _is_true(cond):
            value = Select(cond, value, acc)
        init = BufferStore(out, identity, idx)
        reads = _reads([source, cond, identity])
    else:
        value = rw.visit(op.body)
        reads = _reads([value])
    block = Block(
        iter_vars=tuple(block_ivs),
        reads=reads,
        writes=(_point(out, idx),),
        name_hint=block_name,
        body=BufferStore(out, value, idx),
        init=init,
        annotations={k: v for k, v in op.attrs.items() if k != ASSUME_ATTR},
    )
    stmt: Stmt = BlockRealize(tuple(loop_vars), true_predicate(), block)
    for lv, iv in reversed(list(zip(loop_vars, axes))):
        stmt = For(lv, iv.dom.min, iv.dom.extent, ForKind.SERIAL, stmt)
    return stmt


def _static_empty(iv: IterVar) -> bool:
    return isinstance(iv.dom.extent, IntImm) and iv.dom.extent.value == 0


def _is_true(e: PrimExpr) -> bool:
    return isinstance(e, IntImm) and e.dtype.is_bool and e.value == 1


def create_prim_func(
    tensors: Sequence[Tensor | Var], num_outputs: int | None = None
) -> PrimFunc:
    """Make the block-based PrimFunc computing the listed output tensors.

    ``tensors`` lists the function's arguments in order: inputs, then outputs. An input may be
    a placeholder or a compute tensor (then it is not recomputed); a ``tir.Var`` in the list
    becomes a scalar parameter. ``num_outputs`` says how many trailing tensors are outputs;
    ``None`` means every compute tensor of the list that no other listed compute depends on
    (directly or through intermediates). Compute tensors reached from the outputs that are not
    listed become intermediates allocated by the root block; placeholders reached must be
    listed. Placeholders not reached are still parameters. Buffer and block names are made
    unique within the function (``T_add``, ``T_add_1``). ``attrs`` are ``global_symbol`` (the
    name of the last output), ``num_outputs`` and, when computes declare them in their
    ``attrs``, ``kiln.tir.function.ASSUME_ATTR`` (the conditions on symbolic dims the kernel
    checks before it runs; they are not block annotations).
    """
    args = list(tensors) if isinstance(tensors, (list, tuple)) else [tensors]
    if not args:
        raise KilnError("create_prim_func: empty argument list")
    seen: set[int] = set()
    for a in args:
        if not isinstance(a, (Tensor, Var)):
            raise KilnError(
                f"create_prim_func: argument {a!r} is not a te.Tensor (or a tir.Var scalar)"
            )
        if id(a) in seen:
            raise KilnError(f"create_prim_func: argument {a.name!r} is listed twice")
        seen.add(id(a))
    n_out = _split_outputs(args, num_outputs)
    outputs = [a for a in args[len(args) - n_out:] if isinstance(a, Tensor)]
    input_ids = {id(a) for a in args[: len(args) - n_out]}
    stages = _stages(outputs, input_ids)
    listed = {id(a) for a in args}
    intermediates = [t for t in stages if id(t) not in listed]

    # Buffers: the tensor's own buffer, renamed (a copy) only when its name is taken.
    names = _NameTable()
    bmap: dict[int, Buffer] = {}

    def own(t: Tensor) -> Buffer:
        b = t.buffer
        unique = names.get(b.name)
        nb = b if unique == b.name else Buffer(unique, b.shape, b.dtype, None, b.strides,
                                               b.elem_offset, b.scope)
        bmap[id(b)] = nb
        return nb

    params: list[Var] = []
    buffer_map: dict[Var, Buffer] = {}
    for a in args:
        if isinstance(a, Var):
            names.get(a.name)
            params.append(a)
            continue
        buf = own(a)
        p = Var(buf.name, DataType("handle"))
        params.append(p)
        buffer_map[p] = buf
    allocs = tuple(own(t) for t in intermediates)

    blocks = _NameTable(reserved=("root",))
    nests = [_stage(t, bmap[id(t.buffer)], bmap, blocks.get(t.op.name)) for t in stages]
    _check_free_vars(args, buffer_map, allocs, nests)

    root = Block((), (), (), "root", seq(*nests), None, allocs)
    body = BlockRealize((), true_predicate(), root)
    last = bmap[id(outputs[-1].buffer)]
    attrs: dict[str, Any] = {"global_symbol": last.name, "num_outputs": n_out}
    assumed = tuple(a for t in stages for a in getattr(t.op, "attrs", {}).get(ASSUME_ATTR, ()))
    if assumed:
        attrs[ASSUME_ATTR] = assumed
    return PrimFunc(tuple(params), buffer_map, body, attrs)


def _check_free_vars(
    args: list[Tensor | Var], buffer_map: dict[Var, Buffer], allocs: tuple[Buffer, ...],
    nests: list[Stmt],
) -> None:
    """Every variable the body uses must be bound by a loop, a block or a parameter."""
    bound: set[int] = {id(a) for a in args if isinstance(a, Var)}
    for buf in buffer_map.values():
        bound.update(id(v) for v in collect_vars(buf.shape))
    bound_locally: set[int] = set()

    def binders(n: Node) -> None:
        if isinstance(n, For):
            bound_locally.add(id(n.loop_var))
        elif isinstance(n, Block):
            bound_locally.update(id(iv.var) for iv in n.iter_vars)
        elif isinstance(n, Reduce):  # pragma: no cover - reductions are lowered to stores
            bound_locally.update(id(iv.var) for iv in n.axis)
        elif isinstance(n, Let):  # a let inside a compute expression binds its variable
            bound_locally.add(id(n.var))

    for nest in nests:
        post_order_visit(nest, binders)
    free = [
        v for v in collect_vars((tuple(b.shape for b in allocs), tuple(nests)))
        if id(v) not in bound and id(v) not in bound_locally
    ]
    if free:
        raise KilnError(
            "create_prim_func: variable(s) "
            + ", ".join(repr(v.name) for v in free)
            + " are used but not bound: a symbolic dimension must appear in the shape of an "
            "argument tensor, or pass the variable itself in the argument list"
        )


__all__ = ["create_prim_func"]
