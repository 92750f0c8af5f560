"""Text operators: ``ngram_count``, the counting kernel of ONNX TfIdfVectorizer.

``ngram_count(x, trie, n_out, depth, max_skip_count, max_children)`` counts, in every row ``b``
of the integer tensor ``x`` (``(B, C)``), the occurrences of the n-grams of a pool whose items
are ``d`` positions apart, for every distance ``d = 1 .. max_skip_count + 1``, and adds each
occurrence to the pool n-gram's output column: ``out`` is ``(B, n_out)`` int64. Unigrams are
counted once, not once per distance (the ONNX reference and onnxruntime do the same).

The pool is a compile-time constant, given as a trie (:func:`ngram_trie` builds it): row ``k``
of the int64 table ``trie`` (``(M, 4)``) is node ``k``'s ``(key, first child, number of
children, output column or -1)``; node 0 is the root, and every node's children are
consecutive rows sorted by key. For every start position and distance the kernel walks the
trie from the root, one item at a time (at most ``depth`` items), finding each child by a
binary search of at most ``bit_length(max_children)`` steps, and counts every node it reaches
that ends a pool n-gram. The work is ``B * (S + 1) * C * depth * log2(max_children)``: linear in
the input, logarithmic in the pool. (Comparing every pool n-gram at every position, a plain
tensor expression, is linear in the pool size: on a 1500-gram pool and a 64 x 256 input with
2 skips it took 240 ms, this walk 10 ms, onnxruntime's hash trie 1 ms, 2 threads.) The walk is
data dependent, so the kernel is block TIR written by ``legalize`` (like the scans): one block
per row, whose output row only it writes, rows in parallel.
"""

from __future__ import annotations

from collections.abc import Sequence
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

__all__ = ["ngram_count", "ngram_trie"]


def _non_negative(name: str, value: Any, least: int = 0) -> None:
    if isinstance(value, bool) or not isinstance(value, int) or value < least:
        raise KilnError(f"ngram_count: {name} must be an int >= {least}, got {value!r}")


@dataclass(frozen=True)
class NgramCountAttrs:
    """``n_out``: output columns; ``depth``: the longest pool n-gram; ``max_skip_count``: the
    most items skipped between two n-gram items; ``max_children``: the largest number of
    children of a trie node (bounds the binary search)."""

    n_out: int = 1
    depth: int = 1
    max_skip_count: int = 0
    max_children: int = 1

    def __post_init__(self):
        _non_negative("n_out", self.n_out, 1)
        _non_negative("depth", self.depth, 1)
        _non_negative("max_skip_count", self.max_skip_count)
        _non_negative("max_children", self.max_children)


def ngram_trie(grams: Sequence[Sequence[int]], columns: Sequence[int]) -> np.ndarray:
    """The ``trie`` table of ``ngram_count`` for n-grams ``grams`` counted into ``columns``
    (an n-gram listed twice keeps its last column). Nodes are numbered breadth first, so the
    children of a node are consecutive rows, sorted by key."""
    ends: dict[tuple[int, ...], int] = {}
    children: dict[tuple[int, ...], set[int]] = {(): set()}
    for gram, col in zip(grams, columns):
        gram = tuple(int(v) for v in gram)
        if not gram:
            raise KilnError("ngram_trie: an n-gram must have at least one item")
        ends[gram] = int(col)
        for k in range(len(gram)):
            children.setdefault(gram[:k], set()).add(gram[k])
            children.setdefault(gram[:k + 1], set())
    order: list[tuple[int, ...]] = [()]
    rows: list[list[int]] = []
    for prefix in order:  # grows while it is walked: breadth first
        kids = sorted(children[prefix])
        rows.append([prefix[-1] if prefix else 0, len(order), len(kids), ends.get(prefix, -1)])
        order.extend(prefix + (k,) for k in kids)
    return np.asarray(rows, dtype=np.int64).reshape(-1, 4)


def _infer(call: Any) -> Any:
    x = tensor_arg(call, 0, "ngram_count", "x")
    trie = tensor_arg(call, 1, "ngram_count", "trie")
    for name, s, ndim in (("x", x, 2), ("trie", trie, 2)):
        dt = as_dtype(s.dtype)
        if not dt.is_integer:
            raise StructInfoError(f"ngram_count: {name} must be an integer tensor, got {dt}")
        nd = arg_ndim(s)
        if nd >= 0 and nd != ndim:
            raise StructInfoError(f"ngram_count: {name} must have rank {ndim}, got rank {nd}")
    attrs = call.attrs or NgramCountAttrs()
    xs = arg_shape(x)
    return tensor_sinfo(None if xs is None else (xs[0], attrs.n_out), "int64", ndim=2)


def ngram_prim_func(x_shape: Sequence[Any], x_dtype: str, n_nodes: int, attrs: NgramCountAttrs,
                    name: str = "ngram_count") -> tir.PrimFunc:
    """The PrimFunc ``(X, TRIE, OUT)`` (see the module doc)."""
    idx, zero, one = INDEX_DTYPE, tx.const(INDEX_DTYPE, 0), tx.const(INDEX_DTYPE, 1)
    batch, c = (d if const_int(d) is not None or isinstance(d, tir.Var)
                else tir.Var(f"d{k}", INDEX_DTYPE) for k, d in enumerate(x_shape))
    x = tir.decl_buffer((batch, c), x_dtype, "X")
    trie = tir.decl_buffer((n_nodes, 4), "int64", "TRIE")
    out = tir.decl_buffer((batch, attrs.n_out), "int64", "OUT")
    node, lo, hi = (tir.decl_buffer((1,), idx, v, scope="local") for v in ("node", "lo", "hi"))
    b, bv = tir.Var("b", idx), tir.Var("bi", idx)
    o, s, i, k, step = (tir.Var(v, idx) for v in ("o", "s", "i", "k", "step"))
    v, end, mid, col = (tir.Var(n, idx) for n in ("v", "end", "mid", "col"))
    last = tx.const(idx, n_nodes - 1)

    def field(row: Any, f: int) -> Any:
        return trie[tx.min(tx.max(row, zero), last), tx.const(idx, f)]

    def store(buf: Any, value: Any) -> Any:
        return tir.BufferStore(buf, value, (zero,))

    steps = max(int(attrs.max_children).bit_length(), 1)
    search = tir.For(step, zero, tx.const(idx, steps), tir.ForKind.SERIAL, tir.IfThenElse(
        lo[zero] < hi[zero], tir.LetStmt(mid, tx.floordiv(lo[zero] + hi[zero], 2), tir.IfThenElse(
            field(mid, 0) < v, store(lo, mid + one), store(hi, mid)))))
    found = tx.logical_and(lo[zero] < end, tx.eq(field(lo[zero], 0), v))
    count = tir.LetStmt(col, field(node[zero], 3), tir.IfThenElse(
        tx.all_of([col >= 0, col < attrs.n_out, tx.logical_or(k > 0, tx.eq(s, 0))]),
        tir.BufferStore(out, out[b, col] + one, (b, col))))
    pos = i + (s + one) * k
    descend = tir.LetStmt(v, tx.cast(idx, x[b, tx.min(pos, c - one)]), tir.seq(
        store(lo, field(node[zero], 1)),
        tir.LetStmt(end, lo[zero] + field(node[zero], 2), tir.seq(
            store(hi, end), search,
            store(node, tx.select(found, lo[zero], tx.const(idx, -1))),
            tir.IfThenElse(node[zero] >= 0, count)))))
    walk = tir.seq(store(node, zero), tir.For(
        k, zero, tx.const(idx, attrs.depth), tir.ForKind.SERIAL,
        tir.IfThenElse(node[zero] >= 0, tir.IfThenElse(
            pos < c, descend, store(node, tx.const(idx, -1))))))
    body = tir.seq(
        tir.For(o, zero, tx.const(idx, attrs.n_out), tir.ForKind.SERIAL,
                tir.BufferStore(out, zero, (b, o))),
        tir.For(s, zero, tx.const(idx, attrs.max_skip_count + 1), tir.ForKind.SERIAL,
                tir.For(i, zero, c, tir.ForKind.SERIAL, walk)))
    reads = (tir.BufferRegion(x, (tx.Range(b, one), tx.Range(zero, c))), trie.full_region())
    writes = (tir.BufferRegion(out, (tx.Range(b, one), tx.Range(zero, tx.const(
        idx, attrs.n_out)))),)
    block = tir.Block((tx.IterVar(tx.Range(zero, batch), b, tx.IterType.DATA_PAR),), reads,
                      writes, name, body, alloc_buffers=(node, lo, hi))
    stmt = tir.For(bv, zero, batch, tir.ForKind.SERIAL,
                   tir.BlockRealize((bv,), tir.true_predicate(), block))
    root = tir.Block((), (), (), "root", stmt)
    params = tuple(tir.Var(n, "handle") for n in ("X", "TRIE", "OUT"))
    work = (attrs.max_skip_count + 1) * attrs.depth * steps * (const_int(c) or 64)
    return tir.PrimFunc(params, dict(zip(params, (x, trie, out))),
                        tir.BlockRealize((), tir.true_predicate(), root),
                        {"global_symbol": name, "num_outputs": 1, "row_work": work})


def _legalize(bb: Any, call: Any) -> Any:
    x, trie = (a.struct_info for a in call.args)
    if getattr(x, "shape", None) is None or getattr(trie, "shape", None) is None:
        raise StructInfoError("LegalizeOps: ngram_count needs inputs of known shape")
    n_nodes = const_int(trie.shape[0])
    if n_nodes is None or const_int(trie.shape[1]) != 4:
        raise StructInfoError(f"ngram_count: trie must be a static (M, 4) table, got "
                              f"{trie.shape}")
    func = ngram_prim_func(tuple(x.shape), str(x.dtype), n_nodes,
                           call.attrs or NgramCountAttrs())
    func = func.with_attr("op_name", "ngram_count").with_attr(
        "op_pattern", int(OpPattern.OPAQUE))
    return gx.call_tir(bb.add_func(func, "ngram_count"), list(call.args), call.struct_info)


ngram_count = register_op(
    "ngram_count",
    inputs=("x", "trie"),
    attrs=NgramCountAttrs,
    infer=_infer,
    pattern=OpPattern.OPAQUE,
    legalize=_legalize,
    mixed_precision=MixedPrecision.NEVER,
    gradient=NON_DIFFERENTIABLE,
    doc="Occurrences of pool n-grams (a trie) in each row of an integer tensor, with skips, "
    "per output column (the counting of ONNX TfIdfVectorizer).",
)
