"""topk (selection kernel) and reduce_to (reduced axes chosen at run time): inference, errors,
the schedule, numerics against numpy (each in one compiled module)."""

from __future__ import annotations

import numpy as np
import pytest

import kiln
from kiln import graph as g
from kiln import op, tir
from kiln.graph.block_builder import BlockBuilder
from kiln.ir.errors import KilnError, StructInfoError
from kiln.op.registry import OpPattern, get_op_def
from kiln.op.sort import topk_prim_func
from kiln.schedule import lookup_schedule
from kiln.target import Target
from kiln.testing.op_testing import dims, infer, tvar
from kiln.tir.schedule import Schedule

RNG = np.random.default_rng(11)


def np_topk(x, k, axis, largest):
    """numpy reference: stable sort, so equal values keep the lower index first (the samples
    are small integers, exact in float64, which also negates unsigned ones)."""
    key = x.astype(np.float64)
    order = np.argsort(-key if largest else key, axis=axis, kind="stable")
    idx = np.take(order, np.arange(k), axis=axis)
    return np.take_along_axis(x, idx, axis=axis), idx.astype(np.int64)


# ---------------------------------------------------------------------------------------------
# topk
# ---------------------------------------------------------------------------------------------
def test_topk_declaration_and_inference():
    d = get_op_def("topk")
    assert d.pattern == OpPattern.OPAQUE and d.legalize is not None
    assert lookup_schedule(d.name, "c") is not None
    assert callable(d.gradient)  # rule checked in test_op_gradients.py
    s = infer(op.topk(tvar("x", (3, 7, 5)), 2, axis=1))
    assert dims(s.fields[0]) == (3, 2, 5) and s.fields[0].dtype == "float32"
    assert dims(s.fields[1]) == (3, 2, 5) and s.fields[1].dtype == "int64"
    k = tir.Var("k", "int64")
    s = infer(op.topk(tvar("x", (3, 7)), k, largest=False))
    assert s.fields[1].shape[1] is k


def test_topk_errors_name_the_op():
    with pytest.raises(StructInfoError, match="topk: k=8 exceeds"):
        infer(op.topk(tvar("x", (3, 7)), 8))
    with pytest.raises(StructInfoError, match="topk"):
        infer(op.topk(tvar("x", (3, 7)), 2, axis=2))
    with pytest.raises(StructInfoError, match="topk: x must be a tensor of numbers"):
        infer(op.topk(tvar("b", (3, 7), "bool"), 2))
    with pytest.raises(KilnError, match="topk: k must be"):
        op.topk(tvar("x", (3, 7)), -1)
    with pytest.raises(KilnError, match="topk: largest"):
        op.topk(tvar("x", (3, 7)), 1, largest=1)


def test_topk_tir_is_one_block_per_line_and_parallel_when_big():
    func = topk_prim_func((64, 4096), "float32", 4, 1, True).with_attr("op_name", "topk")
    sch = Schedule(func)
    lookup_schedule("topk", "c")(sch, Target("c"))
    kinds = []
    tir.post_order_visit(sch.func.body, lambda n: isinstance(n, tir.For) and kinds.append(n.kind))
    assert tir.ForKind.PARALLEL in kinds
    loops = []
    tir.post_order_visit(func.body, lambda n: isinstance(n, tir.For) and loops.append(n))
    # lines, the slot initialization (k), the elements (n) and the insertion (k): O(n*k)
    assert sorted(int(lp.extent.value) for lp in loops) == [4, 4, 64, 4096]


TOPK_CASES = [
    # (shape, dtype, k, axis, largest)
    ((3, 7, 5), "float32", 3, 1, True),
    ((3, 7, 5), "float32", 5, -1, False),
    ((4, 9), "int64", 9, 1, True),  # k = n: a full stable sort
    ((9,), "int32", 4, 0, False),
    ((5, 6), "uint64", 2, 0, True),
    ((6, 5), "float64", 0, 0, True),  # k = 0: empty outputs
    ((2, 0, 3), "float32", 0, 1, True),  # empty axis
    ((32, 300), "float32", 10, 1, True),  # enough work for the parallel schedule
]


def _sample(shape, dtype):
    if dtype.startswith(("int", "uint")):
        return RNG.integers(0, 4, shape).astype(dtype)  # many ties
    return RNG.integers(-3, 3, shape).astype(dtype) + (RNG.random(shape) < 0.3)


def test_topk_numerics_match_numpy():
    params, arrays = [], []
    for i, (shape, dtype, *_rest) in enumerate(TOPK_CASES):
        params.append(tvar(f"x{i}", shape, dtype))
        arrays.append(_sample(shape, dtype))
    bb = BlockBuilder()
    with bb.function("main", params):
        with bb.dataflow():
            outs = []
            for p, (_, _, k, axis, largest) in zip(params, TOPK_CASES):
                t = bb.emit(op.topk(p, k, axis=axis, largest=largest))
                outs += [bb.emit_output(g.TupleGetItem(t, 0)),
                         bb.emit_output(g.TupleGetItem(t, 1))]
        bb.emit_func_output(g.Tuple(tuple(outs)))
    got = kiln.build(bb.get())(*arrays)
    for i, (a, (_, dtype, k, axis, largest)) in enumerate(zip(arrays, TOPK_CASES)):
        want_v, want_i = np_topk(a, k, axis, largest)
        v, ix = got[2 * i], got[2 * i + 1]
        assert v.dtype == np.dtype(dtype) and ix.dtype == np.int64, i
        np.testing.assert_array_equal(ix, want_i, err_msg=str(TOPK_CASES[i]))
        np.testing.assert_array_equal(v, want_v, err_msg=str(TOPK_CASES[i]))


def test_topk_symbolic_k_and_length():
    n, k = tir.Var("n", "int64"), tir.Var("k", "int64")
    x = tvar("x", (3, n))
    bound = tvar("b", (k,), "int64")  # binds k at run time (its values are unused)
    bb = BlockBuilder()
    with bb.function("main", [x, bound]):
        with bb.dataflow():
            t = bb.emit(op.topk(x, k, axis=1))
            out = [bb.emit_output(g.TupleGetItem(t, 0)), bb.emit_output(g.TupleGetItem(t, 1))]
        bb.emit_func_output(g.Tuple(tuple(out)))
    exe = kiln.build(bb.get())
    for cols, kk in ((6, 2), (11, 11)):
        a = RNG.standard_normal((3, cols)).astype("float32")
        v, ix = exe(a, np.zeros(kk, "int64"))
        want_v, want_i = np_topk(a, kk, 1, True)
        np.testing.assert_array_equal(ix, want_i)
        np.testing.assert_array_equal(v, want_v)


# ---------------------------------------------------------------------------------------------
# reduce_to
# ---------------------------------------------------------------------------------------------
def test_reduce_to_inference_and_errors():
    m = tir.Var("m", "int64")
    s = infer(op.reduce_to(tvar("x", (3, 4, 5)), shape=(1, 4, m), kind="max"))
    assert s.shape[2] is m and s.dtype == "float32"
    assert infer(op.reduce_to(tvar("b", (3, 4), "bool"), shape=(1, 4))).dtype == "int64"
    with pytest.raises(StructInfoError, match="reduce_to: shape"):
        infer(op.reduce_to(tvar("x", (3, 4)), shape=(1,)))
    with pytest.raises(StructInfoError, match="reduce_to"):
        infer(op.reduce_to(tvar("i", (3, 4), "int32"), shape=(1, 4), kind="logsumexp"))
    with pytest.raises(KilnError, match="reduce_to: kind"):
        op.reduce_to(tvar("x", (3, 4)), shape=(1, 4), kind="median")


def np_reduce(kind, x, axes):
    if kind == "logsumexp":
        m = x.max(axis=axes, keepdims=True)
        return np.log(np.exp(x - m).sum(axis=axes, keepdims=True)) + m
    return getattr(np, kind)(x, axis=axes, keepdims=True)


def test_reduce_to_numerics_with_symbolic_dims():
    """The kept/reduced pattern comes from symbolic dims bound at run time."""
    a, b, c = (tir.Var(n, "int64") for n in "abc")
    x = tvar("x", (3, 4, 5))
    shape_arg = tvar("s", (a, b, c), "int8")  # binds a, b, c from its shape
    kinds = ("sum", "max", "min", "prod", "logsumexp")
    bb = BlockBuilder()
    with bb.function("main", [x, shape_arg]):
        with bb.dataflow():
            outs = [bb.emit_output(op.reduce_to(x, shape=(a, b, c), kind=k)) for k in kinds]
        bb.emit_func_output(g.Tuple(tuple(outs)))
    exe = kiln.build(bb.get())
    v = RNG.uniform(0.5, 1.5, (3, 4, 5)).astype("float32")
    for axes in ((0, 2), (1,), (0, 1, 2), ()):
        shape = tuple(1 if d in axes else n for d, n in enumerate(v.shape))
        for kind, out in zip(kinds, exe(v, np.zeros(shape, "int8"))):
            np.testing.assert_allclose(out, np_reduce(kind, v, axes), rtol=1e-5, atol=1e-6,
                                       err_msg=f"{kind} {axes}")
