"""Sequences, optionals and string tensors in the runtime (``kiln.runtime.host_values``,
``kiln.runtime.sequence_funcs``, ``kiln.runtime.string_funcs``): graphs built with the op API,
run, passed across the call boundary, saved and loaded; the host functions against numpy."""

from __future__ import annotations

import numpy as np
import pytest

import kiln
from kiln import graph as g
from kiln import op
from kiln.ir.dtype import DataType
from kiln.ir.errors import ArgumentError, KilnError, StructInfoError
from kiln.runtime import sequence_funcs, string_funcs
from kiln.runtime.plan import Plan

RNG = np.random.default_rng(7)


def _sequence_model():
    """x -> split into 3 pieces along axis 1, piece 1 doubled and appended, the pieces
    concatenated, plus the length and the sequence itself as outputs; s is a sequence input
    whose first element is added to the concatenation's first column block."""
    bb = g.BlockBuilder()
    x = g.Var("x", g.TensorStructInfo((4, 6), "float32"))
    s = g.Var("s", g.SequenceStructInfo(g.TensorStructInfo((4, 2), "float32")))
    with bb.function("main"):
        with bb.dataflow():
            parts = bb.emit(op.split_to_sequence(x, [g.const(np.array(2, np.int64))], axis=1))
            one = bb.emit(op.sequence_at(parts, g.const(np.array(1, np.int64))))
            doubled = bb.emit(op.add(one, one))
            longer = bb.emit(op.sequence_insert(parts, doubled, []))
            cat = bb.emit(op.concat_from_sequence(longer, axis=1))
            first = bb.emit(op.sequence_at(s, g.const(np.array(0, np.int64))))
            n = bb.emit(op.sequence_length(longer))
            out = bb.emit_output(g.Tuple([cat, n, longer, op.add(first, first)]))
        bb.emit_func_output(out, params=[x, s])
    return bb.get()


def _check_sequence_model(exe):
    x = RNG.standard_normal((4, 6)).astype("float32")
    s = [RNG.standard_normal((4, 2)).astype("float32") for _ in range(2)]
    cat, n, longer, first2 = exe(x, s)
    pieces = np.split(x, 3, axis=1)
    np.testing.assert_allclose(cat, np.concatenate([*pieces, 2 * pieces[1]], axis=1))
    assert n.shape == () and int(n) == 4
    assert isinstance(longer, list) and len(longer) == 4
    np.testing.assert_allclose(longer[3], 2 * pieces[1])
    np.testing.assert_allclose(first2, 2 * s[0])
    # outputs are the caller's: changing them does not change the next run
    longer[0][...] = 99
    assert not np.any(exe(x, s)[2][0] == 99)


def test_sequence_values_pass_between_steps_and_the_boundary():
    mod = _sequence_model()
    text = g.script(mod["main"])
    assert 'Sequence(Tensor((4, 2), "float32"), length=4)' in text
    exe = kiln.build(mod)
    _check_sequence_model(exe)
    plan = exe.plans["main"]
    assert plan.entry is None and plan.has_host_steps
    assert {spec.form for spec in plan.slots} == {"tensor", "sequence"}


def test_saved_executable_carries_sequences_and_strings(tmp_path):
    exe = kiln.build(_sequence_model())
    path = str(tmp_path / "seq.kiln")
    exe.save(path)
    _check_sequence_model(kiln.load(path))

    bb = g.BlockBuilder()
    words = g.Var("w", g.TensorStructInfo((3,), "string"))
    suffix = g.const(np.array(["-a", "-b", "-c"], dtype=object))
    with bb.function("main"):
        with bb.dataflow():
            cat = bb.emit(op.string_concat(words, suffix))
            ids = bb.emit(op.label_encoder(cat, keys=("x-a", "y-b"), values=(1, 2), default=0,
                                           dtype="int64"))
            out = bb.emit_output(g.Tuple([cat, ids]))
        bb.emit_func_output(out, params=[words])
    exe = kiln.build(bb.get())
    path = str(tmp_path / "str.kiln")
    exe.save(path)
    for runner in (exe, kiln.load(path)):
        cat, ids = runner(np.array(["x", "y", "z"]))
        assert cat.dtype == object and cat.tolist() == ["x-a", "y-b", "z-c"]
        np.testing.assert_array_equal(ids, [1, 2, 0])


def test_plan_json_round_trips_slot_forms():
    exe = kiln.build(_sequence_model())
    plan = exe.plans["main"]
    dtypes = {}
    for spec in plan.slots:
        dtypes.setdefault(spec.dtype, len(dtypes))
    back = Plan.from_json(plan.to_json(dtypes), list(dtypes), plan.constants)
    assert [(s.form, s.elem) for s in back.slots] == [(s.form, s.elem) for s in plan.slots]


def test_optional_values():
    bb = g.BlockBuilder()
    maybe = g.Var("maybe", g.OptionalStructInfo(g.TensorStructInfo((2,), "int64")))
    with bb.function("main"):
        with bb.dataflow():
            has = bb.emit(op.optional_has_element(maybe))
            wrapped = bb.emit(op.optional_wrap(has))
            none = bb.emit(op.optional_none(dtype="float32", ndim=1))
            out = bb.emit_output(g.Tuple([has, wrapped, none]))
        bb.emit_func_output(out, params=[maybe])
    exe = kiln.build(bb.get())
    has, wrapped, none = exe(None)
    assert not bool(has) and not bool(wrapped) and none is None
    has, wrapped, none = exe(np.array([1, 2]))
    assert bool(has) and bool(wrapped) and none is None
    with pytest.raises(ArgumentError, match="expected dtype int64"):
        exe(np.array([1.0, 2.0]))


def test_sequence_host_functions_match_numpy():
    x = RNG.standard_normal((5, 7)).astype("float32")
    parts = sequence_funcs.split_to_sequence(x, np.array(3), axis=1)
    assert [p.shape for p in parts] == [(5, 3), (5, 3), (5, 1)]
    np.testing.assert_array_equal(sequence_funcs.concat_from_sequence(parts, axis=1), x)
    rows = sequence_funcs.split_to_sequence(x, None, axis=0, keepdims=False)
    np.testing.assert_array_equal(sequence_funcs.concat_from_sequence(rows, 0, True), x)
    seq = [np.array(i) for i in range(4)]
    assert [int(v) for v in sequence_funcs.sequence_insert(seq, np.array(9), np.array(-1))] \
        == [0, 1, 2, 9, 3]
    assert [int(v) for v in sequence_funcs.sequence_erase(seq, np.array([-4]))] == [1, 2, 3]
    assert int(sequence_funcs.sequence_at(seq, np.array(-1))) == 3
    assert len(seq) == 4  # never modified in place
    for bad in (lambda: sequence_funcs.sequence_at(seq, np.array(4)),
                lambda: sequence_funcs.sequence_erase([], None),
                lambda: sequence_funcs.split_to_sequence(x, np.array([1, 2]), axis=1),
                lambda: sequence_funcs.concat_from_sequence([], axis=0)):
        with pytest.raises(ValueError):
            bad()


def test_string_host_functions():
    a = np.array([["ab", "c"], ["", "d e"]], dtype=object)
    np.testing.assert_array_equal(string_funcs.string_concat(a, np.array("!", dtype=object)),
                                  np.char.add(a.astype(str), "!").astype(object))
    assert string_funcs.string_concat(np.array("x", dtype=object),
                                      np.array("y", dtype=object)).shape == ()
    parts = string_funcs.string_split(a, "")
    assert parts.shape == (2, 2, 2) and parts[1, 1].tolist() == ["d", "e"]
    assert string_funcs.string_split_count(a, "").tolist() == [[1, 1], [0, 2]]
    out = string_funcs.string_normalizer(np.array(["The", "cat", "THE"], dtype=object),
                                         "UPPER", False, "", ("the",))
    assert out.tolist() == ["CAT"]
    with pytest.raises(ValueError, match=r"\[C\] or \[1, C\]"):
        string_funcs.string_normalizer(np.empty((2, 2), object))
    nums = string_funcs.cast_from_string(np.array(["1e3", "-inf", " 7 "], dtype=object),
                                         "float32")
    assert nums.dtype == np.float32 and nums[0] == 1000 and np.isneginf(nums[1])
    assert string_funcs.cast_from_string(np.array(["12", "-3"], dtype=object),
                                         "int16").tolist() == [12, -3]


def test_string_dtype():
    dt = DataType("string")
    assert str(dt) == "string" and dt.is_string and dt.to_numpy() == np.dtype(object)
    assert DataType.from_numpy(np.array(["a"]).dtype) == dt
    with pytest.raises(KilnError):
        DataType("string32")


def test_string_tensors_stay_off_kernels():
    """A string tensor given to a kernel op is refused: by the op's inference where it checks
    dtypes, else when the op would become a kernel."""
    w = g.Var("w", g.TensorStructInfo((3,), "string"))
    bb = g.BlockBuilder()
    with bb.function("main", params=[w]):
        with pytest.raises(StructInfoError, match="numeric"):
            bb.emit(op.add(w, w))
        with bb.dataflow():
            r = bb.emit_output(op.reshape(w, (3, 1)))
        bb.emit_func_output(r)
    with pytest.raises(StructInfoError, match="is a string tensor"):
        kiln.build(bb.get())


def test_described_inputs_and_outputs():
    exe = kiln.build(_sequence_model())
    assert [(i.name, i.dtype) for i in exe.inputs] == [("x", "float32"),
                                                        ("s", "sequence(float32)")]
    assert [o.dtype for o in exe.outputs] == ["float32", "int64", "sequence(float32)",
                                              "float32"]


def test_sequences_keep_their_tensors_when_the_workspace_is_reused():
    """x+1 goes into a sequence, then x+2 and x+3 are computed by kernels whose static temps
    may take x+1's workspace bytes: the sequence still holds x+1 (its tensors are copied out of
    reused memory when they go in)."""
    bb = g.BlockBuilder()
    x = g.Var("x", g.TensorStructInfo((16,), "float32"))
    with bb.function("main"):
        with bb.dataflow():
            seq = bb.emit(op.sequence_construct([op.add(x, g.const(np.float32(1)))]))
            for k in (2, 3):
                seq = bb.emit(op.sequence_insert(
                    seq, op.exp(op.add(x, g.const(np.float32(k)))), []))
            out = bb.emit_output(op.concat_from_sequence(seq, axis=0))
        bb.emit_func_output(out, params=[x])
    exe = kiln.build(bb.get())
    a = RNG.standard_normal(16).astype("float32")
    np.testing.assert_allclose(exe(a), np.concatenate([a + 1, np.exp(a + 2), np.exp(a + 3)]),
                               rtol=1e-5)


def test_an_element_output_is_the_callers():
    """SequenceAt of a constant's sequence is an output: changing it changes no later run."""
    bb = g.BlockBuilder()
    i = g.Var("i", g.TensorStructInfo((), "int64"))
    table = g.const(np.arange(6, dtype=np.float32).reshape(2, 3))
    with bb.function("main"):
        with bb.dataflow():
            seq = bb.emit(op.split_to_sequence(table, [], axis=0, keepdims=False))
            out = bb.emit_output(op.sequence_at(seq, i))
        bb.emit_func_output(out, params=[i])
    exe = kiln.build(bb.get())
    row = exe(np.array(1))
    row[...] = -1
    np.testing.assert_array_equal(exe(np.array(1)), [3, 4, 5])
