"""Feedback instead of failure (kiln/schedule/npu/feedback.py): when a later check refuses the
planner's tiling -- the TIR program generator's slot and accumulator counts, an instruction
field the encoding cannot hold -- the lowering takes the planner's next candidate, undoes what
the refused attempt emitted, and records why in ``exe.describe()``; only when every candidate
is refused does the product leave the NPU. Each path forced by putting an infeasible tiling
first in the planner's ranking; results checked against numpy."""

from __future__ import annotations

import numpy as np
import pytest

import kiln
from kiln import graph as g
from kiln import op
from kiln.codegen.npu import LOWERING_KEY
from kiln.npu.isa import Block, Instr, IsaError
from kiln.schedule.npu import feedback, gemm
from kiln.schedule.npu.gemm import GemmTiling
from kiln.testing.op_testing import graph_module
from kiln.transform import PassContext

RNG = np.random.default_rng(23)


def _first(monkeypatch, bad: GemmTiling, only: bool = False) -> None:
    """The planner ranks ``bad`` first (alone with ``only``)."""
    real = gemm.feasible_tilings
    monkeypatch.setattr(gemm, "feasible_tilings",
                        lambda *a, **k: [bad] + ([] if only else real(*a, **k)))


def _dense(m, k, n, route="tir"):
    x = RNG.standard_normal((m, k)).astype(np.float32)
    w = (RNG.standard_normal((n, k)) / np.sqrt(k)).astype(np.float32)
    with PassContext(config={LOWERING_KEY: route}):
        exe = kiln.build(graph_module(lambda a, b: op.dense(a, b), [(m, k), (n, k)]),
                         target="npu")
    return exe, x, w


def _check(exe, x, w, refused: str) -> None:
    assert exe.cpu_ops == []
    np.testing.assert_allclose(exe(x, w), x @ w.T, rtol=2e-2, atol=2e-2)
    (kernel,) = [k for k in exe.kernels if k.op == "dense"]
    assert "feedback: 1 refused" in kernel.tiling and refused in kernel.tiling
    assert "feedback: 1 refused" in exe.describe()


def test_slots_exceeding_input_take_the_next_candidate(monkeypatch):
    # a 256 x 1024 fp16 A tile: 512 KiB in a 256 KiB input buffer
    _first(monkeypatch, GemmTiling(256, 32, 1024, 0.0, False))
    exe, x, w = _dense(256, 1024, 32)
    _check(exe, x, w, "exceed input")


def test_accumulators_exceeding_acc_take_the_next_candidate(monkeypatch):
    # a 256 x 512 float32 accumulator tile: 512 KiB in a 256 KiB acc
    _first(monkeypatch, GemmTiling(256, 512, 16, 0.0, False))
    exe, x, w = _dense(256, 64, 512)
    _check(exe, x, w, "exceed acc")


@pytest.fixture
def mma_refused_once(monkeypatch):
    """Each lowering's first attempt refused as if an mma's extent did not fit its instruction
    field: the real check, with an encoder that says so once per lowering context (the
    probes' and the build's)."""
    real_encode, real_check = feedback.encode, feedback.check_encodable
    real_within = feedback.within_fields
    refused: list[object] = []

    def too_wide(instr, cfg):
        if instr.op.startswith("mma"):
            raise IsaError(f"{instr.op} shape: {instr.args['shape']} exceeds the field")
        return real_encode(instr, cfg)

    def check(ctx, lens):
        if not any(c is ctx for c in refused):
            refused.append(ctx)
            with monkeypatch.context() as m:
                m.setattr(feedback, "encode", too_wide)
                m.setattr(feedback, "within_fields",
                          lambda i, c: not i.op.startswith("mma") and real_within(i, c))
                real_check(ctx, lens)
        real_check(ctx, lens)

    monkeypatch.setattr(feedback, "check_encodable", check)


@pytest.mark.parametrize("route", ["tir", "emit"])
def test_instruction_field_limit_takes_the_next_candidate(mma_refused_once, route):
    exe, x, w = _dense(64, 64, 48, route)
    assert exe.cpu_ops == []
    np.testing.assert_allclose(exe(x, w), x @ w.T, rtol=2e-2, atol=2e-2)
    (kernel,) = [k for k in exe.kernels if k.op == "dense"]
    assert "instruction field limit" in kernel.tiling, kernel.tiling


def test_convolution_takes_the_next_candidate(mma_refused_once):
    x = RNG.standard_normal((1, 8, 10, 10)).astype(np.float32)
    w = (RNG.standard_normal((16, 8, 3, 3)) / 8).astype(np.float32)
    exe = kiln.build(graph_module(lambda a: op.nn.conv2d(a, g.const(w), padding=(1, 1)),
                                  [x.shape]), target="npu")
    assert exe.cpu_ops == []
    (kernel,) = [k for k in exe.kernels if k.op == "nn.conv2d"]
    assert kernel.tiling.startswith("TIR: ") and "feedback: 1 refused" in kernel.tiling
    ref = torch_free_conv(x, w)
    np.testing.assert_allclose(exe(x), ref, rtol=2e-2, atol=2e-2)


def torch_free_conv(x: np.ndarray, w: np.ndarray) -> np.ndarray:
    """A 3x3, padding-1 NCHW convolution in numpy."""
    xp = np.pad(x, ((0, 0), (0, 0), (1, 1), (1, 1)))
    h, wd = x.shape[2:]
    out = np.zeros((x.shape[0], w.shape[0], h, wd), np.float64)
    for i in range(3):
        for j in range(3):
            out += np.einsum("nchw,oc->nohw", xp[:, :, i:i + h, j:j + wd], w[:, :, i, j])
    return out


def test_quick_field_test_agrees_with_the_encoder():
    """Instructions of a real kernel pass the quick test; a stride past the field fails it and
    the encoder (which the quick test defers to) refuses it."""
    exe, _, _ = _dense(64, 64, 48)
    prog = [s.program for s in exe.steps if hasattr(s, "program")][-1]
    instrs = [i for st in prog.streams for i in st]
    limits = feedback.field_limits(exe.config)
    assert instrs and all(feedback.within_fields(i, limits) for i in instrs)
    mma = next(i for i in instrs if i.op.startswith("mma"))
    big = exe.config.encoding.max_stride + 1
    (name, blk), = [(k, v) for k, v in mma.args.items() if isinstance(v, Block)][:1]
    wide = Instr(mma.op, **{**mma.args, name: blk._replace(strides=(big, 1, 1))})
    assert not feedback.within_fields(wide, limits)
    with pytest.raises(IsaError):
        feedback.encode(wide, exe.config)


def test_every_candidate_refused_sends_the_product_to_the_cpu(monkeypatch):
    _first(monkeypatch, GemmTiling(256, 32, 1024, 0.0, False), only=True)
    exe, x, w = _dense(256, 1024, 32)
    assert exe.cpu_ops == ["dense"]
    np.testing.assert_allclose(exe(x, w), x @ w.T, rtol=1e-4, atol=1e-4)


def test_refused_attempt_is_rolled_back(monkeypatch):
    """A refused attempt's instructions, kernels and allocations are gone: the kernel list and
    DRAM use are the unforced build's."""
    plain, _, _ = _dense(256, 1024, 32)
    _first(monkeypatch, GemmTiling(256, 32, 1024, 0.0, False))
    forced, _, _ = _dense(256, 1024, 32)
    assert [k.label for k in forced.kernels] == [k.label for k in plain.kernels]
    assert forced.dram_bytes == plain.dram_bytes
    assert [k.tiling.split(" [feedback")[0] for k in forced.kernels] == \
        [k.tiling for k in plain.kernels]


def test_a_refused_tiling_under_a_fused_epilogue_is_undone_with_it(monkeypatch):
    """A dense whose bias and relu run on its accumulator tiles (the fused epilogue) and
    whose first tiling the program generator refuses half-way: the retry starts from the
    epilogue's state at the checkpoint (its tile and store counts, its operand loads), so the
    tokens pair up, the kernel stays fused and gives the unfused build's bits."""
    m, k, n = 256, 1024, 32
    _first(monkeypatch, GemmTiling(256, 32, 1024, 0.0, False))
    x = RNG.standard_normal((m, k)).astype(np.float32)
    w = (RNG.standard_normal((n, k)) / np.sqrt(k)).astype(np.float32)
    b = RNG.standard_normal(n).astype(np.float32)

    def fn(a):
        return op.nn.relu(op.add(op.dense(a, g.const(w)), g.const(b)))

    outs = []
    for fuse in (True, False):
        with PassContext(config={"npu.fuse_epilogue": fuse}):
            exe = kiln.build(graph_module(fn, [(m, k)]), target="npu")
        (kernel,) = [kk for kk in exe.kernels if kk.op == "matmul"]  # (dense: W^T constant)
        assert "feedback: 1 refused" in kernel.tiling
        assert ("+add+relu" in kernel.label) == fuse
        outs.append(exe(x))
    np.testing.assert_array_equal(outs[0], outs[1])
    np.testing.assert_allclose(outs[0], np.maximum(x @ w.T + b, 0), rtol=2e-2, atol=2e-2)
