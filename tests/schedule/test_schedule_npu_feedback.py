"""Feedback instead of failure (kiln/schedule/npu/feedback.py): when a later check refuses the
planner's tiling -- the TIR program generator's slot and accumulator counts, an instruction
field the encoding cannot hold -- the lowering takes the planner's next candidate, undoes what
the refused attempt emitted, and records why in ``exe.describe()``; only when every candidate
is refused does the product leave the NPU. Each path forced by putting an infeasible tiling
first in the planner's ranking; results checked against numpy. The vector unit's planners
(element-wise forms, pooling blocks) offer ranked candidates too, and take the next when a
block does not fit."""

from __future__ import annotations

from dataclasses import replace

import numpy as np
import pytest

import kiln
from kiln import graph as g
from kiln import op
from kiln.build import npu_pipeline
from kiln.codegen.npu import LOWERING_KEY, build_npu
from kiln.codegen.npu import compile as npu_compile
from kiln.codegen.npu.compile import CHOOSE_ACC_SLOTS_KEY
from kiln.npu.isa import Block, Instr, IsaError
from kiln.schedule.npu import feedback, gemm, isel, tir_pool, vector
from kiln.schedule.npu.emit import MEM_ID, DramTensor
from kiln.schedule.npu.gemm import GemmTiling
from kiln.schedule.npu.nest_analysis import analyse_elementwise
from kiln.schedule.npu.vector import VecStep
from kiln.target.npu import load_config
from kiln.testing.models import conv_residual_relu
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
    """Each lowering's first product attempt refused as if an mma's extent did not fit its
    instruction field: the real check, with an encoder that says so once per lowering context (the
    probes' and the build's)."""
    real_encode, real_check = feedback.encode, feedback.check_encodable
    real_within = feedback.within_fields
    refused: list[object] = []

    def too_wide(instr, cfg):
        if instr.op.startswith("mma"):
            raise IsaError(f"{instr.op} shape: {instr.args['shape']} exceeds the field")
        return real_encode(instr, cfg)

    def check(ctx, lens):
        # (the element-wise kernels -- a product's operand cast -- are checked too: only an
        # attempt that emitted an mma is refused)
        mma = any(i.op.startswith("mma") for st, n in zip(ctx.kb.streams, lens)
                  for i in st[n:])
        if mma and not any(c is ctx for c in refused):
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


# ---- the vector unit's planners: candidate blocks, the feedback path forced ----------------
def test_elementwise_planner_offers_ranked_forms():
    """select_forms: select_form's choice first, then other legal forms cheapest first, at
    most FORM_CANDIDATES; plan_elementwise_candidates carries them as plans."""
    cfg = load_config("default")
    out = DramTensor(0, (64, 48, 40), "float32")
    ins = [DramTensor(0, (64, 48, 40), "float32"), DramTensor(0, (48, 1), "float32")]
    nest = analyse_elementwise(cfg, out, ins, "float32", ("vadd",))
    sels = isel.select_forms(cfg, 2, nest)
    assert sels[0] == isel.select_form(cfg, 2, nest)
    assert 2 <= len(sels) <= isel.FORM_CANDIDATES
    assert [s.estimate for s in sels[1:]] == sorted(s.estimate for s in sels[1:])
    assert len({s.form for s in sels}) == len(sels)
    assert all(isel.check_form(cfg, 2, nest, s.form) is None for s in sels)
    plans = vector.plan_elementwise_candidates(cfg, 2, out, ins, "float32",
                                               [VecStep("vadd", (("in", 0), ("in", 1)))])
    assert [p.tile for p in plans] == [s.form.tile for s in sels]
    assert plans[0] == vector.plan_elementwise(cfg, 2, out, ins, "float32",
                                               [VecStep("vadd", (("in", 0), ("in", 1)))])


def test_pooling_planner_offers_ranked_blocks():
    """pool2d_blocks: plan_pool2d's block first, then smaller ones by the cost model."""
    cfg = load_config("default")
    args = (cfg, 2, (1, 32, 64, 64), (1, 32, 32, 32), "float32", (2, 2), (2, 2),
            (0, 0, 0, 0), (1, 1), False, False)
    blocks = vector.pool2d_blocks(*args)
    assert blocks[0] == vector.plan_pool2d(*args)
    assert 2 <= len(blocks) <= vector.POOL_CANDIDATES and len(set(blocks)) == len(blocks)
    ct, rt, wp = blocks[0]
    assert all(c <= ct and r <= rt and w == wp for c, r, w in blocks[1:])
    costs = [vector.pool_block_cost(cfg, 2, *args[2:7], args[8], False, c, r)
             for c, r, _ in blocks[1:]]
    assert costs == sorted(costs)


def _whole_block_first(monkeypatch):
    """The element-wise planner ranks first a form whose block is the whole (collapsed)
    tensor: its slots do not fit L0."""
    real = vector.select_forms

    def forms(cfg, nbuf, nest):
        sels = real(cfg, nbuf, nest)
        f = sels[0].form
        return [replace(sels[0], form=replace(f, tile=tuple(f.dims[-3:])))] + sels

    monkeypatch.setattr(vector, "select_forms", forms)


@pytest.mark.parametrize("route", ["tir", "emit"])
def test_elementwise_block_that_does_not_fit_takes_the_next(monkeypatch, route):
    _whole_block_first(monkeypatch)
    a, b = (RNG.standard_normal((256, 1024)).astype(np.float32) for _ in range(2))
    with PassContext(config={LOWERING_KEY: route}):
        exe = kiln.build(graph_module(lambda x, y: op.add(x, y), [a.shape, b.shape]),
                         target="npu")
    assert exe.cpu_ops == []
    (kernel,) = [k for k in exe.kernels if k.op == "add"]
    assert "feedback: 1 refused" in kernel.tiling and "block (1, 1, 262144)" in kernel.tiling
    assert ("exceed" if route == "tir" else "more than") in kernel.tiling, kernel.tiling
    np.testing.assert_array_equal(exe(a, b), a + b)


@pytest.mark.parametrize("route", ["tir", "emit"])
def test_pooling_block_that_does_not_fit_takes_the_next(monkeypatch, route):
    """A max pooling whose first block (every channel and output row: 2 x 512 KiB of input
    rows) the kernel builder refuses takes the planner's next block."""
    real = vector.pool2d_blocks

    def blocks(cfg, nbuf, x_shape, out_shape, *rest):
        got = real(cfg, nbuf, x_shape, out_shape, *rest)
        return [(x_shape[0] * x_shape[1], out_shape[2], got[0][2])] + got

    monkeypatch.setattr(vector, "pool2d_blocks", blocks)
    monkeypatch.setattr(tir_pool, "pool2d_blocks", blocks)
    x = RNG.standard_normal((1, 32, 64, 64)).astype(np.float32)
    with PassContext(config={LOWERING_KEY: route}):
        exe = kiln.build(graph_module(lambda a: op.nn.max_pool2d(a, pool_size=(2, 2),
                                                                 strides=(2, 2)), [x.shape]),
                         target="npu")
    assert exe.cpu_ops == []
    (kernel,) = [k for k in exe.kernels if k.op == "nn.max_pool2d"]
    assert "feedback: 1 refused" in kernel.tiling and "32 channels x 32 rows" in kernel.tiling
    assert "exceed" in kernel.tiling, kernel.tiling
    np.testing.assert_array_equal(exe(x), x.reshape(1, 32, 32, 2, 32, 2).max(axis=(3, 5)))


def test_a_products_output_slots_are_chosen_by_its_replay(monkeypatch):
    """Edge, a pointwise convolution (128 -> 32 channels at 14 x 14, one K step) with a
    residual: its tiles could take a third accumulator slot, so the build emits it with three
    and with two and keeps the count whose program, replayed after its bank placement, is
    faster -- forced each way by a replay that takes 1000 cycles off one count's (the first
    replay is the three slots', the second the two's). Two slots chosen so are kept only
    where the whole model replays faster with them than a build without the choice (forced
    each way too: dropped, ``BankPlan.left`` says so). Only with the PassContext option
    ``"npu.choose_acc_slots"`` (off by default: no replay, acc_slots' count). The kept
    count is in the program (the slot tile 0 and tile 2 or 3 share), on the kernel
    (``acc_choice``, its tiling text), and
    the bits are those of the build without bank placement (no choice: three slots)."""
    rng = np.random.default_rng(7)
    w = (rng.standard_normal((32, 128, 1, 1)) * 0.2).astype("float32")
    x = rng.standard_normal((1, 128, 14, 14)).astype("float32")
    res = rng.standard_normal((1, 32, 14, 14)).astype("float32")
    mod = conv_residual_relu(w, res.shape)
    real, real_model = npu_compile.kernel_replay, npu_compile.model_replay

    def build(faster=None, bank_plan=True, model_keeps=True, choose=True):
        calls = []

        def fake(cfg):
            replay = real(cfg)

            def timed(program):
                cycles, conflicts = replay(program)
                calls.append(cycles)
                slots = 3 if len(calls) % 2 else 2
                return cycles - (1000 if slots == faster else 0), conflicts
            return timed

        def fake_model(exe):  # the whole model: faster with the choice, or without it
            chose = any(k.acc_choice for k in exe.kernels)
            return (100.0 if chose == model_keeps else 200.0), 0.0
        if faster is not None:
            monkeypatch.setattr(npu_compile, "kernel_replay", fake)
            monkeypatch.setattr(npu_compile, "model_replay", fake_model)
        with PassContext(config={CHOOSE_ACC_SLOTS_KEY: choose}):
            exe = build_npu(npu_pipeline()(mod), kiln.Target("npu", hw="edge"),
                            residency=False, bank_plan=bank_plan)
        monkeypatch.setattr(npu_compile, "kernel_replay", real)
        monkeypatch.setattr(npu_compile, "model_replay", real_model)
        assert len(calls) == (0 if faster is None else 2)
        (kernel,) = [k for k in exe.kernels if k.knob]  # the product
        stream = [s.program for s in exe.steps if getattr(s, "program", None)][-1].streams[0]
        # the tiles' slots in turn: tile 2 reuses tile 0's with two (bank placement moves
        # each slot's buffer, so not their addresses)
        firsts = [i.args["c"].addr for i in stream
                  if i.op == "mma.set" and i.args["c"].mem == MEM_ID["acc"]]
        slots = 2 if firsts[2] == firsts[0] else 3
        assert firsts[slots] == firsts[0]
        return exe, kernel, slots, np.asarray(exe(x, res))

    plain, plain_kernel, plain_slots, want = build(bank_plan=False)
    assert plain_slots == 3 and plain_kernel.acc_choice is None
    # the option off (the default): no replay, acc_slots' own count
    _, kernel, slots, out = build(choose=False)
    assert slots == 3 and kernel.acc_choice is None and np.array_equal(out, want)
    ref = np.maximum(np.einsum("oc,nchw->nohw", w[:, :, 0, 0], x) + res, 0)
    assert np.max(np.abs(want - ref)) / np.max(np.abs(ref)) < 2e-2
    for faster in (3, 2):
        exe, kernel, slots, out = build(faster)
        assert slots == faster
        assert np.array_equal(out, want)
        kept, _, other, _ = kernel.acc_choice
        assert (kept, other) == (faster, 5 - faster)
        assert f"[{faster} output slots:" in kernel.tiling
        assert exe.slot_choices.endswith("kept") == (faster == 2)
    # two slots by the kernel's replay, but the whole model is faster without: dropped
    exe, kernel, slots, out = build(2, model_keeps=False)
    assert slots == 3 and kernel.acc_choice is None and np.array_equal(out, want)
    assert exe.slot_choices.endswith("dropped")
    assert any(why.startswith("output slot choices dropped: 1 product(s)")
               for why in exe.bank_plans[0].left)
    # the real replays: the count kept is not the slower
    _, kernel, _, out = build()
    assert np.array_equal(out, want)
    if kernel.acc_choice is not None:
        kept, c_kept, other, c_other = kernel.acc_choice
        assert c_kept <= c_other and {kept, other} == {2, 3}
