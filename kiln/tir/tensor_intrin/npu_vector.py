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

__all__ = ["NPU_VECTOR", "NPU_VIEW", "REDUCTIONS", "VECTOR_OPCODES", "VecOperand", "vector_intrin",
           "vector_intrin_name",
           "vector_value"]

#: ``Call`` op of a vector instruction (args: opcode, mode, D's address, one per operand --
#: an address or an immediate --, then the block's three extents).
NPU_VECTOR = "npu.vector"
#: ``Call`` op of a strided view operand (args: its first element's address, then per
#: instruction dim the buffer dim that moves along it, counted from the end, and the step;
#: step 0: none moves).
NPU_VIEW = "npu.view"
I64 = "int64"
_SCOPE_TAG = {SCOPE_INPUT: "in", SCOPE_WEIGHT: "wt", SCOPE_ACC: "acc"}


def _abs(a: PrimExpr) -> PrimExpr:
    return call_intrin("fabs", a) if a.dtype.is_float else select(a < make_const(a.dtype, 0),
                                                                   -a, a)


#: The row reductions (``D[..., r] = reduce_k A[..., r, k]``).
REDUCTIONS = ("vred.sum", "vred.max", "vred.min")
#: opcode -> (operands, semantics of the operand values); ``vcast`` is apart (its dtype, mode).
VECTOR_OPCODES: dict[str, tuple[int, Any]] = {
    "vadd": (2, lambda a, b: a + b), "vsub": (2, lambda a, b: a - b),
    "vmul": (2, lambda a, b: a * b), "vdiv": (2, lambda a, b: a / b),
    "vmin": (2, tmin), "vmax": (2, tmax), "vmac": (3, lambda c, a, b: c + a * b),
    "vmaxnm": (2, lambda a, b: select(b > a, b, select(a != a, b, a))),
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
    mask: tuple[bool, ...] = (True, True, True)
    value: float = 0.0
    #: the second operand is the first one's block again (``vmul`` of a block by itself)
    same: bool = False
    #: a strided view instead of ``mask``: per buffer dim, the instruction dim that moves it
    #: (-1: none, the index is 0) and by how many elements per step (a pooling window's tap
    #: ``X[c, i * sh, j * sw]``; a depthwise weight ``W[c, 0]`` read along the channels)
    index: tuple[tuple[int, int], ...] | None = None

    @property
    def tag(self) -> str:
        if self.same:
            return "same"
        if self.index is not None:
            return _SCOPE_TAG[self.scope] + "v" + "_".join(  # type: ignore[index]
                "x" if d < 0 else f"{d}s{c}" for d, c in self.index)
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
                       mode: str = "", dst: str = SCOPE_ACC, rank: int = 3) -> str:
    """The registered name of a form: ``npu.<opcode>[.<mode>].<src dtype>.<dtype>[.<dst
    scope>][.<rank>d].<operand tags>`` (a tag: scope and broadcast mask, e.g. ``in101``,
    ``imm<value>``, or ``same``: the first operand again; the dst scope when not the
    accumulators, the rank when not 3)."""
    head = f"npu.{opcode}" + (f".{mode}" if mode else "")
    extra = ([] if dst == SCOPE_ACC else ["to" + _SCOPE_TAG[dst]]) + \
        ([] if rank == 3 else [f"{rank}d"])
    return ".".join([head, src_dtype, dtype] + extra + [o.tag for o in operands])


def _is_reduction(opcode: str) -> bool:
    return opcode in REDUCTIONS


def _buffers(dtype: str, src_dtype: str, operands: tuple[VecOperand, ...], dst: str,
             rank: int, reduce: bool) -> tuple[list[Var], list[Buffer]]:
    ext = [Var(f"E{d}", I64) for d in range(rank)]
    one = const(I64, 1)

    def strides(name: str) -> tuple[Var, ...]:
        return tuple(Var(f"{name}_s{d}", I64) for d in range(rank))

    # a reduction's D is one value per row: the last dim (the reduced one) of extent 1
    d_shape = tuple(ext[:-1]) + (one,) if reduce else tuple(ext)
    bufs = [Buffer("D", d_shape, dtype, strides=strides("D"), scope=dst)]
    for i, o in enumerate(operands):
        if o.scope is None or o.same:
            continue
        name = "CAB"[i] if len(operands) == 3 else "AB"[i]
        if o.index is not None:
            shape = tuple(one if d < 0 else ext[d] for d, _ in o.index)
            bufs.append(Buffer(name, shape, src_dtype,
                               strides=tuple(Var(f"{name}_s{k}", I64) for k in range(len(shape))),
                               scope=o.scope))
            continue
        shape = tuple(e if m else one for e, m in zip(ext, o.mask))
        bufs.append(Buffer(name, shape, src_dtype, strides=strides(name), scope=o.scope))
    return ext, bufs


def _desc(opcode: str, dtype: str, src_dtype: str, operands: tuple[VecOperand, ...],
          mode: str, dst: str, rank: int) -> PrimFunc:
    reduce = _is_reduction(opcode)
    ext, bufs = _buffers(dtype, src_dtype, operands, dst, rank, reduce)
    names = ("i", "j", "k")[3 - rank:]
    loops = [Var(x, I64) for x in names]
    if reduce:  # spatial loops, a unit loop over D's last dim, the reduction innermost
        loops = loops[:-1] + [Var("z", I64), loops[-1]]
    extents = list(ext[:-1]) + [const(I64, 1), ext[-1]] if reduce else list(ext)
    kinds = [IterType.DATA_PAR] * (len(loops) - 1) + \
        [IterType.COMM_REDUCE if reduce else IterType.DATA_PAR]
    ivs = [IterVar(Range(const(I64, 0), e), Var(f"v{lv.name}", I64), kind)
           for lv, e, kind in zip(loops, extents, kinds)]
    idx = [iv.var for iv in ivs]
    src_idx = idx[:-2] + [idx[-1]] if reduce else idx
    d_idx = idx[:-1] if reduce else idx
    zero = const(I64, 0)
    vals: list[PrimExpr] = []
    it = iter(bufs[1:])
    for o in operands:
        if o.same:
            vals.append(vals[0])
        elif o.scope is None:
            vals.append(make_const(src_dtype, o.value))
        elif o.index is not None:
            b = next(it)
            vals.append(b[tuple(zero if d < 0 else src_idx[d] * c for d, c in o.index)])
        else:
            b = next(it)
            vals.append(b[tuple(v if m else zero for v, m in zip(src_idx, o.mask))])
    if reduce:
        acc = bufs[0][tuple(d_idx)]
        value = acc + vals[0] if opcode == "vred.sum" else \
            (tmax if opcode == "vred.max" else tmin)(acc, vals[0])
    else:
        value = vector_value(opcode, dtype, vals, mode)
    stmt: Stmt = BlockRealize(tuple(loops), const("bool", 1),
                              Block(tuple(ivs), (), (), "vector", BufferStore(bufs[0], value,
                                                                              tuple(d_idx))))
    for lv, e in reversed(list(zip(loops, extents))):
        stmt = For(lv, const(I64, 0), e, ForKind.SERIAL, stmt)
    return _prim_func(bufs, stmt)


def _impl(opcode: str, dtype: str, src_dtype: str, operands: tuple[VecOperand, ...],
          mode: str, dst: str, rank: int) -> PrimFunc:
    ext, bufs = _buffers(dtype, src_dtype, operands, dst, rank, _is_reduction(opcode))
    zero = (0,) * rank
    args: list[PrimExpr] = [StringImm(opcode), StringImm(mode), address_of(bufs[0], *zero)]
    it = iter(bufs[1:])
    for o in operands:
        if o.same:
            args.append(args[3])
        elif o.index is not None:  # the view: per instruction dim, the buffer dim and step
            b = next(it)
            view: list[PrimExpr] = []
            for d in range(rank):  # the buffer dim counted from the end (-1 and 0: none)
                dim = next((k for k, (x, _) in enumerate(o.index) if x == d), -1)
                view += [const(I64, dim - len(o.index) if dim >= 0 else -1),
                         const(I64, o.index[dim][1] if dim >= 0 else 0)]
            args.append(Call("handle", NPU_VIEW, (address_of(b, *(0,) * len(o.index)),
                                                  *view)))
        else:
            args.append(make_const(src_dtype, o.value) if o.scope is None
                        else address_of(next(it), *zero))
    # the instruction's 3-D shape: the (source) block's extents, 1 in the missing dims
    shape = [const(I64, 1)] * (3 - rank) + list(ext)
    return _prim_func(bufs, Evaluate(Call("int32", NPU_VECTOR, (*args, *shape))))


def _prim_func(buffers: list[Buffer], body: Stmt) -> PrimFunc:
    params = [Var(b.name, "handle") for b in buffers]
    root = Block((), (), (), "root", body)
    return PrimFunc(params, dict(zip(params, buffers)), BlockRealize((), const("bool", 1), root))


def vector_intrin(opcode: str, dtype: str, src_dtype: str, operands: tuple[VecOperand, ...],
                  mode: str = "", dst: str = SCOPE_ACC, rank: int = 3) -> str:
    """Register (once) the intrinsic of the form ``opcode`` writing ``dtype`` into a block of
    scope ``dst`` from ``operands`` of ``src_dtype`` over ``rank`` dims (``mode``: a cast's
    rounding) and return its name. A reduction (``vred.sum/max/min``) reduces its operand's
    last dim into one value per row (``D``'s last dim of extent 1); the instruction runs
    with ``acc = 0`` (the block's ``init``, on the outer block, runs with it)."""
    if opcode != "vcast" and opcode not in VECTOR_OPCODES and opcode not in REDUCTIONS:
        raise ScheduleError(f"no vector intrinsic for {opcode!r}")
    if not any(o.scope is not None for o in operands):
        raise ScheduleError(f"{opcode}: a vector instruction reads at least one block")
    if rank not in (2, 3) or any(len(o.mask) != rank for o in operands if o.scope):
        raise ScheduleError(f"{opcode}: blocks of rank {rank} (2 or 3, every operand's mask)")
    if any(o.same for o in operands[:1]):
        raise ScheduleError(f"{opcode}: only a second operand repeats the first")
    name = vector_intrin_name(opcode, dtype, src_dtype, operands, mode, dst, rank)
    if name not in set(names()):
        register(name, _desc(opcode, dtype, src_dtype, operands, mode, dst, rank),
                 _impl(opcode, dtype, src_dtype, operands, mode, dst, rank))
    return get(name).name
