"""NPU tensor intrinsics: the tensor unit's tile product, registered from a hardware description.

The NPU's ``mma`` instruction multiplies a whole tile of any extent (the unit steps over its
``m x k x n`` shape internally), so one intrinsic per operand/accumulator dtype combination of
the description's ``[tensor] dtypes`` covers every tile a schedule cuts:

- ``npu.mma.<a>.<b>.<acc>``: ``C[M, N] (acc) += cast(acc, A[M, K]) * cast(acc, B[K, N])`` with
  ``M, N, K`` free (tensorize binds them to the tile's extents) and row strides free (the
  scratchpad layout is the program generator's). ``A`` lives in ``npu.l0.input``, ``B`` in
  ``npu.l0.weight``, ``C`` in ``npu.l0.acc``: the desc declares those scopes, so a tile whose
  operands were not staged into them does not match.

The impl is one ``Call`` of :data:`NPU_MMA` on the first element of each tile and the bound
extents; :mod:`kiln.schedule.npu.tir_program` turns it into an ``mma`` (``mma.set`` when the
block's ``init`` runs on that step).
"""

from __future__ import annotations

from typing import Any

from ..buffer import Buffer
from ..expr import Call, IterType, IterVar, PrimExpr, Range, Var, cast, const
from ..function import PrimFunc
from ..stmt import Block, BlockRealize, BufferStore, Evaluate, For, ForKind, Stmt
from .intrin import address_of, get, names, register

__all__ = ["NPU_MMA", "SCOPE_ACC", "SCOPE_INPUT", "SCOPE_L1", "SCOPE_WEIGHT", "mma_intrin_name",
           "register_npu_intrinsics"]

#: ``Call`` op of the tensor unit's tile product (args: C, A, B addresses, then M, N, K).
NPU_MMA = "npu.mma"
#: Storage scopes named after the description's memories.
SCOPE_INPUT, SCOPE_WEIGHT, SCOPE_ACC, SCOPE_L1 = ("npu.l0.input", "npu.l0.weight",
                                                   "npu.l0.acc", "npu.l1")
I64 = "int64"


def mma_intrin_name(a: str, b: str, acc: str) -> str:
    """The intrinsic's registered name for operand dtypes ``a`` x ``b`` into ``acc``."""
    return f"npu.mma.{a}.{b}.{acc}"


def _prim_func(buffers: list[Buffer], body: Stmt) -> PrimFunc:
    params = [Var(b.name, "handle") for b in buffers]
    root = Block((), (), (), "root", body)
    return PrimFunc(params, dict(zip(params, buffers)), BlockRealize((), const("bool", 1), root))


def _tile_buffers(a: str, b: str, acc: str) -> tuple[list[Var], list[Buffer]]:
    m, n, k, ldc, lda, ldb = (Var(x, I64) for x in ("M", "N", "K", "ldc", "lda", "ldb"))
    one = const(I64, 1)
    bufs = [Buffer("C", (m, n), acc, strides=(ldc, one), scope=SCOPE_ACC),
            Buffer("A", (m, k), a, strides=(lda, one), scope=SCOPE_INPUT),
            Buffer("B", (k, n), b, strides=(ldb, one), scope=SCOPE_WEIGHT)]
    return [m, n, k], bufs


def _desc(a: str, b: str, acc: str) -> PrimFunc:
    (m, n, k), (C, A, B) = _tile_buffers(a, b, acc)
    loops = [Var(x, I64) for x in ("i", "j", "k")]
    kinds = (IterType.DATA_PAR, IterType.DATA_PAR, IterType.COMM_REDUCE)
    ivs = [IterVar(Range(const(I64, 0), e), Var(f"v{lv.name}", I64), kind)
           for lv, e, kind in zip(loops, (m, n, k), kinds)]
    vi, vj, vk = (iv.var for iv in ivs)
    value: PrimExpr = C[vi, vj] + cast(acc, A[vi, vk]) * cast(acc, B[vk, vj])
    stmt: Stmt = BlockRealize(tuple(loops), const("bool", 1),
                              Block(tuple(ivs), (), (), "update", BufferStore(C, value, (vi, vj))))
    for lv, e in reversed(list(zip(loops, (m, n, k)))):
        stmt = For(lv, const(I64, 0), e, ForKind.SERIAL, stmt)
    return _prim_func([C, A, B], stmt)


def _impl(a: str, b: str, acc: str) -> PrimFunc:
    (m, n, k), (C, A, B) = _tile_buffers(a, b, acc)
    call = Call("int32", NPU_MMA, (address_of(C, 0, 0), address_of(A, 0, 0),
                                   address_of(B, 0, 0), m, n, k))
    return _prim_func([C, A, B], Evaluate(call))


def register_npu_intrinsics(config: Any) -> list[str]:
    """Register the tile product of every ``[tensor] dtypes`` combination of ``config`` (an
    :class:`~kiln.target.npu.NPUConfig`); returns their names. Registering again is a no-op
    (the intrinsics depend on the dtypes only, not on the tile shape or the sizes)."""
    out = []
    known = set(names())
    for td in config.tensor_dtypes:
        a, b, acc = str(td.a), str(td.b), str(td.acc)
        name = mma_intrin_name(a, b, acc)
        if name not in known:
            register(name, _desc(a, b, acc), _impl(a, b, acc))
        out.append(get(name).name)
    return out
