"""The NPU lowerings of graph ops (registered with :func:`.lowering.register_lowering`).

Float products run on the tensor unit in float16 with float32 accumulation (the description's
fp16 x fp16 -> fp32 tile product): a float32 activation is cast to float16 by a vector kernel
before the product, constant weights are cast and laid out at compile time. int8 x int8 ->
int32 products (``out_dtype="int32"``) run as they are and are exact.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from ...npu.isa import UNIT_DMA_IN
from .emit import DramTensor, KernelInfo, block, itemsize
from .gemm import GemmShape, emit_gemm, gemm_roofline, plan_gemm
from .lowering import LoweringContext, NotSupported, register_lowering
from .vector import VecStep, emit_elementwise, emit_pool2d, emit_row_mean, emit_softmax

__all__ = ["BINARY_OPS", "ELEMENTWISE_OPS", "GEMM_OPS", "UNARY_OPS", "elementwise_steps",
           "lower_elementwise_chain", "product_operand_dtype"]

#: Graph op -> vector opcode of the element-wise ops.
BINARY_OPS = {"add": "vadd", "subtract": "vsub", "multiply": "vmul", "divide": "vdiv",
              "maximum": "vmax", "minimum": "vmin"}
UNARY_OPS = {"relu": "vrelu", "exp": "vexp", "negative": "vneg", "abs": "vabs",
             "rsqrt": "vrsqrt", "erf": "verf"}
#: What :func:`lower_elementwise` (and a fused chain) takes.
ELEMENTWISE_OPS = (*BINARY_OPS, *UNARY_OPS, "clip")
_FLOAT = ("float32", "float16", "bfloat16")


def _vector_dtype(ctx: LoweringContext, dtype: str, op: str) -> None:
    if not ctx.config.supports_vector_dtype(dtype):
        raise NotSupported(f"{op}: the vector unit does not compute in {dtype}")


def _scalar(arg: Any) -> float | None:
    """A constant operand with one element, as an immediate (else None)."""
    if isinstance(arg, np.ndarray) and arg.size == 1:
        return float(arg.reshape(-1)[0])
    return None


def elementwise_steps(ctx: LoweringContext, call: Any, args: list[Any], dtype: str,
                      running: int | None, inputs: list[DramTensor]) -> list[VecStep]:
    """The vector steps of element-wise ``call`` computing into the output block; operand
    ``running`` (if given) is the output block's current value (an element-wise chain's
    previous result), other tensor operands are appended to ``inputs``. Raises NotSupported."""
    op = call.op.name
    _vector_dtype(ctx, dtype, op)
    if (op in ("divide", "clip") or op in UNARY_OPS and op not in ("relu", "negative", "abs")) \
            and dtype not in _FLOAT:
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
            return [VecStep(BINARY_OPS[op], (src(0), ("imm", imm)))]
        return [VecStep(BINARY_OPS[op], (src(0), src(1)))]
    if op in UNARY_OPS:
        return [VecStep(UNARY_OPS[op], (src(0),))]
    if op == "clip":
        lo, hi = call.attrs.min, call.attrs.max
        x = src(0)
        steps = [VecStep("vmax", (x, ("imm", float(lo))))] if lo is not None else []
        if hi is not None:
            steps.append(VecStep("vmin", (("out",) if steps else x, ("imm", float(hi)))))
        return steps or [VecStep("vmov", (x,))]
    raise NotSupported(f"{op} is not element-wise")


def _check_shape(op: str, inputs: list[DramTensor], out: DramTensor) -> None:
    for x in inputs:
        shape = (1,) * (len(out.shape) - len(x.shape)) + x.shape
        if len(shape) != len(out.shape) or \
                any(a not in (1, b) for a, b in zip(shape, out.shape)):
            raise NotSupported(f"{op}: operand {x.shape} does not broadcast to {out.shape}")


@register_lowering(ELEMENTWISE_OPS)
def lower_elementwise(ctx: LoweringContext, call: Any, args: list[Any], out: DramTensor
                      ) -> None:
    inputs: list[DramTensor] = []
    steps = elementwise_steps(ctx, call, args, out.dtype, None, inputs)
    _check_shape(call.op.name, inputs, out)
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
    _check_shape(names, inputs, out)
    if out.dtype != dtype:
        _vector_dtype(ctx, out.dtype, names)
    emit_elementwise(ctx, names, out, inputs, steps, dtype)


def cast_kernel(ctx: LoweringContext, x: DramTensor, dtype: str, op: str = "cast") -> DramTensor:
    """A new DRAM tensor holding ``x`` converted to ``dtype`` on the vector unit."""
    out = ctx.alloc(x.shape, dtype)
    emit_elementwise(ctx, op, out, [x], [VecStep("vcast", (("in", 0),), (("mode", "rne"),))])
    return out


@register_lowering("cast")
def lower_cast(ctx: LoweringContext, call: Any, args: list[Any], out: DramTensor) -> None:
    x = ctx.tensor(args[0])
    for dt in (x.dtype, out.dtype):
        _vector_dtype(ctx, dt, "cast")
    emit_elementwise(ctx, "cast", out, [x], [VecStep("vcast", (("in", 0),),
                                                     (("mode", "rtz"),))])


@register_lowering(("reshape", "squeeze", "expand_dims"))
def lower_view(ctx: LoweringContext, call: Any, args: list[Any], out: DramTensor) -> None:
    """Handled by the caller as an alias of the operand's DRAM (no data moves)."""
    raise NotSupported("views are aliases, never kernels")


# ---------------------------------------------------------------------------------------------
# products
# ---------------------------------------------------------------------------------------------
def _operand_dtype(ctx: LoweringContext, op: str, x_dtype: str, w_dtype: str,
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
    if call.op.name not in GEMM_OPS or len(call.args) < 2 or \
            getattr(call.attrs, "groups", 1) != 1:  # a grouped conv runs on the CPU
        return None
    w = call.args[1]
    wd = str(getattr(w.struct_info, "dtype", ""))
    out_dt = str(getattr(call.struct_info, "dtype", ""))
    if x_dtype in _FLOAT and wd in _FLOAT and out_dt == "float32" and x_dtype != "float16" \
            and ctx.config.tensor_dtype("float16", "float16") is not None:
        return "float16"
    return None


def _activation(ctx: LoweringContext, x: Any, dt: str, op: str) -> DramTensor:
    if isinstance(x, np.ndarray):
        return ctx.constant(x, dt)
    return x if x.dtype == dt else cast_kernel(ctx, x, dt, f"{op}.cast")


def _plan(ctx: LoweringContext, op: str, shape: GemmShape) -> Any:
    try:
        return plan_gemm(ctx.config, shape, ctx.kb.nbuf)
    except ValueError as err:
        raise NotSupported(f"{op}: {err}") from None


def _gemm_2d(ctx: LoweringContext, op: str, x: Any, w: Any, out: DramTensor,
             w_is_nk: bool) -> None:
    """``out[..., M, N] = x[..., M, K] @ W`` with W ``[N, K]`` (dense) or ``[K, N]``."""
    wd = w.dtype if isinstance(w, DramTensor) else str(w.dtype)
    xd = x.dtype if isinstance(x, DramTensor) else str(x.dtype)
    dt = _operand_dtype(ctx, op, xd, wd, out.dtype)
    if len(w.shape) != 2:
        raise NotSupported(f"{op}: batched right operand")
    k = w.shape[1] if w_is_nk else w.shape[0]
    n = w.shape[0] if w_is_nk else w.shape[1]
    m = int(np.prod(out.shape[:-1], dtype=np.int64))
    shape = GemmShape(1, m, 1, n, k, 1, dt)
    tiling = _plan(ctx, op, shape)
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
        kb.emit(core, "dma.store", shape=(1, ms, ns), dst=out.at(m0 * n + n0, (0, n, 1)),
                src=block("acc", addr, out.dtype, (0, ns, 1)))

    emit_gemm(kb, shape, tiling, load_a, load_b, store_c)
    kb.end_kernel(KernelInfo(ctx.label(op), op, tiling.describe(shape), tiling.estimate,
                             gemm_roofline(ctx.config, shape)))


@register_lowering("dense")
def lower_dense(ctx: LoweringContext, call: Any, args: list[Any], out: DramTensor) -> None:
    _gemm_2d(ctx, "dense", args[0], args[1], out, w_is_nk=True)


@register_lowering("matmul")
def lower_matmul(ctx: LoweringContext, call: Any, args: list[Any], out: DramTensor) -> None:
    if len(args[0].shape) < 2:
        raise NotSupported("matmul: vector left operand")
    _gemm_2d(ctx, "matmul", args[0], args[1], out, w_is_nk=False)


def _odd_lines(elems: int, isz: int, bank_width: int) -> int:
    """``elems`` rounded up so that the span is an odd number of bank lines: a gather that
    reads one element per channel plane then spreads over every bank instead of a few."""
    per_line = max(1, bank_width // isz)
    lines = -(-elems // per_line)
    return (lines + 1 - lines % 2) * per_line if bank_width % isz == 0 else elems


@register_lowering("nn.conv2d")
def lower_conv2d(ctx: LoweringContext, call: Any, args: list[Any], out: DramTensor) -> None:
    """Implicit GEMM: M = output rows of OW pixels, K = input channels x taps, N = output
    channels; the A tile is gathered by one strided DMA with padding per tap."""
    at = call.attrs
    if at.data_layout != "NCHW" or at.kernel_layout != "OIHW":
        raise NotSupported(f"nn.conv2d: layout {at.data_layout}/{at.kernel_layout}")
    x, w = args
    if at.groups != 1:
        return _depthwise(ctx, call, x, w, out)
    if not isinstance(w, np.ndarray):
        raise NotSupported("nn.conv2d: weights computed at run time")
    dt = _operand_dtype(ctx, "nn.conv2d", x.dtype if isinstance(x, DramTensor) else
                        str(x.dtype), str(w.dtype), out.dtype)
    nb, c, h, wd = x.shape
    o, _, kh, kw = w.shape
    _, _, oh, ow = out.shape
    (sh, sw), (dh, dw) = at.strides, at.dilation
    if (kh, kw, sh, sw) == (1, 1, 1, 1) and not any(at.padding):
        return _pointwise(ctx, x, w, out, dt)
    pt, pl = at.padding[0], at.padding[1]
    taps = kh * kw
    l1 = ctx.config.memory("l1")
    shape = GemmShape(nb, oh, ow, o, c, taps, dt, a_dmas=taps, a_elems=c * h * wd,
                      stage_stride=sh, stage_halo=(kh - 1) * dh + 1, stage_row=wd,
                      stage_pad=2 * l1.bank_width)
    tiling = _plan(ctx, "nn.conv2d", shape)
    stage_slot = shape.stage_bytes(tiling.m_units, tiling.k_units)
    xa = _activation(ctx, x, dt, "nn.conv2d")
    wl = ctx.constant(np.ascontiguousarray(w.transpose(2, 3, 1, 0).reshape(taps, c, o)), dt)
    kb = ctx.kb
    zero = block("dram", 0, dt, (0, 0, 0))
    xa_isz = itemsize(dt)

    def valid(lo: int, n: int, tap: int, s: int, d: int, pad: int, size: int
              ) -> tuple[int, int]:
        first = max(lo, -(-(pad - tap * d) // s))
        last = min(lo + n, (size - 1 + pad - tap * d) // s + 1)
        return first, max(first, last)

    def load_a(core: int, b: int, r0: int, rs: int, c0: int, cs: int, addr: int,
               slot: int) -> None:
        """Stage the input rows the tile's windows cover in L1 (one DMA, contiguous in DRAM),
        then gather each tap from L1 with a strided DMA whose padding fills the border."""
        kt = cs * taps
        dst_st = (ow * kt, kt, 1)  # (row, pixel, channel): the channel run is contiguous
        i0 = max(0, r0 * sh - pt)
        i1 = min(h, (r0 + rs - 1) * sh - pt + (kh - 1) * dh + 1)
        nrows = max(0, i1 - i0)
        plane = _odd_lines(nrows * wd, xa_isz, l1.bank_width)
        staged = block("l1", (core * kb.nbuf + slot) * stage_slot, dt, (plane, wd, 1))
        if nrows:
            if kb.nbuf == 1:  # the one slot may still be read by the last step's gathers
                kb.fence(core, UNIT_DMA_IN)
            kb.load(core, shape=(cs, nrows, wd), dst=staged,
                    src=xa.at(((b * c + c0) * h + i0) * wd, (h * wd, wd, 1)))
            kb.fence(core, UNIT_DMA_IN)
        for a in range(kh):
            h0, h1 = valid(r0, rs, a, sh, dh, pt, h)
            for e in range(kw):
                w0, w1 = valid(0, ow, e, sw, dw, pl, wd)
                dst = block("input", addr + (a * kw + e) * cs * xa_isz, dt, dst_st)
                if h0 == h1 or w0 == w1:
                    kb.load(core, shape=(rs, ow, cs), dst=dst, src=zero)
                    continue
                ih, iw = h0 * sh + a * dh - pt, w0 * sw + e * dw - pl
                src = staged._replace(addr=staged.addr + ((ih - i0) * wd + iw) * xa_isz,
                                      strides=(sh * wd, sw, plane))
                kb.load(core, shape=(h1 - h0, w1 - w0, cs), dst=dst, src=src,
                        pad_lo=(h0 - r0, w0, 0), pad_hi=(r0 + rs - h1, ow - w1, 0), fill=0)

    def load_b(core: int, b: int, c0: int, cs: int, n0: int, ns: int, addr: int) -> None:
        kb.load(core, shape=(taps, cs, ns),
                dst=block("weight", addr, dt, (cs * ns, ns, 1)),
                src=wl.at(c0 * o + n0, (c * o, o, 1)))

    def store_c(core: int, b: int, r0: int, rs: int, n0: int, ns: int, addr: int) -> None:
        kb.emit(core, "dma.store", shape=(1, ns, rs * ow),
                dst=out.at((b * o + n0) * oh * ow + r0 * ow, (0, oh * ow, 1)),
                src=block("acc", addr, out.dtype, (0, 1, ns)))

    emit_gemm(kb, shape, tiling, load_a, load_b, store_c)
    kb.end_kernel(KernelInfo(ctx.label("nn.conv2d"), "nn.conv2d", tiling.describe(shape),
                             tiling.estimate, gemm_roofline(ctx.config, shape)))


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
        kb.emit(core, "dma.store", shape=(1, ms, ns),
                dst=out.at((b * o + m0) * hw + n0, (0, hw, 1)),
                src=block("acc", addr, out.dtype, (0, ns, 1)))

    emit_gemm(kb, shape, tiling, load_a, load_b, store_c)
    kb.end_kernel(KernelInfo(ctx.label("nn.conv2d"), "nn.conv2d",
                             "1x1 as W @ X: " + tiling.describe(shape), tiling.estimate,
                             gemm_roofline(ctx.config, shape)))


def _depthwise(ctx: LoweringContext, call: Any, x: Any, w: Any, out: DramTensor) -> None:
    """A depthwise convolution (one input channel per group, multiplier 1) on the vector
    unit: the pooling kernel's taps, each multiplied by its channel's weight."""
    at = call.attrs
    if not isinstance(x, DramTensor) or not isinstance(w, np.ndarray):
        raise NotSupported("nn.conv2d: depthwise with run-time weights or a constant image")
    c, o = x.shape[1], w.shape[0]
    if not (at.groups == c == o and w.shape[1] == 1):
        raise NotSupported(f"nn.conv2d: groups={at.groups} (only depthwise: groups = "
                           "channels, one output per channel)")
    if x.dtype in ("float16", "bfloat16") and out.dtype == "float32":  # ToMixedPrecision's
        x = cast_kernel(ctx, x, "float32", "nn.conv2d.cast")  # exact; products exact in fp32
    if x.dtype not in (*_FLOAT, "int32") or out.dtype != x.dtype:  # int32: int8 widened
        raise NotSupported(f"nn.conv2d: depthwise {x.dtype} -> {out.dtype}")
    _vector_dtype(ctx, x.dtype, "nn.conv2d")
    wt = ctx.constant(w.reshape(c, -1), x.dtype)
    emit_pool2d(ctx, "nn.conv2d.depthwise", x, out, "dw", (w.shape[2], w.shape[3]),
                tuple(at.strides), tuple(at.padding), tuple(at.dilation), None, wt)


# ---------------------------------------------------------------------------------------------
# pooling, softmax
# ---------------------------------------------------------------------------------------------
def _float_input(ctx: LoweringContext, op: str, x: Any) -> DramTensor:
    if not isinstance(x, DramTensor):
        raise NotSupported(f"{op} of a constant")
    _vector_dtype(ctx, x.dtype, op)
    if x.dtype not in _FLOAT:
        raise NotSupported(f"{op}: only on floats")
    return x


@register_lowering(("nn.max_pool2d", "nn.avg_pool2d"))
def lower_pool2d(ctx: LoweringContext, call: Any, args: list[Any], out: DramTensor) -> None:
    op = call.op.name
    at = call.attrs
    x = _float_input(ctx, op, args[0])
    if at.layout != "NCHW" or at.ceil_mode:
        raise NotSupported(f"{op}: layout {at.layout}, ceil_mode={at.ceil_mode}")
    kind = "max" if op == "nn.max_pool2d" else "avg"
    divisor = None
    if kind == "avg":
        if any(at.padding) and not at.count_include_pad:
            raise NotSupported(f"{op}: padding not counted (count_include_pad=False)")
        divisor = float(at.pool_size[0] * at.pool_size[1])
    emit_pool2d(ctx, op, x, out, kind, tuple(at.pool_size), tuple(at.strides),
                tuple(at.padding), tuple(at.dilation), divisor)


@register_lowering("nn.adaptive_avg_pool2d")
def lower_adaptive_avg_pool2d(ctx: LoweringContext, call: Any, args: list[Any],
                              out: DramTensor) -> None:
    op = call.op.name
    x = _float_input(ctx, op, args[0])
    if call.attrs.layout != "NCHW":
        raise NotSupported(f"{op}: layout {call.attrs.layout}")
    h, w = x.shape[2:]
    oh, ow = out.shape[2:]
    if (oh, ow) == (1, 1):
        return emit_row_mean(ctx, op, x, out, x.shape[0] * x.shape[1])
    if h % oh or w % ow:
        raise NotSupported(f"{op}: {h}x{w} -> {oh}x{ow} has unequal windows")
    emit_pool2d(ctx, op, x, out, "avg", (h // oh, w // ow), (h // oh, w // ow), (0, 0, 0, 0),
                (1, 1), float(h // oh * (w // ow)))


@register_lowering("mean")
def lower_mean(ctx: LoweringContext, call: Any, args: list[Any], out: DramTensor) -> None:
    """A mean over trailing axes (global average pooling as ONNX exports it)."""
    x = _float_input(ctx, "mean", args[0])
    rank = len(x.shape)
    axes = call.attrs.axis
    axes = list(range(rank)) if axes is None else \
        sorted(a % rank for a in ((axes,) if isinstance(axes, int) else axes))
    if not axes or axes != list(range(rank - len(axes), rank)):
        raise NotSupported(f"mean over axes {axes} (only trailing axes)")
    emit_row_mean(ctx, "mean", x, out, int(np.prod(x.shape[:rank - len(axes)], dtype=np.int64)))


@register_lowering("nn.softmax")
def lower_softmax(ctx: LoweringContext, call: Any, args: list[Any], out: DramTensor) -> None:
    x = _float_input(ctx, "nn.softmax", args[0])
    if call.attrs.axis not in (-1, len(x.shape) - 1) or x.dtype != "float32":
        raise NotSupported("nn.softmax: only over the last axis, in float32")
    emit_softmax(ctx, "nn.softmax", x, out)
