"""AnnotateTIROpPattern: derive a PrimFunc's fusion pattern (``op_pattern``) from its body.

FuseOps decides what to fuse from the ``op_pattern`` of each ``call_tir`` callee. LegalizeOps
tags the PrimFuncs it makes with the declaring op's pattern; a PrimFunc written by hand (or made
with ``te`` directly) has none, and this pass derives it by looking at how every block indexes
what it reads relative to what it writes. kiln's rules, per block (``te`` blocks store one
value, ``out[store indices] = f(loads)``; iteration variables of extent 1 count as their
constant value, so a size-1 axis read at ``0`` is the same as one read at its variable):

- a load is *element-wise* when it reads a buffer of the output's shape at exactly the store
  indices; *broadcast* when, after skipping size-1 dimensions read at ``0``, its indices are
  plain store-index variables in increasing store position, each over a dimension of the same
  extent; *injective* when its indices use no reduction variable;
- a spatial block (no reduction variables) is ELEMWISE when every load is element-wise,
  BROADCAST when every load is element-wise or broadcast, INJECTIVE when every load is
  injective, OPAQUE otherwise (also when its store indices are not distinct plain variables);
- a reduction block is OUT_EWISE_FUSABLE when it looks like a contraction or a window (the
  rule of thumb TVM uses for conv2d/matmul/pooling): its reduced value multiplies two tensor
  reads that both use a reduction variable (matmul, dense, conv), or one load index mixes a
  reduction variable with a spatial one (a sliding window: pooling, convolution). Otherwise it
  is COMM_REDUCE.

The function's pattern combines its blocks: OPAQUE if any block is; with a reduction block,
OUT_EWISE_FUSABLE if a reduction is, else COMM_REDUCE, except that a *normalization* (a spatial
stage reading a reduction's result broadcast back over the reduced axes, as softmax and
layer_norm do) is OPAQUE: it makes several passes over its input, so a fused producer would be
recomputed in every pass and a consumer cannot join the last pass as a simple epilogue; without
reductions, the largest spatial pattern.

By default the pass only fills functions that have no ``op_pattern`` (the op declaration is the
one authority for legalized ops); ``AnnotateTIROpPattern(overwrite=True)`` replaces existing ones.
"""

from __future__ import annotations

from typing import Any

from ..ir.module import IRModule
from ..ir.node import structural_equal
from ..op.registry import OpPattern
from ..tir.expr import BufferLoad, IntImm, IterType, Mul, PrimExpr, Var
from ..tir.function import PrimFunc
from ..tir.functor import collect_vars, post_order_visit, substitute
from ..tir.stmt import Block, BlockRealize, BufferStore
from .pass_infra import PassContext, prim_func_pass

__all__ = ["AnnotateTIROpPattern", "analyze_op_pattern", "block_patterns"]


def _is_one(e: Any) -> bool:
    return isinstance(e, IntImm) and e.value == 1


def _is_zero(e: Any) -> bool:
    return isinstance(e, IntImm) and e.value == 0


def _same(a: Any, b: Any) -> bool:
    return a is b or structural_equal(a, b, map_free_vars=False)


def _root_and_blocks(func: PrimFunc) -> list[Block]:
    """Every block of the function except the root (outermost, iteration-free) block."""
    root = func.body.block if isinstance(func.body, BlockRealize) else None
    out: list[Block] = []

    def visit(n: Any) -> None:
        if isinstance(n, Block) and n is not root:
            out.append(n)

    post_order_visit(func.body, visit)
    return out


class _BlockView:
    """A block's store and loads, with extent-1 iteration variables replaced by their value."""

    def __init__(self, block: Block):
        self.block = block
        unit = {iv.var: iv.dom.min for iv in block.iter_vars if _is_one(iv.dom.extent)}
        self.spatial = {iv.var for iv in block.iter_vars
                        if iv.iter_type == IterType.DATA_PAR and iv.var not in unit}
        self.reduce = {iv.var for iv in block.iter_vars
                       if iv.iter_type == IterType.COMM_REDUCE and iv.var not in unit}
        self.is_reduction = any(iv.iter_type == IterType.COMM_REDUCE for iv in block.iter_vars)
        body = block.body
        self.store: BufferStore | None = None
        self.loads: list[BufferLoad] = []
        if not isinstance(body, BufferStore):
            return
        store = substitute(body, unit) if unit else body
        self.store = store
        loads: list[BufferLoad] = []
        post_order_visit(store.value, lambda n: loads.append(n) if isinstance(n, BufferLoad)
                         else None)
        if self.is_reduction:  # the accumulator ``out[idx]`` in ``out[idx] = out[idx] + ...``
            loads = [ld for ld in loads
                     if not (ld.buffer is store.buffer and _same(ld.indices, store.indices))]
        self.loads = loads

    def plain_store(self) -> bool:
        """Store indices are distinct spatial variables (or constants of size-1 axes)."""
        seen: list[Var] = []
        for idx in self.store.indices:
            if isinstance(idx, IntImm):
                continue
            if not isinstance(idx, Var) or idx not in self.spatial or idx in seen:
                return False
            seen.append(idx)
        return True


def _load_kind(view: _BlockView, load: BufferLoad) -> OpPattern:
    """How one load relates to the block's store (ELEMWISE / BROADCAST / INJECTIVE / OPAQUE)."""
    store = view.store
    out_shape, in_shape = store.buffer.shape, load.buffer.shape
    if (len(in_shape) == len(out_shape) and _same(load.indices, store.indices)
            and all(_same(a, b) for a, b in zip(in_shape, out_shape))):
        return OpPattern.ELEMWISE
    pos = 0
    broadcast = True
    for dim, idx in zip(in_shape, load.indices):
        if _is_one(dim) and _is_zero(idx):
            continue
        while pos < len(store.indices) and store.indices[pos] is not idx:
            pos += 1
        if pos == len(store.indices) or not isinstance(idx, Var) or not _same(
                dim, out_shape[pos]):
            broadcast = False
            break
        pos += 1
    if broadcast:
        return OpPattern.BROADCAST
    if any(v in view.reduce for i in load.indices for v in collect_vars(i)):
        return OpPattern.OPAQUE
    return OpPattern.INJECTIVE


def _uses(e: Any, vs: set[Var]) -> bool:
    return any(v in vs for v in collect_vars(e))


def _is_contraction(view: _BlockView) -> bool:
    """The reduced value multiplies two tensor reads that both use a reduction variable."""
    found = []

    def operand_reads(e: PrimExpr) -> list[BufferLoad]:
        loads: list[BufferLoad] = []
        post_order_visit(e, lambda n: loads.append(n) if isinstance(n, BufferLoad) else None)
        return [ld for ld in loads if any(_uses(i, view.reduce) for i in ld.indices)]

    def visit(n: Any) -> None:
        if isinstance(n, Mul) and operand_reads(n.a) and operand_reads(n.b):
            found.append(n)

    post_order_visit(view.store.value, visit)
    return bool(found)


def _is_window(view: _BlockView) -> bool:
    """A load index combines a reduction variable with a spatial one (sliding window)."""
    for ld in view.loads:
        for idx in ld.indices:
            vs = set(collect_vars(idx))
            if vs & view.reduce and vs & view.spatial:
                return True
    return False


def _block_pattern(view: _BlockView) -> OpPattern:
    if view.store is None or not view.plain_store():
        return OpPattern.OPAQUE
    if view.is_reduction:
        if view.block.init is None:
            return OpPattern.OPAQUE
        if _is_contraction(view) or _is_window(view):
            return OpPattern.OUT_EWISE_FUSABLE
        return OpPattern.COMM_REDUCE
    kind = OpPattern.ELEMWISE
    for ld in view.loads:
        kind = max(kind, _load_kind(view, ld))
    return kind


def block_patterns(func: PrimFunc) -> list[tuple[str, OpPattern]]:
    """``(block name, pattern)`` of every non-root block, in program order (for diagnostics)."""
    return [(b.name_hint, _block_pattern(_BlockView(b))) for b in _root_and_blocks(func)]


def analyze_op_pattern(func: PrimFunc) -> OpPattern:
    """The fusion pattern of ``func`` derived from its body (see the module docstring)."""
    views = [_BlockView(b) for b in _root_and_blocks(func)]
    if not views:
        return OpPattern.OPAQUE
    kinds = [_block_pattern(v) for v in views]
    if OpPattern.OPAQUE in kinds:
        return OpPattern.OPAQUE
    reductions = [v for v in views if v.is_reduction]
    if not reductions:
        return max(kinds)
    reduced = {id(v.store.buffer) for v in reductions}
    for v in views:
        if v.is_reduction:
            continue
        for ld in v.loads:
            if id(ld.buffer) in reduced and _load_kind(v, ld) != OpPattern.ELEMWISE:
                return OpPattern.OPAQUE  # a normalization: the reduction is broadcast back
    if OpPattern.OUT_EWISE_FUSABLE in kinds:
        return OpPattern.OUT_EWISE_FUSABLE
    return OpPattern.COMM_REDUCE


def pattern_of(func: PrimFunc) -> OpPattern:
    """The function's ``op_pattern`` attr when it has one, else the derived pattern."""
    declared = func.attrs.get("op_pattern")
    if declared is not None:
        return OpPattern(int(declared))
    return analyze_op_pattern(func)


@prim_func_pass(opt_level=0)
class AnnotateTIROpPattern:
    """Set each PrimFunc's op_pattern attr from its body (only where missing, by default)."""

    def __init__(self, overwrite: bool = False):
        self.overwrite = overwrite

    def transform_function(self, func: PrimFunc, mod: IRModule, ctx: PassContext) -> PrimFunc:
        if "op_pattern" in func.attrs and not self.overwrite:
            return func
        pattern = int(analyze_op_pattern(func))
        if func.attrs.get("op_pattern") == pattern:
            return func
        return func.with_attr("op_pattern", pattern)
