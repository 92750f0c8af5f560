"""Bit operators on tensors: ``bitwise_not``, ``left_shift``, ``right_shift`` (numpy's results
for every shift amount) and ``reinterpret`` (numpy ``view``), built and run against numpy."""

from __future__ import annotations

import ml_dtypes
import numpy as np
import pytest

import kiln
from kiln import graph as g
from kiln import op
from kiln.ir import StructInfoError
from kiln.op.registry import NON_DIFFERENTIABLE, OpPattern, get_op_def

INT_DTYPES = ["int8", "uint8", "int16", "uint16", "int32", "uint32", "int64", "uint64"]
RNG = np.random.default_rng(11)


def _ints(dtype, shape):
    info = np.iinfo(dtype)
    return RNG.integers(info.min, info.max, shape, dtype=dtype, endpoint=True)


def _run(build_outputs, inputs):
    """Build ``main(*inputs) -> tuple(build_outputs(vars))`` and run it on the arrays."""
    bb = g.BlockBuilder()
    params = [g.Var(f"x{k}", g.TensorStructInfo(a.shape, str(a.dtype)))
              for k, a in enumerate(inputs)]
    with bb.function("main"):
        with bb.dataflow():
            outs = [bb.emit_output(o) for o in build_outputs(*params)]
        bb.emit_func_output(g.Tuple(outs), params=params)
    return kiln.build(bb.get())(*inputs)


def test_declarations_and_inference():
    for name in ("bitwise_not", "left_shift", "right_shift", "reinterpret"):
        d = get_op_def(name)
        assert d.gradient is NON_DIFFERENTIABLE
        assert d.pattern in (OpPattern.ELEMWISE, OpPattern.BROADCAST)
    bb = g.BlockBuilder()
    a = g.Var("a", g.TensorStructInfo((3, 1), "uint16"))
    b = g.Var("b", g.TensorStructInfo((5,), "uint16"))
    out = bb.normalize(op.left_shift(a, b)).struct_info
    assert out.static_shape() == (3, 5) and out.dtype == "uint16"
    f = g.Var("f", g.TensorStructInfo((4,), "float16"))
    assert bb.normalize(op.reinterpret(f, "bfloat16")).struct_info.dtype == "bfloat16"
    with pytest.raises(StructInfoError, match="right_shift: lhs must be an integer tensor"):
        bb.normalize(op.right_shift(f, f))
    flag = g.Var("p", g.TensorStructInfo((4,), "bool"))
    with pytest.raises(StructInfoError, match="left_shift"):
        bb.normalize(op.left_shift(flag, flag))
    with pytest.raises(StructInfoError, match="reinterpret: x \\(float16\\).*32 bits"):
        bb.normalize(op.reinterpret(f, "int32"))


def test_shifts_and_not_every_integer_dtype():
    """One module: every dtype, broadcast amounts in and outside ``[0, bits)``."""
    feeds, refs = [], []
    for dtype in INT_DTYPES:
        bits = np.dtype(dtype).itemsize * 8
        x = _ints(dtype, (4, 16))
        x[0, :3] = [np.iinfo(dtype).min, np.iinfo(dtype).max, 0]
        lo = -3 if dtype.startswith("int") else 0
        s = RNG.integers(lo, bits + 3, (16,)).astype(dtype)
        s[:3] = [0, bits - 1, bits]
        feeds += [x, s]
        refs += [np.left_shift(x, s), np.right_shift(x, s), np.invert(x)]

    def build(*vs):
        outs = []
        for x, s in zip(vs[::2], vs[1::2]):
            outs += [op.left_shift(x, s), op.right_shift(x, s), op.bitwise_not(x)]
        return outs

    got = _run(build, feeds)
    for k, (a, b) in enumerate(zip(got, refs)):
        assert a.dtype == b.dtype
        np.testing.assert_array_equal(a, b, err_msg=f"{INT_DTYPES[k // 3]} output {k % 3}")


def test_bitwise_not_of_bool_is_logical_not():
    p = RNG.random(33) < 0.5
    (got,) = _run(lambda x: [op.bitwise_not(x)], [p])
    np.testing.assert_array_equal(got, ~p)


@pytest.mark.parametrize("src,dst", [("float32", "int32"), ("int32", "float32"),
                                     ("float64", "uint64"), ("float16", "int16"),
                                     ("uint16", "bfloat16"), ("bfloat16", "float16")])
def test_reinterpret_matches_numpy_view(src, dst):
    npt = {"bfloat16": np.dtype(ml_dtypes.bfloat16)}
    s, d = npt.get(src, np.dtype(src)), npt.get(dst, np.dtype(dst))
    bits = s.itemsize * 8
    raw = RNG.integers(0, 2**bits, (5, 7), dtype=np.uint64).astype(f"uint{bits}")
    x = raw.view(s)
    (got,) = _run(lambda v: [op.reinterpret(v, dst)], [x])
    assert got.dtype == d
    np.testing.assert_array_equal(got.view(raw.dtype), x.view(d).view(raw.dtype))
