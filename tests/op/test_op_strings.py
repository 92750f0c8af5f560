"""String operators (``kiln.op.strings``): inference and every op built and run against
numpy / Python's own string methods."""

from __future__ import annotations

import re

import ml_dtypes
import numpy as np
import pytest

import kiln
from kiln import graph as g
from kiln import op
from kiln.ir.errors import StructInfoError


def _text(words, shape):
    return np.array(words, dtype=object).reshape(shape)


def test_every_string_op_runs():
    s = g.Var("s", g.TensorStructInfo((2, 3), "string"))
    k = g.Var("k", g.TensorStructInfo((2, 3), "int64"))
    f = g.Var("f", g.TensorStructInfo((4,), "float32"))
    bb = g.BlockBuilder()
    with bb.function("main"):
        with bb.dataflow():
            cat = bb.emit(op.string_concat(s, g.const(np.array("_", dtype=object))))
            eq = bb.emit(op.string_equal(s, cat))
            split = bb.emit(op.string_split(s, delimiter="", maxsplit=None))
            count = bb.emit(op.string_split_count(s, delimiter="", maxsplit=None))
            match = bb.emit(op.regex_full_match(s, pattern=r"[a-z]+\d?"))
            row = bb.emit(op.reshape(op.cast(k, "float32"), (6,)))
            norm = bb.emit(op.string_normalizer(
                op.cast_to_string(row), case_change_action="UPPER", stopwords=("1.0",)))
            ids = bb.emit(op.label_encoder(s, keys=("a", "b c"), values=(1.5, 2.5),
                                           default=-1.0, dtype="float32"))
            cats = bb.emit(op.category_mapper(k, cats_strings=("one", "two"), cats_int64s=(1, 2),
                                              default_string="?"))
            back = bb.emit(op.cast_from_string(op.cast_to_string(f), dtype="float32"))
            out = bb.emit_output(g.Tuple([cat, eq, split, count, match, norm, ids, cats, back]))
        bb.emit_func_output(out, params=[s, k, f])
    exe = kiln.build(bb.get())
    words = ["a", "b c", "x9", "", " d  e ", "Zz"]
    ints = np.array([[1, 2, 3], [2, 1, 0]], np.int64)
    floats = np.random.default_rng(6).standard_normal(4).astype("float32")
    cat, eq, split, count, match, norm, ids, cats, back = exe(_text(words, (2, 3)), ints,
                                                             floats)
    assert cat.tolist() == _text([w + "_" for w in words], (2, 3)).tolist()
    assert not eq.any()
    assert count.tolist() == [[len(w.split()) for w in words[:3]],
                              [len(w.split()) for w in words[3:]]]
    assert split.shape == (2, 3, 2) and split[1, 1].tolist() == ["d", "e"]
    assert match.tolist() == [[bool(re.fullmatch(r"[a-z]+\d?", w)) for w in words[:3]],
                              [bool(re.fullmatch(r"[a-z]+\d?", w)) for w in words[3:]]]
    assert norm.tolist() == ["2.0", "3.0", "2.0", "0.0"]
    np.testing.assert_array_equal(ids, [[1.5, 2.5, -1], [-1, -1, -1]])
    assert cats.tolist() == [["one", "two", "?"], ["two", "one", "?"]]
    np.testing.assert_array_equal(back, floats)


def test_string_op_inference():
    s = g.Var("s", g.TensorStructInfo((1, 5), "string"))
    x = g.Var("x", g.TensorStructInfo((5,), "float32"))
    bb = g.BlockBuilder()
    with bb.function("main", params=[s, x]):
        kept = bb.emit(op.string_normalizer(s))
        assert kept.struct_info.static_shape() == (1, 5)  # no stop words: the shape stays
        dropped = bb.emit(op.string_normalizer(s, stopwords=("a",)))
        assert dropped.struct_info.shape is None and dropped.struct_info.ndim == 2
        both = bb.emit(op.string_concat(s, g.const(np.array(["x"] * 5, dtype=object))))
        assert both.struct_info.static_shape() == (1, 5)
        assert bb.emit(op.string_split(s)).struct_info.ndim == 3
        with pytest.raises(StructInfoError, match="must be a string tensor"):
            bb.emit(op.regex_full_match(x, pattern="a"))
        with pytest.raises(StructInfoError, match="string or int64"):
            bb.emit(op.category_mapper(x))
        with pytest.raises(StructInfoError, match="string tensor already"):
            bb.emit(op.cast_to_string(s))
        bb.emit_func_output(x)


def test_cast_to_string_of_ml_dtypes():
    """numpy has no text for bfloat16, float8 or int4 (fuzz 3036778 raised a TypeError): their
    values are written as float32 / int64 text, as float16's are."""
    vals = np.array([0.5, -1.25, 3.0], np.float32)
    for dtype, want in (("bfloat16", ["0.5", "-1.25", "3.0"]),
                        ("float8_e4m3fn", ["0.5", "-1.25", "3.0"]),
                        ("int4", ["0", "-1", "3"])):
        x = g.Var("x", g.TensorStructInfo((3,), dtype))
        bb = g.BlockBuilder()
        with bb.function("main"):
            with bb.dataflow():
                out = bb.emit_output(op.cast_to_string(x))
            bb.emit_func_output(out, params=[x])
        got = kiln.build(bb.get())(vals.astype(getattr(ml_dtypes, dtype)))
        assert got.tolist() == want, dtype
