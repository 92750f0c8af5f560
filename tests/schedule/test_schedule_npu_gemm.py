"""The product planner's view of the chip (kiln.schedule.npu.gemm): every core's first loads
share the one DRAM channel (where each core multiplies one output tile), and a strided
convolution whose input on-chip residency keeps in L1 (``GemmShape.stage_onchip``, predicted by
``ops.onchip_input``) is planned with its staging on chip -- the same K steps, so the same
bits."""

from __future__ import annotations

from dataclasses import replace
from types import SimpleNamespace

import numpy as np
import pytest

import kiln
from kiln import graph as g
from kiln import op
from kiln.build import npu_pipeline
from kiln.codegen.npu import build_npu
from kiln.codegen.npu.prefetch import PREFETCH_KEY
from kiln.npu.isa import mem_name
from kiln.schedule.npu.emit import MEM_ID
from kiln.schedule.npu.gemm import feasible_tilings, gemm_cost, plan_gemm
from kiln.schedule.npu.lowering import PLAN_RESIDENCY_KEY, LoweringContext
from kiln.schedule.npu.ops import ONCHIP_SHARE, conv_geometry, onchip_input
from kiln.target.npu import load_config
from kiln.target.npu.config import DRAM
from kiln.testing.models import conv_residual_relu
from kiln.testing.npu_descriptions import edited_description
from kiln.testing.op_testing import graph_module
from kiln.transform import PassContext


def _geometry(cfg, x, w, stride, onchip=False):
    """The implicit GEMM of a padded 3x3 convolution of image ``x`` (NCHW) by ``w`` (OIHW)."""
    at = SimpleNamespace(strides=(stride, stride), dilation=(1, 1), padding=(1, 1, 1, 1))
    oh = (x[2] + 2 - 3) // stride + 1
    return conv_geometry(cfg, at, x, w, (x[0], w[0], oh, oh), "float16", onchip)


def test_every_cores_first_loads_are_on_the_channel_before_its_first_product():
    """Default (2 cores, one 64 B/cycle channel), ResNet-18's 3x3/s2 of stage 3 (M196 x N256
    x K1152, one output tile a core): each core's first step waits for the other core's
    first tiles too, so the planner takes K steps of 144 (2 x 37 KB of weights before the
    first products) over 288 (2 x 74 KB), which it ranked first when each core's first
    loads were counted alone (simulated in the model: 18884 -> 17319 cycles)."""
    cfg = load_config("default")
    shape = _geometry(cfg, (1, 128, 28, 28), (256, 128, 3, 3), 2).shape
    t = plan_gemm(cfg, shape, 2)
    assert (t.m_units * shape.m_unit, t.n, t.k_units * shape.k_unit) == (196, 128, 144)
    # K288 pays the other core's larger first weight tile: (288 - 144) x 128 x 2 bytes at
    # the chip's bandwidth more before its first product
    k288 = gemm_cost(cfg, shape, 14, 128, 32, 2, balance=False)
    assert k288 - t.estimate >= (288 - 144) * 128 * 2 / cfg.memory(DRAM).bandwidth


def test_with_several_tiles_a_core_the_first_loads_are_not_charged():
    """Stage 2's 3x3/1 (M784 x N128 x K1152: seven M tiles, two N tiles): the plan stays
    M112 x N64 x K576 -- charging the other core's first loads there took M448 x K144, whose
    fused residual epilogue stalls the tensor unit after each tile (32831 -> 35143 cycles)."""
    cfg = load_config("default")
    shape = _geometry(cfg, (1, 128, 28, 28), (128, 128, 3, 3), 1).shape
    t = plan_gemm(cfg, shape, 2)
    assert (t.m_units * shape.m_unit, t.n, t.k_units * shape.k_unit) == (112, 64, 576)


@pytest.mark.parametrize("onchip", [False, True])
def test_a_strided_input_staged_from_l1_is_split_along_n(onchip):
    """Default, ResNet-18's 3x3/s2 of stage 2 (M784 x N128 x K576): with the image in DRAM
    the planner splits the cores along M (an N split stages the whole image once per core:
    twice its bytes on the channel), each core loading all the weights; staged from L1 the
    image costs no DRAM bytes and the N split halves the weights each core waits for
    (simulated in the model: 78.7 -> 85.7% of the roofline). Both plans take the same K
    steps (the same order of additions)."""
    cfg = load_config("default")
    shape = _geometry(cfg, (1, 64, 56, 56), (128, 64, 3, 3), 2, onchip).shape
    assert shape.stage_onchip == onchip
    t = plan_gemm(cfg, shape, 2)
    dram = plan_gemm(cfg, replace(shape, stage_onchip=False), 2)
    assert t.k_units == dram.k_units
    if onchip:
        assert t.n * cfg.cores == shape.n  # each core its half of the output channels
        # no DRAM bytes for A: any tiling costs at most what it costs from DRAM
        for d in feasible_tilings(cfg, replace(shape, stage_onchip=False), 2)[:20]:
            assert gemm_cost(cfg, shape, d.m_units, d.n, d.k_units, 2, d.balance) <= \
                d.estimate + 1e-6
    else:
        assert t.n == shape.n


def test_a_stride_one_input_is_planned_as_from_dram():
    """A stride-1 3x3 (stage 4's) keeps the DRAM plan whether its input is on chip or not:
    planned from L1 it split N otherwise, which moved its weights' prefetch into the kernel
    before (measured on ResNet-18: no gain)."""
    cfg = load_config("default")
    geo = _geometry(cfg, (1, 512, 7, 7), (512, 512, 3, 3), 1, True)
    assert not geo.shape.stage_onchip


def test_the_prediction_counts_only_intermediates_that_fit():
    """``onchip_input``: an intermediate of at most 1/ONCHIP_SHARE of L1, never a pinned
    tensor (a program input), a constant, a larger one, or anything with the option off."""
    cfg = load_config("default")
    ctx = LoweringContext(cfg)
    l1 = cfg.memory("l1").size
    small = ctx.alloc((1, 64, 56, 56), "float16")
    big = ctx.alloc((1, l1 // ONCHIP_SHARE // 2 + 1), "float16")
    inp = ctx.pin(ctx.alloc((1, 8, 8, 8), "float16"))
    const = ctx.constant(np.zeros((1, 8, 8, 8), "float16"))
    assert not onchip_input(ctx, small, "float16")  # off unless the build turns it on
    ctx.plan_residency = True
    assert onchip_input(ctx, small, "float16")
    assert not onchip_input(ctx, small.__class__(small.addr, (1, l1 // 4), "float32"),
                            "float16")  # read cast from float32: 4 bytes an element
    assert not onchip_input(ctx, big, "float16")
    assert not onchip_input(ctx, inp, "float16")
    assert not onchip_input(ctx, const, "float16")
    assert not onchip_input(ctx, np.zeros((1, 8, 8, 8), "float32"), "float16")
    mark = ctx.checkpoint()
    later = ctx.constant(np.ones(4, "float16"))
    ctx.rollback(mark)  # a rolled-back constant's address is free again
    assert later.addr not in ctx.pinned


def _conv(x, w, stride):
    """A padded 3x3 convolution in numpy (the reference)."""
    xp = np.pad(x, ((0, 0), (0, 0), (1, 1), (1, 1)))
    oh = (x.shape[2] + 2 - 3) // stride + 1
    out = np.zeros((x.shape[0], w.shape[0], oh, oh))
    for i in range(3):
        for j in range(3):
            patch = xp[:, :, i:i + stride * oh:stride, j:j + stride * oh:stride]
            out += np.einsum("nchw,oc->nohw", patch, w[:, :, i, j])
    return out


def test_planning_with_residency_keeps_the_bits():
    """conv -> relu -> 3x3/s2 conv -> relu on default: the second convolution's input is an
    intermediate kept in L1, planned as such (``npu.plan_residency``, the default) or as if
    in DRAM; the outputs are bit for bit the same (the same K steps) and match float64 numpy
    within float16's rounding."""
    rng = np.random.default_rng(5)
    w1 = (rng.standard_normal((32, 8, 3, 3)) * 0.2).astype("float32")
    w2 = (rng.standard_normal((48, 32, 3, 3)) * 0.1).astype("float32")

    def fn(x):
        h = op.nn.relu(op.nn.conv2d(x, g.const(w1), padding=(1, 1)))
        return op.nn.relu(op.nn.conv2d(h, g.const(w2), strides=(2, 2), padding=(1, 1)))

    mod = npu_pipeline()(graph_module(fn, [(1, 8, 30, 30)]))
    x = rng.standard_normal((1, 8, 30, 30)).astype("float32")
    outs, tilings = [], []
    for plan in (False, True):
        with PassContext(config={PLAN_RESIDENCY_KEY: plan}):
            exe = build_npu(mod, kiln.Target("npu", hw="default"))
        outs.append(exe(x))
        tilings.append([k.tiling for k in exe.kernels if k.op == "nn.conv2d"])
        assert exe.residency.tensors >= 1
    # the second convolution is planned otherwise (its input on chip), in the same K steps
    assert tilings[0][0] == tilings[1][0] and tilings[0][1] != tilings[1][1]
    assert [t.split(" x ")[2] for t in tilings[0]] == [t.split(" x ")[2] for t in tilings[1]]
    np.testing.assert_array_equal(outs[0], outs[1])
    ref = _conv(np.maximum(_conv(x.astype("float64"), w1, 1), 0), w2, 2)
    np.testing.assert_allclose(outs[1], np.maximum(ref, 0), rtol=2e-2, atol=2e-2)


def _residual_dense(m, k, n, residual, seed=5):
    """``dense(x, W) + b (+ r)`` for x ``[m, k]`` (and r ``[m, n]``) inputs (a matmul by
    the time it is lowered): the product's fused epilogue adds a bias, and a residual where
    asked."""
    rng = np.random.default_rng(seed)
    w = (rng.standard_normal((n, k)) * 0.1).astype("float32")
    bias = (rng.standard_normal(n) * 0.1).astype("float32")
    bb = g.BlockBuilder()
    xs = [g.Var("x", g.TensorStructInfo((m, k), "float32"))]
    if residual:
        xs.append(g.Var("r", g.TensorStructInfo((m, n), "float32")))
    with bb.function("main", xs):
        with bb.dataflow():
            y = bb.emit(op.dense(xs[0], g.const(w)), "y")
            y = bb.emit(op.add(y, g.const(bias)), "yb")
            if residual:
                y = bb.emit(op.add(y, xs[1]), "yr")
            out = bb.emit_output(y, "out")
        bb.emit_func_output(out)
    args = [rng.standard_normal((m, k)).astype("float32")]
    if residual:
        args.append(rng.standard_normal((m, n)).astype("float32"))
    ref = args[0].astype(np.float64) @ w.T.astype(np.float64) + bias
    return bb.get(), args, ref + (args[1] if residual else 0)


def _first_loads(exe, core):
    """The memories the product kernel's DMA loads on ``core`` write before its first
    ``mma``: the first step's loads, in order."""
    stream = exe.steps[0].program.streams[core]
    first = next(i for i, ins in enumerate(stream) if ins.op.startswith("mma"))
    start = max(i for i, ins in enumerate(stream[:first]) if ins.op == "barrier")
    return [mem_name(ins.args["dst"].mem) for ins in stream[start:first]
            if ins.op == "dma.load"]


@pytest.mark.parametrize("residual", [False, True])
def test_a_residual_epilogue_staggers_the_cores_first_loads(residual):
    """Default (2 cores): a product whose fused epilogue adds a residual loads core 1's
    first B tile before its A tile (core 0: A first), so one core's A (from L1, where
    residency keeps an activation) overlaps the other's B on the DRAM channel; each tile's
    store (the residual's chunk loads) goes behind the core's next step's loads. Without a
    residual both cores load A first (STAGGER_FIRST_LOADS, DEFER_STORES). Both routes emit
    the same program (the same cycles, the same bits), close to float64."""
    mod, args, ref = _residual_dense(64, 96, 160, residual)
    exes = {}
    for rt in ("tir", "emit"):
        # no prefetch across kernel boundaries: it would move the first loads of the
        # product above the barrier after the cast kernel before it
        with PassContext(config={"npu.lowering": rt, PREFETCH_KEY: False}):
            exes[rt] = build_npu(npu_pipeline()(mod), kiln.Target("npu", hw="default"))
    for exe in exes.values():
        assert [k.label.split(":", 1)[1] for k in exe.kernels if k.op == "matmul"] == \
            ["matmul+add+add" if residual else "matmul+add"]
        assert _first_loads(exe, 0)[:2] == ["input", "weight"]
        assert _first_loads(exe, 1)[:2] == (["weight", "input"] if residual else
                                            ["input", "weight"])
    outs = {rt: e(*args) for rt, e in exes.items()}
    assert np.array_equal(outs["tir"], outs["emit"])
    assert exes["tir"].last_cycles == exes["emit"].last_cycles
    err = np.max(np.abs(outs["tir"] - ref)) / np.max(np.abs(ref))
    assert err < 5e-3, err


def _small_acc(tmp_path, size):
    """Edge with ``size`` of accumulators (one core; the pointwise convolution's tiles of
    M32 x N16 in float32 take 2 KiB each)."""
    path, cfg = edited_description(tmp_path, "edge-small-acc", (
        r'(^\[l0\.acc\]\s*\nsize\s*=\s*)"[^"]*"', rf'\1"{size}"'), base="edge")
    assert cfg.memory("acc").size == int(size.split()[0]) * 1024
    return path


def test_a_third_output_slot_leaves_the_fused_epilogue_its_chunks(tmp_path):
    """A pointwise convolution (128 -> 32 channels, 14 x 14) whose fused epilogue adds a
    residual, on 7 KiB of accumulators: one K step and the streamed loads as large as an
    output tile, so ``acc_slots`` would take a third 2 KiB slot -- leaving the epilogue 1 KiB,
    chunks of 80 elements, 76 residual loads (25413 cycles) where two slots leave chunks of
    half a tile (28 loads, 20296 cycles). With the epilogue it keeps two; the bits are the
    unfused build's and close to numpy. Without the bank placement: no slot count chosen
    by replay (``feedback.choose_acc_slots``), ``acc_slots``' own."""
    path = _small_acc(tmp_path, "7 KiB")
    rng = np.random.default_rng(5)
    w = (rng.standard_normal((32, 128, 1, 1)) * 0.2).astype("float32")
    x = rng.standard_normal((1, 128, 14, 14)).astype("float32")
    res = rng.standard_normal((1, 32, 14, 14)).astype("float32")
    mod = conv_residual_relu(w, res.shape)
    outs, exes = {}, {}
    for fuse in (False, True):
        exes[fuse] = build_npu(npu_pipeline()(mod), kiln.Target("npu", hw=path),
                               residency=False, fuse_epilogue=fuse, bank_plan=False)
        outs[fuse] = np.asarray(exes[fuse](x, res))
    assert np.array_equal(outs[True], outs[False])
    ref = np.maximum(np.einsum("oc,nchw->nohw", w[:, :, 0, 0], x) + res, 0)
    assert np.max(np.abs(outs[True] - ref)) / np.max(np.abs(ref)) < 2e-2
    kernel = next(k for k in exes[True].kernels if "nn.conv2d+add+relu" in k.label)
    assert "M32 x N16 x K128" in kernel.tiling, kernel.tiling
    acc = MEM_ID["acc"]
    for fuse, slots in ((False, 3), (True, 2)):  # unfused: nothing above, the third slot
        stream = [s.program for s in exes[fuse].steps
                  if getattr(s, "program", None)][-1].streams[0]
        tiles = {i.args["c"].addr // 2048 * 2048 for i in stream  # (tail pieces inside)
                 if i.op == "mma.set" and i.args["c"].mem == acc}
        assert tiles == {2048 * n for n in range(slots)}, (fuse, tiles)
    loads = [i for i in stream if i.op == "dma.load" and i.args["dst"].mem == acc]
    assert len(loads) == 28  # 13 tiles in two chunks, the last one's two tail pieces
