"""Element-wise operators: StructInfo inference, declarations, and numerics against numpy.

Numeric cases are compiled in batches (one C module per test) through the op's own compute and
CPU schedule: te -> PrimFunc -> Schedule -> C.
"""

from __future__ import annotations

import math

import numpy as np
import pytest

from kiln import op, te, tir
from kiln.graph.block_builder import BlockBuilder
from kiln.ir.errors import KilnError, StructInfoError
from kiln.op.registry import NON_DIFFERENTIABLE, MixedPrecision, OpPattern, get_op_def
from kiln.schedule import lookup_schedule
from kiln.target import Target
from kiln.testing.op_testing import dims, infer, make_rand, run_cases, tvar

TARGET = Target("c")
RNG = np.random.default_rng(0)


# ---------------------------------------------------------------------------------------------
# helpers
# ---------------------------------------------------------------------------------------------
rand = make_rand(RNG, -3.0, 3.0)


_erf = np.vectorize(math.erf)


def np_gelu(x, approximate="none"):
    x64 = x.astype(np.float64)
    if approximate == "tanh":
        r = 0.5 * x64 * (1 + np.tanh(math.sqrt(2 / math.pi) * (x64 + 0.044715 * x64**3)))
    else:
        r = 0.5 * x64 * (1 + _erf(x64 / math.sqrt(2)))
    return r.astype(x.dtype)


# ---------------------------------------------------------------------------------------------
# inference
# ---------------------------------------------------------------------------------------------
@pytest.mark.parametrize(
    "a, b, expected",
    [
        ((3, 4), (4,), (3, 4)),
        ((4, 1, 3), (2, 1), (4, 2, 3)),
        ((), (5,), (5,)),
        ((2, 3, 4, 5), (2, 1, 4, 1), (2, 3, 4, 5)),
        ((1,), (1, 1), (1, 1)),
        ((0, 3), (1, 3), (0, 3)),
    ],
)
def test_broadcast_inference(a, b, expected):
    s = infer(op.add(tvar("a", a), tvar("b", b)))
    assert dims(s) == expected and s.dtype == "float32"


def test_broadcast_symbolic():
    n, m = tir.Var("n", "int64"), tir.Var("m", "int64")
    s = infer(op.multiply(tvar("a", (n, 1, 4)), tvar("b", (m, 4))))
    assert len(s.shape) == 3 and s.shape[0] is n and s.shape[1] is m and dims(s)[2] == 4
    # same symbol on both sides
    s = infer(op.add(tvar("a", (n, 4)), tvar("b", (n, 1))))
    assert s.shape[0] is n
    # distinct symbols: the dim the result has at run time (the kernel checks that they fit)
    s = infer(op.add(tvar("a", (n, 4)), tvar("b", (m, 4))))
    assert isinstance(s.shape[0], tir.Max) and dims(s)[1] == 4
    # a symbol against a constant: the constant (the symbol must be 1 or equal to it)
    s = infer(op.add(tvar("a", (n, 4)), tvar("b", (5, 4))))
    assert dims(s) == (5, 4)
    # a constant mismatch is still an error next to an undecidable axis
    with pytest.raises(StructInfoError, match="add: shapes .* do not broadcast"):
        infer(op.add(tvar("a", (n, 4)), tvar("b", (m, 5))))


def test_unknown_shape_inference():
    s = infer(op.add(tvar("a", None, ndim=3), tvar("b", (4,))))
    assert s.shape is None and s.ndim == 3
    s = infer(op.exp(tvar("a", None, ndim=-1)))
    assert s.shape is None and s.ndim == -1


def test_broadcast_error_names_op_and_shapes():
    msg = r"subtract: shapes \(3, 4\) and \(5, 4\) do not broadcast"
    with pytest.raises(StructInfoError, match=msg):
        infer(op.subtract(tvar("a", (3, 4)), tvar("b", (5, 4))))


def test_dtype_errors():
    with pytest.raises(StructInfoError, match="add: lhs has dtype float32 but rhs has dtype int32"):
        infer(op.add(tvar("a", (3,)), tvar("b", (3,), "int32")))
    with pytest.raises(StructInfoError, match="exp: x must be a float tensor, got dtype int32"):
        infer(op.exp(tvar("a", (3,), "int32")))
    with pytest.raises(StructInfoError, match="logical_and: lhs must be a bool tensor"):
        infer(op.logical_and(tvar("a", (3,)), tvar("b", (3,))))
    with pytest.raises(StructInfoError, match="where: condition must be a bool tensor"):
        infer(op.where(tvar("c", (3,)), tvar("a", (3,)), tvar("b", (3,))))
    with pytest.raises(StructInfoError, match="where: x has dtype float32 but y has dtype int8"):
        infer(op.where(tvar("c", (3,), "bool"), tvar("a", (3,)), tvar("b", (3,), "int8")))
    with pytest.raises(StructInfoError, match="relu: x must be a numeric"):
        infer(op.relu(tvar("a", (3,), "bool")))


def test_output_dtypes():
    a, b = tvar("a", (2, 3)), tvar("b", (3,))
    for f in (op.equal, op.not_equal, op.less, op.less_equal, op.greater, op.greater_equal):
        assert infer(f(a, b)).dtype == "bool"
    assert infer(op.cast(a, "int8")).dtype == "int8"
    assert infer(op.cast(a, dtype="bool")).dtype == "bool"
    s = infer(op.where(tvar("c", (4, 1, 1), "bool"), a, b))
    assert dims(s) == (4, 2, 3) and s.dtype == "float32"
    assert infer(op.logical_not(tvar("c", (2,), "bool"))).dtype == "bool"


def test_attr_validation():
    x = tvar("a", (3,))
    with pytest.raises(KilnError, match="approximate"):
        op.gelu(x, approximate="fast")
    with pytest.raises(KilnError, match="clip: min 2.0 is greater than max 1.0"):
        op.clip(x, 2.0, 1.0)
    with pytest.raises(KilnError, match="cast: bad dtype"):
        op.cast(x, "float33")
    assert op.cast(x, np.float16).attrs.dtype == "float16"
    with pytest.raises(KilnError, match="takes no attributes"):
        op.exp(x, 1)


def test_declarations():
    assert get_op_def("add").pattern == OpPattern.BROADCAST
    assert get_op_def("exp").pattern == OpPattern.ELEMWISE
    assert get_op_def("where").pattern == OpPattern.BROADCAST
    assert get_op_def("add").mixed_precision == MixedPrecision.FOLLOW
    assert get_op_def("cast").mixed_precision == MixedPrecision.NEVER
    for name in ("equal", "less", "greater_equal", "logical_and", "logical_not"):
        assert get_op_def(name).gradient is NON_DIFFERENTIABLE
        assert get_op_def(name).mixed_precision == MixedPrecision.NEVER
    assert callable(get_op_def("exp").gradient)  # checked in test_op_gradients.py
    for name in op.elementwise.__all__:
        assert lookup_schedule(name, "c") is not None
        assert getattr(op, name) is get_op_def(name)


# ---------------------------------------------------------------------------------------------
# numerics
# ---------------------------------------------------------------------------------------------
UNARY = {
    "negative": (np.negative, -3, 3),
    "abs": (np.abs, -3, 3),
    "exp": (np.exp, -4, 4),
    "log": (np.log, 0.05, 5),
    "sqrt": (np.sqrt, 0, 5),
    "rsqrt": (lambda x: 1 / np.sqrt(x), 0.05, 5),
    "tanh": (np.tanh, -4, 4),
    "sigmoid": (lambda x: 1 / (1 + np.exp(-x.astype(np.float64))), -8, 8),
    "erf": (_erf, -3, 3),
    "sin": (np.sin, -4, 4),
    "cos": (np.cos, -4, 4),
    "floor": (np.floor, -4, 4),
    "ceil": (np.ceil, -4, 4),
    "relu": (lambda x: np.maximum(x, 0), -3, 3),
    "silu": (lambda x: x / (1 + np.exp(-x.astype(np.float64))), -6, 6),
}


def test_unary_float32():
    shapes = [(7, 13), (64,), (2, 3, 4, 16), ()]
    cases, refs = [], []
    for name, (ref, lo, hi) in UNARY.items():
        for shape in shapes:
            x = rand(shape, "float32", lo, hi)
            cases.append((name, [x], {}))
            refs.append((name, ref(x)))
    for (name, ref), got in zip(refs, run_cases(cases)):
        np.testing.assert_allclose(got, np.asarray(ref, np.float32), rtol=2e-6, atol=2e-6,
                                   err_msg=name)


def test_unary_misc():
    x = rand((5, 17), "float32", -4, 4)
    halves = np.array([-3.5, -2.5, -1.5, -0.5, 0.5, 1.5, 2.5, 3.5, 0.49999997, -0.49999997,
                       2.7, -2.7, 0.0, 1e7 + 1, -1e7 - 1, 8388609.0], np.float32)
    xi = rand((4, 9), "int32", -50, 50)
    xb = rand((3, 8), "bool")
    cases = [
        ("round", [halves], {}),
        ("gelu", [x], {}),
        ("gelu", [x], {"approximate": "tanh"}),
        ("clip", [x], {"min": -1.0, "max": 2.5}),
        ("clip", [x], {"max": 0.5}),
        ("clip", [xi], {"min": -7.5, "max": 20.2}),
        ("negative", [xi], {}),
        ("abs", [xi], {}),
        ("relu", [xi], {}),
        ("logical_not", [xb], {}),
        ("exp", [x.astype(np.float64)], {}),
    ]
    expected = [
        np.round(halves),
        np_gelu(x),
        np_gelu(x, "tanh"),
        np.clip(x, -1.0, 2.5),
        np.minimum(x, 0.5),
        np.clip(xi, -7, 20),
        -xi,
        np.abs(xi),
        np.maximum(xi, 0),
        ~xb,
        np.exp(x.astype(np.float64)),
    ]
    for (name, _, _), got, want in zip(cases, run_cases(cases), expected):
        assert got.dtype == want.dtype, name
        np.testing.assert_allclose(got, want, rtol=1e-6, atol=1e-6, err_msg=name)


BROADCAST_SHAPES = [
    ((7, 13), (13,)), ((4, 1, 3), (2, 1)), ((), (5,)), ((2, 3, 4, 16), (2, 1, 4, 1)),
]


def test_binary_float():
    ops = {
        "add": np.add, "subtract": np.subtract, "multiply": np.multiply, "divide": np.divide,
        "maximum": np.maximum, "minimum": np.minimum, "floor_divide": np.floor_divide,
        "mod": np.mod,
    }
    cases, refs = [], []
    for name, ref in ops.items():
        for sa, sb in BROADCAST_SHAPES:
            a = rand(sa, "float32", -5, 5)
            b = rand(sb, "float32", 0.5, 3) * RNG.choice([-1, 1], size=sb).astype(np.float32)
            cases.append((name, [a, b], {}))
            refs.append(ref(a, b))
    a, b = rand((6, 5), "float32", 0.1, 3), rand((5,), "float32", -2, 2)
    cases.append(("power", [a, b], {}))
    refs.append(np.power(a, b))
    for (name, *_), got, want in zip(cases, run_cases(cases), refs):
        assert got.shape == want.shape, name
        # floor-based ops may legitimately differ by one period right at a boundary
        np.testing.assert_allclose(got, want, rtol=2e-6, atol=2e-5, err_msg=name)


def test_binary_int_semantics():
    a = np.array([7, -7, 7, -7, 0, 5, -2147483648, 3, -3, 9], np.int32)
    b = np.array([2, 2, -2, -2, 3, 0, -1, 1, 0, -1], np.int32)
    ua = np.array([7, 200, 0, 255], np.uint8)
    ub = np.array([2, 7, 0, 0], np.uint8)
    with np.errstate(all="ignore"):
        expected = [
            np.floor_divide(a, b), np.floor_divide(a, b), np.mod(a, b),
            np.floor_divide(ua, ub), np.mod(ua, ub),
            a + b, a - b, a * b, np.maximum(a, b), np.minimum(a, b),
        ]
    cases = [
        ("divide", [a, b], {}), ("floor_divide", [a, b], {}), ("mod", [a, b], {}),
        ("floor_divide", [ua, ub], {}), ("mod", [ua, ub], {}),
        ("add", [a, b], {}), ("subtract", [a, b], {}), ("multiply", [a, b], {}),
        ("maximum", [a, b], {}), ("minimum", [a, b], {}),
    ]
    base = np.array([2, -3, 5, 0, 1, 7], np.int64)
    exp_ = np.array([10, 3, 2, 5, 0, 1], np.int64)
    cases.append(("power", [base, exp_], {}))
    expected.append(base**exp_)
    for (name, *_), got, want in zip(cases, run_cases(cases), expected):
        assert got.dtype == want.dtype, name
        np.testing.assert_array_equal(got, want, err_msg=name)


def test_compare_and_logic():
    cases, refs = [], []
    cmp = {"equal": np.equal, "not_equal": np.not_equal, "less": np.less,
           "less_equal": np.less_equal, "greater": np.greater, "greater_equal": np.greater_equal}
    for name, ref in cmp.items():
        for dt in ("float32", "int64"):
            a = rand((5, 8), dt, -2, 2).round()
            b = rand((8,), dt, -2, 2).round()
            cases.append((name, [a, b], {}))
            refs.append(ref(a, b))
    p, q = rand((3, 1, 8), "bool"), rand((4, 8), "bool")
    cases += [("logical_and", [p, q], {}), ("logical_or", [p, q], {})]
    refs += [p & q, p | q]
    for (name, *_), got, want in zip(cases, run_cases(cases), refs):
        assert got.dtype == np.bool_, name
        np.testing.assert_array_equal(got, want, err_msg=name)


def test_where_and_cast():
    cond = rand((4, 1, 6), "bool")
    x, y = rand((3, 6)), rand((6,))
    f = np.array([-2.7, -0.5, 0.0, 0.4, 1.9, 300.0], np.float32)
    i = np.array([-3, 0, 1, 2, 127, -128], np.int8)
    cases = [
        ("where", [cond, x, y], {}),
        ("cast", [f], {"dtype": "int32"}),
        ("cast", [f], {"dtype": "bool"}),
        ("cast", [f], {"dtype": "float64"}),
        ("cast", [i], {"dtype": "float32"}),
        ("cast", [i], {"dtype": "int64"}),
        ("cast", [i > 0], {"dtype": "float32"}),
    ]
    expected = [
        np.where(cond, x, y), f.astype(np.int32), f.astype(bool), f.astype(np.float64),
        i.astype(np.float32), i.astype(np.int64), (i > 0).astype(np.float32),
    ]
    for (name, *_), got, want in zip(cases, run_cases(cases), expected):
        assert got.dtype == want.dtype and got.shape == want.shape, name
        np.testing.assert_array_equal(got, want, err_msg=name)


def test_float16_math_roundtrip():
    x = rand((4, 16), "float16", -3, 3)
    got_exp, got_add, got_gelu = run_cases(
        [("exp", [x], {}), ("add", [x, x], {}), ("gelu", [x], {})]
    )
    assert got_exp.dtype == np.float16
    np.testing.assert_allclose(got_exp, np.exp(x.astype(np.float32)).astype(np.float16),
                               rtol=1e-3)
    np.testing.assert_array_equal(got_add, x + x)
    np.testing.assert_allclose(got_gelu, np_gelu(x.astype(np.float32)).astype(np.float16),
                               rtol=2e-3, atol=1e-3)


# ---------------------------------------------------------------------------------------------
# schedule
# ---------------------------------------------------------------------------------------------
def _loop_kinds(func):
    kinds = []
    tir.post_order_visit(func.body, lambda n: kinds.append(n.kind) if isinstance(n, tir.For)
                         else None)
    return kinds


def _scheduled(name, shapes, dtype="float32"):
    from kiln.tir.schedule import Schedule

    opdef = get_op_def(name)
    phs = [te.placeholder(s, dtype, name=f"in{k}") for k, s in enumerate(shapes)]
    out = opdef.compute(*phs, attrs=None)
    sch = Schedule(te.create_prim_func([*phs, out]))
    lookup_schedule(opdef.name, "c")(sch, TARGET)
    return sch.func


def test_injective_schedule_shapes():
    lanes = TARGET.vector_lanes("float32")
    kinds = _loop_kinds(_scheduled("add", [(7, lanes * 2), (lanes * 2,)]))
    assert tir.ForKind.VECTORIZED in kinds and tir.ForKind.PARALLEL not in kinds
    kinds = _loop_kinds(_scheduled("add", [(7, 13), (13,)]))
    assert tir.ForKind.VECTORIZED not in kinds
    kinds = _loop_kinds(_scheduled("exp", [(512, 256)]))
    assert tir.ForKind.PARALLEL in kinds and tir.ForKind.VECTORIZED in kinds
    # symbolic: no split/vectorize of an unknown extent, still parallel
    n = te.size_var("n")
    kinds = _loop_kinds(_scheduled("exp", [(n, 13)]))
    assert tir.ForKind.PARALLEL in kinds and tir.ForKind.VECTORIZED not in kinds
    # rank 0 is left alone
    assert _loop_kinds(_scheduled("exp", [()])) == []


def test_graph_end_to_end_symbolic():
    import kiln

    n = tir.Var("n", "int64")
    x, b = tvar("x", (n, 16)), tvar("b", (16,))
    bb = BlockBuilder()
    with bb.function("main", [x, b]):
        with bb.dataflow():
            h = bb.emit(op.gelu(op.add(x, b)))
            mask = bb.emit(op.greater(x, b))
            y = bb.emit(op.where(mask, h, op.negative(op.exp(x))))
            z = bb.emit(op.cast(op.clip(y, -1.0, 1.0), "float16"))
            gv = bb.emit_output((z, mask))
        bb.emit_func_output(gv)
    exe = kiln.build(bb.get(), "c")
    for rows in (1, 6):
        xv, bv = rand((rows, 16)), rand((16,))
        got_z, got_mask = exe(xv, bv)
        want_mask = xv > bv
        want = np.where(want_mask, np_gelu(xv + bv), -np.exp(xv))
        np.testing.assert_array_equal(got_mask, want_mask)
        assert got_z.dtype == np.float16 and got_z.shape == (rows, 16)
        np.testing.assert_allclose(got_z, np.clip(want, -1, 1).astype(np.float16), rtol=1e-3,
                                   atol=1e-6)  # gelu(x << 0) = x * (1 + erf): cancellation


def test_schedule_injective_with_a_symbolic_batch_keeps_inner_loops():
    """A dynamic batch (which may be 1) counts as 1 when choosing the loops the threads share:
    the constant loops after it join the parallel loop until they alone give every thread
    chunks, and the rest stay nested (fusing them all costs a div/mod per element)."""
    from kiln.codegen import c as codegen_c
    from kiln.schedule.cpu.generic import schedule_injective
    from kiln.tir.schedule import Schedule

    n = te.size_var("n")
    a = te.placeholder((n, 3, 64, 64), "float32", name="A")
    b = te.compute((n, 64, 64, 3), lambda i, y, x, c: a[i, c, y, x], name="B")
    sch = Schedule(te.create_prim_func([a, b]))
    schedule_injective(sch, Target("c", num_threads=2))
    loops = []
    tir.post_order_visit(sch.func.body, lambda x: loops.append(x)
                         if isinstance(x, tir.For) else None)
    par = [lp for lp in loops if lp.kind == tir.ForKind.PARALLEL]
    assert len(par) == 1 and str(par[0].extent) == "n * 64"
    assert len(loops) == 3  # the parallel (n, y) loop, x and c nested
    mod = codegen_c.build({"f": sch.func}, TARGET)
    for batch in (1, 2):
        av = rand((batch, 3, 64, 64))
        out = np.empty((batch, 64, 64, 3), np.float32)
        mod["f"](av, out)
        np.testing.assert_array_equal(out, av.transpose(0, 2, 3, 1))


def test_schedule_injective_inlines_intermediate_stages():
    from kiln.codegen import c as codegen_c
    from kiln.schedule.cpu.generic import schedule_injective
    from kiln.tir.schedule import Schedule

    a = te.placeholder((6, 16), "float32", name="A")
    b = te.compute((6, 16), lambda i, j: a[i, j] * 2.0, name="B")
    c = te.compute((6, 16), lambda i, j: tir.exp(b[i, j]) + b[i, j], name="C")
    sch = Schedule(te.create_prim_func([a, c]))
    schedule_injective(sch, TARGET)
    blocks = []
    tir.post_order_visit(sch.func.body, lambda n: blocks.append(n.name_hint)
                         if isinstance(n, tir.Block) else None)
    assert sorted(blocks) == ["C", "root"]
    assert tir.ForKind.VECTORIZED in _loop_kinds(sch.func)
    mod = codegen_c.build({"f": sch.func}, TARGET)
    av, out = rand((6, 16)), np.empty((6, 16), np.float32)
    mod["f"](av, out)
    np.testing.assert_allclose(out, np.exp(2 * av) + 2 * av, rtol=1e-6,
                               atol=1e-6)  # exp(2a) + 2a cancels near a = -0.28


@pytest.mark.parametrize("k, transposed", [(1024, True), (1000, False)])
def test_schedule_injective_transposes_rows_that_conflict_in_l1(k, transposed):
    """Packing a weight into 16-column panels gathers every output vector from 16 rows of
    the input: 4 KiB apart (k = 1024) all 16 lines fall in one L1 set and evict each other,
    so the copy runs with a tile of the contiguous input axis innermost instead; rows whose
    lines spread over the sets (k = 1000) keep the vectorized gather."""
    from kiln.codegen import c as codegen_c
    from kiln.schedule.cpu.generic import _conflicting_rows, schedule_injective
    from kiln.tir.schedule import Schedule

    assert _conflicting_rows(16, 4096) and _conflicting_rows(8, 8192)
    assert not _conflicting_rows(16, 4000) and not _conflicting_rows(3, 4096)
    a = te.placeholder((64, k), "float32", name="A")
    b = te.compute((4, k, 16), lambda jo, kk, jj: a[jo * 16 + jj, kk], name="B")
    sch = Schedule(te.create_prim_func([a, b]))
    schedule_injective(sch, Target("c", num_threads=2))
    loops = []
    tir.post_order_visit(sch.func.body, lambda x: loops.append(x)
                         if isinstance(x, tir.For) else None)
    innermost = loops[0]  # post order: the innermost loop comes first
    if transposed:
        assert innermost.kind == tir.ForKind.UNROLLED and innermost.extent.value == 8
        assert tir.ForKind.VECTORIZED not in _loop_kinds(sch.func)
    else:
        assert innermost.kind == tir.ForKind.VECTORIZED
    mod = codegen_c.build({"f": sch.func}, TARGET)
    av, out = rand((64, k)), np.empty((4, k, 16), np.float32)
    mod["f"](av, out)
    np.testing.assert_array_equal(out, av.reshape(4, 16, k).transpose(0, 2, 1))


@pytest.mark.parametrize("sizes, piecewise", [((6, 6, 12), True), ((5, 7, 12), False)])
def test_schedule_injective_unrolls_concat_pieces_of_a_blocked_axis(sizes, piecewise):
    """A concat along the channels written in NCHW12c (the text detector's FPN: resized maps
    concatenated, then blocked for the head conv) picks its input per lane. When the pieces
    fall on a common boundary (6 | 6, 12, 24) the lane axis splits into 6-lane pieces, the
    piece and channel-block loops are unrolled, and every select is decided at compile time:
    no select and no clamp is left in the lowered code. Pieces of 5 and 7 lanes keep the
    per-lane selects; both are exact."""
    from kiln.codegen import c as codegen_c
    from kiln.schedule.cpu.generic import schedule_injective
    from kiln.tir.schedule import Schedule
    from kiln.tir.transform import lower

    ins = [te.placeholder((1, n, 5, 7), "float32", name=f"X{k}") for k, n in enumerate(sizes)]
    starts = np.cumsum((0,) + sizes)

    def concat(n, c, h, w):
        value = ins[-1][n, tir.max(c - int(starts[-2]), 0), h, w]
        for k in range(len(ins) - 2, -1, -1):
            pos = tir.min(tir.max(c - int(starts[k]), 0), sizes[k] - 1)
            value = tir.select(c < int(starts[k + 1]), ins[k][n, pos, h, w], value)
        return value

    cat = te.compute((1, 24, 5, 7), concat, name="concat")
    out = te.compute((1, 2, 5, 7, 12), lambda n, cb, h, w, c: cat[n, cb * 12 + c, h, w],
                     name="layout_transform")
    sch = Schedule(te.create_prim_func([*ins, out]))
    schedule_injective(sch, Target("c", num_threads=2))
    selects = []
    tir.post_order_visit(lower(sch.func).body, lambda n: selects.append(n)
                         if isinstance(n, tir.Select) else None)
    assert (not selects) == piecewise
    assert (tir.ForKind.UNROLLED in _loop_kinds(sch.func)) == piecewise
    mod = codegen_c.build({"f": sch.func}, TARGET)
    arrays = [rand((1, n, 5, 7)) for n in sizes]
    res = np.empty((1, 2, 5, 7, 12), np.float32)
    mod["f"](*arrays, res)
    want = np.concatenate(arrays, 1).reshape(1, 2, 12, 5, 7).transpose(0, 1, 3, 4, 2)
    np.testing.assert_array_equal(res, want)


@pytest.mark.parametrize("activation", ["relu", "sigmoid"])
def test_schedule_injective_splits_a_flattened_interleave(activation):
    """The depth-to-space after a 2x2/s2 ConvTranspose's GEMM, flattened for the next GEMM:
    ``y[c, i]`` reads phase ``(i // 2W) % 2 * 2 + i % 2W % 2`` of the GEMM result, so a vector
    over ``i`` is a gather. With plain arithmetic in the body the axis splits at the divisors
    (2W, then 2) into row, column and an unrolled phase loop that reads each phase's row
    contiguously; a sigmoid keeps the vector loop (its vector formula needs it)."""
    from kiln.codegen import c as codegen_c
    from kiln.schedule.cpu.generic import schedule_injective
    from kiln.tir.schedule import Schedule

    c, h, w = 3, 4, 8
    g = te.placeholder((c, 4, h * w), "float32", name="G")

    def body(k, i):
        row, col = i // (2 * w), i % (2 * w)
        v = g[k, row % 2 * 2 + col % 2, row // 2 * w + col // 2]
        return tir.max(v, 0.0) if activation == "relu" else tir.sigmoid(v)

    y = te.compute((c, 4 * h * w), body, name="Y")
    sch = Schedule(te.create_prim_func([g, y]))
    schedule_injective(sch, Target("c", num_threads=2))
    kinds = _loop_kinds(sch.func)
    assert (tir.ForKind.UNROLLED in kinds) == (activation == "relu")
    assert (tir.ForKind.VECTORIZED in kinds) == (activation == "sigmoid")
    mod = codegen_c.build({"f": sch.func}, TARGET)
    gv, out = rand((c, 4, h * w)), np.empty((c, 4 * h * w), np.float32)
    mod["f"](gv, out)
    want = gv.reshape(c, 2, 2, h, w).transpose(0, 3, 1, 4, 2).reshape(c, -1)
    want = np.maximum(want, 0) if activation == "relu" else 1 / (1 + np.exp(-want))
    np.testing.assert_allclose(out, want, rtol=1e-6, atol=1e-7)


def test_schedule_injective_splits_a_one_dimensional_interleave():
    """``y[i] = x[i % 2, i // 2]`` (two rows interleaved, no outer loop to run in parallel)."""
    from kiln.codegen import c as codegen_c
    from kiln.schedule.cpu.generic import schedule_injective
    from kiln.tir.schedule import Schedule

    x = te.placeholder((2, 64), "float32", name="X")
    y = te.compute((128,), lambda i: x[i % 2, i // 2] * 2.0, name="Y")
    sch = Schedule(te.create_prim_func([x, y]))
    schedule_injective(sch, Target("c", num_threads=2))
    assert tir.ForKind.UNROLLED in _loop_kinds(sch.func)
    mod = codegen_c.build({"f": sch.func}, TARGET)
    xv, out = rand((2, 64)), np.empty(128, np.float32)
    mod["f"](xv, out)
    np.testing.assert_array_equal(out, xv.T.reshape(-1) * 2)
