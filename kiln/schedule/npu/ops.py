"""The NPU lowerings of graph ops (registered with :func:`.lowering.register_lowering`).

Float products run on the tensor unit in float16 with float32 accumulation (the description's
fp16 x fp16 -> fp32 tile product): a float32 activation is cast to float16 by a vector kernel
before the product, constant weights are cast and laid out at compile time. int8 x int8 ->
int32 products (``out_dtype="int32"``) run as they are and are exact.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, replace
from typing import Any

import numpy as np

from ...npu import numerics
from ...target.npu.config import NPUConfig
from .banded import (
    BandedGeometry,
    banded_block_widths,
    banded_geometry,
    banded_rows,
    banded_transfers,
    banded_weights,
)
from .emit import DramTensor, KernelInfo, block, itemsize, row_major
from .feedback import emit_choosing_slots, lower_with_feedback
from .gemm import (
    GemmShape,
    GemmTiling,
    GemmTransfers,
    acc_slots,
    acc_strides,
    emit_gemm,
    feasible_tilings,
    gemm_kernel_info,
    plan_candidates,
    plan_gemm,
    tile_bytes,
)
from .lowering import LoweringContext, NotSupported, register_lowering
from .pooling import FLOAT_DTYPES as _FLOAT
from .scalar import emit_scalar_elementwise
from .vector import (
    VecStep,
    cast_kernel,
    elementwise_kernel,
    emit_elementwise,
    pool2d_cost,
    pool2d_kernel,
)

__all__ = ["BINARY_OPS", "COMPOSITE_OPS", "ELEMENTWISE_OPS", "GEMM_OPS", "UNARY_OPS",
           "BANDED_ACC_SHARE", "BANDED_FORMS", "BANDED_MAX_GROUP", "BANDED_ROWS_L1_SHARE",
           "DEPTHWISE_UNITS",
           "ConvFn", "ConvGeometry", "ConvPlanes",
           "DepthwiseChoice", "DepthwiseCosts", "DepthwisePart",
           "ONCHIP_SHARE", "check_broadcast_shape", "conv_geometry", "divide_multiplier",
           "conv_transfers", "conv_weight_layout", "depthwise_group", "depthwise_parts",
           "banded_plan", "call_depthwise_route", "depthwise_route",
           "depthwise_tensor_dtype",
           "depthwise_weights",
           "elementwise_steps", "grouped_conv",
           "is_depthwise", "is_pointwise", "lower_elementwise_chain", "onchip_input",
           "operand_dtype", "planned_geometry", "product_operand_dtype"]

#: Graph op -> vector opcode of the element-wise ops.
BINARY_OPS = {"add": "vadd", "subtract": "vsub", "multiply": "vmul", "divide": "vdiv",
              "maximum": "vmax", "minimum": "vmin"}
UNARY_OPS = {"relu": "vrelu", "exp": "vexp", "negative": "vneg", "abs": "vabs",
             "rsqrt": "vrsqrt", "erf": "verf"}
#: Composite activations: vector steps around ``vexp`` and a reciprocal (``vdiv`` of a
#: broadcast 1): sigmoid(x) = 1 / (1 + e^-x), tanh(x) = 2 sigmoid(2x) - 1.
COMPOSITE_OPS = ("sigmoid", "tanh")
#: What :func:`lower_elementwise` (and a fused chain) takes.
ELEMENTWISE_OPS = (*BINARY_OPS, *UNARY_OPS, *COMPOSITE_OPS, "clip")


def _vector_dtype(ctx: LoweringContext, dtype: str, op: str) -> None:
    if not ctx.config.supports_vector_dtype(dtype):
        raise NotSupported(f"{op}: the vector unit does not compute in {dtype}")


def _scalar(arg: Any) -> float | None:
    """A constant operand with one element, as an immediate (else None)."""
    if isinstance(arg, np.ndarray) and arg.size == 1:
        return float(arg.reshape(-1)[0])
    return None


def divide_multiplier(divisor: float, dtype: str) -> float | None:
    """The immediate ``m`` with ``vmul(x, m)`` bit for bit ``vdiv(x, divisor)`` in ``dtype``
    (a float), or None. ``vdiv`` is specified as ``x * recip(b)`` in float32 with ``recip``
    the unit's reciprocal approximation (:func:`~kiln.npu.numerics.div_approx`), and an
    immediate is first rounded to the destination's type: so ``m = recip(divisor as dtype)``
    gives the same bits wherever ``m`` is itself a value of ``dtype`` (always in float32, the
    accumulators' type; in float16 rarely: recip(8) is 0.12499999 in float32). ``vmul`` costs
    one vector cycle per block against ``vdiv``'s ``[vector.cost] div`` (4 on both
    descriptions): the scaled dot product's ``/ sqrt(d)`` in Q @ K^T's fused epilogue was
    most of that kernel's vector time (default, BERT-base's 128 x 128 scores: 9322 -> 5337
    cycles)."""
    if dtype not in _FLOAT:
        return None
    b = numerics.to_f32(numerics.from_f32(np.asarray(divisor, np.float32), dtype))
    m = numerics.recip_approx(b)
    if not np.isfinite(m) or numerics.to_f32(numerics.from_f32(m, dtype)) != m:
        return None
    return float(m)


def elementwise_steps(ctx: LoweringContext, call: Any, args: list[Any], dtype: str,
                      running: int | None, inputs: list[DramTensor]) -> list[VecStep]:
    """The vector steps of element-wise ``call`` computing into the output block; operand
    ``running`` (if given) is the output block's current value (an element-wise chain's
    previous result), other tensor operands are appended to ``inputs``. Raises NotSupported."""
    op = call.op.name
    _vector_dtype(ctx, dtype, op)
    if (op in ("divide", "clip", *COMPOSITE_OPS) or
            op in UNARY_OPS and op not in ("relu", "negative", "abs")) and dtype not in _FLOAT:
        raise NotSupported(f"{op}: the vector unit computes it on floats only")

    def src(i: int) -> tuple[Any, ...]:
        if i == running:
            return ("out",)
        a = args[i]
        if isinstance(a, np.ndarray):
            a = ctx.constant(np.asarray(a, dtype))
        if a.dtype != dtype:
            raise NotSupported(f"{op}: operands of different dtypes")
        inputs.append(a)
        return ("in", len(inputs) - 1)

    if op in BINARY_OPS:
        imm = _scalar(args[1])
        if imm is not None and (running == 0 or isinstance(args[0], DramTensor)):
            mul = divide_multiplier(imm, dtype) if op == "divide" else None
            if mul is not None:  # the same bits as vdiv, a quarter of its cycles
                return [VecStep("vmul", (src(0), ("imm", mul)))]
            return [VecStep(BINARY_OPS[op], (src(0), ("imm", imm)))]
        return [VecStep(BINARY_OPS[op], (src(0), src(1)))]
    if op in UNARY_OPS:
        return [VecStep(UNARY_OPS[op], (src(0),))]
    if op in COMPOSITE_OPS:
        x = src(0)
        inputs.append(ctx.constant(np.ones(1, dtype)))
        one = ("in", len(inputs) - 1)
        scale = -2.0 if op == "tanh" else -1.0
        steps = [VecStep("vmul", (x, ("imm", scale))), VecStep("vexp", (("out",),)),
                 VecStep("vadd", (("out",), ("imm", 1.0))), VecStep("vdiv", (one, ("out",)))]
        if op == "tanh":
            steps += [VecStep("vmul", (("out",), ("imm", 2.0))),
                      VecStep("vadd", (("out",), ("imm", -1.0)))]
        return steps
    if op == "clip":
        lo, hi = call.attrs.min, call.attrs.max
        x = src(0)
        steps = [VecStep("vmax", (x, ("imm", float(lo))))] if lo is not None else []
        if hi is not None:
            steps.append(VecStep("vmin", (("out",) if steps else x, ("imm", float(hi)))))
        return steps or [VecStep("vmov", (x,))]
    raise NotSupported(f"{op} is not element-wise")


def check_broadcast_shape(op: str, inputs: list[DramTensor], out: DramTensor) -> None:
    """NotSupported unless every operand broadcasts to ``out`` (numpy rules)."""
    for x in inputs:
        shape = (1,) * (len(out.shape) - len(x.shape)) + x.shape
        if len(shape) != len(out.shape) or \
                any(a not in (1, b) for a, b in zip(shape, out.shape)):
            raise NotSupported(f"{op}: operand {x.shape} does not broadcast to {out.shape}")


def _off_vector(ctx: LoweringContext, call: Any, args: list[Any], out: DramTensor) -> bool:
    """Whether some dtype of the call is not a vector dtype (then the scalar unit runs it)."""
    dts = [out.dtype] + [str(a.dtype) for a in args if isinstance(a, DramTensor)]
    return any(not ctx.config.supports_vector_dtype(dt) for dt in dts)


@register_lowering(ELEMENTWISE_OPS)
def lower_elementwise(ctx: LoweringContext, call: Any, args: list[Any], out: DramTensor
                      ) -> None:
    """On the vector unit; an op whose dtype the vector unit lacks on the scalar unit."""
    inputs: list[DramTensor] = []
    try:
        steps = elementwise_steps(ctx, call, args, out.dtype, None, inputs)
    except NotSupported as err:
        if not _off_vector(ctx, call, args, out):
            raise
        return emit_scalar_elementwise(ctx, call, args, out, str(err))
    check_broadcast_shape(call.op.name, inputs, out)
    emit_elementwise(ctx, call.op.name, out, inputs, steps)


def lower_elementwise_chain(ctx: LoweringContext, chain: list[tuple[Any, list[Any], int | None]],
                            out: DramTensor, dtype: str) -> None:
    """One kernel for a chain of element-wise calls, each (but the first) consuming the
    previous one's result (operand ``running``), all of ``out``'s shape and of ``dtype``: the
    intermediate results stay in the accumulator block instead of going through DRAM. An
    ``out`` of another dtype gets the result cast (for a product's operand)."""
    inputs: list[DramTensor] = []
    steps: list[VecStep] = []
    for call, args, running in chain:
        steps += elementwise_steps(ctx, call, args, dtype, running, inputs)
    names = "+".join(c.op.name for c, _, _ in chain)
    check_broadcast_shape(names, inputs, out)
    if out.dtype != dtype:
        _vector_dtype(ctx, out.dtype, names)
    elementwise_kernel(ctx, names, out, inputs, steps, dtype)


@register_lowering("cast")
def lower_cast(ctx: LoweringContext, call: Any, args: list[Any], out: DramTensor) -> None:
    x = ctx.tensor(args[0])
    for dt in (x.dtype, out.dtype):
        if not ctx.config.supports_vector_dtype(dt):
            return emit_scalar_elementwise(ctx, call, [x], out, f"cast: the vector unit does "
                                           f"not compute in {dt}")
    emit_elementwise(ctx, "cast", out, [x], [VecStep("vcast", (("in", 0),),
                                                     (("mode", "rtz"),))])


@register_lowering(("reshape", "squeeze", "expand_dims"))
def lower_view(ctx: LoweringContext, call: Any, args: list[Any], out: DramTensor) -> None:
    """Handled by the caller as an alias of the operand's DRAM (no data moves)."""
    raise NotSupported("views are aliases, never kernels")


# ---------------------------------------------------------------------------------------------
# products
# ---------------------------------------------------------------------------------------------
def operand_dtype(ctx: LoweringContext, op: str, x_dtype: str, w_dtype: str,
                   out_dtype: str) -> str:
    """The tensor unit's operand type for a product of these dtypes."""
    if x_dtype == w_dtype == "int8" and out_dtype == "int32":
        dt = "int8"
    elif x_dtype in _FLOAT and w_dtype in _FLOAT and out_dtype == "float32":
        dt = "bfloat16" if x_dtype == w_dtype == "bfloat16" else "float16"
    else:
        raise NotSupported(f"{op}: no tensor-unit product for {x_dtype} x {w_dtype} -> "
                           f"{out_dtype}")
    if ctx.config.tensor_dtype(dt, dt) is None:
        raise NotSupported(f"{op}: the tensor unit of {ctx.config.name!r} lacks {dt}")
    return dt


#: The ops computed on the tensor unit (their first operand is the activation).
GEMM_OPS = ("dense", "matmul", "nn.conv2d")


def product_operand_dtype(ctx: LoweringContext, call: Any, x_dtype: str) -> str | None:
    """The dtype GEMM op ``call`` wants its activation in (None: as it is or no product):
    float16 for a float product with a constant float weight."""
    if call.op.name not in GEMM_OPS or len(call.args) < 2:
        return None
    w = call.args[1]
    groups = getattr(call.attrs, "groups", 1)
    wd = str(getattr(w.struct_info, "dtype", ""))
    out_dt = str(getattr(call.struct_info, "dtype", ""))
    if groups != 1 and is_depthwise(groups, tuple(_dims(call.args[0])), tuple(_dims(w))):
        if call_depthwise_route(ctx, call).route == "vector":
            return None  # on the vector unit, in the activation's own dtype
    if x_dtype in _FLOAT and wd in _FLOAT and out_dt == "float32" and x_dtype != "float16" \
            and ctx.config.tensor_dtype("float16", "float16") is not None:
        return "float16"
    return None


def _dims(e: Any) -> list[Any]:
    return [getattr(d, "value", d) for d in (getattr(e.struct_info, "shape", None) or ())]


def _activation(ctx: LoweringContext, x: Any, dt: str, op: str) -> DramTensor:
    if isinstance(x, np.ndarray):
        return ctx.constant(x, dt)
    return x if x.dtype == dt else cast_kernel(ctx, x, dt, f"{op}.cast")


def _plan(ctx: LoweringContext, op: str, shape: GemmShape) -> Any:
    try:
        return plan_gemm(ctx.config, shape, ctx.kb.nbuf, context=ctx.kb.knob_context())
    except ValueError as err:
        raise NotSupported(f"{op}: {err}") from None


def _gemm_2d(ctx: LoweringContext, op: str, x: Any, w: Any, out: DramTensor,
             w_is_nk: bool) -> None:
    """``out[..., M, N] = x[..., M, K] @ W`` with W ``[N, K]`` (dense) or ``[K, N]``."""
    wd = w.dtype if isinstance(w, DramTensor) else str(w.dtype)
    xd = x.dtype if isinstance(x, DramTensor) else str(x.dtype)
    dt = operand_dtype(ctx, op, xd, wd, out.dtype)
    if len(w.shape) != 2:
        if w_is_nk:
            raise NotSupported(f"{op}: batched weights")
        return _batch_matmul(ctx, x, w, out, dt)
    k = w.shape[1] if w_is_nk else w.shape[0]
    n = w.shape[0] if w_is_nk else w.shape[1]
    m = int(np.prod(out.shape[:-1], dtype=np.int64))
    shape = GemmShape(1, m, 1, n, k, 1, dt)
    try:
        tilings = plan_candidates(ctx.config, shape, ctx.kb.nbuf,
                                  context=ctx.kb.knob_context())
    except ValueError as err:
        raise NotSupported(f"{op}: {err}") from None
    xa = _activation(ctx, x, dt, op)
    if isinstance(w, np.ndarray):
        wt = ctx.constant(np.ascontiguousarray(w.T if w_is_nk else w), dt)  # [K, N]
        b_strides = (0, n, 1)
    else:
        wt = _activation(ctx, w, dt, op)
        b_strides = (0, 1, k) if w_is_nk else (0, n, 1)
    kb = ctx.kb

    def load_a(core: int, b: int, m0: int, ms: int, k0: int, ks: int, addr: int,
               slot: int) -> None:
        kb.load(core, shape=(1, ms, ks), dst=block("input", addr, dt, (0, ks, 1)),
                src=xa.at(m0 * k + k0, (0, k, 1)))

    def load_b(core: int, b: int, k0: int, ks: int, n0: int, ns: int, addr: int) -> None:
        off = (k0 * n + n0) if b_strides[1] == n else (n0 * k + k0)
        kb.load(core, shape=(1, ks, ns), dst=block("weight", addr, dt, (0, ns, 1)),
                src=wt.at(off, b_strides))

    def store_c(core: int, b: int, m0: int, ms: int, n0: int, ns: int, addr: int) -> None:
        kb.store(core, shape=(1, ms, ns), dst=out.at(m0 * n + n0, (0, n, 1)),
                src=block("acc", addr, out.dtype, (0, ns, 1)))

    def attempt(tiling: GemmTiling) -> None:
        emit_gemm(kb, shape, tiling, load_a, load_b, store_c)
        kb.end_kernel(gemm_kernel_info(ctx.config, ctx.label(op), op, tiling.describe(shape),
                                       tiling.estimate, shape, tiling.knob,
                                       constant_b=isinstance(w, np.ndarray),
                                       c_itemsize=kb.result_itemsize(out.dtype)))

    lower_with_feedback(ctx, op, tilings, attempt, lambda t: t.describe(shape))


def _batch_offsets(shape: tuple[int, ...], batch: tuple[int, ...]) -> list[int]:
    """Element offset of each matrix of ``shape`` (``[..., R, C]``) per entry of the result's
    ``batch`` dims, broadcasting (numpy rules) the operand's leading dims."""
    lead = (1,) * (len(batch) - len(shape[:-2])) + tuple(shape[:-2])
    size = shape[-2] * shape[-1]
    strides = [0 if n == 1 else s * size for n, s in zip(lead, row_major(lead))]
    return [sum(i * s for i, s in zip(idx, strides)) for idx in np.ndindex(*batch)]


def _batch_matmul(ctx: LoweringContext, x: Any, w: Any, out: DramTensor, dt: str) -> None:
    """``out[b] = x[b] @ w[b]`` with both operands batched (broadcast dims allowed): attention's
    ``Q @ K^T`` and ``P @ V``, whose right operand is computed at run time; one GEMM per batch
    entry, loaded from its own offsets (nothing is shared between entries)."""
    if len(x.shape) < 2:
        raise NotSupported("matmul: vector left operand")
    batch = out.shape[:-2]
    m, k, n = x.shape[-2], x.shape[-1], w.shape[-1]
    x_off, w_off = _batch_offsets(x.shape, batch), _batch_offsets(w.shape, batch)
    shape = GemmShape(len(x_off), m, 1, n, k, 1, dt, b_shared=False)
    tiling = _plan(ctx, "matmul", shape)
    xa, wa = _activation(ctx, x, dt, "matmul"), _activation(ctx, w, dt, "matmul")
    kb = ctx.kb

    def load_a(core: int, b: int, m0: int, ms: int, k0: int, ks: int, addr: int,
               slot: int) -> None:
        kb.load(core, shape=(1, ms, ks), dst=block("input", addr, dt, (0, ks, 1)),
                src=xa.at(x_off[b] + m0 * k + k0, (0, k, 1)))

    def load_b(core: int, b: int, k0: int, ks: int, n0: int, ns: int, addr: int) -> None:
        kb.load(core, shape=(1, ks, ns), dst=block("weight", addr, dt, (0, ns, 1)),
                src=wa.at(w_off[b] + k0 * n + n0, (0, n, 1)))

    def store_c(core: int, b: int, m0: int, ms: int, n0: int, ns: int, addr: int) -> None:
        kb.store(core, shape=(1, ms, ns), dst=out.at((b * m + m0) * n + n0,
                                                                  (0, n, 1)),
                src=block("acc", addr, out.dtype, (0, ns, 1)))

    emit_gemm(kb, shape, tiling, load_a, load_b, store_c)
    kb.end_kernel(gemm_kernel_info(ctx.config, ctx.label("matmul"), "matmul",
                                   tiling.describe(shape), tiling.estimate, shape, tiling.knob,
                                   c_itemsize=kb.result_itemsize(out.dtype)))


@register_lowering("dense")
def lower_dense(ctx: LoweringContext, call: Any, args: list[Any], out: DramTensor) -> None:
    _gemm_2d(ctx, "dense", args[0], args[1], out, w_is_nk=True)


@register_lowering("matmul")
def lower_matmul(ctx: LoweringContext, call: Any, args: list[Any], out: DramTensor) -> None:
    if len(args[0].shape) < 2:
        raise NotSupported("matmul: vector left operand")
    _gemm_2d(ctx, "matmul", args[0], args[1], out, w_is_nk=False)


#: ``conv(ctx, attrs, x, w, out, dtype)``: lowers one ungrouped convolution (a route's).
ConvFn = Callable[[LoweringContext, Any, Any, np.ndarray, DramTensor, str], None]


def is_depthwise(groups: int, x_shape: tuple[int, ...], w_shape: tuple[int, ...]) -> bool:
    """One input channel per group and one output channel per input channel."""
    return groups == x_shape[1] == w_shape[0] and w_shape[1] == 1


@register_lowering("nn.conv2d")
def lower_conv2d(ctx: LoweringContext, call: Any, args: list[Any], out: DramTensor) -> None:
    """Implicit GEMM: M = output rows of OW pixels, K = input channels x taps, N = output
    channels; the A tile is gathered by one strided DMA with padding per tap. A depthwise
    convolution runs on the vector unit, another grouped one as one GEMM per group."""
    at = call.attrs
    if at.data_layout != "NCHW" or at.kernel_layout != "OIHW":
        raise NotSupported(f"nn.conv2d: layout {at.data_layout}/{at.kernel_layout}")
    x, w = args
    if at.groups != 1 and is_depthwise(at.groups, x.shape, w.shape):
        return _depthwise(ctx, call, x, w, out)
    if not isinstance(w, np.ndarray):
        raise NotSupported("nn.conv2d: weights computed at run time")
    dt = operand_dtype(ctx, "nn.conv2d", x.dtype if isinstance(x, DramTensor) else
                        str(x.dtype), str(w.dtype), out.dtype)
    if at.groups != 1:
        return grouped_conv(ctx, at, x, w, out, dt, _conv)
    _conv(ctx, at, x, w, out, dt)


def grouped_conv(ctx: LoweringContext, at: Any, x: Any, w: np.ndarray, out: DramTensor,
                 dt: str, conv: ConvFn) -> None:
    """A grouped convolution: in NCHW each group's input and output channels are contiguous
    per image, so every (image, group) pair is an ordinary convolution of DRAM sub-tensors --
    one GEMM kernel each, lowered by ``conv`` (the emitter's or the TIR route's; a float32
    activation is cast to float16 per group, the same traffic as one cast of the whole, and
    after the first group's tiling is known to fit)."""
    nb, c, h, wd = x.shape
    o, cg = w.shape[0], w.shape[1]
    groups = at.groups
    og = o // groups
    oh, ow = out.shape[2:]
    xa = ctx.tensor(x)
    isz, osz = itemsize(xa.dtype), itemsize(out.dtype)
    for n in range(nb):
        for gi in range(groups):
            xs = DramTensor(xa.addr + (n * c + gi * cg) * h * wd * isz, (1, cg, h, wd),
                            xa.dtype)
            os_ = DramTensor(out.addr + (n * o + gi * og) * oh * ow * osz, (1, og, oh, ow),
                             out.dtype)
            conv(ctx, at, xs, w[gi * og:(gi + 1) * og], os_, dt)


def is_pointwise(at: Any, w_shape: tuple[int, ...]) -> bool:
    """A 1x1 stride-1 unpadded convolution (lowered as ``W @ X`` per image, no staging)."""
    return tuple(w_shape[2:]) == (1, 1) and tuple(at.strides) == (1, 1) and \
        not any(at.padding)


@dataclass(frozen=True)
class ConvGeometry:
    """An ungrouped NCHW/OIHW convolution as the implicit GEMM both lowering routes build:
    the planner's :class:`~.gemm.GemmShape` (an M unit is one output row of ``ow`` pixels, a
    K unit one input channel times the ``kh * kw`` taps) and the staging of the input rows in
    L1: ``rstep`` (image rows between staged rows: ``sh`` for a strided 1x1 whose rows are
    staged alone, else 1) and ``width`` (pixels of a staged row, the window's padding
    included)."""

    nb: int
    c: int
    h: int
    w: int
    o: int
    kh: int
    kw: int
    oh: int
    ow: int
    sh: int
    sw: int
    dh: int
    dw: int
    pt: int
    pl: int
    rstep: int
    width: int
    shape: GemmShape

    @property
    def taps(self) -> int:
        return self.kh * self.kw


#: A convolution's accumulator tile is column-major (``GemmShape.acc_columns``): each output
#: channel's pixels contiguous, so the tail pieces and a fused epilogue's chunks (ranges of
#: channels) are address ranges of their own that the bank-group placement can separate;
#: row-major (``acc_padded``) they interleave over the whole tile.
CONV_ACC_COLUMNS = True


#: The largest share of L1 an input may take for :func:`onchip_input` to count on
#: residency keeping it there: the pass places every live intermediate of the kernel and
#: the kernels' own staging slots in L1 too, so an input near L1's size is not kept.
ONCHIP_SHARE = 4


def onchip_input(ctx: LoweringContext, x: Any, dt: str) -> bool:
    """Whether a convolution's input ``x`` (read in ``dt``) will be staged from L1: the
    planner's prediction of :mod:`.residency`, which runs after the program is emitted and
    moves the intermediates that only the program's DMAs touch into L1 where they fit. An
    intermediate (not a constant, not an input of the program or a CPU step's result:
    ``ctx.pinned``) of at most ``1 / ONCHIP_SHARE`` of L1 is predicted resident. Only with
    ``ctx.plan_residency`` (the PassContext option ``"npu.plan_residency"`` and residency
    on). Default, ResNet-18's 3x3/s2 of stage 2 (input 401 KB, staged from L1): the staging
    counted the image on the DRAM channel once per core, so splitting the cores along N
    looked dearer than along M, where each core loads all the weights."""
    if not ctx.plan_residency:
        return False
    t = getattr(x, "tensor", x)  # a view (a group's channels) reads its tensor
    if not isinstance(t, DramTensor) or t.addr in ctx.pinned:
        return False
    nbytes = int(np.prod(t.shape, dtype=np.int64)) * max(itemsize(t.dtype), itemsize(dt))
    return nbytes * ONCHIP_SHARE <= ctx.config.memory("l1").size


def planned_geometry(ctx: LoweringContext, at: Any, x: Any, w_shape: tuple[int, ...],
                     out_shape: tuple[int, ...], dt: str) -> ConvGeometry:
    """:func:`conv_geometry` of a convolution as this build plans it (both routes): its
    input staged from L1 where residency will keep it there (:func:`onchip_input`)."""
    return conv_geometry(ctx.config, at, x.shape, w_shape, out_shape, dt,
                         onchip_input(ctx, x, dt))


def conv_geometry(cfg: NPUConfig, at: Any, x_shape: tuple[int, ...],
                  w_shape: tuple[int, ...], out_shape: tuple[int, ...], dt: str,
                  onchip: bool = False) -> ConvGeometry:
    """The implicit GEMM of a (not pointwise) convolution: one definition for the emitter
    (:func:`lower_conv2d`) and the TIR route (:mod:`.tir_conv`), so both plan the same
    :class:`~.gemm.GemmShape` and get the same tiling. ``onchip``: the input is staged from
    L1 (:func:`onchip_input`), which the planner counts (``GemmShape.stage_onchip``) where the
    convolution reads its image rows with a stride (``stage_stride > 1``, a 3x3/s2): there
    the cores splitting N, each staging the whole image from L1, wins (default, ResNet-18's
    stage-2 3x3/s2: 17933 -> 16473 cycles). Elsewhere the tiling stays the DRAM plan's:
    counted for every convolution, the planner split the 1x1/s2 downsamples otherwise and
    the stride-1 3x3s of stage 4 along N128 (measured: 2878 -> 3680 cycles for stage 2's
    downsample, and the next kernel's weights prefetched into the one before)."""
    nb, c, h, wd = x_shape
    o, _, kh, kw = w_shape
    _, _, oh, ow = out_shape
    (sh, sw), (dh, dw) = at.strides, at.dilation
    pt, pl = at.padding[0], at.padding[1]
    taps = kh * kw
    l1 = cfg.memory("l1")
    # A window one row high with a row stride > 1 (a strided 1x1 shortcut) reads every
    # sh-th input row only: stage those rows alone (sh times less DRAM traffic) -- unless
    # the rows are narrower than a DRAM burst, whose whole bursts make the rows read cost
    # more than the whole image read contiguously (a 14-pixel float16 row: 28 bytes, one
    # 64-byte burst). The roofline counts the cheaper of the two, in whole bursts.
    burst = cfg.memory("dram").burst
    rows = sum(0 <= r * sh - pt < h for r in range(oh)) if kh == 1 else h
    row_cost = rows * -(-wd * itemsize(dt) // burst) * burst
    rstep = sh if kh == 1 and sh > 1 and row_cost < h * wd * itemsize(dt) else 1
    a_bytes = row_cost if rstep > 1 else h * wd * itemsize(dt)
    # the staged rows carry the window's padding: pl zero pixels on the left, as many on the
    # right as the last window reaches past the image, and zero rows above and below
    width = pl + wd + max(0, (ow - 1) * sw + (kw - 1) * dw + 1 - pl - wd)
    shape = GemmShape(nb, oh, ow, o, c, taps, dt, a_dmas=taps, a_dmas_row=kh,
                      a_elems=c * -(-a_bytes // itemsize(dt)),
                      stage_stride=sh // rstep, stage_halo=(kh - 1) * dh + 1, stage_row=wd,
                      stage_width=width, stage_pad=l1.bank_width,
                      acc_padded=not CONV_ACC_COLUMNS, acc_columns=CONV_ACC_COLUMNS,
                      stage_runs=rstep > 1, stage_onchip=onchip and sh // rstep > 1)
    return ConvGeometry(nb, c, h, wd, o, kh, kw, oh, ow, sh, sw, dh, dw, pt, pl, rstep, width,
                        shape)


#: ``planes(b) -> (input plane, output plane, weight offset)`` of a convolution's batch
#: entry ``b``: the first channel plane of its input and of its output (in planes of
#: ``H x W``, ``OH x OW`` elements) and the offset of its weights (elements).
ConvPlanes = Callable[[int], tuple[int, int, int]]


def conv_transfers(ctx: LoweringContext, geo: ConvGeometry, tiling: GemmTiling,
                   xa: DramTensor, wl: DramTensor, out: DramTensor,
                   planes: ConvPlanes | None = None) -> GemmTransfers:
    """The DMAs of ``geo`` under ``tiling`` from image ``xa`` (NCHW, in the operand dtype),
    weights ``wl`` (``[taps, C, O]``) into ``out`` (NCHW): the staging of the input rows in
    the core's L1 slot, the gather of the A tile per tap, the weight tile, the store of the
    output tile (see the nested functions). ``planes``: where batch entry ``b`` reads and
    writes (default: image ``b``, the weights shared); a depthwise convolution's batch is
    its (image, channel group) pairs, each with its own block-diagonal weights."""
    shape, dt = geo.shape, geo.shape.dtype
    c, h, wd, o, oh, ow = geo.c, geo.h, geo.w, geo.o, geo.oh, geo.ow
    kh, kw, sh, sw, dh, dw = geo.kh, geo.kw, geo.sh, geo.sw, geo.dh, geo.dw
    pt, pl, rstep, width, taps = geo.pt, geo.pl, geo.rstep, geo.width, geo.taps
    stage_slot = shape.stage_bytes(tiling.m_units, tiling.k_units)
    px = shape.stage_pixel(tiling.k_units)  # elements per staged pixel (channels innermost)
    row_px = width * px  # elements per staged row
    c_row, c_col = acc_strides(ctx.config, shape, tiling, tiling.n)
    kb = ctx.kb
    isz = itemsize(dt)
    plane = planes or (lambda b: (b * c, b * o, 0))

    def slot_addr(core: int, slot: int) -> int:
        return (core * kb.nbuf + slot) * stage_slot

    def stage_a(core: int, b: int, r0: int, rs: int, c0: int, cs: int, slot: int) -> None:
        """Stage the input rows the tile's windows cover in L1 with their padding (one DMA,
        contiguous in DRAM), channels innermost: every window is then contiguous channel
        runs, gathered without padding."""
        lo, nbox = r0 * sh - pt, shape.stage_rows(rs)  # first window row; staged rows
        first = min(nbox, max(0, -(lo // rstep)))
        last = max(first, min(nbox, -(-(h - lo) // rstep)))
        dst = block("l1", slot_addr(core, slot), dt, (1, row_px, px))
        if kb.stage_begin(core, dst, (cs, nbox, width), last == first):
            return
        kb.load(core, shape=(cs, last - first, wd), dst=dst,
                src=xa.at(((plane(b)[0] + c0) * h + lo + first * rstep) * wd,
                          (h * wd, rstep * wd, 1)),
                pad_lo=(0, first, pl), pad_hi=(0, nbox - last, width - pl - wd), fill=0)

    def load_a(core: int, b: int, r0: int, rs: int, c0: int, cs: int, addr: int,
               slot: int) -> None:
        """Gather the A tile (row-major: pixel, tap, channel) from the staged rows: per tap,
        one DMA of every row's windows, or for a tile of fewer rows than the kernel is wide
        per row and kernel row one DMA of its ``KW`` taps."""
        kt = cs * taps
        base = slot_addr(core, slot)
        if rs < kw:
            for r in range(rs):
                for a in range(kh):
                    src = (r * sh + a * dh) // rstep * row_px
                    kb.load(core, shape=(ow, kw, cs),
                            dst=block("input", addr + (r * ow * kt + a * kw * cs) * isz, dt,
                                      (kt, cs, 1)),
                            src=block("l1", base + src * isz, dt, (sw * px, dw * px, 1)))
            return
        for a in range(kh):
            for e in range(kw):
                src = a * dh // rstep * row_px + e * dw * px
                kb.load(core, shape=(rs, ow, cs),
                        dst=block("input", addr + (a * kw + e) * cs * isz, dt, (ow * kt, kt, 1)),
                        src=block("l1", base + src * isz, dt, (sh // rstep * row_px, sw * px, 1)))

    def load_b(core: int, b: int, c0: int, cs: int, n0: int, ns: int, addr: int) -> None:
        kb.load(core, shape=(taps, cs, ns),
                dst=block("weight", addr, dt, (cs * ns, ns, 1)),
                src=wl.at(plane(b)[2] + c0 * o + n0, (c * o, o, 1)))

    def store_c(core: int, b: int, r0: int, rs: int, n0: int, ns: int, addr: int) -> None:
        kb.store(core, shape=(1, ns, rs * ow),
                dst=out.at((plane(b)[1] + n0) * oh * ow + r0 * ow, (0, oh * ow, 1)),
                src=block("acc", addr, out.dtype, (0, c_col, c_row)))

    return GemmTransfers(stage_a, load_a, load_b, store_c)


def _conv(ctx: LoweringContext, at: Any, x: Any, w: np.ndarray, out: DramTensor,
          dt: str) -> None:
    """An ungrouped convolution (see :func:`lower_conv2d`), emitted directly."""
    if is_pointwise(at, w.shape):
        return _pointwise(ctx, x, w, out, dt)
    geo = planned_geometry(ctx, at, x, w.shape, out.shape, dt)
    shape = geo.shape
    tiling = _plan(ctx, "nn.conv2d", shape)
    xa = _activation(ctx, x, dt, "nn.conv2d")
    wl = ctx.constant(conv_weight_layout(w), dt)
    t = conv_transfers(ctx, geo, tiling, xa, wl, out)

    def emit() -> None:
        emit_gemm(ctx.kb, shape, tiling, t.load_a, t.load_b, t.store_c, t.stage_a)
        ctx.kb.end_kernel(gemm_kernel_info(ctx.config, ctx.label("nn.conv2d"), "nn.conv2d",
                                           tiling.describe(shape), tiling.estimate, shape,
                                           tiling.knob, constant_b=True,
                                           c_itemsize=ctx.kb.result_itemsize(out.dtype)))
    emit_choosing_slots(ctx, emit)


def conv_weight_layout(w: np.ndarray) -> np.ndarray:
    """OIHW weights as the implicit GEMM's B: ``[taps, C, O]`` (a K step's tile is one
    strided DMA of every tap's channel block)."""
    o, c, kh, kw = w.shape
    return np.ascontiguousarray(w.transpose(2, 3, 1, 0).reshape(kh * kw, c, o))


def _pointwise(ctx: LoweringContext, x: Any, w: np.ndarray, out: DramTensor, dt: str) -> None:
    """A 1x1 stride-1 convolution as ``out[n] = W @ X[n]`` per image: the weights ``[O, C]``
    are A and the image's channel planes ``[C, H*W]`` are B, both contiguous in DRAM, and C is
    NCHW as it is -- no staging, no gathers."""
    nb, c, h, wd = x.shape
    o, hw = w.shape[0], h * wd
    shape = GemmShape(nb, o, 1, hw, c, 1, dt, b_shared=False, a_shared=True)
    tiling = _plan(ctx, "nn.conv2d", shape)
    xa = _activation(ctx, x, dt, "nn.conv2d")
    wc = ctx.constant(np.ascontiguousarray(w.reshape(o, c)), dt)
    kb = ctx.kb

    def load_a(core: int, b: int, m0: int, ms: int, k0: int, ks: int, addr: int,
               slot: int) -> None:
        kb.load(core, shape=(1, ms, ks), dst=block("input", addr, dt, (0, ks, 1)),
                src=wc.at(m0 * c + k0, (0, c, 1)))

    def load_b(core: int, b: int, k0: int, ks: int, n0: int, ns: int, addr: int) -> None:
        kb.load(core, shape=(1, ks, ns), dst=block("weight", addr, dt, (0, ns, 1)),
                src=xa.at((b * c + k0) * hw + n0, (0, hw, 1)))

    def store_c(core: int, b: int, m0: int, ms: int, n0: int, ns: int, addr: int) -> None:
        kb.store(core, shape=(1, ms, ns),
                dst=out.at((b * o + m0) * hw + n0, (0, hw, 1)),
                src=block("acc", addr, out.dtype, (0, ns, 1)))

    def emit() -> None:
        emit_gemm(kb, shape, tiling, load_a, load_b, store_c)
        kb.end_kernel(gemm_kernel_info(ctx.config, ctx.label("nn.conv2d"), "nn.conv2d",
                                       "1x1 as W @ X: " + tiling.describe(shape),
                                       tiling.estimate, shape, tiling.knob, constant_a=True,
                                       c_itemsize=kb.result_itemsize(out.dtype)))
    emit_choosing_slots(ctx, emit)


# ---------------------------------------------------------------------------------------------
# depthwise convolutions: the vector unit's taps, or block-diagonal products on the tensor unit
# ---------------------------------------------------------------------------------------------
def depthwise_group(cfg: NPUConfig) -> int:
    """Channels per group of a depthwise convolution on the tensor unit: its ``k`` (= ``n``
    on the shipped descriptions; the smaller of the two), so that one pass of the unit
    multiplies a group's ``g x g`` diagonal weight of one tap -- at ``1 / g`` of its peak."""
    _, k, n = cfg.tensor_shape
    return min(k, n)


@dataclass(frozen=True)
class DepthwisePart:
    """One kernel of a depthwise convolution on the tensor unit: ``groups`` groups of ``g``
    channels from channel ``first`` on, each an ungrouped ``g -> g`` convolution with
    block-diagonal weights; ``geo``'s implicit GEMM batches every (image, group) pair
    (``batch = images x groups``, B per group: one kernel whose loop runs over the channel
    blocks, not one kernel per group)."""

    first: int
    g: int
    groups: int
    geo: ConvGeometry


def depthwise_parts(cfg: NPUConfig, at: Any, x_shape: tuple[int, ...],
                    w_shape: tuple[int, ...], out_shape: tuple[int, ...], dt: str
                    ) -> list[DepthwisePart]:
    """The kernels of a depthwise convolution on the tensor unit: the ``C // g`` whole groups,
    and, when ``g`` does not divide ``C``, a second kernel of one group of the last
    ``C mod g`` channels (a GEMM's batch entries share one shape)."""
    nb, c, h, wd = x_shape
    kh, kw = w_shape[2:]
    g = min(depthwise_group(cfg), c)
    full, rest = divmod(c, g)
    parts = []
    for first, gs, ng in ((0, g, full), (full * g, rest, 1)):
        if not (gs and ng):
            continue
        geo = conv_geometry(cfg, at, (nb, gs, h, wd), (gs, gs, kh, kw),
                            (nb, gs, *out_shape[2:]), dt)
        geo = replace(geo, shape=replace(geo.shape, batch=nb * ng, b_shared=False))
        parts.append(DepthwisePart(first, gs, ng, geo))
    return parts


def depthwise_weights(w: np.ndarray, part: DepthwisePart) -> np.ndarray:
    """``part``'s weights ``[groups, taps, g, g]``, each tap's ``g x g`` block diagonal
    (``W[gi, t, i, i]`` = channel ``first + gi * g + i``'s weight of tap ``t``, zero off the
    diagonal): :func:`conv_weight_layout` of the group's ungrouped convolution, so the
    implicit GEMM reads it as any other's. ``taps x g`` times the depthwise weights' size --
    the DRAM bytes the tensor route pays for its zeros."""
    taps = w.shape[2] * w.shape[3]
    ws = w[part.first:part.first + part.groups * part.g].reshape(part.groups, part.g, taps)
    out = np.zeros((part.groups, taps, part.g, part.g), dtype=w.dtype)
    diag = np.arange(part.g)
    out[:, :, diag, diag] = ws.transpose(0, 2, 1)
    return out


def _step_waits(cfg: NPUConfig, shape: GemmShape, tiling: GemmTiling) -> float:
    """A tensor-route kernel's estimate for the choice of unit: the tiling's
    :func:`~.gemm.gemm_cost` plus one DRAM latency per step of the busiest core -- each
    step's loads land before its product starts (the pipeline's token), which
    :func:`~.gemm.gemm_cost` leaves out to rank tilings among themselves (a term for it
    mis-ranked attention's). Here the kernel is weighed against another unit's, and a
    depthwise convolution's steps (one group's tile each) are small: without it the
    estimate was 30-40% below the simulated cycles of MobileNetV2's 7 x 7 layers (384 and
    576 channels: 24 and 36 steps; default, 4127 cycles estimated, 6139 simulated), which
    then went to the tensor unit although the vector unit takes 4710. A banded kernel
    whose step loads nothing from DRAM (its rows in L1, ``stage_onchip``, and its bands
    built from rows preloaded there, ``b_rows``) waits L1's latency instead."""
    nm, nn = -(-shape.m_units // tiling.m_units), -(-shape.n // tiling.n)
    nk = -(-shape.k_units // tiling.k_units)
    steps = -(-shape.batch * nm * nn // cfg.cores) * nk
    onchip = shape.stage_onchip and shape.b_rows
    return tiling.estimate + steps * cfg.memory("l1" if onchip else "dram").latency


def depthwise_tensor_dtype(cfg: NPUConfig, x_dtype: str, w_dtype: str, out_dtype: str
                           ) -> str | None:
    """The tensor unit's operand dtype for a depthwise convolution of these dtypes (as
    :func:`operand_dtype`: float16 -- bfloat16 for bfloat16 operands -- for a float product
    into float32, int8 for int8 x int8 -> int32), or None when the tensor unit cannot
    compute it (an int32 one: the quantized graph's widened int8)."""
    if x_dtype == w_dtype == "int8" and out_dtype == "int32":
        dt = "int8"
    elif x_dtype in _FLOAT and w_dtype in _FLOAT and out_dtype == "float32":
        dt = "bfloat16" if x_dtype == w_dtype == "bfloat16" else "float16"
    else:
        return None
    return dt if cfg.tensor_dtype(dt, dt) is not None else None


def _cheapest(cfg: NPUConfig, shape: GemmShape, nbuf: int) -> GemmTiling:
    """The cost model's cheapest feasible tiling of ``shape`` (ValueError when none fits)."""
    ranked = feasible_tilings(cfg, shape, nbuf)
    if not ranked:
        raise ValueError(f"no tiling of {shape!r} fits the L0 buffers of {cfg.name!r}")
    return ranked[0]


def banded_plan(cfg: NPUConfig, nbuf: int, at: Any, x_shape: tuple[int, ...],
                w_shape: tuple[int, ...], out_shape: tuple[int, ...], dt: str
                ) -> tuple[BandedGeometry, GemmTiling, float] | None:
    """The banded route's kernel (:mod:`.banded`): of the forms (:data:`BANDED_FORMS`),
    block widths worth planning (:func:`.banded.banded_block_widths`) and channel groups
    (powers of two up to :data:`BANDED_MAX_GROUP`), the geometry and planned tiling of the
    lowest
    estimate (:func:`_step_waits`), and that estimate; None when no tiling fits. Kept per
    description (the object: a description is not hashable) and arguments: a build asks
    for every depthwise layer's route several times (the target annotation, the memory
    scopes, the producer's operand dtype, the epilogue fusion, the lowering), each
    planning every block width."""
    key = (id(cfg), nbuf, tuple(at.strides), tuple(at.padding), tuple(at.dilation),
           tuple(x_shape), tuple(w_shape), tuple(out_shape), dt, BANDED_FORMS)
    hit = _BANDED_PLANS.get(key)
    if hit is not None and hit[0] is cfg:
        return hit[1]
    best = None
    c = x_shape[1]
    acc_room = cfg.memory("acc").size // BANDED_ACC_SHARE
    for in_place, compact in BANDED_FORMS:
        for n in banded_block_widths(cfg, at, w_shape, out_shape, in_place, x_shape[3]):
            for g in sorted({min(c, 1 << i) for i in range(BANDED_MAX_GROUP.bit_length())}):
                geo = banded_geometry(cfg, at, x_shape, w_shape, out_shape, dt, n, g,
                                      in_place, compact)
                if compact and x_shape[0] * x_shape[1] * geo.kh * geo.row_len * \
                        itemsize(dt) > cfg.memory("l1").size // BANDED_ROWS_L1_SHARE:
                    continue  # the rows preloaded in L1 would crowd out the residents
                # the whole window in one K step, the whole block in one N tile
                # (banded_transfers): the first such of the cost model's ranking
                # and output tiles that leave the fused epilogue's chunk buffers room
                tiling = next((t for t in feasible_tilings(cfg, geo.shape, nbuf,
                                                           k_units=geo.window)
                               if t.n == geo.n and acc_slots(cfg, geo.shape, t, nbuf) *
                               tile_bytes(cfg, geo.shape, t)[2] <= acc_room), None)
                if tiling is None:
                    continue
                est = _step_waits(cfg, geo.shape, tiling)
                if best is None or est < best[2]:
                    best = (geo, tiling, est)
    if len(_BANDED_PLANS) >= 512:
        _BANDED_PLANS.clear()
    _BANDED_PLANS[key] = (cfg, best)  # the description kept alive: its id stays its own
    return best


_BANDED_PLANS: dict[tuple[Any, ...], tuple[NPUConfig, Any]] = {}
#: The most channels a banded depthwise kernel's step multiplies (``GemmShape.groups``;
#: powers of two up to it are planned): more only shrink the tiles the L0 buffers hold.
BANDED_MAX_GROUP = 64
#: The forms of the banded kernel :func:`banded_plan` plans, as ``(in_place, compact)``
#: (:func:`.banded.banded_geometry`): A gathered from rows staged in L1; A read in place
#: from rows staged in L0, bands from DRAM; in place with the bands built on chip from
#: compact rows preloaded in L1.
BANDED_FORMS = ((False, False), (True, False), (True, True))
#: A banded kernel's output tiles (every accumulator slot) take at most this fraction
#: (1 / share) of the accumulator memory: above them a fused epilogue (a depthwise layer's
#: batch norm and ReLU6) has its chunk buffers, and a tile that took it all cut the epilogue
#: into one-channel chunks with a DRAM round trip each (edge, MobileNetV2's 192 x 14 x 14
#: layer in place: 1344 chunks a core, 161539 cycles against 26040 gathered).
BANDED_ACC_SHARE = 2
#: A compact banded kernel's rows (:func:`.banded.banded_rows`), preloaded in L1, take at
#: most this fraction (1 / share) of it: the rest stays free for the intermediates that
#: residency keeps there.
BANDED_ROWS_L1_SHARE = 8


@dataclass(frozen=True)
class DepthwiseCosts:
    """The cost model's cycles of each route of a depthwise convolution (None: that route
    cannot run it): the tensor unit's block-diagonal (:func:`depthwise_parts`) and banded
    (:func:`banded_plan`) products, the vector unit's taps (:func:`.vector.pool2d_cost`)."""

    diagonal: float | None
    banded: float | None
    vector: float | None


def _depthwise_costs(cfg: NPUConfig, nbuf: int, at: Any, x_shape: tuple[int, ...],
                     w_shape: tuple[int, ...], out_shape: tuple[int, ...], dt: str | None,
                     vdt: str) -> DepthwiseCosts:
    """The cost model's cycles of each route: the tensor routes' kernels' planned tilings
    (None: no tiling fits or no tensor dtype) and the vector route's
    :func:`.vector.pool2d_cost` in ``vdt`` (None: no block fits)."""
    diagonal: float | None = None
    banded: float | None = None
    if dt is not None:
        try:
            # the cost model's tilings (not the tuning knob's: the route is chosen before
            # the kernel's context -- its fused epilogue -- that keys the knob is known)
            diagonal = sum(_step_waits(cfg, p.geo.shape, _cheapest(cfg, p.geo.shape, nbuf))
                           for p in depthwise_parts(cfg, at, x_shape, w_shape, out_shape, dt))
        except ValueError:
            diagonal = None
        plan = banded_plan(cfg, nbuf, at, x_shape, w_shape, out_shape, dt)
        banded = plan[2] if plan is not None else None
    try:
        # the output counted in L1 where it fits, as the banded kernel's
        # (banded.banded_geometry's store_onchip): residency keeps it there
        vector: float | None = pool2d_cost(
            cfg, nbuf, x_shape, out_shape, vdt, (w_shape[2], w_shape[3]), tuple(at.strides),
            tuple(at.padding), tuple(at.dilation), True,
            int(np.prod(out_shape)) * itemsize(vdt) <= cfg.memory("l1").size)
    except NotSupported:
        vector = None
    return DepthwiseCosts(diagonal, banded, vector)


#: The routes of a depthwise convolution, as :class:`DepthwiseChoice` names them.
DEPTHWISE_UNITS = {"diagonal": "tensor", "banded": "tensor", "vector": "vector"}


@dataclass(frozen=True)
class DepthwiseChoice:
    """Where a depthwise convolution runs (``route``: ``"diagonal"`` or ``"banded"`` on the
    tensor unit, or ``"vector"``) and the cost model's cycles of each route (None: that
    route cannot run it)."""

    route: str
    diagonal: float | None
    banded: float | None
    vector: float | None

    @property
    def unit(self) -> str:
        """``"tensor"`` or ``"vector"``."""
        return DEPTHWISE_UNITS[self.route]

    @property
    def tensor(self) -> float | None:
        """The cheaper tensor-unit route's estimate (None: neither can run it)."""
        got = [v for v in (self.diagonal, self.banded) if v is not None]
        return min(got) if got else None

    def describe(self) -> str:
        est = ", ".join(f"{name} {v:.0f}" for name, v in
                        (("diagonal", self.diagonal), ("banded", self.banded),
                         ("vector", self.vector)) if v is not None)
        form = f" ({self.route})" if self.unit == "tensor" else ""
        return f" [depthwise on the {self.unit} unit{form}; est. cycles {est}]"


def depthwise_route(ctx: LoweringContext, at: Any, x_shape: tuple[int, ...],
                    w_shape: tuple[int, ...], out_shape: tuple[int, ...], x_dtype: str,
                    w_dtype: str, out_dtype: str) -> DepthwiseChoice:
    """Where a depthwise convolution runs: ``"diagonal"`` (:func:`depthwise_parts`'s
    grouped products with block-diagonal weights), ``"banded"`` (:mod:`.banded`'s products
    over the rows) or ``"vector"`` (the pooling kernel's taps). The context's
    :data:`~.lowering.DEPTHWISE_KEY` forces one where it can run (``"tensor"``: the cheaper
    of the two tensor-unit forms); ``"auto"`` takes the cheapest by the cost model
    (:func:`~.gemm.gemm_cost` of the planned tilings against :func:`.vector.pool2d_cost`),
    from the shapes and the graph's dtypes only, so every caller -- the lowering, the
    producer deciding to store the activation in float16, the epilogue fusion -- agrees.
    ``x_dtype`` is the activation's graph dtype (not a float16 copy a producer stored for
    the tensor route)."""
    cfg = ctx.config
    dt = depthwise_tensor_dtype(cfg, x_dtype, w_dtype, out_dtype)
    vdt = "int32" if dt == "int8" or x_dtype == "int32" else "float32"
    costs = _depthwise_costs(cfg, ctx.kb.nbuf, at, x_shape, w_shape, out_shape, dt, vdt)
    est = {"diagonal": costs.diagonal, "banded": costs.banded, "vector": costs.vector}
    tensor = {r: v for r, v in est.items() if r != "vector" and v is not None}
    knob = ctx.depthwise
    if not tensor or knob == "vector":
        route = "vector"
    elif knob in tensor:
        route = knob
    elif knob in ("tensor", "diagonal", "banded") or costs.vector is None:
        route = min(tensor, key=lambda r: tensor[r])
    else:
        route = min({**tensor, "vector": costs.vector}.items(), key=lambda kv: kv[1])[0]
    return DepthwiseChoice(route, costs.diagonal, costs.banded, costs.vector)


def call_depthwise_route(ctx: LoweringContext, call: Any) -> DepthwiseChoice:
    """:func:`depthwise_route` of a depthwise ``nn.conv2d`` graph call (its static shapes
    and dtypes); the vector unit when they are not static."""
    args = list(call.args[:2]) + [call]
    dims = [tuple(_dims(a)) for a in args]
    if not all(d and all(isinstance(v, int) for v in d) for d in dims):
        return DepthwiseChoice("vector", None, None)
    dts = [str(getattr(a.struct_info, "dtype", "")) for a in args]
    return depthwise_route(ctx, call.attrs, dims[0], dims[1], dims[2], *dts)


def _depthwise(ctx: LoweringContext, call: Any, x: Any, w: Any, out: DramTensor) -> None:
    """A depthwise convolution (one input channel per group, multiplier 1) on the unit
    :func:`call_depthwise_route` chooses: the tensor unit's grouped products
    (:func:`_depthwise_tensor`) or banded products (:func:`_depthwise_banded`), or the
    vector unit (:func:`_depthwise_vector`). Its kernels' tiling text ends with the choice
    and every route's estimate."""
    if not isinstance(x, DramTensor) or not isinstance(w, np.ndarray):
        raise NotSupported("nn.conv2d: depthwise with run-time weights or a constant image")
    choice = call_depthwise_route(ctx, call)
    first = len(ctx.kb.kernels)
    if choice.unit == "tensor":
        dt = depthwise_tensor_dtype(ctx.config, str(call.args[0].struct_info.dtype),
                                    str(w.dtype), out.dtype)
        assert dt is not None  # the route said so
        if choice.route == "banded":
            _depthwise_banded(ctx, call.attrs, x, w, out, dt)
        else:
            _depthwise_tensor(ctx, call.attrs, x, w, out, dt)
    else:
        _depthwise_vector(ctx, call, x, w, out)
    for info in ctx.kb.kernels[first:]:
        if info.op == "nn.conv2d.depthwise":
            info.tiling += choice.describe()


def depthwise_traffic(info: KernelInfo, cfg: NPUConfig, x_shape: tuple[int, ...],
                      w_shape: tuple[int, ...], out_shape: tuple[int, ...], dt: str,
                      c_itemsize: int) -> KernelInfo:
    """``info`` (a tensor-route depthwise kernel's, from the product it runs) with its
    roofline's DRAM side the convolution's own minimum traffic: the input image read once,
    the weights once in their compact form (``C x kh x kw``), the output written once --
    a property of the layer and the hardware. The product's traffic counted its embedding:
    the banded route's bands (mostly zeros, built on chip from compact rows) and the
    overlapping row windows, the diagonal route's block-diagonal weights and gathered
    taps -- bytes no DMA moves from DRAM, which put the bound above the simulated cycles
    (MobileNetV2's banded layers showed up to 147%). The compute side stays the route's
    tensor-unit work (the route has to multiply its zeros)."""
    isz = itemsize(dt)
    reads = int(np.prod(x_shape)) * isz
    writes = int(np.prod(out_shape)) * c_itemsize
    traffic = (reads + int(np.prod(w_shape)) * isz + writes) / cfg.memory("dram").bandwidth
    return replace(info, roofline=max(info.compute, traffic), traffic=traffic, reads=reads,
                   writes=writes)


def _depthwise_tensor(ctx: LoweringContext, at: Any, x: DramTensor, w: np.ndarray,
                      out: DramTensor, dt: str) -> None:
    """A depthwise convolution on the tensor unit: per :class:`DepthwisePart` one implicit
    GEMM kernel (:func:`conv_transfers`, :func:`~.gemm.emit_gemm`) whose batch runs over
    every (image, channel group), each entry staging and gathering its group's ``g`` input
    channels and multiplying them by its own block-diagonal weights. The kernel's
    :class:`~.emit.KernelInfo` counts the useful MACs (``macs``: the depthwise
    convolution's, not the zeros the tensor unit multiplies too)."""
    nb, c = x.shape[:2]
    oh, ow = out.shape[2:]
    taps = w.shape[2] * w.shape[3]
    parts = depthwise_parts(ctx.config, at, x.shape, w.shape, out.shape, dt)
    xa = _activation(ctx, x, dt, "nn.conv2d")
    for part in parts:
        shape = part.geo.shape
        tiling = _plan(ctx, "nn.conv2d", shape)
        wl = ctx.constant(depthwise_weights(w, part), dt)

        def planes(b: int, p: DepthwisePart = part) -> tuple[int, int, int]:
            ch = (b // p.groups) * c + p.first + (b % p.groups) * p.g
            return ch, ch, (b % p.groups) * taps * p.g * p.g

        t = conv_transfers(ctx, part.geo, tiling, xa, wl, out, planes)

        def emit(part: DepthwisePart = part, shape: GemmShape = shape,
                 tiling: GemmTiling = tiling, t: GemmTransfers = t) -> None:
            emit_gemm(ctx.kb, shape, tiling, t.load_a, t.load_b, t.store_c, t.stage_a)
            info = gemm_kernel_info(
                ctx.config, ctx.label("nn.conv2d.depthwise"), "nn.conv2d.depthwise",
                f"tensor unit, {part.groups} groups of {part.g} channels (block-diagonal): " +
                tiling.describe(shape), tiling.estimate, shape, tiling.knob,
                constant_b=True, c_itemsize=ctx.kb.result_itemsize(out.dtype))
            ch = part.groups * part.g  # each part reads and writes its own channels
            info = depthwise_traffic(info, ctx.config, (nb, ch, *x.shape[2:]),
                                     (ch, *w.shape[1:]), (nb, ch, oh, ow), dt,
                                     ctx.kb.result_itemsize(out.dtype))
            ctx.kb.end_kernel(replace(info, macs=nb * part.groups * part.g * oh * ow * taps))
        emit_choosing_slots(ctx, emit)


def _depthwise_banded(ctx: LoweringContext, at: Any, x: DramTensor, w: np.ndarray,
                      out: DramTensor, dt: str) -> None:
    """A depthwise convolution on the tensor unit as banded products (:mod:`.banded`): one
    implicit GEMM kernel whose batch runs over every (image, channel, column block), A the
    channel's staged input rows, B the block's band. Its :class:`~.emit.KernelInfo` counts
    the useful MACs (the depthwise convolution's, not the band's zeros nor the columns an
    overlapping last block computes twice)."""
    plan = banded_plan(ctx.config, ctx.kb.nbuf, at, x.shape, w.shape, out.shape, dt)
    if plan is None:
        raise NotSupported("nn.conv2d: no tiling of the banded depthwise products fits")
    geo, tiling, _ = plan
    shape = geo.shape
    xa = _activation(ctx, x, dt, "nn.conv2d")
    wl = ctx.constant(banded_rows(w, geo) if geo.compact else banded_weights(w, geo), dt)
    t = banded_transfers(ctx, geo, tiling, xa, wl, out)

    def emit() -> None:
        emit_gemm(ctx.kb, shape, tiling, t.load_a, t.load_b, t.store_c, t.stage_a,
                  geo.b_groups, geo.c_groups(tiling),
                  geo.a_parts(tiling) if geo.in_place else None, geo.a_row)
        info = gemm_kernel_info(
            ctx.config, ctx.label("nn.conv2d.depthwise"), "nn.conv2d.depthwise",
            f"tensor unit, banded: {len(geo.blocks)} blocks of {geo.n} columns, windows of "
            f"{geo.window}, {geo.g} channels a step" + (", in place" if geo.in_place else "")
            + (", bands built on chip" if geo.compact else "") +
            ": " + tiling.describe(shape), tiling.estimate,
            shape, constant_b=True, c_itemsize=ctx.kb.result_itemsize(out.dtype))
        info = depthwise_traffic(info, ctx.config, x.shape, w.shape, out.shape, dt,
                                 ctx.kb.result_itemsize(out.dtype))
        ctx.kb.end_kernel(replace(info, macs=int(np.prod(out.shape)) * w.shape[2] *
                                  w.shape[3]))
    emit_choosing_slots(ctx, emit)


def _depthwise_vector(ctx: LoweringContext, call: Any, x: DramTensor, w: np.ndarray,
                      out: DramTensor) -> None:
    """A depthwise convolution on the vector unit: the pooling kernel's taps, each
    multiplied by its channel's weight."""
    at = call.attrs
    c = x.shape[1]
    if x.dtype in ("float16", "bfloat16") and out.dtype == "float32":  # ToMixedPrecision's
        x = cast_kernel(ctx, x, "float32", "nn.conv2d.cast")  # exact; products exact in fp32
    if x.dtype == "int8" and str(w.dtype) == "int8" and out.dtype == "int32":
        _vector_dtype(ctx, "int32", "nn.conv2d")
        x = cast_kernel(ctx, x, "int32", "nn.conv2d.cast")  # the quantized graph's: exact
    if x.dtype not in (*_FLOAT, "int32") or out.dtype != x.dtype:
        raise NotSupported(f"nn.conv2d: depthwise {x.dtype} -> {out.dtype}")
    _vector_dtype(ctx, x.dtype, "nn.conv2d")
    wt = ctx.constant(w.reshape(c, -1), x.dtype)
    pool2d_kernel(ctx, "nn.conv2d.depthwise", x, out, "dw", (w.shape[2], w.shape[3]),
                  tuple(at.strides), tuple(at.padding), tuple(at.dilation), None, wt)
