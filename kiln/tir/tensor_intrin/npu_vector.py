"""NPU vector intrinsics: the vector unit's instructions on 1-3-D blocks, described in TIR.

The NPU's vector instructions (``vadd``, ``vmul``, ``vexp``, ``vcast``, ...; see
:mod:`kiln.npu.isa`) work on a whole 3-D block of any extents, each operand a block of an L0
buffer with its own strides -- a stride of 0 repeats an element (a broadcast operand) -- or an
immediate. One intrinsic per instruction *form* covers every block a schedule cuts:

- ``desc``: ``D[i, j, k] = f(A[...], B[...])`` over loops of free extents ``E0 x E1 x E2``
  (tensorize binds them to the tile's extents), ``f`` the instruction's semantics in TIR
  (:func:`vector_value`). ``D`` lives in ``npu.l0.acc`` (where the vector unit writes);
  a block operand lives in the scope the form names (``npu.l0.input``, ``npu.l0.weight``, or
  ``npu.l0.acc``: the running value of a chain) and is indexed by ``i, j, k`` in the dims its
  broadcast mask keeps and by 0 in the others (a buffer dim of extent 1, read with stride 0);
  an immediate is the constant itself (so it is part of the form: ``vmul`` by 0.5 and by 2.0
  are two intrinsics). All strides are free (the scratchpad layout is the program
  generator's).
- ``impl``: one ``Call`` of :data:`NPU_VECTOR`: the opcode, the mode (a cast's rounding), the
  address of ``D``'s first element, per operand its first element's address or the immediate,
  then the extents; :mod:`kiln.schedule.npu.tir_vector` turns it into the instruction.

Forms are registered on demand (:func:`vector_intrin`): the set a model needs is small and
depends on its ops, not on a hardware description.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from ...ir.errors import ScheduleError
from ..buffer import Buffer
from ..expr import (
    Call,
    IterType,
    IterVar,
    PrimExpr,
    Range,
    StringImm,
    Var,
    call_intrin,
    cast,
    const,
    make_const,
    select,
)
from ..expr import max as tmax
from ..expr import min as tmin
from ..function import PrimFunc
from ..stmt import Block, BlockRealize, BufferStore, Evaluate, For, ForKind, Stmt
from .intrin import address_of, get, names, register
from .npu import SCOPE_ACC, SCOPE_INPUT, SCOPE_WEIGHT

__all__ = ["NPU_VECTOR", "VECTOR_OPCODES", "VecOperand", "vector_intrin", "vector_intrin_name",
           "vector_value"]

#: ``Call`` op of a vector instruction (args: opcode, mode, D's address, one per operand --
#: an address or an immediate --, then the block's three extents).
NPU_VECTOR = "npu.vector"
I64 = "int64"
_SCOPE_TAG = {SCOPE_INPUT: "in", SCOPE_WEIGHT: "wt", SCOPE_ACC: "acc"}


def _abs(a: PrimExpr) -> PrimExpr:
    return call_intrin("fabs", a) if a.dtype.is_float else select(a < make_const(a.dtype, 0),
                                                                   -a, a)


#: opcode -> (operands, semantics of the operand values); ``vcast`` is apart (its dtype, mode).
VECTOR_OPCODES: dict[str, tuple[int, Any]] = {
    "vadd": (2, lambda a, b: a + b), "vsub": (2, lambda a, b: a - b),
    "vmul": (2, lambda a, b: a * b), "vdiv": (2, lambda a, b: a / b),
    "vmin": (2, tmin), "vmax": (2, tmax),
    "vmov": (1, lambda a: a), "vrelu": (1, lambda a: tmax(a, make_const(a.dtype, 0))),
    "vneg": (1, lambda a: -a), "vabs": (1, _abs),
    "vexp": (1, lambda a: call_intrin("exp", a)), "vrsqrt": (1, lambda a: call_intrin("rsqrt", a)),
    "verf": (1, lambda a: call_intrin("erf", a)),
}


@dataclass(frozen=True)
class VecOperand:
    """One operand of a vector instruction form: a block of ``scope`` whose dims ``mask``
    keeps (False: extent 1, read with stride 0), or (``scope`` None) the immediate ``value``."""

    scope: str | None = None
    mask: tuple[bool, bool, bool] = (True, True, True)
    value: float = 0.0

    @property
    def tag(self) -> str:
        if self.scope is None:
            return f"imm{self.value!r}"
        return _SCOPE_TAG[self.scope] + "".join("1" if m else "0" for m in self.mask)


def vector_value(opcode: str, dtype: str, operands: list[PrimExpr], mode: str = "") -> PrimExpr:
    """The TIR value ``opcode`` computes from ``operands`` into ``dtype``: the desc of its
    intrinsics, and the stages a schedule tensorizes onto them are built with it too. A cast
    from float to int rounds by ``mode`` (``rne``: to nearest even, ``floor``, ``rtz``: toward
    zero, TIR's own cast); float -> float rounds to nearest even whatever the mode."""
    if opcode == "vcast":
        (a,) = operands
        if a.dtype.is_float and not make_const(dtype, 0).dtype.is_float:
            if mode == "rne":
                a = call_intrin("round", a)
            elif mode == "floor":
                a = call_intrin("floor", a)
        return cast(dtype, a)
    n, fn = VECTOR_OPCODES[opcode]
    if len(operands) != n:
        raise ScheduleError(f"{opcode} takes {n} operand(s), got {len(operands)}")
    return fn(*operands)


def vector_intrin_name(opcode: str, dtype: str, src_dtype: str, operands: tuple[VecOperand, ...],
                       mode: str = "") -> str:
    """The registered name of a form: ``npu.<opcode>[.<mode>].<src dtype>.<dtype>.<operand
    tags>`` (a tag: scope and broadcast mask, e.g. ``in101``, or ``imm<value>``)."""
    head = f"npu.{opcode}" + (f".{mode}" if mode else "")
    return ".".join([head, src_dtype, dtype] + [o.tag for o in operands])


def _buffers(dtype: str, src_dtype: str, operands: tuple[VecOperand, ...]
             ) -> tuple[list[Var], list[Buffer]]:
    ext = [Var(f"E{d}", I64) for d in range(3)]
    one = const(I64, 1)

    def strides(name: str) -> tuple[Var, ...]:
        return tuple(Var(f"{name}_s{d}", I64) for d in range(3))

    bufs = [Buffer("D", tuple(ext), dtype, strides=strides("D"), scope=SCOPE_ACC)]
    for i, o in enumerate(operands):
        if o.scope is None:
            continue
        name = "AB"[i]
        shape = tuple(e if m else one for e, m in zip(ext, o.mask))
        bufs.append(Buffer(name, shape, src_dtype, strides=strides(name), scope=o.scope))
    return ext, bufs


def _desc(opcode: str, dtype: str, src_dtype: str, operands: tuple[VecOperand, ...],
          mode: str) -> PrimFunc:
    ext, bufs = _buffers(dtype, src_dtype, operands)
    loops = [Var(x, I64) for x in ("i", "j", "k")]
    ivs = [IterVar(Range(const(I64, 0), e), Var(f"v{lv.name}", I64), IterType.DATA_PAR)
           for lv, e in zip(loops, ext)]
    idx = [iv.var for iv in ivs]
    zero = const(I64, 0)
    vals, it = [], iter(bufs[1:])
    for o in operands:
        if o.scope is None:
            vals.append(make_const(src_dtype, o.value))
        else:
            b = next(it)
            vals.append(b[tuple(v if m else zero for v, m in zip(idx, o.mask))])
    value = vector_value(opcode, dtype, vals, mode)
    stmt: Stmt = BlockRealize(tuple(loops), const("bool", 1),
                              Block(tuple(ivs), (), (), "vector", BufferStore(bufs[0], value,
                                                                              tuple(idx))))
    for lv, e in reversed(list(zip(loops, ext))):
        stmt = For(lv, const(I64, 0), e, ForKind.SERIAL, stmt)
    return _prim_func(bufs, stmt)


def _impl(opcode: str, dtype: str, src_dtype: str, operands: tuple[VecOperand, ...],
          mode: str) -> PrimFunc:
    ext, bufs = _buffers(dtype, src_dtype, operands)
    zero = (0, 0, 0)
    args: list[PrimExpr] = [StringImm(opcode), StringImm(mode), address_of(bufs[0], *zero)]
    it = iter(bufs[1:])
    for o in operands:
        args.append(make_const(src_dtype, o.value) if o.scope is None
                    else address_of(next(it), *zero))
    return _prim_func(bufs, Evaluate(Call("int32", NPU_VECTOR, (*args, *ext))))


def _prim_func(buffers: list[Buffer], body: Stmt) -> PrimFunc:
    params = [Var(b.name, "handle") for b in buffers]
    root = Block((), (), (), "root", body)
    return PrimFunc(params, dict(zip(params, buffers)), BlockRealize((), const("bool", 1), root))


def vector_intrin(opcode: str, dtype: str, src_dtype: str, operands: tuple[VecOperand, ...],
                  mode: str = "") -> str:
    """Register (once) the intrinsic of the form ``opcode`` writing ``dtype`` from
    ``operands`` of ``src_dtype`` (``mode``: a cast's rounding) and return its name."""
    if opcode != "vcast" and opcode not in VECTOR_OPCODES:
        raise ScheduleError(f"no vector intrinsic for {opcode!r}")
    if not any(o.scope is not None for o in operands):
        raise ScheduleError(f"{opcode}: a vector instruction reads at least one block")
    name = vector_intrin_name(opcode, dtype, src_dtype, operands, mode)
    if name not in set(names()):
        register(name, _desc(opcode, dtype, src_dtype, operands, mode),
                 _impl(opcode, dtype, src_dtype, operands, mode))
    return get(name).name
