"""FuseTIR: turn every Primitive graph function (made by FuseOps) into one PrimFunc.

For a Primitive function ``fused_conv2d_add_relu(x, w, b)`` whose body is ``call_tir`` bindings,
the fused PrimFunc has one buffer parameter per function parameter, then one per result value
(inputs first, outputs last, as every PrimFunc). Each member PrimFunc's body is inlined in
binding order:

- its parameter buffers are replaced by the buffers of the values it is called with: a fused
  parameter, another member's result, or the fused output buffer;
- a member result used only inside the group becomes an intermediate buffer of scope
  ``"local"`` allocated by the fused root block, and the member's own intermediates join the
  root's allocations (renamed where names clash);
- its symbolic dimensions are bound to the dimensions of the buffers it is called with, and its
  loop and block variables are copied, so a member called twice yields independent loop nests;
- a member result that stays inside the kernel and is a float product is wrapped in
  :func:`kiln.tir.rounded` when the anchor is element-wise, injective or a reduction: the C
  compiler must not fuse it with a following member's addition into one FMA, so the kernel
  rounds as the operators would one after the other (``E[x^2] - E[x]^2`` overflowing to
  ``inf - inf = NaN`` as in onnxruntime, not to a finite value). A GEMM-like anchor's epilogue
  (convolution, matmul, pooling) keeps its FMAs, as onnxruntime's own fused kernels do;
- its blocks are renamed where their names clash, except the *anchor*'s: the member with the
  strongest fusion pattern (ties: the last one), whose op schedule the build applies to the
  fused function, finds its blocks under their original names.

The fused PrimFunc's attrs: ``op_name`` and ``op_pattern`` of the anchor, ``fused_ops`` (the op
names of the members in order), ``kiln.anchor_blocks`` (the anchor's block names),
``num_outputs``, the members' ``kiln.assume`` conditions (in the fused kernel's dims), and
``kiln.fused_group`` (a :class:`FusedGroup` record of the Primitive function and the member
PrimFuncs, which DefuseOps uses to undo the fusion). Callers' calls of the Primitive function
become one ``call_tir``; the Primitive functions, and member PrimFuncs no graph function calls
any more, leave the module.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from .. import tir
from ..graph import expr as gx
from ..graph.block_builder import BlockBuilder
from ..graph.functor import ExprMutator, ExprVisitor
from ..graph.op_registry import OpPattern
from ..graph.struct_info import TensorStructInfo, TupleStructInfo
from ..ir.errors import InternalError, KilnError
from ..ir.module import IRModule
from ..ir.node import structural_equal, structural_hash
from ..tir.buffer import Buffer
from ..tir.expr import PrimExpr, Var
from ..tir.function import ASSUME_ATTR, PrimFunc
from ..tir.functor import Mutator, collect_vars, post_order_visit, substitute
from ..tir.schedule.analysis import infer_regions
from ..tir.stmt import Block, BlockRealize, BufferStore, seq, true_predicate
from .annotate_tir_op_pattern import pattern_of
from .pass_infra import PassContext, module_pass

__all__ = ["FuseTIR", "FusedGroup", "fuse_primitive"]


@dataclass(frozen=True, eq=False)
class FusedGroup:
    """What a fused PrimFunc was made from: the Primitive graph function and its members.

    Kept as the fused PrimFunc's ``kiln.fused_group`` attr so that DefuseOps can restore the
    member calls. Compared and hashed structurally (two identical fusions are one kernel).
    """

    func: gx.Function
    members: tuple[tuple[str, PrimFunc], ...]

    def __eq__(self, other: object) -> bool:
        if not isinstance(other, FusedGroup):
            return NotImplemented
        return self is other or structural_equal((self.func, self.members),
                                                 (other.func, other.members))

    def __hash__(self) -> int:
        return structural_hash((self.func, self.members))

    def __repr__(self) -> str:
        return f"FusedGroup({', '.join(name for name, _ in self.members)})"


def _unique(name: str, used: set[str]) -> str:
    out, k = name, 1
    while out in used:
        out = f"{name}_{k}"
        k += 1
    used.add(out)
    return out


class _Inliner(Mutator):
    """Copies one member body: buffers remapped, symbolic dims bound, local vars renewed,
    blocks renamed; a float product stored into ``rounded`` (the member's result when it stays
    inside the kernel) is wrapped in :func:`kiln.tir.rounded`, so that no FMA fuses it with the
    consumer that is inlined into it."""

    def __init__(self, buffers: dict[Buffer, Buffer], sym: dict[Var, PrimExpr],
                 block_names: dict[str, str], rounded: Buffer | None = None):
        self.buffers = buffers
        self.sym = sym
        self.block_names = block_names
        self.rounded = rounded
        self.fresh: dict[Var, Var] = {}

    def visit_BufferStore(self, s: BufferStore) -> BufferStore:
        new = self.generic_visit(s)
        if self.rounded is not None and new.buffer is self.rounded:
            value = tir.rounded(new.value)
            if value is not new.value:
                new = new.replace(value=value)
        return new

    def visit_Buffer(self, b: Buffer) -> Buffer:
        return self.buffers.get(b, b)

    def visit_Var(self, v: Var) -> PrimExpr:
        if v in self.sym:
            return self.sym[v]
        new = self.fresh.get(v)
        if new is None:
            new = self.fresh[v] = type(v)(v.name, v.dtype)
        return new

    visit_SizeVar = visit_Var

    def visit_Block(self, b: Block) -> Block:
        new = _unit_dims_by_iter_var(self.generic_visit(b))
        name = self.block_names.get(b.name_hint, b.name_hint)
        return new if name == new.name_hint else new.replace(name_hint=name)


def _is_const(e: Any, value: int) -> bool:
    return isinstance(e, tir.IntImm) and e.value == value


def _unit_dims_by_iter_var(block: Block) -> Block:
    """Index size-1 dimensions of loads by the block's iteration variable of that (size-1)
    output dimension instead of the constant 0 (``te`` broadcasting writes ``A[0, i]``).

    Same value, but a schedule can now follow the index: ``reverse_compute_at`` derives an
    epilogue's loops from the indices at which it reads the anchor's result, and a constant
    gives it nothing to derive the size-1 loop from.
    """
    store = block.body
    if block.init is not None or not isinstance(store, tir.BufferStore):
        return block
    units = {iv.var for iv in block.iter_vars if _is_const(iv.dom.extent, 1)}
    out_shape = store.buffer.shape
    slots = {d: idx for d, idx in enumerate(store.indices)
             if idx in units and _is_const(out_shape[d], 1)}
    if not slots:
        return block

    class _Loads(Mutator):
        def visit_BufferLoad(self, load: tir.BufferLoad) -> PrimExpr:
            load = self.generic_visit(load)
            shape = load.buffer.shape
            if len(shape) != len(out_shape):
                return load
            idx = [slots[d] if d in slots and _is_const(i, 0) and _is_const(shape[d], 1) else i
                   for d, i in enumerate(load.indices)]
            if all(a is b for a, b in zip(idx, load.indices)):
                return load
            return tir.BufferLoad(load.buffer, tuple(idx))

    value = _Loads().visit(store.value)
    if value is store.value:
        return block
    new = block.replace(body=store.replace(value=value))
    reads, writes = infer_regions(new)
    return new.replace(reads=reads, writes=writes)


def _root_parts(func: PrimFunc) -> tuple[list[Any], tuple[Buffer, ...]]:
    """The top-level statements and root allocations of a PrimFunc body."""
    body = func.body
    if isinstance(body, BlockRealize) and not body.block.iter_vars:
        root = body.block
        stmts = list(root.body.seq) if isinstance(root.body, tir.SeqStmt) else [root.body]
        return stmts, tuple(root.alloc_buffers)
    return [body], ()


def _block_names(stmts: list[Any]) -> list[str]:
    names: list[str] = []
    post_order_visit(stmts, lambda n: names.append(n.name_hint) if isinstance(n, Block) else None)
    return names


def _bind_dims(params: list[Buffer], actual: list[Buffer], sym: dict[Var, PrimExpr]) -> None:
    """Bind the variables that are plain dims of a member's parameter buffers to the dims of
    the buffers it is called with (first binding wins)."""
    for pb, ab in zip(params, actual):
        for pd, ad in zip(pb.shape, ab.shape):
            if isinstance(pd, Var) and pd not in sym:
                sym[pd] = ad


def _tensor_sinfo(sinfo: Any, what: str) -> TensorStructInfo:
    if not isinstance(sinfo, TensorStructInfo) or sinfo.shape is None:
        raise KilnError(f"FuseTIR: {what} must be a tensor of known rank, got {sinfo}")
    return sinfo


def _bindings(func: gx.Function, name: str) -> list[gx.VarBinding]:
    body = func.body
    if not isinstance(body, gx.SeqExpr):
        raise KilnError(f"FuseTIR: Primitive function {name} has no binding blocks")
    out = []
    for block in body.blocks:
        for b in block.bindings:
            v = b.value
            if not (isinstance(b, gx.VarBinding) and isinstance(v, gx.Call)
                    and isinstance(v.op, gx.Op) and v.op.name == "call_tir"):
                raise KilnError(
                    f"FuseTIR: Primitive function {name}: binding {b.var.name_hint} is not a "
                    "call_tir (run LegalizeOps before FuseOps)"
                )
            out.append(b)
    return out


def fuse_primitive(name: str, func: gx.Function, mod: IRModule) -> PrimFunc:
    """The single PrimFunc computing Primitive graph function ``func`` (see module doc)."""
    bindings = _bindings(func, name)
    result = func.body.body
    out_vars = list(result.fields) if isinstance(result, gx.Tuple) else [result]
    if not all(isinstance(v, gx.Var) for v in out_vars):
        raise KilnError(f"FuseTIR: Primitive function {name} must return variables")

    graph_sym: dict[Var, Var] = {}
    compound: list[tuple[PrimExpr, Var]] = []

    def shape_of(sinfo: TensorStructInfo, param: bool = False) -> tuple[PrimExpr, ...]:
        """The kernel's dims for a graph shape: its own copies of the graph's symbolic
        variables; a compound dim (``4*n``) of a parameter becomes a variable of its own, as
        in LegalizeOps, because a kernel binds its variables from plain parameter dims."""
        dims = []
        for d in sinfo.shape:
            if not isinstance(d, Var) and collect_vars(d):
                known = next((v for e, v in compound
                              if structural_equal(e, d, map_free_vars=False)), None)
                if known is None and param:
                    known = Var(f"d{len(compound)}", d.dtype)
                    compound.append((d, known))
                if known is not None:
                    dims.append(known)
                    continue
            for v in collect_vars(d):
                graph_sym.setdefault(v, Var(v.name, v.dtype))
            dims.append(substitute(d, graph_sym))
        return tuple(dims)

    buf_names: set[str] = set()
    value_buf: dict[gx.Var, Buffer] = {}
    params: list[Var] = []
    buffer_map: dict[Var, Buffer] = {}
    for p in func.params:
        sinfo = _tensor_sinfo(p.struct_info, f"parameter {p.name_hint} of {name}")
        buf = tir.decl_buffer(shape_of(sinfo, param=True), sinfo.dtype,
                              _unique(p.name_hint, buf_names))
        value_buf[p] = buf
        hv = Var(buf.name, "handle")
        params.append(hv)
        buffer_map[hv] = buf

    members = [(b, mod[b.value.args[0].name]) for b in bindings]
    for b, callee in members:
        if not isinstance(callee, PrimFunc):
            raise KilnError(f"FuseTIR: {b.value.args[0].name} called in {name} is not a PrimFunc")
    patterns = [pattern_of(f) for _, f in members]
    anchor = max(range(len(members)), key=lambda k: (patterns[k], k))
    round_products = patterns[anchor] <= OpPattern.COMM_REDUCE
    anchor_stmts, _ = _root_parts(members[anchor][1])
    anchor_blocks = _block_names(anchor_stmts)
    used_blocks: set[str] = {"root", *anchor_blocks}

    if len(set(out_vars)) != len(out_vars):
        raise KilnError(f"FuseTIR: Primitive function {name} returns a value twice")
    out_set = set(out_vars)
    out_bufs: dict[gx.Var, Buffer] = {}

    allocs: list[Buffer] = []
    stmts: list[Any] = []
    assumed: list[tuple[PrimExpr, str]] = []
    for k, (b, callee) in enumerate(members):
        call = b.value
        args = call.args[1].fields
        if not isinstance(b.var.struct_info, TensorStructInfo):
            raise KilnError(f"FuseTIR: {b.var.name_hint} in {name} has a tuple result")
        cparams = callee.buffers
        if len(cparams) != len(args) + 1 or len(cparams) != len(callee.params):
            raise KilnError(
                f"FuseTIR: call of {call.args[0].name} in {name} passes {len(args)} argument(s) "
                f"and 1 output; the PrimFunc has {len(callee.params)} parameter(s)"
            )
        actual: list[Buffer] = []
        for a in args:
            if not isinstance(a, gx.Var) or a not in value_buf:
                raise KilnError(
                    f"FuseTIR: argument {a} of {call.args[0].name} in {name} is not a parameter "
                    "or an earlier result of the function"
                )
            actual.append(value_buf[a])
        sinfo = _tensor_sinfo(b.var.struct_info, f"result {b.var.name_hint} of {name}")
        out_name = _unique(cparams[-1].name, buf_names)
        # bind the member's symbolic dimensions to the dims of the buffers it is called with
        sym: dict[Var, PrimExpr] = {}
        _bind_dims(cparams[:-1], actual, sym)
        if b.var in out_set:
            obuf = tir.decl_buffer(shape_of(sinfo, param=True), sinfo.dtype, out_name)
            out_bufs[b.var] = obuf
        else:
            # an intermediate's dims as the member computes them from its inputs (always in
            # the kernel's variables), else as the graph states them
            shape = tuple(substitute(d, sym) for d in cparams[-1].shape)
            if any(isinstance(d, Var) and d not in sym for d in cparams[-1].shape):
                shape = shape_of(sinfo)
            obuf = tir.decl_buffer(shape, sinfo.dtype, out_name, scope="local")
            allocs.append(obuf)
        value_buf[b.var] = obuf
        actual.append(obuf)
        _bind_dims(cparams[-1:], [obuf], sym)
        unbound = [v.name for pb in cparams for d in pb.shape for v in collect_vars(d)
                   if v not in sym]
        if unbound:
            raise KilnError(
                f"FuseTIR: {call.args[0].name} (in {name}) has symbolic dims {unbound} that "
                "are not plain dimensions of its buffers; they cannot be bound in a fused kernel"
            )
        assumed += [(substitute(cond, sym), message)
                    for cond, message in callee.attrs.get(ASSUME_ATTR, ())]
        bmap: dict[Buffer, Buffer] = dict(zip(cparams, actual))
        mstmts, mallocs = _root_parts(callee)
        for ab in mallocs:
            shape = tuple(substitute(d, sym) for d in ab.shape)
            nb = Buffer(_unique(ab.name, buf_names), shape, ab.dtype, None, ab.strides,
                        ab.elem_offset, ab.scope)
            bmap[ab] = nb
            allocs.append(nb)
        names = {}
        if k != anchor:
            for n in _block_names(mstmts):
                names[n] = _unique(n, used_blocks)
        rounded = None if b.var in out_set or not round_products else obuf
        inliner = _Inliner(bmap, sym, names, rounded)
        stmts.extend(inliner.visit(s) for s in mstmts)

    for v in out_vars:
        if v not in out_bufs:
            raise KilnError(f"FuseTIR: result {v.name_hint} of {name} is not computed by a "
                            "call_tir of the function")
        hv = Var(out_bufs[v].name, "handle")
        params.append(hv)
        buffer_map[hv] = out_bufs[v]

    root = Block((), (), (), "root", seq(*stmts), None, tuple(allocs))
    body = BlockRealize((), true_predicate(), root)
    anchor_func = members[anchor][1]
    record = FusedGroup(func, tuple((b.value.args[0].name, f) for b, f in members))
    attrs = {
        "global_symbol": name,
        "num_outputs": len(out_vars),
        "op_name": anchor_func.attrs.get("op_name"),
        "op_pattern": int(patterns[anchor]),
        "fused_ops": tuple(str(f.attrs.get("op_name") or b.value.args[0].name)
                           for b, f in members),
        "kiln.anchor_blocks": tuple(anchor_blocks),
        "kiln.fused_group": record,
    }
    if attrs["op_name"] is None:
        del attrs["op_name"]
    if assumed:
        attrs[ASSUME_ATTR] = tuple(assumed)
    return PrimFunc(tuple(params), buffer_map, body, attrs)


class _Refs(ExprVisitor):
    def __init__(self):
        self.names: set[str] = set()

    def visit_GlobalVar(self, gv: gx.GlobalVar) -> None:
        self.names.add(gv.name)


def referenced_functions(mod: IRModule) -> set[str]:
    """Names of the module functions some graph function refers to."""
    refs = _Refs()
    for f in mod.functions.values():
        if isinstance(f, gx.Function):
            refs.visit_expr(f)
    return refs.names


class _CallRewriter(ExprMutator):
    def __init__(self, bb: BlockBuilder, fused: dict[str, gx.GlobalVar]):
        super().__init__(bb)
        self.fused = fused

    def visit_Call(self, c: gx.Call) -> gx.Expr:
        c = super().visit_Call(c)
        if isinstance(c.op, gx.GlobalVar) and c.op.name in self.fused:
            sinfo = c.struct_info
            if not isinstance(sinfo, (TensorStructInfo, TupleStructInfo)):
                raise InternalError(f"FuseTIR: call of {c.op.name} has no tensor result")
            out = list(sinfo.fields) if isinstance(sinfo, TupleStructInfo) else sinfo
            return self.builder.normalize(gx.call_tir(self.fused[c.op.name], list(c.args), out))
        return c


@module_pass(opt_level=2)
class FuseTIR:
    """Replace each Primitive function by one PrimFunc with its members' loop nests inlined."""

    def transform_module(self, mod: IRModule, ctx: PassContext) -> IRModule:
        prims = {name: f for name, f in mod.items()
                 if isinstance(f, gx.Function) and f.attrs.get("Primitive")}
        if not prims:
            return mod.copy()
        members: set[str] = set()
        fused_funcs: dict[str, PrimFunc] = {}
        for name, f in prims.items():
            fused_funcs[name] = fuse_primitive(name, f, mod)
            members.update(n for n, _ in fused_funcs[name].attrs["kiln.fused_group"].members)
        new = mod.copy()
        for name in prims:
            del new[name]
        bb = BlockBuilder(new)
        gvars = {name: bb.add_func(pf, name) for name, pf in fused_funcs.items()}
        rewritten = bb.get()
        for name, f in rewritten.items():
            if isinstance(f, gx.Function):
                nf = _CallRewriter(bb, gvars).visit(f)
                if nf is not f:
                    bb.update_func(name, nf)
        out = bb.get()
        live = referenced_functions(out)
        for name in members:
            if name in out and name not in live and isinstance(out[name], PrimFunc):
                del out[name]
        for gv in gvars.values():
            if gv.name not in live and gv.name in out:
                del out[gv.name]
        return out
