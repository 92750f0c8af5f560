"""kiln.training: losses, optimizers and the compiled train step against a numpy re-implementation
(forward, backward by hand, SGD-momentum and Adam updates), and the training example."""

from __future__ import annotations

import importlib.util
import os

import numpy as np
import pytest

import kiln
from kiln import graph as g
from kiln import op, training
from kiln.graph.struct_info import TensorStructInfo
from kiln.ir.errors import ArgumentError, KilnError, StructInfoError
from kiln.ir.module import IRModule

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
BATCH, IN, HIDDEN, OUT = 8, 4, 16, 3


# ---------------------------------------------------------------------------------------------
# a one-hidden-layer MLP in kiln and in numpy
# ---------------------------------------------------------------------------------------------
def build_mlp(batch: int) -> IRModule:
    x = g.Var("x", TensorStructInfo((batch, IN), "float32"))
    w0 = g.Var("w0", TensorStructInfo((HIDDEN, IN), "float32"))
    b0 = g.Var("b0", TensorStructInfo((HIDDEN,), "float32"))
    w1 = g.Var("w1", TensorStructInfo((OUT, HIDDEN), "float32"))
    b1 = g.Var("b1", TensorStructInfo((OUT,), "float32"))
    bb = g.BlockBuilder()
    # data input in the middle: the trainer finds parameters by name, not position
    with bb.function("main", [w0, b0, x, w1, b1]):
        with bb.dataflow():
            h = bb.emit(op.nn.relu(op.add(op.dense(x, w0), b0)))
            out = bb.emit_output(op.add(op.dense(h, w1), b1))
        bb.emit_func_output(out)
    return bb.get()


def init_params(seed: int = 0) -> dict[str, np.ndarray]:
    rng = np.random.default_rng(seed)
    return {
        "w0": (rng.standard_normal((HIDDEN, IN)) * 0.5).astype("float32"),
        "b0": (rng.standard_normal(HIDDEN) * 0.1).astype("float32"),
        "w1": (rng.standard_normal((OUT, HIDDEN)) * 0.5).astype("float32"),
        "b1": (rng.standard_normal(OUT) * 0.1).astype("float32"),
    }


def batches(seed: int = 1, steps: int = 3):
    rng = np.random.default_rng(seed)
    for _ in range(steps):
        x = rng.standard_normal((BATCH, IN)).astype("float32")
        labels = rng.integers(0, OUT, BATCH)
        yield x, labels


def np_forward_backward(p, x, target, loss):
    """(loss, grads) of the MLP by hand, in float64."""
    p = {k: v.astype(np.float64) for k, v in p.items()}
    x = x.astype(np.float64)
    h = x @ p["w0"].T + p["b0"]
    a = np.maximum(h, 0)
    z = a @ p["w1"].T + p["b1"]
    if loss == "sce":
        zs = z - z.max(axis=1, keepdims=True)
        logp = zs - np.log(np.exp(zs).sum(axis=1, keepdims=True))
        onehot = np.eye(OUT)[target]
        value = -np.mean(np.sum(onehot * logp, axis=1))
        dz = (np.exp(logp) - onehot) / len(x)
    else:  # mse
        value = np.mean((z - target) ** 2)
        dz = 2 * (z - target) / z.size
    grads = {"w1": dz.T @ a, "b1": dz.sum(axis=0)}
    dh = (dz @ p["w1"]) * (h > 0)
    grads["w0"] = dh.T @ x
    grads["b0"] = dh.sum(axis=0)
    return value, grads


class NumpySGD:
    def __init__(self, lr, momentum, weight_decay):
        self.lr, self.mu, self.wd = lr, momentum, weight_decay
        self.v = {}

    def update(self, p, grads):
        out = {}
        for k, w in p.items():
            gk = grads[k] + self.wd * w
            self.v[k] = self.mu * self.v.get(k, 0.0) + gk
            out[k] = w - self.lr * self.v[k]
        return out


class NumpyAdam:
    def __init__(self, lr, b1=0.9, b2=0.999, eps=1e-8):
        self.lr, self.b1, self.b2, self.eps = lr, b1, b2, eps
        self.m, self.v, self.t = {}, {}, 0

    def update(self, p, grads):
        self.t += 1
        out = {}
        for k, w in p.items():
            self.m[k] = self.b1 * self.m.get(k, 0.0) + (1 - self.b1) * grads[k]
            self.v[k] = self.b2 * self.v.get(k, 0.0) + (1 - self.b2) * grads[k] ** 2
            m_hat = self.m[k] / (1 - self.b1 ** self.t)
            v_hat = self.v[k] / (1 - self.b2 ** self.t)
            out[k] = w - self.lr * m_hat / (np.sqrt(v_hat) + self.eps)
        return out


def close(a, b, what):
    np.testing.assert_allclose(np.asarray(a, np.float64), b, rtol=1e-5, atol=1e-5,
                               err_msg=what)


# ---------------------------------------------------------------------------------------------
# the train step against numpy
# ---------------------------------------------------------------------------------------------
@pytest.fixture(scope="module")
def sgd_trainer():
    return training.Trainer(build_mlp, training.SoftmaxCrossEntropy(),
                            training.SGD(lr=0.1, momentum=0.9, weight_decay=0.01),
                            init_params(), batch_size=BATCH)


def test_sgd_momentum_steps_match_numpy(sgd_trainer):
    trainer = sgd_trainer
    assert trainer.steps == 0
    ref_p = {k: v.astype(np.float64) for k, v in init_params().items()}
    ref_opt = NumpySGD(0.1, 0.9, 0.01)
    for step, (x, labels) in enumerate(batches()):
        ref_loss, grads = np_forward_backward(ref_p, x, labels, "sce")
        loss = trainer.step(x, labels)
        assert abs(loss - ref_loss) < 1e-5, (step, loss, ref_loss)
        ref_p = ref_opt.update(ref_p, grads)
        for k in ref_p:
            close(trainer.params[k], ref_p[k], f"step {step}: {k}")
            close(trainer.states[f"{k}.velocity"], ref_opt.v[k], f"step {step}: velocity {k}")
    # the forward function sees the updated parameters
    x, _ = next(batches(seed=5, steps=1))
    p64 = {k: v.astype(np.float64) for k, v in trainer.params.items()}
    h = np.maximum(x @ p64["w0"].T + p64["b0"], 0)
    close(trainer.predict(x), h @ p64["w1"].T + p64["b1"], "predict")


def test_loss_decreases(sgd_trainer):
    x, labels = next(batches(seed=9, steps=1))
    first = sgd_trainer.step(x, labels)
    for _ in range(40):
        last = sgd_trainer.step(x, labels)
    assert last < 0.5 * first, (first, last)
    # predicting any number of rows (padding the last batch)
    many = np.random.default_rng(3).standard_normal((BATCH * 2 + 3, IN)).astype("float32")
    out = sgd_trainer.predict(many)
    assert out.shape == (BATCH * 2 + 3, OUT)
    np.testing.assert_allclose(out[:BATCH], sgd_trainer.predict(many[:BATCH]), rtol=1e-6)


def test_adam_mse_steps_match_numpy():
    mod = build_mlp(BATCH)
    trainer = training.Trainer(mod, training.MSELoss(), training.Adam(lr=0.01),
                               init_params(seed=2))
    assert trainer.batch_size == BATCH
    ref_p = {k: v.astype(np.float64) for k, v in init_params(seed=2).items()}
    ref_opt = NumpyAdam(0.01)
    rng = np.random.default_rng(4)
    for step, (x, _) in enumerate(batches(seed=6)):
        target = rng.standard_normal((BATCH, OUT)).astype("float32")
        ref_loss, grads = np_forward_backward(ref_p, x, target.astype(np.float64), "mse")
        loss = trainer.step(x, target)
        assert abs(loss - ref_loss) < 1e-5, (step, loss, ref_loss)
        ref_p = ref_opt.update(ref_p, grads)
        for k in ref_p:
            close(trainer.params[k], ref_p[k], f"step {step}: {k}")
            close(trainer.states[f"{k}.m"], ref_opt.m[k], f"step {step}: m of {k}")
            close(trainer.states[f"{k}.v"], ref_opt.v[k], f"step {step}: v of {k}")
        assert int(trainer.states["step"]) == step + 1
    # the learning rate is an input: changing it needs no rebuild, and lr=0 freezes the params
    trainer.lr = 0.0
    before = {k: v.copy() for k, v in trainer.params.items()}
    trainer.step(*next(batches(seed=8, steps=1))[:1], rng.standard_normal((BATCH, OUT)))
    for k, v in before.items():
        np.testing.assert_array_equal(trainer.params[k], v)


# ---------------------------------------------------------------------------------------------
# losses and optimizers as standalone graph functions (one compile for all of them)
# ---------------------------------------------------------------------------------------------
def test_loss_and_optimizer_functions():
    logits = TensorStructInfo((5, 4), "float32")
    params = {"w": TensorStructInfo((3, 2), "float32"), "b": TensorStructInfo((2,), "float32")}
    adamw = training.Adam(lr=0.1, weight_decay=0.5, decoupled=True)
    nesterov = training.SGD(lr=0.1, momentum=0.5, nesterov=True)
    mod = IRModule({
        "sce_int": training.SoftmaxCrossEntropy().function(logits, "sce_int"),
        "sce_onehot": training.SoftmaxCrossEntropy("onehot").function(logits, "sce_onehot"),
        "mse": training.MSELoss().function(logits, "mse"),
        "adamw": adamw.function(params, "adamw"),
        "nesterov": nesterov.function(params, "nesterov"),
    })
    exe = kiln.build(mod)
    rng = np.random.default_rng(0)
    z = rng.standard_normal((5, 4)).astype("float32")
    labels = np.array([0, 3, 1, 1, 2])
    zs = z - z.max(axis=1, keepdims=True)
    logp = zs - np.log(np.exp(zs).sum(axis=1, keepdims=True))
    ref = -logp[np.arange(5), labels].mean()
    assert abs(float(exe["sce_int"](z, labels)) - ref) < 1e-6
    soft = rng.dirichlet(np.ones(4), 5).astype("float32")
    assert abs(float(exe["sce_onehot"](z, soft)) - -(soft * logp).sum(1).mean()) < 1e-6
    t = rng.standard_normal((5, 4)).astype("float32")
    assert abs(float(exe["mse"](z, t)) - ((z - t) ** 2).mean()) < 1e-6

    w, b = rng.standard_normal((3, 2)).astype("float32"), rng.standard_normal(2).astype("float32")
    dw, db = rng.standard_normal((3, 2)).astype("float32"), rng.standard_normal(2).astype("float32")
    state = adamw.init_state({"w": w, "b": b})
    assert list(state) == ["w.m", "w.v", "b.m", "b.v", "step"]
    new_w, new_b, *_, step = exe["adamw"](np.float32(0.1), w, b, dw, db, *state.values())
    for p, d, new in ((w, dw, new_w), (b, db, new_b)):
        m, v = 0.1 * d, 0.001 * d * d
        upd = (m / 0.1) / (np.sqrt(v / 0.001) + 1e-8) + 0.5 * p
        np.testing.assert_allclose(new, p - 0.1 * upd, rtol=1e-5, atol=1e-6)
    assert int(step) == 1

    vel = {"w.velocity": rng.standard_normal((3, 2)).astype("float32"),
           "b.velocity": rng.standard_normal(2).astype("float32")}
    new_w, new_b, vw, vb = exe["nesterov"](np.float32(0.1), w, b, dw, db, *vel.values())
    np.testing.assert_allclose(vw, 0.5 * vel["w.velocity"] + dw, rtol=1e-6)
    np.testing.assert_allclose(new_b, b - 0.1 * (db + 0.5 * (0.5 * vel["b.velocity"] + db)),
                               rtol=1e-5, atol=1e-6)


def test_errors_name_the_culprit():
    logits = TensorStructInfo((5, 4), "float32")
    with pytest.raises(KilnError, match="labels must be"):
        training.SoftmaxCrossEntropy("index")
    with pytest.raises(StructInfoError, match="logits must be \\(batch, classes\\)"):
        training.SoftmaxCrossEntropy().function(TensorStructInfo((5,), "float32"))
    with pytest.raises(StructInfoError, match="float"):
        training.MSELoss().function(TensorStructInfo((5, 4), "int32"))
    with pytest.raises(StructInfoError, match=r"target must be.*int64.*got.*int32"):
        training.SoftmaxCrossEntropy().check_target(
            logits, g.Var("t", TensorStructInfo((5,), "int32")))
    with pytest.raises(KilnError, match="momentum"):
        training.SGD(lr=0.1, momentum=1.5)
    with pytest.raises(KilnError, match="beta1"):
        training.Adam(beta1=1.0)
    with pytest.raises(KilnError, match="nesterov"):
        training.SGD(nesterov=True)
    mod = build_mlp(BATCH)
    loss, opt = training.MSELoss(), training.SGD()
    with pytest.raises(KilnError, match=r"no parameter\(s\) \['w9'\]"):
        training.Trainer(mod, loss, opt, {"w9": np.zeros(1)})
    with pytest.raises(KilnError, match="exactly one data input"):
        training.Trainer(mod, loss, opt, {"w0": init_params()["w0"]})
    with pytest.raises(KilnError, match="needs batch_size"):
        training.Trainer(build_mlp, loss, opt, init_params())


def test_wrong_parameter_shape(sgd_trainer):
    with pytest.raises(ArgumentError, match="'w0' must have shape"):
        sgd_trainer._checked("w0", np.zeros((2, 2)), TensorStructInfo((HIDDEN, IN), "float32"))
    with pytest.raises(ArgumentError, match="rows of x"):
        sgd_trainer.predict(np.zeros((3, IN + 1), "float32"))


# ---------------------------------------------------------------------------------------------
# the example
# ---------------------------------------------------------------------------------------------
def _load_example():
    path = os.path.join(ROOT, "examples", "train_mlp.py")
    spec = importlib.util.spec_from_file_location("kiln_example_train_mlp", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_example_reaches_target(capsys):
    example = _load_example()
    assert example.main(["--epochs", "6", "--samples", "800", "--target", "0.95"]) == 0
    out = capsys.readouterr().out
    assert "epoch   6" in out and "final held-out accuracy" in out


def test_example_fails_when_target_missed(capsys):
    example = _load_example()
    assert example.main(["--epochs", "1", "--samples", "200", "--target", "1.01"]) == 1
