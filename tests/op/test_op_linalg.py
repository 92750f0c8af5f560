"""matmul / dense: StructInfo inference, declarations, and numerics of the CPU schedules.

Numeric cases go through the op's own compute and CPU schedule (te -> PrimFunc -> Schedule ->
C), several cases per compiled module, and are compared with numpy.
"""

from __future__ import annotations

import functools

import numpy as np
import pytest

import kiln
from kiln import graph as g
from kiln import op, te, tir
from kiln.graph.block_builder import BlockBuilder
from kiln.graph.struct_info import TensorStructInfo
from kiln.ir.errors import KilnError, StructInfoError
from kiln.op.registry import MixedPrecision, OpPattern, get_op_def
from kiln.schedule import lookup_schedule
from kiln.target import Target
from kiln.testing.op_testing import (
    check,
    dims,
    infer,
    make_rand,
    run_cases,
    scheduled,
    tvar,
)
from kiln.tir.schedule import Schedule

TARGET = Target("c")
RNG = np.random.default_rng(1)


rand = make_rand(RNG)
check = functools.partial(check, check_shape=False)


# ---------------------------------------------------------------------------------------------
# declarations
# ---------------------------------------------------------------------------------------------
def test_declarations():
    for name, inputs in (("matmul", ("a", "b")), ("dense", ("data", "weight"))):
        d = get_op_def(name)
        assert d.inputs == inputs
        assert d.pattern == OpPattern.OUT_EWISE_FUSABLE
        assert d.mixed_precision == MixedPrecision.ALWAYS
        assert lookup_schedule(d.name, "c") is not None and callable(d.gradient)
    assert op.matmul is get_op_def("matmul") and op.dense is get_op_def("dense")


def test_out_dtype_attr_is_normalized():
    call = op.matmul(tvar("a", (2, 3), "float16"), tvar("b", (3, 4), "float16"),
                     out_dtype=np.float32)
    assert call.attrs.out_dtype == "float32"
    assert infer(call).dtype == "float32"
    with pytest.raises(KilnError, match="out_dtype"):
        op.matmul(tvar("a", (2, 3)), tvar("b", (3, 4)), out_dtype="float32x4")


# ---------------------------------------------------------------------------------------------
# inference
# ---------------------------------------------------------------------------------------------
@pytest.mark.parametrize(
    "a, b, out",
    [
        ((2, 3), (3, 4), (2, 4)),
        ((3,), (3, 4), (4,)),
        ((2, 3), (3,), (2,)),
        ((3,), (3,), ()),
        ((5, 2, 3), (3, 4), (5, 2, 4)),
        ((2, 1, 2, 3), (6, 3, 4), (2, 6, 2, 4)),
        ((3,), (7, 3, 4), (7, 4)),
        ((7, 2, 3), (3,), (7, 2)),
    ],
)
def test_matmul_shapes(a, b, out):
    sinfo = infer(op.matmul(tvar("a", a), tvar("b", b)))
    assert dims(sinfo) == out and sinfo.dtype == "float32"


def test_matmul_symbolic_and_unknown_shapes():
    n, m = tir.Var("n", "int64"), tir.Var("m", "int64")
    sinfo = infer(op.matmul(tvar("a", (n, 8)), tvar("b", (8, m))))
    assert dims(sinfo)[0] is n and dims(sinfo)[1] is m
    # a symbolic contracted dim is accepted against anything (checked at run time)
    assert dims(infer(op.matmul(tvar("a", (2, n)), tvar("b", (5, 3))))) == (2, 3)
    unknown = infer(op.matmul(tvar("a", None, ndim=3), tvar("b", None, ndim=1)))
    assert unknown.shape is None and unknown.ndim == 2
    assert infer(op.matmul(tvar("a", None), tvar("b", (3, 4)))).ndim == -1


def test_matmul_errors_name_the_culprit():
    with pytest.raises(StructInfoError, match=r"matmul: a \(2, 3\) has 3 columns but b"):
        infer(op.matmul(tvar("a", (2, 3)), tvar("b", (4, 5))))
    with pytest.raises(StructInfoError, match="batch dimensions"):
        infer(op.matmul(tvar("a", (2, 2, 3)), tvar("b", (5, 3, 4))))
    with pytest.raises(StructInfoError, match="a has dtype float32 but b has float16"):
        infer(op.matmul(tvar("a", (2, 3)), tvar("b", (3, 4), "float16")))
    with pytest.raises(StructInfoError, match="scalar"):
        infer(op.matmul(tvar("a", ()), tvar("b", (3, 4))))
    with pytest.raises(StructInfoError, match="numeric"):
        infer(op.matmul(tvar("a", (2, 3), "bool"), tvar("b", (3, 4), "bool")))


def test_dense_inference():
    assert dims(infer(op.dense(tvar("x", (4, 8)), tvar("w", (5, 8))))) == (4, 5)
    assert dims(infer(op.dense(tvar("x", (2, 3, 8)), tvar("w", (5, 8))))) == (2, 3, 5)
    assert dims(infer(op.dense(tvar("x", (8,)), tvar("w", (5, 8))))) == (5,)
    sinfo = infer(op.dense(tvar("x", (4, 8), "int8"), tvar("w", (5, 8), "int8"),
                           out_dtype="int32"))
    assert sinfo.dtype == "int32"
    with pytest.raises(StructInfoError, match=r"dense: data \(4, 8\) has 8 features but weight"):
        infer(op.dense(tvar("x", (4, 8)), tvar("w", (5, 7))))
    with pytest.raises(StructInfoError, match="weight must be 2-d"):
        infer(op.dense(tvar("x", (4, 8)), tvar("w", (5, 8, 1))))


def test_linear_adds_bias_as_separate_op():
    x, w, b = tvar("x", (4, 8)), tvar("w", (5, 8)), tvar("b", (5,))
    call = op.linear(x, w, b)
    assert call.op.name == "add" and call.args[0].op.name == "dense"
    assert op.linear(x, w).op.name == "dense"


# ---------------------------------------------------------------------------------------------
# numerics
# ---------------------------------------------------------------------------------------------
MATMUL_CASES = [
    ((7, 13), (13, 5)),  # nothing divides the vector width
    ((7, 13), (13, 24)),  # rows need a predicate, columns vectorize
    ((64, 48), (48, 256)),  # full tiles and a column chunk
    ((33, 17), (17, 40)),
    ((13,), (13, 24)),  # vector @ matrix
    ((9, 13), (13,)),  # matrix @ vector
    ((13,), (13,)),  # dot product
    ((2, 1, 5, 6), (3, 6, 16)),  # broadcast batch dims
    ((3, 5, 6), (6, 8)),
    ((6,), (4, 6, 8)),
    ((1, 1), (1, 1)),
]


def test_matmul_matches_numpy():
    cases = [("matmul", [rand(a), rand(b)], {}) for a, b in MATMUL_CASES]
    for (_, (a, b), _), out in zip(cases, run_cases(cases)):
        check(out, np.matmul(a, b))


def test_empty_inner_dimension_gives_zeros():
    """K = 0: every product is an empty sum, zeros as numpy gives (the schedules met a block
    without a reduction loop); also packed (opt level 2, 16 columns) with a constant
    weight."""
    cases = [("matmul", [rand((3, 0)), rand((0, 4))], {}),
             ("matmul", [rand((2, 3, 0)), rand((0, 5))], {}),
             ("matmul", [rand((3, 0)), rand((0,))], {}),
             ("dense", [rand((4, 0)), rand((6, 0))], {})]
    for (name, (a, b), _), out in zip(cases, run_cases(cases)):
        want = a @ (b.T if name == "dense" else b)
        assert out.shape == want.shape and not out.any()
    x = g.Var("x", TensorStructInfo((5, 0), "float32"))
    bb = BlockBuilder()
    with bb.function("main", [x]):
        bb.emit_func_output(bb.emit(op.nn.relu(op.matmul(x, g.const(rand((0, 16)))))))
    with kiln.transform.PassContext(opt_level=2):
        out = kiln.build(bb.get())(rand((5, 0)))
    assert out.shape == (5, 16) and not out.any()


def test_matmul_integer_and_out_dtype():
    a, b = rand((5, 7), "int32"), rand((7, 16), "int32")
    a8, b8 = rand((6, 10), "int8"), rand((10, 8), "int8")
    out, out8 = run_cases([
        ("matmul", [a, b], {}),
        ("matmul", [a8, b8], {"out_dtype": "int32"}),
    ])
    np.testing.assert_array_equal(out, a @ b)
    assert out8.dtype == np.int32
    np.testing.assert_array_equal(out8, a8.astype(np.int32) @ b8.astype(np.int32))


def test_matmul_unscheduled_equals_scheduled():
    a, b = rand((11, 9)), rand((9, 32))
    (plain,) = run_cases([("matmul", [a, b], {})], schedule=False)
    (fast,) = run_cases([("matmul", [a, b], {})])
    check(fast, plain)


def test_matmul_symbolic_rows():
    """The schedule keeps symbolic extents unsplit; one module serves every row count."""
    from kiln.codegen import c as codegen_c

    n = te.size_var("n")
    a = te.placeholder((n, 12), "float32", name="a")
    b = te.placeholder((12, 16), "float32", name="b")
    out = get_op_def("matmul").compute(a, b, attrs=op.linalg.MatmulAttrs())
    sch = Schedule(te.create_prim_func([a, b, out]))
    lookup_schedule("matmul", "c")(sch, TARGET)
    mod = codegen_c.build({"mm": sch.func}, TARGET)
    for rows in (1, 5, 9):
        x, y = rand((rows, 12)), rand((12, 16))
        res = np.zeros((rows, 16), "float32")
        mod["mm"](x, y, res)
        check(res, x @ y)


DENSE_CASES = [
    ((7, 13), (9, 13)),  # transposed weight stage + predicated rows
    ((1, 32), (24, 32)),  # one row: matrix-vector form
    ((16, 20), (48, 20)),
    ((2, 3, 10), (16, 10)),  # leading batch dims
    ((10,), (5, 10)),
]


def test_dense_matches_numpy():
    cases = [("dense", [rand(x), rand(w)], {}) for x, w in DENSE_CASES]
    for (_, (x, w), _), out in zip(cases, run_cases(cases)):
        check(out, x @ w.T)


def test_schedule_vectorizes_and_parallelizes_gemm():
    func, _ = scheduled("matmul", [rand((64, 32)), rand((32, 128))], {})
    kinds = set()
    tir.post_order_visit(func.body, lambda n: kinds.add(n.kind) if isinstance(n, tir.For)
                         else None)
    assert {tir.ForKind.PARALLEL, tir.ForKind.VECTORIZED, tir.ForKind.UNROLLED} <= kinds


def test_one_column_products_vectorize_along_k():
    """A batch of matrix-vector products with the vector as a (k, 1) matrix (an MoE layer's
    gathered experts, one token each): the sum over k runs in vector partial sums, contiguous
    in both operands (it was a scalar chain); numerics with odd k and rows (a k no vector
    width divides stays a scalar sum)."""
    a, v = rand((16, 97, 131)), rand((16, 131, 1))
    func, _ = scheduled("matmul", [rand((16, 97, 128)), rand((16, 128, 1))], {})
    kinds = set()
    tir.post_order_visit(func.body, lambda n: kinds.add(n.kind) if isinstance(n, tir.For)
                         else None)
    assert {tir.ForKind.PARALLEL, tir.ForKind.VECTORIZED} <= kinds
    cases = [("matmul", [a, v], {}), ("matmul", [rand((5, 64, 256)), rand((5, 256, 1))], {}),
             ("matmul", [rand((3, 7, 64)), rand((64, 1))], {})]
    for (_, (x, y), _), out in zip(cases, run_cases(cases)):
        check(out, np.matmul(x, y))


# ---------------------------------------------------------------------------------------------
# through kiln.build
# ---------------------------------------------------------------------------------------------
def test_build_linear_with_bias_and_matmul():
    x = g.Var("x", TensorStructInfo((5, 12), "float32"))
    w, b, m = rand((20, 12)), rand((20,)), rand((20, 7))
    bb = BlockBuilder()
    with bb.function("main", [x]):
        with bb.dataflow():
            h = bb.emit(op.linear(x, g.const(w), g.const(b)))
            out = bb.emit_output(op.matmul(h, g.const(m)))
        bb.emit_func_output(out)
    exe = kiln.build(bb.get(), "c")
    xv = rand((5, 12))
    check(exe(xv), (xv @ w.T + b) @ m)


def _symbolic_rows_schedule(op_name, k, w_shape, target):
    """``op_name(x [n, k], w)`` with a symbolic row count ``n``, scheduled for ``target``."""
    n = te.size_var("n")
    x = te.placeholder((n, k), "float32", name="x")
    w = te.placeholder(w_shape, "float32", name="w")
    opdef = get_op_def(op_name)
    out = opdef.compute(x, w, attrs=opdef.make_attrs())
    sch = Schedule(te.create_prim_func([x, w, out]))
    lookup_schedule(opdef.name, "c")(sch, target)
    return sch


def _check_symbolic_rows(sch, target, w_shape, row_counts, reference):
    """Build ``sch`` and compare it with ``reference(x, w)`` at each row count."""
    from kiln.codegen import c as codegen_c

    mod = codegen_c.build({"f": sch.func}, target)
    wv = rand(w_shape)
    k = sch.func.buffer_map[sch.func.params[0]].shape[1].value
    for rows in row_counts:
        xv = rand((rows, k))
        want = reference(xv, wv)
        res = np.empty(want.shape, "float32")
        mod["f"](xv, wv, res)
        check(res, want)


def test_dense_symbolic_rows_uses_transposed_weight():
    sch = _symbolic_rows_schedule("dense", 12, (24, 12), TARGET)
    _check_symbolic_rows(sch, TARGET, (24, 12), (1, 7), lambda x, w: x @ w.T)


def test_gemm_with_symbolic_rows_shares_column_chunks():
    """An unpacked product with a dynamic row count (a classifier of 1000 classes at a dynamic
    batch) splits its columns into chunks and fuses them with the rows into the parallel loop,
    so at one row every thread still has columns to compute."""
    target = Target("c", num_threads=2)
    sch = _symbolic_rows_schedule("matmul", 40, (40, 1000), target)
    loops = []
    tir.post_order_visit(sch.func.body, lambda lp: loops.append(lp)
                         if isinstance(lp, tir.For) else None)
    par = [lp for lp in loops if lp.kind == tir.ForKind.PARALLEL]
    assert len(par) == 1 and str(par[0].extent) not in ("n", "1")
    _check_symbolic_rows(sch, target, (40, 1000), (1, 3), lambda x, w: x @ w)


def test_gemv_column_chunks_balance_the_threads():
    """A classifier's 1000 columns (125 vectors of 8) in 25 chunks of 5 vectors, not 5 of 25
    that give one of 2 threads 3 chunks (60% of the work); 1024 columns keep 4 wide chunks."""
    from kiln.schedule.cpu.linalg import _column_chunk

    assert _column_chunk(1000, 8, 4, threads=2) == 40
    assert _column_chunk(1024, 8, 4, threads=2) == 256
    assert _column_chunk(1000, 8, 2, threads=2, outer=2) == 200  # 2 rows x 5 chunks: 10 for 2
    assert _column_chunk(1001, 8, 4, threads=2) is None


def test_schedules_handle_fused_epilogues():
    """After fusion an op's PrimFunc also holds its element-wise consumers; the op's schedule
    computes them under its parallel loop (vectorized) and the result stays right."""
    from kiln.codegen import c as codegen_c

    def epilogue(t, bias):
        biased = te.compute(t.shape, lambda i, j: t[i, j] + bias[j], name="T_add")
        return te.compute(t.shape, lambda i, j: tir.max(biased[i, j], tir.const("float32", 0)),
                          name="T_relu")

    funcs, refs, args = {}, [], []
    for name, a_shape, b_shape in (("matmul", (64, 40), (40, 96)), ("dense", (64, 40), (96, 40)),
                                   ("dense", (2, 40), (96, 40))):
        opdef = get_op_def(name)
        a = te.placeholder(a_shape, "float32", name="a")
        b = te.placeholder(b_shape, "float32", name="b")
        bias = te.placeholder((96,), "float32", name="bias")
        out = epilogue(opdef.compute(a, b, attrs=opdef.make_attrs()), bias)
        sch = Schedule(te.create_prim_func([a, b, bias, out]))
        lookup_schedule(opdef.name, "c")(sch, TARGET)
        key = f"f{len(funcs)}"
        funcs[key] = sch.func
        av, bv, cv = rand(a_shape), rand(b_shape), rand((96,))
        prod = av @ (bv if name == "matmul" else bv.T)
        args.append((key, av, bv, cv))
        refs.append(np.maximum(prod + cv, 0))
        if a_shape[0] == 64:  # the epilogue moved under the parallel loop
            text = str(sch.func)
            assert text.index("parallel") < text.index('block("T_relu")')
    mod = codegen_c.build(funcs, TARGET)
    for (key, av, bv, cv), ref in zip(args, refs):
        res = np.empty(ref.shape, "float32")
        mod[key](av, bv, cv, res)
        check(res, ref)
