"""Gradient: the adjoint functions it builds (structure), its errors, and numerics of whole
model losses (an MLP and a small CNN) against finite differences in float64."""

from __future__ import annotations

import numpy as np
import pytest

import kiln
from kiln import graph as g
from kiln import op
from kiln.ir import IRModule, KilnError, assert_structural_equal
from kiln.transform import Gradient, list_passes

RNG = np.random.default_rng(3)


def _t(*shape, dtype="float32"):
    return g.TensorStructInfo(shape, dtype)


def _module(params, body_fn, name="main"):
    """A one-function module: ``body_fn(bb, *params)`` emits the bindings, returns the loss."""
    bb = g.BlockBuilder()
    with bb.function(name, params):
        with bb.dataflow():
            out = bb.emit_output(body_fn(bb, *params))
        bb.emit_func_output(out)
    return bb.get()


def _adjoint_of(params, body_fn):
    """Expected adjoint IR, built by hand: ``body_fn(bb, *params)`` returns (loss, grads)."""
    bb = g.BlockBuilder()
    with bb.function("main_adjoint", params, {"global_symbol": "main_adjoint"}):
        with bb.dataflow():
            loss, grads = body_fn(bb, *params)
            out = bb.emit_output(g.Tuple((loss, g.Tuple(tuple(grads)))))
        bb.emit_func_output(out)
    return bb.get()["main_adjoint"]


def one(dtype="float32"):
    return g.const(np.array(1, dtype=dtype))


def zero(dtype="float32"):
    return g.const(np.array(0, dtype=dtype))


# ---------------------------------------------------------------------------------------------
# structure
# ---------------------------------------------------------------------------------------------
def test_gradient_is_a_declared_pass():
    assert "Gradient" in [name for name, _, _ in list_passes()]
    assert Gradient().info.name == "Gradient"


def test_product_rule_structure():
    x, y = g.Var("x", _t(3)), g.Var("y", _t(3))
    mod = _module([x, y], lambda bb, x, y: op.sum(bb.emit(op.multiply(x, y))))
    after = Gradient("main")(mod)
    assert_structural_equal(after["main"], mod["main"])  # the original is kept as it was

    def expected(bb, x, y):
        lv = bb.emit(op.multiply(x, y))
        loss = bb.emit(op.sum(lv))
        seed = bb.emit(op.broadcast_to(one(), (3,)))
        return loss, [bb.emit(op.multiply(seed, y)), bb.emit(op.multiply(seed, x))]

    x2, y2 = g.Var("x", _t(3)), g.Var("y", _t(3))
    assert_structural_equal(after["main_adjoint"], _adjoint_of([x2, y2], expected))


def test_contributions_accumulate_without_zeros():
    """x is used twice: its adjoint is the first contribution itself plus the second; no zero
    tensor starts the sum."""
    x = g.Var("x", _t(2, 3))
    mod = _module([x], lambda bb, x: op.sum(bb.emit(op.add(bb.emit(op.exp(x)), x))))
    after = Gradient()(mod)

    def expected(bb, x):
        e = bb.emit(op.exp(x))
        s = bb.emit(op.add(e, x))
        loss = bb.emit(op.sum(s))
        seed = bb.emit(op.broadcast_to(one(), (2, 3)))
        via_exp = bb.emit(op.multiply(seed, e))
        return loss, [bb.emit(op.add(seed, via_exp))]

    assert_structural_equal(after["main_adjoint"], _adjoint_of([g.Var("x", _t(2, 3))], expected))


def test_broadcast_operand_gradient_is_collapsed():
    x, b = g.Var("x", _t(4, 3)), g.Var("b", _t(3))
    mod = _module([x, b], lambda bb, x, b: op.sum(bb.emit(op.add(x, b))))
    after = Gradient(require_grads=[b])(mod)

    def expected(bb, x, b):
        s = bb.emit(op.add(x, b))
        loss = bb.emit(op.sum(s))
        seed = bb.emit(op.broadcast_to(one(), (4, 3)))
        return loss, [bb.emit(op.collapse_sum_like(seed, b))]

    assert_structural_equal(after["main_adjoint"],
                            _adjoint_of([g.Var("x", _t(4, 3)), g.Var("b", _t(3))], expected))


def test_tuple_output_gets_zeros_only_for_the_unused_field():
    x = g.Var("x", _t(4, 2))

    def body(bb, x):
        parts = bb.emit(op.split(x, 2))
        first = bb.emit(g.TupleGetItem(parts, 0))
        return op.sum(first)

    after = Gradient()(_module([x], body))

    def expected(bb, x):
        parts = bb.emit(op.split(x, 2))
        first = bb.emit(g.TupleGetItem(parts, 0))
        loss = bb.emit(op.sum(first))
        seed = bb.emit(op.broadcast_to(one(), (2, 2)))
        zeros = bb.emit(op.broadcast_to(zero(), (2, 2)))
        return loss, [bb.emit(op.concat([seed, zeros], 0))]

    assert_structural_equal(after["main_adjoint"], _adjoint_of([g.Var("x", _t(4, 2))], expected))


def test_unused_parameter_gets_explicit_zeros_when_requested():
    x, y = g.Var("x", _t(3)), g.Var("y", _t(2, 2))
    after = Gradient(require_grads=["y", x])(_module([x, y], lambda bb, x, y: op.sum(x)))

    def expected(bb, x, y):
        loss = bb.emit(op.sum(x))
        seed = bb.emit(op.broadcast_to(one(), (3,)))
        return loss, [bb.emit(op.broadcast_to(zero(), (2, 2))), seed]

    assert_structural_equal(after["main_adjoint"],
                            _adjoint_of([g.Var("x", _t(3)), g.Var("y", _t(2, 2))], expected))


def test_only_requested_paths_are_differentiated_and_dead_bindings_removed():
    """With only gamma requested, layer_norm's rule emits intermediates for all three inputs;
    the ones only d(data) would use are dropped, and nothing flows into x's producer."""
    x, gm, bt = g.Var("x", _t(2, 5)), g.Var("gamma", _t(5)), g.Var("beta", _t(5))

    def body(bb, x, gm, bt):
        h = bb.emit(op.tanh(x))
        return op.sum(bb.emit(op.nn.layer_norm(h, gm, bt)))

    adj = Gradient(require_grads=[gm])(_module([x, gm, bt], body))["main_adjoint"]
    (block,) = adj.body.blocks
    names = [op_name(b.value) for b in block.bindings]
    assert "tanh" in names and names.count("tanh") == 1  # forward only: no tanh gradient
    used = set()
    for b in block.bindings:
        used.update(id(v) for v in g.free_vars(b.value))
    used.update(id(v) for v in g.free_vars(adj.body.body))
    forward = 3
    dead = [b.var.name for b in block.bindings[forward:] if id(b.var) not in used]
    assert not dead, f"unused backward bindings: {dead}"
    # the mean and variance for the normalized input; d(data)'s two further means are gone
    assert names.count("mean") == 2
    full = Gradient()(_module([x, gm, bt], body))["main_adjoint"]
    assert [op_name(b.value) for b in full.body.blocks[0].bindings].count("mean") == 4


def op_name(value):
    return value.op.name if isinstance(value, g.Call) and isinstance(value.op, g.Op) else ""


def test_cast_gradient_goes_back_to_the_input_dtype():
    x = g.Var("x", _t(3, dtype="float32"))
    mod = _module([x], lambda bb, x: op.sum(bb.emit(op.cast(x, "float64"))))
    adj = Gradient()(mod)["main_adjoint"]
    (grad_sinfo,) = adj.ret_struct_info.fields[1].fields
    assert grad_sinfo.dtype == "float32"
    exe = kiln.build(Gradient()(mod))
    _, (gx,) = exe["main_adjoint"](np.arange(3, dtype=np.float32))
    np.testing.assert_array_equal(gx, np.ones(3, np.float32))


def test_symbolic_shapes():
    n = kiln.tir.Var("n", "int64")
    x, w = g.Var("x", g.TensorStructInfo((n, 4), "float64")), g.Var("w", _t(4, dtype="float64"))

    def body(bb, x, w):
        return op.mean(bb.emit(op.multiply(bb.emit(op.relu(x)), w)))  # a symbolic count

    exe = kiln.build(Gradient()(_module([x, w], body)))
    for rows in (1, 3):
        xv = RNG.standard_normal((rows, 4))
        wv = RNG.standard_normal(4)
        loss, (gx, gw) = exe["main_adjoint"](xv, wv)
        np.testing.assert_allclose(loss, (np.maximum(xv, 0) * wv).mean())
        np.testing.assert_allclose(gx, (xv > 0) * wv / xv.size)
        np.testing.assert_allclose(gw, np.maximum(xv, 0).sum(0) / xv.size)


# ---------------------------------------------------------------------------------------------
# errors
# ---------------------------------------------------------------------------------------------
def test_result_must_be_a_scalar():
    x = g.Var("x", _t(3))
    with pytest.raises(KilnError, match=r"main must return a float scalar.*\(3,\)"):
        Gradient()(_module([x], lambda bb, x: op.exp(x)))


def test_bad_requests():
    x, i = g.Var("x", _t(3)), g.Var("i", _t(3, dtype="int64"))
    mod = _module([x, i], lambda bb, x, i: op.sum(x))
    with pytest.raises(KilnError, match="parameter i of main is not a float tensor"):
        Gradient(require_grads=[i])(mod)
    with pytest.raises(KilnError, match="no parameter.* named 'z'"):
        Gradient(require_grads=["z"])(mod)
    with pytest.raises(KilnError, match="is not a parameter of main"):
        Gradient(require_grads=[g.Var("x", _t(3))])(mod)
    with pytest.raises(KilnError, match="no function named 'other'"):
        Gradient("other")(mod)
    done = Gradient()(mod)
    with pytest.raises(KilnError, match="already has a function named 'main_adjoint'"):
        Gradient()(done)


def test_non_differentiable_operator_blocking_a_gradient_is_named():
    x, w = g.Var("x", _t(2, 3)), g.Var("w", _t(2))

    def body(bb, x, w):
        idx = bb.emit(op.argmax(x, axis=1))
        return op.sum(bb.emit(op.multiply(bb.emit(op.cast(idx, "float32")), w)))

    mod = _module([x, w], body)
    with pytest.raises(KilnError, match=r"with respect to parameter x is blocked: .*argmax "
                                        r"\(binding lv, 'x' \(input 0\)\).*not differentiable"):
        Gradient()(mod)
    adj = Gradient(require_grads=[w])(mod)  # w alone is fine
    assert "main_adjoint" in adj


def test_differentiating_through_a_non_differentiable_result_is_an_error():
    """An operator marked non-differentiable whose result receives a gradient (here a
    max_pool2d_backward inside the function) is reported with the input it would flow to."""
    x = g.Var("x", _t(1, 1, 4, 4))

    def body(bb, x):
        y = bb.emit(op.nn.max_pool2d(x, 2, 2))
        back = bb.emit(op.max_pool2d_backward(y, x, y, pool_size=2, strides=2))
        return op.sum(back)

    with pytest.raises(KilnError, match=r"nn.max_pool2d_backward \(binding lv1\) is not "
                                        r"differentiable.*respect to x.*'grad' \(input 0\)"):
        Gradient()(_module([x], body))


def test_gradient_runs_before_legalization_only():
    x = g.Var("x", _t(3))
    legal = kiln.transform.LegalizeOps()(_module([x], lambda bb, x: op.sum(bb.emit(op.exp(x)))))
    with pytest.raises(KilnError, match="call_tir; differentiate before LegalizeOps"):
        Gradient()(legal)


# ---------------------------------------------------------------------------------------------
# numerics: whole losses against finite differences (float64), full build pipeline
# ---------------------------------------------------------------------------------------------
def _check_against_finite_differences(mod, inputs, eps=1e-6):
    exe = kiln.build(Gradient()(mod))
    loss, grads = exe["main_adjoint"](*inputs)
    np.testing.assert_allclose(loss, exe(*inputs), rtol=1e-12)
    assert len(grads) == len(inputs)
    for i, (x, got) in enumerate(zip(inputs, grads)):
        want = np.zeros_like(x)
        for j in range(x.size):
            vals = []
            for sign in (1, -1):
                xs = [a.copy() for a in inputs]
                xs[i].reshape(-1)[j] += sign * eps
                vals.append(float(exe(*xs)))
            want.reshape(-1)[j] = (vals[0] - vals[1]) / (2 * eps)
        np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-7, err_msg=f"input {i}")
    return exe


def _cross_entropy(bb, logits, labels, classes):
    """mean over rows of -log_softmax(logits)[row, label], with a flat take."""
    rows = labels.shape[0]
    lp = bb.emit(op.nn.log_softmax(logits, axis=1))
    flat = bb.emit(op.reshape(lp, (-1,)))
    picked = bb.emit(op.take(flat, g.const(np.arange(rows) * classes + labels)))
    return op.negative(bb.emit(op.mean(picked)))


def test_mlp_softmax_cross_entropy_gradients():
    f64 = "float64"
    params = [g.Var("x", _t(4, 6, dtype=f64)), g.Var("w1", _t(8, 6, dtype=f64)),
              g.Var("b1", _t(8, dtype=f64)), g.Var("w2", _t(3, 8, dtype=f64)),
              g.Var("b2", _t(3, dtype=f64))]
    labels = np.array([0, 2, 1, 2])

    def body(bb, x, w1, b1, w2, b2):
        h = bb.emit(op.relu(bb.emit(op.add(bb.emit(op.dense(x, w1)), b1))))
        logits = bb.emit(op.add(bb.emit(op.dense(h, w2)), b2))
        return _cross_entropy(bb, logits, labels, 3)

    inputs = [RNG.standard_normal(p.struct_info.static_shape()) for p in params]
    exe = _check_against_finite_differences(_module(params, body), inputs)
    # the adjoint is an ordinary function of the executable, with its own execution plan
    assert "main_adjoint" in exe.plans


def test_cnn_gradients():
    f64 = "float64"
    params = [g.Var("x", _t(2, 1, 6, 6, dtype=f64)), g.Var("k", _t(3, 1, 3, 3, dtype=f64)),
              g.Var("w", _t(4, 12, dtype=f64)), g.Var("b", _t(4, dtype=f64))]
    labels = np.array([3, 1])

    def body(bb, x, k, w, b):
        c = bb.emit(op.relu(bb.emit(op.nn.conv2d(x, k, padding=1))))
        p = bb.emit(op.nn.max_pool2d(c, pool_size=2, strides=3))
        flat = bb.emit(op.reshape(p, (2, 12)))
        logits = bb.emit(op.add(bb.emit(op.dense(flat, w)), b))
        return _cross_entropy(bb, logits, labels, 4)

    inputs = [RNG.standard_normal(p.struct_info.static_shape()) for p in params]
    _check_against_finite_differences(_module(params, body), inputs)


def test_gradient_of_a_module_in_a_sequential_pipeline():
    """The adjoint goes through the other graph passes like any function."""
    from kiln.transform import DeadCodeElimination, FoldConstant, PassContext, Sequential

    x = g.Var("x", _t(3))
    mod = _module([x], lambda bb, x: op.sum(bb.emit(op.multiply(x, x))))
    seq = Sequential([Gradient(), FoldConstant(), DeadCodeElimination()])
    with PassContext(opt_level=2):
        out = seq(mod)
    assert isinstance(out, IRModule) and "main_adjoint" in out
    exe = kiln.build(out)
    xv = np.array([1.0, -2.0, 0.5], np.float32)
    _, (gx,) = exe["main_adjoint"](xv)
    np.testing.assert_allclose(gx, 2 * xv)
