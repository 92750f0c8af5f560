"""End to end: models built with the graph builder compile, run and match numpy."""

import numpy as np
import pytest

import kiln
from kiln import graph as g
from kiln import op
from kiln.ir import ArgumentError, CompilerNotFoundError, KilnError
from kiln.testing import models


def _check(out, ref, rtol=1e-5):
    scale = float(np.max(np.abs(ref))) or 1.0
    np.testing.assert_allclose(out, ref, rtol=rtol, atol=rtol * scale)


@pytest.fixture(scope="module")
def mlp():
    model = models.mlp(batch=4, sizes=(64, 96, 32, 10))
    return model, kiln.build(model.mod, target="c")


@pytest.fixture(scope="module")
def cnn():
    model = models.small_cnn(batch=2, channels=8, size=16)
    return model, kiln.build(model.mod, target="c")


def test_mlp_matches_numpy(mlp):
    model, exe = mlp
    _check(exe(*model.inputs), model.reference(*model.inputs))


def test_cnn_matches_numpy(cnn):
    model, exe = cnn
    _check(exe(*model.inputs), model.reference(*model.inputs))
    x = np.random.default_rng(5).standard_normal(model.inputs[0].shape).astype("float32")
    _check(exe(x), model.reference(x))


def test_inputs_by_name(mlp):
    model, exe = mlp
    np.testing.assert_array_equal(exe(x=model.inputs[0]), exe(model.inputs[0]))
    with pytest.raises(KilnError, match="unknown input"):
        exe(y=model.inputs[0])


def test_save_and_load_gives_same_outputs(cnn, tmp_path):
    model, exe = cnn
    path = str(tmp_path / "cnn.kiln")
    exe.save(path)
    again = kiln.load(path)
    np.testing.assert_array_equal(again(*model.inputs), exe(*model.inputs))
    assert again.num_kernels == exe.num_kernels


def test_wrong_shape_names_input_and_both_shapes(mlp):
    _, exe = mlp
    with pytest.raises(ArgumentError, match=r"'x'.*\(4, 64\).*\(4, 63\)"):
        exe(np.zeros((4, 63), "float32"))


def test_wrong_dtype_names_input_and_both_dtypes(mlp):
    _, exe = mlp
    with pytest.raises(ArgumentError, match=r"'x'.*float32.*float64"):
        exe(np.zeros((4, 64), "float64"))


def test_wrong_rank_and_count(mlp):
    _, exe = mlp
    with pytest.raises(ArgumentError, match="rank"):
        exe(np.zeros((4, 64, 1), "float32"))
    with pytest.raises(ArgumentError, match="expected 1 input"):
        exe(np.zeros((4, 64), "float32"), np.zeros((4, 64), "float32"))


def test_outputs_are_fresh_arrays(mlp):
    model, exe = mlp
    a = exe(*model.inputs)
    b = exe(*model.inputs)
    assert a is not b and not np.shares_memory(a, b)


def test_non_contiguous_input(mlp):
    model, exe = mlp
    x = np.asfortranarray(model.inputs[0])
    _check(exe(x), model.reference(model.inputs[0]))


def test_symbolic_batch_runs_at_several_sizes():
    n = kiln.tir.Var("n", "int64")
    bb = g.BlockBuilder()
    x = g.Var("x", g.TensorStructInfo((n, 16), "float32"))
    w = np.random.default_rng(0).standard_normal((16, 8)).astype("float32")
    with bb.function("main", [x]):
        h = bb.emit(op.matmul(x, g.const(w)))
        y = bb.emit(op.nn.relu(h))
        bb.emit_func_output(y)
    exe = kiln.build(bb.get())
    for batch in (1, 3, 17):
        xv = np.random.default_rng(batch).standard_normal((batch, 16)).astype("float32")
        _check(exe(xv), np.maximum(xv @ w, 0))


def test_tuple_output():
    bb = g.BlockBuilder()
    x = g.Var("x", g.TensorStructInfo((4, 6), "float32"))
    with bb.function("main", [x]):
        a = bb.emit(op.exp(x))
        b = bb.emit(op.sum(x, axis=1))
        bb.emit_func_output(g.Tuple((a, b)))
    exe = kiln.build(bb.get())
    xv = np.random.default_rng(1).standard_normal((4, 6)).astype("float32")
    ea, eb = exe(xv)
    _check(ea, np.exp(xv))
    _check(eb, xv.sum(axis=1))


def test_missing_compiler_is_a_clear_error(monkeypatch, tmp_path):
    monkeypatch.setenv("CC", str(tmp_path / "no-such-cc"))
    monkeypatch.setenv("KILN_CACHE_DIR", str(tmp_path / "cache"))
    bb = g.BlockBuilder()
    x = g.Var("x", g.TensorStructInfo((3,), "float32"))
    with bb.function("main", [x]):
        bb.emit_func_output(bb.emit(op.exp(x)))
    with pytest.raises(CompilerNotFoundError, match="no-such-cc"):
        kiln.build(bb.get())


def test_compound_symbolic_dims_flow_through_kernels():
    """A kernel whose input shape is 2*n (after a concat) still binds its shape at run time."""
    n = kiln.tir.Var("n", "int64")
    bb = g.BlockBuilder()
    x = g.Var("x", g.TensorStructInfo((n, 4), "float32"))
    with bb.function("main", [x]):
        c = bb.emit(op.concat([x, x], axis=0))
        r = bb.emit(op.nn.relu(c))
        s = bb.emit(op.sum(r, axis=0))
        bb.emit_func_output(g.Tuple((r, s)))
    exe = kiln.build(bb.get())
    for batch in (1, 5):
        xv = np.random.default_rng(batch).standard_normal((batch, 4)).astype("float32")
        r, s = exe(xv)
        ref = np.maximum(np.concatenate([xv, xv]), 0)
        _check(r, ref)
        _check(s, ref.sum(axis=0))
