"""NPU lowerings of single ops, run on the simulator and checked against numpy on random inputs,
on both shipped hardware descriptions. Float products run in float16 with float32
accumulation (rel. error <= 1e-2 against float64 numpy); int8 products are exact."""

import numpy as np
import pytest
from hypothesis import HealthCheck, example, given, settings
from hypothesis import strategies as st

import kiln
from kiln import graph as g
from kiln import op
from kiln.codegen.npu import DEPTHWISE_KEY, NPUUnsupportedError, build_npu
from kiln.ir import KilnError, RuntimeCheckError
from kiln.npu import Program
from kiln.npu.asm import assemble_program
from kiln.schedule.npu import (
    GemmShape,
    LoweringContext,
    gemm_roofline,
    lowered_ops,
    plan_gemm,
)
from kiln.schedule.npu import ops as npu_ops
from kiln.schedule.npu.nest_analysis import unit_shares
from kiln.schedule.npu.ops import (
    depthwise_group,
    depthwise_parts,
    depthwise_route,
    depthwise_weights,
    divide_multiplier,
)
from kiln.schedule.npu.residency import RESIDENCY_KEY
from kiln.target.npu import load_config
from kiln.testing import models
from kiln.testing.op_testing import graph_module
from kiln.transform import PassContext

HW = ["default", "edge"]


def _build(fn, shapes, hw, dtype="float32", **kw):
    return kiln.build(graph_module(fn, shapes, dtype), target=kiln.Target("npu", hw=hw), **kw)


def _rel(out, ref):
    return float(np.max(np.abs(out.astype(np.float64) - ref)) / (np.max(np.abs(ref)) or 1.0))


def _rand(rng, *shape):
    return rng.standard_normal(shape).astype("float32")


@pytest.mark.parametrize("hw", HW)
@pytest.mark.parametrize("m,k,n", [(5, 97, 251), (64, 1021, 33), (1, 16, 16)])
def test_dense_fp16_tiles(hw, m, k, n):
    rng = np.random.default_rng(m + k + n)
    w = _rand(rng, n, k)
    exe = _build(lambda x: op.dense(x, g.const(w)), [(m, k)], hw)
    x = _rand(rng, m, k)
    assert _rel(exe(x), x.astype(np.float64) @ w.T) <= 1e-2
    assert exe.cpu_ops == [] and exe.last_cycles > 0
    assert [k.op for k in exe.kernels] in (["dense.cast", "dense"], ["matmul.cast", "matmul"])


@pytest.mark.parametrize("hw", HW)
def test_dense_int8_is_exact(hw):
    rng = np.random.default_rng(1)
    w = rng.integers(-128, 128, (61, 251), dtype=np.int8)
    exe = _build(lambda x: op.dense(x, g.const(w), out_dtype="int32"), [(37, 251)], hw,
                 dtype="int8")
    x = rng.integers(-128, 128, (37, 251), dtype=np.int8)
    np.testing.assert_array_equal(exe(x), x.astype(np.int32) @ w.T.astype(np.int32))


@pytest.mark.parametrize("hw", HW)
def test_matmul_batched_left_and_runtime_operands(hw):
    rng = np.random.default_rng(2)
    b = _rand(rng, 33, 19)
    exe = _build(lambda x: op.matmul(x, g.const(b)), [(2, 7, 33)], hw)
    x = _rand(rng, 2, 7, 33)
    assert _rel(exe(x), x.astype(np.float64) @ b) <= 1e-2
    exe = _build(lambda x, y: op.matmul(x, y), [(9, 40), (40, 23)], hw)
    x, y = _rand(rng, 9, 40), _rand(rng, 40, 23)
    assert _rel(exe(x, y), x.astype(np.float64) @ y) <= 1e-2


def _conv_ref(x, w, stride, pad, dil):
    n, c, h, wd = x.shape
    o, _, kh, kw = w.shape
    xp = np.pad(x.astype(np.float64), ((0, 0), (0, 0), (pad[0], pad[2]), (pad[1], pad[3])))
    oh = (h + pad[0] + pad[2] - dil[0] * (kh - 1) - 1) // stride[0] + 1
    ow = (wd + pad[1] + pad[3] - dil[1] * (kw - 1) - 1) // stride[1] + 1
    out = np.zeros((n, o, oh, ow))
    for a in range(kh):
        for b in range(kw):
            patch = xp[:, :, a * dil[0]:a * dil[0] + stride[0] * (oh - 1) + 1:stride[0],
                       b * dil[1]:b * dil[1] + stride[1] * (ow - 1) + 1:stride[1]]
            out += np.einsum("nchw,oc->nohw", patch, w[:, :, a, b].astype(np.float64))
    return out


CONVS = [  # (n, c, h, w), (o, kh, kw), stride, padding, dilation
    ((2, 5, 11, 11), (7, 3, 3), (1, 1), (1, 1, 1, 1), (1, 1)),
    ((1, 3, 13, 17), (16, 3, 3), (2, 2), (1, 1, 1, 1), (1, 1)),
    ((1, 19, 7, 7), (11, 1, 1), (1, 1), (0, 0, 0, 0), (1, 1)),
    ((1, 4, 9, 9), (6, 3, 3), (1, 1), (2, 2, 2, 2), (2, 2)),
    ((1, 64, 14, 14), (64, 3, 3), (1, 1), (1, 1, 1, 1), (1, 1)),
    ((1, 2, 1, 1), (3, 3, 3), (1, 1), (1, 1, 1, 1), (1, 1)),  # taps reading only padding
    ((2, 16, 13, 12), (8, 1, 1), (2, 2), (0, 0, 0, 0), (1, 1)),  # strided 1x1: rows < burst
    ((1, 6, 9, 10), (5, 1, 1), (3, 2), (1, 1, 2, 1), (1, 1)),  # ... with padding rows
    ((1, 8, 14, 72), (6, 1, 1), (2, 2), (0, 0, 0, 0), (1, 1)),  # strided 1x1: rows skipped
    ((1, 6, 9, 80), (5, 1, 1), (3, 2), (1, 1, 2, 1), (1, 1)),  # ... with padding rows
]


@pytest.mark.parametrize("hw", HW)
@pytest.mark.parametrize("xs,ws,stride,pad,dil", CONVS)
def test_conv2d_implicit_gemm(hw, xs, ws, stride, pad, dil):
    rng = np.random.default_rng(sum(xs) + sum(ws))
    w = (_rand(rng, ws[0], xs[1], ws[1], ws[2]) * 0.3).astype("float32")
    exe = _build(lambda x: op.nn.conv2d(x, g.const(w), strides=stride, padding=pad,
                                        dilation=dil), [xs], hw)
    x = _rand(rng, *xs)
    assert _rel(exe(x), _conv_ref(x, w, stride, pad, dil)) <= 1e-2
    assert exe.cpu_ops == []


@pytest.mark.parametrize("wd,rows_skipped", [(14, False), (72, True)])
def test_strided_1x1_stages_the_rows_it_reads_unless_the_image_is_cheaper(wd, rows_skipped):
    """A 1x1 stride-2 conv reads every other input row. 72-pixel float16 rows (144 bytes,
    3 bursts) are staged alone; 14-pixel rows (28 bytes: each would move a whole 64-byte
    burst) cost more that way than the whole image read contiguously, so the image is staged
    -- and the roofline counts the cheaper of the two, in whole bursts. (The input's float16
    cast kept in DRAM: L1 residency would stage it from L1.)"""
    rng = np.random.default_rng(wd)
    c, h, o = 8, 14, 6
    w = (_rand(rng, o, c, 1, 1) * 0.3).astype("float32")
    with PassContext(config={RESIDENCY_KEY: False}):
        exe = _build(lambda v: op.nn.conv2d(v, g.const(w), strides=(2, 2)), [(1, c, h, wd)],
                     "default")
    x = _rand(rng, 1, c, h, wd)
    assert _rel(exe(x), _conv_ref(x, w, (2, 2), (0, 0, 0, 0), (1, 1))) <= 1e-2
    prog = [st.program for st in exe.steps if getattr(st, "program", None)][-1]
    staged = [i for stream in prog.streams for i in stream
              if i.op == "dma.load" and i.args["dst"].mem == 1 and i.args["src"].mem == 0]
    assert staged and all(i.args["src"].strides[1] == (2 * wd if rows_skipped else wd)
                          for i in staged)
    conv = [k for k in exe.kernels if k.op == "nn.conv2d"][0]
    row_bytes = -(-wd * 2 // 64) * 64
    a_bytes = c * (h // 2 * row_bytes if rows_skipped else h * wd * 2)
    cfg = load_config("default")
    assert conv.roofline == pytest.approx(
        (a_bytes + c * o * 2 + o * (h // 2) * (wd // 2) * 4) / cfg.memory("dram").bandwidth)


@pytest.mark.parametrize("hw", HW)
@pytest.mark.parametrize("stride,pad", [((1, 1), (1, 1, 1, 1)), ((2, 2), (1, 1, 1, 1)),
                                        ((1, 1), (0, 2, 1, 0))])
def test_depthwise_conv2d_on_the_vector_unit(hw, stride, pad):
    rng = np.random.default_rng(11)
    x = _rand(rng, 2, 7, 13, 11)
    w = _rand(rng, 7, 1, 3, 3)
    with PassContext(config={DEPTHWISE_KEY: "vector"}):
        exe = _build(lambda v: op.nn.conv2d(v, g.const(w), strides=stride, padding=pad,
                                            groups=7), [x.shape], hw)
    assert exe.cpu_ops == [] and [k.op for k in exe.kernels] == ["nn.conv2d.depthwise"]
    ref = np.concatenate([_conv_ref(x[:, i:i + 1], w[i:i + 1], stride, pad, (1, 1))
                          for i in range(7)], axis=1)
    np.testing.assert_allclose(exe(x), ref, rtol=1e-5, atol=1e-5)


def _depthwise_ref(x, w, stride, pad):
    c = x.shape[1]
    return np.concatenate([_conv_ref(x[:, i:i + 1], w[i:i + 1], stride, pad, (1, 1))
                           for i in range(c)], axis=1)


def _depthwise_kernels(exe):
    return [k for k in exe.kernels if k.op == "nn.conv2d.depthwise"]


@pytest.mark.parametrize("hw", HW)
@pytest.mark.parametrize("shape,stride,pad", [
    ((2, 37, 13, 11), (1, 1), (1, 1, 1, 1)),   # 37 channels: groups of g and a rest
    ((1, 32, 16, 16), (2, 2), (1, 1, 1, 1)),   # whole groups, stride 2
    ((1, 20, 9, 10), (1, 2), (0, 2, 1, 0)),    # asymmetric padding and strides
])
def test_depthwise_conv2d_on_the_tensor_unit(hw, shape, stride, pad):
    """Forced onto the tensor unit's block-diagonal form: one kernel of grouped products over
    every (image, group of g channels), a second one for the last C mod g channels; float16
    operands, float32 accumulation (rel. error <= 1e-2 against float64 numpy)."""
    rng = np.random.default_rng(sum(shape))
    x = _rand(rng, *shape)
    c = shape[1]
    w = _rand(rng, c, 1, 3, 3)
    with PassContext(config={DEPTHWISE_KEY: "diagonal"}):
        exe = _build(lambda v: op.nn.conv2d(v, g.const(w), strides=stride, padding=pad,
                                            groups=c), [x.shape], hw)
    assert exe.cpu_ops == []
    ks = _depthwise_kernels(exe)
    g_ = depthwise_group(load_config(hw))
    assert len(ks) == 1 + (c % g_ != 0)
    assert all("block-diagonal" in k.tiling and
               "[depthwise on the tensor unit (diagonal)" in k.tiling for k in ks)
    out = exe(x)
    ref = _depthwise_ref(x, w, stride, pad)
    assert _rel(out, ref) <= 1e-2
    # the MACs counted are the depthwise convolution's (not the diagonal's zeros), all on
    # the tensor unit
    s = unit_shares(exe)
    assert s.tensor_macs == ref.size * 9 and s.vector_macs == 0
    assert sum(k.macs for k in ks) == ref.size * 9


@pytest.mark.parametrize("route", ["diagonal", "banded"])
def test_depthwise_roofline_is_the_layers_own(route):
    """A tensor-route depthwise kernel's roofline counts the layer's minimum DRAM traffic --
    the image read once, the compact weights once, the output written once -- not the bytes
    of the product it runs (bands and block-diagonal weights of mostly zeros, overlapping
    windows, which no DMA moves from DRAM): the bound stays below the simulated cycles."""
    rng = np.random.default_rng(3)
    shape = (1, 96, 28, 28)
    x = _rand(rng, *shape)
    w = _rand(rng, 96, 1, 3, 3)
    with PassContext(config={DEPTHWISE_KEY: route}):
        exe = _build(lambda v: op.nn.conv2d(v, g.const(w), padding=(1, 1, 1, 1), groups=96),
                     [x.shape], "default")
    ks = _depthwise_kernels(exe)
    assert ks and all(f"({route})" in k.tiling for k in ks)
    assert _rel(exe(x), _depthwise_ref(x, w, (1, 1), (1, 1, 1, 1))) <= 1e-2
    bw = load_config("default").memory("dram").bandwidth
    # float16 image, weights and result (the mixed-precision graph's activations)
    want = (x.size * 2 + w.size * 2 + x.size * 2) / bw
    assert sum(k.traffic for k in ks) == pytest.approx(want)
    cycles = exe.last_reports[0].phase_cycles()
    for k in ks:
        assert k.roofline == max(k.compute, k.traffic) <= cycles[k.label]


@pytest.mark.parametrize("hw", HW)
@pytest.mark.parametrize("route", ["diagonal", "banded", "vector"])
def test_depthwise_conv2d_int8_is_exact(hw, route):
    """int8 x int8 -> int32 depthwise (the quantized graph's): exact on the tensor unit (int8
    operands as they are, both forms) and on the vector unit (widened to int32 by a cast
    kernel)."""
    rng = np.random.default_rng(5)
    c = 21
    x = rng.integers(-128, 128, (1, c, 9, 9), dtype=np.int8)
    w = rng.integers(-127, 128, (c, 1, 3, 3), dtype=np.int8)
    with PassContext(config={DEPTHWISE_KEY: route}):
        exe = _build(lambda v: op.nn.conv2d(v, g.const(w), strides=(2, 2), padding=(1, 1),
                                            groups=c, out_dtype="int32"), [x.shape], hw,
                     dtype="int8")
    assert exe.cpu_ops == []
    where = "on the vector unit" if route == "vector" else f"on the tensor unit ({route})"
    assert all(where in k.tiling for k in _depthwise_kernels(exe))
    ref = _depthwise_ref(x.astype(np.float64), w.astype(np.float64), (2, 2), (1, 1, 1, 1))
    np.testing.assert_array_equal(exe(x), ref.astype(np.int32))


def test_depthwise_block_diagonal_weights():
    """Each tap's g x g block is diagonal with the group's channel weights; the constants
    hold taps x g elements per channel of the whole groups (9 x C x g for 3x3), taps x r
    per channel of the last r = C mod g."""
    rng = np.random.default_rng(0)
    cfg = load_config("default")
    c, g_ = 37, depthwise_group(cfg)
    w = _rand(rng, c, 1, 3, 3)
    at = op.nn.conv2d(g.Var("x", g.TensorStructInfo((1, c, 8, 8), "float32")), g.const(w),
                      padding=(1, 1), groups=c).attrs
    parts = depthwise_parts(cfg, at, (1, c, 8, 8), w.shape, (1, c, 8, 8), "float16")
    assert [(p.first, p.g, p.groups) for p in parts] == [(0, g_, c // g_), (c // g_ * g_,
                                                                             c % g_, 1)]
    assert [p.geo.shape.batch for p in parts] == [c // g_, 1]
    total = 0
    for p in parts:
        wd = depthwise_weights(w, p)
        assert wd.shape == (p.groups, 9, p.g, p.g)
        total += wd.size
        for gi in range(p.groups):
            for t in range(9):
                want = np.diag(w[p.first + gi * p.g:p.first + (gi + 1) * p.g, 0].reshape(
                    p.g, 9)[:, t])
                np.testing.assert_array_equal(wd[gi, t], want)
    assert total == 9 * (c // g_ * g_ * g_ + (c % g_) ** 2)


@pytest.mark.parametrize("hw", HW)
def test_depthwise_route_follows_the_cost_model(hw):
    """``auto`` takes the route of the lowest estimate of the three; ``diagonal`` /
    ``banded`` / ``vector`` force theirs, ``tensor`` the cheaper tensor-unit form; a dtype
    the tensor unit lacks (int32: no integer product of int32) stays on the vector unit
    whatever the option."""
    cfg = load_config(hw)
    x = g.Var("x", g.TensorStructInfo((1, 96, 28, 28), "float32"))
    w = np.zeros((96, 1, 3, 3), "float32")
    at = op.nn.conv2d(x, g.const(w), padding=(1, 1), groups=96).attrs
    args = (at, (1, 96, 28, 28), w.shape, (1, 96, 28, 28))
    for knob in ("auto", "tensor", "diagonal", "banded", "vector"):
        ctx = LoweringContext(cfg, depthwise=knob)
        ch = depthwise_route(ctx, *args, "float32", "float32", "float32")
        est = {"diagonal": ch.diagonal, "banded": ch.banded, "vector": ch.vector}
        assert None not in est.values() and ch.tensor == min(ch.diagonal, ch.banded)
        tensor = min(("diagonal", "banded"), key=est.__getitem__)
        want = {"auto": min(est, key=est.__getitem__), "tensor": tensor}.get(knob, knob)
        assert ch.route == want
        assert ch.unit == ("vector" if want == "vector" else "tensor")
        assert depthwise_route(ctx, *args, "int32", "int32", "int32").route == "vector"
    with pytest.raises(KilnError, match="depthwise route"):
        LoweringContext(cfg, depthwise="gpu")


@pytest.mark.parametrize("hw", HW)
@pytest.mark.parametrize("route", ["diagonal", "banded"])
def test_depthwise_on_the_tensor_unit_fuses_its_epilogue(hw, route):
    """On the tensor unit a depthwise convolution is a product (either form): its
    per-channel multiply/add and clip (batch norm and ReLU6) run on its accumulator tiles."""
    rng = np.random.default_rng(3)
    c = 24
    x = _rand(rng, 1, c, 14, 14)
    w = _rand(rng, c, 1, 3, 3)
    sc, sh = _rand(rng, 1, c, 1, 1), _rand(rng, 1, c, 1, 1)

    def fn(v):
        y = op.nn.conv2d(v, g.const(w), padding=(1, 1), groups=c)
        return op.clip(op.add(op.multiply(y, g.const(sc)), g.const(sh)), 0.0, 6.0)

    with PassContext(config={DEPTHWISE_KEY: route}):
        exe = _build(fn, [x.shape], hw)
    ks = _depthwise_kernels(exe)
    assert ks and all("+multiply+add+clip" in k.label for k in ks)
    ref = np.clip(_depthwise_ref(x, w, (1, 1), (1, 1, 1, 1)) * sc + sh, 0, 6)
    assert _rel(exe(x), ref) <= 1e-2


@pytest.mark.parametrize("hw", HW)
def test_conv2d_int8_is_exact(hw):
    rng = np.random.default_rng(3)
    w = rng.integers(-128, 128, (9, 6, 3, 3), dtype=np.int8)
    exe = _build(lambda x: op.nn.conv2d(x, g.const(w), padding=(1, 1), out_dtype="int32"),
                 [(1, 6, 10, 10)], hw, dtype="int8")
    x = rng.integers(-128, 128, (1, 6, 10, 10), dtype=np.int8)
    ref = _conv_ref(x, w, (1, 1), (1, 1, 1, 1), (1, 1))
    np.testing.assert_array_equal(exe(x), ref.astype(np.int32))


@pytest.mark.parametrize("hw", HW)
def test_elementwise_broadcast_and_chains(hw):
    rng = np.random.default_rng(4)
    bias = _rand(rng, 6, 1, 1)
    cases = [
        (lambda x: op.add(x, g.const(bias)), lambda x: x + bias),
        (lambda x: op.multiply(x, g.const(np.float32(0.5))), lambda x: x * 0.5),
        (lambda x: op.subtract(g.const(bias), x), lambda x: bias - x),
        (lambda x: op.maximum(x, g.const(bias)), lambda x: np.maximum(x, bias)),
        (lambda x: op.nn.relu(x), lambda x: np.maximum(x, 0)),
        (lambda x: op.clip(x, min=-0.5, max=0.7), lambda x: np.clip(x, -0.5, 0.7)),
        (lambda x: op.exp(x), np.exp),
    ]
    x = _rand(rng, 2, 6, 31, 97)
    for fn, ref in cases:
        exe = _build(fn, [x.shape], hw)
        np.testing.assert_allclose(exe(x), ref(x), rtol=1e-5, atol=1e-6)
        assert exe.cpu_ops == []
    exe = _build(lambda x, y: op.divide(x, y), [(251,), (3, 251)], hw)
    a, b = _rand(rng, 251), _rand(rng, 3, 251) + 4
    np.testing.assert_allclose(exe(a, b), a / b, rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize("hw", HW)
def test_pooling(hw):
    rng = np.random.default_rng(5)
    x = _rand(rng, 2, 5, 17, 15)
    exe = _build(lambda x: op.nn.max_pool2d(x, pool_size=(3, 3), strides=(2, 2),
                                            padding=(1, 1)), [x.shape], hw)
    xp = np.pad(x, ((0, 0), (0, 0), (1, 1), (1, 1)), constant_values=-np.inf)
    ref = np.stack([np.stack([xp[:, :, 2 * i:2 * i + 3, 2 * j:2 * j + 3].max(axis=(2, 3))
                              for j in range(8)], -1) for i in range(9)], -2)
    np.testing.assert_array_equal(exe(x), ref)
    exe = _build(lambda x: op.nn.avg_pool2d(x, pool_size=(2, 3), strides=(2, 3)),
                 [(1, 3, 8, 9)], hw)
    y = _rand(rng, 1, 3, 8, 9)
    np.testing.assert_allclose(exe(y), y.reshape(1, 3, 4, 2, 3, 3).mean(axis=(3, 5)),
                               rtol=1e-5, atol=1e-6)
    exe = _build(lambda x: op.nn.adaptive_avg_pool2d(x, output_size=(1, 1)), [x.shape], hw)
    np.testing.assert_allclose(exe(x), x.mean(axis=(2, 3), keepdims=True), rtol=1e-5,
                               atol=1e-6)
    assert exe.cpu_ops == []


@pytest.mark.parametrize("hw", HW)
def test_mean_over_trailing_axes(hw):
    rng = np.random.default_rng(10)
    x = _rand(rng, 2, 7, 97)
    for axis, keep in (((1, 2), True), (-1, False)):
        exe = _build(lambda x, a=axis, k=keep: op.mean(x, axis=a, keepdims=k), [x.shape], hw)
        np.testing.assert_allclose(exe(x), x.mean(axis=axis, keepdims=keep), rtol=1e-5,
                                   atol=1e-6)
        assert exe.cpu_ops == []
    exe = _build(lambda x: op.mean(x, axis=0), [x.shape], hw)
    # a leading axis is not a row reduction: PreProcess transposes it to the end first
    assert exe.cpu_ops == [] and [k.op for k in exe.kernels] == ["transpose", "mean"]
    np.testing.assert_allclose(exe(x), x.mean(axis=0), rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize("hw", HW)
def test_softmax(hw):
    rng = np.random.default_rng(6)
    x = _rand(rng, 3, 7, 1021) * 3
    exe = _build(lambda x: op.nn.softmax(x, axis=-1), [x.shape], hw)
    e = np.exp(x - x.max(-1, keepdims=True))
    np.testing.assert_allclose(exe(x), e / e.sum(-1, keepdims=True), rtol=1e-4, atol=1e-7)


def test_unsupported_op_runs_on_cpu_or_is_refused_when_strict():
    rng = np.random.default_rng(7)
    w = _rand(rng, 4, 4, 3, 3)

    def fn(x):  # a cumulative sum has no NPU lowering
        return op.cumsum(op.nn.conv2d(x, g.const(w), padding=(1, 1)), axis=3)

    x = _rand(rng, 1, 4, 6, 6)
    exe = _build(fn, [x.shape], "edge")
    assert exe.cpu_ops == ["cumsum"]
    ref = np.cumsum(_conv_ref(x, w, (1, 1), (1, 1, 1, 1), (1, 1)), axis=3)
    assert _rel(exe(x), ref) <= 1e-2
    exe = _build(lambda x: op.nn.relu(op.cumsum(x, axis=1)), [x.shape], "default")
    assert exe.cpu_ops == ["cumsum"]
    np.testing.assert_allclose(exe(x), np.maximum(np.cumsum(x, axis=1), 0), rtol=1e-5,
                               atol=1e-6)
    with pytest.raises(NPUUnsupportedError, match=r"cumsum .*no NPU"):
        _build(fn, [x.shape], "edge", strict=True)
    with pytest.raises(KilnError, match="strict= applies to NPU targets only"):
        kiln.build(models.mlp(batch=1, sizes=(4, 2)).mod, target="c", strict=True)


def test_tiling_fits_the_description_and_beats_the_alternatives():
    for hw in HW:
        cfg = load_config(hw)
        shape = GemmShape(1, 256, 1, 512, 1152, 1, "float16")
        t = plan_gemm(cfg, shape, 2)
        mt, kt = t.m_units, t.k_units
        assert 2 * mt * kt * 2 <= cfg.memory("input").size
        assert 2 * kt * t.n * 2 <= cfg.memory("weight").size
        # a core's output tiles rotate through two accumulator slots; one tile, one slot
        tiles = -(-256 // mt) * -(-512 // t.n)
        assert min(2, -(-tiles // cfg.cores)) * mt * t.n * 4 <= cfg.memory("acc").size
        assert t.estimate >= gemm_roofline(cfg, shape)
    with pytest.raises(ValueError, match="fits the L0 buffers"):
        plan_gemm(load_config("edge"), GemmShape(1, 4, 1, 4, 1, 100000, "float16"), 2)
    assert {"dense", "nn.conv2d", "add", "relu", "nn.max_pool2d"} <= set(lowered_ops())


def test_double_buffering_overlaps_dma_and_compute():
    rng = np.random.default_rng(8)
    w = _rand(rng, 512, 512)
    x = _rand(rng, 64, 512)
    cycles = {}
    for db in (False, True):
        exe = build_npu(graph_module(lambda v: op.dense(v, g.const(w)), [x.shape]),
                        kiln.Target("npu", hw="edge"), double_buffer=db)
        assert _rel(exe(x), x.astype(np.float64) @ w.T) <= 1e-2
        cycles[db] = exe.last_cycles
    assert cycles[True] < cycles[False]


_DIMS = st.integers(1, 300)


@settings(max_examples=12, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(m=_DIMS, k=_DIMS, n=_DIMS, hw=st.sampled_from(HW), seed=st.integers(0, 2 ** 16))
def test_random_fused_kernels_match_numpy(m, k, n, hw, seed):
    """Random sizes through a product and its fused epilogue (bias, scale, relu, clip)."""
    rng = np.random.default_rng(seed)
    w, bias = _rand(rng, n, k), _rand(rng, n)

    def fn(x):
        h = op.dense(x, g.const(w))
        return op.clip(op.nn.relu(op.multiply(op.add(h, g.const(bias)), g.const(np.float32(
            0.5)))), min=0.0, max=2.0)

    exe = _build(fn, [(m, k)], hw)
    # the chain runs on the product's accumulator tiles (epilogue fusion): one kernel
    assert exe.cpu_ops == [] and exe.kernels[-1].op in ("dense", "matmul") and \
        exe.kernels[-1].label.endswith("+add+multiply+relu+clip")
    x = _rand(rng, m, k)
    ref = np.clip((x.astype(np.float64) @ w.T + bias) * 0.5, 0.0, 2.0)
    out = exe(x)
    scale = max(1.0, float(np.max(np.abs(x.astype(np.float64) @ w.T))))
    assert float(np.max(np.abs(out - ref))) <= 1e-2 * scale


# ---------------------------------------------------------------------------------------------
# layer_norm, batched run-time products, data movement, grouped conv, pooling variants
# ---------------------------------------------------------------------------------------------
def _layer_norm_ref(x, gamma, beta, eps):
    x = x.astype(np.float64)
    mean = x.mean(-1, keepdims=True)
    var = ((x - mean) ** 2).mean(-1, keepdims=True)
    return (x - mean) / np.sqrt(var + eps) * gamma + beta


@pytest.mark.parametrize("hw", HW)
@pytest.mark.parametrize("shape", [(3, 5, 97), (2, 251), (4, 1021)])
def test_layer_norm_on_the_vector_unit(hw, shape):
    rng = np.random.default_rng(shape[-1])
    x = _rand(rng, *shape) * 3 + 1
    gamma, beta = _rand(rng, shape[-1]), _rand(rng, shape[-1])
    exe = _build(lambda v, gm: op.nn.layer_norm(v, gm, g.const(beta), axes=-1, epsilon=1e-5),
                 [shape, gamma.shape], hw)  # gamma at run time, beta a constant
    assert exe.cpu_ops == [] and [k.op for k in exe.kernels] == ["nn.layer_norm"]
    np.testing.assert_allclose(exe(x, gamma), _layer_norm_ref(x, gamma, beta, 1e-5),
                               rtol=1e-4, atol=1e-4)


def test_layer_norm_over_leading_axes_runs_on_the_cpu():
    rng = np.random.default_rng(12)
    x, gamma, beta = _rand(rng, 4, 6, 5), _rand(rng, 4, 6), _rand(rng, 4, 6)
    exe = _build(lambda v: op.nn.layer_norm(v, g.const(gamma), g.const(beta), axes=(0, 1)),
                 [x.shape], "edge")
    assert exe.cpu_ops == ["nn.layer_norm"]
    xt = x.transpose(2, 0, 1)
    ref = _layer_norm_ref(xt.reshape(5, 24), gamma.reshape(-1), beta.reshape(-1), 1e-5)
    np.testing.assert_allclose(exe(x), ref.reshape(5, 4, 6).transpose(1, 2, 0), rtol=1e-4,
                               atol=1e-4)


@pytest.mark.parametrize("hw", HW)
@pytest.mark.parametrize("a,b", [((2, 3, 7, 97), (2, 3, 97, 13)), ((3, 5, 33), (1, 33, 251)),
                                 ((9, 40), (2, 40, 23)), ((2, 1, 5, 8), (3, 8, 1021))])
def test_batch_matmul_with_a_runtime_right_operand(hw, a, b):
    rng = np.random.default_rng(sum(a) + sum(b))
    x, y = _rand(rng, *a), _rand(rng, *b)
    exe = _build(lambda u, v: op.matmul(u, v), [a, b], hw)
    assert exe.cpu_ops == [] and exe.kernels[-1].op == "matmul"
    assert _rel(exe(x, y), x.astype(np.float64) @ y) <= 1e-2


@pytest.mark.parametrize("hw", HW)
def test_attention_scores_and_context_with_fused_epilogue(hw):
    """softmax(Q @ K^T * s + mask) @ V with every op on the NPU (the transpose a DMA)."""
    rng = np.random.default_rng(13)
    q, k, v = (_rand(rng, 2, 4, 97, 16) for _ in range(3))
    mask = np.where(rng.random((2, 1, 1, 97)) < 0.2, -1e4, 0).astype("float32")

    def fn(qq, kk, vv):
        s = op.matmul(qq, op.transpose(kk, axes=(0, 1, 3, 2)))
        s = op.add(op.multiply(s, g.const(np.float32(0.25))), g.const(mask))
        return op.matmul(op.nn.softmax(s, axis=-1), vv)

    exe = _build(fn, [q.shape] * 3, hw)
    assert exe.cpu_ops == []
    s = q.astype(np.float64) @ k.transpose(0, 1, 3, 2) * 0.25 + mask
    e = np.exp(s - s.max(-1, keepdims=True))
    assert _rel(exe(q, k, v), (e / e.sum(-1, keepdims=True)) @ v) <= 1e-2


@pytest.mark.parametrize("hw", HW)
def test_transpose_slice_and_concat_are_strided_dmas(hw):
    rng = np.random.default_rng(14)
    a, b = _rand(rng, 2, 5, 97), _rand(rng, 2, 3, 97)
    cases = [
        (lambda x: op.transpose(x, axes=(2, 0, 1)), lambda x: x.transpose(2, 0, 1)),
        (lambda x: op.transpose(x), lambda x: x.T),
        (lambda x: op.transpose(x, axes=(1, 0, 2)), lambda x: x.transpose(1, 0, 2)),
        (lambda x: op.strided_slice(x, begin=(1, 90), end=(5, 3), strides=(2, -3),
                                    axes=(1, 2)), lambda x: x[:, 1:5:2, 90:3:-3]),
        (lambda x: op.strided_slice(x, begin=(-4,), end=(2 ** 31 - 1,), axes=(1,)),
         lambda x: x[:, -4:]),
    ]
    for fn, ref in cases:
        exe = _build(fn, [a.shape], hw)
        assert exe.cpu_ops == []
        np.testing.assert_array_equal(exe(a), ref(a))
    c = _rand(rng, 1, 3, 97)
    exe = _build(lambda x, y: op.concat([op.nn.relu(x), y, g.const(c)], axis=0),
                 [(2, 3, 97), b.shape], hw)
    assert exe.cpu_ops == [] and [k.op for k in exe.kernels][-3:] == ["concat"] * 3
    np.testing.assert_array_equal(exe(b, b), np.concatenate([np.maximum(b, 0), b, c], 0))
    exe = _build(lambda x, y: op.concat([x, y], axis=1), [a.shape, b.shape], hw)
    np.testing.assert_array_equal(exe(a, b), np.concatenate([a, b], 1))
    exe = _build(lambda x, y: op.concat([x, y], axis=-1), [(2, 5, 4), (2, 5, 251)], hw,
                 dtype="int32")
    u, w = (rng.integers(-9, 9, s, dtype=np.int32) for s in ((2, 5, 4), (2, 5, 251)))
    np.testing.assert_array_equal(exe(u, w), np.concatenate([u, w], -1))


def test_concat_of_an_unsupported_dtype_runs_on_the_cpu():
    x = np.arange(12, dtype=np.int64).reshape(3, 4)
    exe = _build(lambda u, v: op.concat([u, v], axis=0), [x.shape, x.shape], "edge",
                 dtype="int64")
    assert exe.cpu_ops == ["concat"]
    np.testing.assert_array_equal(exe(x, x + 1), np.concatenate([x, x + 1]))


@pytest.mark.parametrize("hw", HW)
@pytest.mark.parametrize("xs,o,groups,k,s", [((2, 4, 9, 9), 6, 2, 3, 1),
                                             ((1, 12, 11, 7), 8, 4, 3, 2),
                                             ((1, 6, 5, 5), 9, 3, 1, 1)])
def test_grouped_conv2d_one_gemm_per_group(hw, xs, o, groups, k, s):
    rng = np.random.default_rng(o * groups)
    w = (_rand(rng, o, xs[1] // groups, k, k) * 0.3).astype("float32")
    p = k // 2
    exe = _build(lambda v: op.nn.relu(op.nn.conv2d(v, g.const(w), strides=(s, s),
                                                   padding=(p, p), groups=groups)), [xs], hw)
    assert exe.cpu_ops == []
    assert sum(kk.op == "nn.conv2d" for kk in exe.kernels) == xs[0] * groups
    x = _rand(rng, *xs)
    cg, og = xs[1] // groups, o // groups
    ref = np.concatenate([_conv_ref(x[:, i * cg:(i + 1) * cg], w[i * og:(i + 1) * og], (s, s),
                                    (p, p, p, p), (1, 1)) for i in range(groups)], axis=1)
    assert _rel(exe(x), np.maximum(ref, 0)) <= 1e-2


def _pool_ref(x, kind, k, s, p, ceil, count_pad):
    """numpy pooling with torch's output size and window-counting rules."""
    n, c, h, w = x.shape

    def out_len(size):
        span = size + 2 * p - k
        o = (span + (s - 1 if ceil else 0)) // s + 1
        return o - 1 if ceil and (o - 1) * s >= size + p else o

    oh, ow = out_len(h), out_len(w)
    out = np.empty((n, c, oh, ow))
    for i in range(oh):
        for j in range(ow):
            r0, c0 = i * s - p, j * s - p
            win = x[:, :, max(r0, 0):min(r0 + k, h), max(c0, 0):min(c0 + k, w)]
            if kind == "max":
                out[:, :, i, j] = win.max(axis=(2, 3))
                continue
            if count_pad:
                rows = min(r0 + k, h + p) - r0
                cols = min(c0 + k, w + p) - c0
            else:
                rows, cols = win.shape[2], win.shape[3]
            out[:, :, i, j] = win.sum(axis=(2, 3)) / (rows * cols)
    return out


@pytest.mark.parametrize("hw", HW)
@pytest.mark.parametrize("k,s,p,ceil,count_pad", [(3, 2, 1, False, False), (3, 2, 1, True, True),
                                                  (3, 2, 0, True, False), (2, 2, 1, True, False),
                                                  (3, 3, 1, True, True)])
def test_pooling_ceil_mode_and_uncounted_padding(hw, k, s, p, ceil, count_pad):
    rng = np.random.default_rng(k * 10 + s)
    x = _rand(rng, 2, 5, 17, 14)
    exe = _build(lambda v: op.nn.avg_pool2d(v, pool_size=(k, k), strides=(s, s), padding=(p, p),
                                            ceil_mode=ceil, count_include_pad=count_pad),
                 [x.shape], hw)
    assert exe.cpu_ops == []
    np.testing.assert_allclose(exe(x), _pool_ref(x, "avg", k, s, p, ceil, count_pad),
                               rtol=1e-5, atol=1e-6)
    exe = _build(lambda v: op.nn.max_pool2d(v, pool_size=(k, k), strides=(s, s), padding=(p, p),
                                            ceil_mode=ceil), [x.shape], hw)
    assert exe.cpu_ops == []
    np.testing.assert_array_equal(exe(x), _pool_ref(x, "max", k, s, p, ceil, False))


@settings(max_examples=8, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(b=st.integers(1, 3), m=_DIMS, k=st.integers(1, 130), n=_DIMS, hw=st.sampled_from(HW),
       seed=st.integers(0, 2 ** 16))
@example(b=1, m=2, k=17, n=174, hw="default", seed=36)
def test_random_batched_products_with_layer_norm_epilogue(b, m, k, n, hw, seed):
    """Random sizes through a run-time batched product, a fused residual add + scale, a
    transpose and a layer norm: the encoder block's data path."""
    rng = np.random.default_rng(seed)
    gamma, beta = _rand(rng, m), _rand(rng, m)

    def fn(x, y, r):
        h = op.multiply(op.add(op.matmul(x, y), r), g.const(np.float32(0.5)))
        return op.nn.layer_norm(op.transpose(h, axes=(0, 2, 1)), g.const(gamma),
                                g.const(beta), axes=-1, epsilon=1e-5)

    exe = _build(fn, [(b, m, k), (b, k, n), (b, m, n)], hw)
    assert exe.cpu_ops == []
    x, y, r = _rand(rng, b, m, k), _rand(rng, b, k, n), _rand(rng, b, m, n)
    # the products' operands in float16, as the tensor unit takes them (accumulated in
    # float32): a row of nearly equal values, normalized, would magnify the operands'
    # rounding far beyond any fixed tolerance (b=1, m=2, k=17, n=174, seed=36: 0.14)
    x16, y16 = (a.astype(np.float16).astype(np.float64) for a in (x, y))
    h = ((x16 @ y16 + r) * 0.5).transpose(0, 2, 1)
    ref = _layer_norm_ref(h, gamma, beta, 1e-5)
    assert float(np.max(np.abs(exe(x, y, r) - ref))) <= 2e-3 * (1 + float(
        np.max(np.abs(gamma))))


@pytest.mark.parametrize("hw", HW)
def test_int64_elementwise_ops_run_on_the_scalar_unit(hw):
    """int64 is no vector dtype: add/multiply/maximum/negative/relu and casts from and to
    int64 run as scalar-unit loops (numpy's wrap-around), reported with the reason."""
    rng = np.random.default_rng(15)
    a, b = (rng.integers(-2 ** 40, 2 ** 40, (3, 37), dtype=np.int64) for _ in range(2))

    def fn(x, y):
        h = op.maximum(op.multiply(op.add(x, y), g.const(np.int64(2 ** 30))), op.negative(y))
        h = op.add(h, g.const(np.int64(3 << 40)))  # wider than an immediate: loaded once
        return op.cast(op.nn.relu(op.subtract(h, g.const(np.int64(7)))), "float32")

    exe = _build(fn, [a.shape, b.shape], hw, dtype="int64")
    assert exe.cpu_ops == []
    assert all(k.tiling.startswith("scalar unit (") and "int64" in k.tiling
               for k in exe.kernels)
    with np.errstate(over="ignore"):
        ref = np.maximum(np.maximum((a + b) * 2 ** 30, -b) + (3 << 40) - 7, 0)
    np.testing.assert_array_equal(exe(a, b), ref.astype(np.float32))
    prog = exe.steps[0].program  # the loops encode (32-bit immediates) and assemble
    assert Program.from_bytes(prog.to_bytes()).streams == prog.streams
    assert assemble_program(prog.assembly()) == prog.streams
    exe = _build(lambda x: op.add(op.cast(x, "int64"), g.const(np.int64(1))), [(5, 3)], hw)
    x = (rng.standard_normal((5, 3)) * 1e3).astype("float32")
    np.testing.assert_array_equal(exe(x), np.trunc(x).astype(np.int64) + 1)
    assert "scalar unit" in exe.describe()


def test_scalar_unit_refuses_what_it_cannot_compute():
    x = np.arange(12, dtype=np.int64).reshape(3, 4)
    row = np.arange(4, dtype=np.int64)
    exe = _build(lambda u, v: op.add(u, v), [x.shape, row.shape], "edge", dtype="int64")
    assert exe.cpu_ops == ["add"]  # a broadcast operand: not a scalar-unit form
    np.testing.assert_array_equal(exe(x, row), x + row)
    with pytest.raises(NPUUnsupportedError, match=r"divide .*int64.*no scalar-unit form"):
        _build(lambda u, v: op.divide(u, v), [x.shape, x.shape], "edge", dtype="int64",
               strict=True)


@pytest.mark.parametrize("hw", HW)
def test_sigmoid_and_tanh_compose_vector_instructions(hw):
    """sigmoid = 1 / (1 + e^-x) and tanh = 2 sigmoid(2x) - 1 from vexp and vdiv (documented
    approximations), saturating cleanly at +-inf, fused into a chain with their neighbours."""
    rng = np.random.default_rng(16)
    x = np.concatenate([rng.standard_normal(1010) * 5, [0, 1e-6, -1e-6, 50, -50, 1e4, -1e4,
                                                        np.inf, -np.inf, 88.0, -88.0]])
    x = x.astype("float32")
    x64 = x.astype(np.float64)
    with np.errstate(over="ignore"):
        sig = 1 / (1 + np.exp(-x64))
    for fn, ref in ((op.sigmoid, sig), (op.tanh, np.tanh(x64))):
        exe = _build(fn, [x.shape], hw)
        assert exe.cpu_ops == []
        np.testing.assert_allclose(exe(x), ref, rtol=0, atol=1e-6)
    bias = _rand(rng, 1021)
    exe = _build(lambda v: op.multiply(op.tanh(op.add(v, g.const(bias))), op.sigmoid(v)),
                 [(3, 1021)], hw)
    y = _rand(rng, 3, 1021)
    assert exe.cpu_ops == []
    np.testing.assert_allclose(exe(y), np.tanh(y + bias) / (1 + np.exp(-y.astype(np.float64))),
                               rtol=0, atol=2e-6)


_CONV = st.tuples(st.integers(1, 2), st.integers(1, 9), st.integers(1, 13), st.integers(1, 13),
                  st.integers(1, 17), st.integers(1, 4), st.integers(1, 3), st.integers(0, 2),
                  st.integers(1, 2))


@settings(max_examples=10, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(shape=_CONV, hw=st.sampled_from(HW), seed=st.integers(0, 2 ** 16))
@example(shape=(1, 1, 1, 1, 1, 1, 2, 1, 1), hw="edge", seed=0)
@example(shape=(1, 1, 2, 1, 1, 1, 2, 1, 1), hw="default", seed=0)
def test_random_conv_shapes_match_numpy(shape, hw, seed):
    """Random convolutions (image, channels, kernel, stride, padding, dilation) compiled for
    the NPU and simulated, against a float64 numpy convolution. A convolution none of whose
    taps reaches the image along one axis (a 1x1 image, stride 2, padding 1: its output is all
    zeros) may be refused by the NPU's staging ("stages padding only") and run on the CPU
    (a 1-column image is; a 1-row one with the columns read stages, computing the zeros on
    the NPU: Hypothesis found it) -- checked the same way either way."""
    n, c, h, w, o, k, s, p, d = shape
    if (k - 1) * d + 1 > min(h, w) + 2 * p:
        k = 1
    rng = np.random.default_rng(seed)
    wt = (_rand(rng, o, c, k, k) * 0.3).astype(np.float32)
    exe = _build(lambda v: op.nn.conv2d(v, g.const(wt), strides=(s, s), padding=(p, p),
                                        dilation=(d, d)), [(n, c, h, w)], hw)
    reads_image = [any(0 <= i * s - p + t * d < size for i in range((size + 2 * p - (k - 1) * d
                                                                     - 1) // s + 1)
                       for t in range(k)) for size in (h, w)]
    assert exe.cpu_ops in (([],) if all(reads_image) else ([], ["nn.conv2d"]))
    x = _rand(rng, n, c, h, w)
    ref = _conv_ref(x, wt, (s, s), (p, p, p, p), (d, d))
    scale = max(1.0, float(np.max(np.abs(ref))))
    assert float(np.max(np.abs(exe(x) - ref))) <= 1e-2 * scale


@pytest.mark.parametrize("hw", HW)
def test_float_functions_without_a_vector_instruction_run_on_the_scalar_unit(hw):
    """log, sqrt, sin, cos, floor, ceil and round have no vector instruction: each runs as an
    s.fn loop on the scalar unit (the float64 function rounded once to float32), reported with
    the reason, and the graph builds with strict=True."""
    rng = np.random.default_rng(16)
    x = np.concatenate([rng.standard_normal(97) * 5, [0.0, -0.0, 2.5, -2.5, 0.5, np.inf]]
                       ).astype("float32").reshape(1, 103)
    funcs = {"log": np.log, "sqrt": np.sqrt, "sin": np.sin, "cos": np.cos, "floor": np.floor,
             "ceil": np.ceil, "round": np.rint}
    for name, ref in funcs.items():
        arg = np.abs(x) if name in ("log", "sqrt") else x
        exe = _build(lambda v, name=name: getattr(op, name)(v), [x.shape], hw, strict=True)
        with np.errstate(all="ignore"):
            want = ref(arg.astype(np.float64)).astype(np.float32)
        np.testing.assert_array_equal(exe(arg), want)
        assert exe.cpu_ops == []
        assert f"scalar unit ({name}: no vector instruction)" in exe.describe()
    # in a chain: the vector kernels around it, the scalar loop between
    exe = _build(lambda v: op.multiply(op.log(op.add(op.abs(v), g.const(np.float32(1)))),
                                       g.const(np.float32(3))), [x.shape], hw)
    with np.errstate(all="ignore"):
        inner = np.abs(x) + np.float32(1)  # float32 on the vector unit
        want = np.log(inner.astype(np.float64)).astype(np.float32) * np.float32(3)
    np.testing.assert_array_equal(exe(x), want)


TAKES = [  # data shape, indices shape, axis, mode, index dtype
    ((50, 12), (3, 7), 0, "clip", "int64"), ((4, 9, 5), (6,), 1, "wrap", "int32"),
    ((30, 3), (2, 5), 0, "fast", "int64"), ((7, 11), (13,), None, "clip", "int32"),
    ((40, 6), (9,), 0, "raise", "int64"), ((5, 3, 2), (4,), -1, "clip", "int64"),
]


@pytest.mark.parametrize("hw", HW)
@pytest.mark.parametrize("dshape,ishape,axis,mode,idt", TAKES)
def test_take_is_a_scalar_loop_over_the_indices(hw, dshape, ishape, axis, mode, idt):
    """A gather with run-time indices (no indirect DMA) on the scalar unit: every mode and
    axis equals numpy's take bit for bit (rows copied as integer words); "raise" stops the run
    on an index outside [-n, n) with a RuntimeCheckError naming it."""
    rng = np.random.default_rng(sum(dshape) + len(mode))

    def fn(d, i):
        return op.take(d, i, axis=axis, mode=mode)

    bb = g.BlockBuilder()
    d = g.Var("d", g.TensorStructInfo(dshape, "float16"))
    i = g.Var("i", g.TensorStructInfo(ishape, idt))
    with bb.function("main", [d, i]):
        with bb.dataflow():
            out = bb.emit_output(fn(d, i))
        bb.emit_func_output(out)
    exe = kiln.build(bb.get(), target=kiln.Target("npu", hw=hw), strict=True)
    x = rng.standard_normal(dshape).astype("float16")
    n = x.size if axis is None else dshape[axis]
    lo, hi = (-n, n) if mode in ("raise", "fast") else (-2 * n, 2 * n)
    ind = rng.integers(lo, hi, ishape).astype(idt)
    ind.reshape(-1)[:2] = (lo, hi - 1)
    ref = np.take(x, ind, axis=axis, mode="raise" if mode == "fast" else mode)
    np.testing.assert_array_equal(exe(x, ind), ref)
    assert "scalar unit (take: no indirect DMA)" in exe.describe()
    prog = exe.steps[0].program
    assert Program.from_bytes(prog.to_bytes()).streams == prog.streams
    assert assemble_program(prog.assembly()) == prog.streams
    if mode == "raise":
        ind.reshape(-1)[-1] = n
        with pytest.raises(RuntimeCheckError, match=f"index out of range: {n}"):
            exe(x, ind)


_SUMS = {
    "global pool": ((1, 8, 64, 64), lambda v: op.nn.adaptive_avg_pool2d(v, output_size=(1, 1)),
                    lambda x: x.mean(axis=(2, 3), keepdims=True)),
    "adaptive 2x2": ((1, 8, 64, 64), lambda v: op.nn.adaptive_avg_pool2d(v, output_size=(2, 2)),
                     lambda x: x.reshape(1, 8, 2, 32, 2, 32).mean(axis=(3, 5))),
    "avg pool 7x7": ((2, 5, 7, 7), lambda v: op.nn.avg_pool2d(v, pool_size=(7, 7)),
                     lambda x: x.mean(axis=(2, 3), keepdims=True)),
    "mean": ((2, 3, 40, 40), lambda v: op.mean(v, axis=(2, 3)), lambda x: x.mean(axis=(2, 3))),
    "sum": ((2, 3, 40, 40), lambda v: op.sum(v, axis=(2, 3)), lambda x: x.sum(axis=(2, 3))),
}


@pytest.mark.parametrize("dtype", ["float16", "bfloat16"])
@pytest.mark.parametrize("name", sorted(_SUMS))
def test_float16_sums_accumulate_in_float32(name, dtype):
    """``vred.sum`` and the pooling taps round to their destination's type after every
    element: a float16 mean of a 64 x 64 plane of values in [1, 2) came out a third low,
    bfloat16 by 92%. The sums of float16/bfloat16 tensors run in float32 and round once:
    within one rounding of the float64 value (2**-11 relative for float16, 2**-8 for
    bfloat16), as on the CPU."""
    shape, fn, ref = _SUMS[name]
    np_dtype = kiln.ir.DataType(dtype).to_numpy()
    x = (np.random.default_rng(3).random(shape) + 1).astype(np_dtype)
    exe = _build(fn, [shape], "edge", dtype)
    assert exe.cpu_ops == []
    out = exe(x)
    assert str(out.dtype) == dtype
    assert _rel(out, ref(x.astype(np.float64))) <= (2.0 ** -11 if dtype == "float16" else 2.0 ** -8)


@pytest.mark.parametrize("divisor", [8.0, 3.0, 0.1, -7.5, 1e-3, 6e37])
def test_divide_multiplier_is_vdiv_bit_for_bit(divisor):
    """vdiv is x * recip(b) in float32 (docs/npu.md, Numerics): vmul by the multiplier
    divide_multiplier gives the same bits in float32 (the accumulators' type) for every
    x, specials included; in float16 and for integers there is none where it would not."""
    from kiln.npu import numerics as nm

    rng = np.random.default_rng(7)
    x = np.concatenate([rng.standard_normal(4096) * 10.0 ** rng.integers(-40, 38, 4096),
                        [0.0, -0.0, np.inf, -np.inf, np.nan, 1e-45, 3e38]]).astype(np.float32)
    m = divide_multiplier(divisor, "float32")
    assert m is not None
    want = nm.div_approx(x, np.full_like(x, np.float32(divisor)))
    got = (x * np.float32(m)).astype(np.float32)
    assert np.array_equal(want.view(np.uint32), got.view(np.uint32))
    assert divide_multiplier(divisor, "int32") is None
    h = divide_multiplier(divisor, "float16")
    if h is not None:  # a float16 immediate: only where recip(divisor) is one
        assert np.float32(np.float16(h)) == np.float32(h)


def test_scaled_scores_divide_by_vmul_with_vdivs_bits(monkeypatch):
    """Q @ K^T / 8 + mask (attention's scores): the product's fused epilogue scales by vmul,
    never vdiv, with the bits of the same build dividing with vdiv (divide_multiplier off);
    close to float64."""
    rng = np.random.default_rng(3)
    q, kt = _rand(rng, 2, 32, 16), _rand(rng, 2, 16, 32)
    mask = (rng.integers(0, 2, (1, 32)) * -1e4).astype("float32")

    def fn(a, b):
        return op.add(op.divide(op.matmul(a, b), g.const(np.float32(8.0))), g.const(mask))

    def opcodes(exe):
        return {ins.op for s in exe.steps if hasattr(s, "program") for st in s.program.streams
                for ins in st}

    fused = _build(fn, [q.shape, kt.shape], "default")
    assert any("matmul+divide+add" in k.label for k in fused.kernels)
    assert "vmul" in opcodes(fused) and "vdiv" not in opcodes(fused)
    monkeypatch.setenv("KILN_EXECUTABLE_CACHE", "0")
    monkeypatch.setattr(npu_ops, "divide_multiplier", lambda divisor, dtype: None)
    with_vdiv = _build(fn, [q.shape, kt.shape], "default")
    assert "vdiv" in opcodes(with_vdiv)
    out = fused(q, kt)
    assert np.array_equal(out, with_vdiv(q, kt))
    ref = np.matmul(q.astype(np.float64), kt) / 8.0 + mask
    assert _rel(out, ref) <= 1e-2
