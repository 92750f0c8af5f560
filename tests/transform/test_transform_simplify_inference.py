"""SimplifyInference: batch_norm -> multiply + add, dropout removed."""

import numpy as np

import kiln
from kiln import graph as g
from kiln import op
from kiln.ir import assert_structural_equal
from kiln.transform import SimplifyInference
from kiln.transform.simplify_inference import batch_norm_scale_shift

RNG = np.random.default_rng(11)
C = 3
GAMMA, BETA, MEAN = (RNG.standard_normal(C).astype("float32") for _ in range(3))
VAR = RNG.uniform(0.5, 2.0, C).astype("float32")


def _t(*shape):
    return g.TensorStructInfo(shape, "float32")


def _bn_model(stats, params=()):
    x = g.Var("x", _t(2, C, 4, 4))
    bb = g.BlockBuilder()
    with bb.function("main", [x, *params]):
        with bb.dataflow():
            y = bb.emit(op.nn.batch_norm(x, *stats, axis=1, epsilon=1e-3))
            out = bb.emit_output(op.nn.dropout(op.relu(y), 0.3))
        bb.emit_func_output(out)
    return bb.get(), x


def test_batch_norm_with_constant_stats_becomes_scale_and_shift():
    stats = [g.const(a) for a in (GAMMA, BETA, MEAN, VAR)]
    mod, x = _bn_model(stats)
    after = SimplifyInference()(mod)

    scale, shift = batch_norm_scale_shift(GAMMA, BETA, MEAN, VAR, 1e-3)
    bb = g.BlockBuilder()
    with bb.function("main", [x]):
        with bb.dataflow():
            m = bb.emit(op.multiply(x, g.const(scale.reshape(C, 1, 1))))
            y = bb.emit(op.add(m, g.const(shift.reshape(C, 1, 1))))
            r = bb.emit(op.relu(y))
            out = bb.emit_output(r)  # dropout is gone; the block output aliases its input
        bb.emit_func_output(out)
    assert_structural_equal(after["main"], bb.get()["main"])

    data = RNG.standard_normal((2, C, 4, 4)).astype("float32")
    np.testing.assert_allclose(kiln.build(after)(data), kiln.build(mod)(data),
                               rtol=1e-5, atol=1e-5)


def test_batch_norm_with_parameter_stats_is_computed_in_the_graph():
    params = [g.Var(n, _t(C)) for n in ("gamma", "beta", "mean", "var")]
    mod, _ = _bn_model(params, params)
    after = SimplifyInference()(mod)
    ops = [b.value.op.name for b in after["main"].body.blocks[0].bindings
           if isinstance(b.value, g.Call)]
    assert "nn.batch_norm" not in ops and "nn.dropout" not in ops
    assert {"rsqrt", "reshape", "multiply", "add", "subtract"} <= set(ops)
    data = RNG.standard_normal((2, C, 4, 4)).astype("float32")
    args = (data, GAMMA, BETA, MEAN, VAR)
    np.testing.assert_allclose(kiln.build(after)(*args), kiln.build(mod)(*args),
                               rtol=1e-5, atol=1e-5)


def test_channel_last_axis_broadcasts_without_reshape_padding():
    x = g.Var("x", _t(5, C))
    bb = g.BlockBuilder()
    with bb.function("main", [x]):
        with bb.dataflow():
            stats = [g.const(a) for a in (GAMMA, BETA, MEAN, VAR)]
            out = bb.emit_output(op.nn.batch_norm(x, *stats, axis=-1))
        bb.emit_func_output(out)
    mod = bb.get()
    after = SimplifyInference()(mod)
    mul = after["main"].body.blocks[0].bindings[0].value
    assert mul.args[1].data.shape == (C,)
    data = RNG.standard_normal((5, C)).astype("float32")
    np.testing.assert_allclose(kiln.build(after)(data), kiln.build(mod)(data), rtol=1e-5,
                               atol=1e-5)
