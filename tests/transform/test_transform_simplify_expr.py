"""SimplifyExpr: identities, no-op casts/reshapes, double transposes and negations."""

import numpy as np
import pytest

import kiln
from kiln import graph as g
from kiln import op
from kiln.ir import assert_structural_equal
from kiln.transform import DeadCodeElimination, SimplifyExpr


def _t(*shape, dtype="float32"):
    return g.TensorStructInfo(shape, dtype)


def _func(params, build):
    """Module with main(params) whose dataflow block is made by ``build(*params)``."""
    bb = g.BlockBuilder()
    with bb.function("main", params):
        with bb.dataflow():
            out = bb.emit_output(build(bb, *params))
        bb.emit_func_output(out)
    return bb.get()


def _identity(x):
    bb = g.BlockBuilder()
    with bb.function("main", [x]):
        bb.emit_func_output(x)
    return bb.get()


def _ones(shape, dtype="float32"):
    return g.const(np.ones(shape, dtype))


def _zeros(shape, dtype="float32"):
    return g.const(np.zeros(shape, dtype))


@pytest.mark.parametrize("make", [
    lambda x: op.multiply(x, _ones((1, 8))),
    lambda x: op.multiply(_ones((8,)), x),
    lambda x: op.divide(x, _ones((4, 1))),
    lambda x: op.add(x, _zeros((4, 8))),
    lambda x: op.add(_zeros((1,)), x),
    lambda x: op.subtract(x, g.const(np.array([-0.0] * 8, "float32"))),
    lambda x: op.cast(x, "float32"),
    lambda x: op.reshape(x, (4, 8)),
    lambda x: op.transpose(x, (0, 1)),
    lambda x: op.negative(op.negative(x)),
    lambda x: op.transpose(op.transpose(x)),
    lambda x: op.reshape(op.reshape(x, (32,)), (4, 8)),
])
def test_identity_becomes_the_input(make):
    x = g.Var("x", _t(4, 8))
    mod = _func([x], lambda bb, x: bb.emit(make(x)))
    after = DeadCodeElimination()(SimplifyExpr()(mod))
    assert_structural_equal(after["main"], _identity(x)["main"])


@pytest.mark.parametrize("make", [
    lambda x: op.multiply(x, _ones((2, 4, 8))),  # broadcasting grows the shape
    lambda x: op.multiply(x, g.const(np.full((8,), 2.0, "float32"))),
    lambda x: op.subtract(_zeros((8,)), x),  # 0 - x is not x
    lambda x: op.divide(_ones((8,)), x),
    lambda x: op.cast(x, "float16"),
    lambda x: op.transpose(x),
])
def test_non_identities_are_kept(make):
    x = g.Var("x", _t(4, 8))
    mod = _func([x], lambda bb, x: bb.emit(make(x)))
    assert SimplifyExpr()(mod)["main"] is mod["main"]


def test_integer_identity_needs_matching_dtype():
    x = g.Var("x", _t(6, dtype="int32"))
    mod = _func([x], lambda bb, x: bb.emit(op.add(x, g.const(np.zeros(6, "int32")))))
    assert_structural_equal(SimplifyExpr()(mod)["main"], _identity(x)["main"])


def test_reshape_chains_and_transposes_compose():
    x = g.Var("x", _t(2, 3, 4))

    def before(bb, x):
        a = bb.emit(op.expand_dims(x, 0))      # (1, 2, 3, 4)
        b = bb.emit(op.reshape(a, (6, 4)))
        c = bb.emit(op.squeeze(op.reshape(b, (1, 24))))
        t1 = bb.emit(op.transpose(x, (1, 2, 0)))   # (3, 4, 2)
        t2 = bb.emit(op.transpose(t1, (2, 0, 1)))  # back to (2, 3, 4): identity
        t3 = bb.emit(op.transpose(t1, (0, 2, 1)))  # (3, 2, 4)
        # reshape back to x's shape; transpose(t3, (1, 0, 2)) composes to the identity
        return bb.emit(op.add(op.reshape(c, (2, 3, 4)), op.add(t2, op.transpose(t3, (1, 0, 2)))))

    mod = _func([x], before)
    after = DeadCodeElimination()(SimplifyExpr()(mod))

    def expected(bb, x):
        return bb.emit(op.add(x, op.add(x, x)))

    assert_structural_equal(after["main"], _func([x], expected)["main"])
    # before DCE the composed forms are visible
    text = str(SimplifyExpr()(mod)["main"])
    assert "reshape(x, shape=(24,))" in text and "transpose(x, axes=(1, 0, 2))" in text
    data = np.random.default_rng(2).standard_normal((2, 3, 4)).astype("float32")
    np.testing.assert_array_equal(kiln.build(after)(data), kiln.build(mod)(data))


def test_output_alias_kept_when_input_is_a_dataflow_var():
    x = g.Var("x", _t(4))

    def before(bb, x):
        e = bb.emit(op.exp(x))
        return op.multiply(e, _ones((4,)))  # emitted as the block output

    after = SimplifyExpr()(_func([x], before))
    blk = after["main"].body.blocks[0]
    assert len(blk.bindings) == 2
    assert blk.bindings[1].value is blk.bindings[0].var  # gv = lv


def test_numerics_on_random_inputs():
    x = g.Var("x", _t(3, 5))

    def before(bb, x):
        a = bb.emit(op.add(op.multiply(x, _ones((5,))), _zeros((3, 5))))
        return bb.emit(op.tanh(op.negative(op.negative(a))))

    mod = _func([x], before)
    after = SimplifyExpr()(mod)
    assert len(after["main"].body.blocks[0].bindings) < len(mod["main"].body.blocks[0].bindings)
    data = np.random.default_rng(3).standard_normal((3, 5)).astype("float32")
    np.testing.assert_array_equal(kiln.build(after)(data), kiln.build(mod)(data))
