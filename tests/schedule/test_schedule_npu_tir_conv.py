"""Convolutions through the NPU's TIR route: the implicit GEMM as a TE PrimFunc, scheduled
into L1 staging, L0 gather, weight and accumulator scopes, tensorized, generated. Checked on
both shipped descriptions with prime sizes, strides, padding, dilation, kernels from 1x1 to
7x7, batches and groups: against the emitter (the very same instructions: the same bits and
cycles) and against torch in float64."""

import numpy as np
import pytest
import torch

import kiln
from kiln import cli, op
from kiln import graph as g
from kiln.codegen.npu import LOWERING_KEY, build_npu
from kiln.codegen.npu.executable import NpuStep
from kiln.ir import KilnError
from kiln.op.nn import Conv2DAttrs
from kiln.schedule.npu import LoweringContext, NotSupported
from kiln.schedule.npu.emit import DramView
from kiln.schedule.npu.gemm import acc_slots, feasible_tilings, held_tiles, plan_gemm
from kiln.schedule.npu.ops import conv_geometry
from kiln.schedule.npu.tir_conv import conv_prim_func, schedule_conv, scheduled_conv
from kiln.schedule.npu.tir_program import (
    BALANCE_KEY,
    OUT_SLOTS_KEY,
    STAGE_KEY,
    compile_index,
    emit_scheduled_conv,
    evaluate,
)
from kiln.target.npu import load_config
from kiln.testing.op_testing import graph_module
from kiln.tir import Schedule
from kiln.tir import expr as E
from kiln.tir.functor import post_order_visit
from kiln.tir.stmt import Block
from kiln.tir.tensor_intrin.npu import (
    SCOPE_ACC,
    SCOPE_INPUT,
    SCOPE_L1,
    SCOPE_WEIGHT,
    mma_intrin_name,
    register_npu_intrinsics,
)
from kiln.transform import PassContext

HW = ["default", "edge"]

#: (image NCHW, weights OIHW, conv2d keywords): primes, strides 1 and 2, padding, dilation 2,
#: kernels 1x1 (strided), 3x3, 5x5, 7x7, batch 2, groups 2.
CASES = [
    ((1, 10, 9, 9), (20, 10, 3, 3), {"padding": (1, 1)}),
    ((2, 13, 17, 11), (29, 13, 3, 3), {"padding": (1, 1), "strides": (2, 2)}),
    ((1, 3, 23, 23), (16, 3, 7, 7), {"padding": (3, 3), "strides": (2, 2)}),
    ((1, 16, 14, 14), (32, 16, 1, 1), {"strides": (2, 2)}),
    ((1, 8, 12, 12), (16, 8, 3, 3), {"padding": (2, 2), "dilation": (2, 2)}),
    ((2, 8, 9, 9), (12, 4, 3, 3), {"padding": (1, 1), "groups": 2}),
    ((1, 97, 11, 11), (97, 97, 5, 5), {"padding": (2, 2)}),
    ((2, 5, 13, 7), (7, 5, 3, 5), {"padding": (0, 2), "strides": (1, 2)}),
    ((1, 31, 29, 31), (37, 31, 3, 3), {}),
    ((1, 6, 8, 8), (10, 3, 1, 1), {"groups": 2, "strides": (2, 2)}),
    ((1, 9, 10, 13), (11, 9, 3, 3), {"padding": (1, 0, 2, 3), "strides": (2, 1)}),
]


def _both(fn, shapes, hw):
    out = []
    for route in ("emit", "tir"):
        with PassContext(config={LOWERING_KEY: route}):
            out.append(kiln.build(graph_module(fn, shapes, "float32"),
                                  target=kiln.Target("npu", hw=hw)))
    return out


def _conv_schedules(exe):
    """The scheduled PrimFuncs of the implicit-GEMM convolutions (not the vector kernels')."""
    return [sch for op_name, sch in exe.tir if op_name == "nn.conv2d"]


def _program(exe):
    """Every NPU instruction of an executable (op and arguments), in stream order; a DMA's
    stride along a dim of extent 1 is never applied, so it is left out (the TIR route
    derives it from the copy's index map, where a K step of one channel steps to the next
    tap; the emitter writes the tensor's own)."""
    out = []
    for s in exe.steps:
        if not isinstance(s, NpuStep):
            continue
        for stream in s.program.streams:
            for i in stream:
                args = dict(i.args)
                if i.op.startswith("dma.") and "shape" in args:
                    for key in ("src", "dst"):
                        b = args[key]
                        args[key] = b._replace(strides=tuple(
                            0 if n == 1 else st for n, st in zip(args["shape"], b.strides)))
                out.append((i.op, repr(sorted(args.items()))))
    return out


def _torch(x, w, kw):
    """torch's float64 convolution (a (top, left, bottom, right) padding applied first)."""
    args = {("stride" if k == "strides" else k): v for k, v in kw.items()}
    args["groups"] = args.get("groups", 1)
    xt = torch.tensor(x, dtype=torch.float64)
    pad = args.pop("padding", (0, 0))
    top, left, bottom, right = pad if len(pad) == 4 else (*pad, *pad)
    xt = torch.nn.functional.pad(xt, (left, right, top, bottom))
    return torch.nn.functional.conv2d(xt, torch.tensor(w, dtype=torch.float64), **args).numpy()


@pytest.mark.parametrize("hw", HW)
@pytest.mark.parametrize("xs,ws,kw", CASES)
def test_conv2d_through_tir_is_the_emitters_program(hw, xs, ws, kw):
    rng = np.random.default_rng(sum(xs) + sum(ws))
    x = rng.standard_normal(xs).astype("float32")
    w = rng.standard_normal(ws).astype("float32")
    emit, tir = _both(lambda a: op.nn.conv2d(a, g.const(w), **kw), [xs], hw)
    convs = [k for k in tir.kernels if k.op == "nn.conv2d"]
    assert convs and all(k.tiling.startswith("TIR: ") for k in convs)
    assert not emit.tir and len(_conv_schedules(tir)) == len(convs)
    # the same instructions (so the same bits and the same cycles), the same tilings
    assert _program(tir) == _program(emit)
    assert [k.tiling.removeprefix("TIR: ").removeprefix("1x1 as W @ X: ") for k in convs] == \
        [k.tiling.removeprefix("1x1 as W @ X: ") for k in emit.kernels if k.op == "nn.conv2d"]
    got, want = tir(x), emit(x)
    np.testing.assert_array_equal(got, want)
    assert tir.last_cycles == emit.last_cycles > 0
    ref = _torch(x, w, kw)
    # float16 operands (x and w rounded: 2^-11 relative each), float32 accumulation
    assert np.max(np.abs(got - ref)) <= 2e-3 * np.max(np.abs(ref))


def _random_case(rng):
    """A random convolution (groups, batch, kernel 1-7 x 1-5, strides 1-3, dilation 1-2,
    padding 0-3 per side, sizes up to 39) whose output is not empty."""
    while True:
        groups, nb = int(rng.choice([1, 1, 2])), int(rng.choice([1, 2]))
        cg, og = int(rng.integers(1, 40)), int(rng.integers(1, 40))
        kh, kw = int(rng.choice([1, 2, 3, 5, 7])), int(rng.choice([1, 3, 5]))
        sh, sw = int(rng.choice([1, 2, 3])), int(rng.choice([1, 2]))
        dh, dw = int(rng.choice([1, 1, 2])), int(rng.choice([1, 2]))
        pad = tuple(int(p) for p in rng.integers(0, 4, 4))
        h, w = int(rng.integers(1, 40)), int(rng.integers(1, 40))
        if h + pad[0] + pad[2] > (kh - 1) * dh and w + pad[1] + pad[3] > (kw - 1) * dw:
            return ((nb, cg * groups, h, w), (og * groups, cg, kh, kw),
                    {"strides": (sh, sw), "padding": pad, "dilation": (dh, dw),
                     "groups": groups})


@pytest.mark.parametrize("seed", range(12))
def test_random_convolutions_are_the_emitters_program(seed):
    """Random shapes (200 of these generators' draws were checked alike while writing the
    route): the same program as the emitter, the same bits, torch's values."""
    rng = np.random.default_rng(1000 + seed)
    xs, ws, kw = _random_case(rng)
    hw = HW[seed % 2]
    x = rng.standard_normal(xs).astype("float32")
    w = rng.standard_normal(ws).astype("float32")
    emit, tir = _both(lambda a: op.nn.conv2d(a, g.const(w), **kw), [xs], hw)
    assert tir.tir and _program(tir) == _program(emit)
    got = tir(x)
    np.testing.assert_array_equal(got, emit(x))
    assert tir.last_cycles == emit.last_cycles
    ref = _torch(x, w, kw)
    assert np.max(np.abs(got - ref)) <= 2e-3 * np.max(np.abs(ref))


@pytest.mark.parametrize("hw", HW)
def test_one_slot_pipeline_is_the_emitters_program(hw):
    """Without double buffering (one slot: the staging fences the gathers of the step
    before) the program is the emitter's too."""
    rng = np.random.default_rng(4)
    w = rng.standard_normal((19, 7, 3, 3)).astype("float32")
    x = rng.standard_normal((2, 7, 15, 12)).astype("float32")
    mod = graph_module(lambda a: op.nn.conv2d(a, g.const(w), padding=(1, 1), strides=(2, 1)),
                       [x.shape], "float32")
    exes = []
    for route in ("emit", "tir"):
        with PassContext(config={LOWERING_KEY: route}):
            exes.append(build_npu(mod, kiln.Target("npu", hw=hw), double_buffer=False))
    emit, tir = exes
    (sch,) = _conv_schedules(tir)
    assert '"software_pipeline": 1' in str(sch.func)
    assert _program(tir) == _program(emit)
    got = tir(x)
    np.testing.assert_array_equal(got, emit(x))
    ref = _torch(x, w, {"padding": (1, 1), "strides": (2, 1)})
    assert np.max(np.abs(got - ref)) <= 2e-3 * np.max(np.abs(ref))


def test_int8_conv2d_is_exact():
    rng = np.random.default_rng(8)
    w = rng.integers(-8, 8, (11, 7, 3, 3)).astype("int8")
    x = rng.integers(-8, 8, (1, 7, 10, 13)).astype("int8")
    outs = []
    for route in ("emit", "tir"):
        with PassContext(config={LOWERING_KEY: route}):
            exe = kiln.build(graph_module(lambda a: op.nn.conv2d(
                a, g.const(w), padding=(1, 1), strides=(2, 1), out_dtype="int32"),
                [x.shape], "int8"), target=kiln.Target("npu", hw="default"))
        outs.append((exe, exe(x)))
    (emit, want), (tir, got) = outs
    assert len(_conv_schedules(tir)) == 1 and _program(tir) == _program(emit)
    ref = _torch(x.astype(np.float64), w.astype(np.float64), {"padding": (1, 1),
                                                              "strides": (2, 1)})
    np.testing.assert_array_equal(got, ref.astype(np.int32))
    np.testing.assert_array_equal(got, want)


def _geometry(hw="default", xs=(1, 10, 9, 9), ws=(20, 10, 3, 3), **kw):
    cfg = load_config(hw)
    at = Conv2DAttrs(strides=kw.get("strides", (1, 1)), padding=kw.get("padding", (1, 1, 1, 1)),
                     dilation=kw.get("dilation", (1, 1)))
    oh = (xs[2] + at.padding[0] + at.padding[2] - (ws[2] - 1) * at.dilation[0] - 1) // \
        at.strides[0] + 1
    ow = (xs[3] + at.padding[1] + at.padding[3] - (ws[3] - 1) * at.dilation[1] - 1) // \
        at.strides[1] + 1
    ctx = LoweringContext(cfg, True, "tir")
    geo = conv_geometry(cfg, at, xs, ws, (xs[0], ws[0], oh, ow), "float16")
    return ctx, geo, plan_gemm(cfg, geo.shape, 2)


def _blocks(func):
    out = []
    post_order_visit(func.body, lambda n: out.append(n) if isinstance(n, Block) else None)
    return out


@pytest.mark.parametrize("hw", HW)
def test_the_schedule_stages_gathers_and_tensorizes_with_the_planner_tiling(hw):
    ctx, geo, tiling = _geometry(hw)
    sch = scheduled_conv(ctx, geo, tiling)
    text = str(sch.func)
    for scope in (SCOPE_L1, SCOPE_INPUT, SCOPE_WEIGHT, SCOPE_ACC):
        assert f'scope="{scope}"' in text
    assert "npu.mma(" in text and f'"{STAGE_KEY}": True' in text
    assert f'"{OUT_SLOTS_KEY}": {acc_slots(ctx.config, geo.shape, tiling, 2)}' in text
    assert f'"{BALANCE_KEY}": {tiling.balance}' in text
    # the tile is whole output rows of ow pixels and K steps of ku channels x 9 taps
    trace = "\n".join(sch.trace.as_python())
    assert f"factors=[None, {tiling.m_units * geo.ow}]" in trace
    assert f"factors=[None, {tiling.k_units * 9}]" in trace
    again = sch.trace.apply_to_schedule(Schedule(conv_prim_func(geo, tiling, "float32")))
    assert str(again.func) == text
    # the staging copy reads the image with the window's padding, channels innermost
    (stage,) = [b for b in _blocks(sch.func) if b.annotations.get(STAGE_KEY)]
    assert stage.writes[0].buffer.scope == SCOPE_L1 and "select(" in str(stage.body)
    assert [d.value for d in stage.writes[0].buffer.shape] == \
        [1, geo.shape.stage_rows(geo.oh), geo.width, geo.c]


def _dram(ctx, geo):
    m = geo.oh * geo.ow
    return {"X": ctx.alloc((geo.nb, geo.c, geo.h, geo.w), "float16"),
            "W": ctx.alloc((geo.taps, geo.c, geo.o), "float16"),
            "Y": DramView(ctx.alloc((geo.nb, geo.o, m), "float32"), 0, (geo.nb, geo.o, m),
                          (geo.o * m, m, 1))}


def test_the_generator_refuses_what_the_pipeline_does_not_take():
    ctx, geo, tiling = _geometry()
    register_npu_intrinsics(ctx.config)
    intrin = mma_intrin_name("float16", "float16", "float32")
    func = conv_prim_func(geo, tiling, "float32")
    with pytest.raises(NotSupported, match="X_l1.*no place in a convolution"):
        emit_scheduled_conv(ctx, func, _dram(ctx, geo), geo)
    held = held_tiles(ctx.config, geo.shape, tiling, 2)
    one = schedule_conv(func, geo, tiling, 1, intrin, held)
    with pytest.raises(NotSupported, match="pipeline slots"):
        emit_scheduled_conv(ctx, one.func, _dram(ctx, geo), geo)
    wrong = schedule_conv(func, geo, tiling, 2, intrin, held, out_slots=7)
    with pytest.raises(NotSupported, match="npu.out_slots = 7"):
        emit_scheduled_conv(ctx, wrong.func, _dram(ctx, geo), geo)
    sch = schedule_conv(func, geo, tiling, 2, intrin, held)
    with pytest.raises(KilnError, match="no DRAM tensor"):
        emit_scheduled_conv(ctx, sch.func, {}, geo)


def test_the_generator_reads_the_tiling_from_the_schedule():
    """A schedule of another (feasible) tiling is generated as that tiling: the program's
    tile is the schedule's, not the planner's."""
    ctx, geo, tiling = _geometry("edge", (1, 16, 12, 12), (24, 16, 3, 3))
    register_npu_intrinsics(ctx.config)
    other = next(t for t in feasible_tilings(ctx.config, geo.shape, 2)
                 if (t.m_units, t.n, t.k_units) != (tiling.m_units, tiling.n, tiling.k_units))
    sch = schedule_conv(conv_prim_func(geo, other, "float32"), geo, other, 2,
                        mma_intrin_name("float16", "float16", "float32"),
                        held_tiles(ctx.config, geo.shape, other, 2),
                        acc_slots(ctx.config, geo.shape, other, 2))
    got = emit_scheduled_conv(ctx, sch.func, _dram(ctx, geo), geo)
    assert (got.m_units, got.n, got.k_units, got.balance) == \
        (other.m_units, other.n, other.k_units, other.balance)


def test_depthwise_and_runtime_weights_are_no_implicit_gemm():
    """A depthwise convolution runs on the vector unit (TIR's pooling kernels), one with
    run-time weights is emitted: neither is an implicit GEMM through TIR."""
    rng = np.random.default_rng(2)
    wd = rng.standard_normal((6, 1, 3, 3)).astype("float32")
    emit, tir = _both(lambda a: op.nn.conv2d(a, g.const(wd), padding=(1, 1), groups=6),
                      [(1, 6, 8, 8)], "edge")
    assert _conv_schedules(tir) == [] and _program(tir) == _program(emit)
    emit, tir = _both(lambda a, b: op.nn.conv2d(a, b, padding=(1, 1)),
                      [(1, 4, 8, 8), (5, 4, 3, 3)], "edge")
    assert _conv_schedules(tir) == [] and _program(tir) == _program(emit)


def test_cli_show_prints_the_scheduled_convolution(capsys):
    assert cli.main(["show", "demo:small_cnn", "--target", "npu -hw=edge",
                     "--stage", "scheduled"]) == 0
    out = capsys.readouterr().out
    assert "# nn.conv2d: scheduled for npu" in out and 'scope="npu.l1"' in out
    assert f'"{STAGE_KEY}": True' in out and "sch.tensorize(block_or_loop=" in out


def test_compiled_index_maps_evaluate_as_the_interpreter():
    """The generator's compiled index maps (floor division and modulo of negative values,
    selects, min/max, logic, casts) give :func:`evaluate`'s values; a truncating division,
    which neither lowers, is refused by both."""
    a, b = E.Var("a", "int64"), E.Var("b", "int64")
    exprs = [E.floordiv(a - 7, 3), E.floormod(a * 2 - b, 5), E.select(a < b, a + 1, b * 3),
             E.min(a, b - 2), E.max(a, 4), E.logical_and(a >= 0, E.logical_not(b > a)),
             E.Cast("int64", a + b)]
    fn = compile_index(exprs, [a, b])
    for x in range(-9, 10):
        for y in range(-6, 7):
            assert fn(x, y) == tuple(evaluate(e, {a: x, b: y}) for e in exprs)
    with pytest.raises(KilnError, match="cannot evaluate"):
        compile_index([E.truncdiv(a, 3)], [a])
    with pytest.raises(KilnError, match="has no value"):
        compile_index([a + b], [a])
