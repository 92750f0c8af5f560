"""Generated C runs and matches numpy: vectorized/parallel loops, reductions, intrinsics, dtypes."""

from __future__ import annotations

import math

import ml_dtypes
import numpy as np
import pytest

from kiln import te, tir
from kiln.codegen import c as cg
from kiln.testing.tir_testing import elementwise_func as ew_func
from kiln.tir.schedule import Schedule

RNG = np.random.default_rng(0)


@pytest.fixture(autouse=True, scope="module")
def _cache_dir(tmp_path_factory):
    mp = pytest.MonkeyPatch()
    mp.setenv("KILN_CACHE_DIR", str(tmp_path_factory.mktemp("kiln_cache")))
    yield
    mp.undo()


# ---------------------------------------------------------------------------------------------
# loops
# ---------------------------------------------------------------------------------------------
def test_elementwise_vectorized_parallel_symbolic_dim():
    n = tir.Var("n", "int64")
    A = te.placeholder((n, 64), "float32", name="A")
    B = te.placeholder((n, 64), "float32", name="B")
    C = te.compute((n, 64), lambda i, j: tir.max(A[i, j] * B[i, j], 0.0) + 1.0, name="C")
    sch = Schedule(te.create_prim_func([A, B, C]))
    i, j = sch.get_loops(sch.get_block("C"))
    jo, ji = sch.split(j, factors=[None, 8])
    sch.parallel(i)
    sch.vectorize(ji)
    mod = cg.build({"fused_mul_relu": sch.func})
    src = mod.source
    assert "kiln_parallel_for(fused_mul_relu__par0_task" in src  # kiln's thread pool
    assert "float32x8" in src and "*(float32x8_u*)(C + " in src
    for rows in (1, 13):  # the same module at two sizes of n
        a = RNG.standard_normal((rows, 64), dtype=np.float32)
        b = RNG.standard_normal((rows, 64), dtype=np.float32)
        c = np.full((rows, 64), np.nan, np.float32)
        mod["fused_mul_relu"](a, b, c)
        np.testing.assert_allclose(c, np.maximum(a * b, 0) + 1, rtol=1e-6)
    assert mod.info("fused_mul_relu").sym_vars == ("n",)


def test_vector_access_to_local_arrays_uses_the_aligned_type():
    """A function's own arrays are 64-byte aligned: vector accesses at offsets that are
    multiples of the vector (constant, or proven from a loop variable's stride) go through the
    aligned ``_a`` type, which GCC keeps in registers better; other offsets and the caller's
    buffers (any alignment) through ``_u``. The results are the same either way."""
    from kiln.tir import stmt as S

    def c64(v):
        return tir.const("int64", v)

    def vec(buf, base):
        return tir.BufferLoad(buf, (tir.Ramp(base, c64(1), 8),))

    X = tir.decl_buffer((c64(24),), "float32", "X")
    Y = tir.decl_buffer((c64(24),), "float32", "Y")
    T = tir.decl_buffer((c64(24),), "float32", "T", scope="local")
    i = tir.Var("i", "int64")
    fill = S.For(i, c64(0), c64(3), S.ForKind.SERIAL, S.BufferStore(
        T, vec(X, i * 8) * tir.Broadcast(tir.const("float32", 2.0), 8),
        (tir.Ramp(i * 8, c64(1), 8),)))
    shifted = S.BufferStore(Y, vec(T, c64(4)), (tir.Ramp(c64(0), c64(1), 8),))
    rest = S.For(i, c64(1), c64(2), S.ForKind.SERIAL, S.BufferStore(
        Y, vec(T, i * 8), (tir.Ramp(i * 8, c64(1), 8),)))
    xv, yv = tir.Var("x", "handle"), tir.Var("y", "handle")
    func = tir.PrimFunc(params=[xv, yv], buffer_map={xv: X, yv: Y},
                        body=S.Allocate(T, S.SeqStmt((fill, shifted, rest))))
    mod = cg.build({"shuffle": func})
    body = mod.source.split("shuffle__body", 1)[1]
    assert "*(float32x8_a*)(T + (i * 8))" in body  # proven from the loop variable's stride
    assert "= *(float32x8_u*)(T + 4);" in body  # 16 bytes into a line
    assert "(*(float32x8_u*)(X + " in body and "*(float32x8_u*)(Y + " in body
    x = RNG.standard_normal(24, dtype=np.float32)
    y = np.full(24, np.nan, np.float32)
    mod["shuffle"](x, y)
    np.testing.assert_array_equal(y[:8], 2 * x[4:12])
    np.testing.assert_array_equal(y[8:], 2 * x[8:])


@pytest.mark.parametrize("dtype,lanes", [("float32", 8), ("float64", 4)])
def test_register_tile_accumulates_through_the_fma_helper(dtype, lanes):
    """``acc = acc + a * b`` into a register tile (an array on the stack) in a loop annotated
    FMA_IN_REGISTERS goes through ``kiln_fma_<vector>``, whose operands must be registers
    (inline ``vfmadd231`` on x86 with FMA); without the annotation, or into the caller's
    buffer, it stays a plain expression. All give numpy's result."""
    from kiln.tir import stmt as S

    m, n, k = 10, lanes, 16
    a = te.placeholder((m, k), dtype, name="A")
    b = te.placeholder((k, n), dtype, name="B")
    r = te.reduce_axis((0, k), name="r")
    c = te.compute((m, n), lambda i, j: te.sum(a[i, r] * b[r, j], axis=r), name="C")
    funcs = {}
    for name, tiled, annotated in [("tiled", True, True), ("plain", True, False),
                                   ("direct", False, True)]:
        sch = Schedule(te.create_prim_func([a, b, c]))
        blk = sch.get_block("C")
        i, j, rr = sch.get_loops(blk)
        io, ii = sch.split(i, factors=[None, 5])
        sch.reorder(io, rr, ii, j)
        if tiled:
            sch.reverse_compute_at(sch.cache_write(blk, 0, "local"), io)
        sch.decompose_reduction(blk, rr)
        sch.unroll(ii)
        sch.vectorize(j)
        if annotated:
            sch.annotate(rr, S.FMA_IN_REGISTERS, 1)
        funcs[name] = sch.func
    mod = cg.build(funcs)
    vt = f"{dtype}x{lanes}"
    bodies = {name: mod.source.split(f"{name}__body", 1)[1].split("_unchecked", 1)[0]
              for name in funcs}
    assert bodies["tiled"].count(f"kiln_fma_{vt}(*({vt}_a*)(C_local + ") == 5
    assert f"kiln_fma_{vt}" not in bodies["plain"] + bodies["direct"]
    x = RNG.standard_normal((m, k)).astype(dtype)
    w = RNG.standard_normal((k, n)).astype(dtype)
    for name in funcs:
        out = np.full((m, n), np.nan, dtype)
        mod[name](x, w, out)
        np.testing.assert_allclose(out, x @ w, rtol=1e-5)


def test_reduction_with_init_resets_output():
    A = te.placeholder((8, 37), "float32", name="A")
    k = te.reduce_axis((0, 37), name="k")
    S = te.compute((8,), lambda i: te.sum(A[i, k], axis=k), name="S")
    M = te.compute((8,), lambda i: te.max(A[i, k], axis=k), name="M")
    mod = cg.build({"rsum": te.create_prim_func([A, S]), "rmax": te.create_prim_func([A, M])})
    a = RNG.standard_normal((8, 37), dtype=np.float32)
    s = np.full(8, 1e6, np.float32)  # garbage: init must overwrite it
    m = np.full(8, 1e6, np.float32)
    mod["rsum"](a, s)
    mod["rmax"](a, m)
    np.testing.assert_allclose(s, a.sum(axis=1), rtol=1e-5, atol=1e-5)
    np.testing.assert_array_equal(m, a.max(axis=1))
    mod["rsum"](a, s)  # a second call gives the same result (no accumulation across calls)
    np.testing.assert_allclose(s, a.sum(axis=1), rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("dtype", ["float32", "float64"])
def test_in_order_sums_that_gcc_12_miscompiles(dtype):
    """A sum over two loops of values read out of order -- what a ReduceSum of a Concat of
    two Split halves lowers to. GCC 12.2's loop vectorizer summed some elements twice
    (156 for the 153 of 0..17); each step now goes through kiln_opaque (see Helpers.opaque),
    while an accumulation across a loop's elements (a row of a matmul) is left alone."""
    A = te.placeholder((3, 6), dtype, name="A")
    k0, k1 = te.reduce_axis((0, 3), name="k0"), te.reduce_axis((0, 6), name="k1")
    first = A[k0, tir.min(k1.var, 2) + 3]
    second = A[k0, tir.max(k1.var - 3, 0)]
    S = te.compute((), lambda: te.sum(tir.select(k1.var < 3, first, second), axis=[k0, k1]),
                   name="S")
    B = te.placeholder((4, 8), dtype, name="B")
    kk = te.reduce_axis((0, 4), name="kk")
    R = te.compute((8,), lambda j: te.sum(B[kk, j], axis=kk), name="R")
    sch = Schedule(te.create_prim_func([B, R]))
    kk_loop, j_loop = sch.get_loops(sch.get_block("R"))[1], sch.get_loops(sch.get_block("R"))[0]
    sch.reorder(kk_loop, j_loop)  # j innermost: each step adds across the row (vectorizable)
    concat = Schedule(te.create_prim_func([A, S]))
    concat.decompose_reduction(concat.get_block("S"), concat.get_loops(concat.get_block("S"))[0])
    mod = cg.build({"concat_sum": concat.func, "rows": sch.func})
    a = np.arange(18, dtype=dtype).reshape(3, 6)
    out = np.zeros((), dtype)
    mod["concat_sum"](a, out)
    assert out == a.sum() == 153
    assert "kiln_opaque" in mod.source.split("concat_sum__body(")[1].split("\n}\n")[0]
    assert "kiln_opaque" not in mod.source.split("rows__body(")[1].split("\n}\n")[0]
    b = RNG.standard_normal((4, 8)).astype(dtype)
    r = np.zeros(8, dtype)
    mod["rows"](b, r)
    np.testing.assert_allclose(r, b.sum(axis=0), rtol=1e-6)


def test_split_reduction_init_guard():
    """After splitting the reduce loop, init must run once (both parts at their start)."""
    A = te.placeholder((4, 32), "float32", name="A")
    k = te.reduce_axis((0, 32), name="k")
    S = te.compute((4,), lambda i: te.sum(A[i, k], axis=k), name="S")
    sch = Schedule(te.create_prim_func([A, S]))
    i, kk = sch.get_loops(sch.get_block("S"))
    ko, ki = sch.split(kk, factors=[None, 4])
    sch.reorder(ki, ko)
    mod = cg.build({"ssum": sch.func})
    a = RNG.standard_normal((4, 32), dtype=np.float32)
    s = np.full(4, 5.0, np.float32)
    mod["ssum"](a, s)
    np.testing.assert_allclose(s, a.sum(axis=1), rtol=1e-5, atol=1e-5)


def test_matmul_loop_nest_scheduled():
    M, N, K = 24, 40, 19
    A = te.placeholder((M, K), "float32", name="A")
    B = te.placeholder((K, N), "float32", name="B")
    k = te.reduce_axis((0, K), name="k")
    C = te.compute((M, N), lambda i, j: te.sum(A[i, k] * B[k, j], axis=k), name="C")
    sch = Schedule(te.create_prim_func([A, B, C]))
    blk = sch.get_block("C")
    i, j, kk = sch.get_loops(blk)
    jo, ji = sch.split(j, factors=[None, 8])
    sch.reorder(i, jo, kk, ji)
    sch.parallel(i)
    sch.decompose_reduction(blk, kk)
    sch.vectorize(ji)
    mod = cg.build({"matmul": sch.func, "matmul_plain": te.create_prim_func([A, B, C])})
    a = RNG.standard_normal((M, K), dtype=np.float32)
    b = RNG.standard_normal((K, N), dtype=np.float32)
    for name in ("matmul", "matmul_plain"):
        c = np.full((M, N), np.nan, np.float32)
        mod[name](a, b, c)
        np.testing.assert_allclose(c, a @ b, rtol=1e-4, atol=1e-4)


def test_large_intermediate_goes_to_the_heap():
    A = te.placeholder((128, 160), "float32", name="A")
    B = te.compute((160, 128), lambda i, j: A[j, i] * 2.0, name="B")  # 80 KiB
    C = te.compute((128, 160), lambda i, j: B[j, i] + 1.0, name="C")
    mod = cg.build({"bigstage": te.create_prim_func([A, C])})
    assert "kiln_alloc(" in mod.source and "free(B);" in mod.source
    a = RNG.standard_normal((128, 160), dtype=np.float32)
    c = np.empty_like(a)
    mod["bigstage"](a, c)
    np.testing.assert_allclose(c, a * 2 + 1, rtol=1e-6)


def test_intermediate_buffers_stack_and_unroll_pragma():
    A = te.placeholder((16, 128), "float32", name="A")
    B = te.compute((128, 16), lambda i, j: A[j, i] * 2.0, name="B")
    C = te.compute((16, 128), lambda i, j: B[j, i] + 1.0, name="C")
    sch = Schedule(te.create_prim_func([A, C]))
    sch.unroll(sch.get_loops(sch.get_block("C"))[1])  # 128 copies: too many, a pragma
    sch.unroll(sch.get_loops(sch.get_block("B"))[1])  # 16 copies: written out
    mod = cg.build({"twostage": sch.func})
    assert "B[2048] __attribute__((aligned(64)))" in mod.source  # 8 KiB: a stack array
    assert mod.source.count("#pragma GCC unroll") == 1
    assert "#pragma GCC unroll 128" in mod.source
    a = RNG.standard_normal((16, 128), dtype=np.float32)
    c = np.empty_like(a)
    mod["twostage"](a, c)
    np.testing.assert_allclose(c, a * 2 + 1, rtol=1e-6)


def test_parallel_body_with_let_expressions_is_outlined():
    # a vectorized exp expands into let-bound vector values; the parallel loop's body is still
    # moved into a function with restrict parameters (OpenMP's own outlining drops restrict,
    # and GCC then left a GEMM's k loop un-unrolled: 1.09x the time)
    func = ew_func((16, 64), "float32", tir.exp, vectorize=8, parallel=True)
    mod = cg.build({"pexp": func})
    assert "static void pexp__par0(" in mod.source and "float* restrict" in mod.source
    x = RNG.standard_normal((16, 64), dtype=np.float32)
    out = np.empty_like(x)
    mod["pexp"](x, out)
    np.testing.assert_allclose(out, np.exp(x), rtol=2e-7)


def test_local_buffer_on_stack_and_nested_parallel_serialized():
    A = te.placeholder((8, 16), "float32", name="A")
    C = te.compute((8, 16), lambda i, j: A[i, j] + 3.0, name="C")
    sch = Schedule(te.create_prim_func([A, C]))
    blk = sch.get_block("C")
    i, j = sch.get_loops(blk)
    cache = sch.cache_write(blk, 0, "local")
    sch.reverse_compute_at(cache, i)
    sch.parallel(i)
    sch.parallel(sch.get_loops(blk)[1])
    mod = cg.build({"cached": sch.func})
    assert mod.source.count("kiln_parallel_for(cached__par") == 1
    assert "__attribute__((aligned(64)))" in mod.source  # the local cache is a stack array
    a = RNG.standard_normal((8, 16), dtype=np.float32)
    c = np.empty_like(a)
    mod["cached"](a, c)
    np.testing.assert_allclose(c, a + 3, rtol=1e-6)


# ---------------------------------------------------------------------------------------------
# intrinsics
# ---------------------------------------------------------------------------------------------
_erf = np.vectorize(math.erf)

UNARY = {
    "exp": (tir.exp, np.exp),
    "erf": (tir.erf, lambda x: _erf(x.astype(np.float64)).astype(x.dtype)),
    "tanh": (tir.tanh, np.tanh),
    "sigmoid": (tir.sigmoid, lambda x: (1 / (1 + np.exp(-x.astype(np.float64)))).astype(x.dtype)),
    "round": (tir.round, np.round),
    "rsqrt": (tir.rsqrt, lambda x: (1 / np.sqrt(x.astype(np.float64))).astype(x.dtype)),
    "log": (tir.log, np.log),
    "fabs": (tir.fabs, np.abs),
    "floor": (tir.floor, np.floor),
}


@pytest.mark.parametrize("dtype", ["float32", "float64"])
def test_intrinsics_match_numpy(dtype):
    funcs = {}
    for name, (fn, _) in UNARY.items():
        funcs[name] = ew_func((64,), dtype, fn)
        funcs[name + "_vec"] = ew_func((64,), dtype, fn, vectorize=8)
    funcs["pow"] = ew_func((64,), dtype, tir.pow, nin=2)
    funcs["pow_vec"] = ew_func((64,), dtype, tir.pow, nin=2, vectorize=8)
    mod = cg.build(funcs)
    x = RNG.uniform(-4, 4, 64).astype(dtype)
    x[:8] = [0.5, 1.5, 2.5, -0.5, -1.5, -2.5, 3.5, 0.0]  # round: ties to even
    pos = np.abs(x) + 0.25
    rtol = 2e-6 if dtype == "float32" else 1e-12
    for name, (_, ref) in UNARY.items():
        inp = pos if name in ("rsqrt", "log") else x
        for key in (name, name + "_vec"):
            out = np.empty_like(x)
            mod[key](inp, out)
            np.testing.assert_allclose(out, ref(inp), rtol=rtol, atol=rtol, err_msg=key)
    y = RNG.uniform(-2, 2, 64).astype(dtype)
    for key in ("pow", "pow_vec"):
        out = np.empty_like(x)
        mod[key](pos, y, out)
        np.testing.assert_allclose(out, np.power(pos, y), rtol=rtol * 4, err_msg=key)


def test_nan_and_inf_semantics():
    funcs = {
        "exp": ew_func((16,), "float32", tir.exp, vectorize=8),
        "relu": ew_func((16,), "float32", lambda a: tir.max(a, 0.0), vectorize=8),
        "relu_scalar": ew_func((16,), "float32", lambda a: tir.max(a, 0.0)),
        "minimum": ew_func((16,), "float32", tir.min, nin=2, vectorize=8),
        "isnan": ew_func((16,), "float32", tir.isnan),
        "sigmoid": ew_func((16,), "float32", tir.sigmoid),
    }
    mod = cg.build(funcs)
    x = np.array([np.nan, np.inf, -np.inf, 0.0, -0.0, 1.0, -1.0, 100.0] * 2, np.float32)
    y = np.array([1.0, np.nan] * 8, np.float32)
    out = np.empty_like(x)
    mod["exp"](x, out)
    with np.errstate(over="ignore"):
        np.testing.assert_allclose(out, np.exp(x), rtol=2e-6)
    for key in ("relu", "relu_scalar"):
        mod[key](x, out)
        np.testing.assert_array_equal(out, np.maximum(x, 0))  # NaN propagates like numpy
    mod["minimum"](x, y, out)
    np.testing.assert_array_equal(out, np.minimum(x, y))
    flags = np.empty(16, np.bool_)
    mod["isnan"](x, flags)
    np.testing.assert_array_equal(flags, np.isnan(x))
    mod["sigmoid"](x, out)
    with np.errstate(over="ignore"):
        np.testing.assert_allclose(out, 1 / (1 + np.exp(-x)), rtol=2e-6)


# ---------------------------------------------------------------------------------------------
# integer semantics and dtypes
# ---------------------------------------------------------------------------------------------
@pytest.mark.parametrize("dtype", ["int32", "int64", "int8"])
def test_floordiv_floormod_negative(dtype):
    funcs = {
        "div": ew_func((32,), dtype, lambda a, b: a // b, nin=2),
        "mod": ew_func((32,), dtype, lambda a, b: a % b, nin=2),
        "div_vec": ew_func((32,), dtype, lambda a, b: a // b, nin=2, vectorize=8),
        "mod_vec": ew_func((32,), dtype, lambda a, b: a % b, nin=2, vectorize=8),
        "div3": ew_func((32,), dtype, lambda a: a // 3),
        "mod3": ew_func((32,), dtype, lambda a: a % 3),
    }
    mod = cg.build(funcs)
    a = RNG.integers(-50, 50, 32).astype(dtype)
    b = RNG.integers(1, 7, 32).astype(dtype) * RNG.choice([-1, 1], 32).astype(dtype)
    for key, ref in (("div", np.floor_divide(a, b)), ("mod", np.mod(a, b)),
                     ("div_vec", np.floor_divide(a, b)), ("mod_vec", np.mod(a, b))):
        out = np.empty_like(a)
        mod[key](a, b, out)
        np.testing.assert_array_equal(out, ref, err_msg=key)
    for key, ref in (("div3", a // 3), ("mod3", a % 3)):
        out = np.empty_like(a)
        mod[key](a, out)
        np.testing.assert_array_equal(out, ref, err_msg=key)


def test_small_int_uint_bool_float64_buffers():
    funcs = {
        "add_i8": ew_func((32,), "int8", lambda a, b: a + b, nin=2, vectorize=16),
        "mul_u8": ew_func((32,), "uint8", lambda a, b: a * b, nin=2),
        "and_bool": ew_func((32,), "bool", lambda a, b: a & b, nin=2, vectorize=8),
        "gt_f64": ew_func((32,), "bool", lambda a, b: a > b, nin=2, vectorize=4,
                          in_dtypes=["float64", "float64"]),
        "where_f64": ew_func((32,), "float64", lambda c, a: tir.select(c, a, -a), nin=2,
                             vectorize=4, in_dtypes=["bool", "float64"]),
        "cast_u8_f64": ew_func((32,), "float64", lambda a: tir.cast("float64", a),
                               in_dtypes=["uint8"], vectorize=8),
    }
    mod = cg.build(funcs)
    a8 = RNG.integers(-128, 128, 32).astype(np.int8)
    b8 = RNG.integers(-128, 128, 32).astype(np.int8)
    out = np.empty(32, np.int8)
    mod["add_i8"](a8, b8, out)
    with np.errstate(over="ignore"):
        np.testing.assert_array_equal(out, a8 + b8)  # wraps around like numpy
    au = RNG.integers(0, 256, 32).astype(np.uint8)
    bu = RNG.integers(0, 256, 32).astype(np.uint8)
    outu = np.empty(32, np.uint8)
    mod["mul_u8"](au, bu, outu)
    np.testing.assert_array_equal(outu, au * bu)
    pa, pb = RNG.random(32) < 0.5, RNG.random(32) < 0.5
    outb = np.empty(32, np.bool_)
    mod["and_bool"](pa, pb, outb)
    np.testing.assert_array_equal(outb, pa & pb)
    fa, fb = RNG.standard_normal(32), RNG.standard_normal(32)
    mod["gt_f64"](fa, fb, outb)
    np.testing.assert_array_equal(outb, fa > fb)
    outf = np.empty(32, np.float64)
    mod["where_f64"](pa, fa, outf)
    np.testing.assert_array_equal(outf, np.where(pa, fa, -fa))
    mod["cast_u8_f64"](au, outf)
    np.testing.assert_array_equal(outf, au.astype(np.float64))


@pytest.mark.skipif(not cg.supports_float16(), reason="the C compiler has no _Float16")
def test_float16():
    funcs = {
        "add": ew_func((64,), "float16", lambda a, b: a * b + a, nin=2, vectorize=8),
        "exp": ew_func((64,), "float16", tir.exp),
        "to_f32": ew_func((64,), "float32", lambda a: tir.cast("float32", a),
                          in_dtypes=["float16"]),
    }
    mod = cg.build(funcs)
    a = RNG.uniform(-2, 2, 64).astype(np.float16)
    b = RNG.uniform(-2, 2, 64).astype(np.float16)
    out = np.empty(64, np.float16)
    mod["add"](a, b, out)
    np.testing.assert_allclose(out.astype(np.float32), (a * b + a).astype(np.float32),
                               rtol=2e-3, atol=2e-3)
    mod["exp"](a, out)
    np.testing.assert_allclose(out.astype(np.float32), np.exp(a).astype(np.float32), rtol=1e-3)
    o32 = np.empty(64, np.float32)
    mod["to_f32"](a, o32)
    np.testing.assert_array_equal(o32, a.astype(np.float32))


def test_bfloat16():
    bf16 = ml_dtypes.bfloat16
    funcs = {
        "add": ew_func((64,), "bfloat16", lambda a, b: a + b, nin=2, vectorize=8),
        "exp": ew_func((64,), "bfloat16", tir.exp),
        "from_f32": ew_func((64,), "bfloat16", lambda a: tir.cast("bfloat16", a),
                            in_dtypes=["float32"]),
    }
    mod = cg.build(funcs)
    a = RNG.uniform(-3, 3, 64).astype(bf16)
    b = RNG.uniform(-3, 3, 64).astype(bf16)
    out = np.empty(64, bf16)
    mod["add"](a, b, out)
    ref = (a.astype(np.float32) + b.astype(np.float32)).astype(bf16)
    np.testing.assert_array_equal(out.astype(np.float32), ref.astype(np.float32))
    mod["exp"](a, out)
    ref = np.exp(a.astype(np.float32)).astype(bf16)
    np.testing.assert_allclose(out.astype(np.float32), ref.astype(np.float32), rtol=1e-2)
    f = RNG.standard_normal(64).astype(np.float32)
    f[:3] = [np.nan, np.inf, -np.inf]
    mod["from_f32"](f, out)
    np.testing.assert_array_equal(out.astype(np.float32), f.astype(bf16).astype(np.float32))


def test_names_are_sanitized_c_identifiers():
    x = te.placeholder((4,), "float32", name="in.put")
    y = te.compute((4,), lambda i: x[i] + 1.0, name="exp")
    mod = cg.build({"exp": te.create_prim_func([x, y]), "my-kernel": te.create_prim_func([x, y])})
    info = mod.info("exp")
    assert info.symbol != "exp" and info.unchecked_symbol == info.symbol + "_unchecked"
    assert mod.info("my-kernel").symbol == "my_kernel"
    assert "in_put" in mod.source
    a = np.arange(4, dtype=np.float32)
    out = np.empty(4, np.float32)
    mod["exp"](a, out)
    np.testing.assert_array_equal(out, a + 1)
    mod["my-kernel"](a, out)
    np.testing.assert_array_equal(out, a + 1)


def test_hand_written_vector_tir():
    """Vector forms the vectorizer never makes still compile: gather, scatter, lets, calls."""
    from kiln.tir import Broadcast, BufferLoad, Ramp

    c64 = lambda v: tir.const("int64", v)  # noqa: E731
    A = tir.decl_buffer((c64(64),), "float32", "A")
    B = tir.decl_buffer((c64(64),), "float32", "B")
    M = tir.decl_buffer((c64(64),), "bool", "M")
    i = tir.Var("i", "int64")
    gather = BufferLoad(A, (Ramp(i * c64(8), c64(2), 4),))  # A[8i], A[8i+2], ...
    x = tir.Var("x", "float32x4")
    mask = tir.Var("m", "boolx4")
    value = tir.Let(x, tir.Call("float32x4", "exp", (gather,)), x + Broadcast(
        tir.const("float32", 1.0), 4))
    body = tir.For(i, c64(0), c64(8), tir.ForKind.SERIAL, tir.seq(
        tir.BufferStore(B, value, (Ramp(i, c64(8), 4),)),  # scatter: B[i], B[i+8], ...
        tir.LetStmt(mask, tir.Cast("boolx4", BufferLoad(A, (Ramp(i * c64(4), c64(1), 4),))),
                    tir.BufferStore(M, tir.Select(mask, mask, tir.Not(mask)) & mask,
                                    (Ramp(i * c64(4), c64(1), 4),))),
    ))
    params = [tir.Var(n, "handle") for n in "ABM"]
    func = tir.PrimFunc(params, dict(zip(params, (A, B, M))), body, {"kiln.lowered": True})
    mod = cg.build({"vec_forms": func})
    a = RNG.uniform(-1, 1, 64).astype(np.float32)
    a[::3] = 0.0
    b = np.zeros(64, np.float32)
    m = np.zeros(64, np.bool_)
    mod["vec_forms"](a, b, m)
    ref = np.zeros(64, np.float32)
    for it in range(8):
        for lane in range(4):
            ref[it + 8 * lane] = np.exp(a[8 * it + 2 * lane]) + 1
    np.testing.assert_allclose(b, ref, rtol=1e-6)
    np.testing.assert_array_equal(m, a[:32].astype(bool).tolist() + [False] * 32)


def test_floordiv_of_non_negative_indices_uses_plain_division():
    A = te.placeholder((4,), "float32", name="A")
    B = te.compute((16,), lambda i: A[i // 4] + tir.cast("float32", i % 4), name="B")
    mod = cg.build({"repeat": te.create_prim_func([A, B])})
    assert "kiln_floordiv" not in mod.source and "kiln_floormod" not in mod.source
    a = np.arange(4, dtype=np.float32) * 10
    out = np.empty(16, np.float32)
    mod["repeat"](a, out)
    np.testing.assert_array_equal(out, np.repeat(a, 4) + np.tile(np.arange(4), 4))


def test_non_divisible_vectorized_split_keeps_the_tail_correct():
    func = ew_func((30,), "float32", lambda a: a * 3.0, vectorize=8)
    mod = cg.build({"tail": func})
    assert "#pragma omp simd" in mod.source  # a guarded body stays a (simd) scalar loop
    a = RNG.standard_normal(30).astype(np.float32)
    out = np.full(30, np.nan, np.float32)
    mod["tail"](a, out)
    np.testing.assert_allclose(out, a * 3, rtol=1e-6)


def test_vector_select_under_a_scalar_condition_compiles():
    """Padding a middle axis vectorizes the inner one: ``cond ? load : broadcast`` with a scalar
    condition; the arms (an unaligned-load vector type and a plain vector) must be one type."""
    import kiln
    from kiln import graph as g
    from kiln import op

    x = g.Var("x", g.TensorStructInfo((2, 3, 8), "float32"))
    bb = g.BlockBuilder()
    with bb.function("main", [x]):
        with bb.dataflow():
            out = bb.emit_output(op.pad(x, pad_width=((0, 0), (1, 1), (0, 0))))
        bb.emit_func_output(out)
    a = RNG.standard_normal((2, 3, 8), dtype=np.float32)
    np.testing.assert_array_equal(kiln.build(bb.get())(a), np.pad(a, ((0, 0), (1, 1), (0, 0))))


def test_parallel_loop_captures_with_any_names():
    """Buffers and loop variables named like the thread pool's own helpers (``lo``, ``c``,
    ``i``, ``begin``, ``end``, ``ctx``) are captured without clashing (an ONNX model whose
    tensors were named ``lo``/``hi`` once did not compile)."""
    lo = te.placeholder((16, 8), "float32", name="lo")
    c = te.placeholder((16, 8), "float32", name="c")
    begin = te.placeholder((8,), "float32", name="begin")
    out = te.compute((16, 8), lambda i, end: lo[i, end] * c[i, end] + begin[end], name="ctx")
    sch = Schedule(te.create_prim_func([lo, c, begin, out]))
    sch.parallel(sch.get_loops(sch.get_block("ctx"))[0])
    mod = cg.build({"clash": sch.func})
    assert "kiln_parallel_for(clash__par0_task" in mod.source
    a, b = RNG.standard_normal((2, 16, 8), dtype=np.float32)
    v = RNG.standard_normal(8, dtype=np.float32)
    r = np.empty((16, 8), np.float32)
    mod["clash"](a, b, v, r)
    np.testing.assert_allclose(r, a * b + v, rtol=1e-5, atol=1e-6)  # (a fused multiply-add)
