"""Tree ensembles: ``tree_ensemble``, the evaluation kernel of ONNX ``ai.onnx.ml`` TreeEnsemble.

The trees are compile-time constants (ONNX attributes); the converter flattens them into tables
that are inputs of the op:

- ``nodes`` (int64 ``(K, 5)``): per interior node its feature (clamped into range), comparison
  mode, whether a missing value (NaN) takes the true branch, and its true/false successors. A
  successor ``>= 0`` is an interior node; ``< 0`` is leaf ``-code - 1`` (every table read is
  clamped into range, so a bad code gives a wrong leaf, never a read outside the tables);
- ``splits`` (float64 ``(K,)``): the thresholds;
- ``roots`` (int64 ``(T,)``): each tree's first node, in the same code;
- ``weights``/``mask`` (``(L, n_targets)``): what each leaf adds to each target (``mask`` 1 where
  the leaf contributes to the target).

Comparison modes are ``LEQ, LT, GTE, GT, EQ, NEQ`` (0-5, the ONNX numbering); set membership
(mode 6) is rewritten by the converter into a chain of EQ nodes, which is exact. A value is
compared in float64, so a float32 feature meets a float64 threshold without rounding it. A
node takes its true branch when the comparison holds or the value is NaN and the node's
missing flag is set (the ONNX reference and onnxruntime: NaN compares false except under NEQ).

The kernel (``legalize``: block TIR, like the scans) is one block per row: for every tree, a
serial walk of at most ``depth`` steps from the root (a step binds the node, its feature value
and threshold with lets and moves to a successor; a leaf ends the walk), then the reached
leaf's weights are combined into a per-row accumulator of the targets: ``SUM``, ``AVERAGE``
(each leaf's share ``w / T`` summed, as the reference does), ``MIN``/``MAX`` (a target no tree
reaches gets the dtype's largest/lowest finite value, as in the reference); accumulation is in
float64, rounded once. Rows are independent and run in parallel; the work is O(rows * trees *
depth) comparisons. (A tensor expression cannot state the walk: its next node depends on the
previous comparison.)
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np

from .. import tir
from ..graph import expr as gx
from ..ir.dtype import as_dtype
from ..ir.errors import KilnError, StructInfoError
from ..tir import expr as tx
from .common import INDEX_DTYPE, arg_ndim, arg_shape, const_int, tensor_arg, tensor_sinfo
from .registry import NON_DIFFERENTIABLE, MixedPrecision, OpPattern, register_op

__all__ = ["tree_ensemble"]

AGGREGATES = ("AVERAGE", "SUM", "MIN", "MAX")  # ONNX aggregate_function 0..3
MODES = ("LEQ", "LT", "GTE", "GT", "EQ", "NEQ")  # ONNX nodes_modes 0..5


@dataclass(frozen=True)
class TreeEnsembleAttrs:
    """``depth``: the number of interior levels of the deepest tree; ``aggregate``: how the
    trees' leaves combine per target; ``mode``: the comparison every node uses when they all
    use the same one (then the kernel has no per-node mode switch), else None."""

    depth: int = 0
    aggregate: str = "SUM"
    mode: int | None = None

    def __post_init__(self):
        if isinstance(self.depth, bool) or not isinstance(self.depth, int) or self.depth < 0:
            raise KilnError(f"tree_ensemble: depth must be a non-negative int, got {self.depth!r}")
        if self.aggregate not in AGGREGATES:
            raise KilnError(f"tree_ensemble: aggregate must be one of {AGGREGATES}, got "
                            f"{self.aggregate!r}")
        if self.mode is not None and self.mode not in range(len(MODES)):
            raise KilnError(f"tree_ensemble: mode must be None or 0..5, got {self.mode!r}")


_ARGS = (("x", 2, "float"), ("nodes", 2, "int"), ("splits", 1, "float"), ("roots", 1, "int"),
         ("weights", 2, "float"), ("mask", 2, "int"))


def _infer(call: Any) -> Any:
    sinfos = []
    for k, (name, ndim, kind) in enumerate(_ARGS):
        s = tensor_arg(call, k, "tree_ensemble", name)
        dt = as_dtype(s.dtype)
        if (kind == "float" and not dt.is_float) or (kind == "int" and not dt.is_integer):
            raise StructInfoError(f"tree_ensemble: {name} must be a {kind} tensor, got {dt}")
        nd = arg_ndim(s)
        if nd >= 0 and nd != ndim:
            raise StructInfoError(f"tree_ensemble: {name} must have rank {ndim}, got {nd}")
        sinfos.append(s)
    xs, ws = arg_shape(sinfos[0]), arg_shape(sinfos[4])
    if xs is None or ws is None:
        return tensor_sinfo(None, sinfos[0].dtype, ndim=2)
    return tensor_sinfo((xs[0], ws[1]), sinfos[0].dtype)


def _compare(mode: int, v: Any, s: Any) -> Any:
    return (tx.le, tx.lt, tx.ge, tx.gt, tx.eq, tx.ne)[mode](v, s)


def _dims(shape: Any) -> list[Any]:
    """Kernel dims: a compound symbolic dimension (``2*n``) becomes a fresh variable (a kernel
    binds its sizes from plain variables of its arguments' shapes)."""
    return [d if const_int(d) is not None or isinstance(d, tir.Var)
            else tir.Var(f"d{k}", INDEX_DTYPE) for k, d in enumerate(shape)]


def tree_prim_func(shapes: list[Any], dtypes: list[str], attrs: TreeEnsembleAttrs,
                   name: str = "tree_ensemble") -> tir.PrimFunc:
    """The PrimFunc ``(X, NODES, SPLITS, ROOTS, W, MASK, OUT)`` (see the module doc)."""
    names = ("X", "NODES", "SPLITS", "ROOTS", "W", "MASK")
    bufs = [tir.decl_buffer(tuple(sh), dt, nm) for sh, dt, nm in zip(shapes, dtypes, names)]
    x, nodes, splits, roots, w, mask = bufs
    (rows, n_features), (n_nodes, _), (n_trees,), (n_leaves, n_targets) = (
        x.shape, nodes.shape, roots.shape, w.shape)
    targets = const_int(n_targets)
    if targets is None:
        raise KilnError(f"tree_ensemble: the leaf table needs a static width, got {n_targets}")
    out_dt = as_dtype(dtypes[0])
    out = tir.decl_buffer((rows, n_targets), out_dt, "OUT")
    f64, zero, one = "float64", tx.const(INDEX_DTYPE, 0), tx.const(INDEX_DTYPE, 1)
    acc = tir.decl_buffer((targets,), f64, "acc", scope="local")
    code = tir.decl_buffer((1,), INDEX_DTYPE, "code", scope="local")
    rv, r = tir.Var("i", INDEX_DTYPE), tir.Var("r", INDEX_DTYPE)
    t, d, j, j0, j1 = (tir.Var(v, INDEX_DTYPE) for v in ("t", "d", "j", "j0", "j1"))
    n, v, sp = tir.Var("n", INDEX_DTYPE), tir.Var("v", f64), tir.Var("s", f64)
    leaf = tir.Var("leaf", INDEX_DTYPE)

    def field(k: int) -> Any:
        return tx.cast(INDEX_DTYPE, nodes[n, tx.const(INDEX_DTYPE, k)])

    if attrs.mode is not None:
        cmp = _compare(attrs.mode, v, sp)
    else:
        cmp = _compare(len(MODES) - 1, v, sp)
        for k in range(len(MODES) - 2, -1, -1):
            cmp = tx.select(tx.eq(field(1), k), _compare(k, v, sp), cmp)
    cond = tx.logical_or(cmp, tx.logical_and(tx.ne(field(2), 0), tx.isnan(v)))
    feat = tx.min(tx.max(field(0), zero), n_features - one)  # memory-safe
    descend = tir.LetStmt(n, tx.min(code[zero], n_nodes - one), tir.LetStmt(
        v, tx.cast(f64, x[r, feat]), tir.LetStmt(
            sp, tx.cast(f64, splits[n]),
            tir.BufferStore(code, tx.select(cond, field(3), field(4)), (zero,)))))
    agg = attrs.aggregate
    absent = {"SUM": 0.0, "AVERAGE": 0.0, "MIN": float(np.finfo(str(out_dt)).max),
              "MAX": float(np.finfo(str(out_dt)).min)}[agg]
    value = tx.cast(f64, w[leaf, j])
    if agg == "AVERAGE":
        value = value / tx.cast(f64, n_trees)
    combine = {"SUM": tx.add, "AVERAGE": tx.add, "MIN": tx.min, "MAX": tx.max}[agg]
    add_leaf = tir.IfThenElse(tx.ne(tx.cast(INDEX_DTYPE, mask[leaf, j]), 0),
                              tir.BufferStore(acc, combine(acc[j], value), (j,)))
    walk = tir.seq(
        tir.BufferStore(code, tx.cast(INDEX_DTYPE, roots[t]), (zero,)),
        tir.For(d, zero, tx.const(INDEX_DTYPE, attrs.depth), tir.ForKind.SERIAL,
                tir.IfThenElse(code[zero] >= 0, descend)),
        tir.LetStmt(leaf, tx.min(tx.max(-code[zero] - one, zero), n_leaves - one),
                    tir.For(j, zero, n_targets, tir.ForKind.SERIAL, add_leaf)))
    body = tir.seq(
        tir.For(j0, zero, n_targets, tir.ForKind.SERIAL,
                tir.BufferStore(acc, tx.const(f64, absent), (j0,))),
        tir.For(t, zero, n_trees, tir.ForKind.SERIAL, walk),
        tir.For(j1, zero, n_targets, tir.ForKind.SERIAL,
                tir.BufferStore(out, tx.cast(out_dt, acc[j1]), (r, j1))))
    row = tir.BufferRegion(x, (tx.Range(r, one), tx.Range(zero, n_features)))
    reads = (row, *(b.full_region() for b in bufs[1:]))
    writes = (tir.BufferRegion(out, (tx.Range(r, one), tx.Range(zero, n_targets))),)
    iv = tx.IterVar(tx.Range(zero, rows), r, tx.IterType.DATA_PAR)
    block = tir.Block((iv,), reads, writes, name, body, alloc_buffers=(acc, code))
    stmt = tir.For(rv, zero, rows, tir.ForKind.SERIAL,
                   tir.BlockRealize((rv,), tir.true_predicate(), block))
    root = tir.Block((), (), (), "root", stmt)
    params = tuple(tir.Var(b.name, "handle") for b in (*bufs, out))
    steps = (const_int(n_trees) or 1) * (attrs.depth + 1)
    return tir.PrimFunc(params, dict(zip(params, (*bufs, out))),
                        tir.BlockRealize((), tir.true_predicate(), root),
                        {"global_symbol": name, "num_outputs": 1, "tree_steps": steps})


def _legalize(bb: Any, call: Any) -> Any:
    sinfos = [a.struct_info for a in call.args]
    if any(getattr(si, "shape", None) is None for si in sinfos):
        raise StructInfoError("LegalizeOps: tree_ensemble needs inputs of known shape")
    func = tree_prim_func([_dims(si.shape) for si in sinfos], [str(si.dtype) for si in sinfos],
                          call.attrs or TreeEnsembleAttrs())
    func = func.with_attr("op_name", "tree_ensemble").with_attr(
        "op_pattern", int(OpPattern.OPAQUE))
    return gx.call_tir(bb.add_func(func, "tree_ensemble"), list(call.args), call.struct_info)


tree_ensemble = register_op(
    "tree_ensemble",
    inputs=tuple(name for name, _, _ in _ARGS),
    attrs=TreeEnsembleAttrs,
    infer=_infer,
    pattern=OpPattern.OPAQUE,
    legalize=_legalize,
    mixed_precision=MixedPrecision.NEVER,
    gradient=NON_DIFFERENTIABLE,
    doc="Evaluate a tree ensemble given as node/leaf tables (ONNX ai.onnx.ml TreeEnsemble).",
)
