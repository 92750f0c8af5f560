"""The banded (Toeplitz) depthwise convolution on the tensor unit (kiln/schedule/npu/banded.py):
its geometry and bands replayed in numpy against torch's convolution, then forced onto the
simulator (float16 operands / float32 accumulation, int8 exact) on both descriptions."""

import re

import numpy as np
import pytest
import torch

import kiln
from kiln import graph as g
from kiln import op
from kiln.codegen.npu import DEPTHWISE_KEY
from kiln.codegen.npu.prefetch import PREFETCH_KEY
from kiln.schedule.npu import ops
from kiln.schedule.npu.banded import (
    banded_block_widths,
    banded_geometry,
    banded_rows,
    banded_weights,
)
from kiln.schedule.npu.gemm import GemmTiling
from kiln.schedule.npu.nest_analysis import unit_shares
from kiln.schedule.npu.region import FUSE_EPILOGUE_KEY
from kiln.target.npu import load_config
from kiln.testing.op_testing import graph_module
from kiln.transform import PassContext

HW = ["default", "edge"]


def _attrs(c, x_shape, stride, pad, dil, k=3):
    x = g.Var("x", g.TensorStructInfo(x_shape, "float32"))
    w = np.zeros((c, 1, k, k), "float32")
    return op.nn.conv2d(x, g.const(w), strides=stride, padding=pad, dilation=dil,
                        groups=c).attrs


def _torch_ref(x, w, stride, pad, dil):
    p = pad if len(pad) == 4 else (pad[0], pad[1], pad[0], pad[1])
    xt = torch.nn.functional.pad(torch.from_numpy(x.astype(np.float64)), (p[1], p[3], p[0], p[2]))
    return torch.nn.functional.conv2d(xt, torch.from_numpy(w.astype(np.float64)), stride=stride,
                                      dilation=dil, groups=x.shape[1]).numpy()


CASES = [  # (x shape, stride, padding, dilation)
    ((2, 5, 13, 11), (1, 1), (1, 1), (1, 1)),         # odd width, no multiple of a block
    ((1, 3, 16, 17), (2, 2), (1, 1), (1, 1)),         # stride 2
    ((1, 4, 9, 10), (1, 2), (0, 2, 1, 0), (1, 1)),    # asymmetric padding and strides
    ((1, 3, 11, 37), (1, 1), (2, 2), (2, 2)),         # dilation, several blocks
]


def _case(hw, shape, stride, pad, dil, seed):
    """A random image and 3 x 3 depthwise weights of ``shape``, torch's convolution of them
    (float64), the conv's attributes and the description ``hw``."""
    rng = np.random.default_rng(seed)
    x = rng.standard_normal(shape)
    w = rng.standard_normal((shape[1], 1, 3, 3))
    return (x, w, _torch_ref(x, w, stride, pad, dil), _attrs(shape[1], shape, stride, pad, dil),
            load_config(hw))


@pytest.mark.parametrize("hw", HW)
@pytest.mark.parametrize("shape,stride,pad,dil", CASES)
def test_bands_replayed_in_numpy_are_the_convolution(hw, shape, stride, pad, dil):
    """Every block width the route plans, in groups of 1 and 2 channels: per batch entry,
    channel of its group and column block, the staged rows (zero outside the image) times
    the block's band (``b_groups``' slot of the group's bands), summed over the kernel rows,
    placed at the block's columns of the channel's rows (``c_groups``) and cropped to the
    output's width, is torch's depthwise convolution (float64, to rounding)."""
    nb, c, h, wd = shape
    x, w, ref, at, cfg = _case(hw, shape, stride, pad, dil, sum(shape))
    widths = banded_block_widths(cfg, at, w.shape, ref.shape)
    assert widths and max(widths) <= cfg.tensor_shape[2]
    for n in widths:
        for grp in (1, 2):
            geo = banded_geometry(cfg, at, shape, w.shape, ref.shape, "float16", n, grp)
            nblk, nd = len(geo.blocks), len(geo.deltas)
            flat_w = banded_weights(w, geo).reshape(-1)
            assert geo.shape.batch == nb * len(geo.firsts) and geo.shape.groups == grp * nblk
            assert geo.firsts[-1] + geo.g == c  # the last group ends at the last channel
            tiling = GemmTiling(geo.oh, geo.n, geo.window, 0.0)
            rows = geo.oh * geo.shape.acc_row
            out = np.full(ref.shape, np.nan)
            flat = x.reshape(nb * c, h, wd)
            for b in range(geo.shape.batch):
                plane0, w0 = geo.plane(b), geo.weight_offset(b)
                bands = flat_w[w0:w0 + geo.g * geo.channel_stride].reshape(
                    geo.g * nd, geo.kh, geo.window, geo.n)
                acc = np.full(geo.g * rows, np.nan)
                for p, (bg, cg) in enumerate(zip(geo.b_groups, geo.c_groups(tiling))):
                    i, j = divmod(p, nblk)
                    i0 = geo.blocks[j][1]
                    prod = np.zeros((geo.oh, geo.n))
                    for a in range(geo.kh):
                        r = np.arange(geo.oh) * geo.sh + a * geo.dh - geo.pt
                        ok = (r >= 0) & (r < h)
                        a_rows = np.zeros((geo.oh, geo.window))
                        a_rows[ok] = flat[plane0 + i, r[ok], i0:i0 + geo.window]
                        prod += a_rows @ bands[bg, a]
                    for r in range(geo.oh):
                        acc[cg + r * geo.shape.acc_row:cg + r * geo.shape.acc_row + geo.n] = \
                            prod[r]
                tile = acc.reshape(geo.g, geo.oh, geo.shape.acc_row)[:, :, :geo.ow]
                for i in range(geo.g):
                    out[(plane0 + i) // c, (plane0 + i) % c] = tile[i]
            np.testing.assert_allclose(out, ref, rtol=1e-12, atol=1e-12)


def test_bands_are_few_and_hold_the_weights():
    """One band per distinct window offset (first, interior, last block), not per block;
    each column of a band holds the kernel row's KW weights at stride ``sw``; the interior
    blocks' products read one slot of the B tile."""
    cfg = load_config("default")
    c, shape, out = 7, (1, 7, 56, 56), (1, 7, 56, 56)
    rng = np.random.default_rng(0)
    w = rng.standard_normal((c, 1, 3, 3))
    geo = banded_geometry(cfg, _attrs(c, shape, (1, 1), (1, 1), (1, 1)), shape, w.shape, out,
                          "float16", 14, 4)
    assert len(geo.blocks) == 4 and geo.window == 16 and len(geo.deltas) == 3
    assert geo.firsts == (0, 3) and geo.b_groups[:4] == (0, 1, 1, 2)
    bands = banded_weights(w, geo)
    assert bands.shape == (c, 3, 3, 16, 14)
    interior = bands[:, geo.band_of[1]]  # window starts one column left of the block
    for j in range(14):
        np.testing.assert_array_equal(interior[:, :, j:j + 3, j], w[:, 0])
        assert np.count_nonzero(interior[0, 0, :, j]) == 3


def test_block_widths_fill_the_k_passes():
    """Default (k = n = 16), 3 x 3: stride 1 plans 14 columns (a 16-column window: 48 = 3
    passes of K) among others, stride 2 plans 7 (15 columns: 45 in 3 passes); a narrow
    output plans its whole width."""
    cfg = load_config("default")
    s1 = banded_block_widths(cfg, _attrs(4, (1, 4, 56, 56), (1, 1), (1, 1), (1, 1)),
                             (4, 1, 3, 3), (1, 4, 56, 56))
    s2 = banded_block_widths(cfg, _attrs(4, (1, 4, 56, 56), (2, 2), (1, 1), (1, 1)),
                             (4, 1, 3, 3), (1, 4, 28, 28))
    assert 14 in s1 and max(s1) == 16 and 7 in s2
    assert banded_block_widths(cfg, _attrs(4, (1, 4, 4, 4), (1, 1), (1, 1), (1, 1)),
                               (4, 1, 3, 3), (1, 4, 4, 4))[-1] == 4


def _build(fn, shape, hw, dtype):
    return kiln.build(graph_module(fn, [shape], dtype), target=kiln.Target("npu", hw=hw))


@pytest.mark.parametrize("hw", HW)
@pytest.mark.parametrize("shape,stride,pad,dil", CASES)
def test_banded_on_the_simulator_fp16(hw, shape, stride, pad, dil):
    """Forced banded: one kernel, float16 operands with float32 accumulation (rel. error
    <= 1e-2 against float64 torch), every useful MAC counted on the tensor unit."""
    rng = np.random.default_rng(7 + sum(shape))
    c = shape[1]
    x = rng.standard_normal(shape).astype("float32")
    w = rng.standard_normal((c, 1, 3, 3)).astype("float32")
    with PassContext(config={DEPTHWISE_KEY: "banded"}):
        exe = _build(lambda v: op.nn.conv2d(v, g.const(w), strides=stride, padding=pad,
                                            dilation=dil, groups=c), shape, hw, "float32")
    ks = [k for k in exe.kernels if k.op == "nn.conv2d.depthwise"]
    assert exe.cpu_ops == [] and len(ks) == 1
    assert "banded" in ks[0].tiling and "on the tensor unit (banded)" in ks[0].tiling
    ref = _torch_ref(x, w, stride, pad, dil)
    out = exe(x)
    assert float(np.max(np.abs(out - ref)) / np.max(np.abs(ref))) <= 1e-2
    s = unit_shares(exe)
    assert s.tensor_macs == ref.size * 9 == ks[0].macs and s.vector_macs == 0


@pytest.mark.parametrize("hw", HW)
def test_banded_on_the_simulator_int8_is_exact(hw):
    """int8 x int8 -> int32 banded products: exact (odd width, stride 2, padding)."""
    rng = np.random.default_rng(5)
    c, shape = 6, (1, 6, 11, 13)
    x = rng.integers(-128, 128, shape, dtype=np.int8)
    w = rng.integers(-127, 128, (c, 1, 3, 3), dtype=np.int8)
    with PassContext(config={DEPTHWISE_KEY: "banded"}):
        exe = _build(lambda v: op.nn.conv2d(v, g.const(w), strides=(2, 2), padding=(1, 1),
                                            groups=c, out_dtype="int32"), shape, hw, "int8")
    assert exe.cpu_ops == []
    assert all("(banded)" in k.tiling for k in exe.kernels if k.op == "nn.conv2d.depthwise")
    ref = _torch_ref(x, w, (2, 2), (1, 1), (1, 1))
    np.testing.assert_array_equal(exe(x), ref.astype(np.int32))


def _replay_in_place(geo, flat_x, bands, tiling):
    """The in-place kernel replayed in numpy for one batch entry: the L0 A tile (the ``g``
    planes' staged rows, zero rows outside the image, ``row_px`` apart), each product's
    ``a_parts`` -- A rows ``a_row`` apart from its offset, ``k`` deep, times its band from
    the part's B offset -- summed into the product's output; the tile of ``g`` channels'
    rows, ``acc_row`` wide."""
    nbox = geo.shape.stage_rows(tiling.m_units)
    plane = nbox * geo.row_px
    tile_a = np.zeros(geo.g * plane)
    for i in range(geo.g):
        for r in range(nbox):
            y = r - geo.pt
            if 0 <= y < geo.h:
                tile_a[i * plane + r * geo.row_px:i * plane + r * geo.row_px + geo.w] = \
                    flat_x[i, y]
    rows = geo.oh * geo.shape.acc_row
    acc = np.full(geo.g * rows, np.nan)
    band_flat = bands.reshape(-1)
    for parts, bg, cg in zip(geo.a_parts(tiling), geo.b_groups, geo.c_groups(tiling)):
        prod = np.zeros((geo.oh, geo.n))
        for ao, bo, k in parts:
            a = np.stack([tile_a[ao + r * geo.a_row:ao + r * geo.a_row + k]
                          for r in range(geo.oh)])
            b = band_flat[bg * geo.band + bo:bg * geo.band + bo + k * geo.n].reshape(k, geo.n)
            prod += a @ b
        for r in range(geo.oh):
            acc[cg + r * geo.shape.acc_row:cg + r * geo.shape.acc_row + geo.n] = prod[r]
    return acc.reshape(geo.g, geo.oh, geo.shape.acc_row)[:, :, :geo.ow]


@pytest.mark.parametrize("hw", HW)
@pytest.mark.parametrize("shape,stride,pad,dil", CASES)
def test_in_place_parts_replayed_in_numpy_are_the_convolution(hw, shape, stride, pad, dil):
    """In place (every block width the form plans, groups of 1 and 3): the A tile the
    staging DMA writes to L0, read by each product's ``mma`` parts (one per kernel row, or
    one over the whole rows where a block is the image's width) at their offsets and rows
    ``a_row`` apart, times the parts' slices of the bands, placed by ``c_groups``, is
    torch's depthwise convolution; and the bands built from the compact rows -- the view
    ``R[i + d - j*sw - u_min]`` the on-chip DMAs copy -- are the bands, exactly."""
    nb, c, h, wd = shape
    x, w, ref, at, cfg = _case(hw, shape, stride, pad, dil, 3 + sum(shape))
    widths = banded_block_widths(cfg, at, w.shape, ref.shape, True, wd)
    assert widths and max(widths) <= cfg.tensor_shape[2]
    seen_whole = False
    for n in widths:
        for grp in (1, 3):
            geo = banded_geometry(cfg, at, shape, w.shape, ref.shape, "float16", n, grp,
                                  in_place=True, compact=True)
            assert geo.shape.stage_l0 and geo.shape.a_dmas == 1 and geo.row_px == wd
            seen_whole |= geo.whole_rows
            assert geo.shape.k_split == (1 if geo.whole_rows else geo.kh)
            bands = banded_weights(w, geo)
            rows = banded_rows(w, geo)
            # the on-chip build: band d's [a, i, j] = R[a, i + d - j*sw - u_min]
            i, j = np.meshgrid(np.arange(geo.window), np.arange(geo.n), indexing="ij")
            for di, d in enumerate(geo.deltas):
                np.testing.assert_array_equal(rows[:, :, i + d - j * geo.sw - geo.u_min],
                                              bands[:, di])
            tiling = GemmTiling(geo.oh, geo.n, geo.window, 0.0)
            out = np.full(ref.shape, np.nan)
            flat = x.reshape(nb * c, h, wd)
            for b in range(geo.shape.batch):
                plane0 = geo.plane(b)
                ch = geo.firsts[b % len(geo.firsts)]
                tile = _replay_in_place(geo, flat[plane0:plane0 + geo.g],
                                        bands[ch:ch + geo.g], tiling)
                for q in range(geo.g):
                    out[(plane0 + q) // c, (plane0 + q) % c] = tile[q]
            np.testing.assert_allclose(out, ref, rtol=1e-12, atol=1e-12)
    if shape == (1, 3, 16, 17):  # stride 2, 9 output columns: one block reads every column
        assert seen_whole


FORMS = [(False, False), (True, False), (True, True)]


@pytest.mark.parametrize("hw", HW)
@pytest.mark.parametrize("form", FORMS, ids=["gathered", "in_place", "compact"])
def test_each_banded_form_on_the_simulator(hw, form, monkeypatch):
    """Each form of the banded kernel forced (``ops.BANDED_FORMS``), float16 operands into
    float32 (rel. error <= 1e-2 against float64 torch) on shapes of several column blocks
    (three bands), one whole-row block and stride 2; int8 exact."""
    monkeypatch.setattr(ops, "BANDED_FORMS", (form,))
    rng = np.random.default_rng(11)
    for shape, stride, pad in (((1, 5, 9, 37), (1, 1), (1, 1)),
                               ((1, 6, 7, 7), (1, 1), (1, 1)),
                               ((1, 4, 12, 13), (2, 2), (1, 1))):
        c = shape[1]
        x = rng.standard_normal(shape).astype("float32")
        w = rng.standard_normal((c, 1, 3, 3)).astype("float32")
        with PassContext(config={DEPTHWISE_KEY: "banded"}):
            exe = _build(lambda v, w=w, stride=stride, pad=pad, c=c: op.nn.conv2d(
                v, g.const(w), strides=stride, padding=pad, groups=c), shape, hw, "float32")
        ks = [k for k in exe.kernels if k.op == "nn.conv2d.depthwise"]
        assert len(ks) == 1 and ("in place" in ks[0].tiling) == form[0]
        ref = _torch_ref(x, w, stride, pad, (1, 1))
        assert float(np.max(np.abs(exe(x) - ref)) / np.max(np.abs(ref))) <= 1e-2
    xi = rng.integers(-128, 128, (1, 6, 11, 13), dtype=np.int8)
    wi = rng.integers(-127, 128, (6, 1, 3, 3), dtype=np.int8)
    with PassContext(config={DEPTHWISE_KEY: "banded"}):
        exe = _build(lambda v: op.nn.conv2d(v, g.const(wi), strides=(2, 2), padding=(1, 1),
                                            groups=6, out_dtype="int32"), xi.shape, hw, "int8")
    np.testing.assert_array_equal(exe(xi), _torch_ref(xi, wi, (2, 2), (1, 1), (1, 1))
                                  .astype(np.int32))


EST_CASES = [  # (x shape, stride): MobileNetV2-like layers, small
    ((1, 32, 28, 28), 1), ((1, 64, 14, 14), 2), ((1, 96, 7, 7), 1), ((1, 192, 14, 14), 1)]


@pytest.mark.parametrize("shape,stride", EST_CASES)
def test_banded_estimate_is_within_15_percent_of_the_simulator(shape, stride):
    """Default description, the banded route forced: the route's estimate
    (``DepthwiseChoice.banded``, what ``auto`` weighs against the vector unit) is within
    15% of the simulated cycles of the kernel -- in the setting it models: the input an
    intermediate (a ReLU's result) and the output one (a ReLU reads it), both kept in L1 by
    residency; no epilogue fused (its vector work is not the product's) and no loads moved
    into the kernel before (``npu.prefetch`` off: the kernel's phase holds its own fill).
    (A 4 x 4 layer of 128 channels, one step a core, is 18% under: 498 against 606.)"""
    rng = np.random.default_rng(2)
    c = shape[1]
    x = rng.standard_normal(shape).astype("float32")
    w = rng.standard_normal((c, 1, 3, 3)).astype("float32")
    with PassContext(config={DEPTHWISE_KEY: "banded", FUSE_EPILOGUE_KEY: False,
                             PREFETCH_KEY: False}):
        exe = _build(lambda v: op.nn.relu(op.nn.conv2d(
            op.nn.relu(v), g.const(w), strides=(stride, stride), padding=(1, 1), groups=c)),
            shape, "default", "float32")
    exe(x)
    [k] = [k for k in exe.kernels if k.op == "nn.conv2d.depthwise"]
    sim = sum(r.phase_cycles().get(k.label, 0.0) for r in exe.last_reports)
    est = float(re.search(r"banded (\d+)", k.tiling.split("est. cycles")[-1]).group(1))
    assert abs(est - sim) <= 0.15 * sim, (est, sim, k.tiling)
