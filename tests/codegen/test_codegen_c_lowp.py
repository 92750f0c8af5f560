"""float16/bfloat16 kernels of the C backend.

Widened (every bfloat16, and float16 on targets without AVX512-FP16 -- this CPU family): 16-bit
storage, exact widening loads, float32 arithmetic, round-to-nearest-even stores (F16C
instructions where the compiler targets them, portable C otherwise). Native float16 (a target
with ``avx512_fp16``): ``_Float16`` storage and arithmetic, checked in the generated source and
run where the compiler accepts ``_Float16`` (GCC emulates it on x86-64 without the ISA).
"""

from __future__ import annotations

import subprocess

import ml_dtypes
import numpy as np
import pytest

import kiln
from kiln import graph as g
from kiln import op, te, tir
from kiln.codegen import c as cg
from kiln.codegen.c.compiler import FLAGS, find_compiler
from kiln.runtime.module import Module
from kiln.target import Target
from kiln.tir.schedule import Schedule

RNG = np.random.default_rng(3)
BF16 = ml_dtypes.bfloat16
#: The host's features without AVX512-FP16: the widened code path, whatever this CPU is.
WIDE = Target("c", features=Target("c").features - {"avx512_fp16"})
#: A target that computes float16 natively.
NATIVE = Target("c", features=frozenset({"avx2", "fma", "f16c", "avx512f", "avx512_fp16"}))


@pytest.fixture(autouse=True, scope="module")
def _cache_dir(tmp_path_factory):
    mp = pytest.MonkeyPatch()
    mp.setenv("KILN_CACHE_DIR", str(tmp_path_factory.mktemp("kiln_cache")))
    yield
    mp.undo()


def ew(shape, out_dtype, fcompute, in_dtypes, vectorize=None):
    """``out = fcompute(*inputs)`` element-wise, its innermost loop split and vectorized."""
    ins = [te.placeholder(shape, d, name=f"x{k}") for k, d in enumerate(in_dtypes)]
    out = te.compute(shape, lambda *i: fcompute(*[x[i] for x in ins]), name="out")
    func = te.create_prim_func([*ins, out])
    if vectorize is None:
        return func
    sch = Schedule(func)
    loops = sch.get_loops(sch.get_block("out"))
    _, inner = sch.split(loops[-1], factors=[None, vectorize])
    sch.vectorize(inner)
    return sch.func


def bits_equal(got, want):
    """Same values bit for bit, except that any NaN matches any NaN."""
    got, want = np.asarray(got), np.asarray(want)
    gi = got.view(f"uint{got.dtype.itemsize * 8}")
    wi = want.view(f"uint{want.dtype.itemsize * 8}")
    nan = np.isnan(want.astype(np.float32))
    assert np.array_equal(np.isnan(got.astype(np.float32)), nan)
    bad = np.nonzero((gi != wi) & ~nan)[0]
    assert bad.size == 0, f"{bad.size} mismatches, first at {bad[:5]}: {got[bad[:5]]} vs " \
                          f"{want[bad[:5]]}"


def conversion_funcs(lp):
    """low -> float32 and float32 -> low, as scalar loops and vectors of 16, 4 and 2 lanes."""
    n = 1 << 16
    funcs = {"widen": ew((n,), "float32", lambda a: tir.cast("float32", a), [lp]),
             "narrow": ew((n,), lp, lambda a: tir.cast(lp, a), ["float32"])}
    for lanes in (16, 4, 2):
        funcs[f"widen_v{lanes}"] = ew((n,), "float32", lambda a: tir.cast("float32", a), [lp],
                                      vectorize=lanes)
        funcs[f"narrow_v{lanes}"] = ew((n,), lp, lambda a: tir.cast(lp, a), ["float32"],
                                       vectorize=lanes)
    return funcs


def narrowing_inputs(np_lp):
    """float32 values that exercise rounding: every low-precision value, the midpoints between
    neighbours (ties to even), values just off the midpoints, overflow, subnormals, NaN."""
    lows = np.arange(1 << 16, dtype=np.uint16).view(np_lp)
    exact = lows.astype(np.float32)
    finite = np.sort(exact[np.isfinite(exact)])
    finite = np.unique(finite)
    mid = ((finite[:-1].astype(np.float64) + finite[1:]) / 2).astype(np.float32)
    above = np.nextafter(mid, np.float32(np.inf))
    below = np.nextafter(mid, np.float32(-np.inf))
    special = np.array([np.nan, -np.nan, np.inf, -np.inf, -0.0, 0.0, 65504, 65519.996, 65520,
                        1e9, -1e9, 3e38, 2.0**-24, 2.0**-25, 2.0**-26, 1e-30, -1e-45,
                        1 + 2.0**-8, 1 + 3 * 2.0**-8], np.float32)
    vals = np.concatenate([exact, mid, above, below, special,
                           RNG.standard_normal(4096).astype(np.float32) * 100])
    out = np.zeros(1 << 16, np.float32)
    pick = RNG.choice(vals.size, out.size - special.size, replace=False)
    out[: special.size] = special
    out[special.size:] = vals[pick]
    return out


def check_conversions(mod, lp, np_lp):
    halves = np.arange(1 << 16, dtype=np.uint16).view(np_lp)
    for name in ("widen", "widen_v16", "widen_v4", "widen_v2"):
        out = np.empty(1 << 16, np.float32)
        mod[name](halves, out)
        bits_equal(out, halves.astype(np.float32))
    x = narrowing_inputs(np_lp)
    with np.errstate(over="ignore", invalid="ignore"):
        want = x.astype(np_lp)
    for name in ("narrow", "narrow_v16", "narrow_v4", "narrow_v2"):
        out = np.empty(1 << 16, np_lp)
        mod[name](x, out)
        bits_equal(out, want)


@pytest.mark.parametrize("lp", ["float16", "bfloat16"])
def test_conversions_are_exact_and_round_to_nearest_even(lp):
    np_lp = BF16 if lp == "bfloat16" else np.float16
    funcs = conversion_funcs(lp)
    mod = cg.build(funcs, WIDE)
    src = mod.source
    assert "_Float16" not in src.split("/* ---- vector types")[1]  # widened: 16-bit patterns
    short = "bf16" if lp == "bfloat16" else "f16"
    assert f"kiln_load_{short}_float32x16(" in src and f"kiln_bits_{short}_float32x4(" in src
    check_conversions(mod, lp, np_lp)


def test_portable_float16_conversions_without_f16c(tmp_path):
    """The same kernels compiled without F16C use the portable C conversions."""
    funcs = conversion_funcs("float16")
    source, infos = cg.generate_source(funcs, WIDE)
    assert "#if defined(__F16C__)" in source and "kiln_f32_to_f16_soft" in source
    src = tmp_path / "soft.c"
    lib = tmp_path / "soft.so"
    src.write_text(source)
    cc = find_compiler()
    res = subprocess.run([*cc.command, *FLAGS, "-mno-f16c", "-o", str(lib), str(src), "-lm"],
                         capture_output=True, text=True, check=False)
    assert res.returncode == 0, res.stderr
    probe = subprocess.run([*cc.command, "-march=native", "-mno-f16c", "-dM", "-E", "-x", "c",
                            "/dev/null"], capture_output=True, text=True, check=False)
    assert "__F16C__" not in probe.stdout  # so the portable branch is what was compiled
    check_conversions(Module(str(lib), source, infos, str(src), False), "float16", np.float16)


@pytest.mark.parametrize("lp", ["float16", "bfloat16"])
@pytest.mark.parametrize("lanes", [None, 8])
def test_widened_arithmetic_rounds_once_at_the_store(lp, lanes):
    np_lp = BF16 if lp == "bfloat16" else np.float16
    n = 1024
    funcs = {
        "fma": ew((n,), lp, lambda a, b, c: a * b + c, [lp] * 3, lanes),
        # an explicit cast inside a float32 computation does round
        "cast_inside": ew((n,), "float32",
                          lambda x: tir.cast("float32", tir.cast(lp, x * 3.0)) + 1.0,
                          ["float32"], lanes),
        "minmax_select": ew((n,), lp, lambda a, b: tir.select(a > b, tir.max(a, b) - b,
                                                              tir.min(a, b) * 0.5),
                            [lp] * 2, lanes),
        "from_int": ew((n,), lp, lambda i: tir.cast(lp, i), ["int32"], lanes),
        "to_int": ew((n,), "int32", lambda a: tir.cast("int32", a), [lp], lanes),
    }
    mod = cg.build(funcs, WIDE)
    a, b, c = (RNG.uniform(-4, 4, n).astype(np_lp) for _ in range(3))
    f32 = [v.astype(np.float32) for v in (a, b, c)]
    out = np.empty(n, np_lp)
    mod["fma"](a, b, c, out)
    # a*b is exact in float32, so fused or not, float32 gives one rounding at the store
    bits_equal(out, (f32[0] * f32[1] + f32[2]).astype(np_lp))
    x = RNG.standard_normal(n).astype(np.float32)
    o32 = np.empty(n, np.float32)
    mod["cast_inside"](x, o32)
    bits_equal(o32, (x * np.float32(3)).astype(np_lp).astype(np.float32) + np.float32(1))
    mod["minmax_select"](a, b, out)
    want = np.where(f32[0] > f32[1], np.maximum(f32[0], f32[1]) - f32[1],
                    np.minimum(f32[0], f32[1]) * np.float32(0.5))
    bits_equal(out, want.astype(np_lp))
    ints = RNG.integers(-5000, 5000, n).astype(np.int32)
    mod["from_int"](ints, out)
    bits_equal(out, ints.astype(np.float32).astype(np_lp))
    oi = np.empty(n, np.int32)
    mod["to_int"](a, oi)
    np.testing.assert_array_equal(oi, f32[0].astype(np.int32))


@pytest.mark.parametrize("lp", ["float16", "bfloat16"])
def test_broadcast_gather_and_copy(lp):
    np_lp = BF16 if lp == "bfloat16" else np.float16
    x = te.placeholder((16, 16), lp, name="x")
    bcast = te.compute((16, 16), lambda i, j: x[i, j] + x[i, 0], name="out")
    gather = te.compute((16, 16), lambda i, j: x[j, i] * 2.0, name="out")  # scalar fallback
    copy = te.compute((16, 16), lambda i, j: x[i, j], name="out")
    mod = cg.build({"bcast_add": _vec_inner(te.create_prim_func([x, bcast])),
                    "transpose": _vec_inner(te.create_prim_func([x, gather])),
                    "copy": _vec_inner(te.create_prim_func([x, copy]))}, WIDE)
    short = "bf16" if lp == "bfloat16" else "f16"
    body = mod.source.split("int32_t bcast_add__body(")[1].split("\n}\n")[0]
    assert f"kiln_broadcast_float32x8(kiln_{short}_to_f32(" in body
    assert f"kiln_load_{short}_float32x8(x + " in body
    body = mod.source.split("int32_t copy__body(")[1].split("\n}\n")[0]
    assert short not in body and "*(uint16x8_u*)(x + " in body  # 16-bit patterns copied
    xv = RNG.standard_normal((16, 16)).astype(np_lp)
    xv[3, 5] = np.nan
    x32 = xv.astype(np.float32)
    out = np.empty((16, 16), np_lp)
    mod["bcast_add"](xv, out)
    bits_equal(out.ravel(), (x32 + x32[:, :1]).astype(np_lp).ravel())
    mod["transpose"](xv, out)
    bits_equal(out.ravel(), (x32.T * np.float32(2)).astype(np_lp).ravel())
    mod["copy"](xv, out)
    np.testing.assert_array_equal(out.view(np.uint16), xv.view(np.uint16))


def _vec_inner(func, lanes=8):
    sch = Schedule(func)
    loops = sch.get_loops(sch.get_block("out"))
    _, inner = sch.split(loops[-1], factors=[None, lanes])
    sch.vectorize(inner)
    return sch.func


@pytest.mark.parametrize("lp", ["float16", "bfloat16"])
def test_scalar_low_precision_parameter(lp):
    np_lp = BF16 if lp == "bfloat16" else np.float16
    x = te.placeholder((32,), lp, name="x")
    s = tir.Var("s", lp)
    out = te.compute((32,), lambda i: x[i] * s, name="out")
    mod = cg.build({"scale": te.create_prim_func([x, s, out])}, WIDE)
    xv = RNG.standard_normal(32).astype(np_lp)
    o = np.empty(32, np_lp)
    mod["scale"](xv, 1.5, o)
    bits_equal(o, (xv.astype(np.float32) * np.float32(1.5)).astype(np_lp))


@pytest.mark.skipif(not cg.supports_float16(), reason="the C compiler has no _Float16")
def test_native_float16_source_and_results():
    n = 256
    funcs = {
        "muladd": ew((n,), "float16", lambda a, b, c: a * b + c, ["float16"] * 3, 16),
        "scalar": ew((n,), "float16", lambda a, b, c: tir.max(a * b, c), ["float16"] * 3),
        "exp": ew((n,), "float16", tir.exp, ["float16"], 16),
        "to_f32": ew((n,), "float32", lambda a: tir.cast("float32", a) * 2.0, ["float16"], 8),
    }
    wide_src, _ = cg.generate_source(funcs, WIDE)
    native_src, _ = cg.generate_source(funcs, NATIVE)
    # widened: 16-bit storage and float32 arithmetic
    assert "uint16_t* restrict x0" in wide_src and "(uint16_t*)data[0]" in wide_src
    assert "kiln_load_f16_float32x16(x0 +" in wide_src
    # native: _Float16 storage, vectors of _Float16 and _Float16 arithmetic
    assert "_Float16* restrict x0" in native_src and "(_Float16*)data[0]" in native_src
    assert "typedef _Float16 float16x16 __attribute__((vector_size(32)));" in native_src
    body = native_src.split("int32_t muladd__body(")[1].split("\n}\n")[0]
    assert "(*(float16x16_u*)(x0 + " in body and "*(float16x16_u*)(out + " in body
    assert "kiln_f16" not in body and "float32" not in body
    scalar_body = native_src.split("int32_t scalar__body(")[1].split("\n}\n")[0]
    assert "kiln_max_float16(" in scalar_body
    assert "_Float16 kiln_max_float16(_Float16 a, _Float16 b)" in native_src
    # it compiles (GCC emulates _Float16 arithmetic without the ISA) and computes in float16
    mod = cg.build(funcs, NATIVE)
    a, b, c = (RNG.uniform(-3, 3, n).astype(np.float16) for _ in range(3))
    out = np.empty(n, np.float16)
    mod["muladd"](a, b, c, out)
    np.testing.assert_allclose(out.astype(np.float32), (a * b + c).astype(np.float32),
                               rtol=2.0**-10, atol=2.0**-12)
    mod["scalar"](a, b, c, out)
    np.testing.assert_allclose(out.astype(np.float32), np.maximum(a * b, c).astype(np.float32),
                               rtol=2.0**-10)
    mod["exp"](a, out)
    np.testing.assert_allclose(out.astype(np.float32), np.exp(a.astype(np.float32)),
                               rtol=2.0**-10)
    o32 = np.empty(n, np.float32)
    mod["to_f32"](a, o32)
    np.testing.assert_array_equal(o32, a.astype(np.float32) * 2)


def test_native_float16_only_when_the_target_has_it():
    assert not cg.native_float16(WIDE)
    assert cg.native_float16(NATIVE) == cg.supports_float16()


@pytest.mark.parametrize("lp", ["float16", "bfloat16"])
def test_dense_conv_matmul_pool_accumulate_in_float32(lp):
    """With ``out_dtype="float32"`` the products of 16-bit inputs are summed in float32: 4096
    terms of 0.1 reach ~409.5, where a 16-bit accumulator would stall far below. Average
    pools of 16-bit data sum their windows in float32 too."""
    np_lp = BF16 if lp == "bfloat16" else np.float16
    k = 4096
    bb = g.BlockBuilder()
    x = g.Var("x", g.TensorStructInfo((2, k), lp))
    w = g.Var("w", g.TensorStructInfo((3, k), lp))
    img = g.Var("img", g.TensorStructInfo((1, k // 8, 4, 4), lp))
    ker = g.Var("ker", g.TensorStructInfo((2, k // 8, 3, 3), lp))
    pim = g.Var("pim", g.TensorStructInfo((1, 2, 64, 64), lp))
    with bb.function("main", [x, w, img, ker, pim]):
        with bb.dataflow():
            d = bb.emit(op.dense(x, w, out_dtype="float32"))
            m = bb.emit(op.matmul(x, op.transpose(w, (1, 0)), out_dtype="float32"))
            c = bb.emit(op.nn.conv2d(img, ker, padding=1, out_dtype="float32"))
            gp = bb.emit(op.nn.global_avg_pool2d(pim))
            ap = bb.emit(op.nn.avg_pool2d(pim, pool_size=(64, 64)))
            out = bb.emit_output(g.Tuple((d, m, c, gp, ap)))
        bb.emit_func_output(out)
    xv = np.full((2, k), 0.1, np_lp)
    wv = np.ones((3, k), np_lp)
    iv = np.full((1, k // 8, 4, 4), 0.1, np_lp)
    kv = np.ones((2, k // 8, 3, 3), np_lp)
    pv = np.full((1, 2, 64, 64), 0.1, np_lp)
    d, m, c, gp, ap = kiln.build(bb.get(), WIDE)(xv, wv, iv, kv, pv)
    exact = k * float(np_lp(0.1))
    for got in (d, m):
        assert got.dtype == np.float32
        np.testing.assert_allclose(got, exact, rtol=1e-5)
    assert c.dtype == np.float32
    # interior outputs: all 9 taps of all k / 8 channels inside the image
    np.testing.assert_allclose(c[:, :, 1:3, 1:3], (k // 8) * 9 * float(np_lp(0.1)), rtol=1e-5)
    for got in (gp, ap):
        assert got.dtype == np_lp
        np.testing.assert_array_equal(got.astype(np.float32), np.float32(np_lp(0.1)))
