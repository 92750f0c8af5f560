"""The TIR route of the NPU's vector kernels (PassContext ``"npu.lowering": "tir"``, the
default): element-wise and broadcast ops, fused chains and casts, softmax, layer_norm, row
means, pooling and depthwise convolutions as TE PrimFuncs scheduled into the L0 scopes,
tensorized onto the vector intrinsics, generated into instructions.
Checked on both shipped descriptions, with prime sizes (tail blocks), broadcasts in every
position and fused chains, against numpy and against the emitter: the same instruction
stream, so the same bits and cycles."""

import numpy as np
import pytest
import torch

import kiln
from kiln import graph as g
from kiln import op
from kiln.codegen.npu import DEPTHWISE_KEY, LOWERING_KEY
from kiln.codegen.npu.executable import NpuStep
from kiln.ir import ScheduleError
from kiln.schedule.npu import LoweringContext, NotSupported
from kiln.schedule.npu.tir_program import HELD_KEY, PIPELINE_KEY
from kiln.schedule.npu.tir_rows import (
    PLACE_KEY,
    layer_norm_stages,
    lower_rows_tir,
    row_mean_stages,
    softmax_stages,
)
from kiln.schedule.npu.tir_vector import (
    elementwise_prim_func,
    emit_vector_scheduled,
    lower_vector_tir,
    schedule_elementwise,
    scheduled_elementwise,
    vector_kernel,
)
from kiln.schedule.npu.vector import (
    VecStep,
    elementwise_kernel,
    emit_elementwise,
    emit_layer_norm,
    emit_row_mean,
    emit_softmax,
    plan_elementwise,
    pool2d_kernel,
)
from kiln.target.npu import load_config
from kiln.testing.op_testing import graph_module
from kiln.tir.functor import post_order_visit
from kiln.tir.stmt import Block, For
from kiln.tir.tensor_intrin import get
from kiln.tir.tensor_intrin.npu import SCOPE_ACC, SCOPE_INPUT, SCOPE_WEIGHT
from kiln.tir.tensor_intrin.npu_vector import VecOperand, vector_intrin, vector_value
from kiln.transform import PassContext

HW = ["default", "edge"]


def _both(fn, shapes, hw, dtype="float32"):
    """The executables of the emit and the TIR route (depthwise convolutions on the vector
    unit: its kernels are what these tests check)."""
    out = []
    for route in ("emit", "tir"):
        with PassContext(config={LOWERING_KEY: route, DEPTHWISE_KEY: "vector"}):
            out.append(kiln.build(graph_module(fn, shapes, dtype),
                                  target=kiln.Target("npu", hw=hw)))
    return out


def _streams(exe):
    return [s.program.streams for s in exe.steps if isinstance(s, NpuStep)]


def _check(emit, tir, inputs, ref, tol=1e-5):
    """Every vector kernel of the TIR build went through TIR and is the emitter's
    instruction stream (so the emitter's bits and cycles), and the values are numpy's."""
    vec = [k for k in tir.kernels if k.op not in ("dense", "matmul", "nn.conv2d")]
    assert vec and all(k.tiling.startswith("TIR: ") for k in vec)
    assert not any(k.tiling.startswith("TIR: ") for k in emit.kernels)
    assert len(tir.tir) >= len(vec)
    assert _streams(tir) == _streams(emit)
    got, want = tir(*inputs), emit(*inputs)
    np.testing.assert_array_equal(got, want)
    assert tir.last_cycles == emit.last_cycles > 0
    if np.issubdtype(ref.dtype, np.integer):
        np.testing.assert_array_equal(got, ref)
    else:
        np.testing.assert_allclose(got, ref, rtol=tol, atol=tol * np.max(np.abs(ref)))


def _rand(rng, *shape):
    return rng.standard_normal(shape).astype("float32")


BINARY = [(op.add, np.add), (op.subtract, np.subtract), (op.multiply, np.multiply),
          (op.maximum, np.maximum), (op.minimum, np.minimum)]


@pytest.mark.parametrize("hw", HW)
@pytest.mark.parametrize("a,b", [((97, 251), (97, 251)), ((3, 97, 251), (251,)),
                                 ((3, 97, 251), (3, 1, 251)), ((5, 97, 13), (5, 97, 1)),
                                 ((1021, 7), (1021, 1)), ((2, 3, 5, 7), (2, 1, 5, 1)),
                                 ((4, 1), (1, 1021))])
def test_binary_broadcast(hw, a, b):
    """Broadcasts in every position (leading, trailing, middle, both operands), with the
    prime extents whose blocks leave tails; (2, 3, 5, 7) with (2, 1, 5, 1) keeps four dims
    after collapsing: an outer loop around the blocks."""
    rng = np.random.default_rng(sum(a) + sum(b))
    for (fn, ref) in BINARY[:2] if hw == "edge" else BINARY:
        emit, tir = _both(lambda x, y, fn=fn: fn(x, y), [a, b], hw)
        x, y = _rand(rng, *a), _rand(rng, *b)
        _check(emit, tir, [x, y], ref(x, y))


@pytest.mark.parametrize("hw", HW)
def test_divide_and_unary(hw):
    rng = np.random.default_rng(1)
    x, y = _rand(rng, 97, 251), np.abs(_rand(rng, 251)) + 0.5
    emit, tir = _both(lambda a, b: op.divide(a, b), [(97, 251), (251,)], hw)
    _check(emit, tir, [x, y], x / y, tol=1e-3)
    for fn, ref, tol in ((op.relu, lambda v: np.maximum(v, 0), 0), (op.negative, np.negative, 0),
                         (op.abs, np.abs, 0), (op.exp, np.exp, 1e-4)):
        emit, tir = _both(fn, [(251, 97)], hw)
        _check(emit, tir, [x.T.copy()], ref(x.T), tol=tol)


@pytest.mark.parametrize("hw", HW)
def test_immediates_and_composites(hw):
    """A scalar constant becomes an immediate (an intrinsic per value); sigmoid and tanh are
    chains of steps around vexp with a broadcast constant 1; clip is vmax then vmin."""
    rng = np.random.default_rng(2)
    x = _rand(rng, 33, 1021)
    cases = [
        (lambda a: op.multiply(a, g.const(np.float32(0.25))), x * 0.25, 0),
        (lambda a: op.sigmoid(a), 1 / (1 + np.exp(-x)), 1e-3),
        (lambda a: op.tanh(a), np.tanh(x), 1e-3),
        (lambda a: op.clip(a, -0.5, 0.75), np.clip(x, -0.5, 0.75), 0),
    ]
    for fn, ref, tol in cases:
        emit, tir = _both(fn, [x.shape], hw)
        _check(emit, tir, [x], ref, tol=tol)


@pytest.mark.parametrize("hw", HW)
def test_fused_chain(hw):
    """A chain of element-wise calls is one kernel of several stages, each in the block of
    the accumulators; its operands broadcast differently."""
    rng = np.random.default_rng(3)
    s = (3, 97, 251)
    b1, b2 = _rand(rng, 251), _rand(rng, 3, 97, 1)

    def fn(a):
        return op.relu(op.add(op.multiply(op.add(a, g.const(b1)), g.const(b2)),
                              g.const(np.float32(0.5))))

    emit, tir = _both(fn, [s], hw)
    x = _rand(rng, *s)
    assert len(tir.kernels) == 1 and "+" in tir.kernels[0].op
    _check(emit, tir, [x], np.maximum((x + b1) * b2 + 0.5, 0))
    sch = tir.tir[0][1]
    stages = []
    post_order_visit(sch.func.body, lambda n: stages.append(n) if isinstance(n, Block) and
                     n.annotations.get("kiln.tensor_intrin") else None)
    assert len(stages) == 4
    assert all(b.writes[0].buffer.scope == SCOPE_ACC for b in stages)


@pytest.mark.parametrize("hw", HW)
def test_chain_cast_for_product(hw):
    """An element-wise result whose only consumer is a float product is written in float16
    by its producer: a final vcast stage into a block of its own."""
    rng = np.random.default_rng(4)
    w = _rand(rng, 64, 97)
    emit, tir = _both(lambda a: op.dense(op.relu(a), g.const(w)), [(97, 97)], hw)
    x = _rand(rng, 97, 97)
    assert any(k.op == "relu" and k.tiling.startswith("TIR: ") for k in tir.kernels)
    assert _streams(tir) == _streams(emit)
    np.testing.assert_array_equal(tir(x), emit(x))
    ref = np.maximum(x, 0) @ w.T
    assert np.max(np.abs(tir(x) - ref)) <= 1e-2 * np.max(np.abs(ref))


@pytest.mark.parametrize("hw", HW)
def test_cast_and_integers(hw):
    """``cast`` (float -> int rounds toward zero, saturating) and integer element-wise ops."""
    rng = np.random.default_rng(5)
    x = (_rand(rng, 97, 251) * 100).astype("float32")
    emit, tir = _both(lambda a: op.cast(a, "int32"), [x.shape], hw)
    _check(emit, tir, [x], np.trunc(x).astype("int32"))
    emit, tir = _both(lambda a: op.cast(a, "float16"), [x.shape], hw)
    _check(emit, tir, [x], x.astype("float16"), tol=1e-3)
    xi = rng.integers(-1000, 1000, (251, 97)).astype("int32")
    yi = rng.integers(-1000, 1000, (97,)).astype("int32")
    emit, tir = _both(lambda a, b: op.relu(op.add(a, b)), [xi.shape, yi.shape], hw, "int32")
    _check(emit, tir, [xi, yi], np.maximum(xi + yi, 0))


def test_scheduled_prim_func_structure():
    """Operands staged into the L0 buffers the emitter uses (input and weight alternately),
    stages in the accumulators, one pipelined block loop, every stage tensorized."""
    cfg = load_config("edge")
    ctx = LoweringContext(cfg)
    out = ctx.alloc((97, 251), "float32")
    ins = [ctx.alloc((97, 251), "float32"), ctx.alloc((251,), "float32")]
    steps = [VecStep("vadd", (("in", 0), ("in", 1))), VecStep("vexp", (("out",),))]
    plan = plan_elementwise(cfg, ctx.kb.nbuf, out, ins, "float32")
    k = vector_kernel(plan, ins, steps, "float32", "float32")
    sch = scheduled_elementwise(k, ctx.kb.nbuf)
    blocks, loops = [], []

    def visit(n):
        if isinstance(n, Block):
            blocks.append(n)
        elif isinstance(n, For):
            loops.append(n)

    post_order_visit(sch.func.body, visit)
    written = [w.buffer for b in blocks for w in b.writes]
    copies = [b.writes[0].buffer.scope for b in blocks if b.name_hint.startswith("X")]
    assert copies == [SCOPE_INPUT, SCOPE_WEIGHT]
    assert [b.scope for b in written if b.name.startswith("S")] == [SCOPE_ACC, SCOPE_ACC]
    tensorized = [b.annotations["kiln.tensor_intrin"] for b in blocks
                  if b.annotations.get("kiln.tensor_intrin")]
    assert tensorized == ["npu.vadd.float32.float32.in011.wt001",  # (1, 97, 251) + (1, 1, 251)
                          "npu.vexp.float32.float32.acc111"]
    assert [lp.annotations.get(PIPELINE_KEY) for lp in loops
            if PIPELINE_KEY in lp.annotations] == [ctx.kb.nbuf]


def test_generated_stream_is_the_emitters():
    """The generator's instructions for a 4-D broadcast chain with tails on a description of
    several cores are the emitter's, instruction for instruction."""
    cfg = load_config("default")
    streams = []
    for route in ("emit", "tir"):
        ctx = LoweringContext(cfg, route=route)
        out = ctx.alloc((2, 3, 97, 13), "float32")
        ins = [ctx.alloc((2, 3, 97, 13), "float32"), ctx.alloc((3, 1, 13), "float32")]
        steps = [VecStep("vmul", (("in", 0), ("in", 1))), VecStep("vmax", (("out",),
                                                                            ("imm", 0.5)))]
        lower = emit_elementwise if route == "emit" else lower_vector_tir
        lower(ctx, "chain", out, ins, steps, "float32")
        streams.append(ctx.kb.streams)
    assert streams[0] == streams[1]
    assert sum(len(s) for s in streams[1]) > 20


def test_vector_intrinsics():
    """One intrinsic per form: the desc states the instruction's semantics over blocks of the
    L0 scopes (a broadcast operand with extent 1), an immediate is part of the form."""
    a = VecOperand(SCOPE_INPUT)
    b = VecOperand(SCOPE_WEIGHT, (False, True, False))
    name = vector_intrin("vsub", "float32", "float32", (a, b))
    assert name == "npu.vsub.float32.float32.in111.wt010"
    assert vector_intrin("vsub", "float32", "float32", (a, b)) == name  # registered once
    intrin = get(name)
    d, x, y = intrin.desc.buffers
    assert (d.scope, x.scope, y.scope) == (SCOPE_ACC, SCOPE_INPUT, SCOPE_WEIGHT)
    assert [int(getattr(e, "value", -1)) for e in y.shape] == [1, -1, 1]
    imm = vector_intrin("vmul", "float16", "float16", (a, VecOperand(None, value=0.5)))
    assert imm == "npu.vmul.float16.float16.in111.imm0.5"
    cast = vector_intrin("vcast", "int32", "float32", (a,), "rtz")
    assert cast == "npu.vcast.rtz.float32.int32.in111"
    with pytest.raises(ScheduleError, match="vfoo"):
        vector_intrin("vfoo", "float32", "float32", (a,))
    with pytest.raises(ScheduleError, match="at least one block"):
        vector_intrin("vmov", "float32", "float32", (VecOperand(None, value=1.0),))
    with pytest.raises(ScheduleError, match="takes 2"):
        vector_value("vadd", "float32", [x[0, 0, 0]])


def test_generator_refuses_untensorized_stage():
    """A stage the schedule left as a loop nest is not an instruction: NotSupported names
    it."""
    cfg = load_config("edge")
    ctx = LoweringContext(cfg)
    out = ctx.alloc((97,), "float32")
    ins = [ctx.alloc((97,), "float32")]
    steps = [VecStep("vrelu", (("in", 0),))]
    plan = plan_elementwise(cfg, ctx.kb.nbuf, out, ins, "float32")
    k = vector_kernel(plan, ins, steps, "float32", "float32")
    func = elementwise_prim_func(k)
    with pytest.raises(NotSupported):
        emit_vector_scheduled(ctx.kb, func, {"X0": ins[0], "C": out})
    sch = schedule_elementwise(func, k, ctx.kb.nbuf)
    with pytest.raises(NotSupported, match="2 pipeline slots|1 pipeline slots"):
        emit_vector_scheduled(LoweringContext(cfg, double_buffer=False).kb, sch.func,
                              {"X0": ins[0], "C": out})


def test_route_falls_back_off_the_vector_unit():
    """An int64 element-wise op (no vector type) still runs: the emitted lowering puts it on
    the scalar unit; a kernel with an immediate its dtype cannot hold (0.5 in int32) is
    emitted."""
    xi = np.arange(6, dtype="int64").reshape(2, 3)
    emit, tir = _both(lambda a: op.add(a, a), [(2, 3)], "edge", "int64")
    np.testing.assert_array_equal(tir(xi), xi + xi)
    assert not tir.tir and _streams(tir) == _streams(emit)
    cfg = load_config("edge")
    streams = []
    for route in ("emit", "tir"):
        ctx = LoweringContext(cfg, route=route)
        x, out = ctx.alloc((97,), "int32"), ctx.alloc((97,), "int32")
        elementwise_kernel(ctx, "add", out, [x], [VecStep("vadd", (("in", 0), ("imm", 0.5)))])
        assert not ctx.tir and not ctx.kb.kernels[0].tiling.startswith("TIR: ")
        streams.append(ctx.kb.streams)
    assert streams[0] == streams[1]


# ---------------------------------------------------------------------------------------------
# row kernels: softmax, layer_norm, the mean of each row
# ---------------------------------------------------------------------------------------------
@pytest.mark.parametrize("hw", HW)
@pytest.mark.parametrize("shape", [(97, 251), (2, 12, 33, 128), (1021, 13)])
def test_softmax(hw, shape):
    rng = np.random.default_rng(sum(shape))
    emit, tir = _both(lambda a: op.nn.softmax(a, axis=-1), [shape], hw)
    x = _rand(rng, *shape) * 4
    e = np.exp(x - x.max(-1, keepdims=True))
    _check(emit, tir, [x], e / e.sum(-1, keepdims=True), tol=1e-3)
    assert [o for o, _ in tir.tir] == ["nn.softmax"]


def test_softmax_divides_each_row_once_with_vdivs_bits():
    """The division by the row's sum is one vdiv per row (of a 1 by the sum) and a vmul of the
    row: the bits of vdiv(e, sum) by the numerics' specification (vdiv is e * recip(sum)),
    which this reference evaluates step by step -- max, subtract, exp_approx, the sequential
    float32 sum, div_approx -- on both routes; no vdiv runs over whole rows."""
    from kiln.npu import numerics as nm

    rng = np.random.default_rng(11)
    x = _rand(rng, 37, 128) * 4
    emit, tir = _both(lambda a: op.nn.softmax(a, axis=-1), [x.shape], "default")
    z = (x - x.max(-1, keepdims=True)).astype(np.float32)
    e = nm.exp_approx(z).astype(np.float32)
    total = np.add.accumulate(e, axis=-1, dtype=np.float32)[:, -1:]
    want = nm.div_approx(e, np.broadcast_to(total, e.shape))
    for exe in (emit, tir):
        assert np.array_equal(exe(x).view(np.uint32), want.view(np.uint32))
        divs = [ins.args["shape"] for streams in _streams(exe) for st in streams
                for ins in st if ins.op == "vdiv"]
        assert divs and all(shape[-1] == 1 for shape in divs)


@pytest.mark.parametrize("hw", HW)
@pytest.mark.parametrize("shape", [(97, 251), (3, 41, 768)])
def test_layer_norm(hw, shape):
    """Two reductions, the square written over the input block, gamma and beta held on each
    core (loaded by its first block only)."""
    rng = np.random.default_rng(sum(shape))
    n = shape[-1]
    gamma, beta = _rand(rng, n), _rand(rng, n)
    emit, tir = _both(lambda a: op.nn.layer_norm(a, g.const(gamma), g.const(beta), axes=[-1],
                                                 epsilon=1e-5), [shape], hw)
    x = _rand(rng, *shape) * 3 + 1
    mu = x.mean(-1, keepdims=True)
    ref = (x - mu) / np.sqrt(((x - mu) ** 2).mean(-1, keepdims=True) + 1e-5) * gamma + beta
    _check(emit, tir, [x], ref, tol=1e-3)
    sch = tir.tir[0][1]
    blocks = []
    post_order_visit(sch.func.body, lambda b: blocks.append(b) if isinstance(b, Block) else None)
    places = [b.annotations.get(PLACE_KEY) for b in blocks if PLACE_KEY in b.annotations]
    assert places.count("input") == 1 and "stat1" in places
    assert sum(bool(b.annotations.get(HELD_KEY)) for b in blocks) == 2


@pytest.mark.parametrize("hw", HW)
def test_global_average_pool_and_mean(hw):
    rng = np.random.default_rng(7)
    x = _rand(rng, 2, 97, 7, 7)
    emit, tir = _both(lambda a: op.nn.adaptive_avg_pool2d(a, (1, 1)), [x.shape], hw)
    _check(emit, tir, [x], x.mean(axis=(2, 3), keepdims=True), tol=1e-5)
    emit, tir = _both(lambda a: op.mean(a, axis=[2, 3]), [x.shape], hw)
    _check(emit, tir, [x], x.mean(axis=(2, 3)), tol=1e-5)


def test_rows_fall_back_to_the_emitted_lowering():
    """A softmax over another axis is refused by both routes alike (the CPU runs it)."""
    emit, tir = _both(lambda a: op.nn.softmax(a, axis=0), [(33, 17)], "edge")
    assert not tir.tir and tir.cpu_ops == emit.cpu_ops


def test_row_stage_streams_are_the_emitters():
    """The generator's instruction streams of the three row kernels equal the emitter's."""
    cfg = load_config("default")
    for kind in ("softmax", "layer_norm", "mean"):
        streams = []
        for route in ("emit", "tir"):
            ctx = LoweringContext(cfg, route=route)
            x = ctx.alloc((251, 97), "float32")
            if kind == "mean":
                out = ctx.alloc((251, 1), "float32")
                if route == "emit":
                    emit_row_mean(ctx, "mean", x, out, 251)
                else:
                    lower_rows_tir(ctx, "mean", x, out, 251, 97, 1, row_mean_stages(97))
            elif kind == "softmax":
                out = ctx.alloc((251, 97), "float32")
                if route == "emit":
                    emit_softmax(ctx, "nn.softmax", x, out)
                else:
                    lower_rows_tir(ctx, "nn.softmax", x, out, 251, 97, 97, softmax_stages())
            else:
                gm, bt = ctx.alloc((97,), "float32"), ctx.alloc((97,), "float32")
                out = ctx.alloc((251, 97), "float32")
                if route == "emit":
                    emit_layer_norm(ctx, "ln", x, gm, bt, out, 1e-5)
                else:
                    lower_rows_tir(ctx, "ln", x, out, 251, 97, 97, layer_norm_stages(97, 1e-5),
                                   (gm, bt))
            streams.append(ctx.kb.streams)
        assert streams[0] == streams[1], kind


# ---------------------------------------------------------------------------------------------
# pooling and depthwise convolutions: every tap a strided view of the staged input
# ---------------------------------------------------------------------------------------------
def _pool_ref(x, k, s, p, kind):
    n, c, h, w = x.shape
    fill = -np.inf if kind == "max" else 0.0
    xp = np.full((n, c, h + 2 * p, w + 2 * p), fill, x.dtype)
    xp[:, :, p:p + h, p:p + w] = x
    oh, ow = (h + 2 * p - k) // s + 1, (w + 2 * p - k) // s + 1
    win = np.stack([xp[:, :, a:a + s * oh:s, b:b + s * ow:s] for a in range(k) for b in range(k)])
    return win.max(0) if kind == "max" else win.mean(0)


@pytest.mark.parametrize("hw", HW)
@pytest.mark.parametrize("shape,k,s,p", [((1, 13, 29, 29), 3, 2, 1), ((2, 7, 13, 13), 3, 2, 0),
                                         ((1, 97, 14, 14), 2, 2, 0)])
def test_pooling(hw, shape, k, s, p):
    rng = np.random.default_rng(sum(shape) + k)
    x = _rand(rng, *shape)
    emit, tir = _both(lambda a: op.nn.max_pool2d(a, (k, k), (s, s), (p, p, p, p)), [shape], hw)
    _check(emit, tir, [x], _pool_ref(x, k, s, p, "max"))
    emit, tir = _both(lambda a: op.nn.avg_pool2d(a, (k, k), (s, s), (p, p, p, p),
                                                 count_include_pad=True), [shape], hw)
    _check(emit, tir, [x], _pool_ref(x, k, s, p, "avg"), tol=1e-5)


@pytest.mark.parametrize("hw", HW)
@pytest.mark.parametrize("ignore_nan", [True, False])
def test_max_pool_nan(hw, ignore_nan):
    """ONNX MaxPool (``ignore_nan``) skips NaNs -- ``vmaxnm``, IEEE maxNum: a window of NaNs
    only is NaN, as in onnxruntime --; without it a NaN tap makes its window NaN."""
    rng = np.random.default_rng(3)
    x = _rand(rng, 1, 6, 11, 11)
    x[rng.random(x.shape) < 0.2] = np.nan
    x[0, 0, :4, :4] = np.nan  # a window of NaNs only
    emit, tir = _both(lambda a: op.nn.max_pool2d(a, (3, 3), (2, 2), (0, 0, 0, 0),
                                                 ignore_nan=ignore_nan), [x.shape], hw)
    win = np.stack([x[:, :, a:a + 9:2, b:b + 9:2] for a in range(3) for b in range(3)])
    ref = np.fmax.reduce(win, 0) if ignore_nan else np.max(win, 0)
    assert np.isnan(ref[0, 0, 0, 0]) and (ref[~np.isnan(ref)] > -np.inf).all()
    assert_ops = {i.op for s in _streams(tir) for q in s for i in q}
    assert ("vmaxnm" in assert_ops) == ignore_nan and ("vmax" in assert_ops) != ignore_nan
    np.testing.assert_array_equal(tir(x), emit(x))
    np.testing.assert_array_equal(tir(x), ref)
    assert _streams(tir) == _streams(emit)


@pytest.mark.parametrize("hw", HW)
def test_avg_pool_uncounted_padding(hw):
    """Windows of different tap counts: each block multiplied by its rows of the map of
    reciprocal counts, loaded per block into L0 weight and read across the channels."""
    rng = np.random.default_rng(11)
    x = _rand(rng, 1, 5, 9, 9)
    emit, tir = _both(lambda a: op.nn.avg_pool2d(a, (3, 3), (1, 1), (1, 1, 1, 1),
                                                 count_include_pad=False), [x.shape], hw)
    ones = np.ones_like(x)
    ref = _pool_ref(x, 3, 1, 1, "avg") / _pool_ref(ones, 3, 1, 1, "avg")
    _check(emit, tir, [x], ref, tol=1e-5)


@pytest.mark.parametrize("hw", HW)
@pytest.mark.parametrize("shape,s", [((1, 32, 28, 28), 1), ((2, 97, 15, 15), 2),
                                     ((1, 251, 7, 7), 1)])
def test_depthwise_conv(hw, shape, s):
    """MobileNet's 3x3 depthwise convolutions (padding 1): each tap's view times its
    channel's weight, accumulated with vmac into the accumulator block."""
    rng = np.random.default_rng(sum(shape) + s)
    c = shape[1]
    w = _rand(rng, c, 1, 3, 3)
    emit, tir = _both(lambda a: op.nn.conv2d(a, g.const(w), strides=(s, s), padding=(1, 1),
                                             groups=c), [shape], hw)
    x = _rand(rng, *shape)
    ref = torch.nn.functional.conv2d(torch.from_numpy(x), torch.from_numpy(w), stride=s,
                                     padding=1, groups=c).numpy()
    _check(emit, tir, [x], ref, tol=1e-4)
    assert any(k.op == "nn.conv2d.depthwise" and k.tiling.startswith("TIR: ")
               for k in tir.kernels)


def test_pool_streams_are_the_emitters():
    """The generator's streams equal the emitter's, tail blocks (channels and rows) and
    blocks of padding rows only included."""
    for hw in HW:
        cfg = load_config(hw)
        for kind, xs, ohw, pool, st, pad in (("max", (2, 7, 13, 13), (6, 6), (3, 3), (2, 2),
                                              (0, 0, 0, 0)),
                                             ("dw", (1, 97, 29, 29), (15, 15), (3, 3), (2, 2),
                                              (1, 1, 1, 1))):
            streams = []
            for route in ("emit", "tir"):
                ctx = LoweringContext(cfg, route=route)
                x, out = ctx.alloc(xs, "float32"), ctx.alloc(xs[:2] + ohw, "float32")
                wts = ctx.alloc((xs[1], 9), "float32") if kind == "dw" else None
                pool2d_kernel(ctx, "pool", x, out, "max" if kind == "max" else "avg", pool,
                              st, pad, (1, 1), None, wts)
                streams.append(ctx.kb.streams)
            assert streams[0] == streams[1], (hw, kind)


def test_random_elementwise_kernels_are_the_emitters():
    """60 random element-wise kernels -- shapes of primes (97, 251, 1021) and small extents,
    operands broadcasting in random dims, chains of 1-4 steps with immediates and a final
    cast, one and two slots, both descriptions --: the TIR route's streams are the
    emitter's."""
    rng = np.random.default_rng(2026)
    dims = [1, 2, 3, 5, 7, 13, 97, 251, 1021]
    binary = ["vadd", "vsub", "vmul", "vmax", "vmin", "vdiv"]
    for case in range(60):
        hw = HW[case % 2]
        cfg = load_config(hw)
        rank = int(rng.integers(1, 5))
        shape = tuple(int(rng.choice(dims)) for _ in range(rank))
        while np.prod(shape) > 300_000:
            shape = tuple(max(1, d // 7) for d in shape)
        n_in = int(rng.integers(1, 4))
        shapes = [shape] + [tuple(d if rng.random() < 0.5 else 1 for d in shape)[
            int(rng.integers(0, rank)):] for _ in range(n_in - 1)]
        steps = [VecStep("vexp", (("in", 0),))] if n_in == 1 else \
            [VecStep(str(rng.choice(binary)), (("in", 0), ("in", 1)))]
        for k in range(2, n_in):
            steps.append(VecStep(str(rng.choice(binary)), (("out",), ("in", k))))
        if rng.random() < 0.5:
            steps.append(VecStep("vmul", (("out",), ("imm", float(rng.normal())))))
        cast = "float16" if rng.random() < 0.3 else None
        streams = []
        for route in ("emit", "tir"):
            ctx = LoweringContext(cfg, double_buffer=bool(case % 3), route=route)
            ins = [ctx.alloc(s, "float32") for s in shapes]
            out = ctx.alloc(shape, cast or "float32")
            elementwise_kernel(ctx, "k", out, ins, steps, "float32")
            assert bool(ctx.tir) == (route == "tir")
            streams.append(ctx.kb.streams)
        assert streams[0] == streams[1], (hw, shapes, steps, cast)


def test_random_row_and_pool_kernels_are_the_emitters():
    """Random softmax / layer_norm / row-mean shapes and random poolings and depthwise
    convolutions (windows 2-3, strides 1-2, padding 0-1, prime channels and sizes): the TIR
    route's streams are the emitter's (a pooling whose staged rows are wider than its windows
    read is the emitter's kernel on both routes)."""
    rng = np.random.default_rng(28)
    for case in range(24):
        cfg = load_config(HW[case % 2])
        rows, length = int(rng.choice([1, 7, 97, 251])), int(rng.choice([13, 97, 251, 768]))
        kind = ("softmax", "layer_norm", "mean")[case % 3]
        stages = {"softmax": softmax_stages(), "layer_norm": layer_norm_stages(length, 1e-6),
                  "mean": row_mean_stages(length)}[kind]
        out_len = 1 if kind == "mean" else length
        streams = []
        for route in ("emit", "tir"):
            ctx = LoweringContext(cfg, double_buffer=bool(case % 4), route=route)
            x, out = ctx.alloc((rows, length), "float32"), ctx.alloc((rows, out_len), "float32")
            consts = tuple(ctx.alloc((length,), "float32") for _ in range(2)) \
                if kind == "layer_norm" else ()
            if route == "tir":
                lower_rows_tir(ctx, kind, x, out, rows, length, out_len, stages, consts)
            elif kind == "softmax":
                emit_softmax(ctx, kind, x, out)
            elif kind == "mean":
                emit_row_mean(ctx, kind, x, out, rows)
            else:
                emit_layer_norm(ctx, kind, x, *consts, out, 1e-6)
            streams.append(ctx.kb.streams)
        assert streams[0] == streams[1], (kind, rows, length)
    for case in range(24):
        cfg = load_config(HW[case % 2])
        kind = ("max", "avg", "dw")[case % 3]
        n, c = int(rng.integers(1, 3)), int(rng.choice([3, 13, 97]))
        h = int(rng.choice([7, 13, 29]))
        k, s, p = int(rng.integers(2, 4)), int(rng.integers(1, 3)), int(rng.integers(0, 2))
        o = (h + 2 * p - k) // s + 1
        streams = []
        for route in ("emit", "tir"):
            ctx = LoweringContext(cfg, double_buffer=bool(case % 4), route=route)
            x, out = ctx.alloc((n, c, h, h), "float32"), ctx.alloc((n, c, o, o), "float32")
            wts = ctx.alloc((c, k * k), "float32") if kind == "dw" else None
            pool2d_kernel(ctx, "pool", x, out, "max" if kind == "max" else "avg", (k, k),
                          (s, s), (p, p, p, p), (1, 1), float(k * k) if kind == "avg" else None,
                          wts)
            streams.append(ctx.kb.streams)
        assert streams[0] == streams[1], (kind, n, c, h, k, s, p)
