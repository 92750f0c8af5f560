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
