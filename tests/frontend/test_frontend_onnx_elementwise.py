"""ONNX element-wise converters (math, activations, bit operations, Trilu/EyeLike, CastLike,
Mod) checked against ``onnx.reference`` on random inputs.

Each test builds one multi-node model, so every group is one kiln build (one C compile).
"""

from __future__ import annotations

import numpy as np
import pytest
from onnx import TensorProto, helper
from onnx.reference import ReferenceEvaluator

import kiln
from kiln.frontend.onnx import from_onnx
from kiln.ir import KilnError

OPSET = 28


def _model(nodes, inputs, outputs, opset=OPSET):
    graph = helper.make_graph(
        nodes, "g",
        [helper.make_tensor_value_info(n, t, s) for n, t, s in inputs],
        [helper.make_tensor_value_info(n, TensorProto.UNDEFINED, None) for n in outputs])
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", opset)])


def _run_both(model, feeds):
    mod, params = from_onnx(model)
    exe = kiln.build(mod, params=params)
    got = exe(**feeds)
    got = got if isinstance(got, (list, tuple)) else (got,)
    want = ReferenceEvaluator(model).run(None, feeds)
    return [np.asarray(v) for v in got], want


def _check(model, feeds, rtol=1e-5, atol=1e-6):
    got, want = _run_both(model, feeds)
    names = [o.name for o in model.graph.output]
    for name, a, b in zip(names, got, want):
        assert a.dtype == b.dtype, f"{name}: dtype {a.dtype}, expected {b.dtype}"
        assert a.shape == b.shape, f"{name}: shape {a.shape}, expected {b.shape}"
        if a.dtype.kind in "fc":
            np.testing.assert_allclose(a, b, rtol=rtol, atol=atol, err_msg=name)
        else:
            np.testing.assert_array_equal(a, b, err_msg=name)


def test_float_math_and_activations():
    rng = np.random.default_rng(0)
    x = rng.uniform(-4, 4, (4, 6)).astype("float32")
    x[0, :3] = [0.0, 1e-4, -3e-5]  # sign of zero / cancellation-prone small values
    unit = rng.uniform(-0.999, 0.999, (4, 6)).astype("float32")
    unit[0, :3] = [1.0, -1.0, 0.0]
    big = rng.uniform(1.0, 50.0, (4, 6)).astype("float32")
    slope = rng.uniform(0, 1, (6,)).astype("float32")
    n = helper.make_node
    nodes = [
        n("Tan", ["unit"], ["tan"]), n("Atan", ["x"], ["atan"]),
        n("Asin", ["unit"], ["asin"]), n("Acos", ["unit"], ["acos"]),
        n("Sinh", ["x"], ["sinh"]), n("Cosh", ["x"], ["cosh"]),
        n("Asinh", ["x"], ["asinh"]), n("Acosh", ["big"], ["acosh"]),
        n("Atanh", ["unit"], ["atanh_"]), n("Atan", ["big"], ["atan_big"]),
        n("Sign", ["x"], ["sign"]), n("Softsign", ["x"], ["softsign"]),
        n("ThresholdedRelu", ["x"], ["trelu"], alpha=0.5),
        n("Celu", ["x"], ["celu"], alpha=1.5),
        n("Shrink", ["x"], ["shrink"], lambd=1.2, bias=0.3),
        n("Swish", ["x"], ["swish"], alpha=0.7), n("Swish", ["x"], ["swish1"]),
        n("SwiGLU", ["x", "unit"], ["swiglu"], alpha=1.3),
        n("Mish", ["x"], ["mish"]), n("PRelu", ["x", "slope"], ["prelu"]),
        n("CastLike", ["x", "slope"], ["same"]),
    ]
    model = _model(nodes, [("x", TensorProto.FLOAT, (4, 6)), ("unit", TensorProto.FLOAT, (4, 6)),
                           ("big", TensorProto.FLOAT, (4, 6)),
                           ("slope", TensorProto.FLOAT, (6,))],
                   [nd.output[0] for nd in nodes])
    # the reference atanh(+-1) is +-inf like ours; compare finite values with rtol 2e-6
    _check(model, {"x": x, "unit": unit, "big": big, "slope": slope}, rtol=2e-6, atol=1e-7)


def test_elu_and_celu_keep_small_values():
    """``alpha * (exp(x / alpha) - 1)`` cancels for small ``x / alpha``: Celu with a large
    alpha gave 0 where the value is ``x`` (fuzz seed 3028583); Elu lost digits near 0. Both use
    an expm1 now: within a few ulps of onnx.reference (float64), infinities and NaN kept."""
    x = np.array([-2, -1e-3, 0.5, -50, -1e-30, -200, -np.inf, np.inf, np.nan, 0.0], "float32")
    n = helper.make_node
    nodes = [n("Celu", ["x"], ["celu_big"], alpha=1e10), n("Celu", ["x"], ["celu_mid"], alpha=3e7),
             n("Celu", ["x"], ["celu"], alpha=1.0), n("Elu", ["x"], ["elu"], alpha=2.5)]
    model = _model(nodes, [("x", TensorProto.FLOAT, (10,))], [nd.output[0] for nd in nodes])
    _check(model, {"x": x}, rtol=4e-7, atol=0)


def test_softplus_of_large_values_is_the_value():
    """``log(1 + exp(x))`` overflowed to inf for every float32 x above 88.7 (fuzz 3037945):
    compared with numpy's logaddexp(0, x) in float64, and an RNN's softplus activation too."""
    x = np.array([-1e30, -200, -20, -1, -1e-3, 0, 1e-3, 1, 20, 88, 89, 200, 1e30, np.inf,
                  -np.inf, np.nan], "float32")
    model = _model([helper.make_node("Softplus", ["x"], ["y"])],
                   [("x", TensorProto.FLOAT, (x.size,))], ["y"])
    mod, params = from_onnx(model)
    got = kiln.build(mod, params=params)(x=x)
    want = np.logaddexp(0, x.astype(np.float64)).astype(np.float32)
    np.testing.assert_allclose(got, want, rtol=2.5e-7, atol=0)
    for half in ("float16", "bfloat16"):  # computed in float32, rounded once
        xh = np.clip(x, -6e4, 6e4).astype(half) if half == "float16" else x.astype(half)
        tp = TensorProto.FLOAT16 if half == "float16" else TensorProto.BFLOAT16
        model = _model([helper.make_node("Softplus", ["x"], ["y"])], [("x", tp, (x.size,))],
                       ["y"])
        mod, params = from_onnx(model)
        got = kiln.build(mod, params=params)(x=xh)
        want = np.logaddexp(0, xh.astype(np.float64)).astype(half)
        np.testing.assert_array_equal(got.astype(np.float64), want.astype(np.float64))


def test_float64_math_keeps_precision():
    rng = np.random.default_rng(1)
    x = rng.uniform(-0.99, 0.99, (16,))
    nodes = [helper.make_node(o, ["x"], [o.lower()]) for o in ("Atan", "Asin", "Acos", "Tan")]
    model = _model(nodes, [("x", TensorProto.DOUBLE, (16,))], [nd.output[0] for nd in nodes])
    _check(model, {"x": x}, rtol=1e-13, atol=1e-15)


def test_nan_inf_and_mod_corners():
    vals = np.array([0.0, -0.0, 1.5, -2.5, np.inf, -np.inf, np.nan, 7.25], "float32")
    div = np.array([2.0, -2.0, np.inf, np.inf, 2.0, 3.0, 1.0, -3.5], "float32")
    n = helper.make_node
    nodes = [
        n("IsNaN", ["a"], ["isnan"]), n("IsInf", ["a"], ["isinf"]),
        n("IsInf", ["a"], ["isposinf"], detect_negative=0),
        n("IsInf", ["a"], ["isneginf"], detect_positive=0),
        n("Sign", ["a"], ["sign"]),
        n("Mod", ["a", "b"], ["fmod"], fmod=1), n("Mod", ["a", "b"], ["floormod"], fmod=0),
    ]
    model = _model(nodes, [("a", TensorProto.FLOAT, (8,)), ("b", TensorProto.FLOAT, (8,))],
                   [nd.output[0] for nd in nodes])
    got, want = _run_both(model, {"a": vals, "b": div})
    for a, b in zip(got, want):
        np.testing.assert_array_equal(a, b)


@pytest.mark.parametrize("dtype", ["int8", "uint16", "int32", "uint64"])
def test_integer_bit_ops_and_mod(dtype):
    rng = np.random.default_rng(2)
    info = np.iinfo(dtype)
    a = rng.integers(info.min, info.max, (3, 8), dtype=dtype, endpoint=True)
    b = rng.integers(info.min, info.max, (8,), dtype=dtype, endpoint=True)
    b[b == 0] = 3
    bits = info.bits
    lo = -2 if info.min < 0 else 0
    s = rng.integers(lo, bits + 3, (3, 8)).astype(dtype)
    s[0, :4] = [0, bits - 1, bits, 1]
    ttype = helper.np_dtype_to_tensor_dtype(np.dtype(dtype))
    n = helper.make_node
    nodes = [
        n("BitwiseAnd", ["a", "b"], ["and"]), n("BitwiseOr", ["a", "b"], ["or"]),
        n("BitwiseXor", ["a", "b"], ["xor"]), n("BitwiseNot", ["a"], ["not"]),
        n("Mod", ["a", "b"], ["mod"]), n("Mod", ["a", "b"], ["fmod"], fmod=1),
    ]
    inputs = [("a", ttype, (3, 8)), ("b", ttype, (8,))]
    if not dtype.startswith("int") or dtype in ("int8", "int32"):
        nodes += [n("BitShift", ["a", "s"], ["shl"], direction="LEFT"),
                  n("BitShift", ["a", "s"], ["shr"], direction="RIGHT")]
        inputs.append(("s", ttype, (3, 8)))
    model = _model(nodes, inputs, [nd.output[0] for nd in nodes])
    feeds = {"a": a, "b": b}
    if len(inputs) == 3:
        feeds["s"] = s
    got, want = _run_both(model, feeds)
    names = [nd.output[0] for nd in nodes]
    for name, x, y in zip(names, got, want):
        if name in ("shl", "shr"):  # the reference shifts with numpy: pin ONNX's rule here
            sh = s.astype("int64")
            ok = (sh >= 0) & (sh < bits)
            safe = np.where(ok, sh, 0).astype(dtype)
            y = (np.left_shift(a, safe) if name == "shl" else np.right_shift(a, safe))
            fill = (a < 0).astype(dtype) * np.array(-1).astype(dtype) if name == "shr" else 0
            y = np.where(ok, y, fill).astype(dtype)
        np.testing.assert_array_equal(x, y, err_msg=name)


@pytest.mark.parametrize("dtype", ["int8", "int16", "int32", "int64"])
def test_integer_division_corners_match_onnxruntime(dtype):
    """ONNX integer Div truncates toward zero; Mod (both modes) at the type's corners:
    ``INT_MIN / 2``, ``INT_MIN / -1`` (wraps), every sign combination. onnxruntime is the
    reference (it traps on ``INT64_MIN / -1`` and on a zero divisor, so those pairs are checked
    against the wrapped value and kiln's 0)."""
    ort = pytest.importorskip("onnxruntime")
    info = np.iinfo(dtype)
    vals = np.array([info.min, info.min + 1, -7, -6, -1, 0, 1, 2, 6, 7, info.max], dtype)
    a, b = np.repeat(vals, vals.size), np.tile(vals, vals.size)
    ttype = helper.np_dtype_to_tensor_dtype(np.dtype(dtype))
    n = helper.make_node
    nodes = [n("Div", ["a", "b"], ["div"]), n("Mod", ["a", "b"], ["mod"]),
             n("Mod", ["a", "b"], ["fmod"], fmod=1)]
    vis = [helper.make_tensor_value_info(v, ttype, ("n",)) for v in ("a", "b")]
    outs = [helper.make_tensor_value_info(v, ttype, ("n",)) for v in ("div", "mod", "fmod")]
    model = helper.make_model(helper.make_graph(nodes, "g", vis, outs),
                              opset_imports=[helper.make_opsetid("", 18)])
    mod, params = from_onnx(model)
    got = kiln.build(mod, params=params)(a=a, b=b)
    safe = (b != 0) & ~((a == info.min) & (b == -1))
    sess = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"])
    want = sess.run(None, {"a": a[safe], "b": b[safe]})
    for name, x, y in zip(("div", "mod", "fmod"), got, want):
        np.testing.assert_array_equal(x[safe], y, err_msg=name)
        assert (x[b == 0] == 0).all(), name
    assert got[0][(a == info.min) & (b == 2)] == info.min // 2  # was +2**(bits-2)
    assert got[0][(a == info.min) & (b == -1)] == info.min  # wraps, as numpy
    assert (got[1][(a == info.min) & (b == -1)] == 0).all()


def test_constant_shift_bool_xor_and_binarizer():
    a = np.arange(-8, 8, dtype="int32").reshape(2, 8)
    p = np.array([True, False, True, True])
    q = np.array([True, True, False, True])
    shift = helper.make_tensor("k", TensorProto.INT32, (), [31])
    n = helper.make_node
    nodes = [n("Constant", [], ["k"], value=shift),
             n("BitShift", ["a", "k"], ["shl31"], direction="LEFT"),
             n("BitShift", ["a", "k"], ["shr31"], direction="RIGHT"),
             n("Xor", ["p", "q"], ["xor"]),
             n("Binarizer", ["f"], ["bin"], domain="ai.onnx.ml", threshold=0.25)]
    graph = helper.make_graph(
        nodes, "g",
        [helper.make_tensor_value_info("a", TensorProto.INT32, (2, 8)),
         helper.make_tensor_value_info("p", TensorProto.BOOL, (4,)),
         helper.make_tensor_value_info("q", TensorProto.BOOL, (4,)),
         helper.make_tensor_value_info("f", TensorProto.FLOAT, (4,))],
        [helper.make_tensor_value_info(o, TensorProto.UNDEFINED, None)
         for o in ("shl31", "shr31", "xor", "bin")])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", OPSET),
                                                    helper.make_opsetid("ai.onnx.ml", 1)])
    f = np.array([0.1, 0.25, 0.3, -1.0], "float32")
    mod, params = from_onnx(model)
    shl, shr, xor, binz = kiln.build(mod, params=params)(a=a, p=p, q=q, f=f)
    np.testing.assert_array_equal(shl, np.left_shift(a, 31))
    np.testing.assert_array_equal(shr, np.right_shift(a, 31))
    np.testing.assert_array_equal(xor, p ^ q)
    np.testing.assert_array_equal(binz, (f > 0.25).astype("float32"))


def test_trilu_eyelike():
    rng = np.random.default_rng(3)
    x = rng.standard_normal((2, 4, 5)).astype("float32")
    k = helper.make_tensor("k", TensorProto.INT64, (), [-1])
    n = helper.make_node
    nodes = [n("Constant", [], ["kc"], value=k),
             n("Trilu", ["x"], ["triu"]), n("Trilu", ["x", "kc"], ["tril"], upper=0),
             n("Trilu", ["x", "kr"], ["triu_rt"]),
             n("EyeLike", ["e"], ["eye"], k=1), n("EyeLike", ["e"], ["eye_f"], dtype=1, k=-2)]
    model = _model(nodes, [("x", TensorProto.FLOAT, (2, 4, 5)), ("kr", TensorProto.INT64, ()),
                           ("e", TensorProto.INT32, (3, 4))],
                   [nd.output[0] for nd in nodes[1:]])
    for kr in (2, -3):
        _check(model, {"x": x, "kr": np.array(kr, "int64"), "e": np.zeros((3, 4), "int32")})


def test_det():
    rng = np.random.default_rng(4)
    n = helper.make_node
    nodes = [n("Det", [f"m{k}"], [f"det{k}"]) for k in (1, 2, 3, 4)]
    shapes = {1: (2, 1, 1), 2: (2, 2), 3: (3, 3, 3), 4: (2, 4, 4)}
    model = _model(nodes, [(f"m{k}", TensorProto.FLOAT, s) for k, s in shapes.items()],
                   [nd.output[0] for nd in nodes])
    feeds = {f"m{k}": rng.standard_normal(s).astype("float32") for k, s in shapes.items()}
    _check(model, feeds, rtol=1e-4, atol=1e-5)
    # above 4x4: an LU factorization with partial pivoting (kiln.op.matrix)
    big = _model([n("Det", ["m"], ["d"], name="d5"), n("Det", ["s"], ["ds"])],
                 [("m", TensorProto.FLOAT, (3, 5, 5)), ("s", TensorProto.FLOAT, (9, 9))],
                 ["d", "ds"])
    singular = rng.standard_normal((9, 9)).astype("float32")
    singular[4] = singular[1]
    _check(big, {"m": rng.standard_normal((3, 5, 5)).astype("float32"), "s": singular},
           rtol=1e-4, atol=1e-5)


def test_constant_inputs_fold_at_import():
    """Mod/CastLike/Sign/Bitwise* of constants are evaluated with numpy at import (shape
    arithmetic stays constant); the folded values match the reference."""
    a = helper.make_tensor("a", TensorProto.INT64, (4,), [-7, 7, 5, -5])
    b = helper.make_tensor("b", TensorProto.INT64, (4,), [3, -3, 2, 2])
    f = helper.make_tensor("f", TensorProto.FLOAT, (1,), [0.5])
    n = helper.make_node
    nodes = [n("Constant", [], ["a"], value=a), n("Constant", [], ["b"], value=b),
             n("Constant", [], ["f"], value=f),
             n("Mod", ["a", "b"], ["mod"]), n("Mod", ["a", "b"], ["fmod"], fmod=1),
             n("CastLike", ["a", "f"], ["castlike"]), n("Sign", ["a"], ["sign"]),
             n("BitwiseAnd", ["a", "b"], ["band"]), n("BitwiseNot", ["a"], ["bnot"])]
    outs = [nd.output[0] for nd in nodes[3:]]
    model = _model(nodes, [("x", TensorProto.FLOAT, (1,))], outs)
    mod, _ = from_onnx(model)
    script = mod["main"].script()
    assert not any(f"{o}(" in script for o in ("mod", "cast", "where", "bitwise_and", "subtract"))
    got = kiln.build(mod)(x=np.zeros(1, "float32"))
    want = ReferenceEvaluator(model).run(None, {"x": np.zeros(1, "float32")})
    for name, x, y in zip(outs, got, want):
        assert x.dtype == y.dtype, name
        np.testing.assert_array_equal(x, y, err_msg=name)


def test_errors_name_the_node():
    bad_mod = _model([helper.make_node("Mod", ["a", "b"], ["y"], fmod=2, name="m0")],
                     [("a", TensorProto.INT32, (3,)), ("b", TensorProto.INT32, (3,))], ["y"])
    with pytest.raises(KilnError, match="Mod node 'm0'.*fmod"):
        from_onnx(bad_mod)
    bad_trilu = _model([helper.make_node("Trilu", ["x"], ["y"], name="t0")],
                       [("x", TensorProto.FLOAT, (3,))], ["y"])
    with pytest.raises(KilnError, match="Trilu node 't0'.*rank"):
        from_onnx(bad_trilu)
    bad_shift = _model([helper.make_node("BitShift", ["a", "b"], ["y"], name="s0")],
                       [("a", TensorProto.INT32, (3,)), ("b", TensorProto.INT32, (3,))], ["y"])
    with pytest.raises(KilnError, match="BitShift node 's0'.*direction"):
        from_onnx(bad_shift)



@pytest.mark.parametrize("base,exp", [(TensorProto.INT64, TensorProto.FLOAT),
                                      (TensorProto.INT32, TensorProto.DOUBLE)])
def test_pow_of_an_integer_base_to_a_float_exponent(base, exp):
    """Computed in float64 and truncated, as numpy and onnxruntime do: 3 ** 2.5 is 15 (kiln
    cast the exponent to the base's type first: 3 ** 2 = 9); a NaN exponent gives what the
    float64-to-integer conversion gives (fuzz seed 3010037)."""
    model = _model([helper.make_node("Pow", ["x", "y"], ["z"])],
                   [("x", base, [5]), ("y", exp, [5])], ["z"], opset=15)
    xt = helper.tensor_dtype_to_np_dtype(base)
    yt = helper.tensor_dtype_to_np_dtype(exp)
    _check(model, {"x": np.array([3, 2, 5, 4, -3], xt),
                   "y": np.array([2.5, 3, 0.5, -1, 3], yt)})
