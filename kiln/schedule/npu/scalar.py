"""The scalar unit's kernels: what neither the tensor nor the vector unit can compute.

- Element-wise ops in a dtype the vector unit lacks (``[vector] dtypes``: no int64 in the
  shipped descriptions: an attention mask's arithmetic, its cast to float): a loop on each
  core's scalar unit -- ``s.ld`` each operand's element straight from DRAM, one ``s.alu`` (or
  ``s.cvt`` for a cast), ``s.st`` the result, advance the byte offsets, branch back.
- Float functions without a vector instruction (``log``, ``sqrt``, ``sin``, ``cos``,
  ``floor``, ``ceil``, ``round``): the same loop around ``s.fn``, when the description's
  ``[scalar] functions`` lists the function (:func:`kiln.npu.numerics.scalar_function`).
- ``take`` with run-time indices (there is no indirect DMA): per index, ``s.ld`` it, fix it
  by the mode, and copy the row it selects with one ``s.copy`` (:func:`lower_take`); ONNX Gather's
  "raise" mode stops the run with ``s.trap`` on an index out of range.

Each is correct and slow (a handful of instructions and DRAM round trips per element), which
is why the kernel's description says so and why: ``kiln show --stage npu`` and
``NPUExecutable.describe()`` print it as ``scalar unit (<reason>)``.

Kernels are separated by barriers, so the loops need no tokens: everything earlier kernels
wrote to DRAM is there, and later kernels wait for the loop to finish.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from ...target.npu.config import DRAM
from .emit import DramTensor, KernelInfo, itemsize
from .lowering import LoweringContext, NotSupported, register_lowering

__all__ = ["SCALAR_ALU", "SCALAR_DTYPES", "SCALAR_FN_OPS", "emit_scalar_elementwise",
           "lower_scalar_function", "lower_take"]

#: Graph op -> ``s.alu`` function of the ops the scalar fallback computes (``negative`` is
#: ``0 - x``, ``relu`` is ``max(x, 0)``, ``cast`` is ``s.cvt``).
SCALAR_ALU = {"add": "add", "subtract": "sub", "multiply": "mul", "maximum": "max",
              "minimum": "min", "negative": "sub", "relu": "max"}
#: Graph op -> ``s.fn`` function: float functions the scalar unit computes (when the
#: description lists them in ``[scalar] functions``).
SCALAR_FN = {"exp": "exp", "log": "log", "sqrt": "sqrt", "rsqrt": "rsqrt", "sin": "sin",
             "cos": "cos", "tanh": "tanh", "erf": "erf", "floor": "floor", "ceil": "ceil",
             "round": "round"}
#: The ops without a vector instruction, lowered onto the scalar unit only.
SCALAR_FN_OPS = ("log", "sqrt", "sin", "cos", "floor", "ceil", "round")
#: The dtypes the scalar unit loads and stores (its registers hold any element type of the
#: ISA; a bool is its uint8 bytes).
SCALAR_DTYPES = ("int8", "uint8", "int16", "int32", "int64", "float16", "bfloat16", "float32")
_DRAM = 0


def _immediate(v: Any) -> bool:
    """Whether ``v`` fits an instruction's immediate (a 32-bit int or a float32 value)."""
    if isinstance(v, int):
        return -(2 ** 31) <= v < 2 ** 31
    return not np.isfinite(v) or float(np.float32(v)) == v


def emit_scalar_elementwise(ctx: LoweringContext, call: Any, args: list[Any],
                            out: DramTensor, reason: str) -> None:
    """``out = op(args)`` element by element on the scalar units (cores split the elements);
    every operand has ``out``'s shape or one element. ``reason``: why not the vector unit
    (printed with the kernel). Raises NotSupported for other ops, shapes or dtypes."""
    op = call.op.name
    cfg = ctx.config
    if op in SCALAR_FN:
        if SCALAR_FN[op] not in cfg.scalar_functions:
            raise NotSupported(f"{op}: {reason}; the scalar unit of {cfg.name!r} has no "
                               f"{SCALAR_FN[op]} either")
        if out.dtype not in ("float16", "bfloat16", "float32"):
            raise NotSupported(f"{op}: {reason}; the scalar unit computes it on floats only")
    elif op not in SCALAR_ALU and op != "cast":
        raise NotSupported(f"{op}: {reason}; no scalar-unit form either")
    n = int(np.prod(out.shape, dtype=np.int64))
    operands: list[tuple[str, Any]] = []  # ("mem" | "const", DramTensor) or ("imm", value)
    for a in args:
        if isinstance(a, np.ndarray) and a.size == 1:
            v = a.reshape(-1)[0].item()
            if _immediate(v):
                operands.append(("imm", v))
            else:  # wider than an instruction's 32-bit immediate: loaded once from DRAM
                operands.append(("const", ctx.constant(a.reshape(1))))
        elif isinstance(a, (DramTensor, np.ndarray)) and tuple(a.shape) == out.shape:
            operands.append(("mem", ctx.tensor(a)))
        else:
            raise NotSupported(f"{op}: {reason}; the scalar unit takes operands of the "
                               "result's shape or one element only")
    if op == "negative":
        operands.insert(0, ("imm", 0))
    elif op == "relu":
        operands.append(("imm", 0))
    in_dt = next((str(t.dtype) for _, t in operands if isinstance(t, DramTensor)), out.dtype)
    for dt in (in_dt, out.dtype):
        if dt not in SCALAR_DTYPES:
            raise NotSupported(f"{op}: {reason}; the scalar unit has no {dt} either")
    if op != "cast" and any(isinstance(t, DramTensor) and t.dtype != out.dtype
                            for _, t in operands):
        raise NotSupported(f"{op}: operands of different dtypes")
    kb = ctx.kb
    if cfg.scalar_registers < 5 + len(operands):
        raise NotSupported(f"{op}: the scalar unit has too few registers")
    isz, osz = itemsize(in_dt), itemsize(out.dtype)
    per = -(-n // cfg.cores)
    for core in range(cfg.cores):
        lo, hi = core * per, min(n, (core + 1) * per)
        if lo >= hi:
            continue
        # r1: input byte offset, r2: output byte offset, r3: output end, r4..: values
        body = [("s.li", dict(dtype="int64", rd=1, value=0))]
        for k, (kind, v) in enumerate(operands):
            if kind == "const":
                body.append(("s.ld", dict(dtype=v.dtype, rd=4 + k, mem=_DRAM, base=1,
                                          offset=v.addr)))
        body += [("s.li", dict(dtype="int64", rd=1, value=lo * isz)),
                 ("s.li", dict(dtype="int64", rd=2, value=lo * osz)),
                 ("s.li", dict(dtype="int64", rd=3, value=hi * osz))]
        regs = []
        for k, (kind, v) in enumerate(operands):
            rd = 4 + k
            regs.append(rd)
            if kind == "imm":
                body.append(("s.li", dict(dtype=in_dt, rd=rd, value=v)))
        loop_start = len(body)
        for rd, (kind, v) in zip(regs, operands):
            if kind == "mem":
                body.append(("s.ld", dict(dtype=in_dt, rd=rd, mem=_DRAM, base=1,
                                          offset=v.addr)))
        res = 4 + len(operands)
        if op in SCALAR_FN:
            body.append(("s.fn", dict(fn=SCALAR_FN[op], dtype=out.dtype, rd=res,
                                      rs=regs[0])))
        elif op == "cast":
            body.append(("s.cvt", dict(mode="rtz", to=out.dtype, **{"from": in_dt}, rd=res,
                                       rs=regs[0])))
        else:
            body.append(("s.alu", dict(fn=SCALAR_ALU[op], dtype=out.dtype, rd=res,
                                       rs1=regs[0], rs2=regs[1])))
        body += [("s.st", dict(dtype=out.dtype, rs=res, mem=_DRAM, base=2, offset=out.addr)),
                 ("s.alui", dict(fn="add", dtype="int64", rd=1, rs1=1, value=isz)),
                 ("s.alui", dict(fn="add", dtype="int64", rd=2, rs1=2, value=osz))]
        body.append(("s.br", dict(cond="lt", rs1=2, rs2=3, target=loop_start - len(body))))
        for opcode, fields in body:
            kb.emit(core, opcode, **fields)
    loop = sum(kind == "mem" for kind, _ in operands) + 5
    # each element: the loop's instructions, two of them DRAM accesses
    dram = cfg.memory(DRAM)
    fn = cfg.scalar_function_latency - cfg.scalar_latency if op in SCALAR_FN else 0
    estimate = per * (loop * cfg.scalar_latency + fn + 2 * (cfg.scalar_memory_latency +
                                                            dram.latency))
    kb.end_kernel(KernelInfo(ctx.label(op), op, f"scalar unit ({reason}): {n} elements, "
                             f"{loop} instructions each", estimate, estimate))


@register_lowering(SCALAR_FN_OPS)
def lower_scalar_function(ctx: LoweringContext, call: Any, args: list[Any], out: DramTensor
                          ) -> None:
    """A float function the vector unit has no instruction for (``log``, ``sqrt``, ``sin``,
    ``cos``, ``floor``, ``ceil``, ``round``): a scalar-unit loop of ``s.fn``."""
    op = call.op.name
    emit_scalar_elementwise(ctx, call, [ctx.tensor(args[0])], out,
                            f"{op}: no vector instruction")


#: Registers of the take loop (every description has at least 16).
_R_IDX, _R_IDX_END, _R_OUT, _R_BASE, _R_I, _R_ROW = range(1, 7)
_R_N, _R_ROWB, _R_ZERO, _R_TMP, _R_AUX, _R_OUT_BASE, _R_BASE_END = range(7, 14)


@register_lowering("take")
def lower_take(ctx: LoweringContext, call: Any, args: list[Any], out: DramTensor) -> None:
    """A gather with run-time indices (no indirect DMA): a scalar-unit loop per core over its
    share of the indices -- ``s.ld`` the index, fix it by the mode (``clip``: clamp;
    ``wrap``: modulo; ``fast``: negatives from the end; ``raise``: also ``s.trap`` on one
    outside ``[-n, n)``, a RuntimeCheckError naming it), then copy the row it selects with
    one ``s.copy`` (a DRAM -> DRAM DMA at register-held addresses: the bits move unchanged)."""
    at = call.attrs
    mode = getattr(at, "mode", "clip")
    data, idx = ctx.tensor(args[0]), ctx.tensor(args[1])
    if not isinstance(data, DramTensor) or not isinstance(idx, DramTensor):
        raise NotSupported("take: strided operand views")
    if idx.dtype not in ("int8", "uint8", "int16", "int32", "int64"):
        raise NotSupported(f"take: {idx.dtype} indices")
    cfg, kb = ctx.config, ctx.kb
    if cfg.scalar_registers < 14:
        raise NotSupported("take: the scalar unit has too few registers")
    axis = getattr(at, "axis", None)
    shape = (int(np.prod(data.shape, dtype=np.int64)),) if axis is None else data.shape
    axis = 0 if axis is None else axis % len(shape)
    n = shape[axis]
    outer = int(np.prod(shape[:axis], dtype=np.int64))
    row_bytes = int(np.prod(shape[axis + 1:], dtype=np.int64)) * itemsize(data.dtype)
    n_idx = int(np.prod(idx.shape, dtype=np.int64))
    if n == 0 or n_idx == 0 or row_bytes == 0 or outer == 0:
        raise NotSupported("take: an empty operand")
    per = -(-n_idx // cfg.cores)
    for core in range(cfg.cores):
        lo, hi = core * per, min(n_idx, (core + 1) * per)
        if lo < hi:
            _take_loop(kb, core, mode, data, idx, out, (lo, hi), (outer, n, n_idx),
                       row_bytes)
    dram = cfg.memory(DRAM)
    access = cfg.scalar_memory_latency + dram.latency
    copy = cfg.dma_latency + dram.latency + 2 * row_bytes / dram.bandwidth
    estimate = outer * per * (copy + 12 * cfg.scalar_latency + access)
    kb.end_kernel(KernelInfo(
        ctx.label("take"), "take",
        f"scalar unit (take: no indirect DMA): {outer * n_idx} rows of {row_bytes} bytes, "
        f"one s.copy each", estimate, estimate))


def _take_loop(kb: Any, core: int, mode: str, data: DramTensor, idx: DramTensor,
               out: DramTensor, span: tuple[int, int], dims: tuple[int, int, int],
               row_bytes: int) -> None:
    """One core's loop of :func:`lower_take` over indices ``span`` (``dims``: the rows
    before the axis, the axis length, the number of indices)."""
    (lo, hi), (outer, n, n_idx) = span, dims
    isz = itemsize(idx.dtype)
    code: list[tuple[str, dict[str, Any]]] = []
    labels: dict[str, int] = {}
    fixups: list[tuple[int, str]] = []

    def emit(opcode: str, **fields: Any) -> None:
        code.append((opcode, fields))

    def li(rd: int, value: int) -> None:
        emit("s.li", dtype="int64", rd=rd, value=value)

    def alu(fn: str, rd: int, rs1: int, rs2: int) -> None:
        emit("s.alu", fn=fn, dtype="int64", rd=rd, rs1=rs1, rs2=rs2)

    def branch(cond: str, rs1: int, rs2: int, label: str) -> None:
        fixups.append((len(code), label))
        emit("s.br", cond=cond, rs1=rs1, rs2=rs2, target=0)

    # immediates are 32-bit: larger constants are built as hi * 2**16 + lo
    def const(rd: int, value: int) -> None:
        if -(2 ** 31) <= value < 2 ** 31:
            return li(rd, value)
        li(rd, value >> 16)
        emit("s.alui", fn="shl", dtype="int64", rd=rd, rs1=rd, value=16)
        emit("s.alui", fn="add", dtype="int64", rd=rd, rs1=rd, value=value & 0xFFFF)

    const(_R_N, n)
    const(_R_ROWB, row_bytes)
    li(_R_ZERO, 0)
    const(_R_AUX, n - 1)
    li(_R_BASE, 0)
    li(_R_OUT_BASE, lo * row_bytes)
    const(_R_BASE_END, outer * n * row_bytes)
    labels["outer"] = len(code)
    const(_R_IDX, lo * isz)
    const(_R_IDX_END, hi * isz)
    alu("add", _R_OUT, _R_OUT_BASE, _R_ZERO)
    labels["index"] = len(code)
    emit("s.ld", dtype=idx.dtype, rd=_R_I, mem=_DRAM, base=_R_IDX, offset=idx.addr)
    if mode == "clip":
        alu("max", _R_I, _R_I, _R_ZERO)
        alu("min", _R_I, _R_I, _R_AUX)
    elif mode == "wrap":
        alu("rem", _R_I, _R_I, _R_N)  # floor modulo: in [0, n)
    else:  # fast, raise: a negative index counts from the end
        alu("add", _R_AUX, _R_I, _R_ZERO)
        alu("lt", _R_TMP, _R_I, _R_ZERO)
        alu("mul", _R_TMP, _R_TMP, _R_N)
        alu("add", _R_I, _R_I, _R_TMP)
        if mode == "raise":
            branch("lt", _R_I, _R_ZERO, "trap")
            branch("ge", _R_I, _R_N, "trap")
    alu("mul", _R_ROW, _R_I, _R_ROWB)
    alu("add", _R_ROW, _R_ROW, _R_BASE)
    emit("s.copy", rd=_R_OUT, dst=out.addr, rs=_R_ROW, src=data.addr, nbytes=row_bytes)
    alu("add", _R_OUT, _R_OUT, _R_ROWB)
    emit("s.alui", fn="add", dtype="int64", rd=_R_IDX, rs1=_R_IDX, value=isz)
    branch("lt", _R_IDX, _R_IDX_END, "index")
    alu("mul", _R_TMP, _R_N, _R_ROWB)  # the next outer row: data + n rows, out + n_idx rows
    alu("add", _R_BASE, _R_BASE, _R_TMP)
    const(_R_TMP, n_idx * row_bytes)
    alu("add", _R_OUT_BASE, _R_OUT_BASE, _R_TMP)
    branch("lt", _R_BASE, _R_BASE_END, "outer")
    if mode == "raise":
        emit("s.jmp", target=2)
        labels["trap"] = len(code)
        emit("s.trap", code="index", rs=_R_AUX)
    for at, label in fixups:
        code[at][1]["target"] = labels[label] - at
    for opcode, fields in code:
        kb.emit(core, opcode, **fields)
