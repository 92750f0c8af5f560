"""The TIR route of the NPU's products (PassContext ``"npu.lowering": "tir"``): dense and
matmul as TE PrimFuncs scheduled into NPU scopes and tensorized, then generated into
instructions. Checked on both shipped descriptions, with prime sizes (tail tiles), against
numpy and against the emitter (the same bits: same tiling, same order of products)."""

import numpy as np
import pytest

import kiln
from kiln import graph as g
from kiln import op
from kiln.codegen.npu import LOWERING_KEY
from kiln.codegen.npu.executable import NpuStep
from kiln.ir import KilnError, ScheduleError
from kiln.schedule.npu import LoweringContext, NotSupported
from kiln.schedule.npu.emit import DramTensor
from kiln.schedule.npu.gemm import held_tiles
from kiln.schedule.npu.tir_gemm import (
    GemmProblem,
    gemm_prim_func,
    plan_gemm_problem,
    schedule_gemm,
    scheduled_gemm,
)
from kiln.schedule.npu.tir_program import HELD_KEY, emit_scheduled
from kiln.target.npu import load_config
from kiln.testing.op_testing import graph_module
from kiln.tir import Schedule
from kiln.tir.functor import post_order_visit
from kiln.tir.stmt import Block
from kiln.tir.tensor_intrin import names
from kiln.tir.tensor_intrin.npu import (
    SCOPE_ACC,
    SCOPE_INPUT,
    mma_intrin_name,
    register_npu_intrinsics,
)
from kiln.transform import PassContext

HW = ["default", "edge"]


def _both(fn, shapes, hw, dtype="float32"):
    """The executables of the emit and the TIR route."""
    out = []
    for route in ("emit", "tir"):
        with PassContext(config={LOWERING_KEY: route}):
            out.append(kiln.build(graph_module(fn, shapes, dtype),
                                  target=kiln.Target("npu", hw=hw)))
    return out


def _check(emit, tir, inputs, ref, tol=1e-2):
    """TIR lowered its products and gives the emitter's bits (the same tiling, the same
    order of products) and numpy's values, in the emitter's cycles within 1% (its pipeline
    lacks the emitter's split of leftover tiles over the cores: 1.0045x at most here; its
    stores may be split finer, a few percent faster in some small kernels)."""
    assert tir.tir and not emit.tir
    assert [k.tiling.startswith("TIR: ") for k in tir.kernels] == \
        [k.op in ("dense", "matmul", "nn.conv2d") or k.op.endswith(".cast")  # vcast: TIR too
         for k in tir.kernels]
    got, want = tir(*inputs), emit(*inputs)
    np.testing.assert_array_equal(got, want)
    assert emit.last_cycles > 0 and 0.9 * emit.last_cycles < tir.last_cycles <= \
        1.01 * emit.last_cycles, (tir.last_cycles, emit.last_cycles)
    if np.issubdtype(ref.dtype, np.integer):
        np.testing.assert_array_equal(got, ref)
    else:
        assert np.max(np.abs(got - ref)) <= tol * np.max(np.abs(ref))


def _rand(rng, *shape):
    return rng.standard_normal(shape).astype("float32")


@pytest.mark.parametrize("hw", HW)
@pytest.mark.parametrize("m,k,n", [(97, 251, 97), (5, 97, 251), (251, 1021, 33), (1, 97, 16)])
def test_dense_constant_weights(hw, m, k, n):
    rng = np.random.default_rng(m * k + n)
    w = _rand(rng, n, k)
    emit, tir = _both(lambda x: op.dense(x, g.const(w)), [(m, k)], hw)
    x = _rand(rng, m, k)
    _check(emit, tir, [x], x.astype(np.float64) @ w.T)


def _loads(exe):
    """(count, bytes) of the DMA loads of an executable's NPU programs."""
    loads = [i for s in exe.steps if isinstance(s, NpuStep) for stream in s.program.streams
             for i in stream if i.op == "dma.load"]
    return len(loads), sum(int(np.prod(i.args["shape"])) for i in loads)


def test_a_tile_that_stays_on_its_core_is_loaded_once():
    # BERT's QKV projection on the default description: M128 x N32 x K768 tiles, the whole
    # A (128 x 768) on both cores for all 72 output tiles -- held in one copy, loaded once
    # per core, as the emitter does (it was loaded for every tile: 2.98x the cycles)
    rng = np.random.default_rng(3)
    w = _rand(rng, 2304, 768)
    emit, tir = _both(lambda x: op.dense(x, g.const(w)), [(128, 768)], "default")
    x = _rand(rng, 128, 768)
    _check(emit, tir, [x], x.astype(np.float64) @ w.T)
    (sch,) = [s for o, s in tir.tir if o == "matmul"]  # (the activation's cast: TIR too)
    cfg = load_config("default")
    p = GemmProblem(1, 128, 2304, 768, "float16", "float32")
    tiling = plan_gemm_problem(LoweringContext(cfg, True, "tir"), "dense", p)
    assert held_tiles(cfg, p.shape, tiling, 2) == (True, False)
    blocks = []
    post_order_visit(sch.func.body, lambda n: blocks.append(n) if isinstance(n, Block) else None)
    held = [b for b in blocks if b.annotations.get(HELD_KEY)]
    assert [b.writes[0].buffer.scope for b in held] == [SCOPE_INPUT]
    assert _loads(tir) == _loads(emit)
    _, elements = _loads(tir)
    # x cast to float16 by a vector kernel, then A once per core and each B tile once
    assert elements == 128 * 768 + 2 * 128 * 768 + 768 * 2304


@pytest.mark.parametrize("hw", HW)
def test_dense_int8_is_exact(hw):
    rng = np.random.default_rng(1)
    w = rng.integers(-128, 128, (97, 251), dtype=np.int8)
    emit, tir = _both(lambda x: op.dense(x, g.const(w), out_dtype="int32"), [(37, 251)], hw,
                      "int8")
    x = rng.integers(-128, 128, (37, 251), dtype=np.int8)
    _check(emit, tir, [x], x.astype(np.int32) @ w.T.astype(np.int32))


@pytest.mark.parametrize("hw", HW)
def test_runtime_operands_and_batches(hw):
    """Both operands computed at run time (dense's [N, K] read transposed by the DMA), a
    batched left operand with 2-D weights, and a batch of products (attention's shape)."""
    rng = np.random.default_rng(2)
    emit, tir = _both(lambda x, y: op.matmul(x, y), [(97, 40), (40, 251)], hw)
    x, y = _rand(rng, 97, 40), _rand(rng, 40, 251)
    _check(emit, tir, [x, y], x.astype(np.float64) @ y)
    emit, tir = _both(lambda x, y: op.dense(x, y), [(33, 97), (61, 97)], hw)
    x, y = _rand(rng, 33, 97), _rand(rng, 61, 97)
    _check(emit, tir, [x, y], x.astype(np.float64) @ y.T)
    b = _rand(rng, 97, 19)
    emit, tir = _both(lambda x: op.matmul(x, g.const(b)), [(2, 7, 97)], hw)
    x = _rand(rng, 2, 7, 97)
    _check(emit, tir, [x], x.astype(np.float64) @ b)
    emit, tir = _both(lambda x, y: op.matmul(x, y), [(3, 97, 16), (3, 16, 251)], hw)
    x, y = _rand(rng, 3, 97, 16), _rand(rng, 3, 16, 251)
    _check(emit, tir, [x, y], x.astype(np.float64) @ y)


@pytest.mark.parametrize("hw", HW)
def test_pointwise_conv2d(hw):
    """A 1x1 stride-1 convolution is W @ X per image (the weights shared by the batch)."""
    rng = np.random.default_rng(4)
    w = _rand(rng, 33, 97, 1, 1)
    emit, tir = _both(lambda x: op.nn.conv2d(x, g.const(w)), [(2, 97, 7, 9)], hw)
    x = _rand(rng, 2, 97, 7, 9)
    _check(emit, tir, [x], np.einsum("oc,nchw->nohw", w[:, :, 0, 0].astype(np.float64), x))
    assert "1x1 as W @ X" in tir.kernels[-1].tiling


def test_depthwise_convolutions_take_the_vector_route():
    """A depthwise convolution runs on the vector unit, through TIR's pooling kernels
    (tests/schedule/test_schedule_npu_tir_conv.py covers the other convolutions, tests/
    schedule/test_schedule_npu_tir_vector.py the vector kernels): the emitter's kernels."""
    rng = np.random.default_rng(5)
    w = _rand(rng, 8, 1, 3, 3)
    emit, tir = _both(lambda x: op.nn.conv2d(x, g.const(w), padding=(1, 1), groups=8),
                      [(1, 8, 9, 9)], "edge")
    assert tir.tir and emit.tir == []
    assert [k.tiling.removeprefix("TIR: ") for k in tir.kernels] == \
        [k.tiling for k in emit.kernels]
    x = _rand(rng, 1, 8, 9, 9)
    np.testing.assert_array_equal(tir(x), emit(x))


def test_broadcast_batch_falls_back_to_the_emitter():
    rng = np.random.default_rng(3)
    emit, tir = _both(lambda x, y: op.matmul(x, y), [(2, 9, 16), (1, 16, 11)], "default")
    # the product emitted (only the activation's vcast went through TIR)
    assert all(o.endswith(".cast") for o, _ in tir.tir)
    assert [k.tiling.removeprefix("TIR: ") for k in tir.kernels] == \
        [k.tiling for k in emit.kernels]
    x, y = _rand(rng, 2, 9, 16), _rand(rng, 1, 16, 11)
    np.testing.assert_array_equal(tir(x, y), emit(x, y))


def _problem(hw="default", m=97, n=251, k=251, nbuf=2):
    cfg = load_config(hw)
    ctx = LoweringContext(cfg, nbuf == 2, "tir")
    p = GemmProblem(1, m, n, k, "float16", "float32")
    return ctx, p, plan_gemm_problem(ctx, "dense", p)


@pytest.mark.parametrize("hw", HW)
def test_the_schedule_uses_the_planner_tiling_and_replays(hw):
    ctx, p, tiling = _problem(hw)
    sch = scheduled_gemm(ctx, p, tiling)
    text = str(sch.func)
    for scope in ("npu.l0.input", "npu.l0.weight", "npu.l0.acc"):
        assert f'scope="{scope}"' in text
    assert '"software_pipeline": 2' in text and "npu.mma(" in text
    assert f"factors=[None, {tiling.m_units}]" in "\n".join(sch.trace.as_python())
    again = sch.trace.apply_to_schedule(Schedule(gemm_prim_func(
        p, (tiling.m_units, tiling.n, tiling.k_units))))
    assert str(again.func) == text


@pytest.mark.parametrize("hw", HW)
def test_intrinsics_come_from_the_description(hw):
    cfg = load_config(hw)
    got = register_npu_intrinsics(cfg)
    assert got == [mma_intrin_name(str(t.a), str(t.b), str(t.acc)) for t in cfg.tensor_dtypes]
    assert set(got) <= set(names()) and "npu.mma.int8.int8.int32" in got


def test_tensorize_refuses_operands_outside_the_npu_scopes():
    """The intrinsic's desc names the scopes: a tile still reading DRAM buffers does not match."""
    ctx, p, tiling = _problem()
    register_npu_intrinsics(ctx.config)
    sch = Schedule(gemm_prim_func(p, (tiling.m_units, tiling.n, tiling.k_units)))
    prod = sch.get_block("C_acc")
    _, i, j, k = sch.get_loops(prod)
    i0, i1 = sch.split(i, [None, tiling.m_units])
    with pytest.raises(ScheduleError):
        sch.tensorize(i1, mma_intrin_name("float16", "float16", "float32"))


def _dram(ctx, p):
    return {"A": ctx.alloc((p.batch, p.m, p.k), p.dtype),
            "B": ctx.alloc((p.batch, p.k, p.n), p.dtype),
            "C": ctx.alloc((p.batch, p.m, p.n), p.acc)}


def test_the_generator_refuses_what_it_cannot_lower():
    ctx, p, tiling = _problem()
    tile = (tiling.m_units, tiling.n, tiling.k_units)
    with pytest.raises(NotSupported, match="between DRAM and a scratchpad"):
        emit_scheduled(ctx.kb, gemm_prim_func(p, tile), _dram(ctx, p))
    sch = schedule_gemm(gemm_prim_func(p, tile), tile, 1, mma_intrin_name("float16", "float16",
                                                                         "float32"))
    with pytest.raises(NotSupported, match="pipeline slots"):
        emit_scheduled(ctx.kb, sch.func, _dram(ctx, p))
    with pytest.raises(KilnError, match="no DRAM tensor"):
        emit_scheduled(ctx.kb, sch.func, {})


def test_the_generator_refuses_tiles_beyond_the_scratchpad():
    """A tile that the planner would never choose (the whole product at once on edge's
    32-48 KiB buffers) is refused by the scope allocation, naming the buffer."""
    cfg = load_config("edge")
    ctx = LoweringContext(cfg, True, "tir")
    p = GemmProblem(1, 97, 251, 251, "float16", "float32")
    register_npu_intrinsics(cfg)
    sch = schedule_gemm(gemm_prim_func(p, (97, 251, 251)), (97, 251, 251), 2,
                        mma_intrin_name("float16", "float16", "float32"))
    with pytest.raises(NotSupported, match="exceed"):
        emit_scheduled(ctx.kb, sch.func, _dram(ctx, p))


def test_unknown_route_is_refused():
    with pytest.raises(KilnError, match="route"):
        LoweringContext(load_config("default"), True, "vliw")
    assert isinstance(SCOPE_ACC, str) and DramTensor


def test_cli_show_prints_the_scheduled_tir(capsys):
    from kiln import cli
    assert cli.main(["show", "demo:mlp", "--target", "npu -hw=edge", "--stage", "scheduled"]) == 0
    out = capsys.readouterr().out
    assert "# matmul: scheduled for npu" in out and 'scope="npu.l0.acc"' in out
    assert 'sch.tensorize(block_or_loop=' in out and '"software_pipeline": 2' in out
