"""PreProcess (kiln/transform/npu/preprocess.py): op calls the NPU has no lowering for --
silu, gelu in both forms, power with a constant exponent, mean and sum over leading axes --
become formulas of ops it runs, checked with the lowerings themselves; built for the NPU they
leave ``exe.cpu_ops`` and match numpy. Calls whose pieces the NPU would reject, other dtypes
and other exponents stay."""

from __future__ import annotations

import math

import numpy as np
import pytest

import kiln
from kiln import graph as g
from kiln import op
from kiln.transform.npu import PREPROCESS_ATTR, AnnotateTarget, PreProcess
from kiln.transform.npu import preprocess as pp

RNG = np.random.default_rng(23)
erf = np.vectorize(math.erf)
SHAPE = (4, 32)


def _module(make, dtype="float32", shape=SHAPE):
    bb = g.BlockBuilder()
    x = g.Var("x", g.TensorStructInfo(shape, dtype))
    with bb.function("main", [x]):
        with bb.dataflow():
            out = bb.emit_output(make(x), "y")
        bb.emit_func_output(out)
    return bb.get()


def _c(v):
    return g.const(np.float32(v))


CASES = {
    "silu": (op.silu, lambda x: x / (1 + np.exp(-x)), "silu"),
    "gelu": (op.gelu, lambda x: 0.5 * x * (1 + erf(x / math.sqrt(2))), "gelu"),
    "gelu_tanh": (lambda v: op.gelu(v, approximate="tanh"),
                  lambda x: 0.5 * x * (1 + np.tanh(math.sqrt(2 / math.pi)
                                                   * (x + 0.044715 * x ** 3))), "gelu"),
    "square": (lambda v: op.power(v, _c(2.0)), lambda x: x * x, "power"),
    "cube": (lambda v: op.power(v, _c(3.0)), lambda x: x ** 3, "power"),
    "reciprocal": (lambda v: op.power(v, _c(-1.0)), lambda x: 1 / x, "power"),
    "sqrt": (lambda v: op.power(op.abs(v), _c(0.5)), lambda x: np.sqrt(np.abs(x)), "power"),
    "rsqrt": (lambda v: op.power(op.abs(v), _c(-0.5)), lambda x: 1 / np.sqrt(np.abs(x)),
              "power"),
}


@pytest.mark.parametrize("hw", ["default", "edge"])
@pytest.mark.parametrize("name", sorted(CASES))
def test_rewrite_runs_on_the_npu_and_matches_numpy(name, hw):
    make, ref, op_name = CASES[name]
    mod = _module(make)
    # without PreProcess the NPU rejects the op
    marks = AnnotateTarget(hw)(mod)["main"].attrs["npu.target"]
    assert marks["y"].startswith("cpu"), marks
    exe = kiln.build(mod, target=f"npu -hw={hw}")
    assert exe.cpu_ops == []
    x = RNG.standard_normal(SHAPE).astype(np.float32) + np.float32(0.05)
    y = np.asarray(exe(x))
    np.testing.assert_allclose(y, ref(x.astype(np.float64)), rtol=2e-5, atol=2e-6)
    assert PreProcess(hw)(mod)["main"].attrs[PREPROCESS_ATTR] == {"y": op_name}


@pytest.mark.parametrize("name,axis,keep", [("mean", 0, False), ("mean", (0, 2), True),
                                            ("mean", 1, False), ("sum", (0, 1), False)])
def test_reduction_over_leading_axes_is_transposed_to_the_end(name, axis, keep):
    mod = _module(lambda v: getattr(op, name)(v, axis=axis, keepdims=keep), shape=(3, 5, 16))
    assert AnnotateTarget()(mod)["main"].attrs["npu.target"]["y"].startswith("cpu")
    exe = kiln.build(mod, target="npu")
    assert exe.cpu_ops == [] and [k.op for k in exe.kernels] == ["transpose", name]
    x = RNG.standard_normal((3, 5, 16)).astype(np.float32)
    want = getattr(x.astype(np.float64), name)(axis=axis, keepdims=keep)
    np.testing.assert_allclose(exe(x), want, rtol=1e-5, atol=1e-5)
    # trailing axes are the NPU's own: left as they are
    trailing = _module(lambda v: op.mean(v, axis=(1, 2)), shape=(3, 5, 16))
    assert PREPROCESS_ATTR not in PreProcess()(trailing)["main"].attrs


def test_silu_becomes_multiply_of_sigmoid():
    out = PreProcess()(_module(op.silu))["main"]
    calls = [b.value.op.name for blk in out.body.blocks for b in blk.bindings]
    assert calls == ["sigmoid", "multiply"]
    y = out.body.blocks[0].bindings[-1]
    assert y.var.name_hint == "y" and y.value.args[0] is out.params[0]


def test_calls_left_alone():
    # another exponent, another dtype, a non-constant exponent: no formula
    for mod in (_module(lambda v: op.power(v, _c(1.7))),
                _module(op.silu, dtype="float64"),
                _module(lambda v: op.power(v, v))):
        assert PREPROCESS_ATTR not in PreProcess()(mod)["main"].attrs
    exe = kiln.build(_module(lambda v: op.power(op.abs(v), _c(1.7))), target="npu")
    assert exe.cpu_ops == ["power"]


def test_rewrite_needs_every_piece_accepted(monkeypatch):
    real = pp.lowering_rejection

    def no_sigmoid(config, call, *args, **kw):
        return "sigmoid refused" if call.op.name == "sigmoid" else real(config, call, *args,
                                                                         **kw)

    monkeypatch.setattr(pp, "lowering_rejection", no_sigmoid)
    assert PREPROCESS_ATTR not in PreProcess()(_module(op.silu))["main"].attrs
    # gelu's pieces do not include sigmoid: still rewritten
    assert PREPROCESS_ATTR in PreProcess()(_module(op.gelu))["main"].attrs


def test_refused_rewrite_emits_nothing(monkeypatch):
    monkeypatch.setattr(pp, "lowering_rejection", lambda config, call, *a, **k: (
        "refused" if call.op.name == "sigmoid" else None if call.op.name != "silu"
        else "no NPU lowering"))
    out = PreProcess()(_module(op.silu))["main"]
    assert [b.value.op.name for blk in out.body.blocks for b in blk.bindings] == ["silu"]
