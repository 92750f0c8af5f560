"""gather_elements / gather_nd / scatter_elements / scatter_nd: inference, errors, the scatter
loop program, and numerics against numpy loops (every case in one compiled module)."""

from __future__ import annotations

import numpy as np
import pytest

import kiln
from kiln import graph as g
from kiln import op, tir
from kiln.ir.errors import KilnError, RuntimeCheckError, StructInfoError
from kiln.op.index import scatter_prim_func
from kiln.op.registry import OpPattern, get_op_def
from kiln.schedule import lookup_schedule
from kiln.testing.op_testing import dims, infer, tvar

RNG = np.random.default_rng(11)


# ---------------------------------------------------------------------------------------------
# numpy references (written as loops, independent of kiln's formulation)
# ---------------------------------------------------------------------------------------------
def np_gather_nd(data, indices, b=0):
    k = indices.shape[-1]
    out = np.empty(indices.shape[:-1] + data.shape[b + k:], data.dtype)
    for q in np.ndindex(indices.shape[:-1]):
        pos = tuple(int(i) for i in indices[q])
        out[q] = data[q[:b] + pos]
    return out


REDUCE = {"none": lambda a, b: b, "add": np.add, "mul": np.multiply, "max": np.maximum,
          "min": np.minimum}


def np_scatter_elements(data, indices, updates, axis, reduction):
    out = data.copy()
    for u in np.ndindex(indices.shape):
        dst = list(u)
        dst[axis] = int(indices[u])
        out[tuple(dst)] = REDUCE[reduction](out[tuple(dst)], updates[u])
    return out


def np_scatter_nd(data, indices, updates, reduction):
    out = data.copy()
    for q in np.ndindex(indices.shape[:-1]):
        dst = tuple(int(i) for i in indices[q])
        out[dst] = REDUCE[reduction](out[dst], updates[q])
    return out


# ---------------------------------------------------------------------------------------------
# declarations and inference
# ---------------------------------------------------------------------------------------------
def test_declarations():
    for name, pattern in (("gather_elements", OpPattern.INJECTIVE),
                          ("gather_nd", OpPattern.INJECTIVE),
                          ("scatter_elements", OpPattern.OPAQUE),
                          ("scatter_nd", OpPattern.OPAQUE)):
        d = get_op_def(name)
        assert d.pattern == pattern and lookup_schedule(d.name, "c") is not None
        assert callable(d.gradient)  # rules checked in test_op_gradients.py
    assert get_op_def("scatter_nd").legalize is not None


def test_inference():
    x = tvar("x", (3, 4, 5))
    assert dims(infer(op.gather_elements(x, tvar("i", (3, 2, 5), "int64"), axis=1))) == (3, 2, 5)
    assert dims(infer(op.gather_nd(x, tvar("i", (6, 2), "int32")))) == (6, 5)
    assert dims(infer(op.gather_nd(x, tvar("i", (3, 7, 1), "int64"), batch_dims=1))) == (3, 7, 5)
    s = infer(op.scatter_elements(x, tvar("i", (1, 2, 5), "int64"), tvar("u", (1, 2, 5)),
                                  axis=-1, reduction="max"))
    assert dims(s) == (3, 4, 5) and s.dtype == "float32"
    assert dims(infer(op.scatter_nd(x, tvar("i", (2, 2), "int64"), tvar("u", (2, 5))))) == (3, 4, 5)


def test_inference_errors():
    x = tvar("x", (3, 4))
    with pytest.raises(StructInfoError, match="gather_elements.*integer"):
        infer(op.gather_elements(x, tvar("i", (3, 4)), axis=0))
    with pytest.raises(StructInfoError, match="gather_elements.*same rank"):
        infer(op.gather_elements(x, tvar("i", (3,), "int64")))
    with pytest.raises(StructInfoError, match="gather_elements.*axis"):
        infer(op.gather_elements(x, tvar("i", (3, 4), "int64"), axis=2))
    with pytest.raises(StructInfoError, match="gather_nd.*does not fit"):
        infer(op.gather_nd(x, tvar("i", (2, 3), "int64")))
    with pytest.raises(StructInfoError, match="scatter_elements.*same shape"):
        infer(op.scatter_elements(x, tvar("i", (2, 4), "int64"), tvar("u", (2, 3))))
    with pytest.raises(StructInfoError, match="scatter_elements.*dtype"):
        infer(op.scatter_elements(x, tvar("i", (2, 4), "int64"), tvar("u", (2, 4), "float64")))
    with pytest.raises(StructInfoError, match="scatter_nd: updates must have shape"):
        infer(op.scatter_nd(x, tvar("i", (2, 1), "int64"), tvar("u", (2, 3))))
    b = tvar("b", (3, 4), "bool")
    with pytest.raises(StructInfoError, match="scatter_elements: reduction 'add'.*bool"):
        infer(op.scatter_elements(b, tvar("i", (2, 4), "int64"), tvar("u", (2, 4), "bool"),
                                  reduction="add"))
    with pytest.raises(KilnError, match="scatter_nd: reduction"):
        op.scatter_nd(x, tvar("i", (2, 1), "int64"), tvar("u", (2, 4)), reduction="sum")


def test_scatter_loop_program_is_sequential_after_a_copy():
    func = scatter_prim_func("scatter_nd", (4, 3), (2, 1), (2, 3), "float32", "int64", "add",
                             lambda us, ib, yb: ([], [ib.load((us[0], 0)), us[1]], []))
    text = func.script()
    copy, scatter = text.index('block("scatter_nd_copy")'), text.index('block("scatter_nd")')
    assert copy < scatter
    # without independent lines the update block has no iteration variables: one serial walk
    assert "axis.spatial" not in text[scatter:]
    func = scatter_prim_func("scatter_nd", (4, 3), (2, 1), (2, 3), "float32", "int64", "add",
                             lambda us, ib, yb: ([], [ib.load((us[0], 0)), us[1]], []),
                             lines=[1], y_line_axes=[1])
    text = func.script()
    body = text[text.index('block("scatter_nd")'):]
    assert body.count("axis.spatial") == 1 and "for s0 in range(2)" in body


# ---------------------------------------------------------------------------------------------
# numerics: every case in one graph function, one build
# ---------------------------------------------------------------------------------------------
def _run(cases):
    """Build one function computing every ``(fn, inputs, attrs)`` case; return the results."""
    params, arrays = [], []
    bb = g.BlockBuilder()

    def var(a):
        v = g.Var(f"p{len(params)}", g.TensorStructInfo(a.shape, a.dtype.name))
        params.append(v)
        arrays.append(a)
        return v

    calls = [(fn, [var(a) for a in inputs], attrs) for fn, inputs, attrs in cases]
    with bb.function("main", params):
        with bb.dataflow():
            outs = [bb.emit_output(fn(*vs, **attrs)) for fn, vs, attrs in calls]
        bb.emit_func_output(g.Tuple(tuple(outs)))
    return kiln.build(bb.get())(*arrays)


def _f(*shape, dtype="float32"):
    return RNG.standard_normal(shape).astype(dtype)


def test_numerics_against_numpy():
    data = _f(3, 4, 5)
    ge_idx = RNG.integers(-4, 4, (3, 6, 5))  # longer than the axis, negative entries
    ge_idx0 = RNG.integers(0, 3, (2, 4, 5)).astype("int32")
    nd_idx = np.array([[0, 1], [2, -1], [1, 3]])
    nd_b1 = RNG.integers(-4, 4, (3, 2, 1))
    se_idx = RNG.integers(-5, 5, (3, 4, 3))  # repeated positions along the last axis
    se_upd = _f(3, 4, 3)
    sn_idx = np.array([[1], [0], [1], [-1]])  # row 1 updated twice
    sn_upd = _f(4, 4, 5)
    ints = RNG.integers(-9, 9, (4, 3)).astype("int32")
    int_idx = np.array([[0, 2, 2], [3, 0, 0]])
    int_upd = RNG.integers(-9, 9, (2, 3)).astype("int32")
    bools = RNG.random((2, 3)) < 0.5
    cases = [
        (op.gather_elements, [data, ge_idx], {"axis": 1}),
        (op.gather_elements, [data, ge_idx0], {"axis": 0}),
        (op.gather_nd, [data, nd_idx], {}),
        (op.gather_nd, [data, nd_b1], {"batch_dims": 1}),
        *[(op.scatter_elements, [data, se_idx, se_upd], {"axis": -1, "reduction": r})
          for r in REDUCE],
        *[(op.scatter_nd, [data, sn_idx, sn_upd], {"reduction": r}) for r in REDUCE],
        (op.scatter_elements, [ints, int_idx, int_upd], {"axis": 0, "reduction": "add"}),
        (op.scatter_nd, [bools, np.array([[1, 0], [0, 2]]), ~bools[:2, 0]], {"reduction": "max"}),
        (op.gather_elements, [bools, np.array([[1, 0, 1]])], {"axis": 0}),
    ]
    got = _run(cases)
    wrap = lambda i, n: np.where(i < 0, i + n, i)  # noqa: E731
    np.testing.assert_array_equal(got[0], np.take_along_axis(data, wrap(ge_idx, 4), axis=1))
    np.testing.assert_array_equal(got[1], np.take_along_axis(data, ge_idx0, axis=0))
    np.testing.assert_array_equal(got[2], np_gather_nd(data, wrap(nd_idx, np.array([3, 4]))))
    np.testing.assert_array_equal(got[3], np_gather_nd(data, wrap(nd_b1, 4), b=1))
    for k, r in enumerate(REDUCE):
        want = np_scatter_elements(data, wrap(se_idx, 5), se_upd, 2, r)
        np.testing.assert_allclose(got[4 + k], want, rtol=1e-6, err_msg=r)
        want = np_scatter_nd(data, wrap(sn_idx, 3), sn_upd, r)
        np.testing.assert_allclose(got[9 + k], want, rtol=1e-6, err_msg=r)
    np.testing.assert_array_equal(got[14], np_scatter_elements(ints, int_idx, int_upd, 0, "add"))
    want = np_scatter_nd(bools, np.array([[1, 0], [0, 2]]), ~bools[:2, 0], "max")
    np.testing.assert_array_equal(got[15], want)
    np.testing.assert_array_equal(got[16], np.take_along_axis(bools, np.array([[1, 0, 1]]), 0))


@pytest.mark.parametrize("fn,inputs,attrs,bad", [
    (op.gather_elements, [_f(2, 3), np.array([[2, -3, 1]])], {"axis": 1}, (0, 7)),
    (op.gather_nd, [_f(2, 3), np.array([[1, 2], [0, -3]])], {}, (1, -4)),
    (op.scatter_elements, [_f(2, 3), np.array([[1, -2, 0]]), np.ones((1, 3), "float32")],
     {"axis": 1}, (1, -4)),
    (op.scatter_nd, [_f(2, 3), np.array([[1], [0]]), np.zeros((2, 3), "float32")], {},
     (0, 2)),
    (op.take, [_f(2, 3), np.array([1, -2])], {"axis": 0, "mode": "raise"}, (1, 2)),
])
def test_out_of_range_indices_fail_the_run(fn, inputs, attrs, bad):
    """An index outside [-n, n) fails the kernel with the index (ONNX leaves it undefined,
    onnxruntime raises); kiln never reads or writes outside a buffer."""
    got = _run([(fn, inputs, attrs)])[0]
    assert got.shape
    arrays = [a.copy() for a in inputs]
    pos, value = bad
    arrays[1].reshape(-1)[pos] = value
    with pytest.raises(RuntimeCheckError, match=rf"index {value} is out of range"):
        _run([(fn, arrays, attrs)])


def test_parallel_lines_keep_repeated_updates_exact():
    """Large enough for the schedule to run update lines in parallel; every line repeats
    indices, so a race between lines or within one would change the sums."""
    data = _f(16, 64, 32)
    idx = RNG.integers(0, 8, (16, 48, 32))  # 48 updates into 8 slots per line
    upd = RNG.integers(-4, 4, (16, 48, 32)).astype("float32")  # exact sums in any order
    nd_idx = RNG.integers(0, 4, (40, 2))  # 40 slices into 4 x 4 slots: many repeats
    nd_upd = RNG.integers(-4, 4, (40, 32)).astype("float32")
    got = _run([
        (op.scatter_elements, [data, idx, upd], {"axis": 1, "reduction": "add"}),
        (op.scatter_elements, [data, idx, upd], {"axis": 1, "reduction": "max"}),
        (op.scatter_nd, [data[:, :, :32], nd_idx, nd_upd], {"reduction": "add"}),
    ])
    b, c = np.meshgrid(np.arange(16), np.arange(32), indexing="ij")
    b, c = np.broadcast_to(b[:, None], idx.shape), np.broadcast_to(c[:, None], idx.shape)
    for out, ufunc in ((got[0], np.add), (got[1], np.maximum)):
        want = data.copy()
        ufunc.at(want, (b, idx, c), upd)
        np.testing.assert_array_equal(out, want)
    want = data.copy()
    np.add.at(want, (nd_idx[:, 0], nd_idx[:, 1]), nd_upd)
    np.testing.assert_array_equal(got[2], want)


def test_symbolic_dimensions():
    """One compiled function serves every length of a symbolic axis (gather and scatter)."""
    n = tir.Var("n", "int64")
    d, i, u = tvar("d", (n, 4)), tvar("i", (n, 2), "int64"), tvar("u", (n, 2))
    bb = g.BlockBuilder()
    with bb.function("main", [d, i, u]):
        with bb.dataflow():
            a = bb.emit_output(op.gather_elements(d, i, axis=1))
            b = bb.emit_output(op.scatter_elements(d, i, u, axis=1, reduction="add"))
        bb.emit_func_output(g.Tuple((a, b)))
    exe = kiln.build(bb.get())
    for rows in (3, 7):
        data, idx, upd = _f(rows, 4), RNG.integers(0, 4, (rows, 2)), _f(rows, 2)
        got_a, got_b = exe(data, idx, upd)
        np.testing.assert_array_equal(got_a, np.take_along_axis(data, idx, 1))
        np.testing.assert_allclose(got_b, np_scatter_elements(data, idx, upd, 1, "add"),
                                   rtol=1e-6)
