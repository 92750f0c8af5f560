"""The GPU schedules of convolution and pooling (kiln/schedule/gpu/conv.py, pooling.py): run on
OpenCL (PoCL) against torch's CPU convolution and pooling, with primes, strides, padding,
dilation and groups; shared tiles of one reduction step; fused epilogues in the write-back;
knobs; NVRTC compiles within the register and shared-memory limits of sm_80 and sm_90."""

from __future__ import annotations

import ml_dtypes
import numpy as np
import pytest

import kiln
from kiln import graph as g
from kiln import op
from kiln.arith.analyzer import simplify
from kiln.codegen.gpu.build import build as gpu_build
from kiln.codegen.gpu.nvrtc import compile_cuda
from kiln.schedule.gpu import SCHEDULE_ATTR, schedule_and_lower
from kiln.schedule.gpu.conv import ConvShape, conv_tiles, shared_bytes
from kiln.target import Target
from kiln.testing.gpu_testing import kernel_launches, mma_calls
from kiln.testing.op_testing import scheduled
from kiln.tir.gpu import KernelLaunch

torch = pytest.importorskip("torch")
F = torch.nn.functional

OPENCL = Target("opencl")
RNG = np.random.default_rng(29)
NP16 = {"float16": np.float16, "bfloat16": ml_dtypes.bfloat16}


def _lowered(name: str, arrays: list[np.ndarray], attrs: dict, target: Target, knobs=None):
    func, _ = scheduled(name, arrays, attrs, schedule=False)
    return schedule_and_lower(func.with_attr("op_name", name), target, knobs)


def _shared_floats_each(launch: KernelLaunch) -> list[int]:
    return [int(np.prod([simplify(d).value for d in s.shape])) for s in launch.shared]


def _shared_floats(launch: KernelLaunch) -> int:
    return sum(_shared_floats_each(launch))


def _run(lowered, arrays: list[np.ndarray], shape: tuple) -> np.ndarray:
    out = np.full(shape, np.nan, "float32")
    gpu_build({"f": lowered}, OPENCL)["f"](*arrays, out)
    return out


# (data shape, weight shape, strides, padding (top, left, bottom, right), dilation, groups)
CONVS = [
    ((1, 16, 14, 14), (32, 16, 3, 3), (1, 1), (1, 1, 1, 1), (1, 1), 1),      # ResNet-like
    ((2, 3, 23, 19), (13, 3, 7, 7), (2, 2), (3, 3, 3, 3), (1, 1), 1),        # stem, primes
    ((1, 7, 11, 13), (5, 7, 1, 1), (1, 1), (0, 0, 0, 0), (1, 1), 1),         # pointwise
    ((1, 12, 17, 9), (18, 4, 3, 3), (2, 1), (1, 0, 2, 1), (2, 1), 3),        # grouped, dilated
    ((1, 32, 19, 37), (24, 32, 3, 5), (1, 2), (2, 1, 0, 2), (1, 1), 1),      # asymmetric
    ((3, 20, 9, 9), (40, 20, 1, 1), (2, 2), (0, 0, 0, 0), (1, 1), 1),        # downsample
]
DEPTHWISE = [
    ((1, 12, 15, 15), (12, 1, 3, 3), (1, 1), (1, 1, 1, 1), (1, 1)),
    ((2, 8, 29, 23), (8, 1, 3, 3), (2, 2), (1, 1, 1, 1), (1, 1)),
    ((1, 6, 13, 11), (6, 1, 5, 5), (1, 2), (2, 2, 2, 2), (2, 1)),
]


def _torch_conv(x, w, strides, padding, dilation, groups) -> np.ndarray:
    pt, pl, pb, pr = padding
    xt = F.pad(torch.from_numpy(x), (pl, pr, pt, pb))
    return F.conv2d(xt, torch.from_numpy(w), stride=strides, dilation=dilation,
                    groups=groups).numpy()


def _attrs(strides, padding, dilation, groups=1) -> dict:
    return {"strides": strides, "padding": padding, "dilation": dilation, "groups": groups}


@pytest.mark.parametrize("xs,ws,strides,padding,dilation,groups", CONVS)
def test_implicit_gemm_matches_torch_on_opencl(xs, ws, strides, padding, dilation, groups):
    x = RNG.standard_normal(xs).astype("float32")
    w = RNG.standard_normal(ws).astype("float32")
    sched, lowered = _lowered("nn.conv2d", [x, w], _attrs(strides, padding, dilation, groups),
                              OPENCL)
    assert sched.attrs[SCHEDULE_ATTR] == "op"
    (launch,) = kernel_launches(lowered)
    ref = _torch_conv(x, w, strides, padding, dilation, groups)
    # the shared tiles hold one step's weights and input box, not the whole input
    n, o, h, wd = ref.shape
    geom = ConvShape(n, o, h, wd, ws[1], ws[2], ws[3], strides, dilation)
    tiles = conv_tiles(geom, OPENCL, o // groups)
    assert 4 * _shared_floats(launch) <= shared_bytes(geom, tiles, groups)
    assert launch.threads_per_block == tiles.threads
    np.testing.assert_allclose(_run(lowered, [x, w], ref.shape), ref, rtol=1e-4, atol=1e-4)


def test_large_convolution_stages_tiles_not_the_image():
    x = RNG.standard_normal((1, 64, 56, 56)).astype("float32")
    w = RNG.standard_normal((64, 64, 3, 3)).astype("float32")
    _, lowered = _lowered("nn.conv2d", [x, w], _attrs((1, 1), (1, 1, 1, 1), (1, 1)), OPENCL)
    (launch,) = kernel_launches(lowered)
    assert 4 * _shared_floats(launch) < x.nbytes // 8
    ref = _torch_conv(x, w, (1, 1), (1, 1, 1, 1), (1, 1), 1)
    np.testing.assert_allclose(_run(lowered, [x, w], ref.shape), ref, rtol=1e-4, atol=1e-3)


@pytest.mark.parametrize("xs,ws,strides,padding,dilation", DEPTHWISE)
def test_depthwise_matches_torch_on_opencl(xs, ws, strides, padding, dilation):
    x = RNG.standard_normal(xs).astype("float32")
    w = RNG.standard_normal(ws).astype("float32")
    attrs = _attrs(strides, padding, dilation, xs[1])
    sched, lowered = _lowered("nn.conv2d", [x, w], attrs, OPENCL)
    assert sched.attrs[SCHEDULE_ATTR] == "op"
    (launch,) = kernel_launches(lowered)
    assert [s.name for s in launch.shared] == ["conv2d_pad_shared"]  # the input box only
    assert [simplify(d).value for d in launch.grid][1] == xs[1]  # a channel per blockIdx.y
    ref = _torch_conv(x, w, strides, padding, dilation, xs[1])
    np.testing.assert_allclose(_run(lowered, [x, w], ref.shape), ref, rtol=1e-5, atol=1e-5)


#: The unit roundoff of each 16-bit float (half an ulp, relative).
UNIT = {"float16": 2.0 ** -11, "bfloat16": 2.0 ** -8}
# 16-bit convolutions the tensor cores do not take: depthwise, grouped, and (knobs) a shape
# the mma schedule refuses unpadded; (data, weight, strides, padding, dilation, groups, knobs)
LOW_PRECISION_SIMT = [
    ((1, 16, 12, 12), (16, 1, 7, 7), (1, 1), (3, 3, 3, 3), (1, 1), 16, None),   # depthwise
    ((1, 64, 9, 9), (32, 32, 3, 3), (1, 1), (1, 1, 1, 1), (1, 1), 2, None),     # grouped
    ((1, 64, 7, 7), (32, 64, 3, 3), (1, 1), (1, 1, 1, 1), (1, 1), 1,           # 49 pixels
     {"gpu_conv_mma_pad": False}),
    ((1, 32, 8, 8), (32, 32, 3, 3), (1, 1), (1, 1, 1, 1), (1, 1), 1, {"gpu_conv_mma": False}),
]


def _float32_sum_bound(x, w, strides, padding, dilation, groups, dtype) -> np.ndarray:
    """What a float32 sum of the K products rounded once to ``dtype`` may be off by: one
    rounding of the result, plus K float32 roundings of the sum of |products| (the standard
    bound of recursive summation). A float16 accumulator rounds every partial sum to
    ``dtype`` and is off by up to K roundings of those partial sums instead."""
    k = w.shape[1] * w.shape[2] * w.shape[3]
    exact = _torch_conv(x.astype("float64"), w.astype("float64"), strides, padding, dilation,
                        groups)
    magnitude = _torch_conv(np.abs(x).astype("float64"), np.abs(w).astype("float64"), strides,
                            padding, dilation, groups)
    return exact, UNIT[dtype] * np.abs(exact) + k * 2.0 ** -24 * magnitude


@pytest.mark.parametrize("dtype", ["float16", "bfloat16"])
@pytest.mark.parametrize("xs,ws,strides,padding,dilation,groups,knobs", LOW_PRECISION_SIMT)
def test_low_precision_simt_convolutions_accumulate_in_float32(dtype, xs, ws, strides, padding,
                                                               dilation, groups, knobs):
    """The SIMT schedules keep a 16-bit convolution's sums in float32 registers and round
    once, at the store, as the tensor cores do: within one rounding of the float64 result
    (positive data: the partial sums grow, a 16-bit accumulator's error with them)."""
    npdt = NP16[dtype]
    x = RNG.uniform(0, 1, xs).astype(npdt)
    w = RNG.uniform(0, 1, ws).astype(npdt)
    sched, lowered = _lowered("nn.conv2d", [x, w], _attrs(strides, padding, dilation, groups),
                              OPENCL, knobs)
    assert sched.attrs[SCHEDULE_ATTR] == "op" and mma_calls(lowered) == 0
    exact, bound = _float32_sum_bound(x, w, strides, padding, dilation, groups, dtype)
    out = np.full(exact.shape, np.nan, npdt)
    gpu_build({"f": lowered}, OPENCL)["f"](x, w, out)
    err = np.abs(out.astype("float64") - exact)
    assert np.all(err <= bound), (err.max(), (err / bound).max())


def test_knobs_choose_the_tiles():
    x = RNG.standard_normal((1, 8, 12, 12)).astype("float32")
    w = RNG.standard_normal((16, 8, 3, 3)).astype("float32")
    knobs = {"gpu_conv_threads_o": 2, "gpu_conv_threads_y": 4, "gpu_conv_threads_x": 8,
             "gpu_conv_reg_o": 2, "gpu_conv_reg_x": 1, "gpu_conv_k_channels": 2}
    sched, lowered = _lowered("nn.conv2d", [x, w], _attrs((1, 1), (1, 1, 1, 1), (1, 1)),
                              OPENCL, knobs)
    assert sched.attrs[SCHEDULE_ATTR] == "op"
    (launch,) = kernel_launches(lowered)
    assert launch.threads_per_block == 2 * 4 * 8
    weights = 2 * 2 * 2 * 9          # threads_o x reg_o x k_channels x taps
    box = 2 * (4 + 2) * (8 + 2)      # k_channels x (rows + halo) x (columns + halo)
    assert sorted(_shared_floats_each(launch)) == sorted([weights, box])
    ref = _torch_conv(x, w, (1, 1), (1, 1, 1, 1), (1, 1), 1)
    np.testing.assert_allclose(_run(lowered, [x, w], ref.shape), ref, rtol=1e-4, atol=1e-4)


def test_other_layouts_get_the_generic_rules():
    x = RNG.standard_normal((1, 9, 9, 4)).astype("float32")
    w = RNG.standard_normal((3, 3, 4, 8)).astype("float32")
    attrs = {"padding": (1, 1), "data_layout": "NHWC", "kernel_layout": "HWIO"}
    sched, lowered = _lowered("nn.conv2d", [x, w], attrs, OPENCL)
    assert sched.attrs[SCHEDULE_ATTR] == "rules"
    ref = F.conv2d(torch.from_numpy(x).permute(0, 3, 1, 2),
                   torch.from_numpy(w).permute(3, 2, 0, 1), padding=1).permute(0, 2, 3, 1)
    np.testing.assert_allclose(_run(lowered, [x, w], tuple(ref.shape)), ref.numpy(),
                               rtol=1e-4, atol=1e-4)


def _conv_block_module(depthwise: bool):
    """conv -> + bias -> + residual -> relu, the fusion of a ResNet block's tail."""
    bb = g.BlockBuilder()
    c = 8
    x = g.Var("x", g.TensorStructInfo((2, c, 10, 10), "float32"))
    w = g.const(RNG.standard_normal((c, 1 if depthwise else c, 3, 3)).astype("float32"))
    bias = g.const(RNG.standard_normal((1, c, 1, 1)).astype("float32"))
    with bb.function("main"):
        with bb.dataflow():
            y = op.nn.conv2d(x, w, padding=(1, 1), groups=c if depthwise else 1)
            y = bb.emit_output(op.nn.relu(op.add(op.add(y, bias), x)))
        bb.emit_func_output(y, params=[x])
    return bb.get()


@pytest.mark.parametrize("depthwise", [False, True])
def test_fused_epilogues_fold_into_the_write_back(depthwise):
    mod = _conv_block_module(depthwise)
    exe = kiln.build(mod, OPENCL)
    funcs = exe.module.program.functions
    assert [len(f.kernels) for f in funcs.values()] == [1]
    xs = RNG.standard_normal((2, 8, 10, 10)).astype("float32")
    np.testing.assert_allclose(exe(xs), kiln.build(mod, "c")(xs), rtol=1e-4, atol=1e-4)


POOLS = [
    ("nn.max_pool2d", (1, 5, 17, 13), {"pool_size": (3, 3), "strides": (2, 2),
                                       "padding": (1, 1, 1, 1)}),
    ("nn.avg_pool2d", (2, 3, 11, 11), {"pool_size": (2, 3), "strides": (2, 1),
                                       "padding": (0, 1, 0, 1), "count_include_pad": False}),
    ("nn.adaptive_avg_pool2d", (2, 6, 7, 7), {"output_size": (1, 1)}),     # global
    ("nn.adaptive_max_pool2d", (1, 4, 9, 10), {"output_size": (3, 4)}),
]


def _torch_pool(name: str, x: np.ndarray, attrs: dict) -> np.ndarray:
    t = torch.from_numpy(x)
    if name == "nn.max_pool2d":
        pt, pl, pb, pr = attrs["padding"]
        t = F.pad(t, (pl, pr, pt, pb), value=-np.inf)
        return F.max_pool2d(t, attrs["pool_size"], attrs["strides"]).numpy()
    if name == "nn.avg_pool2d":
        pt, pl, pb, pr = attrs["padding"]
        assert pt == pb and pl == pr
        return F.avg_pool2d(t, attrs["pool_size"], attrs["strides"], padding=(pt, pl),
                            count_include_pad=False).numpy()
    if name == "nn.adaptive_avg_pool2d":
        return F.adaptive_avg_pool2d(t, attrs["output_size"]).numpy()
    return F.adaptive_max_pool2d(t, attrs["output_size"]).numpy()


@pytest.mark.parametrize("name,xs,attrs", POOLS)
def test_pooling_matches_torch_on_opencl(name, xs, attrs):
    x = RNG.standard_normal(xs).astype("float32")
    sched, lowered = _lowered(name, [x], attrs, OPENCL)
    assert sched.attrs[SCHEDULE_ATTR] == "op"
    ref = _torch_pool(name, x, attrs)
    launches = kernel_launches(lowered)
    if attrs.get("output_size") == (1, 1):  # global pooling: a block of threads per output
        grid = [simplify(d).value for d in launches[0].grid]
        assert launches[0].threads_per_block > 1 and grid[0] == xs[0] * xs[1]
    np.testing.assert_allclose(_run(lowered, [x], ref.shape), ref, rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("arch", ["sm_80", "sm_90"])
def test_resnet_convolutions_compile_within_the_limits(arch):
    """ResNet-18's convolution shapes at 224 x 224 (batch 1) and one depthwise layer, each
    within the registers and shared memory of ``arch`` and without spills."""
    target = Target("cuda", arch=arch)
    limits = target.gpu
    layers = [((1, 3, 224, 224), (64, 3, 7, 7), 2, 3, 1),
              ((1, 64, 56, 56), (64, 64, 3, 3), 1, 1, 1),
              ((1, 64, 56, 56), (128, 64, 3, 3), 2, 1, 1),
              ((1, 128, 28, 28), (256, 128, 1, 1), 2, 0, 1),
              ((1, 512, 7, 7), (512, 512, 3, 3), 1, 1, 1),
              ((1, 144, 56, 56), (144, 1, 3, 3), 2, 1, 144)]
    funcs = {}
    for k, (xs, ws, s, p, grp) in enumerate(layers):
        arrays = [np.zeros(xs, "float32"), np.zeros(ws, "float32")]
        sched, lowered = _lowered("nn.conv2d", arrays, _attrs((s, s), (p, p, p, p), (1, 1), grp),
                                  target)
        assert sched.attrs[SCHEDULE_ATTR] == "op"
        funcs[f"conv{k}"] = lowered
    program = gpu_build(funcs, target).program
    kernels = {kern.name: kern for f in program.functions.values() for kern in f.kernels}
    usage = compile_cuda(program.source, arch).resources()
    assert set(usage) == set(kernels)
    for name, res in usage.items():
        assert res.spill_stores == res.spill_loads == 0, name
        assert res.registers * kernels[name].threads <= limits.max_registers_per_block, name
        assert res.shared_bytes <= limits.shared_memory_per_block, name
