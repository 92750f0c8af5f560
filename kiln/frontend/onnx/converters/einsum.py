"""ONNX Einsum, decomposed into kiln ops (no einsum kernel).

The equation is parsed into one label string per operand (``...`` becomes digit labels, one
per broadcast dimension, aligned from the right as numpy does). Then:

1. a label repeated within an operand (``ii``) takes the diagonal: ``where(eye, x, 0)`` summed
   over the second copy (exact: one term is selected);
2. labels used by one operand only and not in the output are summed out right away;
3. operands are combined left to right; a pair is one ``matmul``: shared labels still needed
   later are batch dims, shared labels needed no more are contracted (the K of the matmul),
   the others are its M and N (each group flattened by a reshape) -- so contractions run on
   kiln's GEMM kernel rather than as a broadcast product and a sum;
4. remaining labels not in the output are summed and the result is transposed to the output
   order. Without ``->`` the output is the labels used once, in alphabetical order, after the
   ``...`` dims (numpy's implicit mode).
"""

from __future__ import annotations

from typing import Any

import numpy as np

from .... import graph as g
from .... import op
from ..registry import converter
from .common import dtype_of, ndim_of, prod, scalar, shape_of, static_int

_ELLIPSIS_LABELS = "0123456789"


def parse_equation(node: Any, equation: str, ranks: list[int]) -> tuple[list[str], str]:
    """(labels per operand, output labels); ``...`` is expanded to digit labels."""
    eq = equation.replace(" ", "")
    lhs, arrow, rhs = eq.partition("->")
    terms = lhs.split(",")
    if len(terms) != len(ranks):
        raise node.error(f"equation {equation!r} has {len(terms)} operands, the node "
                         f"{len(ranks)} inputs")
    ell = max((r - len(t.replace("...", "")) for t, r in zip(terms, ranks) if "..." in t),
              default=0)
    if ell > len(_ELLIPSIS_LABELS):
        raise node.error(f"'...' covers {ell} dims, at most {len(_ELLIPSIS_LABELS)} supported")
    full = _ELLIPSIS_LABELS[:ell]
    labels = []
    for t, r in zip(terms, ranks):
        n = r - len(t.replace("...", ""))
        if "..." in t:
            t = t.replace("...", full[ell - n:] if n else "")
        if len(t) != r or not all(c.isalpha() or c in full for c in t):
            raise node.error(f"operand term {t!r} of {equation!r} does not fit an input of "
                             f"rank {r}")
        labels.append(t)
    if arrow:
        out = rhs.replace("...", full)
        if not all(c.isalpha() or c in full for c in out) or len(set(out)) != len(out):
            raise node.error(f"bad output term {rhs!r} in {equation!r}")
        if any(c not in "".join(labels) for c in out):
            raise node.error(f"output term {rhs!r} uses a label no operand has")
    else:
        counts = {c: "".join(labels).count(c) for c in "".join(labels)}
        out = full + "".join(sorted(c for c, n in counts.items() if n == 1 and c.isalpha()))
    return labels, out


def _diagonal(ctx: Any, node: Any, x: Any, labels: str) -> tuple[Any, str]:
    """Take the diagonal of every label repeated in ``labels``."""
    while True:
        dup = next((c for c in labels if labels.count(c) > 1), None)
        if dup is None:
            return x, labels
        p = labels.index(dup)
        q = labels.index(dup, p + 1)
        n, nq = static_int(shape_of(x)[p]), static_int(shape_of(x)[q])
        if n is None or n != nq:
            raise node.error(f"label {dup!r} repeated in one operand needs equal static dims, "
                             f"got {shape_of(x)[p]} and {shape_of(x)[q]}")
        eye = g.const(np.eye(n, dtype=bool).reshape(
            [n if d in (p, q) else 1 for d in range(ndim_of(x))]))
        x = ctx.emit(op.sum(op.where(eye, x, scalar(0, dtype_of(x))), axis=q))
        labels = labels[:q] + labels[q + 1:]


def _sum_out(x: Any, labels: str, keep: set[str]) -> tuple[Any, str]:
    axes = tuple(i for i, c in enumerate(labels) if c not in keep)
    if not axes:
        return x, labels
    return op.sum(x, axis=axes), "".join(c for c in labels if c in keep)


def _permute(x: Any, labels: str, order: str) -> Any:
    perm = tuple(labels.index(c) for c in order)
    return x if perm == tuple(range(len(perm))) else op.transpose(x, perm)


def _contract(ctx: Any, a: Any, la: str, b: Any, lb: str, keep: set[str]) -> tuple[Any, str]:
    """``a`` and ``b`` combined as one batched matmul (see the module docstring)."""
    batch = "".join(c for c in la if c in lb and c in keep)
    red = "".join(c for c in la if c in lb and c not in keep)
    m = "".join(c for c in la if c not in lb)
    n = "".join(c for c in lb if c not in la)
    sa, sb = dict(zip(la, shape_of(a))), dict(zip(lb, shape_of(b)))
    a2 = op.reshape(_permute(a, la, batch + m + red),
                    tuple(sa[c] for c in batch) + (prod(sa[c] for c in m),
                                                   prod(sa[c] for c in red)))
    b2 = op.reshape(_permute(b, lb, batch + red + n),
                    tuple(sb[c] for c in batch) + (prod(sb[c] for c in red),
                                                   prod(sb[c] for c in n)))
    out = ctx.emit(op.matmul(a2, b2))
    bshape = tuple(shape_of(out)[:len(batch)])
    shape = bshape + tuple(sa[c] for c in m) + tuple(sb[c] for c in n)
    return op.reshape(out, shape), batch + m + n


@converter("Einsum", since=12)
def einsum(ctx: Any, node: Any) -> Any:
    xs = [x for x in node.inputs() if x is not None]
    labels, out = parse_equation(node, node.attr("equation", ""), [ndim_of(x) for x in xs])
    terms = []
    for i, (x, lab) in enumerate(zip(xs, labels)):
        x, lab = _diagonal(ctx, node, x, lab)
        others = set(out).union(*(labels[j] for j in range(len(xs)) if j != i))
        terms.append(_sum_out(x, lab, others))
    acc, lab = terms[0]
    for i in range(1, len(terms)):
        keep = set(out).union(*(t[1] for t in terms[i + 1:]))
        b, lb = terms[i]
        acc, lab = _contract(ctx, ctx.emit(acc), lab, ctx.emit(b), lb, keep)
    acc, lab = _sum_out(acc, lab, set(out))
    return _permute(acc, lab, out) if lab else acc
