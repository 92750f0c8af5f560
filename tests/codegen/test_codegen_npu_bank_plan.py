"""kiln.codegen.npu.bank_plan: bank-group conflicts found by a timing replay of a program and
removed by moving its on-chip buffers -- the same bits, no more cycles."""

import json

import numpy as np
import pytest
import torch

import kiln
from kiln import graph as g
from kiln import op
from kiln.build import npu_pipeline
from kiln.codegen.npu import build_npu
from kiln.codegen.npu.bank_plan import analyse_banks, plan_banks
from kiln.npu import Block, Instr, Machine, Program, Simulator
from kiln.npu.isa import UNIT_DMA_IN, UNIT_DMA_OUT, UNIT_VECTOR
from kiln.schedule.npu import ops as npu_ops
from kiln.schedule.npu.epilogue import EPILOGUE_HOME_KEY
from kiln.target.npu import load_config
from kiln.target.npu.config import config_from_dict
from kiln.testing import models
from kiln.transform.pass_infra import PassContext

IN, ACC = 2, 4
N = 2048  # float32 elements of a tile: 8 KiB


def _config(input_size: str | None = None):
    """The default description (L0 buffers in 4 bank groups of one port); ``input_size``
    shrinks L0 input."""
    raw = json.loads(json.dumps(load_config("default").raw))
    if input_size is not None:
        raw["l0"]["input"]["size"] = input_size
    return config_from_dict(raw, "default_test.toml")


def _f32(mem: int, addr: int) -> Block:
    return Block(mem, addr, "float32", (0, 0, 1))


def _pingpong(steps: int = 4, in_slots=(0, 8192), acc_slots=(0, 8192), fill_rest: int = 0):
    """A double-buffered kernel: DMA-in loads tile i into input slot i % 2, the vector unit
    writes ``2 x + 1`` of it to accumulator slot i % 2, DMA-out stores it; tokens order the
    slots' reuse. Both input slots sit in one bank group, so the load of tile i + 1 collides
    with the vector's read of tile i. ``fill_rest``: a vfill first writes that many
    bytes of L0 input from 16 KiB on (a buffer taking the rest of the memory)."""
    s: list[Instr] = []
    if fill_rest:
        s.append(Instr("vfill", shape=(1, fill_rest // 4096, 1024), value=0.0,
                       dst=Block(IN, 16384, "float32", (0, 1024, 1))))
    for i in range(steps):
        slot_in, slot_acc = in_slots[i % 2], acc_slots[i % 2]
        if i >= 2:
            s.append(Instr("tok.pop", src=UNIT_VECTOR, dst=UNIT_DMA_IN))
        s += [Instr("dma.load", shape=(1, 1, N), dst=_f32(IN, slot_in),
                    src=_f32(0, 64 + i * N * 4), pad_lo=(0, 0, 0), pad_hi=(0, 0, 0), fill=0),
              Instr("tok.push", src=UNIT_DMA_IN, dst=UNIT_VECTOR),
              Instr("tok.pop", src=UNIT_DMA_IN, dst=UNIT_VECTOR)]
        if i >= 2:
            s.append(Instr("tok.pop", src=UNIT_DMA_OUT, dst=UNIT_VECTOR))
        s += [Instr("vmul", shape=(1, 1, N), dst=_f32(ACC, slot_acc), a=_f32(IN, slot_in),
                    b=2.0),
              Instr("tok.push", src=UNIT_VECTOR, dst=UNIT_VECTOR),
              Instr("tok.pop", src=UNIT_VECTOR, dst=UNIT_VECTOR),
              Instr("vadd", shape=(1, 1, N), dst=_f32(ACC, slot_acc), a=_f32(ACC, slot_acc),
                    b=1.0),
              Instr("tok.push", src=UNIT_VECTOR, dst=UNIT_DMA_IN),
              Instr("tok.push", src=UNIT_VECTOR, dst=UNIT_DMA_OUT),
              Instr("tok.pop", src=UNIT_VECTOR, dst=UNIT_DMA_OUT),
              Instr("dma.store", shape=(1, 1, N), src=_f32(ACC, slot_acc),
                    dst=_f32(0, 64 + (steps + i) * N * 4), pad_lo=(0, 0, 0),
                    pad_hi=(0, 0, 0), fill=0),
              Instr("tok.push", src=UNIT_DMA_OUT, dst=UNIT_VECTOR)]
    return s


def _run(cfg, program, x):
    m = Machine(cfg, 64 + 2 * x.nbytes)
    m.write(64, x)
    rep = Simulator(cfg, m).run(program)
    return rep, m.read(64 + x.nbytes, x.shape, x.dtype)


def test_pingpong_in_one_group_is_moved_apart():
    cfg = _config()
    steps = 4
    program = Program(cfg, [_pingpong(steps), []])
    x = np.random.default_rng(0).standard_normal(steps * N).astype(np.float32)
    before = analyse_banks(program, Machine(cfg, 1 << 20))
    assert before.conflict_cycles > 0
    assert {p.a.mem for p in before.pairs} == {IN}  # the loads against the vector's reads
    assert before.pairs == sorted(before.pairs, key=lambda p: -p.cycles)
    moved, plan = plan_banks(program, Machine(cfg, 1 << 20))
    assert plan.conflicts_before == before.conflict_cycles
    assert plan.conflicts_after == 0 and not plan.left
    assert plan.cycles_after < plan.cycles_before
    group = cfg.memory("input").group_bytes
    for buf, lo in plan.moves:  # to another group, keeping the bank of every byte
        assert lo // group != buf.lo // group
        assert (lo - buf.lo) % (cfg.memory("input").banks * cfg.memory("input").bank_width) == 0
    rep0, out0 = _run(cfg, program, x)
    rep1, out1 = _run(cfg, moved, x)
    np.testing.assert_array_equal(out0, 2 * x + 1)
    assert out1.tobytes() == out0.tobytes()
    assert rep0.total_conflict_cycles == plan.conflicts_before  # the replay is the run's timing
    assert rep1.total_conflict_cycles == 0 and rep1.cycles == plan.cycles_after
    assert rep1.cycles < rep0.cycles


def test_full_memory_leaves_the_conflict_and_says_so():
    """L0 input of 64 KiB (4 groups of 16 KiB): both slots in the first, a buffer filling the
    other three; nothing can move there, so the conflict stays, named with the reason."""
    cfg = _config("64 KiB")
    program = Program(cfg, [_pingpong(4, fill_rest=48 * 1024), []])
    moved, plan = plan_banks(program, Machine(cfg, 1 << 20))
    assert plan.left and all("memory full" in why and "input" in why for why in plan.left)
    assert plan.conflicts_after == plan.conflicts_before > 0
    assert not plan.moves and moved is program
    assert "left:" in plan.summary()
    x = np.random.default_rng(1).standard_normal(4 * N).astype(np.float32)
    assert _run(cfg, moved, x)[1].tobytes() == _run(cfg, program, x)[1].tobytes()


def test_data_carried_between_phases_pins_its_buffers():
    """A tile loaded in one phase and read in the next must not move (its writer is in the
    other phase): the read-before-write bytes pin the buffers on both sides."""
    cfg = _config()
    held = 0x8000
    s = [Instr("dma.load", shape=(1, 1, N), dst=_f32(IN, held), src=_f32(0, 64),
               pad_lo=(0, 0, 0), pad_hi=(0, 0, 0), fill=0), Instr("barrier", id=1),
         Instr("vmov", shape=(1, 1, N), dst=_f32(ACC, 0x10000), a=_f32(IN, held)),
         *_pingpong(4)]
    analysis = analyse_banks(Program(cfg, [s, [Instr("barrier", id=1)]]),
                             Machine(cfg, 1 << 20))
    pinned = {(b.phase, b.mem, b.lo) for b in analysis.pinned}
    assert (0, IN, held) in pinned and (1, IN, held) in pinned
    assert (1, IN, 0) not in pinned and (1, IN, 8192) not in pinned
    assert analysis.carried[(0, IN)] == [(held, held + N * 4, 0, 1)]  # live in phases 0-1


@pytest.mark.parametrize("hw", ["edge", "default"])
def test_model_with_and_without_placement_same_bits(hw):
    m = models.small_cnn(batch=1, channels=16, size=16)
    target = kiln.Target("npu", hw=hw)
    mod = npu_pipeline()(m.mod)
    # without the prefetch (it runs after the placement): the placement's replays are the run;
    # the epilogues' buffers in the accumulators: on default, in their own groups of L0
    # weight, they leave this model no conflict to place away
    with PassContext(config={EPILOGUE_HOME_KEY: "acc"}):
        off = build_npu(mod, target, bank_plan=False, prefetch=False)
        on = build_npu(mod, target, prefetch=False)
    a, b = off(*m.inputs), on(*m.inputs)
    assert np.asarray(a).tobytes() == np.asarray(b).tobytes()
    np.testing.assert_allclose(np.asarray(b), m.reference(*m.inputs), rtol=2e-2, atol=2e-2)
    before, after = on.bank_conflicts
    assert before > 0 and after <= before
    assert on.last_cycles <= off.last_cycles
    assert sum(r.total_conflict_cycles for r in off.last_reports) == before
    assert sum(r.total_conflict_cycles for r in on.last_reports) == after
    assert off.bank_conflicts == (0, 0)
    per_kernel = on.kernel_bank_conflicts
    assert per_kernel and set(per_kernel) <= {k.label for k in on.kernels} | {"tail"}
    assert sum(b for b, _ in per_kernel.values()) == before
    assert sum(a for _, a in per_kernel.values()) == after


def _chunked(steps: int = 4, tile: int = 0, split: int = N // 2):
    """An accumulator tile in two chunks, the fused epilogue's pattern: DMA-in loads the
    whole tile (as the tensor unit writes it), the vector unit doubles chunk 0 then chunk 1
    in place (and divides it by 1: as long as its store takes), DMA-out stores each chunk
    as soon as it is done -- chunk 0's store runs while the vector unit computes chunk 1, in
    one buffer (the load spans both chunks). ``split``: chunk 0's elements."""
    s: list[Instr] = []
    for i in range(steps):
        if i:
            s.append(Instr("tok.pop", src=UNIT_DMA_OUT, dst=UNIT_DMA_IN))
        s += [Instr("dma.load", shape=(1, 1, N), dst=_f32(ACC, tile),
                    src=_f32(0, 64 + i * N * 4), pad_lo=(0, 0, 0), pad_hi=(0, 0, 0), fill=0),
              Instr("tok.push", src=UNIT_DMA_IN, dst=UNIT_VECTOR),
              Instr("tok.pop", src=UNIT_DMA_IN, dst=UNIT_VECTOR)]
        for at, n in ((0, split), (split, N - split)):
            chunk = _f32(ACC, tile + at * 4)
            s += [Instr("vmul", shape=(1, 1, n), dst=chunk, a=chunk, b=2.0),
                  Instr("tok.push", src=UNIT_VECTOR, dst=UNIT_VECTOR),  # a fence
                  Instr("tok.pop", src=UNIT_VECTOR, dst=UNIT_VECTOR),
                  Instr("vdiv", shape=(1, 1, n), dst=chunk, a=chunk, b=1.0),
                  Instr("tok.push", src=UNIT_VECTOR, dst=UNIT_DMA_OUT)]
        for at, n in ((0, split), (split, N - split)):
            s += [Instr("tok.pop", src=UNIT_VECTOR, dst=UNIT_DMA_OUT),
                  Instr("dma.store", shape=(1, 1, n), src=_f32(ACC, tile + at * 4),
                        dst=_f32(0, 64 + (steps * N + i * N + at) * 4),
                        pad_lo=(0, 0, 0), pad_hi=(0, 0, 0), fill=0)]
        s.append(Instr("tok.push", src=UNIT_DMA_OUT, dst=UNIT_DMA_IN))
    return s


def test_one_buffer_used_in_two_parts_at_once_straddles_a_group_boundary():
    """Chunk 0's store and chunk 1's computation touch one buffer at once: no move of the
    whole buffer to another group separates them, a placement across a group boundary
    between the chunks does -- the cost model counts accesses, shifted with their buffer."""
    cfg = _config()
    steps = 4
    program = Program(cfg, [_chunked(steps), []])
    before = analyse_banks(program, Machine(cfg, 1 << 20))
    assert before.conflict_cycles > 0
    assert all(p.a == p.b and p.a.mem == ACC for p in before.pairs)  # one buffer, two units
    moved, plan = plan_banks(program, Machine(cfg, 1 << 20))
    assert plan.conflicts_after == 0 and not plan.left
    assert plan.cycles_after < plan.cycles_before
    (buf, lo), = plan.moves
    group = cfg.memory("acc").group_bytes
    assert (lo + N * 2) % group == 0  # the boundary between the chunks on a group's edge
    x = np.random.default_rng(2).standard_normal(steps * N).astype(np.float32)
    rep0, out0 = _run(cfg, program, x)
    rep1, out1 = _run(cfg, moved, x)
    np.testing.assert_allclose(out0, 2 * x, rtol=2.5e-7)  # vdiv rounds to within an ulp
    assert out1.tobytes() == out0.tobytes()
    assert rep1.total_conflict_cycles == 0 and rep1.cycles < rep0.cycles


def test_conv_accumulator_columns_leave_fewer_conflicts_same_bits(monkeypatch):
    """A 3x3 conv with bias and relu fused (epilogue chunks and tail pieces: ranges of
    output channels): with the tile column-major each range is an address range of its own,
    which the placement can separate; row-major they interleave over the whole tile and no
    move helps (the epilogue's buffers in the accumulators, ``"npu.epilogue_home": "acc"``:
    the result stored from the tile). Same bits either way, with and without the placement;
    no more cycles. With the default home, column-major, the relu writes each chunk into a
    slot in a bank group of L0 weight of its own and DMA-out stores it from there: the
    placement leaves no conflict; the same bits. (Not fewer cycles here: 8368 against 8036
    -- this kernel's stores bind it, and each chunk's slot token waits for DMA-out's queue
    to drain; ResNet-18, MobileNetV2 and the small CNN are faster with it.)"""
    rng = np.random.default_rng(5)
    w = g.const((rng.standard_normal((64, 16, 3, 3)) * 0.3).astype("float32"))
    b = g.const((rng.standard_normal((64, 1, 1)) * 0.3).astype("float32"))
    bb = g.BlockBuilder()
    xv = g.Var("x", g.TensorStructInfo((1, 16, 32, 32), "float32"))
    with bb.function("main", [xv]):
        with bb.dataflow():
            c = bb.emit(op.nn.conv2d(xv, w, padding=(1, 1)), "c")
            out = bb.emit_output(op.nn.relu(bb.emit(op.add(c, b), "a")), "y")
        bb.emit_func_output(out)
    mod = npu_pipeline()(bb.get())
    x = rng.standard_normal((1, 16, 32, 32)).astype("float32")
    target = kiln.Target("npu", hw="default")
    runs, staged = {}, {}
    for columns in (False, True):
        monkeypatch.setattr(npu_ops, "CONV_ACC_COLUMNS", columns)
        for plan in (False, True):
            with PassContext(config={EPILOGUE_HOME_KEY: "acc"}):
                exe = build_npu(mod, target, bank_plan=plan, residency=False)
            runs[columns, plan] = exe, np.asarray(exe(x))
        exe = build_npu(mod, target, residency=False)
        staged[columns] = exe, np.asarray(exe(x))
    ref = torch.relu(torch.nn.functional.conv2d(
        torch.tensor(x), torch.tensor(w.data), torch.tensor(b.data.reshape(-1)),
        padding=1)).numpy()
    base = runs[False, False][1]
    np.testing.assert_allclose(base, ref, rtol=2e-2, atol=2e-2)
    for _, out in runs.values():
        assert out.tobytes() == base.tobytes()
    rows, cols = runs[False, True][0], runs[True, True][0]
    assert "nn.conv2d+add+relu" in {k.label.split(":", 1)[1] for k in cols.kernels}
    assert rows.bank_conflicts[1] > 0 and any("interleaved" in why for p in rows.bank_plans
                                              for why in p.left)
    assert cols.bank_conflicts[1] < rows.bank_conflicts[1] / 2
    assert cols.last_cycles <= rows.last_cycles
    for columns in (False, True):
        assert runs[columns, True][0].last_cycles <= runs[columns, False][0].last_cycles
        assert staged[columns][1].tobytes() == base.tobytes()
    # row-major, the stores would read the slot across the channels (strided, in a memory of
    # half the banks): the result is stored from the tile, its conflicts left as they were
    assert staged[True][0].bank_conflicts[1] == 0 and not any(
        p.left for p in staged[True][0].bank_plans)
    assert staged[False][0].bank_conflicts[1] == rows.bank_conflicts[1]


def test_a_chunk_edge_off_the_bank_span_still_lands_on_a_group_boundary():
    """Chunk 0 of 1792 bytes: its edge is no multiple of the accumulators' bank span (32
    banks x 32 bytes), which the moves used to keep -- the nearest boundary placements left
    a bank line of one chunk in the other's group. A move keeps the address modulo the bank
    width only (the simulator's bank model is relative to a block's own address), so the
    edge lands on the boundary: no conflict left, the same bits."""
    cfg = _config()
    split, steps = 448, 4
    spec = cfg.memory("acc")
    assert (split * 4) % (spec.banks * spec.bank_width) and (split * 4) % spec.bank_width == 0
    program = Program(cfg, [_chunked(steps, split=split), []])
    moved, plan = plan_banks(program, Machine(cfg, 1 << 20))
    assert plan.conflicts_before > 0 and plan.conflicts_after == 0 and not plan.left
    (buf, lo), = plan.moves
    assert (lo + split * 4) % spec.group_bytes == 0 and (lo - buf.lo) % spec.bank_width == 0
    x = np.random.default_rng(3).standard_normal(steps * N).astype(np.float32)
    rep0, out0 = _run(cfg, program, x)
    rep1, out1 = _run(cfg, moved, x)
    np.testing.assert_allclose(out0, 2 * x, rtol=2.5e-7)
    assert out1.tobytes() == out0.tobytes()
    assert rep0.total_conflict_cycles == plan.conflicts_before
    assert rep1.total_conflict_cycles == 0 and rep1.cycles < rep0.cycles


def test_carried_data_pins_only_the_phases_it_is_live_in():
    """Two tiles loaded in phase 0 and read in phase 1 are carried between those phases; the
    double buffer of phase 2 reuses their bytes. The carried range pins its buffers in
    phases 0 and 1 only (it used to pin it in every phase, so phase 2's colliding slots
    could not move): phase 2's conflicts go, the bits stay."""
    cfg = _config()
    s = [*(Instr("dma.load", shape=(1, 1, N), dst=_f32(IN, at), src=_f32(0, 64 + at),
                 pad_lo=(0, 0, 0), pad_hi=(0, 0, 0), fill=0) for at in (0, N * 4)),
         Instr("barrier", id=1),
         *(Instr("vmov", shape=(1, 1, N), dst=_f32(ACC, 0x20000 + at), a=_f32(IN, at))
           for at in (0, N * 4)),
         Instr("barrier", id=2), *_pingpong(4)]
    program = Program(cfg, [s, [Instr("barrier", id=1), Instr("barrier", id=2)]])
    machine = Machine(cfg, 1 << 20)
    analysis = analyse_banks(program, machine)
    assert sorted(analysis.carried[(0, IN)]) == [(0, N * 4, 0, 1), (N * 4, N * 8, 0, 1)]
    pinned = {(b.phase, b.mem, b.lo) for b in analysis.pinned}
    assert {(0, IN, 0), (1, IN, 0)} <= pinned and not {b for b in pinned if b[0] == 2}
    phase2 = [p for p in analysis.pairs if p.a.phase == 2]
    assert phase2 and {p.a.mem for p in phase2} == {IN}  # the load beside the read
    moved, plan = plan_banks(program, machine)
    assert plan.conflicts_after == 0 and not plan.left
    assert {b.phase for b, _ in plan.moves} == {2}
    x = np.random.default_rng(4).standard_normal(4 * N).astype(np.float32)
    rep0, out0 = _run(cfg, program, x)
    rep1, out1 = _run(cfg, moved, x)
    np.testing.assert_array_equal(out0, 2 * x + 1)
    assert out1.tobytes() == out0.tobytes()
    assert rep1.total_conflict_cycles == 0 and rep1.cycles < rep0.cycles
