"""The scalar unit's fallback for element-wise ops the vector unit cannot compute.

The vector unit works in the description's vector dtypes (``[vector] dtypes``: no int64 in
the shipped ones), so an element-wise op on int64 -- an attention mask's arithmetic, its cast
to float -- has no vector form. Rather than leaving the NPU for the CPU, such an op runs as a
loop on each core's scalar unit: ``s.ld`` each operand's element straight from DRAM, one
``s.alu`` (or ``s.cvt`` for a cast), ``s.st`` the result, advance the byte offsets, branch
back. It is correct and slow (a handful of instructions and two DRAM round trips per element),
which is why the kernel's description says so and why: ``kiln show --stage npu`` and
``NPUExecutable.describe()`` print it as ``scalar unit (<reason>)``.

Kernels are separated by barriers, so the loop needs no tokens: everything earlier kernels
wrote to DRAM is there, and later kernels wait for the loop to finish.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from ...target.npu.config import DRAM
from .emit import DramTensor, KernelInfo, itemsize
from .lowering import LoweringContext, NotSupported, register_lowering

__all__ = ["SCALAR_ALU", "SCALAR_FN_OPS", "emit_scalar_elementwise", "lower_scalar_function"]

#: Graph op -> ``s.alu`` function of the ops the scalar fallback computes (``negative`` is
#: ``0 - x``, ``relu`` is ``max(x, 0)``, ``cast`` is ``s.cvt``).
SCALAR_ALU = {"add": "add", "subtract": "sub", "multiply": "mul", "maximum": "max",
              "minimum": "min", "negative": "sub", "relu": "max"}
#: The scalar unit's dtypes (its registers hold any element type of the ISA).
#: Graph op -> ``s.fn`` function: float functions the scalar unit computes (when the
#: description lists them in ``[scalar] functions``).
SCALAR_FN = {"exp": "exp", "log": "log", "sqrt": "sqrt", "rsqrt": "rsqrt", "sin": "sin",
             "cos": "cos", "tanh": "tanh", "erf": "erf", "floor": "floor", "ceil": "ceil",
             "round": "round"}
#: The ops without a vector instruction, lowered onto the scalar unit only.
SCALAR_FN_OPS = ("log", "sqrt", "sin", "cos", "floor", "ceil", "round")
_SCALAR_DTYPES = ("int8", "uint8", "int16", "int32", "int64", "float16", "bfloat16", "float32")
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
        if dt not in _SCALAR_DTYPES:
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
