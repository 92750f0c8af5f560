"""Quantized and mixed-precision models on the NPU, on both hardware descriptions.

int8 (``kiln.quantize``): the quantized graph's output on the NPU and on the CPU equals, bit
for bit, the numpy model of the quantized graph (``kiln.testing.quant_reference``), and stays
within a few percent of the float32 model. fp16/bf16 (``ToMixedPrecision``): the whole model on
the NPU, within 1e-2 of float32 for float16 (bfloat16 keeps 8 significant bits: its bound is
the float16 one scaled by their precision ratio, 2**3)."""

import numpy as np
import pytest

import kiln
from kiln import graph as g
from kiln import op
from kiln.frontend.onnx import from_onnx
from kiln.quantize import prepare, quantize_model
from kiln.testing import models, torch_models
from kiln.testing.quant_reference import run_quantized_graph
from kiln.transform.to_mixed_precision import ToMixedPrecision

HW = ["default", "edge"]


def _rel(out, ref):
    return float(np.max(np.abs(out.astype(np.float64) - ref)) / np.max(np.abs(ref)))


def _logits_mlp():
    """The MLP without its final softmax (float exp differs between targets: the bit-exact
    comparison is of the quantized graph's own ops)."""
    m = models.mlp(batch=4, sizes=(64, 96, 32, 10))
    main = m.mod["main"]
    bindings = [b for blk in main.body.blocks for b in blk.bindings]
    bb = g.BlockBuilder()
    x = g.Var("x", main.params[0].struct_info)
    env = {id(main.params[0]): x}
    with bb.function("main", [x]):
        with bb.dataflow():
            for b in bindings[:-1]:
                env[id(b.var)] = bb.emit(g.Call(b.value.op, tuple(env.get(id(a), a)
                                                                  for a in b.value.args),
                                                b.value.attrs))
            out = bb.emit_output(env[id(bindings[-2].var)])
        bb.emit_func_output(out)
    return bb.get(), m.inputs


def _model(m):
    return m.mod, m.inputs


#: name -> () -> (float32 module, inputs)
SMALL = {
    "mlp": _logits_mlp,
    "small_cnn": lambda: _model(models.small_cnn(batch=2, channels=8, size=16)),
    "resnet_block_cnn": lambda: _model(models.resnet_block_cnn(batch=1, channels=16, size=16)),
}


def _samples(shape, n=4, seed=1):
    rng = np.random.default_rng(seed)
    return [rng.standard_normal(shape).astype("float32") for _ in range(n)]


@pytest.fixture(scope="module")
def small_quantized():
    out = {}
    for name, make in SMALL.items():
        mod, inputs = make()
        out[name] = (mod, quantize_model(mod, None, _samples(inputs[0].shape)), inputs)
    return out


@pytest.mark.parametrize("hw", HW)
@pytest.mark.parametrize("name", sorted(SMALL))
def test_int8_model_on_npu_is_bit_exact(small_quantized, hw, name):
    mod, qmod, inputs = small_quantized[name]
    x = np.random.default_rng(7).standard_normal(inputs[0].shape).astype("float32")
    want = run_quantized_graph(qmod, x)
    exe = kiln.build(qmod, target=f"npu -hw={hw}", strict=True)
    np.testing.assert_array_equal(exe(x), want)
    np.testing.assert_array_equal(kiln.build(qmod, target="c")(x), want)
    # int8 vs float32 where calibration saw the range (a fresh input may exceed it and
    # saturate: minmax on 4 samples); measured 0.7-1.5%
    seen = _samples(inputs[0].shape)[0]
    assert _rel(run_quantized_graph(qmod, seen), kiln.build(mod, target="c")(seen)) <= 0.03
    kinds = {k.op for k in exe.kernels}
    assert "qnn.requantize" in kinds and "qnn.quantize" in kinds


def test_mlp_int8_kernels_are_integer_products(small_quantized):
    _, qmod, _ = small_quantized["mlp"]
    ops = [b.value.op.name for blk in qmod["main"].body.blocks for b in blk.bindings
           if isinstance(b.value, g.Call)]
    # one quantize in, matmul + requantize per layer (bias and ReLU folded), one dequantize out
    assert ops == ["qnn.quantize"] + ["matmul", "qnn.requantize"] * 3 + ["qnn.dequantize"]


@pytest.mark.parametrize("hw", HW)
def test_qnn_ops_on_npu_match_the_specification(hw):
    """Rounding ties, saturation and per-channel multipliers: NPU == CPU == numpy model."""
    rng = np.random.default_rng(3)
    bb = g.BlockBuilder()
    x = g.Var("x", g.TensorStructInfo((2, 5, 3, 7), "float32"))
    a = g.Var("a", g.TensorStructInfo((2, 5, 3, 7), "int32"))
    bias = rng.integers(-1000, 1000, 5).astype("int32")
    mult = rng.integers(1 << 29, (1 << 31) - 1, 5).astype("int32")
    with bb.function("main", [x, a]):
        with bb.dataflow():
            q = bb.emit_output(op.qnn_quantize(x, 0.25))
            d = bb.emit_output(op.qnn_dequantize(q, 0.1))
            r = bb.emit_output(op.qnn_requantize(a, g.const(bias), g.const(mult), shift=40,
                                                 axis=1, out_min=-3, out_max=100))
            s = bb.emit_output(op.qnn_requantize(a, g.const(np.zeros(1, "int32")),
                                                 g.const(np.array([3 << 28], "int32")),
                                                 shift=30, axis=0))
        bb.emit_func_output(g.Tuple((q, d, r, s)))
    mod = bb.get()
    xv = rng.integers(-200, 200, (2, 5, 3, 7)).astype("float32") * np.float32(0.125)
    xv.flat[:4] = [0.125, 0.375, -0.375, 1e9]  # ties (0.5, 1.5, -1.5) and saturation
    av = rng.integers(-2 ** 31, 2 ** 31, (2, 5, 3, 7)).astype("int32")
    av.flat[:2] = [2 ** 31 - 1, -2 ** 31]
    want = run_quantized_graph(mod, xv, av)
    assert list(want[0].flat[:4]) == [0, 2, -2, 127]
    for target in (f"npu -hw={hw}", "c"):
        got = kiln.build(mod, target=target, **({"strict": True} if "npu" in target else {}))(
            xv, av)
        for gv, wv in zip(got, want):
            np.testing.assert_array_equal(gv, wv)


@pytest.mark.parametrize("hw", HW)
@pytest.mark.parametrize("name", sorted(SMALL))
@pytest.mark.parametrize("dtype", ["float16", "bfloat16"])
def test_mixed_precision_model_on_npu(hw, name, dtype):
    mod, inputs = SMALL[name]()
    low = ToMixedPrecision(dtype)(prepare(mod))
    exe = kiln.build(low, target=f"npu -hw={hw}", strict=True)
    x = inputs[0]
    out = exe(x)
    ref = kiln.build(mod, target="c")(x)
    assert _rel(out, ref) <= (1e-2 if dtype == "float16" else 8e-2)
    # the low-precision graph runs as such: its products are dtype x dtype on the tensor unit
    assert _rel(out, kiln.build(low, target="c")(x)) <= (1e-2 if dtype == "float16" else 8e-2)


@pytest.fixture(scope="module")
def vision_quantized(tmp_path_factory):
    torch = pytest.importorskip("torch")
    out = {}
    for name in ("resnet18", "mobilenet_v2"):
        net = getattr(torch_models, name)()
        x = np.random.default_rng(12).standard_normal((1, 3, 32, 32)).astype("float32")
        path = tmp_path_factory.mktemp(name) / f"{name}.onnx"
        path.write_bytes(torch_models.export_onnx(net, (torch.from_numpy(x),), ["x"]))
        mod, params = from_onnx(str(path))
        qmod = quantize_model(mod, params, _samples((1, 3, 32, 32)))
        want = run_quantized_graph(qmod, x)
        np.testing.assert_array_equal(kiln.build(qmod, target="c")(x), want)
        with torch.no_grad():
            ref = net(torch.from_numpy(x)).numpy()
        out[name] = (mod, params, qmod, x, want, ref)
    return out


@pytest.mark.parametrize("hw", HW)
@pytest.mark.parametrize("name", ["resnet18", "mobilenet_v2"])
def test_vision_models_int8_on_npu_bit_exact(vision_quantized, hw, name):
    """ResNet-18 and MobileNetV2 (torch -> ONNX, 32x32) quantized: every op on the NPU
    (depthwise convs as int32 MACs on the vector unit), output equal to the numpy model of the
    quantized graph (and the CPU's, checked in the fixture), within 5% of float32."""
    _, _, qmod, x, want, ref = vision_quantized[name]
    exe = kiln.build(qmod, target=f"npu -hw={hw}", strict=True)
    np.testing.assert_array_equal(exe(x), want)
    assert _rel(want, ref) <= 0.05  # measured 1.3-2%


@pytest.mark.parametrize("hw", HW)
@pytest.mark.parametrize("name", ["resnet18", "mobilenet_v2"])
def test_vision_models_float16_on_npu(vision_quantized, hw, name):
    mod, params, _, x, _, ref = vision_quantized[name]
    low = ToMixedPrecision("float16")(prepare(mod, params))
    exe = kiln.build(low, target=f"npu -hw={hw}", strict=True)
    assert _rel(exe(x), ref) <= 1e-2


@pytest.fixture(scope="module")
def bert_quantized(tmp_path_factory):
    torch = pytest.importorskip("torch")
    torch.manual_seed(0)
    net = torch_models.bert_encoder(layers=2, hidden=64, heads=4, ffn=128, vocab=100, max_len=16)
    rng = np.random.default_rng(0)

    def sample():
        return (rng.integers(0, 100, (2, 16)).astype("int64"), np.ones((2, 16), "int64"))

    feeds = sample()
    path = tmp_path_factory.mktemp("bert") / "bert.onnx"
    path.write_bytes(torch_models.export_onnx(net, tuple(torch.from_numpy(f) for f in feeds),
                                              ["input_ids", "attention_mask"]))
    mod, params = from_onnx(str(path))
    with torch.no_grad():
        ref = net(*(torch.from_numpy(f) for f in feeds)).numpy()
    return mod, params, quantize_model(mod, params, [sample() for _ in range(4)]), feeds, ref


@pytest.mark.parametrize("hw", HW)
def test_bert_encoder_int8_and_float16_on_npu(bert_quantized, hw):
    """The BERT-style encoder: its weight matmuls in int8 on the NPU (the attention's
    run-time products stay float, on the NPU too; only the embedding gather runs on the CPU),
    within 3% of torch's float32 in int8 (measured 0.8%) and 1e-2 in float16; the NPU and CPU
    builds of the int8 graph agree to 1e-2 (the NPU computes the attention's float products
    with float16 operands, and its softmax/erf are approximations)."""
    mod, params, qmod, feeds, ref = bert_quantized
    exe = kiln.build(qmod, target=f"npu -hw={hw}")
    out = exe(*feeds)
    kernels = [k.op for k in exe.kernels]
    # 8 weight products in int8 (each requantized), 2 float attention products per layer
    assert kernels.count("matmul") == 12 and kernels.count("qnn.requantize") == 8
    assert _rel(out, ref) <= 0.03
    assert _rel(out, kiln.build(qmod, target="c")(*feeds)) <= 1e-2
    low = ToMixedPrecision("float16")(prepare(mod, params))
    assert _rel(kiln.build(low, target=f"npu -hw={hw}")(*feeds), ref) <= 1e-2
