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
from kiln.target.npu import MEMORY_NAMES
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
        h = op.nn.relu(op.nn.dense(x, g.const(w1)))
        j = op.add(i, g.const(np.int64(3)))  # int64: the scalar unit
        k = op.mod(op.nn.dense(h, g.const(w2)), g.const(np.float32(0.7)))  # mod: the CPU
        return op.add(k, op.cast(j, "float32"))

    mod = graph_module(fn, [(5, 16), (5, 16)], dtype=["float32", "int64"])
    off, on = _both(mod, hw)
    assert on.cpu_ops == ["mod"]
    x = rng.standard_normal((5, 16)).astype("float32")
    i = rng.integers(-9, 9, (5, 16)).astype("int64")
    np.testing.assert_array_equal(on(x, i), off(x, i))
    h = np.maximum(x @ w1.T, 0)
    ref = np.fmod(h @ w2.T, np.float32(0.7)) + (i + 3)
    np.testing.assert_allclose(on(x, i), ref, rtol=5e-2, atol=5e-2)
    scalar_blocks = [ins for st in on.steps if hasattr(st, "program")
                     for stream in st.program.streams for ins in stream
                     if ins.op in ("s.ld", "s.st") and ins.args.get("mem") == L1]
    assert not scalar_blocks
    assert on.residency.tensors >= 1  # relu(dense) stays on chip for the second dense


def test_no_room_in_l1_keeps_everything_in_dram(tmp_path):
    """A description whose L1 holds only the kernels' own staging: nothing moves, the same
    bits."""
    src = open(kiln.target.npu.load_config("edge").path).read()
    path = tmp_path / "tiny_l1.toml"
    path.write_text(src.replace('name = "edge"', 'name = "tiny-l1"').replace(
        '[l1]\nsize = "256 KiB"', '[l1]\nsize = "4 KiB"'))
    m = models.small_cnn(batch=1, channels=8, size=12)
    off, on = _both(m.mod, str(path))
    assert on.residency.tensors == 0 and not _l1_blocks(on) or \
        all(o != "dma.store" or k != "dst" for o, k, _ in _l1_blocks(on))
    np.testing.assert_array_equal(on(m.inputs[0]), off(m.inputs[0]))


def test_a_saved_executable_keeps_its_l1_tensors(tmp_path):
    m = models.small_cnn(batch=1, channels=8, size=12)
    _, on = _both(m.mod, "default")
    x = m.inputs[0]
    want = on(x)
    on.save(str(tmp_path / "m.kiln"))
    back = kiln.load(str(tmp_path / "m.kiln"))
    np.testing.assert_array_equal(back(x), want)
    assert back.last_cycles == on.last_cycles and _l1_blocks(back)
