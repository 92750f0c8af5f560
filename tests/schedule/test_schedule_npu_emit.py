"""The NPU kernel builder's pieces: split stores cover their block exactly (and are not split
below the kernel's loads), a GEMM whose operand tile stays the same on a core's steps loads it
once per slot, the output tiles left over after a round per core are split evenly over the
cores, and the last tile is stored in pieces as it is multiplied -- all with the same bits."""

import math
import re

import numpy as np
import pytest

import kiln
from kiln import graph as g
from kiln import op
from kiln.codegen.npu import build_npu
from kiln.schedule.npu import gemm as npu_gemm
from kiln.schedule.npu import ops as npu_ops
from kiln.schedule.npu import tir_conv as npu_tir_conv
from kiln.schedule.npu import tir_gemm as npu_tir_gemm
from kiln.schedule.npu.emit import MEM_ID, block, itemsize, store_piece_bytes, store_pieces
from kiln.schedule.npu.gemm import (
    GemmShape,
    GemmTiling,
    feasible_tilings,
    gemm_bounds,
    gemm_cost,
    output_tiles,
    plan_gemm,
    prefetch_staging,
)
from kiln.target.npu import load_config
from kiln.testing.npu_descriptions import edited_description
from kiln.testing.op_testing import graph_module

HW = ["default", "edge"]


def _addresses(shape, blk):
    """Byte address of every element of a 3-D block, in iteration order."""
    isz = itemsize(blk.dtype)
    idx = np.indices(shape).reshape(3, -1).T
    return blk.addr + (idx @ np.array(blk.strides)) * isz


@pytest.mark.parametrize("hw", HW)
@pytest.mark.parametrize("shape,dst_strides,src_strides", [
    ((1, 64, 392), (0, 3136, 1), (0, 1, 64)),      # a conv's output tile: channels x pixels
    ((1, 300, 200), (0, 512, 1), (0, 200, 1)),     # a dense tile: rows x columns
    ((3, 5, 7000), (40000, 7000, 1), (35000, 7000, 1)),  # rows longer than a piece
    ((2, 3, 4), (12, 4, 1), (12, 4, 1)),           # small: one piece
])
def test_store_pieces_cover_the_block_once_and_stay_small(hw, shape, dst_strides, src_strides):
    cfg = load_config(hw)
    dst = block("dram", 4096, "float32", dst_strides)
    src = block("acc", 128, "float32", src_strides)
    pieces = store_pieces(cfg, shape, dst, src)
    limit = store_piece_bytes(cfg)
    pairs = set()
    for shp, d, s in pieces:
        nbytes = int(np.prod(shp)) * 4
        assert nbytes <= max(limit, shp[-1] * 4)
        pairs |= set(zip(_addresses(shp, d).tolist(), _addresses(shp, s).tolist()))
    whole = set(zip(_addresses(shape, dst).tolist(), _addresses(shape, src).tolist()))
    assert pairs == whole
    assert sum(int(np.prod(p[0])) for p in pieces) == int(np.prod(shape))
    assert len(pieces) == 1 or int(np.prod(shape)) * 4 > limit


def _loads_into(exe, mem):
    n = 0
    for step in exe.steps:
        for stream in getattr(getattr(step, "program", None), "streams", []):
            n += sum(i.op == "dma.load" and i.args["dst"].mem == MEM_ID[mem] for i in stream)
    return n


def _bytes_into(exe, mem):
    n = 0
    for step in exe.steps:
        for stream in getattr(getattr(step, "program", None), "streams", []):
            n += sum(int(np.prod(i.args["shape"])) * itemsize(i.args["dst"].dtype)
                     for i in stream
                     if i.op == "dma.load" and i.args["dst"].mem == MEM_ID[mem])
    return n


@pytest.mark.parametrize("hw", HW)
def test_a_weight_tile_that_stays_is_loaded_once_per_slot(hw):
    """dense with many rows and a small weight: the output tiles multiply the same one or two
    B tiles, which each core's two slots keep, so every core loads the weight once instead
    of once per step."""
    rng = np.random.default_rng(3)
    w = rng.standard_normal((24, 40)).astype("float32")
    x = rng.standard_normal((4000, 40)).astype("float32")
    exe = build_npu(graph_module(lambda v: op.dense(v, g.const(w)), [x.shape]),
                    kiln.Target("npu", hw=hw))
    got = exe(x)
    ref = x.astype(np.float64) @ w.T.astype(np.float64)
    assert float(np.max(np.abs(got - ref)) / np.max(np.abs(ref))) <= 1e-2
    cfg = load_config(hw)
    gemm = [k for k in exe.kernels if k.op == "dense"][0]
    assert "x K40 of" in gemm.tiling  # one K step: the B tiles can stay
    assert _loads_into(exe, "weight") <= 2 * cfg.cores
    assert _bytes_into(exe, "weight") <= cfg.cores * w.size * 2  # float16, once per core
    assert _loads_into(exe, "input") > 2 * cfg.cores  # A tiles still stream


def _conv_shape(c, h, o, kh, stride, line=32):
    """The GemmShape of a square ``kh x kh`` convolution (padding ``kh // 2``) of a
    ``c x h x h`` float16 image, as the lowering builds it (L1 bank lines of ``line``
    bytes)."""
    pad = kh // 2
    oh = (h + 2 * pad - kh) // stride + 1
    width = pad + h + max(0, (oh - 1) * stride + kh - pad - h)
    return GemmShape(1, oh, oh, o, c, kh * kh, "float16", a_dmas=kh * kh, a_dmas_row=kh,
                     a_elems=c * h * h, stage_stride=stride, stage_halo=kh, stage_row=h,
                     stage_width=width, stage_pad=line, acc_padded=True)


@pytest.mark.parametrize("shape,tiling,cores_work", [
    # 7 tiles of 4 output rows on 2 cores: the 7th split into 2 + 2 rows (keeps B)
    (_conv_shape(64, 56, 128, 3, 2), GemmTiling(4, 128, 32, 0), 4 * 128 * 3 + 2 * 128),
    # 1 row of M, 5 column tiles of 32: the 5th split into 16 + 16 columns (keeps A)
    (GemmShape(1, 8, 1, 160, 64, 1, "float16"), GemmTiling(8, 32, 64, 0), 8 * 32 * 2 + 8 * 16),
])
def test_leftover_tiles_are_split_evenly_over_the_cores(shape, tiling, cores_work):
    cfg = load_config("default")
    tiles = output_tiles(cfg, shape, tiling, 2)
    covered = np.zeros((shape.batch, shape.m_units, shape.n), int)
    work = [0] * cfg.cores
    for j, (b, m0, mus, n0, nts) in enumerate(tiles):
        covered[b, m0:m0 + mus, n0:n0 + nts] += 1
        work[j % cfg.cores] += mus * nts
    assert (covered == 1).all()  # every output element once
    assert work == [cores_work] * cfg.cores
    # a tiling the planner chose not to balance keeps its tiles whole
    whole = output_tiles(cfg, shape, GemmTiling(tiling.m_units, tiling.n, tiling.k_units, 0,
                                                 balance=False), 2)
    assert len(whole) == len(tiles) - 1
    assert all(t[2] == min(tiling.m_units, shape.m_units - t[1]) for t in whole)


def _forced(monkeypatch, tiling):
    """Both lowering routes plan ``tiling`` (the products' and convolutions' default route is
    TIR's)."""
    monkeypatch.setattr(npu_ops, "plan_gemm",
                        lambda cfg, shape, nbuf, hold=True, context="": tiling)
    for module in (npu_ops, npu_tir_gemm, npu_tir_conv):  # the routes with feedback
        monkeypatch.setattr(module, "plan_candidates",
                            lambda cfg, shape, nbuf, hold=True, context="": [tiling])


def test_a_split_leftover_tile_gives_the_same_bits(monkeypatch):
    """The same K steps in the same order: splitting the 7th output tile of a strided 3x3
    convolution over the 2 cores changes no bit of the result (vs 4 tiles of 7 rows), and
    both equal numpy's to float16 accuracy."""
    rng = np.random.default_rng(5)
    w = (rng.standard_normal((32, 16, 3, 3)) * 0.2).astype("float32")
    x = rng.standard_normal((1, 16, 56, 56)).astype("float32")
    mod = graph_module(lambda v: op.nn.conv2d(v, g.const(w), strides=(2, 2),
                                              padding=(1, 1, 1, 1)), [x.shape])
    outs = []
    for mu in (4, 7):
        _forced(monkeypatch, GemmTiling(mu, 32, 16, 0))
        exe = build_npu(mod, kiln.Target("npu", hw="default"))
        assert f"tile M{mu * 28} x N32 x K144" in exe.kernels[-1].tiling
        outs.append(exe(x))
    assert np.array_equal(outs[0], outs[1])
    xp = np.pad(x.astype(np.float64), ((0, 0), (0, 0), (1, 1), (1, 1)))
    ref = sum(np.einsum("nchw,oc->nohw", xp[:, :, a:a + 55:2, b:b + 55:2], w[:, :, a, b])
              for a in range(3) for b in range(3))
    assert float(np.max(np.abs(outs[0] - ref)) / np.max(np.abs(ref))) <= 1e-2


def _stream_ops(exe, core=0):
    prog = [s.program for s in exe.steps if getattr(s, "program", None)][-1]
    return [i for i in prog.streams[core] if i.op != "barrier"]


@pytest.mark.parametrize("hw", HW)
def test_the_last_tile_is_stored_in_pieces_while_it_is_multiplied(hw):
    """One output tile per core: its product runs in pieces of M and each piece's store is
    issued before the next piece's product, so the kernel ends with one piece's store."""
    rng = np.random.default_rng(6)
    w = rng.standard_normal((16, 32)).astype("float32")
    x = rng.standard_normal((64, 32)).astype("float32")
    exe = build_npu(graph_module(lambda v: op.dense(v, g.const(w)), [x.shape]),
                    kiln.Target("npu", hw=hw))
    got = exe(x)  # the simulator checks every token: a store before its product is a hazard
    ref = x.astype(np.float64) @ w.T.astype(np.float64)
    assert float(np.max(np.abs(got - ref)) / np.max(np.abs(ref))) <= 1e-2
    ops = [i.op for i in _stream_ops(exe) if i.op in ("mma", "mma.set", "dma.store")]
    last_mma = max(i for i, o in enumerate(ops) if o.startswith("mma"))
    assert "dma.store" in ops[:last_mma]  # an earlier piece is stored before the last product
    assert ops[:last_mma].count("mma.set") + ops[:last_mma].count("mma") >= 1


def test_stores_are_not_split_below_the_kernels_loads():
    """edge, attention's P @ V shape: a 16 KB store split into 1.6 KB pieces waited behind
    each 16 KB load on the channel (first come, first served) and kept the accumulator slot
    busy (81.7 -> 69.8% of the roofline); pieces are at least the kernel's largest load."""
    rng = np.random.default_rng(7)
    p = rng.standard_normal((12, 128, 128)).astype("float32")
    v = rng.standard_normal((12, 128, 64)).astype("float32")
    exe = build_npu(graph_module(lambda a, b: op.matmul(a, b), [p.shape, v.shape]),
                    kiln.Target("npu", hw="edge"))
    got = exe(p, v)
    ref = np.matmul(p.astype(np.float64), v.astype(np.float64))
    assert float(np.max(np.abs(got - ref)) / np.max(np.abs(ref))) <= 1e-2
    ins = _stream_ops(exe)
    nbytes = [int(np.prod(i.args["shape"])) * itemsize(i.args["src"].dtype) for i in ins
              if i.op in ("dma.load", "dma.store") and i.args["src"].mem == MEM_ID["dram"]]
    stores = [int(np.prod(i.args["shape"])) * 4 for i in ins if i.op == "dma.store"]
    gemm = [k for k in exe.kernels if k.op == "matmul"][0]
    mt, nt = (int(v) for v in re.search(r"tile M(\d+) x N(\d+)", gemm.tiling).groups())
    tiles = 12 * -(-128 // mt) * -(-64 // nt)
    assert len(stores) >= tiles
    # every output tile but the kernel's last (stored in pieces as it is multiplied) is
    # stored whole, or in pieces no smaller than the largest load
    assert sum(s >= min(max(nbytes), mt * nt * 4) for s in stores) >= tiles - 1


def test_a_held_operand_is_not_split(monkeypatch):
    """One M tile held on each core (one copy per K step, never double-buffered) and 3 column
    tiles too narrow to halve: splitting the leftover along M would reload the held A slot
    while the other tiles' products still read it (a hazard the simulator reports), so the
    leftover stays whole."""
    cfg = load_config("default")
    shape = GemmShape(1, 64, 1, 48, 32, 1, "float16")
    tiling = GemmTiling(64, 16, 32, 0)
    assert len(output_tiles(cfg, shape, tiling, 2)) == 3
    rng = np.random.default_rng(8)
    w = rng.standard_normal((48, 32)).astype("float32")
    x = rng.standard_normal((64, 32)).astype("float32")
    _forced(monkeypatch, tiling)
    exe = build_npu(graph_module(lambda v: op.dense(v, g.const(w)), [x.shape]),
                    kiln.Target("npu", hw="default"))
    got = exe(x)
    ref = x.astype(np.float64) @ w.T.astype(np.float64)
    assert float(np.max(np.abs(got - ref)) / np.max(np.abs(ref))) <= 1e-2


def _conv_numpy(x, w, stride, pad):
    """float64 NCHW convolution (square stride and padding)."""
    kh, kw = w.shape[2:]
    xp = np.pad(x.astype(np.float64), ((0, 0), (0, 0), (pad, pad), (pad, pad)))
    oh = (xp.shape[2] - kh) // stride + 1
    ow = (xp.shape[3] - kw) // stride + 1
    return sum(np.einsum("nchw,oc->nohw", xp[:, :, a:a + (oh - 1) * stride + 1:stride,
                                            b:b + (ow - 1) * stride + 1:stride], w[:, :, a, b])
               for a in range(kh) for b in range(kw))


def _gathers(exe):
    """The conv kernel's L1 -> L0 input DMAs (the tap gathers) on core 0."""
    return [i for i in _stream_ops(exe) if i.op == "dma.load" and
            i.args["src"].mem == MEM_ID["l1"] and i.args["dst"].mem == MEM_ID["input"]]


@pytest.mark.parametrize("hw", HW)
@pytest.mark.parametrize("c,h,o,k,s,p", [
    (16, 28, 24, 3, 1, 1),   # 3x3: a tile of fewer rows than 3 gathers per (row, kernel row)
    (3, 30, 16, 7, 2, 3),    # a stem: one channel per K step, 7 taps per gather
    (8, 9, 8, 1, 1, 2),      # 1x1 with padding 2: the first and last rows only padding
])
def test_conv_staged_rows_carry_their_padding_and_gathers_read_channel_runs(hw, c, h, o, k,
                                                                            s, p):
    """The staged rows hold the window's padding, channels innermost: every gather reads
    contiguous channel runs (inner stride 1 -- no bank conflicts) and fills nothing, and a
    tile of one output row takes one gather per kernel row, not one per tap."""
    rng = np.random.default_rng(c + h + k)
    w = rng.standard_normal((o, c, k, k)).astype("float32")
    x = rng.standard_normal((1, c, h, h)).astype("float32")
    exe = build_npu(graph_module(lambda v: op.nn.conv2d(v, g.const(w), strides=(s, s),
                                                        padding=(p, p)), [x.shape]),
                    kiln.Target("npu", hw=hw))
    got = exe(x)  # the simulator checks every token and every access
    ref = _conv_numpy(x, w, s, p)
    assert float(np.max(np.abs(got - ref)) / np.max(np.abs(ref))) <= 1e-2
    gathers = _gathers(exe)
    assert gathers and all(i.args["src"].strides[2] == 1 for i in gathers)
    assert all(not any(i.args["pad_lo"]) and not any(i.args["pad_hi"]) for i in gathers)
    ow = (h + 2 * p - k) // s + 1
    rows = int(exe.kernels[-1].tiling.split(" x ")[0].split("M")[1]) // ow
    # (pixels, KW taps, channels) per row and kernel row, or (rows, pixels, channels) per tap
    assert all(tuple(i.args["shape"][:2]) == (ow, k) for i in gathers) if rows < k else \
        all(i.args["shape"][1] == ow for i in gathers)


@pytest.mark.parametrize("hw", HW)
@pytest.mark.parametrize("double_buffer", [True, False])
def test_staging_a_step_ahead_gives_the_same_bits(monkeypatch, hw, double_buffer):
    """Staging each step's rows during the step before (prefetch_staging) only moves DMAs:
    the same products in the same order, the same bits -- and with one slot it is never
    done (the one L1 slot is still being gathered from)."""
    rng = np.random.default_rng(11)
    w = rng.standard_normal((32, 16, 3, 3)).astype("float32")
    x = rng.standard_normal((1, 16, 20, 20)).astype("float32")
    mod = graph_module(lambda v: op.nn.conv2d(v, g.const(w), padding=(1, 1)), [x.shape])
    _forced(monkeypatch, GemmTiling(4, 32, 8, 0))  # several steps a core
    outs, streams = [], []
    for on in (False, True):
        monkeypatch.setattr(npu_gemm, "prefetch_staging", lambda *a, on=on: on)
        exe = build_npu(mod, kiln.Target("npu", hw=hw), double_buffer=double_buffer)
        outs.append(exe(x))  # the simulator checks every token and every access
        streams.append(_stream_ops(exe))
    assert np.array_equal(outs[0], outs[1])
    staged = [sum(i.op == "dma.load" and i.args["dst"].mem == MEM_ID["l1"] for i in st)
              for st in streams]
    same = [(i.op, str(i.args)) for i in streams[0]] == [(i.op, str(i.args)) for i in streams[1]]
    assert same != double_buffer
    assert staged[0] == staged[1]  # the same rows staged, earlier
    ref = _conv_numpy(x, w, 1, 1)
    assert float(np.max(np.abs(outs[0] - ref)) / np.max(np.abs(ref))) <= 1e-2


def test_prefetch_staging_is_the_cost_models_choice():
    """emit_gemm stages ahead exactly when gemm_cost says it is cheaper: edge's stage-1 3x3
    conv (hundreds of DMA-bound steps: the hidden latencies win), not default's stage-3
    3x3/s2 (4 steps a core: the later start loses)."""
    edge, default = load_config("edge"), load_config("default")
    l1 = _conv_shape(64, 56, 64, 3, 1)
    l3 = _conv_shape(128, 28, 256, 3, 2)
    for cfg, shape, expect in ((edge, l1, True), (default, l3, False)):
        tiling = plan_gemm(cfg, shape, 2)
        args = (cfg, shape, tiling.m_units, tiling.n, tiling.k_units, 2)
        on = gemm_cost(*args, balance=tiling.balance, prefetch=True)
        off = gemm_cost(*args, balance=tiling.balance, prefetch=False)
        assert prefetch_staging(cfg, shape, tiling, 2) == (on < off) == expect
        assert tiling.estimate == pytest.approx(min(on, off))
        assert not prefetch_staging(cfg, shape, tiling, 1)


@pytest.mark.parametrize("hw", HW)
def test_kernel_info_says_which_side_of_the_roofline_binds(hw):
    """A matrix-vector product (every weight read once for one row) is DMA-bound; a
    1024 x 512 x 512 product is bound by the tensor unit; the roofline is the larger side.
    (Every tensor in DRAM: the activation's cast kept in L1 would leave the DRAM side.)"""
    cfg = load_config(hw)
    for m, dram_bound in ((1, True), (1024, False)):
        w = np.ones((512, 512), "float32")
        exe = build_npu(graph_module(lambda v, w=w: op.dense(v, g.const(w)), [(m, 512)]),
                        kiln.Target("npu", hw=hw), residency=False)
        k = [k for k in exe.kernels if k.op == "dense"][0]
        tensor, traffic = gemm_bounds(cfg, GemmShape(1, m, 1, 512, 512, 1, "float16"))
        assert k.dram_bound is dram_bound is (traffic > tensor)
        assert (k.roofline, k.compute, k.traffic) == (max(tensor, traffic), tensor, traffic)
        assert k.overlap_gain == pytest.approx((tensor + traffic) / max(tensor, traffic))


@pytest.mark.parametrize("hw", HW)
@pytest.mark.parametrize("nbuf", [1, 2, 3])
@pytest.mark.parametrize("shape,tiling", [
    (GemmShape(12, 128, 1, 64, 128, 1, "float16", b_shared=False), GemmTiling(32, 64, 128, 0)),
    (GemmShape(12, 128, 1, 128, 64, 1, "float16", b_shared=False), GemmTiling(16, 128, 64, 0)),
    (GemmShape(1, 64, 1, 196, 384, 1, "float16", b_shared=False, a_shared=True),
     GemmTiling(32, 16, 192, 0)),
    (GemmShape(3, 40, 1, 48, 96, 1, "float16", a_shared=True, b_shared=False),
     GemmTiling(8, 16, 32, 0)),
    (GemmShape(1, 100, 1, 24, 40, 1, "float16"), GemmTiling(25, 12, 40, 0)),
    (GemmShape(2, 9, 1, 70, 30, 1, "int8"), GemmTiling(3, 16, 10, 0)),
])
def test_the_cost_model_counts_the_loads_the_slots_save(hw, nbuf, shape, tiling):
    """The slots of an operand are an LRU cache of the core's tiles (core_step_slots): a tile
    one holds is not loaded again, a new one never lands in a slot a step that may still
    run reads; gemm_cost's count (held_loads, on the busiest core) is what is emitted."""
    cfg = load_config(hw)
    # the tiles whole (gemm_cost counts a leftover tile's pieces on top of this count)
    tiling = GemmTiling(tiling.m_units, tiling.n, tiling.k_units, 0, balance=False)
    tiles = output_tiles(cfg, shape, tiling, nbuf)
    steps = npu_gemm.core_step_slots(cfg, shape, tiling, tiles, nbuf)
    nm, nn, nk = (-(-shape.m_units // tiling.m_units), -(-shape.n // tiling.n),
                  -(-shape.k_units // tiling.k_units))
    a_fixed, b_fixed = npu_gemm.fixed_tiles(cfg, shape, nm, nn, nk, nbuf)
    for st in steps:
        for i, s in enumerate(st):  # no slot overwritten while the last nbuf-1 steps read it
            before = st[max(0, i - nbuf + 1):i]
            if s.load_a and not a_fixed:
                assert all(p.a_slot != s.a_slot for p in before)
            if s.load_b and not b_fixed:
                assert all(p.b_slot != s.b_slot for p in before)
    want = npu_gemm.held_loads(cfg, shape, nm, nn, nk, nbuf)
    got = (sum(s.load_a for s in steps[0]), sum(s.load_b for s in steps[0]))
    if not a_fixed:
        assert got[0] == want[0]
    if not b_fixed:
        assert got[1] == want[1]


def test_a_tile_two_consecutive_steps_use_is_loaded_once():
    """edge, attention's P @ V (V: 128 x 64 per head): the two M tiles of a head read the
    same V tile, which stays in its slot -- V moves once (it was loaded for each M tile,
    alternating slots: 74501 -> 65038 cycles), the same bits. (The operands' float16 casts
    kept in DRAM: L1 residency would move them on chip and out of the count.)"""
    rng = np.random.default_rng(7)
    p = rng.standard_normal((12, 128, 128)).astype("float32")
    v = rng.standard_normal((12, 128, 64)).astype("float32")
    mod = graph_module(lambda a, b: op.matmul(a, b), [p.shape, v.shape])
    # without the prefetch: a first tile loaded during the cast kernel before counts there
    exe = build_npu(mod, kiln.Target("npu", hw="edge"), residency=False, prefetch=False)
    got = exe(p, v)
    ref = np.matmul(p.astype(np.float64), v.astype(np.float64))
    assert float(np.max(np.abs(got - ref)) / np.max(np.abs(ref))) <= 1e-2
    assert _bytes_into(exe, "weight") == v.size * 2  # float16, once
    kernel = [k for k in exe.kernels if k.op == "matmul"][0]
    moved = exe.last_reports[0].phase_bytes[kernel.label]
    assert moved == (p.size * 2 + v.size * 2 + p.shape[0] * 128 * 64 * 4)  # the minimum


@pytest.mark.parametrize("hw", HW)
def test_a_conv_tail_in_pieces_of_n_gives_the_same_bits(monkeypatch, hw):
    """One output tile per core, wide enough: its last K step runs in pieces of N (whole
    NCHW channel runs per store), each stored as it is done -- the same products in the
    same order as without pieces, the same bits."""
    rng = np.random.default_rng(12)
    w = rng.standard_normal((64, 16, 3, 3)).astype("float32")
    x = rng.standard_normal((1, 16, 8, 8)).astype("float32")
    mod = graph_module(lambda v: op.nn.conv2d(v, g.const(w), padding=(1, 1)), [x.shape])
    cfg = load_config(hw)
    _forced(monkeypatch, GemmTiling(8 // cfg.cores, 64, 8, 0))  # one tile a core
    outs, pieces = [], []
    for split in (True, False):
        if not split:
            monkeypatch.setattr(npu_gemm, "tail_pieces",
                                lambda cfg, shape, mus, nts: [(0, mus, 0, nts)])
        exe = build_npu(mod, kiln.Target("npu", hw=hw))
        outs.append(exe(x))  # the simulator checks every token and every access
        pieces.append([tuple(i.args["shape"]) for i in _stream_ops(exe)
                       if i.op in ("mma", "mma.set")])
    assert np.array_equal(outs[0], outs[1])
    assert float(np.max(np.abs(outs[0] - _conv_numpy(x, w, 1, 1))) /
                 np.max(np.abs(_conv_numpy(x, w, 1, 1)))) <= 1e-2
    tn = cfg.tensor_shape[2]
    assert {s[2] for s in pieces[0][-min(8, 64 // tn):]} == {64 // min(8, 64 // tn)}
    assert all(s[2] == 64 for s in pieces[1])


def test_tail_pieces_alternate_the_halves_of_the_tile():
    """The last tile's pieces in the order 0, 2, 1, 3 (each pair of consecutive pieces on
    both sides of the tile's middle, which the bank placement puts on a group boundary):
    every row (column) of the tile in exactly one piece."""
    cfg = load_config("default")
    shape = GemmShape(1, 256, 1, 64, 64, 1, "float16")
    pieces = npu_gemm.tail_pieces(cfg, shape, 64, 64)
    assert [p[0] for p in pieces] == [0, 32, 16, 48] and {p[1] for p in pieces} == {16}
    assert sorted(r for p in pieces for r in range(p[0], p[0] + p[1])) == list(range(64))
    three = npu_gemm.tail_pieces(cfg, shape, 48, 64)
    assert [p[0] for p in three] == [0, 32, 16]


@pytest.mark.parametrize("route", ["tir", "emit"])
def test_dense_tail_pieces_with_a_fused_epilogue(monkeypatch, route):
    """One output tile per core, its last K step in three pieces of rows, each through the
    fused epilogue and stored as it is done, in the alternating order (0, 2, 1): the
    simulator checks every token and access (the TIR generator's window of the last piece
    assumed it ended the tile: piece 2 was stored twice, a hazard), the same bits as one
    piece, close to numpy."""
    rng = np.random.default_rng(17)
    w = (rng.standard_normal((64, 96)) * 0.2).astype("float32")
    bias = rng.standard_normal(64).astype("float32")
    x = rng.standard_normal((96, 96)).astype("float32")
    mod = graph_module(lambda v: op.nn.relu(op.add(op.dense(v, g.const(w)), g.const(bias))),
                       [x.shape])
    _forced(monkeypatch, GemmTiling(48, 64, 96, 0))  # M48 x N64 x K96: one tile a core
    outs = []
    for split in (True, False):
        if not split:
            monkeypatch.setattr(npu_gemm, "tail_pieces",
                                lambda cfg, shape, mus, nts: [(0, mus, 0, nts)])
        with kiln.transform.PassContext(config={"npu.lowering": route}):
            exe = build_npu(mod, kiln.Target("npu", hw="default"))
        assert exe.kernels[-1].label.endswith("+add+relu"), exe.kernels[-1].label
        outs.append(exe(x))
        if split:
            rows = [i.args["shape"][1] for i in _stream_ops(exe)
                    if i.op in ("mma", "mma.set")][-3:]
            assert rows == [16] * 3
    assert np.array_equal(outs[0], outs[1])
    ref = np.maximum(x.astype(np.float64) @ w.T + bias, 0)
    assert float(np.max(np.abs(outs[0] - ref))) <= 1e-2 * float(np.max(np.abs(ref)))


def test_a_single_large_tile_leaves_its_epilogue_room():
    """edge (48 KiB of accumulators), dense 84 x 255 -> 84: one M84 x N84 tile (28 KiB of
    float32, too large for two slots) on a core; the fused epilogue's buffers go above the
    one slot it uses -- counted as two, they found no room and the product ran unfused (a
    case hypothesis found in test_random_fused_kernels_match_numpy)."""
    rng = np.random.default_rng(0)
    w = (rng.standard_normal((84, 255)) * 0.1).astype("float32")
    bias = rng.standard_normal(84).astype("float32")
    x = rng.standard_normal((84, 255)).astype("float32")
    mod = graph_module(lambda v: op.clip(op.nn.relu(op.add(op.dense(v, g.const(w)),
                                                           g.const(bias))), min=0.0, max=2.0),
                       [x.shape])
    exe = build_npu(mod, kiln.Target("npu", hw="edge"))
    assert [k.op for k in exe.kernels][-1] in ("dense", "matmul")
    assert exe.kernels[-1].label.endswith("+add+relu+clip")
    ref = np.clip(x.astype(np.float64) @ w.T + bias, 0, 2)
    assert float(np.max(np.abs(exe(x) - ref))) <= 1e-2 * max(1.0, float(np.max(np.abs(ref))))


def test_one_output_tile_per_core_takes_one_accumulator_slot(monkeypatch):
    """edge (48 KB of accumulators): a 64 x 128 float32 tile (32 KB) fits once, not twice;
    a core with that one tile is feasible and computes the product exactly as two tiles of
    N64 do (the same K steps, the same bits)."""
    cfg = load_config("edge")
    shape = GemmShape(1, 64, 1, 128, 64, 1, "float16")
    tilings = feasible_tilings(cfg, shape, 2)
    assert any(t.m_units == 64 and t.n == 128 for t in tilings)
    assert all(t.m_units * t.n * 4 * 2 <= cfg.memory("acc").size for t in tilings
               if -(-64 // t.m_units) * -(-128 // t.n) > 1)
    assert not any(t.m_units == 64 and t.n == 128 for t in feasible_tilings(cfg, shape, 2,
                                                                               hold=False))
    rng = np.random.default_rng(13)
    w = rng.standard_normal((128, 64)).astype("float32")
    x = rng.standard_normal((64, 64)).astype("float32")
    mod = graph_module(lambda v: op.dense(v, g.const(w)), [x.shape])
    outs = []
    for nt in (128, 64):
        _forced(monkeypatch, GemmTiling(64, nt, 64, 0))
        exe = build_npu(mod, kiln.Target("npu", hw="edge"))
        assert f"tile M64 x N{nt} x K64" in [k for k in exe.kernels if k.op == "dense"][0].tiling
        outs.append(exe(x))
    assert np.array_equal(outs[0], outs[1])
    ref = x.astype(np.float64) @ w.T.astype(np.float64)
    assert float(np.max(np.abs(outs[0] - ref)) / np.max(np.abs(ref))) <= 1e-2


def test_the_cost_model_counts_the_busiest_cores_own_tiles(tmp_path, monkeypatch):
    """gemm_cost's tensor unit is the busiest core's own tiles, not the average share: M896
    in tiles of 256 rows is 3.5 tiles, dealt round-robin, so core 0 multiplies two whole
    ones (4096 cycles) where tiles of 224 give each core 3584. On "default" with a DRAM
    channel fast enough that the tensor unit binds, the planner ranks the tiles of 224
    first, as the simulator times them (it ranked them alike before), and both tilings
    compute the product."""
    path, cfg = edited_description(tmp_path, "default-fast-dram", (
        r'(^\[dram\].*?^bandwidth\s*=\s*)\d+', r'\g<1>4096'))
    assert cfg.memory("dram").bandwidth == 4096
    shape = GemmShape(1, 896, 1, 128, 128, 1, "float16")
    whole, even = GemmTiling(256, 128, 128, 0, False), GemmTiling(224, 128, 128, 0, False)
    est = {t: gemm_cost(cfg, shape, t.m_units, t.n, t.k_units, 2, balance=False)
           for t in (whole, even)}
    assert est[whole] - est[even] >= 512  # core 0's second whole tile against 224 rows
    rng = np.random.default_rng(5)
    x = rng.standard_normal((896, 128)).astype("float32")
    w = rng.standard_normal((128, 128)).astype("float32")
    mod = graph_module(lambda v: op.dense(v, g.const(w)), [x.shape])
    cycles = {}
    for t in (whole, even):
        _forced(monkeypatch, t)
        exe = build_npu(mod, kiln.Target("npu", hw=str(path)))
        out = exe(x)
        k = next(k for k in exe.kernels if k.op == "dense")
        assert f"tile M{t.m_units} x N128 x K128" in k.tiling
        ref = x.astype(np.float64) @ w.T.astype(np.float64)
        assert float(np.max(np.abs(out - ref)) / np.max(np.abs(ref))) <= 1e-2
        cycles[t] = exe.last_reports[0].phase_cycles()[k.label]
    assert cycles[even] < cycles[whole]


@pytest.mark.parametrize("hw", HW)
def test_vector_kernels_bound_is_the_larger_of_vector_work_and_traffic(hw):
    """An element-wise kernel's record gets the vector unit's side of its bound
    (``KernelBuilder.with_vector_side``): its steps at the description's throughput for its
    elements, shared by the cores -- GELU (``x / sqrt 2``, ``erf`` at its ``[vector.cost]``,
    ``+ 1``, ``* x``, ``* 0.5``), three ``erf`` in a row (the vector unit binds) and one
    ``add`` (the traffic binds); the bound is the larger side and below the simulated
    cycles; numpy checks the values."""
    cfg = load_config(hw)
    rng = np.random.default_rng(9)
    shape = (64, 1024)
    x = rng.standard_normal(shape).astype("float32")
    erf = np.vectorize(math.erf)

    def gelu(v):
        e = op.erf(op.divide(v, g.const(np.float32(np.sqrt(2.0)))))
        return op.multiply(op.multiply(v, op.add(e, g.const(np.float32(1.0)))),
                           g.const(np.float32(0.5)))

    c = cfg.vector_cost
    # (the GELU chain reads x twice: for erf's argument and for the product with it)
    cases = [(gelu, [c["default"], c["erf"]] + [c["default"]] * 3, 3,
              0.5 * x * (1 + erf(x.astype(np.float64) / np.sqrt(2.0)))),
             (lambda v: op.erf(op.erf(op.erf(v))), [c["erf"]] * 3, 2, erf(erf(erf(x)))),
             (lambda v: op.add(v, g.const(np.float32(1.0))), [c["default"]], 2, x + 1)]
    sides = []
    for fn, costs, moved, want in cases:
        exe = kiln.build(graph_module(fn, [shape], "float32"), target=kiln.Target("npu", hw=hw))
        np.testing.assert_allclose(exe(x), want, rtol=1e-5, atol=1e-5)
        (k,) = exe.kernels
        work = x.size * 4 / cfg.vector_width * sum(costs) / cfg.cores
        assert k.compute == pytest.approx(work, rel=0.02)
        assert k.traffic == pytest.approx(moved * x.nbytes / cfg.memory("dram").bandwidth)
        assert k.roofline == max(k.compute, k.traffic)
        assert k.roofline <= exe.last_reports[0].phase_cycles()[k.label]
        sides.append(k.compute > k.traffic)
    assert sides[1:] == [True, False]
