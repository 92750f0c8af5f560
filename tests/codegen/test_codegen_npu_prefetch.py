"""Prefetch across kernel boundaries (kiln.codegen.npu.prefetch): a kernel's first loads of
bytes the kernel before does not write run during that kernel -- the same bits, fewer cycles;
a load whose source the kernel before writes, or whose destination it uses where no room can be
made, stays after the barrier."""

from __future__ import annotations

import numpy as np
import pytest

import kiln
from kiln import graph as g
from kiln import op
from kiln.build import npu_pipeline
from kiln.codegen.npu import build_npu
from kiln.codegen.npu.prefetch import PREFETCH_KEY, prefetch_program
from kiln.npu import Block, Instr, Machine, Program, Simulator
from kiln.npu.isa import UNIT_DMA_IN, UNIT_DMA_OUT, UNIT_VECTOR
from kiln.target.npu import load_config
from kiln.testing.op_testing import graph_module

CFG = load_config("default")
DRAM, L1, IN, WT, ACC = range(5)
N = 4096  # float32 elements of every tile: 16 KiB
X, W, W0, Y0, Y1 = 0x1000, 0x20000, 0x40000, 0x60000, 0x80000  # DRAM addresses


def _f32(mem, addr):
    return Block(mem, addr, "float32", (0, 0, 1))


def _load(dst, src):
    return Instr("dma.load", shape=(1, 1, N), dst=dst, src=src, pad_lo=(0, 0, 0),
                 pad_hi=(0, 0, 0), fill=0)


def _sync(src, dst):
    return [Instr("tok.push", src=src, dst=dst), Instr("tok.pop", src=src, dst=dst)]


def _kernel(loads, vec, store_to, bid):
    """Loads, one vector instruction on them, a store of its result, the closing barrier."""
    return [*loads, *_sync(UNIT_DMA_IN, UNIT_VECTOR), vec, *_sync(UNIT_VECTOR, UNIT_DMA_OUT),
            Instr("dma.store", shape=(1, 1, N), dst=store_to, src=_f32(ACC, 0)),
            *_sync(UNIT_DMA_OUT, UNIT_VECTOR), Instr("barrier", id=bid)]


def _program(first, second):
    return Program(CFG, [first + second, [Instr("barrier", id=1), Instr("barrier", id=2)]],
                   {1: "first", 2: "second"})


def _run(program, data):
    m = Machine(CFG, 1 << 20)
    for addr, arr in data.items():
        m.write(addr, arr)
    report = Simulator(CFG, m).run(program)  # hazard checks on: tokens must order the data
    return report, m.read(Y0, (N,), np.float32), m.read(Y1, (N,), np.float32)


def _data():
    rng = np.random.default_rng(7)
    return {a: rng.standard_normal(N).astype(np.float32) for a in (X, W, W0)}


def _first(uses_weight=False):
    """y0 = x + 1 (or x + w0, the weight tile in L0 weight's first bytes)."""
    loads = [_load(_f32(IN, 0), _f32(DRAM, X))]
    b = 1.0
    if uses_weight:
        loads.append(_load(_f32(WT, 0), _f32(DRAM, W0)))
        b = _f32(WT, 0)
    return _kernel(loads, Instr("vadd", shape=(1, 1, N), dst=_f32(ACC, 0), a=_f32(IN, 0), b=b),
                   _f32(DRAM, Y0), 1)


def _second():
    """y1 = y0 * w: y0 written by the first kernel, w a constant."""
    return _kernel([_load(_f32(IN, 0), _f32(DRAM, Y0)), _load(_f32(WT, 0), _f32(DRAM, W))],
                   Instr("vmul", shape=(1, 1, N), dst=_f32(ACC, 0), a=_f32(IN, 0),
                         b=_f32(WT, 0)), _f32(DRAM, Y1), 2)


def _position(program, src_addr):
    """(index of the load reading DRAM ``src_addr`` in core 0's stream, index of the first
    barrier there)."""
    s = program.streams[0]
    load = next(i for i, ins in enumerate(s) if ins.op == "dma.load" and
                ins.args["src"].mem == DRAM and ins.args["src"].addr == src_addr)
    return load, next(i for i, ins in enumerate(s) if ins.op == "barrier")


@pytest.mark.parametrize("uses_weight", [False, True])
def test_the_weight_load_runs_before_the_barrier(uses_weight):
    """The second kernel's weight load moves above the barrier; the load of y0, which the
    first kernel writes, stays. Where the first kernel uses L0 weight's first bytes too, the
    second kernel's weight buffer moves to free bytes first. Same bits, fewer cycles."""
    program = _program(_first(uses_weight), _second())
    moved, plan = prefetch_program(program, Machine(CFG, 1 << 20))
    assert plan.moved == 1 and plan.moved_bytes == N * 4 and not plan.reverted
    assert plan.prefetched == {"second": N * 4}  # the kernel whose load ran before it
    load, barrier = _position(moved, W)
    assert load < barrier
    assert _position(moved, Y0)[0] > barrier
    assert plan.kept == {"its DRAM source is written by the kernel before": 1}
    assert bool(plan.relocated) == uses_weight
    if uses_weight:  # the second kernel's buffer moved clear of the first's
        (phase, core, mem, old, new), = plan.relocated
        assert (phase, core, mem, old) == (1, 0, "weight", 0) and new >= N * 4
        vmul = next(i for i in moved.streams[0] if i.op == "vmul")
        assert vmul.args["b"].addr == new
    data = _data()
    before, y0, y1 = _run(program, data)
    after, y0_moved, y1_moved = _run(moved, data)
    w0 = data[W0] if uses_weight else np.float32(1.0)
    np.testing.assert_array_equal(y0, data[X] + w0)
    np.testing.assert_array_equal(y1, (data[X] + w0) * data[W])
    assert y0_moved.tobytes() == y0.tobytes() and y1_moved.tobytes() == y1.tobytes()
    assert after.cycles < before.cycles
    assert plan.cycles_before == before.cycles and plan.cycles_after == after.cycles


def test_a_relocated_buffer_goes_to_a_group_apart_from_its_kernels_others():
    """y1 = w * x in the second kernel, both tiles in L0 weight: w at 0, where the first
    kernel's w0 is, x at 32 KiB (the first group). Both loads move above the barrier; w's
    buffer must move first, and goes to the free group that holds none of its kernel's other
    buffers -- the lowest free range (16 KiB) would put it beside x, in one group -- the same
    bits, fewer cycles."""
    x_at = 0x8000
    second = _kernel([_load(_f32(WT, 0), _f32(DRAM, W)), _load(_f32(WT, x_at), _f32(DRAM, X))],
                     Instr("vmul", shape=(1, 1, N), dst=_f32(ACC, 0), a=_f32(WT, 0),
                           b=_f32(WT, x_at)), _f32(DRAM, Y1), 2)
    program = _program(_first(uses_weight=True), second)
    moved, plan = prefetch_program(program, Machine(CFG, 1 << 20))
    assert plan.moved == 2 and not plan.reverted
    (phase, core, mem, old, new), = plan.relocated
    group = CFG.memory("weight").group_bytes
    assert (phase, core, mem, old) == (1, 0, "weight", 0)
    assert new // group != x_at // group and new % group == 0  # the next group's lowest
    vmul = next(i for i in moved.streams[0] if i.op == "vmul")
    assert vmul.args["a"].addr == new and vmul.args["b"].addr == x_at
    data = _data()
    before, y0, y1 = _run(program, data)
    after, y0_moved, y1_moved = _run(moved, data)
    np.testing.assert_array_equal(y0, data[X] + data[W0])
    np.testing.assert_array_equal(y1, data[W] * data[X])
    assert y0_moved.tobytes() == y0.tobytes() and y1_moved.tobytes() == y1.tobytes()
    assert after.cycles < before.cycles


def test_a_load_of_what_the_kernel_before_writes_stays():
    """Only the load of y0 heads the second kernel: the first kernel stores y0, nothing
    moves and the program is returned as it was."""
    second = _kernel([_load(_f32(IN, 0), _f32(DRAM, Y0))],
                     Instr("vmul", shape=(1, 1, N), dst=_f32(ACC, 0), a=_f32(IN, 0), b=2.0),
                     _f32(DRAM, Y1), 2)
    program = _program(_first(), second)
    moved, plan = prefetch_program(program, Machine(CFG, 1 << 20))
    assert moved is program and plan.moved == 0
    assert plan.kept == {"its DRAM source is written by the kernel before": 1}


def test_an_l1_destination_in_use_and_a_load_behind_a_fence_stay():
    """The second kernel stages w in L1 where the first kernel staged x (L1 is not
    relocated: it may hold tensors carried between kernels), so that load stays, and so does
    the load reading x back; a staging to free L1 bytes moves, but the load that reads them
    back behind the queue's fence on itself does not (it would pass its producer)."""
    fence = _sync(UNIT_DMA_IN, UNIT_DMA_IN)
    first = [_load(_f32(L1, 0), _f32(DRAM, X)), *fence, *_first()]
    second = _kernel([_load(_f32(L1, 0), _f32(DRAM, W)),
                      _load(_f32(L1, 0x10000), _f32(DRAM, W0)), *fence,
                      _load(_f32(IN, 0), _f32(L1, 0)), _load(_f32(WT, 0), _f32(L1, 0x10000))],
                     Instr("vmul", shape=(1, 1, N), dst=_f32(ACC, 0), a=_f32(IN, 0),
                           b=_f32(WT, 0)), _f32(DRAM, Y1), 2)
    program = _program(first, second)
    moved, plan = prefetch_program(program, Machine(CFG, 1 << 20))
    assert plan.kept == {"its L1 destination is in use by the kernel before": 1,
                         "its on-chip source is written by the kernel before": 1,  # x in L1
                         "it shares bytes with a load it would pass": 1}
    assert plan.moved == 1 and _position(moved, W0)[0] < _position(moved, W0)[1]
    assert _position(moved, W)[0] > _position(moved, W)[1]
    data = _data()
    _, _, y1 = _run(program, data)
    _, _, y1_moved = _run(moved, data)
    np.testing.assert_array_equal(y1, data[W] * data[W0])
    assert y1_moved.tobytes() == y1.tobytes()


@pytest.mark.parametrize("hw", ["default", "edge"])
def test_two_products_same_bits_fewer_cycles(hw):
    """dense -> relu -> dense: the second product's weight tiles load while the first one
    runs; the outputs are bit for bit those of the build without the pass (and the float32
    reference's within fp16 rounding); the PassContext option switches it off; the pass's
    replays give the run's cycles."""
    rng = np.random.default_rng(0)
    w1 = (rng.standard_normal((256, 128)) * 0.1).astype("float32")
    w2 = (rng.standard_normal((256, 256)) * 0.1).astype("float32")

    def fn(x):
        return op.dense(op.nn.relu(op.dense(x, g.const(w1))), g.const(w2))

    mod = npu_pipeline()(graph_module(fn, [(64, 128)]))
    target = kiln.Target("npu", hw=hw)
    on = build_npu(mod, target)
    with kiln.transform.PassContext(config={PREFETCH_KEY: False}):
        off = build_npu(mod, target)
    assert not off.prefetch_plans
    x = rng.standard_normal((64, 128)).astype("float32")
    got, want = on(x), off(x)
    assert got.tobytes() == want.tobytes()
    np.testing.assert_allclose(got, np.maximum(x @ w1.T, 0) @ w2.T, rtol=2e-2, atol=2e-2)
    (plan,) = on.prefetch_plans
    assert plan.moved > 0 and not plan.reverted
    assert on.last_cycles == plan.cycles_after < off.last_cycles == plan.cycles_before
    # the loads that changed kernels moved one kernel earlier, and each reads a constant
    consts = [(t.addr, t.addr + a.nbytes) for t, a in on.constants]
    before, after = _load_phases(off), _load_phases(on)
    changed = [key for key in after if after[key] != before[key]]
    assert len(changed) == plan.moved
    # every moved load reads DRAM: its bytes are charged to the kernel it came from
    assert sum(plan.prefetched.values()) == plan.moved_bytes
    assert set(plan.prefetched) <= {k.label for k in on.kernels}
    for key in changed:
        assert after[key] == before[key] - 1
        assert any(lo <= key[2] < hi for lo, hi in consts)


def _load_phases(exe):
    """(core, n-th load from that source, DRAM source address) -> the phase it is in."""
    out = {}
    for core, stream in enumerate(exe.steps[0].program.streams):
        phase, seen = 0, {}
        for ins in stream:
            if ins.op == "barrier":
                phase += 1
            elif ins.op == "dma.load" and ins.args["src"].mem == DRAM:
                addr = ins.args["src"].addr
                seen[addr] = seen.get(addr, -1) + 1
                out[(core, seen[addr], addr)] = phase
    return out
