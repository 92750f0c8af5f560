"""Sequence and optional operators (``kiln.op.sequence``): StructInfo inference (lengths,
element shapes, errors) and every op built and run against numpy."""

from __future__ import annotations

import numpy as np
import pytest

import kiln
from kiln import graph as g
from kiln import op
from kiln.ir.errors import StructInfoError

RNG = np.random.default_rng(5)


def _i64(v):
    return g.const(np.array(v, np.int64))


def test_inference_tracks_lengths_and_rejects_mixing():
    x = g.Var("x", g.TensorStructInfo((2, 3), "float32"))
    y = g.Var("y", g.TensorStructInfo((5, 3), "float32"))
    bb = g.BlockBuilder()
    with bb.function("main", params=[x, y]):
        seq = bb.emit(op.sequence_construct([x, y]))
        assert seq.struct_info.static_length == 2
        assert seq.struct_info.elem.shape is None and seq.struct_info.elem.ndim == 2
        longer = bb.emit(op.sequence_insert(seq, x, []))
        assert longer.struct_info.static_length == 3
        shorter = bb.emit(op.sequence_erase(longer, []))
        assert shorter.struct_info.static_length == 2
        empty = bb.emit(op.sequence_empty(dtype="float32"))
        one = bb.emit(op.sequence_insert(empty, x, []))
        # an empty sequence takes what comes
        assert one.struct_info.elem.static_shape() == (2, 3)
        with pytest.raises(StructInfoError, match="into a sequence of float32"):
            bb.emit(op.sequence_insert(seq, g.const(np.zeros(3, np.int32)), []))
        with pytest.raises(StructInfoError, match="share a dtype"):
            bb.emit(op.sequence_construct([x, g.const(np.zeros(3, np.int32))]))
        with pytest.raises(StructInfoError, match="must be a sequence"):
            bb.emit(op.sequence_length(x))
        with pytest.raises(StructInfoError, match="sequence is empty"):
            bb.emit(op.sequence_erase(empty, []))
        bb.emit_func_output(x)


def test_split_to_sequence_inference():
    x = g.Var("x", g.TensorStructInfo((4, 6), "float32"))
    bb = g.BlockBuilder()
    with bb.function("main", params=[x]):
        even = bb.emit(op.split_to_sequence(x, [_i64(3)], axis=1))
        assert even.struct_info.static_length == 2
        assert even.struct_info.elem.static_shape() == (4, 3)
        uneven = bb.emit(op.split_to_sequence(x, [_i64([1, 5])], axis=-1))
        assert uneven.struct_info.static_length == 2 and uneven.struct_info.elem.shape is None
        rows = bb.emit(op.split_to_sequence(x, [], axis=0, keepdims=False))
        assert rows.struct_info.static_length == 4
        assert rows.struct_info.elem.static_shape() == (6,)
        cat = bb.emit(op.concat_from_sequence(even, axis=0))
        assert cat.struct_info.static_shape() == (8, 3)
        stacked = bb.emit(op.concat_from_sequence(rows, axis=1, new_axis=True))
        assert stacked.struct_info.static_shape() == (6, 4)
        with pytest.raises(StructInfoError, match="out of range|axis"):
            bb.emit(op.split_to_sequence(x, [], axis=2))
        bb.emit_func_output(x)


def test_every_sequence_op_runs():
    """All sequence and optional ops in one graph, against numpy."""
    x = g.Var("x", g.TensorStructInfo((3, 4), "float32"))
    y = g.Var("y", g.TensorStructInfo((3, 4), "float32"))
    flag = g.Var("flag", g.TensorStructInfo((), "bool"))
    bb = g.BlockBuilder()
    with bb.function("main"):
        with bb.dataflow():
            seq = bb.emit(op.sequence_construct([x, y]))
            seq = bb.emit(op.sequence_insert(seq, op.multiply(x, y), [_i64(0)]))
            seq = bb.emit(op.sequence_erase(seq, [_i64(-1)]))        # [x*y, x]
            empty = bb.emit(op.sequence_empty(dtype="float32"))
            picked = bb.emit(op.select_value(flag, seq, empty))
            n = bb.emit(op.sequence_length(picked))
            at = bb.emit(op.sequence_at(seq, _i64(1)))
            parts = bb.emit(op.split_to_sequence(at, [_i64([1, 3])], axis=1))
            cat = bb.emit(op.concat_from_sequence(seq, axis=0, new_axis=True))
            opt = bb.emit(op.optional_wrap(at))
            none = bb.emit(op.optional_none(dtype="float32", ndim=2))
            has = bb.emit(op.optional_has_element(opt))
            has_none = bb.emit(op.optional_has_element(none))
            got = bb.emit(op.optional_get_element(opt))
            out = bb.emit_output(g.Tuple([n, cat, parts, has, has_none, op.negative(got)]))
        bb.emit_func_output(out, params=[x, y, flag])
    exe = kiln.build(bb.get())
    a, b = (RNG.standard_normal((3, 4)).astype("float32") for _ in range(2))
    for f in (True, False):
        n, cat, parts, has, has_none, neg = exe(a, b, np.array(f))
        assert int(n) == (2 if f else 0)
        np.testing.assert_allclose(cat, np.stack([a * b, a]), rtol=1e-6)
        assert [p.shape for p in parts] == [(3, 1), (3, 3)]
        np.testing.assert_array_equal(np.concatenate(parts, axis=1), a)
        assert bool(has) and not bool(has_none)
        np.testing.assert_array_equal(neg, -a)
