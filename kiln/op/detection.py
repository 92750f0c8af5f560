"""Object detection: ``non_max_suppression`` (the greedy selection of ONNX NonMaxSuppression).

``non_max_suppression(boxes, scores, max_output, iou_threshold, score_threshold,
center_point_box=False, use_score_threshold=True)``:

- ``boxes`` (B, N, 4): corners ``[y1, x1, y2, x2]`` (either diagonal pair), or with
  ``center_point_box`` ``[x_center, y_center, width, height]``; ``scores`` (B, C, N);
- ``max_output`` (int64), ``iou_threshold``, ``score_threshold`` (of the boxes' dtype): 0-d
  tensors read by the kernel at run time, so a model whose thresholds are graph inputs is not
  specialized to their values.

The result (B, C, N) int64 holds, per (batch, class) line, the indices of the selected boxes in
the order they were selected, then ``-1``. Boxes are visited best first -- the higher score,
then the lower box index (ONNX's order; NaN scores last); a box is a candidate when its score
is ``> score_threshold`` (when ``use_score_threshold``), and is selected while fewer than
``max_output`` boxes are selected and its IoU with every box selected before it is
``<= iou_threshold``. A pair whose intersection, either area or the union is not positive never
suppresses (zero-area boxes are always kept), exactly as ``onnx.reference`` decides. The ONNX
converter turns this fixed-size result into the (num_selected, 3) output by counting the
non-negative entries (the count binds the run-time length) and filling the rows with
``dynamic_nonzero``: the entries are packed at the front of each line, so row-major nonzero
order is ONNX's (batch, class, selection) order.

Why the kernel is written in TIR (``legalize``) instead of ``te.compute``: the selection is
greedy -- whether a box is kept depends on which boxes before it were kept -- so no output
element can be described independently of the others. As for the scans (``kiln/op/scan.py``),
there is one block per (batch, class) line, spatial over B and C (the schedule fuses and
parallelizes them), holding the serial selection with a few ``local`` scalars.

Why the kernel orders the boxes itself with a binary heap instead of taking a ``topk`` of all
N scores: ``topk`` inserts into sorted slots, O(N*k), which is O(N²) for k = N (80 classes of
1000 boxes: ~0.5 s, against ~4 ms for onnxruntime). A heap of the candidates is built in O(N)
and popped only until ``max_output`` boxes are selected, O(N + popped * log N). It needs no
scratch memory: the heap lives at the back of the output line, reversed, while the selected
boxes are packed at the front; at most as many boxes are selected as were popped, so the two
never overlap. Each popped box is compared with the boxes selected so far: O(popped *
selected) IoUs, computed in float32 (float64 for float64 boxes; float16 boxes are widened).

No gradient: the result is a set of integer indices.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from .. import tir
from ..graph import expr as gx
from ..ir.dtype import DataType, as_dtype
from ..ir.errors import KilnError, StructInfoError
from ..tir import expr as tx
from ..tir.expr import PrimExpr
from .common import arg_shape, const_int, dims_equal, kernel_dims, tensor_arg, tensor_sinfo
from .registry import NON_DIFFERENTIABLE, MixedPrecision, OpPattern, get_op_def, register_op

__all__ = ["non_max_suppression"]

INDEX = DataType("int64")
_OP = "non_max_suppression"


@dataclass(frozen=True)
class NMSAttrs:
    """``center_point_box``: boxes are ``[xc, yc, w, h]`` (else corners ``[y1, x1, y2, x2]``);
    ``use_score_threshold``: filter candidates by ``score > score_threshold`` (ONNX applies no
    filter when the input is absent)."""

    center_point_box: bool = False
    use_score_threshold: bool = True

    def __post_init__(self):
        for name in ("center_point_box", "use_score_threshold"):
            if not isinstance(getattr(self, name), bool):
                raise KilnError(f"{_OP}: {name} must be a bool, got {getattr(self, name)!r}")


def _infer(call: Any) -> Any:
    boxes = tensor_arg(call, 0, _OP, "boxes")
    scores = tensor_arg(call, 1, _OP, "scores")
    dt = as_dtype(boxes.dtype)
    if not dt.is_float or dt.lanes != 1 or scores.dtype != boxes.dtype:
        raise StructInfoError(f"{_OP}: boxes and scores must be float tensors of one dtype, "
                              f"got {boxes} and {scores}")
    for i, (arg, want) in enumerate((("max_output", INDEX), ("iou_threshold", dt),
                                     ("score_threshold", dt))):
        s = tensor_arg(call, 2 + i, _OP, arg)
        if s.dtype != want or s.ndim != 0:
            raise StructInfoError(f"{_OP}: {arg} must be a 0-d {want} tensor, got {s}")
    bshape, sshape = arg_shape(boxes), arg_shape(scores)
    if bshape is None or sshape is None:
        raise StructInfoError(f"{_OP}: boxes and scores need known shapes, got {boxes} and "
                              f"{scores}")
    if len(bshape) != 3 or const_int(bshape[2]) != 4 or len(sshape) != 3 or not (
            dims_equal(bshape[0], sshape[0]) and dims_equal(bshape[1], sshape[2])):
        raise StructInfoError(f"{_OP}: boxes must be (B, N, 4) and scores (B, C, N), got "
                              f"{boxes} and {scores}")
    return tensor_sinfo(sshape, INDEX)


def _suppresses(a: Sequence[PrimExpr], b: Sequence[PrimExpr], center: bool,
                threshold: PrimExpr) -> PrimExpr:
    """Whether box ``b`` (4 coordinates) suppresses box ``a``: ``onnx.reference``'s test."""

    def extent(box: Sequence[PrimExpr]) -> tuple[PrimExpr, PrimExpr, PrimExpr, PrimExpr]:
        if center:  # [xc, yc, w, h]
            two = tx.const(box[2].dtype, 2)
            hw, hh = box[2] / two, box[3] / two
            return box[0] - hw, box[0] + hw, box[1] - hh, box[1] + hh
        return (tx.min(box[1], box[3]), tx.max(box[1], box[3]),
                tx.min(box[0], box[2]), tx.max(box[0], box[2]))

    ax0, ax1, ay0, ay1 = extent(a)
    bx0, bx1, by0, by1 = extent(b)
    ix0, ix1 = tx.max(ax0, bx0), tx.min(ax1, bx1)
    iy0, iy1 = tx.max(ay0, by0), tx.min(ay1, by1)
    zero = tx.const(ax0.dtype, 0)
    inter = (ix1 - ix0) * (iy1 - iy0)
    area_a, area_b = (ax1 - ax0) * (ay1 - ay0), (bx1 - bx0) * (by1 - by0)
    union = area_a + area_b - inter
    return tx.all_of([ix1 > ix0, iy1 > iy0, inter > zero, area_a > zero, area_b > zero,
                      union > zero, inter / union > threshold])


def _better(s_a: PrimExpr, a: PrimExpr, s_b: PrimExpr, b: PrimExpr) -> PrimExpr:
    """Box ``a`` (score ``s_a``) goes before box ``b``: the higher score, then the lower index
    (ONNX's order); NaN scores go last."""
    num_a = tx.logical_not(tx.isnan(s_a))
    ordered = tx.logical_or(tx.gt(s_a, s_b), tx.logical_and(tx.eq(s_a, s_b), tx.lt(a, b)))
    return tx.select(tx.isnan(s_b), tx.logical_or(num_a, tx.lt(a, b)),
                     tx.logical_and(num_a, ordered))


def nms_prim_func(batch: Any, classes: Any, n: Any, dtype: Any, center_point_box: bool,
                  use_score_threshold: bool, name: str = _OP) -> tir.PrimFunc:
    """The PrimFunc ``(boxes, scores, max_output, iou, score_thr, selected)`` (module doc).
    Symbolic sizes must be plain ``tir.Var``\\ s or constants."""
    dt = as_dtype(dtype)
    acc = DataType("float64") if dt.bits == 64 else DataType("float32")
    i32 = DataType("int32")
    boxes = tir.decl_buffer((batch, n, 4), dt, "boxes")
    scores = tir.decl_buffer((batch, classes, n), dt, "scores")
    max_out = tir.decl_buffer((), INDEX, "max_output")
    iou = tir.decl_buffer((), dt, "iou_threshold")
    score_thr = tir.decl_buffer((), dt, "score_threshold")
    sel = tir.decl_buffer((batch, classes, n), INDEX, "selected")
    # count: selected boxes; size: boxes in the heap; cur, depth: sift-down state; keep: flag
    state = {v: tir.decl_buffer((1,), INDEX, v, scope="local")
             for v in ("count", "size", "cur", "depth")}
    keep = tir.decl_buffer((1,), i32, "keep", scope="local")

    zero, one, two = tx.const(INDEX, 0), tx.const(INDEX, 1), tx.const(INDEX, 2)
    lb, lc = tir.Var("b", INDEX), tir.Var("c", INDEX)
    vb, vc = tir.Var("vb", INDEX), tir.Var("vc", INDEX)
    iter_vars = (tx.IterVar(tx.Range(zero, batch), vb, tx.IterType.DATA_PAR),
                 tx.IterVar(tx.Range(zero, classes), vc, tx.IterType.DATA_PAR))

    def get(v: str) -> PrimExpr:
        return state[v][zero]

    def put(v: str, value: PrimExpr) -> tir.Stmt:
        return tir.BufferStore(state[v], value, (zero,))

    def loop(var: str, extent: PrimExpr, body: Any) -> tir.Stmt:
        """``for var in range(extent)``, the extent read once before the loop (the body may
        change the state it reads)."""
        v, end = tir.Var(var, INDEX), tir.Var(f"{var}_end", INDEX)
        return tir.LetStmt(end, extent, tir.For(v, zero, end, tir.ForKind.SERIAL, body(v)))

    # the heap of candidates lives at the back of the output line, reversed: heap slot p is
    # selected[.., n-1-p]; with ``count`` selected boxes packed at the front and count <= the
    # number of boxes popped, the two never overlap
    def heap(p: PrimExpr) -> PrimExpr:
        return sel.load((vb, vc, n - one - p))

    def set_heap(p: PrimExpr, value: PrimExpr) -> tir.Stmt:
        return tir.BufferStore(sel, value, (vb, vc, n - one - p))

    def before(p: PrimExpr, q: PrimExpr) -> PrimExpr:
        a, b = heap(p), heap(q)
        return _better(scores.load((vb, vc, a)), a, scores.load((vb, vc, b)), b)

    def sift_down(start: PrimExpr) -> tir.Stmt:
        """Move heap slot ``start`` down to its place (``depth`` steps at most)."""
        cur, left, best, tmp = (tir.Var(v, INDEX) for v in ("at", "left", "best", "tmp"))
        swap = tir.LetStmt(tmp, heap(cur), tir.seq(
            set_heap(cur, heap(best)), set_heap(best, tmp), put("cur", best)))
        step = tir.LetStmt(cur, get("cur"), tir.LetStmt(left, two * cur + one, tir.IfThenElse(
            tx.lt(left, get("size")), tir.LetStmt(best, tx.select(tx.logical_and(
                tx.lt(left + one, get("size")), before(left + one, left)), left + one, left),
                tir.IfThenElse(before(best, cur), swap, put("cur", get("size")))))))
        return tir.seq(put("cur", start), loop("level", get("depth"), lambda _: step))

    def box(index: PrimExpr) -> list[PrimExpr]:
        return [tx.cast(acc, boxes.load((vb, index, tx.const(INDEX, q)))) for q in range(4)]

    cand = tir.Var("cand", INDEX)

    def check(t: tx.Var) -> tir.Stmt:
        """Clear ``keep`` when selected box ``t`` suppresses the candidate."""
        suppressed = _suppresses(box(cand), box(sel.load((vb, vc, t))), center_point_box,
                                 tx.cast(acc, iou.load(())))
        return tir.IfThenElse(tx.logical_and(tx.ne(keep[zero], tx.const(i32, 0)), suppressed),
                              tir.BufferStore(keep, tx.const(i32, 0), (zero,)))

    # pop the best candidate; select it unless a selected box suppresses it
    select = tir.seq(tir.BufferStore(sel, cand, (vb, vc, get("count"))),
                     put("count", get("count") + one))
    pop = tir.LetStmt(cand, heap(zero), tir.seq(
        set_heap(zero, heap(get("size") - one)),
        put("size", get("size") - one),
        sift_down(zero),
        tir.BufferStore(keep, tx.const(i32, 1), (zero,)),
        loop("t", get("count"), check),
        tir.IfThenElse(tx.ne(keep[zero], tx.const(i32, 0)), select),
    ))

    def push(j: tx.Var) -> tir.Stmt:
        """Put box ``j`` in the heap (unsorted yet) when it is a candidate."""
        add = tir.seq(set_heap(get("size"), j), put("size", get("size") + one))
        if not use_score_threshold:
            return add
        return tir.IfThenElse(tx.gt(scores.load((vb, vc, j)), score_thr.load(())), add)

    # depth = bit length of the heap size (the most sift-down steps)
    halve = tir.IfThenElse(tx.gt(get("cur"), zero), tir.seq(
        put("cur", tx.floordiv(get("cur"), two)), put("depth", get("depth") + one)))
    body = tir.seq(
        put("count", zero), put("size", zero),
        loop("j", n, push),
        put("cur", get("size")), put("depth", zero),
        loop("bit", tx.const(INDEX, 64), lambda _: halve),
        loop("h", tx.floordiv(get("size"), two),
             lambda h: sift_down(tx.floordiv(get("size"), two) - one - h)),
        loop("i", get("size"), lambda _: tir.IfThenElse(
            tx.lt(get("count"), max_out.load(())), pop)),
        loop("k", n - get("count"), lambda k: tir.BufferStore(
            sel, tx.const(INDEX, -1), (vb, vc, get("count") + k))),
    )

    def line(buf: tir.Buffer) -> tir.BufferRegion:
        return tir.BufferRegion(buf, (tx.Range(vb, one), tx.Range(vc, one), tx.Range(zero, n)))

    reads = (tir.BufferRegion(boxes, (tx.Range(vb, one), tx.Range(zero, n),
                                      tx.Range(zero, tx.const(INDEX, 4)))),
             line(scores), max_out.full_region(), iou.full_region(), score_thr.full_region(),
             line(sel))
    block = tir.Block(iter_vars, reads, (line(sel),), name, body,
                      alloc_buffers=(*state.values(), keep))
    stmt: tir.Stmt = tir.BlockRealize((lb, lc), tir.true_predicate(), block)
    stmt = tir.For(lb, zero, batch, tir.ForKind.SERIAL,
                   tir.For(lc, zero, classes, tir.ForKind.SERIAL, stmt))
    root = tir.Block((), (), (), "root", stmt)
    bufs = (boxes, scores, max_out, iou, score_thr, sel)
    params = tuple(tir.Var(b.name, "handle") for b in bufs)
    return tir.PrimFunc(params, dict(zip(params, bufs)),
                        tir.BlockRealize((), tir.true_predicate(), root),
                        {"global_symbol": name, "num_outputs": 1})


def _legalize(bb: Any, call: Any) -> Any:
    boxes, scores = call.args[0].struct_info, call.args[1].struct_info
    batch, n, classes = kernel_dims([boxes.shape[0], boxes.shape[1], scores.shape[1]])
    func = nms_prim_func(batch, classes, n, boxes.dtype, call.attrs.center_point_box,
                         call.attrs.use_score_threshold)
    func = func.with_attr("op_name", _OP).with_attr("op_pattern",
                                                    int(get_op_def(_OP).pattern))
    return gx.call_tir(bb.add_func(func, _OP), list(call.args), call.struct_info)


non_max_suppression = register_op(
    _OP,
    inputs=("boxes", "scores", "max_output", "iou_threshold", "score_threshold"),
    attrs=NMSAttrs,
    infer=_infer,
    pattern=OpPattern.OPAQUE,
    legalize=_legalize,
    mixed_precision=MixedPrecision.NEVER,
    gradient=NON_DIFFERENTIABLE,
    doc="Greedy non-maximum suppression per (batch, class) line: the selected box indices in "
    "selection order, -1 padded (ONNX NonMaxSuppression before its count and fill).",
)
