"""TIR bit operations (and/or/xor/not, shifts) and ``reinterpret``: construction, printing,
simplification, and generated C (scalar loops, vectorized loops, hand-written vectors) checked
against numpy."""

from __future__ import annotations

import ml_dtypes
import numpy as np
import pytest

from kiln import tir
from kiln.arith import Analyzer
from kiln.codegen import c as cg
from kiln.ir.errors import DTypeError
from kiln.testing.tir_testing import elementwise_func
from kiln.tir import Broadcast, BufferLoad, Ramp

RNG = np.random.default_rng(7)
INTS = ["int8", "uint8", "int16", "uint16", "int32", "uint32", "int64", "uint64"]
OPS = {
    "and": (tir.bitwise_and, np.bitwise_and),
    "or": (tir.bitwise_or, np.bitwise_or),
    "xor": (tir.bitwise_xor, np.bitwise_xor),
    "shl": (tir.shift_left, np.left_shift),  # numpy: amounts outside [0, bits) give 0
    "shr": (tir.shift_right, np.right_shift),  # ... or the sign fill
}


@pytest.fixture(autouse=True, scope="module")
def _cache_dir(tmp_path_factory):
    mp = pytest.MonkeyPatch()
    mp.setenv("KILN_CACHE_DIR", str(tmp_path_factory.mktemp("kiln_cache")))
    yield
    mp.undo()


def _ew(n, dtype, fcompute, in_dtypes, vectorize=None):
    return elementwise_func((n,), dtype, fcompute, nin=len(in_dtypes), vectorize=vectorize,
                            in_dtypes=in_dtypes)


def _random_ints(dtype, n):
    info = np.iinfo(dtype)
    return RNG.integers(info.min, info.max, n, dtype=dtype, endpoint=True)


def _shift_amounts(dtype, n):
    """Amounts in and around ``[0, bits)``: negative ones (signed types) and >= bits too."""
    bits = np.dtype(dtype).itemsize * 8
    lo = -3 if np.dtype(dtype).kind == "i" else 0
    return RNG.integers(lo, bits + 3, n).astype(dtype)


# ---------------------------------------------------------------------------------------------
# construction and printing
# ---------------------------------------------------------------------------------------------
def test_constructors_types_and_text():
    a, b = tir.Var("a", "int16"), tir.Var("b", "int16")
    assert tir.bitwise_and(a, b).dtype == "int16"
    assert isinstance(a ^ 3, tir.BitwiseXor) and (a ^ 3).b.dtype == "int16"
    s = tir.shift_left(a, tir.Var("k", "int32"))  # the amount takes the value's type
    assert s.dtype == "int16" and s.b.dtype == "int16"
    assert (a >> 2).dtype == "int16" and isinstance(a << 1, tir.ShiftLeft)
    u = tir.Var("u", "uint8")
    assert tir.bitwise_not(u).b.value == 255 and tir.bitwise_not(a).b.value == -1
    flag = tir.Var("f", "bool")
    assert isinstance(tir.bitwise_not(flag), tir.Not)
    r = tir.reinterpret("int32", tir.Var("x", "float32"))
    assert r.dtype == "int32" and r.op == "reinterpret"
    assert tir.reinterpret("float32x4", tir.Var("v", "int32x4")).dtype == "float32x4"
    text = str(tir.bitwise_or(a, b) + tir.shift_right(a, 1))
    assert "bitwise_or(a, b)" in text and "shift_right(a, int16(1))" in text
    assert str(r) == "reinterpret(int32, x)"


def test_constructors_reject_bad_operands():
    f = tir.Var("f", "float32")
    with pytest.raises(DTypeError, match="BitwiseAnd needs integer or bool"):
        tir.bitwise_and(f, f)
    with pytest.raises(DTypeError, match="ShiftLeft needs integer"):
        tir.shift_left(tir.Var("b", "bool"), 1)
    with pytest.raises(DTypeError, match="same bits"):
        tir.reinterpret("int64", f)
    with pytest.raises(DTypeError, match="same bits and lanes"):
        tir.reinterpret("int32x8", tir.Var("v", "float32x4"))
    with pytest.raises(DTypeError, match="bool"):
        tir.reinterpret("uint8", tir.Var("b", "bool"))


# ---------------------------------------------------------------------------------------------
# simplifier
# ---------------------------------------------------------------------------------------------
@pytest.mark.parametrize("dtype", ["int8", "uint8", "int32", "uint64"])
def test_simplifier_folds_constants_like_numpy(dtype):
    ana = Analyzer()
    xs, ys = _random_ints(dtype, 24), _shift_amounts(dtype, 24)
    for name, (build, ref) in OPS.items():
        for x, y in zip(xs, ys if name in ("shl", "shr") else xs[::-1]):
            got = ana.simplify(build(tir.const(dtype, int(x)), tir.const(dtype, int(y))))
            assert isinstance(got, tir.IntImm), (name, got)
            assert got.value == int(ref(x, y)), (name, dtype, x, y)
    got = ana.simplify(tir.bitwise_not(tir.const(dtype, int(xs[0]))))
    assert got.value == int(np.invert(xs[0]))


def test_simplifier_identities_and_vectors():
    ana = Analyzer()
    x = tir.Var("x", "int32")
    assert ana.simplify(tir.bitwise_or(x, 0)) is x
    assert ana.simplify(tir.bitwise_xor(0, x)) is x
    assert ana.simplify(tir.bitwise_and(x, -1)) is x
    assert ana.simplify(tir.bitwise_and(x, 0)).value == 0
    assert ana.simplify(tir.shift_left(x, 0)) is x
    assert ana.simplify(tir.shift_right(tir.const("int32", 0), x)).value == 0
    vec = tir.bitwise_and(Broadcast(tir.const("int32", 12), 4),
                          Broadcast(tir.const("int32", 10), 4))
    got = ana.simplify(vec)
    assert isinstance(got, Broadcast) and got.value.value == 8
    # bounds: x & 255 is in [0, 255], so the comparison folds
    assert ana.simplify(tir.bitwise_and(x, 255) < 256).value == 1
    assert ana.simplify(tir.bitwise_and(x, 255) >= 0).value == 1


def test_simplifier_folds_reinterpret():
    ana = Analyzer()
    got = ana.simplify(tir.reinterpret("int32", tir.const("float32", 1.0)))
    assert got.value == 0x3F800000
    got = ana.simplify(tir.reinterpret("float64", tir.const("int64", -(2**63))))
    assert got.value == 0.0 and np.signbit(got.value)
    got = ana.simplify(tir.reinterpret("uint16x4", Broadcast(tir.const("int16", -1), 4)))
    assert isinstance(got, Broadcast) and got.value.value == 0xFFFF


# ---------------------------------------------------------------------------------------------
# generated C
# ---------------------------------------------------------------------------------------------
@pytest.mark.parametrize("dtype", INTS)
def test_bit_ops_run_like_numpy(dtype):
    """Every op, scalar loop and vectorized loop (8 lanes), random values and shift amounts
    (negative and >= the bit width included)."""
    n = 64
    funcs = {}
    for name, (build, _) in OPS.items():
        funcs[name] = _ew(n, dtype, build, [dtype, dtype])
        funcs[f"{name}_v8"] = _ew(n, dtype, build, [dtype, dtype], vectorize=8)
        # a constant amount: the plain C shift (and the vector-by-scalar form)
        funcs[f"{name}_c3_v8"] = _ew(n, dtype, lambda a, f=build: f(a, 3), [dtype], vectorize=8)
    funcs["not"] = _ew(n, dtype, tir.bitwise_not, [dtype])
    funcs["not_v8"] = _ew(n, dtype, tir.bitwise_not, [dtype], vectorize=8)
    mod = cg.build(funcs)
    x = _random_ints(dtype, n)
    for name, (_, ref) in OPS.items():
        y = _shift_amounts(dtype, n) if name in ("shl", "shr") else _random_ints(dtype, n)
        for suffix in ("", "_v8"):
            out = np.zeros(n, dtype)
            mod[name + suffix](x, y, out)
            np.testing.assert_array_equal(out, ref(x, y), err_msg=f"{name}{suffix} {dtype}")
        out = np.zeros(n, dtype)
        mod[f"{name}_c3_v8"](x, out)
        np.testing.assert_array_equal(out, ref(x, np.asarray(3, dtype)), err_msg=name)
    for suffix in ("", "_v8"):
        out = np.zeros(n, dtype)
        mod["not" + suffix](x, out)
        np.testing.assert_array_equal(out, np.invert(x))


def test_bool_bit_ops_scalar_and_vector():
    n = 40
    funcs = {}
    for name in ("and", "or", "xor"):
        funcs[name] = _ew(n, "bool", OPS[name][0], ["bool", "bool"])
        funcs[name + "_v8"] = _ew(n, "bool", OPS[name][0], ["bool", "bool"], vectorize=8)
    mod = cg.build(funcs)
    a, b = RNG.random(n) < 0.5, RNG.random(n) < 0.5
    for name in ("and", "or", "xor"):
        for suffix in ("", "_v8"):
            out = np.zeros(n, bool)
            mod[name + suffix](a, b, out)
            np.testing.assert_array_equal(out, OPS[name][1](a, b), err_msg=name + suffix)


@pytest.mark.parametrize("dtype", ["int4", "uint4"])
def test_sub_byte_integers_wrap_to_their_width(dtype):
    n = 32
    npt = getattr(ml_dtypes, dtype)
    funcs = {"shl": _ew(n, dtype, tir.shift_left, [dtype, dtype]),
             "shr": _ew(n, dtype, tir.shift_right, [dtype, dtype]),
             "not": _ew(n, dtype, tir.bitwise_not, [dtype]),
             "xor_v8": _ew(n, dtype, tir.bitwise_xor, [dtype, dtype], vectorize=8)}
    mod = cg.build(funcs)
    lo = -8 if dtype == "int4" else 0
    xi = RNG.integers(lo, lo + 16, n)
    yi = RNG.integers(max(lo, -2), 6, n)
    x, y = xi.astype(npt), yi.astype(npt)

    def wrap(v):
        v = np.asarray(v) & 15
        return np.where(v >= 8, v - 16, v) if dtype == "int4" else v

    want = {"shl": wrap(np.where((yi >= 0) & (yi < 4), xi << np.clip(yi, 0, 3), 0)),
            "shr": np.where((yi >= 0) & (yi < 4), xi >> np.clip(yi, 0, 3), np.where(xi < 0, -1, 0)),
            "not": wrap(~xi), "xor_v8": wrap(xi ^ yi)}
    for name, ref in want.items():
        out = np.zeros(n, npt)
        mod[name](*((x,) if name == "not" else (x, y)), out)
        np.testing.assert_array_equal(out.astype(np.int64), ref, err_msg=name)


PAIRS = [("float32", "int32"), ("int32", "float32"), ("float32", "uint32"),
         ("float64", "int64"), ("uint64", "float64"), ("float16", "int16"),
         ("uint16", "float16"), ("bfloat16", "uint16"), ("int16", "bfloat16"),
         ("float16", "bfloat16")]


def _np(dtype):
    return np.dtype(ml_dtypes.bfloat16) if dtype == "bfloat16" else np.dtype(dtype)


def _source_values(dtype, n, keep_nan=True):
    if np.dtype(_np(dtype)).kind in "iu":
        return _random_ints(dtype, n)
    bits = np.dtype(_np(dtype)).itemsize * 8
    raw = RNG.integers(0, 2**bits, n, dtype=np.uint64).astype(f"uint{bits}").view(_np(dtype))
    vals = raw.copy()
    if not keep_nan:  # a soft-float NaN computed in float32 may lose its payload (documented)
        vals[np.isnan(vals)] = 0
    vals[:4] = np.array([0.0, -0.0, np.inf, -np.inf]).astype(_np(dtype))
    return vals


@pytest.mark.parametrize("src,dst", PAIRS)
def test_reinterpret_runs_like_numpy_view(src, dst):
    n = 48
    funcs = {"scalar": _ew(n, dst, lambda a: tir.reinterpret(dst, a), [src]),
             "vloop": _ew(n, dst, lambda a: tir.reinterpret(dst, a), [src], vectorize=8)}
    mod = cg.build(funcs)
    x = _source_values(src, n)
    want = x.view(_np(dst))
    for name in funcs:
        out = np.zeros(n, _np(dst))
        mod[name](x, out)
        np.testing.assert_array_equal(out.view(f"uint{out.itemsize * 8}"),
                                      want.view(f"uint{out.itemsize * 8}"), err_msg=name)


@pytest.mark.parametrize("src,dst,lanes", [("float32", "int32", 4), ("int64", "float64", 2),
                                           ("float16", "uint16", 8), ("uint8", "int8", 16)])
def test_reinterpret_of_vector_expressions(src, dst, lanes):
    """Hand-written vector TIR (Ramp loads): the vector cast path, and bit ops on its lanes."""
    c64 = lambda v: tir.const("int64", v)  # noqa: E731
    n = lanes * 4
    A = tir.decl_buffer((c64(n),), src, "A")
    B = tir.decl_buffer((c64(n),), dst, "B")
    i = tir.Var("i", "int64")
    idx = Ramp(i * c64(lanes), c64(1), lanes)
    value = tir.reinterpret(f"{dst}x{lanes}", BufferLoad(A, (idx,)))
    if dst.startswith("int"):  # flip the sign bit of every lane: a vector bit op on top
        top = Broadcast(tir.const(dst, np.iinfo(dst).min), lanes)
        value = tir.bitwise_xor(value, top)
    body = tir.For(i, c64(0), c64(4), tir.ForKind.SERIAL, tir.BufferStore(B, value, (idx,)))
    params = [tir.Var(nm, "handle") for nm in "AB"]
    func = tir.PrimFunc(params, dict(zip(params, (A, B))), body, {"kiln.lowered": True})
    mod = cg.build({"vec": func})
    x = _source_values(src, n, keep_nan=False)
    out = np.zeros(n, dst)
    mod["vec"](x, out)
    want = x.view(dst)
    if dst.startswith("int"):
        want = want ^ np.array(np.iinfo(dst).min, dst)
    np.testing.assert_array_equal(out.view(f"uint{out.itemsize * 8}"),
                                  want.view(f"uint{out.itemsize * 8}"))


def test_visitors_rebuild_and_compare_the_new_nodes():
    from kiln.ir.node import structural_equal

    x, y = tir.Var("x", "int32"), tir.Var("y", "int32")
    e = tir.bitwise_or(tir.shift_left(x, 2), tir.reinterpret("int32", tir.cast("float32", x)))
    swapped = tir.substitute(e, {x: y})
    want = tir.bitwise_or(tir.shift_left(y, 2), tir.reinterpret("int32", tir.cast("float32", y)))
    assert structural_equal(swapped, want, map_free_vars=False)
    assert not structural_equal(swapped, e, map_free_vars=False)
    assert not structural_equal(e, tir.bitwise_xor(e.a, e.b))  # the node type matters
    assert tir.collect_vars(e) == [x]
    seen: list[str] = []
    tir.post_order_visit(e, lambda n: seen.append(type(n).__name__))
    assert {"BitwiseOr", "ShiftLeft", "Call", "Cast"} <= set(seen)
