"""Reductions: StructInfo inference, declarations, and numerics against numpy."""

from __future__ import annotations

import numpy as np
import pytest

from kiln import op, te, tir
from kiln.graph.block_builder import BlockBuilder
from kiln.ir.errors import KilnError, StructInfoError
from kiln.op.registry import NON_DIFFERENTIABLE, MixedPrecision, OpPattern, get_op_def
from kiln.schedule import lookup_schedule
from kiln.target import Target
from kiln.testing.op_testing import dims, infer, run_cases, tvar

TARGET = Target("c")
RNG = np.random.default_rng(1)


# ---------------------------------------------------------------------------------------------
# inference
# ---------------------------------------------------------------------------------------------
@pytest.mark.parametrize(
    "axis, keepdims, expected",
    [
        (None, False, ()),
        (None, True, (1, 1, 1)),
        (1, False, (2, 4)),
        (-1, True, (2, 3, 1)),
        ((0, -1), False, (3,)),
        ((2, 0), True, (1, 3, 1)),
        ((), False, (2, 3, 4)),
    ],
)
def test_reduce_shapes(axis, keepdims, expected):
    for f in (op.sum, op.mean, op.max, op.min, op.prod):
        s = infer(f(tvar("x", (2, 3, 4)), axis=axis, keepdims=keepdims))
        assert dims(s) == expected and s.dtype == "float32"


def test_reduce_dtypes():
    b = tvar("b", (3, 4), "bool")
    i = tvar("i", (3, 4), "int32")
    assert infer(op.sum(b)).dtype == "int64"
    assert infer(op.max(b, 0)).dtype == "bool"
    assert infer(op.sum(i, 1)).dtype == "int32"
    assert infer(op.mean(i, 1)).dtype == "int32"
    assert infer(op.argmax(i, 1)).dtype == "int64"
    assert dims(infer(op.argmin(i, axis=-1, keepdims=True))) == (3, 1)
    assert dims(infer(op.argmax(i))) == ()
    assert dims(infer(op.argmax(i, keepdims=True))) == (1, 1)
    with pytest.raises(StructInfoError, match="mean: x must be a numeric tensor"):
        infer(op.mean(b))


def test_reduce_symbolic_and_unknown():
    n = tir.Var("n", "int64")
    s = infer(op.sum(tvar("x", (n, 8)), axis=-1))
    assert s.shape[0] is n and len(s.shape) == 1
    s = infer(op.max(tvar("x", None, ndim=3), axis=1))
    assert s.shape is None and s.ndim == 2
    s = infer(op.sum(tvar("x", None, ndim=-1)))
    assert dims(s) == ()
    s = infer(op.sum(tvar("x", None, ndim=-1), axis=0))
    assert s.shape is None and s.ndim == -1


def test_reduce_errors():
    x = tvar("x", (2, 3))
    with pytest.raises(StructInfoError, match="sum: axis=2 is out of range for a 2-d tensor"):
        infer(op.sum(x, 2))
    with pytest.raises(StructInfoError, match="max: axis .* names the same dimension twice"):
        infer(op.max(x, (1, -1)))
    with pytest.raises(StructInfoError, match="argmax: axis=-3 is out of range"):
        infer(op.argmax(x, -3))
    with pytest.raises(KilnError, match="argmax/argmin axis must be an int or None"):
        op.argmax(x, (0, 1))
    with pytest.raises(KilnError, match="keepdims must be a bool"):
        op.sum(x, 0, 1)


def test_declarations():
    for name in ("sum", "mean", "max", "min", "prod", "argmax", "argmin"):
        d = get_op_def(name)
        assert d.pattern == OpPattern.COMM_REDUCE and lookup_schedule(d.name, "c") is not None
        assert getattr(op, name) is d
    assert get_op_def("sum").mixed_precision == MixedPrecision.NEVER
    assert get_op_def("mean").mixed_precision == MixedPrecision.NEVER
    assert get_op_def("max").mixed_precision == MixedPrecision.FOLLOW
    assert get_op_def("argmax").gradient is NON_DIFFERENTIABLE
    assert callable(get_op_def("sum").gradient)  # checked in test_op_gradients.py


# ---------------------------------------------------------------------------------------------
# numerics
# ---------------------------------------------------------------------------------------------
AXES = [None, 0, -1, (0, 2), 1, ()]


def test_float_reductions():
    x = RNG.uniform(-2, 2, size=(5, 7, 13)).astype(np.float32)
    small = RNG.uniform(0.5, 1.5, size=(3, 4, 5)).astype(np.float32)
    cases, refs = [], []
    for name, ref in (("sum", np.sum), ("mean", np.mean), ("max", np.max), ("min", np.min)):
        for axis in AXES:
            for keepdims in (False, True):
                cases.append((name, [x], {"axis": axis, "keepdims": keepdims}))
                refs.append(ref(x.astype(np.float64), axis=axis, keepdims=keepdims))
    for axis in (None, 1, (0, -1)):
        cases.append(("prod", [small], {"axis": axis}))
        refs.append(np.prod(small.astype(np.float64), axis=axis))
    for (name, _, attrs), got, want in zip(cases, run_cases(cases), refs):
        assert got.dtype == np.float32 and got.shape == np.shape(want), (name, attrs)
        np.testing.assert_allclose(got, want, rtol=1e-5, atol=2e-5, err_msg=f"{name} {attrs}")


def test_int_and_bool_reductions():
    xi = RNG.integers(-9, 10, size=(4, 6, 3)).astype(np.int32)
    xb = RNG.random((5, 9)) < 0.4
    cases = [
        ("sum", [xi], {"axis": 1}),
        ("sum", [xi], {}),
        ("prod", [xi[:, :3, :2]], {"axis": (1, 2)}),
        ("max", [xi], {"axis": -1, "keepdims": True}),
        ("min", [xi], {"axis": (0, 1)}),
        ("mean", [xi], {"axis": 1}),
        ("sum", [xb], {"axis": 1}),
        ("max", [xb], {"axis": 0}),
        ("min", [xb], {"axis": 0}),
    ]
    expected = [
        xi.sum(axis=1, dtype=np.int32),
        np.asarray(xi.sum(dtype=np.int32)),
        xi[:, :3, :2].prod(axis=(1, 2), dtype=np.int32),
        xi.max(axis=-1, keepdims=True),
        xi.min(axis=(0, 1)),
        np.floor_divide(xi.sum(axis=1), 6).astype(np.int32),
        xb.sum(axis=1),
        xb.max(axis=0),
        xb.min(axis=0),
    ]
    for (name, _, attrs), got, want in zip(cases, run_cases(cases), expected):
        assert got.dtype == want.dtype, (name, attrs)
        np.testing.assert_array_equal(got, want, err_msg=f"{name} {attrs}")


def test_argmax_argmin_first_occurrence():
    # few distinct values so ties are common: numpy returns the first occurrence
    x = RNG.integers(0, 3, size=(6, 5, 7)).astype(np.float32)
    xi = RNG.integers(-2, 2, size=(9, 4)).astype(np.int64)
    cases, refs = [], []
    for name, ref in (("argmax", np.argmax), ("argmin", np.argmin)):
        for axis in (None, 0, 1, -1):
            for keepdims in (False, True):
                cases.append((name, [x], {"axis": axis, "keepdims": keepdims}))
                refs.append(ref(x, axis=axis, keepdims=keepdims))
        cases.append((name, [xi], {"axis": 0}))
        refs.append(ref(xi, axis=0))
    for (name, _, attrs), got, want in zip(cases, run_cases(cases), refs):
        assert got.dtype == np.int64 and got.shape == np.shape(want), (name, attrs)
        np.testing.assert_array_equal(got, want, err_msg=f"{name} {attrs}")


def test_float16_sum_accumulates_in_float32():
    x = np.full((4, 4096), 0.1, np.float16)
    (got,) = run_cases([("sum", [x], {"axis": 1})])
    assert got.dtype == np.float16
    # accumulating in float16 would stall far below the true value (~409.5)
    np.testing.assert_allclose(got.astype(np.float32), x.astype(np.float32).sum(axis=1),
                               rtol=2e-3)


def test_column_reductions():
    # innermost axis kept and a multiple of the vector width: the vectorized column schedule
    x = RNG.uniform(-2, 2, size=(6, 5, 16)).astype(np.float32)
    xi = RNG.integers(-9, 10, size=(7, 32)).astype(np.int32)
    cases = [
        ("sum", [x], {"axis": 0}),
        ("sum", [x], {"axis": (0, 1)}),
        ("mean", [x], {"axis": 1}),
        ("max", [x], {"axis": 0, "keepdims": True}),
        ("min", [x], {"axis": -2}),
        ("argmax", [x.round()], {"axis": 0}),
        ("sum", [xi], {"axis": 0}),
        ("max", [xi], {"axis": 0}),
    ]
    expected = [
        x.sum(axis=0), x.sum(axis=(0, 1)), x.mean(axis=1), x.max(axis=0, keepdims=True),
        x.min(axis=-2), np.argmax(x.round(), axis=0), xi.sum(axis=0, dtype=np.int32),
        xi.max(axis=0),
    ]
    for (name, _, attrs), got, want in zip(cases, run_cases(cases), expected):
        assert got.dtype == want.dtype and got.shape == want.shape, (name, attrs)
        np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-5, err_msg=f"{name} {attrs}")


def _schedule_kinds(shape, axis):
    from kiln.tir.schedule import Schedule

    x = te.placeholder(shape, "float32", name="x")
    opdef = get_op_def("sum")
    out = opdef.compute(x, attrs=opdef.make_attrs(axis=axis))
    sch = Schedule(te.create_prim_func([x, out]))
    lookup_schedule(opdef.name, "c")(sch, TARGET)
    found = []
    tir.post_order_visit(sch.func.body, lambda n: found.append(n.kind)
                         if isinstance(n, tir.For) else None)
    return found


def test_reduction_schedule():
    assert tir.ForKind.PARALLEL in _schedule_kinds((256, 512), 1)
    assert tir.ForKind.PARALLEL not in _schedule_kinds((4, 8), 1)
    assert tir.ForKind.PARALLEL not in _schedule_kinds((256, 512), None)  # full: serial
    # reducing a non-contiguous axis vectorizes the contiguous output axis
    assert tir.ForKind.VECTORIZED in _schedule_kinds((64, 32), 0)
    assert tir.ForKind.VECTORIZED not in _schedule_kinds((64, 32), 1)
    n = te.size_var("n")
    assert tir.ForKind.PARALLEL in _schedule_kinds((n, 32), 1)


def test_graph_end_to_end_symbolic():
    import kiln

    n = tir.Var("n", "int64")
    x = tvar("x", (n, 16))
    bb = BlockBuilder()
    with bb.function("main", [x]):
        with bb.dataflow():
            m = bb.emit(op.mean(x, axis=0, keepdims=True))
            c = bb.emit(op.subtract(x, m))
            s = bb.emit(op.sum(op.multiply(c, c), axis=-1))
            a = bb.emit(op.argmax(x, axis=1))
            gv = bb.emit_output((s, a))
        bb.emit_func_output(gv)
    exe = kiln.build(bb.get(), "c")
    for rows in (3, 9):
        xv = RNG.standard_normal((rows, 16)).astype(np.float32)
        got_s, got_a = exe(xv)
        c = xv - xv.mean(axis=0, keepdims=True)
        np.testing.assert_allclose(got_s, (c * c).sum(axis=-1), rtol=1e-5, atol=1e-5)
        np.testing.assert_array_equal(got_a, xv.argmax(axis=1))
