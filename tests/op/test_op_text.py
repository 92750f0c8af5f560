"""ngram_count / ngram_trie (kiln.op.text): the trie layout, inference, errors, numerics against
a brute-force numpy count."""

from __future__ import annotations

import numpy as np
import pytest

import kiln
from kiln import graph as g
from kiln import op
from kiln.graph.block_builder import BlockBuilder
from kiln.ir.errors import KilnError, StructInfoError
from kiln.op.registry import NON_DIFFERENTIABLE, OpPattern, get_op_def
from kiln.op.text import NgramCountAttrs, ngram_prim_func
from kiln.testing.op_testing import dims, infer, tvar

RNG = np.random.default_rng(11)


def np_ngram_count(x, grams, columns, n_out, max_skip_count):
    """Count every (distinct) n-gram at every start and distance, one position at a time; a
    gram listed twice counts into its last column."""
    last = {tuple(gr): col for gr, col in zip(grams, columns)}
    batch, c = x.shape
    out = np.zeros((batch, n_out), np.int64)
    for b in range(batch):
        for gram, col in last.items():
            n = len(gram)
            for d in range(1, max_skip_count + 2):
                if n == 1 and d > 1:  # unigrams are counted once
                    break
                for i in range(c - d * (n - 1)):
                    if all(x[b, i + d * k] == gram[k] for k in range(n)):
                        out[b, col] += 1
    return out


def test_trie_layout():
    trie = op.ngram_trie([(3, 1), (1,), (3,), (3, 2), (1, 3)], [4, 0, 1, 2, 3])
    # rows: (key, first child, children, column); root, then 1 and 3, then (1,3), (3,1), (3,2)
    np.testing.assert_array_equal(trie, [[0, 1, 2, -1], [1, 3, 1, 0], [3, 4, 2, 1],
                                         [3, 6, 0, 3], [1, 6, 0, 4], [2, 6, 0, 2]])
    assert op.ngram_trie([], []).tolist() == [[0, 1, 0, -1]]
    with pytest.raises(KilnError, match="at least one item"):
        op.ngram_trie([()], [0])


def test_declaration_and_inference():
    d = get_op_def("ngram_count")
    assert d.pattern == OpPattern.OPAQUE and d.gradient is NON_DIFFERENTIABLE
    s = infer(op.ngram_count(tvar("x", (3, 7), "int32"), tvar("t", (5, 4), "int64"),
                             n_out=9, depth=2, max_skip_count=2, max_children=3))
    assert dims(s) == (3, 9) and s.dtype == "int64"
    with pytest.raises(StructInfoError, match="ngram_count: x must be an integer"):
        infer(op.ngram_count(tvar("x", (3, 7)), tvar("t", (5, 4), "int64")))
    with pytest.raises(StructInfoError, match="ngram_count: trie must have rank 2"):
        infer(op.ngram_count(tvar("x", (3, 7), "int64"), tvar("t", (5,), "int64")))
    with pytest.raises(KilnError, match="max_skip_count must be an int >= 0"):
        op.ngram_count(tvar("x", (3, 7), "int64"), tvar("t", (5, 4), "int64"),
                       max_skip_count=-1)


def test_kernel_is_one_block_per_row():
    text = ngram_prim_func((4, 9), "int64", 6, NgramCountAttrs(n_out=3, depth=2,
                                                               max_children=5)).script()
    assert text.count("with block(") == 2 and "for step in range(3)" in text, text


def _case(batch, c, n_grams, max_n, skip, dtype, vocab=3, n_out=None):
    x = RNG.integers(0, vocab, (batch, c)).astype(dtype)
    grams = [tuple(RNG.integers(0, vocab, int(RNG.integers(1, max_n + 1))))
             for _ in range(n_grams)]
    n_out = n_out or n_grams + 1
    columns = [int(col) for col in RNG.integers(0, n_out, n_grams)]  # shared columns add up
    return x, grams, columns, n_out, skip


def test_numerics_against_numpy():
    cases = [_case(3, 12, 8, 3, 0, "int64"), _case(2, 15, 10, 3, 3, "int32"),
             _case(1, 1, 4, 2, 2, "int64"),  # a one-item row: only unigrams fit
             _case(2, 6, 5, 1, 5, "int32"),  # unigrams only: the skips add nothing
             _case(4, 9, 12, 4, 9, "int64", vocab=2),  # a skip longer than the row
             _case(2, 40, 60, 2, 1, "int64", vocab=12, n_out=70)]  # wide nodes: a real search
    bb = BlockBuilder()
    xs = [g.Var(f"x{k}", g.TensorStructInfo(c[0].shape, str(c[0].dtype)))
          for k, c in enumerate(cases)]
    with bb.function("main", xs):
        with bb.dataflow():
            outs = []
            for xv, (_, grams, columns, n_out, skip) in zip(xs, cases):
                trie = op.ngram_trie(grams, columns)
                call = op.ngram_count(xv, g.const(trie), n_out=n_out,
                                      depth=max(len(gr) for gr in grams), max_skip_count=skip,
                                      max_children=int(trie[:, 2].max()))
                outs.append(bb.emit_output(call))
        bb.emit_func_output(g.Tuple(tuple(outs)))
    results = kiln.build(bb.get())(*(c[0] for c in cases))
    for (x, grams, columns, n_out, skip), got in zip(cases, results):
        np.testing.assert_array_equal(np.asarray(got),
                                      np_ngram_count(x, grams, columns, n_out, skip))
    assert max(int(np.asarray(r).max()) for r in results) > 1  # repeats were counted
