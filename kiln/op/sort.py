"""Selection: ``topk`` (ONNX TopK).

``topk(x, k, axis=-1, largest=True)`` returns ``(values, indices)``: the ``k`` largest (or
smallest) elements along ``axis``, sorted best first, and their int64 positions. Equal values
keep their input order (the lower index first), as ONNX requires. ``k`` is an int or a
symbolic dimension (a TopK whose ``k`` is only known at run time: the ONNX importer binds it
with a host shape function, which also checks ``0 <= k <= n``); a static ``k`` larger than the
axis is an error at inference. NaNs never compare better than a number, so unlike numpy's sort
they are only selected when fewer than ``k`` numbers remain.

Why the kernel is written in TIR (``legalize``) instead of ``te.compute``: the natural
algorithm is a sequential insertion into a sorted list of ``k`` slots, O(n*k) per line (a
tensor expression could only rank every element against every other, O(n²) -- and n is the
long axis while k is usually small). One block per line (spatial over the other axes, so the
schedule fuses and parallelizes them, as for the scans in ``kiln/op/scan.py``), holding:

- the ``k`` slots are the output line itself; an index of -1 marks an empty slot;
- for each element ``j`` in order, slots are visited from the last to the first: a slot the
  element beats is shifted down one when the element also beats the slot above, else the
  element is placed there. Because the slots are sorted, this is an insertion in O(k), and
  "beats" being strict keeps the earlier of two equal elements first;
- an element that does not beat the last slot is skipped in O(1): on typical data most
  elements never enter the top k, so the work is close to O(n) per line (1000x1000 float32,
  k=10: 3x faster than without the skip, slightly faster than numpy's argpartition plus a
  sort of the k, on a busy 2-core machine). A worst case (ascending input with largest=True)
  still costs O(n*k).

Gradient: the values' adjoint is scattered back to the positions ``indices`` selected (a
``scatter_elements`` add into zeros; positions within a line are distinct); the indices are
integers and carry none. Ties select one of the equal elements, so, as for a sort, the
gradient goes to the selected one only.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from .. import tir
from ..graph import expr as gx
from ..graph import shape_utils
from ..graph.expr import Tuple, TupleGetItem
from ..graph.struct_info import TupleStructInfo
from ..ir.dtype import DataType, as_dtype
from ..ir.errors import KilnError, StructInfoError
from ..tir import expr as tx
from ..tir.expr import PrimExpr
from .common import arg_ndim, arg_shape, as_dim, const_int, kernel_dims, tensor_sinfo
from .grad import zeros
from .index import scatter_elements
from .registry import MixedPrecision, OpPattern, get_op_def, register_op

__all__ = ["topk"]

INDEX = DataType("int64")


@dataclass(frozen=True)
class TopKAttrs:
    """``k`` (int >= 0 or an int64 PrimExpr), ``axis`` (int), ``largest`` (bool: the largest
    elements, else the smallest)."""

    k: Any
    axis: int = -1
    largest: bool = True

    def __post_init__(self):
        k = self.k
        if isinstance(k, bool) or not isinstance(k, (int, PrimExpr)) or (
                isinstance(k, int) and k < 0):
            raise KilnError(f"topk: k must be a non-negative int or a PrimExpr, got {k!r}")
        if isinstance(self.axis, bool) or not isinstance(self.axis, int):
            raise KilnError(f"topk: axis must be an int, got {self.axis!r}")
        if not isinstance(self.largest, bool):
            raise KilnError(f"topk: largest must be a bool, got {self.largest!r}")


def _infer(call: Any) -> Any:
    x = shape_utils.tensor_sinfo(call, 0)
    attrs = call.attrs
    dtype = as_dtype(x.dtype)
    if dtype.is_handle or dtype.is_bool or dtype.lanes != 1:
        raise StructInfoError(f"topk: x must be a tensor of numbers, got dtype {dtype}")
    ndim = arg_ndim(x)
    if ndim == 0:
        raise StructInfoError("topk: x must have rank >= 1")
    if ndim < 0:
        return TupleStructInfo((tensor_sinfo(None, dtype), tensor_sinfo(None, INDEX)))
    axis = shape_utils.normalize_axis(attrs.axis, ndim, "topk")
    k = as_dim(attrs.k)
    shape = arg_shape(x)
    if shape is None:
        return TupleStructInfo((tensor_sinfo(None, dtype, ndim=ndim),
                                tensor_sinfo(None, INDEX, ndim=ndim)))
    n = const_int(shape[axis])
    if n is not None and const_int(k) is not None and const_int(k) > n:
        raise StructInfoError(f"topk: k={const_int(k)} exceeds the length {n} of axis {axis}")
    out = tuple(k if d == axis else s for d, s in enumerate(shape))
    return TupleStructInfo((tensor_sinfo(out, dtype), tensor_sinfo(out, INDEX)))


def topk_prim_func(shape: Sequence[Any], dtype: Any, k: Any, axis: int, largest: bool,
                   name: str = "topk") -> tir.PrimFunc:
    """The PrimFunc ``(X, V, I)`` selecting the top ``k`` of ``X`` along ``axis`` (module doc).

    Symbolic dimensions (and ``k``) must be plain ``tir.Var``\\ s or constants.
    """
    shape = tuple(as_dim(d) for d in shape)
    axis = shape_utils.normalize_axis(axis, len(shape), name)
    k = as_dim(k)
    out_shape = tuple(k if d == axis else s for d, s in enumerate(shape))
    x = tir.decl_buffer(shape, dtype, "X")
    vals = tir.decl_buffer(out_shape, dtype, "V")
    idx = tir.decl_buffer(out_shape, INDEX, "I")
    spatial = [d for d in range(len(shape)) if d != axis]
    loop_vars = [tir.Var(f"i{d}", INDEX) for d in spatial]
    iter_vars = [tx.IterVar(tx.Range(tx.const(INDEX, 0), shape[d]), tir.Var(f"v{d}", INDEX),
                            tx.IterType.DATA_PAR) for d in spatial]
    zero, one = tx.const(INDEX, 0), tx.const(INDEX, 1)

    def at(p: PrimExpr) -> tuple[PrimExpr, ...]:
        it = iter(iv.var for iv in iter_vars)
        return tuple(p if d == axis else next(it) for d in range(len(shape)))

    def region(buf: tir.Buffer, extent: PrimExpr) -> tir.BufferRegion:
        it = iter(iv.var for iv in iter_vars)
        return tir.BufferRegion(buf, tuple(
            tx.Range(zero, extent) if d == axis else tx.Range(next(it), one)
            for d in range(len(shape))))

    j, t, c = (tir.Var(n, INDEX) for n in ("j", "t", "c"))
    value = x.load(at(j))
    q = k - one - t
    above = tx.max(q - one, zero)  # read only when q > 0; clamped so it is always in bounds
    last = tx.max(k - one, zero)  # the slot an element must beat to enter (k > 0)

    def beats(slot: PrimExpr) -> PrimExpr:
        better = tx.gt(value, vals.load(at(slot))) if largest else tx.lt(value,
                                                                        vals.load(at(slot)))
        return tx.logical_or(tx.lt(idx.load(at(slot)), zero), better)

    shift = tir.seq(tir.BufferStore(vals, vals.load(at(above)), at(q)),
                    tir.BufferStore(idx, idx.load(at(above)), at(q)))
    place = tir.seq(tir.BufferStore(vals, value, at(q)), tir.BufferStore(idx, j, at(q)))
    insert = tir.IfThenElse(beats(q), tir.IfThenElse(
        tx.logical_and(tx.gt(q, zero), beats(above)), shift, place))
    body = tir.seq(
        tir.For(c, zero, k, tir.ForKind.SERIAL,
                tir.BufferStore(idx, tx.const(INDEX, -1), at(c))),
        tir.For(j, zero, shape[axis], tir.ForKind.SERIAL, tir.IfThenElse(
            tx.logical_and(tx.gt(k, zero), beats(last)),  # most elements miss the last slot
            tir.For(t, zero, k, tir.ForKind.SERIAL, insert))),
    )
    block = tir.Block(tuple(iter_vars),
                      (region(x, shape[axis]), region(vals, k), region(idx, k)),
                      (region(vals, k), region(idx, k)), name, body)
    stmt: tir.Stmt = tir.BlockRealize(tuple(loop_vars), tir.true_predicate(), block)
    for lv, iv in reversed(list(zip(loop_vars, iter_vars))):
        stmt = tir.For(lv, iv.dom.min, iv.dom.extent, tir.ForKind.SERIAL, stmt)
    root = tir.Block((), (), (), "root", stmt)
    params = (tir.Var("X", "handle"), tir.Var("V", "handle"), tir.Var("I", "handle"))
    return tir.PrimFunc(params, {params[0]: x, params[1]: vals, params[2]: idx},
                        tir.BlockRealize((), tir.true_predicate(), root),
                        {"global_symbol": name, "num_outputs": 2})


def _legalize(bb: Any, call: Any) -> Any:
    x = call.args[0].struct_info
    if getattr(x, "shape", None) is None:
        raise StructInfoError(f"LegalizeOps: topk needs an input of known shape, got {x}")
    attrs = call.attrs
    dims = kernel_dims([*x.shape, as_dim(attrs.k)])
    func = topk_prim_func(dims[:-1], x.dtype, dims[-1], attrs.axis, attrs.largest)
    func = func.with_attr("op_name", "topk").with_attr("op_pattern",
                                                       int(get_op_def("topk").pattern))
    gvar = bb.add_func(func, "topk")
    return gx.call_tir(gvar, [call.args[0]], list(call.struct_info.fields))


def _gradient(call: Any, output_grad: Any, bb: Any) -> list[Any]:
    """The values' adjoint scattered to the selected positions of x (zeros elsewhere)."""
    x = call.args[0]
    if not as_dtype(x.struct_info.dtype).is_float:
        return [None]
    g_values = (output_grad.fields[0] if isinstance(output_grad, Tuple)
                else TupleGetItem(output_grad, 0))
    return [scatter_elements(zeros(x.struct_info, "topk gradient"), TupleGetItem(call, 1),
                             g_values, call.attrs.axis, "add")]


topk = register_op(
    "topk",
    inputs=("x",),
    attrs=TopKAttrs,
    infer=_infer,
    pattern=OpPattern.OPAQUE,
    legalize=_legalize,
    mixed_precision=MixedPrecision.FOLLOW,
    gradient=_gradient,
    doc="The k largest (or smallest) elements along ``axis``, sorted, and their int64 indices.",
)
