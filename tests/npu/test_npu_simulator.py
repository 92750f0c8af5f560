"""The NPU foundation: instructions against numpy, the encoding and the assembler round-tripping
compiled programs, timing from the description, timelines."""

import json

import numpy as np
import pytest

import kiln
from kiln.npu import Block, Instr, Machine, Program, SimulationError, Simulator
from kiln.npu.asm import assemble_program
from kiln.npu.isa import UNIT_DMA_IN, UNIT_VECTOR
from kiln.npu.timeline import chrome_trace, timeline_png
from kiln.target.npu import ConfigError, load_config
from kiln.testing import models

CFG = load_config("default")
IN, WT, ACC = 2, 3, 4


def _run(instrs, dram=None, cfg=CFG):
    m = Machine(cfg, 1 << 16)
    if dram is not None:
        m.write(0, dram)
    sim = Simulator(cfg, m)
    streams = [list(instrs)] + [[] for _ in range(cfg.cores - 1)]
    return sim, m, sim.run(Program(cfg, streams))


def _fence(unit):
    return [Instr("tok.push", src=unit, dst=unit), Instr("tok.pop", src=unit, dst=unit)]


def _load(mem, addr, dtype, n, src_addr=0):
    return [Instr("dma.load", shape=(1, 1, n), dst=Block(mem, addr, dtype, (0, 0, 1)),
                  src=Block(0, src_addr, dtype, (0, 0, 1)), pad_lo=(0, 0, 0), pad_hi=(0, 0, 0),
                  fill=0), Instr("tok.push", src=UNIT_DMA_IN, dst=UNIT_VECTOR),
            Instr("tok.pop", src=UNIT_DMA_IN, dst=UNIT_VECTOR)]


def _read(sim, mem, addr, dtype, n):
    raw = sim.machine.memory(0, mem)
    return raw[addr:addr + n * np.dtype(dtype).itemsize].view(dtype)


def test_int8_vector_add_saturates_and_casts_round():
    rng = np.random.default_rng(0)
    a = rng.integers(-128, 128, 256, dtype=np.int8)
    b = rng.integers(-128, 128, 256, dtype=np.int8)
    prog = _load(IN, 0, "int8", 256) + _load(WT, 0, "int8", 256, 256) + [
        Instr("vadd", shape=(1, 1, 256), dst=Block(ACC, 0, "int8", (0, 0, 1)),
              a=Block(IN, 0, "int8", (0, 0, 1)), b=Block(WT, 0, "int8", (0, 0, 1)))]
    sim, _, _ = _run(prog, np.concatenate([a, b]))
    ref = np.clip(a.astype(np.int32) + b, -128, 127)
    np.testing.assert_array_equal(_read(sim, ACC, 0, np.int8, 256), ref)
    x = np.array([2.5, -2.5, 3.5, 300.7, -1e9, np.nan, 0.49999997], np.float32)
    for mode, fn in (("rne", np.rint), ("rtz", np.trunc), ("floor", np.floor)):
        prog = _load(IN, 0, "float32", x.size) + [
            Instr("vcast", shape=(1, 1, x.size), mode=mode,
                  dst=Block(ACC, 0, "int8", (0, 0, 1)), a=Block(IN, 0, "float32", (0, 0, 1)))]
        sim, _, _ = _run(prog, x)
        ref = np.clip(fn(np.nan_to_num(x, nan=0.0)), -128, 127).astype(np.int8)
        np.testing.assert_array_equal(_read(sim, ACC, 0, np.int8, x.size), ref)


def test_vexp_vdiv_approximations_are_close():
    x = np.linspace(-20, 20, 512).astype(np.float32)
    prog = _load(IN, 0, "float32", 512) + [
        Instr("vexp", shape=(1, 1, 512), dst=Block(ACC, 0, "float32", (0, 0, 1)),
              a=Block(IN, 0, "float32", (0, 0, 1)))] + _fence(UNIT_VECTOR) + [
        Instr("vdiv", shape=(1, 1, 512), dst=Block(ACC, 4096, "float32", (0, 0, 1)),
              a=Block(IN, 0, "float32", (0, 0, 1)), b=Block(ACC, 0, "float32", (0, 0, 1)))]
    sim, _, _ = _run(prog, x)
    e = _read(sim, ACC, 0, np.float32, 512)
    np.testing.assert_allclose(e, np.exp(x.astype(np.float64)), rtol=1e-6)
    np.testing.assert_allclose(_read(sim, ACC, 4096, np.float32, 512), x / np.exp(x),
                               rtol=1e-6, atol=1e-30)


def test_dma_padding_and_timing_follow_the_description():
    x = np.arange(12, dtype=np.float32).reshape(3, 4)
    prog = [Instr("dma.load", shape=(1, 3, 4), dst=Block(IN, 0, "float32", (0, 6, 1)),
                  src=Block(0, 0, "float32", (0, 4, 1)), pad_lo=(0, 1, 1), pad_hi=(0, 1, 1),
                  fill=-1.5)]
    sim, _, rep = _run(prog, x)
    ref = np.pad(x, 1, constant_values=-1.5)
    np.testing.assert_array_equal(_read(sim, IN, 0, np.float32, 30).reshape(5, 6), ref)
    dram = CFG.memory("dram")
    n = 1 << 14
    _, _, rep = _run([Instr("dma.load", shape=(1, 1, n), dst=Block(IN, 0, "int8", (0, 0, 1)),
                            src=Block(0, 0, "int8", (0, 0, 1)), pad_lo=(0, 0, 0),
                            pad_hi=(0, 0, 0), fill=0)], np.zeros(n, np.int8))
    data = n / dram.bandwidth
    assert data <= rep.cycles <= data + CFG.dma_latency + 200
    assert rep.dram_read == n


def test_missing_token_is_a_hazard_and_bad_operands_are_named():
    prog = _load(IN, 0, "float32", 64)[:1] + [
        Instr("vrelu", shape=(1, 1, 64), dst=Block(ACC, 0, "float32", (0, 0, 1)),
              a=Block(IN, 0, "float32", (0, 0, 1)))]
    with pytest.raises(SimulationError, match="hazard"):
        _run(prog, np.zeros(64, np.float32))
    bad = [Instr("mma.set", shape=(1, 16, 16, 16), c=Block(ACC, 0, "float32", (0, 16, 1)),
                 a=Block(WT, 0, "float16", (0, 16, 1)), b=Block(WT, 0, "float16", (16, 1, 0)))]
    with pytest.raises(SimulationError, match="L0 input"):
        _run(bad)


@pytest.mark.parametrize("hw", ["default", "edge"])
def test_compiled_programs_round_trip_through_encoding_and_assembly(hw, tmp_path):
    model = models.small_cnn(batch=1, channels=8, size=8)
    exe = kiln.build(model.mod, target=f"npu -hw={hw}")
    prog = exe.steps[0].program
    again = Program.from_bytes(prog.to_bytes())
    assert again.streams == prog.streams and again.labels == prog.labels
    assert assemble_program(prog.assembly()) == prog.streams
    ops = prog.op_counts()
    assert {"dma.load", "dma.store", "mma.set", "vadd", "vmax", "tok.push", "tok.pop",
            "barrier"} <= set(ops)
    out = exe(*model.inputs, trace=True)
    assert np.isfinite(out).all()
    rep = exe.last_reports[0]
    trace = chrome_trace(rep, str(tmp_path / "t.json"))
    assert json.loads((tmp_path / "t.json").read_text()) == trace
    data_ops = {k: v for k, v in ops.items() if k not in ("tok.push", "tok.pop", "barrier")}
    traced = [e["name"] for e in trace["traceEvents"] if e.get("ph") == "X"]
    assert {k: traced.count(k) for k in data_ops} == data_ops
    timeline_png(rep, str(tmp_path / "t.png"))
    assert (tmp_path / "t.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_config_errors_name_the_key(tmp_path):
    text = (load_config("edge").path and open(load_config("edge").path).read())
    bad = tmp_path / "bad.toml"
    bad.write_text(text.replace('size = "32 KiB"', 'size = "32 parsecs"', 1))
    with pytest.raises(ConfigError, match="size"):
        load_config(str(bad))
