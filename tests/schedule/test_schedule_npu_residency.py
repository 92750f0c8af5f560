"""On-chip residency across layers (kiln.schedule.npu.residency): intermediates that fit stay in
L1 between kernels -- the same bits, less DRAM traffic; what the scalar unit, a CPU step or the
caller reads stays in DRAM; the kernels' own use of L1 is respected."""

from __future__ import annotations

import numpy as np
import pytest

import kiln
from kiln import graph as g
from kiln import op
from kiln.build import npu_pipeline
from kiln.codegen.npu import build_npu
from kiln.npu import Block, Instr, Machine, Program, Simulator
from kiln.npu.isa import UNIT_DMA_IN, UNIT_DMA_OUT, UNIT_VECTOR
from kiln.runtime.memory_plan import Interval, place
from kiln.schedule.knobs import graph_knobs
from kiln.schedule.npu.emit import DramTensor
from kiln.schedule.npu.gemm import TILING_KNOB
from kiln.schedule.npu.residency import place_by_groups, plan_residency
from kiln.target.npu import MEMORY_NAMES, load_config
from kiln.testing import models
from kiln.testing.op_testing import graph_module

HW = ["default", "edge"]
L1 = MEMORY_NAMES.index("l1")


def _both(mod, hw):
    mod = npu_pipeline()(mod)
    return [build_npu(mod, kiln.Target("npu", hw=hw), residency=r) for r in (False, True)]


def _dram_bytes(exe):
    return sum(r.dram_read + r.dram_written for r in exe.last_reports)


def _l1_blocks(exe):
    return [(ins.op, k, blk) for st in exe.steps if hasattr(st, "program")
            for stream in st.program.streams for ins in stream
            for k, blk in ins.args.items() if getattr(blk, "mem", None) == L1]


@pytest.mark.parametrize("hw", HW)
def test_a_cnn_keeps_its_activations_on_chip(hw):
    """conv -> batch norm -> relu -> pool -> conv -> relu -> mean -> dense: every activation
    between two kernels fits in L1; the outputs are bit for bit those of the DRAM build, the
    DRAM traffic is lower, and the simulator's hazard checks (L1 is on chip) pass."""
    m = models.small_cnn(batch=2, channels=8, size=16)
    off, on = _both(m.mod, hw)
    x = m.inputs[0]
    want = off(x)
    got = on(x)
    np.testing.assert_array_equal(got, want)
    np.testing.assert_allclose(got, m.reference(x), rtol=2e-2, atol=2e-2)
    assert off.residency is None and on.residency.tensors >= 4
    assert _dram_bytes(on) < _dram_bytes(off) - on.residency.saved_bytes // 2
    assert on.last_cycles <= off.last_cycles
    # each moved tensor is written by a DMA store into L1 and read back by a DMA load
    ops = {(o, k) for o, k, _ in _l1_blocks(on)}
    assert ("dma.store", "dst") in ops and ("dma.load", "src") in ops
    assert "intermediate tensor(s) kept in L1" in on.describe()


@pytest.mark.parametrize("hw", HW)
def test_what_the_scalar_unit_or_a_cpu_step_reads_stays_in_dram(hw):
    """An int64 intermediate (scalar unit: it addresses DRAM) and the operand of an op with no
    NPU lowering (a CPU step reads DRAM) are never moved; the float chain between products
    is."""
    rng = np.random.default_rng(3)
    w1 = (rng.standard_normal((24, 16)) * 0.3).astype("float32")
    w2 = (rng.standard_normal((16, 24)) * 0.3).astype("float32")

    def fn(x, i):
        h = op.nn.relu(op.dense(x, g.const(w1)))
        j = op.add(i, g.const(np.int64(3)))  # int64: the scalar unit
        k = op.cumsum(op.dense(h, g.const(w2)), axis=1)  # cumsum: the CPU
        return op.add(k, op.cast(j, "float32"))

    mod = graph_module(fn, [(5, 16), (5, 16)], dtype=["float32", "int64"])
    off, on = _both(mod, hw)
    assert on.cpu_ops == ["cumsum"]
    x = rng.standard_normal((5, 16)).astype("float32")
    i = rng.integers(-9, 9, (5, 16)).astype("int64")
    np.testing.assert_array_equal(on(x, i), off(x, i))
    h = np.maximum(x @ w1.T, 0)
    ref = np.cumsum(h @ w2.T, axis=1) + (i + 3)
    np.testing.assert_allclose(on(x, i), ref, rtol=5e-2, atol=5e-2)
    scalar_blocks = [ins for st in on.steps if hasattr(st, "program")
                     for stream in st.program.streams for ins in stream
                     if ins.op in ("s.ld", "s.st") and ins.args.get("mem") == L1]
    assert not scalar_blocks
    assert on.residency.tensors >= 1  # relu(dense) stays on chip for the second dense


def test_a_small_l1_keeps_what_does_not_fit_in_dram(tmp_path):
    """The edge description with 6 KiB of L1: fewer intermediates move than with its 256 KiB,
    those that do fit beside the convolutions' staging (the same bits: a staging block over
    a kept tensor would change them)."""
    src = open(kiln.target.npu.load_config("edge").path).read()
    path = tmp_path / "small_l1.toml"
    path.write_text(src.replace('name = "edge"', 'name = "small-l1"').replace(
        '[l1]\nsize = "256 KiB"', '[l1]\nsize = "6 KiB"'))
    m = models.small_cnn(batch=1, channels=8, size=12)
    off, on = _both(m.mod, str(path))
    full = _both(m.mod, "edge")[1]
    assert 0 < on.residency.tensors < full.residency.tensors
    assert max(on.residency.l1_addr[a] + n for a, n in on.residency.nbytes.items()) <= 6 << 10
    np.testing.assert_array_equal(on(m.inputs[0]), off(m.inputs[0]))
    assert _dram_bytes(full) < _dram_bytes(on) < _dram_bytes(off)


def test_a_saved_executable_keeps_its_l1_tensors(tmp_path):
    m = models.small_cnn(batch=1, channels=8, size=12)
    _, on = _both(m.mod, "default")
    x = m.inputs[0]
    want = on(x)
    on.save(str(tmp_path / "m.kiln"))
    back = kiln.load(str(tmp_path / "m.kiln"))
    np.testing.assert_array_equal(back(x), want)
    assert back.last_cycles == on.last_cycles and _l1_blocks(back)


def _pipelined_kernel(src: int, dst: int, tiles: int, n: int) -> list:
    """One kernel: tile by tile, DMA-in loads ``n`` float32 of DRAM ``src`` into L0 input
    (two slots), the vector unit writes ``2 x + 1`` into the accumulators (two slots), DMA-out
    stores it to ``dst`` -- the load of tile i + 1 runs while tile i is stored."""
    def f32(mem: str, addr: int) -> Block:
        return Block(MEMORY_NAMES.index(mem), addr, "float32", (0, 0, 1))

    s: list = []
    for i in range(tiles):
        slot = (i % 2) * n * 4
        if i >= 2:
            s += [Instr("tok.pop", src=UNIT_VECTOR, dst=UNIT_DMA_IN)]
        s += [Instr("dma.load", shape=(1, 1, n), dst=f32("input", slot),
                    src=f32("dram", src + i * n * 4), pad_lo=(0, 0, 0), pad_hi=(0, 0, 0),
                    fill=0),
              Instr("tok.push", src=UNIT_DMA_IN, dst=UNIT_VECTOR),
              Instr("tok.pop", src=UNIT_DMA_IN, dst=UNIT_VECTOR)]
        if i >= 2:
            s += [Instr("tok.pop", src=UNIT_DMA_OUT, dst=UNIT_VECTOR)]
        s += [Instr("vmul", shape=(1, 1, n), dst=f32("acc", slot), a=f32("input", slot),
                    b=2.0),
              Instr("tok.push", src=UNIT_VECTOR, dst=UNIT_VECTOR),
              Instr("tok.pop", src=UNIT_VECTOR, dst=UNIT_VECTOR),
              Instr("vadd", shape=(1, 1, n), dst=f32("acc", slot), a=f32("acc", slot),
                    b=1.0),
              Instr("tok.push", src=UNIT_VECTOR, dst=UNIT_DMA_IN),
              Instr("tok.push", src=UNIT_VECTOR, dst=UNIT_DMA_OUT),
              Instr("tok.pop", src=UNIT_VECTOR, dst=UNIT_DMA_OUT),
              Instr("dma.store", shape=(1, 1, n), src=f32("acc", slot),
                    dst=f32("dram", dst + i * n * 4), pad_lo=(0, 0, 0), pad_hi=(0, 0, 0),
                    fill=0),
              Instr("tok.push", src=UNIT_DMA_OUT, dst=UNIT_VECTOR)]
    for _ in range(min(tiles, 2)):  # the kernel ends with empty token queues
        s += [Instr("tok.pop", src=UNIT_VECTOR, dst=UNIT_DMA_IN),
              Instr("tok.pop", src=UNIT_DMA_OUT, dst=UNIT_VECTOR)]
    return s


def test_l1_tensors_are_placed_by_bank_group():
    """x -> t1 -> t2 -> y in three pipelined kernels on "edge" (L1: 8 groups of 32 KiB, one
    port): t1 and t2 stay in L1. Packed best-fit from the top, both fall in the top group,
    so the middle kernel's loads of t1 and stores of t2 take turns on its port; placed by
    group they lie in different groups -- no L1 conflict, the same bits."""
    cfg = load_config("edge")
    tiles, n = 4, 1024  # 16 KiB tensors: two fit in one group
    nbytes = tiles * n * 4
    x, t1, t2, y = (DramTensor(64 + i * nbytes, (tiles * n,), "float32") for i in range(4))
    kernels = [_pipelined_kernel(a.addr, b.addr, tiles, n)
               for a, b in ((x, t1), (t1, t2), (t2, y))]
    data = np.random.default_rng(5).standard_normal(tiles * n).astype(np.float32)
    runs = []
    for by_groups in (False, True):
        stream = [*kernels[0], Instr("barrier", id=1), *kernels[1], Instr("barrier", id=2),
                  *kernels[2]]
        program = Program(cfg, [[Instr(i.op, note=i.note, **i.args) for i in stream]])
        plan = plan_residency(cfg, [program], [x, y], [x, t1, t2, y], by_groups=by_groups)
        assert sorted(plan.l1_addr) == [t1.addr, t2.addr]
        machine = Machine(cfg, 64 + 4 * nbytes)
        machine.write(x.addr, data)
        report = Simulator(cfg, machine).run(program)
        runs.append((plan, report, machine.read(y.addr, data.shape, data.dtype)))
    (packed, rep0, out0), (grouped, rep1, out1) = runs
    group = cfg.memory("l1").group_bytes
    assert {a // group for a in packed.l1_addr.values()} == {cfg.memory("l1").bank_groups - 1}
    assert len({a // group for a in grouped.l1_addr.values()}) == 2
    want = data
    for _ in kernels:
        want = want * np.float32(2) + np.float32(1)
    np.testing.assert_array_equal(out0, want)
    assert out1.tobytes() == out0.tobytes()
    assert rep0.conflict_cycles.get("l1", 0) > 0 and rep1.conflict_cycles.get("l1", 0) == 0
    assert rep1.cycles <= rep0.cycles  # here L0 input's conflicts bound the pipeline


def _conv_kernels(exe):
    return [k for st in exe.steps if hasattr(st, "program") for k in st.kernels
            if k.op == "nn.conv2d"]


@pytest.mark.parametrize("hw", HW)
def test_the_bound_of_a_layer_with_l1_operands_is_the_same_for_every_tiling(hw):
    """The roofline of a convolution whose input and output residency keeps in L1
    (``residency.rebound``) does not depend on the tiling: the same for the planner's tiling
    and for the knob's last candidate, which loads other tiles again and moves other bytes
    (the bytes a tiling's DMAs moved made it depend on the tiling, below the weights' own
    DRAM cycles on ResNet-18's stage 4). It also stays at or above the DRAM cycles of what
    must cross the channel (the weights) and the compute side; the outputs are those of the
    reference either way."""
    m = models.small_cnn(batch=2, channels=16, size=16)
    mod = npu_pipeline()(m.mod)
    target = kiln.Target("npu", hw=hw)
    with graph_knobs() as seen:
        first = build_npu(mod, target)
    keys = [k for k, names in seen.asked.items() if TILING_KNOB in names and
            len(names[TILING_KNOB][0]) > 1]
    assert keys, "no product with a choice of tilings"
    other = {k: {TILING_KNOB: seen.asked[k][TILING_KNOB][0][-1]} for k in keys}
    with graph_knobs(other.get):
        second = build_npu(mod, target)
    a, b = _conv_kernels(first), _conv_kernels(second)
    assert len(a) == len(b) == 2 and a[1].tiling != b[1].tiling
    assert second.residency.kernel_bytes == first.residency.kernel_bytes
    cfg = load_config(hw)
    weights = 32 * 16 * 9 * 2 / cfg.memory("dram").bandwidth  # float16 on the tensor unit
    for ka, kb in zip(a, b):
        assert ka.roofline == pytest.approx(kb.roofline)
        assert ka.traffic == pytest.approx(kb.traffic)
    assert a[1].roofline >= max(weights, a[1].compute)
    x = m.inputs[0]
    for exe in (first, second):
        np.testing.assert_allclose(exe(x), m.reference(x), rtol=2e-2, atol=2e-2)


def test_tensors_that_find_no_range_by_group_keep_the_packing_the_others_move():
    """Edge's L1 (eight groups of 32 KiB), five tensors kept across three kernels, packed
    best-fit from the top. Placed by group in order of the bytes they save, the 68 KiB one
    finds no free range (the ones before it took the room), so it keeps its packing address
    and the others are placed again around it: the load of kernel 2 then shares no group
    with that kernel's stores -- in the packing it did, and the whole packing was kept
    before."""
    cfg = load_config("edge")
    spec = cfg.memory("l1")
    gbytes = spec.group_bytes
    kib = 1024
    chosen = [Interval(0, 12 * kib, 2, 2), Interval(1, 68 * kib, 1, 2),
              Interval(2, 92 * kib, 0, 1), Interval(3, 44 * kib, 2, 2),
              Interval(4, 52 * kib, 2, 2)]
    ops = {0: {2: {"dma.store"}}, 1: {1: {"dma.store"}, 2: {"dma.store"}},
           2: {0: {"dma.store"}, 1: {"dma.store"}}, 3: {2: {"dma.store"}},
           4: {2: {"dma.load"}}}
    moved = {0: 587, 1: 1, 2: 313, 3: 116, 4: 571}
    offsets, peak = place(chosen, spec.bank_width)
    assert peak <= spec.size
    packing = {iv.key: spec.size - offsets[iv.key] - iv.size for iv in chosen}
    where = place_by_groups(cfg, chosen, packing, ops, [0, 0, 0], [set(), set(), set()],
                            moved)
    ivs = {iv.key: iv for iv in chosen}
    for a in ivs:  # a valid placement: in L1, aligned, no bytes shared while both live
        assert 0 <= where[a] and where[a] + ivs[a].size <= spec.size
        assert where[a] % spec.bank_width == 0
        for b in ivs:
            if a < b and ivs[a].overlaps(ivs[b]):
                assert where[a] + ivs[a].size <= where[b] or \
                    where[b] + ivs[b].size <= where[a], (a, b, where)

    def groups(place_, key):
        lo = place_[key]
        return set(range(lo // gbytes, (lo + ivs[key].size - 1) // gbytes + 1))

    assert where[1] == packing[1] and where != packing
    stores = set().union(*(groups(packing, k) for k in (0, 1, 3)))
    assert groups(packing, 4) & stores  # the packing: the load beside a store
    stores = set().union(*(groups(where, k) for k in (0, 1, 3)))
    assert not groups(where, 4) & stores
