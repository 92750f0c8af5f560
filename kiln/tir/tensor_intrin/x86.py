"""x86 tensor intrinsics: an AVX2/FMA register-tile GEMM micro-kernel and AMX tile GEMMs.

- ``x86.avx2.gemm_f32_{MR}x{NR}``: ``C[MR, NR] += A[MR, K] @ B[K, NR]`` (float32, any ``K``,
  row strides free): ``MR x NR/8`` accumulators in ymm registers, one broadcast of ``A`` and
  ``NR/8`` loads of ``B`` per ``k``. Portable C when the file is built without AVX2/FMA.
- ``x86.amx.gemm_bf16_16x16``: ``C[16, 16] (f32) += A[16, K] (bf16) @ B`` with ``B`` in the
  VNNI layout ``Bp[K/2, 16, 2]`` (``Bp[k // 2, j, k % 2] = B[k, j]``): ``_tile_dpbf16ps`` over
  chunks of 32 ``k``.
- ``x86.amx.gemm_int8_16x16``: ``C[16, 16] (int32) += A[16, K] (int8) @ B``, ``Bp[K/4, 16, 4]``:
  ``_tile_dpbssd`` over chunks of 64 ``k``.

The AMX helpers are compiled with ``__attribute__((target("amx-...")))`` so any file builds;
at run time they ask Linux once for the tile-data permission
(``arch_prctl(ARCH_REQ_XCOMP_PERM, XFEATURE_XTILEDATA)``) and compute with portable C when it is
refused (no AMX on the CPU, old kernel), and for the ``K`` remainder of a chunk. Building a
module that uses them on a CPU with AMX requests the permission up front and raises
:class:`~kiln.runtime.amx.AMXPermissionError` when the kernel refuses
(:func:`kiln.runtime.amx.request_amx_permission`).
"""

from __future__ import annotations

from typing import Any

from ...ir.errors import ScheduleError
from ...runtime.amx import request_amx_permission
from ...target.target import Target
from ..buffer import Buffer
from ..expr import IterType, IterVar, PrimExpr, Range, Var, cast, const
from ..function import PrimFunc
from ..stmt import Block, BlockRealize, BufferStore, Evaluate, For, ForKind, Stmt
from .intrin import address_of, call_extern, register, register_extern

I64 = "int64"


def _func(buffers: list[Buffer], body: Stmt) -> PrimFunc:
    params = [Var(b.name, "handle") for b in buffers]
    root = Block((), (), (), "root", body)
    return PrimFunc(params, dict(zip(params, buffers)), BlockRealize((), const("bool", 1), root))


def _gemm_desc(C: Buffer, A: Buffer, B: Buffer, extents: list[PrimExpr],
               value: Any) -> PrimFunc:
    """Loops ``i, j, *k`` (extents given) around ``C[i, j] = C[i, j] + value(vi, vj, vks)``."""
    loop_vars = [Var(n, I64) for n in ("i", "j", "k", "kk")[:len(extents)]]
    ivs = [IterVar(Range(const(I64, 0), e), Var(f"v{lv.name}", I64),
                   IterType.DATA_PAR if n < 2 else IterType.COMM_REDUCE)
           for n, (lv, e) in enumerate(zip(loop_vars, extents))]
    vi, vj, *vks = (iv.var for iv in ivs)
    store = BufferStore(C, C[vi, vj] + value(vi, vj, *vks), (vi, vj))
    block = Block(tuple(ivs), (), (), "update", store)
    stmt: Stmt = BlockRealize(tuple(loop_vars), const("bool", 1), block)
    for lv, e in reversed(list(zip(loop_vars, extents))):
        stmt = For(lv, const(I64, 0), e, ForKind.SERIAL, stmt)
    return _func([C, A, B], stmt)


def _call_impl(C: Buffer, A: Buffer, B: Buffer, fn: str, k: PrimExpr) -> PrimFunc:
    zeros = [(0,) * b.ndim for b in (C, A, B)]
    call = call_extern("int32", fn, address_of(C, *zeros[0]), address_of(A, *zeros[1]),
                       address_of(B, *zeros[2]), k, C.strides[0], A.strides[0], B.strides[0])
    return _func([C, A, B], Evaluate(call))


# ---------------------------------------------------------------------------------------------
# AVX2 / FMA: float32 register tile
# ---------------------------------------------------------------------------------------------
def _avx2_c(name: str, mr: int, nr: int) -> str:
    nv = nr // 8
    return f"""#if defined(__AVX2__) && defined(__FMA__)
#include <immintrin.h>
#endif
/* C[{mr}x{nr}] += A[{mr}xK] * B[Kx{nr}] (float32, row strides ldc/lda/ldb). */
static inline void {name}(float* restrict C, const float* restrict A,
                          const float* restrict B, int64_t K, int64_t ldc, int64_t lda,
                          int64_t ldb) {{
#if defined(__AVX2__) && defined(__FMA__)
  __m256 acc[{mr}][{nv}];
#pragma GCC unroll {mr}
  for (int r = 0; r < {mr}; ++r)
#pragma GCC unroll {nv}
    for (int v = 0; v < {nv}; ++v) acc[r][v] = _mm256_loadu_ps(C + r * ldc + 8 * v);
  for (int64_t k = 0; k < K; ++k) {{
    __m256 b[{nv}];
#pragma GCC unroll {nv}
    for (int v = 0; v < {nv}; ++v) b[v] = _mm256_loadu_ps(B + k * ldb + 8 * v);
#pragma GCC unroll {mr}
    for (int r = 0; r < {mr}; ++r) {{
      __m256 a = _mm256_broadcast_ss(A + r * lda + k);
#pragma GCC unroll {nv}
      for (int v = 0; v < {nv}; ++v) acc[r][v] = _mm256_fmadd_ps(a, b[v], acc[r][v]);
    }}
  }}
#pragma GCC unroll {mr}
  for (int r = 0; r < {mr}; ++r)
#pragma GCC unroll {nv}
    for (int v = 0; v < {nv}; ++v) _mm256_storeu_ps(C + r * ldc + 8 * v, acc[r][v]);
#else
  for (int r = 0; r < {mr}; ++r)
    for (int c = 0; c < {nr}; ++c) {{
      float s = C[r * ldc + c];
      for (int64_t k = 0; k < K; ++k) s += A[r * lda + k] * B[k * ldb + c];
      C[r * ldc + c] = s;
    }}
#endif
}}
"""


def register_avx2_gemm(mr: int, nr: int) -> str:
    """Register ``x86.avx2.gemm_f32_{mr}x{nr}`` (``nr`` a multiple of 8); returns its name."""
    if nr % 8 or mr <= 0 or nr <= 0:
        raise ScheduleError(f"avx2 gemm tile {mr}x{nr}: NR must be a positive multiple of 8")
    name = f"x86.avx2.gemm_f32_{mr}x{nr}"
    fn = f"kiln_avx2_gemm_f32_{mr}x{nr}"
    register_extern(fn, _avx2_c(fn, mr, nr), override=True)
    K, lda, ldb, ldc = (Var(n, I64) for n in ("K", "lda", "ldb", "ldc"))
    A = Buffer("A", (mr, K), "float32", strides=(lda, const(I64, 1)))
    B = Buffer("B", (K, nr), "float32", strides=(ldb, const(I64, 1)))
    C = Buffer("C", (mr, nr), "float32", strides=(ldc, const(I64, 1)))
    desc = _gemm_desc(C, A, B, [const(I64, mr), const(I64, nr), K],
                      lambda i, j, k: A[i, k] * B[k, j])
    register(name, desc, _call_impl(C, A, B, fn, K), features=("avx2", "fma"), override=True)
    return name


# ---------------------------------------------------------------------------------------------
# AMX: bf16 and int8 tiles (16 x 16 accumulators, B in the VNNI layout)
# ---------------------------------------------------------------------------------------------
AMX_PERMISSION_C = r"""#ifndef KILN_AMX_READY
#define KILN_AMX_READY
#if defined(__x86_64__) && defined(__linux__)
#define KILN_AMX_HOST 1
#include <immintrin.h>
#include <sys/syscall.h>
#include <unistd.h>
/* Linux gives a process AMX tile registers only after it asks (once, for all threads). */
static int kiln_amx_ready(void) {
  static int state; /* 0: not asked yet, 1: granted, -1: refused */
  int s = __atomic_load_n(&state, __ATOMIC_ACQUIRE);
  if (s == 0) {
    s = syscall(SYS_arch_prctl, 0x1023 /* ARCH_REQ_XCOMP_PERM */,
                18 /* XFEATURE_XTILEDATA */) == 0 ? 1 : -1;
    __atomic_store_n(&state, s, __ATOMIC_RELEASE);
  }
  return s == 1;
}
#else
static int kiln_amx_ready(void) { return 0; }
#endif
#endif
"""

def _request_permission(target: Any) -> None:
    """On an AMX target, ask for the tile-data permission now (raises when refused)."""
    if getattr(target, "has_amx", False):
        request_amx_permission()


# (kind, C element of A/B, accumulator C type, pack, tile op, gcc target, widen expression)
_AMX = {
    "bf16": ("uint16_t", "float", 2, "_tile_dpbf16ps", "amx-tile,amx-bf16",
             "kiln_amx_bf16_f32({x})"),
    "int8": ("int8_t", "int32_t", 4, "_tile_dpbssd", "amx-tile,amx-int8", "(int32_t)({x})"),
}


def _amx_c(kind: str, fn: str) -> str:
    el, acc, pack, op, tgt, widen = _AMX[kind]
    chunk = 16  # packed rows of B per tile (16 x 64 bytes)
    a_widen = widen.format(x="A[r * lda + pack * k + p]")
    b_widen = widen.format(x="B[k * ldb + pack * c + p]")
    conv = ("static inline float kiln_amx_bf16_f32(uint16_t h) {\n"
            "  union { uint32_t u; float f; } v;\n  v.u = (uint32_t)h << 16;\n  return v.f;\n}\n"
            if kind == "bf16" else "")
    return f"""#include <string.h>
{conv}#if defined(KILN_AMX_HOST)
/* AMX tile configuration (palette 1): tmm0 = C, tmm1 = A, tmm2 = B, 16 rows x 64 bytes. */
__attribute__((target("{tgt}")))
static void {fn}_tiles({acc}* C, const {el}* A, const {el}* B, int64_t kp, int64_t ldc,
                       int64_t lda, int64_t ldb) {{
  struct {{ uint8_t palette, start_row, reserved[14]; uint16_t colsb[16]; uint8_t rows[16]; }}
      cfg;
  memset(&cfg, 0, sizeof(cfg));
  cfg.palette = 1;
  for (int t = 0; t < 3; ++t) {{ cfg.rows[t] = 16; cfg.colsb[t] = 64; }}
  _tile_loadconfig(&cfg);
  _tile_loadd(0, C, ldc * (int64_t)sizeof({acc}));
  for (int64_t k = 0; k < kp; k += {chunk}) {{
    _tile_loadd(1, A + {pack} * k, lda * (int64_t)sizeof({el}));
    _tile_loadd(2, B + k * ldb, ldb * (int64_t)sizeof({el}));
    {op}(0, 1, 2);
  }}
  _tile_stored(0, C, ldc * (int64_t)sizeof({acc}));
  _tile_release();
}}
#endif

/* C[16x16] += A[16 x {pack}*KP] * Bp[KP x 16 x {pack}] (Bp: B in the VNNI layout). */
static void {fn}({acc}* restrict C, const {el}* restrict A, const {el}* restrict B, int64_t KP,
                 int64_t ldc, int64_t lda, int64_t ldb) {{
  const int64_t pack = {pack};
  int64_t done = 0;
#if defined(KILN_AMX_HOST)
  if (kiln_amx_ready()) done = KP / {chunk} * {chunk};
  if (done > 0) {fn}_tiles(C, A, B, done, ldc, lda, ldb);
#endif
  if (done == KP) return;
  for (int r = 0; r < 16; ++r)
    for (int c = 0; c < 16; ++c) {{
      {acc} s = C[r * ldc + c];
      for (int64_t k = done; k < KP; ++k)
        for (int64_t p = 0; p < pack; ++p) s += {a_widen} * {b_widen};
      C[r * ldc + c] = s;
    }}
}}
"""


def register_amx_gemm(kind: str) -> str:
    """Register ``x86.amx.gemm_{kind}_16x16`` (``kind``: "bf16" or "int8"); returns its name."""
    el, _acc, pack, *_ = _AMX[kind]
    name = f"x86.amx.gemm_{kind}_16x16"
    fn = f"kiln_amx_gemm_{kind}_16x16"
    register_extern(fn, AMX_PERMISSION_C + _amx_c(kind, fn), override=True,
                    before_load=_request_permission)
    in_dt = "bfloat16" if kind == "bf16" else "int8"
    acc_dt = "float32" if kind == "bf16" else "int32"
    KP, lda, ldb, ldc = (Var(n, I64) for n in ("KP", "lda", "ldb", "ldc"))
    one = const(I64, 1)
    A = Buffer("A", (16, KP * pack), in_dt, strides=(lda, one))
    B = Buffer("B", (KP, 16, pack), in_dt, strides=(ldb, const(I64, pack), one))
    C = Buffer("C", (16, 16), acc_dt, strides=(ldc, one))
    desc = _gemm_desc(
        C, A, B, [const(I64, 16), const(I64, 16), KP, const(I64, pack)],
        lambda i, j, k, kk: cast(acc_dt, A[i, k * pack + kk]) * cast(acc_dt, B[k, j, kk]))
    features = ("amx_tile", "amx_bf16" if kind == "bf16" else "amx_int8")
    register(name, desc, _call_impl(C, A, B, fn, KP), features=features, override=True)
    return name


AVX2_GEMM_6X16 = register_avx2_gemm(6, 16)
AVX2_GEMM_4X8 = register_avx2_gemm(4, 8)
AMX_GEMM_BF16 = register_amx_gemm("bf16")
AMX_GEMM_INT8 = register_amx_gemm("int8")


def tensorize_gemm_amx(sch: Any, block: Any, target: Any = None) -> Any:
    """Schedule a matmul block onto AMX tiles; returns the tensorized (outer) block.

    Expected block (as ``te`` makes it), loops ``i, j, k`` in that order::

        C[i, j] = sum_k cast(acc, A[i, k]) * cast(acc, Bp[k // P, j, k % P])

    with ``A`` bfloat16 (``acc`` float32, ``P = 2``) or int8 (``acc`` int32, ``P = 4``), ``A``
    row-major ``[M, K]`` and ``Bp`` the VNNI packing ``[K / P, N, P]`` of ``B[K, N]`` (lay out
    the weights once at compile time). ``M`` and ``N`` must be multiples of 16 and ``K`` of
    ``P`` (any ``K``: chunks of 16 packed rows go to the tile unit, the rest is scalar C). The
    loops become ``i_0, j_0`` (free for the caller to parallelize: ``sch.get_loops(result)``)
    around the tensorized block, whose ``init`` zeroes the tile. Raises ScheduleError when the
    target lacks AMX for the dtype or the block does not have this form.
    """
    tgt = Target.create(target)
    func_block = sch.get(block)
    if not func_block.writes:
        raise ScheduleError("tensorize_gemm_amx: the block writes nothing")
    acc = func_block.writes[0].buffer.dtype
    kind = {"float32": "bf16", "int32": "int8"}.get(str(acc))
    if kind is None:
        raise ScheduleError(f"tensorize_gemm_amx: accumulator dtype {acc} is neither float32 "
                            "(bf16 inputs) nor int32 (int8 inputs)")
    have = tgt.has_amx_bf16 if kind == "bf16" else tgt.has_amx_int8
    if not have:
        raise ScheduleError(f"tensorize_gemm_amx: target has no AMX {kind} (cpu flags amx_tile"
                            f", amx_{kind})")
    intrin = AMX_GEMM_BF16 if kind == "bf16" else AMX_GEMM_INT8
    return _tile_and_tensorize(sch, block, 16, 16, _AMX[kind][2], intrin, "tensorize_gemm_amx")


def tensorize_gemm_avx2(sch: Any, block: Any, mr: int = 6, nr: int = 16) -> Any:
    """Schedule a float32 matmul block ``C[i, j] = sum_k A[i, k] * B[k, j]`` (loops ``i, j,
    k``; ``M % mr == 0``, ``N % nr == 0``, row-major operands) onto the AVX2/FMA register-tile
    micro-kernel; returns the tensorized (outer) block, under loops ``i_0, j_0``."""
    name = register_avx2_gemm(mr, nr)
    return _tile_and_tensorize(sch, block, mr, nr, None, name, "tensorize_gemm_avx2")


def _tile_and_tensorize(sch: Any, block: Any, mr: int, nr: int, pack: int | None,
                        intrin: str, what: str) -> Any:
    """Split ``i, j`` (and ``k`` by ``pack``), blockize the tile, tensorize it. Tried on a copy
    first, so a refusal leaves ``sch`` unchanged."""

    def steps(s: Any) -> Any:
        loops = s.get_loops(block)
        if len(loops) != 3:
            raise ScheduleError(f"{what}: expected loops i, j, k around the block, got "
                                f"{len(loops)}")
        i, j, k = loops
        i0, i1 = s.split(i, factors=[None, mr])
        j0, j1 = s.split(j, factors=[None, nr])
        if pack is None:
            s.reorder(i0, j0, i1, j1, k)
        else:
            k0, k1 = s.split(k, factors=[None, pack])
            s.reorder(i0, j0, i1, j1, k0, k1)
        outer = s.blockize(i1)
        s.tensorize(outer, intrin)
        return outer

    try:
        steps(sch.copy())
    except ScheduleError as e:
        raise ScheduleError(f"{what}: {e}") from None
    return steps(sch)
