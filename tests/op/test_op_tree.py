"""tree_ensemble (kiln.op.tree): inference, the kernel's TIR, numerics against a numpy walk of the
same tables (random trees, every comparison mode, missing values, every aggregate)."""

from __future__ import annotations

import numpy as np
import pytest

import kiln
from kiln import graph as g
from kiln import op
from kiln.graph.block_builder import BlockBuilder
from kiln.ir.errors import KilnError, StructInfoError
from kiln.op.registry import NON_DIFFERENTIABLE, OpPattern, get_op_def
from kiln.op.tree import TreeEnsembleAttrs, tree_prim_func
from kiln.schedule.cpu.tree import schedule_tree_ensemble
from kiln.testing.op_testing import dims, infer, tvar

RNG = np.random.default_rng(12)
_VALUES = np.array([-1.0, -0.5, 0.0, 0.5, 1.0])


def random_tables(n_trees, depth, n_features, n_targets, modes):
    """Random trees as tree_ensemble tables; leaves each feed one target."""
    nodes, splits, leaves = [], [], []

    def build(level):
        if level == 0 or (level < depth and RNG.random() < 0.3):
            leaves.append((int(RNG.integers(0, n_targets)), float(RNG.uniform(-3, 3))))
            return -len(leaves)
        k = len(nodes)
        nodes.append([int(RNG.integers(0, n_features)), int(RNG.choice(modes)),
                      int(RNG.integers(0, 2)), 0, 0])
        splits.append(float(RNG.choice(_VALUES)))
        nodes[k][3] = build(level - 1)
        nodes[k][4] = build(level - 1)
        return k

    roots = [build(depth) for _ in range(n_trees)]
    w = np.zeros((len(leaves), n_targets))
    mask = np.zeros((len(leaves), n_targets), np.int8)
    for i, (t, v) in enumerate(leaves):
        w[i, t], mask[i, t] = v, 1
    return (np.array(nodes, np.int64), np.array(splits), np.array(roots, np.int64), w, mask)


def np_tree_ensemble(x, nodes, splits, roots, w, mask, aggregate):
    cmp = [np.less_equal, np.less, np.greater_equal, np.greater, np.equal, np.not_equal]
    out = np.zeros((x.shape[0], w.shape[1]))
    for r, row in enumerate(x.astype("float64")):
        reached = []
        for code in roots:
            while code >= 0:
                f, m, miss, t, fl = nodes[code]
                v = row[f]
                code = t if cmp[m](v, splits[code]) or (miss and np.isnan(v)) else fl
            reached.append(-code - 1)
        for j in range(w.shape[1]):
            vals = [w[leaf, j] for leaf in reached if mask[leaf, j]]
            big = float(np.finfo(x.dtype).max)
            out[r, j] = {"SUM": sum(vals), "AVERAGE": sum(vals) / len(roots),
                         "MIN": min(vals, default=big), "MAX": max(vals, default=-big)}[aggregate]
    return out.astype(x.dtype)


def test_declaration_and_inference():
    d = get_op_def("tree_ensemble")
    assert d.pattern == OpPattern.OPAQUE and d.gradient is NON_DIFFERENTIABLE
    args = [tvar("x", (8, 3)), tvar("n", (4, 5), "int64"), tvar("s", (4,), "float64"),
            tvar("r", (2,), "int64"), tvar("w", (5, 3), "float64"), tvar("m", (5, 3), "int8")]
    s = infer(op.tree_ensemble(*args, depth=3, aggregate="MAX"))
    assert dims(s) == (8, 3) and s.dtype == "float32"
    with pytest.raises(StructInfoError, match="tree_ensemble: x must be a float"):
        infer(op.tree_ensemble(tvar("x", (8, 3), "int32"), *args[1:]))
    with pytest.raises(KilnError, match="aggregate must be one of"):
        op.tree_ensemble(*args, aggregate="MEDIAN")
    with pytest.raises(KilnError, match="mode must be None or 0..5"):
        op.tree_ensemble(*args, mode=6)


def run_graph(cases):
    """Build every ``(arrays, attrs)`` case into one module (one C compile); the tables are
    constants, as the converter makes them."""
    outs = []
    bb = BlockBuilder()
    xs = [g.Var(f"x{k}", g.TensorStructInfo(a[0].shape, str(a[0].dtype)))
          for k, (a, _) in enumerate(cases)]
    with bb.function("main", xs):
        with bb.dataflow():
            for x, (arrays, attrs) in zip(xs, cases):
                call = op.tree_ensemble(x, *(g.const(t) for t in arrays[1:]), **attrs)
                outs.append(bb.emit_output(call))
        bb.emit_func_output(g.Tuple(tuple(outs)))
    got = kiln.build(bb.get())(*(a[0] for a, _ in cases))
    return [np.asarray(v) for v in got]


def test_kernel_is_one_block_per_row():
    """One block per row; the walk is a serial loop of ``depth`` steps inside it."""
    tables = random_tables(3, 7, 2, 2, [0, 1])
    shapes = [(64, 2), *(t.shape for t in tables)]
    dtypes = ["float32", *(str(t.dtype) for t in tables)]
    text = tree_prim_func(shapes, dtypes, TreeEnsembleAttrs(depth=7)).script()
    assert text.count("with block(") == 2 and "for d in range(7)" in text, text
    assert "for i in range(64)" in text
    from kiln.target import Target
    from kiln.tir.schedule import Schedule

    for rows, parallel in ((64, False), (4096, True)):
        func = tree_prim_func([(rows, 2), *shapes[1:]], dtypes, TreeEnsembleAttrs(depth=7))
        sch = Schedule(func.with_attr("op_name", "tree_ensemble"))
        schedule_tree_ensemble(sch, Target("c"))
        assert ("parallel" in sch.func.script()) == parallel


@pytest.mark.parametrize("dtype", ["float32", "float64"])
def test_numerics_against_numpy(dtype):
    cases = []
    for aggregate, modes, fixed in [("SUM", [0], 0), ("AVERAGE", [0, 1, 2, 3, 4, 5], None),
                                    ("MIN", [1, 4], None), ("MAX", [3], 3),
                                    ("SUM", [2, 5], None)]:
        depth = int(RNG.integers(1, 6))
        tables = random_tables(int(RNG.integers(1, 6)), depth, 3, 3, modes)
        x = RNG.choice(_VALUES, (50, 3)) + RNG.choice([0.0, 0.25], (50, 3))
        x[RNG.random((50, 3)) < 0.1] = np.nan
        cases.append(([x.astype(dtype), *tables],
                      {"depth": depth, "aggregate": aggregate, "mode": fixed}))
    for (arrays, attrs), got in zip(cases, run_graph(cases)):
        want = np_tree_ensemble(*arrays, attrs["aggregate"])
        assert got.dtype == want.dtype
        np.testing.assert_allclose(got, want, rtol=1e-6 if dtype == "float32" else 1e-12)
