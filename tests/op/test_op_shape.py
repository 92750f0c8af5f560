"""Shape operators: StructInfo inference, errors, and numerics against numpy."""

from __future__ import annotations

import numpy as np
import pytest

from kiln import op, tir
from kiln.graph.block_builder import BlockBuilder
from kiln.graph.struct_info import TupleStructInfo
from kiln.ir.errors import KilnError, StructInfoError
from kiln.op.registry import MixedPrecision, OpPattern, get_op_def
from kiln.schedule import lookup_schedule
from kiln.testing.op_testing import check_exact, dims, infer, tvar

RNG = np.random.default_rng(2)


# ---------------------------------------------------------------------------------------------
# inference
# ---------------------------------------------------------------------------------------------
def test_reshape_inference():
    x = tvar("x", (2, 3, 4))
    assert dims(infer(op.reshape(x, (6, -1)))) == (6, 4)
    assert dims(infer(op.reshape(x, (-1,)))) == (24,)
    assert dims(infer(op.reshape(x, [4, 3, 2]))) == (4, 3, 2)
    with pytest.raises(StructInfoError, match=r"reshape: cannot reshape \(2, 3, 4\) into \(5, 5\)"):
        infer(op.reshape(x, (5, 5)))
    with pytest.raises(StructInfoError, match="not .*a multiple of 5"):
        infer(op.reshape(x, (5, -1)))
    with pytest.raises(KilnError, match="only one dimension may be -1"):
        op.reshape(x, (-1, -1))
    n = tir.Var("n", "int64")
    s = infer(op.reshape(tvar("y", (n, 4, 8)), (-1, 32)))
    assert s.shape[0] is n and dims(s)[1] == 32
    s = infer(op.reshape(tvar("y", (n, 4, 8)), (n, 2, -1)))
    assert s.shape[0] is n and dims(s)[1:] == (2, 16)
    s = infer(op.reshape(tvar("y", (n, 4)), (4, n)))
    assert s.shape[1] is n
    with pytest.raises(StructInfoError, match="reshape"):
        infer(op.reshape(tvar("y", (n, 4)), (8, -1)))
    s = infer(op.reshape(tvar("y", None, ndim=2), (3, -1)))
    assert s.shape is None and s.ndim == 2


def test_transpose_concat_split_inference():
    x = tvar("x", (2, 3, 4))
    assert dims(infer(op.transpose(x))) == (4, 3, 2)
    assert dims(infer(op.transpose(x, (1, -1, 0)))) == (3, 4, 2)
    with pytest.raises(StructInfoError, match="transpose: axes .* is not a permutation"):
        infer(op.transpose(x, (0, 1, 1)))
    with pytest.raises(StructInfoError, match="transpose: axes .* has 2 entries for rank 3"):
        infer(op.transpose(x, (0, 1)))

    n = tir.Var("n", "int64")
    s = infer(op.concat([x, tvar("y", (2, 5, 4)), tvar("z", (2, n, 4))], axis=-2))
    assert dims(s)[0] == 2 and dims(s)[2] == 4
    assert not isinstance(s.shape[1], tir.IntImm)  # 8 + n
    with pytest.raises(StructInfoError, match=r"concat: tensors\[1\] has shape \(2, 5, 5\)"):
        infer(op.concat([x, tvar("y", (2, 5, 5))], axis=1))
    with pytest.raises(StructInfoError, match=r"concat: tensors\[1\] has dtype int32"):
        infer(op.concat([x, tvar("y", (2, 3, 4), "int32")]))
    with pytest.raises(StructInfoError, match="concat: axis=3 is out of range"):
        infer(op.concat([x, x], axis=3))

    s = infer(op.split(x, 2))
    assert isinstance(s, TupleStructInfo) and [dims(f) for f in s.fields] == [(1, 3, 4)] * 2
    s = infer(op.split(x, (1, -1, 10), axis=-1))
    assert [dims(f) for f in s.fields] == [(2, 3, 1), (2, 3, 2), (2, 3, 1), (2, 3, 0)]
    with pytest.raises(StructInfoError, match="split: .* cannot be split into 3 equal sections"):
        infer(op.split(x, 3, axis=2))
    s = infer(op.split(tvar("y", (n, 8)), 4, axis=1))
    assert all(f.shape[0] is n and dims(f)[1] == 2 for f in s.fields)


def test_squeeze_expand_broadcast_inference():
    x = tvar("x", (1, 3, 1, 4))
    assert dims(infer(op.squeeze(x))) == (3, 4)
    assert dims(infer(op.squeeze(x, (0, -2)))) == (3, 4)
    assert dims(infer(op.squeeze(x, 2))) == (1, 3, 4)
    with pytest.raises(StructInfoError, match="squeeze: axis 1 has length 3"):
        infer(op.squeeze(x, 1))
    y = tvar("y", (3, 4))
    assert dims(infer(op.expand_dims(y, 0))) == (1, 3, 4)
    assert dims(infer(op.expand_dims(y, -1))) == (3, 4, 1)
    assert dims(infer(op.expand_dims(y, (0, 3)))) == (1, 3, 4, 1)
    assert dims(infer(op.expand_dims(y, (1, 2)))) == (3, 1, 1, 4)
    with pytest.raises(StructInfoError, match="expand_dims: axis=4 is out of range"):
        infer(op.expand_dims(y, 4))
    assert dims(infer(op.broadcast_to(tvar("z", (3, 1)), (2, 3, 5)))) == (2, 3, 5)
    with pytest.raises(StructInfoError, match=r"broadcast_to: cannot broadcast \(3, 2\)"):
        infer(op.broadcast_to(tvar("z", (3, 2)), (3, 5)))
    with pytest.raises(StructInfoError, match="lower-rank"):
        infer(op.broadcast_to(tvar("z", (2, 3, 2)), (3, 2)))


def test_slice_take_pad_inference():
    x = tvar("x", (9, 8))
    assert dims(infer(op.strided_slice(x, (1,), (7,)))) == (6, 8)
    assert dims(infer(op.strided_slice(x, (-1, 0), (None, 8), (-2, 3)))) == (5, 3)
    assert dims(infer(op.strided_slice(x, (2,), (2**31 - 1,), axes=(1,)))) == (9, 6)
    assert dims(infer(op.strided_slice(x, (100,), (200,)))) == (0, 8)
    with pytest.raises(KilnError, match="strides must be non-zero"):
        op.strided_slice(x, (0,), (1,), (0,))
    with pytest.raises(StructInfoError, match="strided_slice: axis=2 is out of range"):
        infer(op.strided_slice(x, (0,), (1,), axes=(2,)))

    ind = tvar("i", (3, 2), "int32")
    assert dims(infer(op.take(x, ind))) == (3, 2)
    assert dims(infer(op.take(x, ind, axis=1))) == (9, 3, 2)
    assert dims(infer(op.take(x, ind, axis=-2))) == (3, 2, 8)
    with pytest.raises(StructInfoError, match="take: indices must be an integer tensor"):
        infer(op.take(x, tvar("f", (3,))))
    with pytest.raises(KilnError, match="take: mode must be"):
        op.take(x, ind, 0, "throw")

    assert dims(infer(op.pad(x, ((1, 2), (0, 3))))) == (12, 11)
    with pytest.raises(StructInfoError, match="pad: pad_width has 1 entries for .* rank 2"):
        infer(op.pad(x, ((1, 2),)))
    with pytest.raises(KilnError, match="pad: mode must be"):
        op.pad(x, ((1, 2), (0, 0)), mode="wrap")
    with pytest.raises(KilnError, match="non-negative"):
        op.pad(x, ((1, -2), (0, 0)))


def test_symbolic_slice():
    n = tir.Var("n", "int64")
    s = infer(op.strided_slice(tvar("x", (n, 8)), (0, 2), (2**63 - 1, 6)))
    assert len(s.shape) == 2 and dims(s)[1] == 4


SHAPE_OPS = ("reshape", "transpose", "concat", "split", "squeeze", "expand_dims", "broadcast_to",
             "strided_slice", "take", "pad")


def test_declarations():
    for name in SHAPE_OPS:
        d = get_op_def(name)
        assert d.pattern == OpPattern.INJECTIVE
        assert d.mixed_precision == MixedPrecision.FOLLOW
        assert lookup_schedule(d.name, "c") is not None
        assert getattr(op, name) is d


# ---------------------------------------------------------------------------------------------
# numerics
# ---------------------------------------------------------------------------------------------
def test_reshape_transpose_numerics():
    x = RNG.standard_normal((2, 3, 4, 5)).astype(np.float32)
    xi = RNG.integers(0, 100, size=(7, 13)).astype(np.int32)
    s = np.float32(3.5).reshape(())
    cases = [
        ("reshape", [x], {"shape": (6, -1)}),
        ("reshape", [x], {"shape": (5, 4, 3, 2)}),
        ("reshape", [xi], {"shape": (-1,)}),
        ("reshape", [s], {"shape": (1, 1)}),
        ("transpose", [x], {}),
        ("transpose", [x], {"axes": (0, 2, 3, 1)}),
        ("transpose", [xi], {"axes": (-1, 0)}),
    ]
    expected = [
        x.reshape(6, -1), x.reshape(5, 4, 3, 2), xi.reshape(-1), s.reshape(1, 1),
        x.transpose(), x.transpose(0, 2, 3, 1), xi.T,
    ]
    check_exact(cases, expected)


def test_concat_split_numerics():
    a = RNG.standard_normal((2, 3, 4)).astype(np.float32)
    b = RNG.standard_normal((2, 5, 4)).astype(np.float32)
    c = RNG.standard_normal((2, 1, 4)).astype(np.float32)
    e = np.zeros((2, 0, 4), np.float32)
    x = RNG.integers(0, 50, size=(6, 9)).astype(np.int64)
    cases = [
        ("concat", [[a, b, c]], {"axis": 1}),
        ("concat", [[a, e, c]], {"axis": -2}),
        ("concat", [[a, a]], {"axis": 0}),
        ("concat", [[a]], {"axis": 2}),
        ("split", [x], {"indices_or_sections": 3}),
        ("split", [x], {"indices_or_sections": (2, -4, 20), "axis": 1}),
        ("split", [x], {"indices_or_sections": 1, "axis": -1}),
    ]
    expected = [
        np.concatenate([a, b, c], axis=1), np.concatenate([a, e, c], axis=1),
        np.concatenate([a, a], axis=0), a,
        np.split(x, 3), np.split(x, [2, -4, 20], axis=1), np.split(x, 1, axis=-1),
    ]
    check_exact(cases, expected)


def test_squeeze_expand_broadcast_numerics():
    x = RNG.standard_normal((1, 3, 1, 4)).astype(np.float32)
    y = RNG.integers(0, 9, size=(3, 1)).astype(np.int8)
    cases = [
        ("squeeze", [x], {}),
        ("squeeze", [x], {"axis": 2}),
        ("expand_dims", [y], {"axis": (0, 3)}),
        ("expand_dims", [y], {"axis": -2}),
        ("broadcast_to", [y], {"shape": (2, 3, 5)}),
        ("broadcast_to", [x], {"shape": (2, 2, 3, 7, 4)}),
    ]
    expected = [
        np.squeeze(x), np.squeeze(x, 2), np.expand_dims(y, (0, 3)), np.expand_dims(y, -2),
        np.broadcast_to(y, (2, 3, 5)).copy(), np.broadcast_to(x, (2, 2, 3, 7, 4)).copy(),
    ]
    check_exact(cases, expected)


SLICES = [
    ((1,), (7,), None, None),
    ((-1, 0), (None, 8), (-2, 3), None),
    ((2,), (2**31 - 1,), None, (1,)),
    ((-100, 100), (100, -100), (1, -1), None),
    ((5,), (1,), (-1,), (-1,)),
    ((8,), (-20,), (-3,), (0,)),
    ((3,), (3,), None, None),
]


def _np_slice(x, begin, end, strides, axes):
    idx = [slice(None)] * x.ndim
    axes = axes if axes is not None else range(len(begin))
    strides = strides or (1,) * len(begin)
    for a, b, e, s in zip(axes, begin, end, strides):
        idx[a] = slice(b, e, s)
    return x[tuple(idx)]


def test_strided_slice_numerics():
    x = RNG.standard_normal((9, 8)).astype(np.float32)
    cases = [("strided_slice", [x], {"begin": b, "end": e, "strides": s, "axes": a})
             for b, e, s, a in SLICES]
    check_exact(cases, [_np_slice(x, *sl).copy() for sl in SLICES])


def test_take_numerics():
    x = RNG.standard_normal((5, 6)).astype(np.float32)
    ind = np.array([[0, 4, -1], [7, -7, 2]], np.int32)
    ind64 = np.array([3, 0, 29, 5], np.int64)
    cases = [
        ("take", [x, ind], {"axis": 0, "mode": "clip"}),
        ("take", [x, ind], {"axis": 1, "mode": "wrap"}),
        ("take", [x, ind64], {"mode": "clip"}),
        ("take", [x, np.array([-1, 2, -6], np.int64)], {"axis": -1, "mode": "fast"}),
        ("take", [x, np.array(4, np.int32)], {"axis": 0}),
    ]
    expected = [
        np.take(x, ind, axis=0, mode="clip"),
        np.take(x, ind, axis=1, mode="wrap"),
        np.take(x, ind64, mode="clip"),
        np.take(x, [-1, 2, -6], axis=-1),
        np.take(x, 4, axis=0),
    ]
    check_exact(cases, expected)


def test_pad_numerics():
    x = RNG.standard_normal((3, 4)).astype(np.float32)
    xi = RNG.integers(-5, 5, size=(2, 3, 5)).astype(np.int32)
    one = np.array([[7.0]], np.float32)
    pw = ((1, 2), (0, 3))
    big = ((4, 5), (7, 6))
    cases = [
        ("pad", [x], {"pad_width": pw}),
        ("pad", [x], {"pad_width": pw, "pad_value": -1.5}),
        ("pad", [x], {"pad_width": pw, "mode": "edge"}),
        ("pad", [x], {"pad_width": pw, "mode": "reflect"}),
        ("pad", [x], {"pad_width": big, "mode": "reflect"}),
        ("pad", [one], {"pad_width": ((2, 1), (1, 2)), "mode": "reflect"}),
        ("pad", [xi], {"pad_width": ((0, 0), (1, 1), (2, 0)), "pad_value": 9}),
    ]
    expected = [
        np.pad(x, pw), np.pad(x, pw, constant_values=-1.5), np.pad(x, pw, mode="edge"),
        np.pad(x, pw, mode="reflect"), np.pad(x, big, mode="reflect"),
        np.pad(one, ((2, 1), (1, 2)), mode="edge"),
        np.pad(xi, ((0, 0), (1, 1), (2, 0)), constant_values=9),
    ]
    check_exact(cases, expected)


def test_reshape_groups_numerics():
    x = RNG.standard_normal((6, 4, 8)).astype(np.float32)
    y = RNG.standard_normal((3, 1, 4)).astype(np.float32)
    shapes = [
        (x, (24, 2, 4)), (x, (6, 32)), (x, (2, 3, 32)), (x, (6, 4, 2, 4)), (x, (1, 192, 1)),
        (y, (3, 4)), (y, (1, 12)), (y, (4, 1, 3)), (y, (12, 1)),
    ]
    cases = [("reshape", [a], {"shape": s}) for a, s in shapes]
    check_exact(cases, [a.reshape(s) for a, s in shapes])


def test_graph_end_to_end_symbolic():
    import kiln

    n = tir.Var("n", "int64")
    x = tvar("x", (n, 4, 8))
    idx = tvar("idx", (3,), "int64")
    bb = BlockBuilder()
    with bb.function("main", [x, idx]):
        with bb.dataflow():
            r = bb.emit(op.reshape(x, (-1, 32)))
            t = bb.emit(op.transpose(r))
            s = bb.emit(op.strided_slice(t, (1, 0), (2**31 - 1, 2**31 - 1), (3, 1)))
            # (every kernel keeps n as a plain dimension of some argument, so it can be bound)
            c = bb.emit(op.concat([s, s], axis=0))
            g = bb.emit(op.take(c, idx, axis=0))
            p = bb.emit(op.pad(op.expand_dims(g, 0), ((0, 0), (1, 1), (0, 2)), mode="edge"))
            gv = bb.emit_output(p)
        bb.emit_func_output(gv)
    exe = kiln.build(bb.get(), "c")
    for rows in (2, 5):
        xv = RNG.standard_normal((rows, 4, 8)).astype(np.float32)
        iv = np.array([0, 21, 13], np.int64)
        got = exe(xv, iv)
        s = xv.reshape(-1, 32).T[1::3]
        c = np.concatenate([s, s], axis=0)
        want = np.pad(np.take(c, iv, axis=0)[None], ((0, 0), (1, 1), (0, 2)), mode="edge")
        np.testing.assert_array_equal(got, want)
