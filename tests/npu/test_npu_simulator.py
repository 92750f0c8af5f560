"""The NPU foundation: instructions against numpy, the encoding and the assembler round-tripping
compiled programs, timing from the description, timelines."""

import json
import math

import ml_dtypes
import numpy as np
import pytest

import kiln
from kiln.npu import Block, Instr, Machine, Program, SimulationError, Simulator
from kiln.npu.asm import assemble_program
from kiln.npu.isa import UNIT_DMA_IN, UNIT_VECTOR
from kiln.npu.timeline import chrome_trace, timeline_png
from kiln.target.npu import ConfigError, load_config
from kiln.target.npu.config import config_from_dict
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


# ---------------------------------------------------------------------------------------------
# compare/select, shifts, fixed-point multiply, bfloat16, the scalar unit
# ---------------------------------------------------------------------------------------------
def _vec(op, n, dst, **args):
    return [Instr(op, shape=(1, 1, n), dst=dst, **args)] + _fence(UNIT_VECTOR)


def _blk(mem, dtype, addr=0):
    return Block(mem, addr, dtype, (0, 0, 1))


def test_vcmp_and_vsel_select_element_by_element():
    rng = np.random.default_rng(20)
    a = rng.standard_normal(193).astype(np.float32)
    b = rng.standard_normal(193).astype(np.float32)
    b[:5] = a[:5]  # ties
    f32 = "float32"
    for cond, fn in (("lt", np.less), ("le", np.less_equal), ("eq", np.equal),
                     ("ne", np.not_equal), ("gt", np.greater), ("ge", np.greater_equal)):
        prog = _load(IN, 0, f32, 193) + _load(WT, 0, f32, 193, 193 * 4) + \
            _vec("vcmp", 193, _blk(ACC, "int8"), cond=cond, a=_blk(IN, f32), b=_blk(WT, f32)) + \
            _vec("vsel", 193, _blk(ACC, f32, 256), mask=_blk(ACC, "int8"), a=_blk(IN, f32),
                 b=-1.5)
        sim, _, _ = _run(prog, np.concatenate([a, b]).view(np.uint8))
        mask = fn(a, b)
        np.testing.assert_array_equal(_read(sim, ACC, 0, np.int8, 193), mask.astype(np.int8))
        np.testing.assert_array_equal(_read(sim, ACC, 256, np.float32, 193),
                                      np.where(mask, a, np.float32(-1.5)))
    x = np.array([-128, -1, 0, 1, 127], np.int8)  # an integer compare against an immediate
    prog = _load(IN, 0, "int8", 5) + _vec("vcmp", 5, _blk(ACC, "uint8"), cond="ge",
                                          a=_blk(IN, "int8"), b=0)
    sim, _, _ = _run(prog, x.view(np.uint8))
    np.testing.assert_array_equal(_read(sim, ACC, 0, np.uint8, 5), [0, 0, 1, 1, 1])
    with pytest.raises(SimulationError, match="vcmp writes an int8/uint8 mask"):
        _run(_load(IN, 0, f32, 4) + _vec("vcmp", 4, _blk(ACC, f32), cond="lt", a=_blk(IN, f32),
                                         b=0.0), np.zeros(16, np.uint8))


def test_vshr_rounds_half_up_and_vshl_saturates():
    rng = np.random.default_rng(21)
    x = np.concatenate([rng.integers(-2 ** 31, 2 ** 31, 250), [-12, -4, 4, 12, 2 ** 31 - 1,
                                                               -2 ** 31]]).astype(np.int32)
    n = x.size
    for rnd in (0, 1):
        for s in (0, 1, 3, 31):
            prog = _load(IN, 0, "int32", n) + _vec("vshr", n, _blk(ACC, "int32"),
                                                   a=_blk(IN, "int32"), b=s, round=rnd)
            sim, _, _ = _run(prog, x.view(np.uint8))
            # Python ints: exact floor division, half an LSB added first when rounding
            ref = [(int(v) + (rnd << (s - 1) if s else 0)) >> s for v in x]
            ref = np.clip(ref, -2 ** 31, 2 ** 31 - 1)
            np.testing.assert_array_equal(_read(sim, ACC, 0, np.int32, n), ref)
    y = np.array([1, -1, 3, -3, 64, -65, 0], np.int8)
    prog = _load(IN, 0, "int8", 7) + _vec("vshl", 7, _blk(ACC, "int8"), a=_blk(IN, "int8"), b=1)
    sim, _, _ = _run(prog, y.view(np.uint8))
    np.testing.assert_array_equal(_read(sim, ACC, 0, np.int8, 7), [2, -2, 6, -6, 127, -128, 0])
    with pytest.raises(SimulationError, match="shift amounts must be in 0..63"):
        _run(_load(IN, 0, "int8", 4) + _vec("vshr", 4, _blk(ACC, "int8"), a=_blk(IN, "int8"),
                                            b=64, round=0), np.zeros(16, np.uint8))


def test_vqmul_is_the_rounded_exact_product():
    rng = np.random.default_rng(22)
    a = np.concatenate([rng.integers(-2 ** 31, 2 ** 31, 125), [-2 ** 31, -2 ** 31, 2 ** 31 - 1]])
    b = np.concatenate([rng.integers(-2 ** 31, 2 ** 31, 125), [-2 ** 31, 2 ** 31 - 1, 1]])
    a, b = a.astype(np.int32), b.astype(np.int32)
    for shift in (0, 1, 17, 31, 63):
        prog = _load(IN, 0, "int32", 128) + _load(WT, 0, "int32", 128, 512) + \
            _vec("vqmul", 128, _blk(ACC, "int32"), a=_blk(IN, "int32"), b=_blk(WT, "int32"),
                 shift=shift)
        sim, _, _ = _run(prog, np.concatenate([a, b]).view(np.uint8))
        ref = [(int(p) * int(q) + ((1 << (shift - 1)) if shift else 0)) >> shift
               for p, q in zip(a, b)]
        np.testing.assert_array_equal(_read(sim, ACC, 0, np.int32, 128),
                                      np.clip(ref, -2 ** 31, 2 ** 31 - 1))


def _bf16_rne(x):
    """float32 -> bfloat16 bits, round to nearest even on the raw bits (NaN stays NaN)."""
    bits = x.view(np.uint32).astype(np.uint64)
    rounded = ((bits + 0x7FFF + ((bits >> 16) & 1)) >> 16).astype(np.uint16)
    return np.where(np.isnan(x), (bits >> 16).astype(np.uint16) | 0x40, rounded)


def test_bfloat16_casts_round_to_nearest_even():
    rng = np.random.default_rng(23)
    one = np.float32(1.0).view(np.uint32)
    ties = np.array([one + 0x8000, one + 0x18000, one + 0x7FFF, one + 0x8001],
                    np.uint32).view(np.float32)  # halfway cases both ways, just below/above
    x = np.concatenate([rng.standard_normal(120).astype(np.float32) * 1e3, ties,
                        np.array([3.3961776e38, -3.4e38, 1e-40, -0.0, np.inf], np.float32)])
    n = x.size
    prog = _load(IN, 0, "float32", n) + _vec("vcast", n, _blk(ACC, "bfloat16"), mode="rne",
                                             a=_blk(IN, "float32")) + \
        _vec("vcast", n, _blk(ACC, "float32", 1024), mode="rne", a=_blk(ACC, "bfloat16"))
    sim, _, _ = _run(prog, x.view(np.uint8))
    got = _read(sim, ACC, 0, np.uint16, n)
    np.testing.assert_array_equal(got, _bf16_rne(x))
    assert got[120] == 0x3F80 and got[121] == 0x3F82  # ties to even
    back = _read(sim, ACC, 1024, np.float32, n)
    np.testing.assert_array_equal(back, (_bf16_rne(x).astype(np.uint32) << 16).view(np.float32))
    assert np.isinf(back[124]) and back[124] > 0  # rounds past the largest bfloat16


def test_scalar_unit_loops_converts_and_stores():
    """sum(1..n) by a counted loop, its float conversion, int32 wrap-around, and stores into
    L0 read back by a DMA; a division by zero is named."""
    n = 1000
    prog = [Instr("s.li", dtype="int32", rd=1, value=0),            # acc
            Instr("s.li", dtype="int32", rd=2, value=1),            # i
            Instr("s.li", dtype="int32", rd=3, value=n + 1),
            Instr("s.alu", fn="add", dtype="int32", rd=1, rs1=1, rs2=2),
            Instr("s.alui", fn="add", dtype="int32", rd=2, rs1=2, value=1),
            Instr("s.br", cond="lt", rs1=2, rs2=3, target=-2),
            Instr("s.li", dtype="int64", rd=4, value=0),            # base address
            Instr("s.st", dtype="int32", rs=1, mem=ACC, base=4, offset=0),
            Instr("s.cvt", mode="rne", to="float32", **{"from": "int32"}, rd=5, rs=1),
            Instr("s.alui", fn="div", dtype="float32", rd=5, rs1=5, value=8.0),
            Instr("s.st", dtype="float32", rs=5, mem=ACC, base=4, offset=4),
            Instr("s.li", dtype="int32", rd=6, value=2 ** 31 - 1),
            Instr("s.alui", fn="add", dtype="int32", rd=6, rs1=6, value=1),
            Instr("s.st", dtype="int32", rs=6, mem=ACC, base=4, offset=8),
            Instr("s.ld", dtype="int32", rd=7, mem=ACC, base=4, offset=0),
            Instr("s.alui", fn="rem", dtype="int32", rd=7, rs1=7, value=7),
            Instr("s.st", dtype="int32", rs=7, mem=ACC, base=4, offset=12)]
    sim, _, rep = _run(prog)
    total = n * (n + 1) // 2
    np.testing.assert_array_equal(_read(sim, ACC, 0, np.int32, 1), [total])
    np.testing.assert_allclose(_read(sim, ACC, 4, np.float32, 1), [total / 8], rtol=1e-6)
    np.testing.assert_array_equal(_read(sim, ACC, 8, np.int32, 2), [-2 ** 31, total % 7])
    assert rep.cycles >= 3 * n * CFG.scalar_latency  # the loop's instructions, one by one
    with pytest.raises(SimulationError, match="division by zero"):
        _run([Instr("s.li", dtype="int32", rd=1, value=3),
              Instr("s.alui", fn="div", dtype="int32", rd=1, rs1=1, value=0)])
    with pytest.raises(SimulationError, match="outside the scalar program"):
        _run([Instr("s.jmp", target=5)])


# ---------------------------------------------------------------------------------------------
# s.fn: the scalar unit's float functions
# ---------------------------------------------------------------------------------------------
_EDGES = [0.0, -0.0, 0.5, -0.5, 1.5, 2.5, -2.5, 1.0, -1.0, 1e-30, 100.0, -100.0, 7e4,
          np.inf, -np.inf, np.nan]
_REF64 = {"exp": np.exp, "log": np.log, "sqrt": np.sqrt, "rsqrt": lambda v: 1 / np.sqrt(v),
          "sin": np.sin, "cos": np.cos, "tanh": np.tanh,
          "erf": np.vectorize(math.erf, otypes=[np.float64]), "floor": np.floor,
          "ceil": np.ceil, "round": np.rint}


def _sfn_loop(fn, dtype, n, out_addr):
    """out[i] = fn(x[i]) for the n elements at DRAM 0, by a scalar loop."""
    isz = np.dtype(ml_dtypes.bfloat16 if dtype == "bfloat16" else dtype).itemsize
    return [Instr("s.li", dtype="int64", rd=1, value=0),
            Instr("s.li", dtype="int64", rd=2, value=n * isz),
            Instr("s.ld", dtype=dtype, rd=3, mem=0, base=1, offset=0),
            Instr("s.fn", fn=fn, dtype=dtype, rd=4, rs=3),
            Instr("s.st", dtype=dtype, rs=4, mem=0, base=1, offset=out_addr),
            Instr("s.alui", fn="add", dtype="int64", rd=1, rs1=1, value=isz),
            Instr("s.br", cond="lt", rs1=1, rs2=2, target=-4)]


@pytest.mark.parametrize("dtype", ["float32", "float16", "bfloat16"])
@pytest.mark.parametrize("fn", sorted(_REF64))
def test_scalar_functions_match_numpy(fn, dtype):
    """s.fn = the float64 function of the float32 value, rounded to float32, then to the
    register's dtype; random operands and edge values (signed zeros, ties, overflow, inf,
    NaN, out of the domain); cycles from the description; round trips the encoding."""
    npdt = ml_dtypes.bfloat16 if dtype == "bfloat16" else np.dtype(dtype)
    rng = np.random.default_rng(len(fn))
    prog = _sfn_loop(fn, dtype, 48 + len(_EDGES), 4096)
    with np.errstate(all="ignore"):  # 7e4 overflows float16
        x = np.concatenate([rng.standard_normal(48) * 4, _EDGES]).astype(np.float32).astype(npdt)
        ref = _REF64[fn](x.astype(np.float64)).astype(np.float32).astype(npdt)
    sim, m, rep = _run(prog, dram=x.view(np.uint8))
    got = m.read(4096, (x.size,), npdt)
    np.testing.assert_array_equal(got.view(np.uint16 if x.itemsize == 2 else np.uint32),
                                  ref.view(np.uint16 if x.itemsize == 2 else np.uint32))
    assert rep.cycles >= x.size * CFG.scalar_function_latency
    p = Program(CFG, [prog, []])
    assert Program.from_bytes(p.to_bytes()).streams == p.streams
    assert assemble_program(p.assembly()) == p.streams


def test_scalar_functions_follow_the_description():
    """A description whose scalar unit lists no functions refuses s.fn; s.fn on an integer
    register and an unknown function are named."""
    raw = {k: (dict(v) if isinstance(v, dict) else v) for k, v in CFG.raw.items()}
    raw["scalar"]["functions"] = ["exp"]
    small = config_from_dict(raw, "no-log")
    assert small.scalar_functions == ("exp",)
    x = np.ones(4, np.float32)
    with pytest.raises(SimulationError, match="has no log"):
        _run(_sfn_loop("log", "float32", 4, 64), dram=x.view(np.uint8), cfg=small)
    with pytest.raises(SimulationError, match="on floats"):
        _run([Instr("s.li", dtype="int32", rd=1, value=3),
              Instr("s.fn", fn="exp", dtype="int32", rd=2, rs=1)])
    raw["scalar"]["functions"] = ["exp", "cbrt"]
    with pytest.raises(ConfigError, match="scalar.functions"):
        config_from_dict(raw, "bad")


def test_scalar_copy_moves_bytes_between_register_addresses():
    """s.copy: nbytes from DRAM[rs + src] to DRAM[rd + dst] (a DMA the scalar unit waits
    for: at least the DRAM latency and both sides' bursts); overlap and out-of-range refused."""
    data = np.arange(256, dtype=np.uint8)
    prog = [Instr("s.li", dtype="int64", rd=1, value=40),
            Instr("s.li", dtype="int64", rd=2, value=1000),
            Instr("s.copy", rd=2, dst=24, rs=1, src=3, nbytes=100)]
    sim, m, rep = _run(prog, dram=data)
    np.testing.assert_array_equal(m.read(1024, (100,), np.uint8), data[43:143])
    dram = CFG.memory("dram")
    assert rep.cycles >= dram.latency + 2 * 100 / dram.bandwidth
    assert rep.dram_read == rep.dram_written == 100
    p = Program(CFG, [prog, []])
    assert Program.from_bytes(p.to_bytes()).streams == p.streams
    assert assemble_program(p.assembly()) == p.streams
    with pytest.raises(SimulationError, match="overlap"):
        _run([Instr("s.li", dtype="int64", rd=1, value=0),
              Instr("s.copy", rd=1, dst=10, rs=1, src=0, nbytes=20)], dram=data)
    with pytest.raises(SimulationError, match="reaches bytes"):
        _run([Instr("s.li", dtype="int64", rd=1, value=1 << 16),
              Instr("s.copy", rd=1, dst=0, rs=1, src=-64, nbytes=128)], dram=data)


def test_per_phase_totals_split_the_run():
    """Report.phase_bytes / phase_busy split the run's DRAM bus bytes and each unit's busy
    cycles over the kernels (phases between barriers), and a phase's bytes are what its
    own DMAs moved in whole bursts -- what the benchmark's 'real x' is computed from."""
    cfg = load_config("edge")
    burst = cfg.memory("dram").burst
    n = 100  # float32: 400 bytes, 13 bursts of 32 from an aligned address
    stream = [*_load(IN, 0, "float32", n), Instr("barrier", id=1),
              *_load(IN, 0, "float32", n), *_load(WT, 0, "float32", n),
              Instr("barrier", id=2)]
    rep = Simulator(cfg, Machine(cfg, 4096)).run(Program(cfg, [stream], {1: "one", 2: "two"}))
    one = -(-n * 4 // burst) * burst
    assert rep.phase_bytes == {"one": one, "two": 2 * one}
    assert sum(rep.phase_bytes.values()) == rep.dram_burst_bytes
    for key, stats in rep.units.items():
        assert sum(p.get(key, 0.0) for p in rep.phase_busy.values()) == pytest.approx(stats.busy)
    assert rep.phase_busy["two"][(0, "dma_in")] > rep.phase_busy["one"][(0, "dma_in")] > 0


# ---- bank groups: conflicts between units (issue 23) -----------------------------------------
def _grouped_config(groups: int | None, ports: int = 1):
    """The default description with L0 input in ``groups`` bank groups (None: the key absent)
    of ``ports`` ports."""
    raw = json.loads(json.dumps(CFG.raw))
    table = raw["l0"]["input"]
    table["ports"] = ports
    table.pop("bank_groups", None)
    if groups is not None:
        table["bank_groups"] = groups
    return config_from_dict(raw, f"default_g{groups}_p{ports}.toml")


def _dma_and_vector(vector_addr: int):
    """DMA-in loads 8 KiB into L0 input at 0 (its data phase: cycles [8, 136)) while the
    vector unit, with no token between them, reads 8 KiB of L0 input at ``vector_addr``
    (32 cycles from cycle 0)."""
    n = 2048
    return [Instr("dma.load", shape=(1, 1, n), dst=Block(IN, 0, "float32", (0, 0, 1)),
                  src=Block(0, 0, "float32", (0, 0, 1)), pad_lo=(0, 0, 0), pad_hi=(0, 0, 0),
                  fill=0),
            Instr("vmov", shape=(1, 1, n), dst=Block(ACC, 0, "float32", (0, 0, 1)),
                  a=Block(IN, vector_addr, "float32", (0, 0, 1)))]


def test_two_units_on_one_bank_group_share_its_port():
    """With one port, the later-issued instruction (the vector unit's, issued after the DMA
    at the same cycle) is stretched by its overlap with the DMA's data phase: 32 cycles from
    0 against [8, 136) overlap 24. Another group, two ports, or one group: no stretch."""
    vector_cycles = math.ceil(2048 * 4 / CFG.vector_width)
    dma_start = CFG.dma_latency
    overlap = vector_cycles - dma_start
    cfg = _grouped_config(4)
    group = cfg.memory("input").group_bytes
    assert group == CFG.memory("input").size // 4
    _, _, same = _run(_dma_and_vector(8192), cfg=cfg)
    assert same.units[(0, "vector")].busy == vector_cycles + overlap
    assert same.conflict_cycles == {"input": overlap}
    assert same.phase_conflicts["tail"] == {"input": overlap}
    assert "bank-group conflicts: 24 cycles" in same.summary()
    _, _, apart = _run(_dma_and_vector(group), cfg=cfg)
    _, _, two_ports = _run(_dma_and_vector(8192), cfg=_grouped_config(4, ports=2))
    _, _, one_group = _run(_dma_and_vector(8192), cfg=_grouped_config(1))
    _, _, absent = _run(_dma_and_vector(8192), cfg=_grouped_config(None))
    for rep in (apart, two_ports, one_group, absent):
        assert rep.units[(0, "vector")].busy == vector_cycles
        assert rep.conflict_cycles == {}
        assert rep.cycles == absent.cycles
    assert same.cycles == absent.cycles  # the DMA, issued first, is the critical path


def test_bank_groups_must_divide_the_memory_into_whole_bank_lines():
    raw = json.loads(json.dumps(CFG.raw))
    raw["l0"]["acc"]["bank_groups"] = 3
    with pytest.raises(ConfigError, match=r"l0\.acc.*bank_groups"):
        config_from_dict(raw, "bad.toml")
    raw["l0"]["acc"]["bank_groups"] = 0
    with pytest.raises(ConfigError, match="bank_groups"):
        config_from_dict(raw, "bad.toml")


def test_timing_only_replay_gives_the_full_runs_timing():
    """The replay the bank placement analyses: no data work, the same cycles, busy totals and
    conflicts as the full simulation of a compiled model."""
    cfg = load_config("edge")
    m = models.small_cnn(batch=1, channels=8, size=16)
    exe = kiln.build(m.mod, target="npu -hw=edge")
    exe(*m.inputs)
    for step, full in zip([s for s in exe.steps if hasattr(s, "program")], exe.last_reports):
        rep = Simulator(cfg, Machine(cfg, exe.dram_bytes), timing_only=True).run(step.program)
        assert rep.cycles == full.cycles
        assert rep.conflict_cycles == full.conflict_cycles
        assert {k: s.busy for k, s in rep.units.items()} == \
            {k: s.busy for k, s in full.units.items()}
