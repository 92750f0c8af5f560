"""float16/bfloat16 convolutions on tensor cores (kiln/schedule/gpu/conv_mma.py): the im2col
GEMM on mma tiles run on OpenCL (PoCL: each thread computes its part of every mma in float32)
against torch's float32 convolution of the same inputs, fused epilogues, ToMixedPrecision's
float32-accumulating convolutions in a small ResNet, the explicit fallbacks to the SIMT
implicit GEMM, and the CUDA kernels of ResNet-18's convolutions compiled by NVRTC within the
register and shared-memory limits of sm_80 and sm_90."""

from __future__ import annotations

import logging
import re

import ml_dtypes
import numpy as np
import pytest

import kiln
from kiln import graph as g
from kiln import op
from kiln.codegen.gpu.build import build as gpu_build
from kiln.codegen.gpu.nvrtc import compile_cuda
from kiln.schedule.gpu import SCHEDULE_ATTR, schedule_and_lower
from kiln.schedule.gpu.conv_mma import (
    INT32_ELEMENTS,
    channels_inner,
    conv_gemm_func,
    index_dtype,
    padded_gemm,
    reduction_step,
)
from kiln.target import Target
from kiln.testing import models
from kiln.testing.gpu_testing import kernel_launches, mma_calls
from kiln.testing.op_testing import scheduled
from kiln.tir.functor import post_order_visit
from kiln.tir.schedule.analysis import as_int
from kiln.tir.stmt import BlockRealize
from kiln.transform import ToMixedPrecision

torch = pytest.importorskip("torch")
F = torch.nn.functional

OPENCL = Target("opencl")
RNG = np.random.default_rng(41)
NP = {"float16": np.float16, "bfloat16": ml_dtypes.bfloat16}
#: One rounding of a float32 sum to the output dtype (half an ulp), with margin: 2^-10 / 2^-7.
EPS = {"float16": 2.0 ** -10, "bfloat16": 2.0 ** -7}


def _attrs(strides, padding, dilation=(1, 1)) -> dict:
    return {"strides": strides, "padding": padding, "dilation": dilation, "groups": 1}


def _lowered(arrays, attrs, target, knobs=None):
    func, _ = scheduled("nn.conv2d", arrays, attrs, schedule=False)
    return schedule_and_lower(func.with_attr("op_name", "nn.conv2d"), target, knobs)


def _torch_conv(x, w, strides, padding, dilation=(1, 1)) -> np.ndarray:
    """float64 convolution of the (exactly widened) float16/bfloat16 inputs."""
    pt, pl, pb, pr = padding
    xt = F.pad(torch.from_numpy(x.astype("float64")), (pl, pr, pt, pb))
    return F.conv2d(xt, torch.from_numpy(w.astype("float64")), stride=strides,
                    dilation=dilation).numpy()


def _check(out, exact, dtype, roundings=1):
    """float32 sums rounded ``roundings`` times to ``dtype``."""
    err = np.abs(out.astype("float64") - exact)
    bound = roundings * EPS[dtype] * np.abs(exact) + 1e-3 * np.abs(exact).max()
    assert np.all(err <= bound), (err.max(), np.abs(exact).max())


# (data shape, weight shape, strides, padding (top, left, bottom, right), dilation)
CONVS = [
    ((2, 32, 8, 8), (64, 32, 1, 1), (1, 1), (0, 0, 0, 0), (1, 1)),      # 1x1, batch 2
    ((2, 16, 8, 8), (32, 16, 3, 3), (1, 1), (1, 1, 1, 1), (1, 1)),      # 3x3 pad 1, K = 144
    ((1, 16, 16, 16), (32, 16, 3, 3), (2, 2), (1, 1, 1, 1), (1, 1)),    # 3x3 / 2
    ((1, 3, 32, 32), (64, 3, 7, 7), (2, 2), (3, 3, 3, 3), (1, 1)),      # stem: K = 147 -> 160
    ((2, 32, 8, 8), (64, 32, 1, 1), (2, 2), (0, 0, 0, 0), (1, 1)),      # downsample 1x1 / 2
    ((1, 16, 8, 8), (16, 16, 3, 3), (1, 1), (1, 1, 1, 1), (1, 1)),      # 16 channels: 1 warp
    ((1, 8, 12, 10), (32, 8, 3, 3), (1, 1), (2, 2, 2, 2), (2, 2)),      # dilated, K = 72 -> 80
    ((1, 16, 7, 7), (24, 16, 3, 3), (1, 1), (1, 1, 1, 1), (1, 1)),      # M 24 -> 32, N 49 -> 64
    ((2, 8, 14, 14), (32, 8, 3, 3), (2, 2), (1, 1, 1, 1), (1, 1)),      # N 2 x 49 -> 128
]


@pytest.mark.parametrize("dtype", ["float16", "bfloat16"])
@pytest.mark.parametrize("xs,ws,strides,padding,dilation", CONVS)
def test_conv_on_tensor_cores_matches_torch_on_opencl(dtype, xs, ws, strides, padding,
                                                      dilation):
    x = RNG.uniform(-1, 1, xs).astype(NP[dtype])
    w = RNG.uniform(-1, 1, ws).astype(NP[dtype])
    sched, lowered = _lowered([x, w], _attrs(strides, padding, dilation), OPENCL)
    assert sched.attrs[SCHEDULE_ATTR] == "op"
    assert mma_calls(lowered) > 0
    assert len(kernel_launches(lowered)) == 1  # the im2col gathered in the shared copies
    exact = _torch_conv(x, w, strides, padding, dilation)
    out = np.full(exact.shape, np.nan, NP[dtype])
    gpu_build({"f": lowered}, OPENCL)["f"](x, w, out)
    _check(out, exact, dtype)


@pytest.mark.parametrize("knobs", [
    {"gpu_mma_bk": 64, "gpu_mma_stages": 1},                       # K = 147 -> 192
    {"gpu_mma_warps": (1, 1), "gpu_mma_tiles": (2, 4), "gpu_mma_bk": 16},
    {"gpu_mma_warps": (4, 2), "gpu_mma_tiles": (1, 1)},
])
def test_mma_knobs_apply_to_convolutions(knobs):
    x = RNG.uniform(-1, 1, (2, 3, 16, 16)).astype(np.float16)
    w = RNG.uniform(-1, 1, (64, 3, 7, 7)).astype(np.float16)
    sched, lowered = _lowered([x, w], _attrs((1, 1), (3, 3, 3, 3)), OPENCL, knobs)
    assert sched.attrs[SCHEDULE_ATTR] == "op" and mma_calls(lowered) > 0
    warps = knobs.get("gpu_mma_warps", (2, 2))
    assert kernel_launches(lowered)[0].threads_per_block == 32 * warps[0] * warps[1]
    exact = _torch_conv(x, w, (1, 1), (3, 3, 3, 3))
    out = np.full(exact.shape, np.nan, np.float16)
    gpu_build({"f": lowered}, OPENCL)["f"](x, w, out)
    _check(out, exact, "float16")


def test_gemm_view_pads_the_reduction_to_the_step():
    """The stem's K = 3 x 7 x 7 = 147: 160 with 32-deep steps (zeros in both gathers)."""
    x = np.zeros((1, 3, 32, 32), np.float16)
    w = np.zeros((64, 3, 7, 7), np.float16)
    func, _ = scheduled("nn.conv2d", [x, w], _attrs((2, 2), (3, 3, 3, 3)), schedule=False)
    assert reduction_step(147) == 32 and reduction_step(72) == 16 and reduction_step(576) == 32
    gemm = conv_gemm_func(func, 32)
    shapes = {b.name: tuple(as_int(d) for d in b.shape) for b in gemm.body.block.alloc_buffers}
    assert shapes["conv2d_a"] == (64, 160) and shapes["conv2d_b"] == (160, 16 * 16)


def _block(func, name):
    """The block ``name`` of ``func``."""
    found = []
    post_order_visit(func.body, lambda n: found.append(n.block) if isinstance(n, BlockRealize)
                     and n.block.name_hint == name else None)
    (block,) = found
    return block


def test_gemm_view_runs_taps_outer_when_steps_hold_whole_channel_runs():
    """64 channels, 32-deep steps: k = tap * 64 + channel, so a step's tap is one value per
    block (k // 64) and its channels consecutive; the stem's 3 channels keep c * 49 + tap."""
    assert channels_inner(64, 32) and channels_inner(16, 16) and not channels_inner(3, 32)
    x = np.zeros((1, 64, 8, 8), np.float16)
    w = np.zeros((64, 64, 3, 3), np.float16)
    func, _ = scheduled("nn.conv2d", [x, w], _attrs((1, 1), (1, 1, 1, 1)), schedule=False)
    gemm = conv_gemm_func(func, 32)
    weight = str(_block(gemm, "conv2d_a").body.value)
    assert "vk % 64" in weight and "vk // 64 // 3" in weight and "vk // 64 % 3" in weight
    # int32 iteration (and index) variables: every buffer has fewer than 2^31 elements
    assert all(str(iv.var.dtype) == "int32" for iv in _block(gemm, "conv2d").iter_vars)
    stem = conv_gemm_func(scheduled("nn.conv2d", [np.zeros((1, 3, 32, 32), np.float16),
                                                  np.zeros((64, 3, 7, 7), np.float16)],
                                    _attrs((2, 2), (3, 3, 3, 3)), schedule=False)[0], 32)
    assert "vk // 49" in str(_block(stem, "conv2d_a").body.value)


@pytest.mark.parametrize("taps_outer", [True, False])
def test_both_reduction_orders_match_torch_on_opencl(taps_outer):
    """Strided, dilated, asymmetrically padded: the taps-outer gather's bounds tests."""
    x = RNG.uniform(-1, 1, (1, 32, 9, 7)).astype(np.float16)
    w = RNG.uniform(-1, 1, (32, 32, 3, 3)).astype(np.float16)
    knobs = {"gpu_conv_mma_taps_outer": taps_outer, "gpu_mma_bk": 32}
    sched, lowered = _lowered([x, w], _attrs((2, 1), (1, 2, 1, 0), (1, 2)), OPENCL, knobs)
    assert sched.attrs[SCHEDULE_ATTR] == "op" and mma_calls(lowered) > 0
    source = gpu_build({"f": lowered}, OPENCL).program.source
    # taps outer: the weight gather's taps are the step's (l_vk_0 // 1, one 32-channel run
    # per tap), no division by the 9 taps of k anywhere
    assert (" / 9)" in source) != taps_outer
    exact = _torch_conv(x, w, (2, 1), (1, 2, 1, 0), (1, 2))
    out = np.full(exact.shape, np.nan, np.float16)
    gpu_build({"f": lowered}, OPENCL)["f"](x, w, out)
    _check(out, exact, "float16")


def test_index_dtype_widens_past_int32():
    func, _ = scheduled("nn.conv2d", [np.zeros((1, 16, 8, 8), np.float16),
                                      np.zeros((32, 16, 3, 3), np.float16)],
                        _attrs((1, 1), (1, 1, 1, 1)), schedule=False)
    assert index_dtype(func, (32 * 144,), "int64") == "int32"
    assert index_dtype(func, (INT32_ELEMENTS + 1,), "int64") == "int64"


def test_padded_rows_and_columns_are_computed_but_not_stored():
    """49 pixels and 24 channels: a 64 x 32 GEMM whose output stores are predicated."""
    assert padded_gemm(24, 49, 132) == (32, 64) and padded_gemm(64, 3136, 132) == (64, 3136)
    x = RNG.uniform(-1, 1, (1, 16, 7, 7)).astype(np.float16)
    w = RNG.uniform(-1, 1, (24, 16, 3, 3)).astype(np.float16)
    _, lowered = _lowered([x, w], _attrs((1, 1), (1, 1, 1, 1)), OPENCL)
    source = gpu_build({"f": lowered}, OPENCL).program.source
    assert "< 24) && (" in source and "< 49))" in source  # the store's predicate
    # a guard band after the output: nothing is written beyond the convolution's elements
    exact = _torch_conv(x, w, (1, 1), (1, 1, 1, 1))
    flat = np.full(exact.size + 4096, np.nan, np.float16)
    gpu_build({"f": lowered}, OPENCL)["f"](x, w, flat[:exact.size].reshape(exact.shape))
    assert np.isnan(flat[exact.size:]).all()
    _check(flat[:exact.size].reshape(exact.shape), exact, "float16")


@pytest.mark.parametrize("xs,ws,why", [
    ((1, 16, 8, 8), (24, 16, 3, 3), "24x64"),   # 24 output channels: no multiple of 16
    ((1, 16, 7, 7), (32, 16, 3, 3), "32x49"),   # 49 pixels: no multiple of 8
])
def test_shapes_off_the_tiles_unpadded_take_the_simt_implicit_gemm_with_a_warning(
        xs, ws, why, caplog):
    x = RNG.uniform(-1, 1, xs).astype(np.float16)
    w = RNG.uniform(-1, 1, ws).astype(np.float16)
    with caplog.at_level(logging.WARNING, logger="kiln.schedule.gpu.conv"):
        sched, lowered = _lowered([x, w], _attrs((1, 1), (1, 1, 1, 1)), OPENCL,
                                  {"gpu_conv_mma_pad": False})
    assert sched.attrs[SCHEDULE_ATTR] == "op" and mma_calls(lowered) == 0
    assert any("not on tensor cores" in r.message and why in r.message for r in caplog.records)
    exact = _torch_conv(x, w, (1, 1), (1, 1, 1, 1))
    out = np.full(exact.shape, np.nan, np.float16)
    gpu_build({"f": lowered}, OPENCL)["f"](x, w, out)
    # the SIMT path also sums in float32 and rounds once
    _check(out, exact, "float16")


def test_async_copies_are_refused_for_gathered_operands(caplog):
    """cp.async moves plain loads; the im2col is computed in its shared copy: the knob
    gpu_mma_async_stages refuses the tensor-core schedule (with its reason) instead of
    quietly pipelining something else."""
    x = RNG.uniform(-1, 1, (1, 16, 8, 8)).astype(np.float16)
    w = RNG.uniform(-1, 1, (32, 16, 3, 3)).astype(np.float16)
    with caplog.at_level(logging.WARNING, logger="kiln.schedule.gpu.conv"):
        _, lowered = _lowered([x, w], _attrs((1, 1), (1, 1, 1, 1)), OPENCL,
                              {"gpu_mma_async_stages": 2})
    assert mma_calls(lowered) == 0
    assert any("gathered operands" in r.message for r in caplog.records)
    exact = _torch_conv(x, w, (1, 1), (1, 1, 1, 1))
    out = np.full(exact.shape, np.nan, np.float16)
    gpu_build({"f": lowered}, OPENCL)["f"](x, w, out)
    _check(out, exact, "float16")


def test_knob_keeps_the_simt_path_reachable():
    x = RNG.uniform(-1, 1, (1, 16, 8, 8)).astype(np.float16)
    w = RNG.uniform(-1, 1, (32, 16, 3, 3)).astype(np.float16)
    _, lowered = _lowered([x, w], _attrs((1, 1), (1, 1, 1, 1)), OPENCL, {"gpu_conv_mma": False})
    assert mma_calls(lowered) == 0
    _, lowered = _lowered([x, w], _attrs((1, 1), (1, 1, 1, 1)), OPENCL)
    assert mma_calls(lowered) > 0


def _conv_bias_residual_relu(dtype: str, size: int, c: int = 32):
    """relu(conv3x3(x) + bias + x), the tail of a ResNet block, in ``dtype``."""
    bb = g.BlockBuilder()
    x = g.Var("x", g.TensorStructInfo((2, c, size, size), dtype))
    w = (RNG.uniform(-1, 1, (c, c, 3, 3)) / np.sqrt(9 * c)).astype(NP[dtype])
    bias = RNG.uniform(-1, 1, (1, c, 1, 1)).astype(NP[dtype])
    with bb.function("main"):
        with bb.dataflow():
            y = op.nn.conv2d(x, g.const(w), padding=(1, 1))
            y = bb.emit_output(op.nn.relu(op.add(op.add(y, g.const(bias)), x)))
        bb.emit_func_output(y, params=[x])
    return bb.get(), w, bias


@pytest.mark.parametrize("dtype,size", [("float16", 8), ("bfloat16", 8), ("float16", 7)])
def test_fused_bias_residual_relu_fold_into_the_write_back(dtype, size):
    """8 x 8: 128 columns; 7 x 7: 98 columns, padded to 128 (the residual read at clamped
    indices, the store predicated)."""
    mod, w, bias = _conv_bias_residual_relu(dtype, size)
    exe = kiln.build(mod, OPENCL)
    (func,) = exe.module.program.functions.values()
    assert len(func.kernels) == 1
    assert "kiln_mma_tile_" in exe.module.program.source  # the warp-tile route
    xs = RNG.uniform(-1, 1, (2, 32, size, size)).astype(NP[dtype])
    got = np.asarray(exe(xs)).astype("float64")
    conv = _torch_conv(xs, w, (1, 1), (1, 1, 1, 1))
    exact = np.maximum(conv + bias.astype("float64") + xs.astype("float64"), 0)
    _check(got, exact, dtype, roundings=3)  # the conv, the bias add, the residual add


@pytest.mark.parametrize("dtype", ["float16", "bfloat16"])
def test_mixed_precision_resnet_runs_its_convolutions_on_tensor_cores(dtype):
    """ToMixedPrecision's convolutions (float16/bfloat16 operands, float32 results, batch
    norm, relu and the skip add fused) in a small ResNet, against its float64 reference."""
    model = models.resnet_block_cnn(batch=2, channels=32, size=16)
    exe = kiln.build(ToMixedPrecision(dtype)(model.mod), OPENCL)
    source = exe.module.program.source
    convs = [f for name, f in exe.module.program.functions.items() if "conv2d" in name]
    # 5 convolutions, 3 distinct functions (the blocks' second convs are alike), one kernel each
    assert len(convs) == 3 and all(len(f.kernels) == 1 for f in convs)
    assert source.count("(void)kiln_mma_tile_") == 3  # one warp-tile call per conv kernel
    got = np.asarray(exe(*model.inputs)).astype("float64")
    ref = model.reference(*model.inputs)
    np.testing.assert_allclose(got, ref, atol=8 * EPS[dtype] * np.abs(ref).max())


#: ResNet-18's convolutions on tensor cores: (data, weight, stride, padding); 224 x 224 at
#: batch 1 (the 14 x 14 and 7 x 7 layers padded to 224 and 64 columns) and layer 4 at batch 32.
RESNET18 = models.RESNET18_CONVS


@pytest.mark.parametrize("arch", ["sm_80", "sm_90"])
def test_resnet18_convolutions_compile_to_mma_sync_within_the_limits(arch):
    target = Target("cuda", arch=arch)
    limits = target.gpu
    funcs = {}
    for k, (xs, ws, s, p) in enumerate(RESNET18):
        arrays = [np.zeros(xs, np.float16), np.zeros(ws, np.float16)]
        sched, lowered = _lowered(arrays, _attrs((s, s), (p,) * 4), target)
        assert sched.attrs[SCHEDULE_ATTR] == "op" and mma_calls(lowered) > 0, (xs, ws)
        funcs[f"conv{k}"] = lowered
    program = gpu_build(funcs, target).program
    kernels = {kern.name: kern for f in program.functions.values() for kern in f.kernels}
    binary = compile_cuda(program.source, arch)
    ptx = binary.ptx.decode(errors="replace")
    assert ptx.count("mma.sync.aligned.m16n8k16.row.col.f32.f16.f16.f32") >= len(RESNET18)
    usage = binary.resources()
    assert set(usage) == set(kernels)
    texts = binary.kernel_ptx()
    for name, res in usage.items():
        assert res.spill_stores == res.spill_loads == 0 and res.stack_bytes == 0, name
        # int32 index arithmetic: no 64-bit division, remainder or multiply-high (what a
        # division by a constant becomes) anywhere in the kernel, im2col gathers included
        assert not re.search(r"\b(?:div|rem|mul\.hi)\.[su]64\b", texts[name]), name
        assert res.registers * kernels[name].threads <= limits.max_registers_per_block, name
        assert res.shared_bytes <= limits.shared_memory_per_block, name
