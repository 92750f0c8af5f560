"""Helper functions of generated GPU code: the C backend's, in the dialect's spelling.

The scalar helpers of :class:`kiln.codegen.c.helpers.Helpers` (NaN-propagating min/max, floor
division, sigmoid, the float16/bfloat16/float8 conversions) are plain C; GPU code uses the same
text with the dialect's function qualifier in front (``__device__`` functions in CUDA). What
differs is provided here: bit casts through a union (no ``__builtin_memcpy``), float16
conversions by the hardware's ``cvt`` instructions on CUDA, and no GCC vector types at all
(vector expressions are written lane by lane, see :mod:`kiln.codegen.gpu.kernel`).
"""

from __future__ import annotations

from ...ir.dtype import DataType
from ...ir.errors import CodegenError
from ...tir.tensor_intrin.wgmma import ELEMENT_BYTES, SharedOperand
from ..c.helpers import Helpers
from ..c.types import value_ctype
from .dialect import Dialect
from .nvrtc import ARCH_SPECIFIC_MARKER

#: float16 <-> float32 with CUDA's conversion instructions (round to nearest even; NaN stays
#: NaN), instead of the portable bit manipulation.
_CUDA_F16 = r"""
/* float16 stored as uint16_t bits; math runs in float32 (cvt instructions). */
static inline float kiln_f16_to_f32(uint16_t h) {
  float f;
  asm("{ .reg .b16 t; mov.b16 t, %1; cvt.f32.f16 %0, t; }" : "=f"(f) : "h"(h));
  return f;
}

static inline uint16_t kiln_f32_to_f16(float f) {
  uint16_t h;
  asm("{ .reg .b16 t; cvt.rn.f16.f32 t, %1; mov.b16 %0, t; }" : "=h"(h) : "f"(f));
  return h;
}

static inline float kiln_f16_round(float f) { return kiln_f16_to_f32(kiln_f32_to_f16(f)); }
"""

#: One lane's part of mma.sync.m16n8k16 (f32 += DT x DT; kiln.tir.tensor_intrin.gpu): its A
#: rows are its own two (a, a + lda), B's column n of the mma is lane n / 2's column (an odd n
#: the next one), lane_cols elements apart from lane to lane.
_CUDA_MMA = r"""
static inline void NAME(float* c, const uint16_t* a, const uint16_t* b, long ldc, long lda,
                        long ldb, long lane_cols) {
  const unsigned lane = threadIdx.x & 31u, g = lane >> 2, t = lane & 3u;
  const uint32_t a0 = *(const uint32_t*)(a + 2 * t);
  const uint32_t a1 = *(const uint32_t*)(a + lda + 2 * t);
  const uint32_t a2 = *(const uint32_t*)(a + 2 * t + 8);
  const uint32_t a3 = *(const uint32_t*)(a + lda + 2 * t + 8);
  const uint16_t* bn = b + ((long)(g >> 1) - (long)t) * lane_cols + (g & 1u);
  const uint32_t b0 = (uint32_t)bn[2 * t * ldb] | ((uint32_t)bn[(2 * t + 1) * ldb] << 16);
  const uint32_t b1 = (uint32_t)bn[(2 * t + 8) * ldb] | ((uint32_t)bn[(2 * t + 9) * ldb] << 16);
  asm("mma.sync.aligned.m16n8k16.row.col.f32.DT.DT.f32 {%0, %1, %2, %3}, {%4, %5, %6, %7}, "
      "{%8, %9}, {%0, %1, %2, %3};"
      : "+f"(c[0]), "+f"(c[1]), "+f"(c[ldc]), "+f"(c[ldc + 1])
      : "r"(a0), "r"(a1), "r"(a2), "r"(a3), "r"(b0), "r"(b1));
}
"""


#: The same with A's fragments loaded by ldmatrix.x4 (kiln.tir.tensor_intrin.gpu's ldmatrix
#: variant): A's tile rows permuted so that an mma's 16 rows are consecutive (lane group g's
#: row g; its second row, g + 8, lda after the first: the tile's row stride is lda / 8). Lane l
#: gives the row address of matrix l / 8 (rows 0-7 / 8-15 x columns 0-7 / 8-15 of the mma's A),
#: row l % 8, and gets a0..a3 in the order mma takes them; B's fragments as above.
_CUDA_MMA_LDMATRIX = r"""
static inline void NAME(float* c, const uint16_t* a, const uint16_t* b, long ldc, long lda,
                        long ldb, long lane_cols) {
  const unsigned lane = threadIdx.x & 31u, g = lane >> 2, t = lane & 3u;
  const uint16_t* pa = a + ((long)(lane & 7u) - (long)g) * (lda >> 3)
                       + (long)((lane >> 3) & 1u) * lda + (long)(lane >> 4) * 8;
  uint32_t a0, a1, a2, a3;
  asm volatile("ldmatrix.sync.aligned.m8n8.x4.shared.b16 {%0, %1, %2, %3}, [%4];"
      : "=r"(a0), "=r"(a1), "=r"(a2), "=r"(a3)
      : "r"((unsigned)__cvta_generic_to_shared(pa)));
  const uint16_t* bn = b + ((long)(g >> 1) - (long)t) * lane_cols + (g & 1u);
  const uint32_t b0 = (uint32_t)bn[2 * t * ldb] | ((uint32_t)bn[(2 * t + 1) * ldb] << 16);
  const uint32_t b1 = (uint32_t)bn[(2 * t + 8) * ldb] | ((uint32_t)bn[(2 * t + 9) * ldb] << 16);
  asm("mma.sync.aligned.m16n8k16.row.col.f32.DT.DT.f32 {%0, %1, %2, %3}, {%4, %5, %6, %7}, "
      "{%8, %9}, {%0, %1, %2, %3};"
      : "+f"(c[0]), "+f"(c[1]), "+f"(c[ldc]), "+f"(c[ldc + 1])
      : "r"(a0), "r"(a1), "r"(a2), "r"(a3), "r"(b0), "r"(b1));
}
"""


#: A warp's register tile for one 16-deep step (kiln.tir.tensor_intrin.gpu's tile intrinsic):
#: A's fragments for mma row block m by ldmatrix.x4 (rows in the mma order: the thread's row i
#: is 8 i tile rows after its first, the tile's row stride lda / 8; lane l gives row l % 16 of
#: the block, columns 8 (l / 16) on), B's for column blocks n and n + 1 by ldmatrix.x4.trans
#: (B's columns in (block, t, e) order: the thread's first column is lane t's 2 t in block 0,
#: a block's 8 columns consecutive; lane l gives row l % 8 + 8 ((l / 8) % 2) of block
#: n + l / 16), then MI x NI mma.sync. The thread's accumulator (h, e) of mma (m, n) is
#: c[(2 m + h) ldc + 2 n + e].
_CUDA_MMA_TILE = r"""
static inline void NAME(float* c, const uint16_t* a, const uint16_t* b, long ldc, long lda,
                        long ldb) {
  const unsigned lane = threadIdx.x & 31u, g = lane >> 2, t = lane & 3u;
  const long row = lda >> 3;
  const uint16_t* pa = a + ((long)(lane & 15u) - (long)g) * row + (long)(lane >> 4) * 8;
  const uint16_t* pb = b - 2 * (long)t + ((long)(lane & 7u) + (long)((lane >> 3) & 1u) * 8) * ldb
                       + (long)(lane >> 4) * 8;
  uint32_t fa[MI][4], fb[NI + 1][2];
#pragma unroll
  for (int m = 0; m < MI; ++m)
    asm volatile("ldmatrix.sync.aligned.m8n8.x4.shared.b16 {%0, %1, %2, %3}, [%4];"
        : "=r"(fa[m][0]), "=r"(fa[m][1]), "=r"(fa[m][2]), "=r"(fa[m][3])
        : "r"((unsigned)__cvta_generic_to_shared(pa + 16 * m * row)));
#pragma unroll
  for (int n = 0; n + 1 < NI; n += 2)
    asm volatile("ldmatrix.sync.aligned.m8n8.x4.trans.shared.b16 {%0, %1, %2, %3}, [%4];"
        : "=r"(fb[n][0]), "=r"(fb[n][1]), "=r"(fb[n + 1][0]), "=r"(fb[n + 1][1])
        : "r"((unsigned)__cvta_generic_to_shared(pb + 8 * n)));
  if (NI % 2)  /* the last block alone: lanes 0-15 give its 16 rows */
    asm volatile("ldmatrix.sync.aligned.m8n8.x2.trans.shared.b16 {%0, %1}, [%2];"
        : "=r"(fb[NI - 1][0]), "=r"(fb[NI - 1][1])
        : "r"((unsigned)__cvta_generic_to_shared(pb + 8 * (NI - 1) - (long)(lane >> 4) * 8)));
#pragma unroll
  for (int m = 0; m < MI; ++m)
#pragma unroll
    for (int n = 0; n < NI; ++n) {
      float* d = c + 2 * m * ldc + 2 * n;
      asm("mma.sync.aligned.m16n8k16.row.col.f32.DT.DT.f32 {%0, %1, %2, %3}, {%4, %5, %6, %7}, "
          "{%8, %9}, {%0, %1, %2, %3};"
          : "+f"(d[0]), "+f"(d[1]), "+f"(d[ldc]), "+f"(d[ldc + 1])
          : "r"(fa[m][0]), "r"(fa[m][1]), "r"(fa[m][2]), "r"(fa[m][3]), "r"(fb[n][0]),
            "r"(fb[n][1]));
    }
}
"""


#: What a CUDA program that needs an arch-specific target (``sm_90a``: wgmma) starts its
#: helpers with: the marker :func:`kiln.codegen.gpu.nvrtc.compile_arch` reads, and a guard
#: that stops a compilation for plain ``sm_90`` at an ``#error`` instead of in ptxas.
_ARCH_SPECIFIC_GUARD = ARCH_SPECIFIC_MARKER + r"""
#if defined(__CUDA_ARCH__) && !defined(__CUDA_ARCH_FEAT_SM90_ALL)
#error "wgmma.mma_async needs the arch-specific target sm_90a (--gpu-architecture=sm_90a)"
#endif
"""


def _cuda_wgmma(name: str, short: str, mi: int, nj: int, a: SharedOperand,
                b: SharedOperand, depth: int, pipelined: bool) -> str:
    """CUDA's thread part of ``MI`` ``wgmma.mma_async.m64n<8 NJ>k16`` (see
    :meth:`GpuHelpers.wgmma`): the descriptors' start addresses found from the thread's own
    elements through the operands' address arithmetic, then fence, the products of every
    16-deep slice of the step (each slice's descriptors the first's plus the slice's offset
    along K), one commit and one wait: for this step's products, or, ``pipelined``, while
    the call's last argument ``pending`` is non-zero, for the step before's only (this one's
    left in flight for the next step of a pipeline, ``kiln.tir.transform.async_copies``; the
    pipeline's last step waits for all). The accumulators are operands of the fence and the
    waits too, so the compiler defines none of them between the fence and the products and
    reads none before they land. (The last step's wait is in the loop, not after it: ptxas
    serializes every product when a ``wgmma.wait_group 0`` follows the loop, its warning
    C7514, and without any the wait it puts before the accumulators' first read, its info
    C7517, was not enough on an H100: wrong sums.)"""
    n = 8 * nj
    # the thread's accumulator (h, e) of column block j of product m, in the d order
    regs = [[f"c[{2 * m + h} * ldc + {2 * j + e}]"
             for j in range(nj) for h in range(2) for e in range(2)] for m in range(mi)]
    first_a = a.c_offset("16 * w + g", "0")
    first_b = b.c_offset("2 * t", "0")
    lines = [
        f"static inline void {name}(float* c, const uint16_t* a, const uint16_t* b, long ldc, "
        "long lda, long ldb" + (", int pending" if pipelined else "") + ") {",
        "  const unsigned lane = threadIdx.x & 31u, g = lane >> 2, t = lane & 3u, "
        "w = threadIdx.y & 3u;",
        f"  const unsigned sa = (unsigned)__cvta_generic_to_shared(a - {first_a});",
        f"  const unsigned sb = (unsigned)__cvta_generic_to_shared(b - {first_b});",
        f"  const uint64_t da = {a.descriptor_bits()}ull | (uint64_t)((sa & 0x3FFFFu) >> 4);",
        f"  const uint64_t db = {b.descriptor_bits()}ull | (uint64_t)((sb & 0x3FFFFu) >> 4);",
    ]
    every = ", ".join(f'"+f"({r})' for rs in regs for r in rs)
    # the accumulators are operands of the fence too: whatever defines them (the zeroing,
    # the last step's wait) comes before it, as the ISA asks of registers wgmma reads
    lines.append(f'  asm volatile("wgmma.fence.sync.aligned;" : {every} :: "memory");')
    dlist = ", ".join(f"%{r}" for r in range(n // 2))
    for s in range(depth // 16):
        # (descriptor start fields count 16-byte units; the offsets stay inside the tile)
        b_step = b.offset(0, 16 * s) * ELEMENT_BYTES // 16
        for m in range(mi):
            a_step = a.offset(64 * m, 16 * s) * ELEMENT_BYTES // 16
            outs = ", ".join(f'"+f"({r})' for r in regs[m])
            lines += [
                f'  asm volatile("{{ .reg .pred p; setp.ne.b32 p, %{n // 2 + 2}, 0; '
                f"wgmma.mma_async.sync.aligned.m64n{n}k16.f32.{short}.{short} {{{dlist}}}, "
                f'%{n // 2}, %{n // 2 + 1}, p, 1, 1, {a.transposed}, {b.transposed}; }}"',
                f"      : {outs}",
                f'      : "l"(da + {a_step}ull), "l"(db + {b_step}ull), "r"(1) : "memory");',
            ]
    lines.append('  asm volatile("wgmma.commit_group.sync.aligned;" ::: "memory");')
    wait = '  asm volatile("wgmma.wait_group.sync.aligned {};" : ' + every + ' :: "memory");'
    if pipelined:
        lines += ["  if (pending) {", "  " + wait.format(1), "  } else {", "  " + wait.format(0),
                  "  }"]
    else:
        lines.append(wait.format(0))
    return "\n".join(lines) + "\n}\n"


class GpuHelpers(Helpers):
    """The helpers one generated GPU program needs, rendered for ``dialect``."""

    def __init__(self, dialect: Dialect) -> None:
        super().__init__(native_fp16=False)
        self.dialect = dialect

    def vec(self, elem: DataType, lanes: int) -> str:
        raise CodegenError(f"GPU code has no {elem}x{lanes} vector values (vector expressions "
                           "are written lane by lane)")

    def use(self, key: str) -> None:
        if key == "f16" and self.dialect.is_cuda:
            self._add("f16", _CUDA_F16)
            return
        if key in ("alloc", "fatal"):
            raise CodegenError(f"GPU kernels cannot use the C helper {key!r}")
        super().use(key)

    def bitcast(self, src: DataType, dst: DataType) -> str:
        s, d = value_ctype(src), value_ctype(dst)
        name = f"kiln_bitcast_{src}_{dst}"
        return self._add(name, f"static inline {d} {name}({s} x) {{ union {{ {s} a; {d} b; }} "
                               f"u; u.a = x; return u.b; }}\n")

    def atomic_add_float(self, dtype: DataType) -> str:
        """OpenCL's float atomic add: a compare-and-swap loop on the value's bits (OpenCL 1.2
        has integer atomics only)."""
        bits = dtype.bits
        ft, ut = ("float", "uint") if bits == 32 else ("double", "ulong")
        cas = "atomic_cmpxchg" if bits == 32 else "atom_cmpxchg"
        name = f"kiln_atomic_add_{dtype}"
        return self._add(name, (
            f"static inline {ft} {name}(volatile __global {ft}* p, {ft} v) {{\n"
            f"  union {{ {ut} u; {ft} f; }} old, sum;\n"
            f"  do {{ old.f = *p; sum.f = old.f + v; }} while ({cas}((volatile __global "
            f"{ut}*)p, old.u, sum.u) != old.u);\n"
            f"  return old.f;\n}}\n"))

    def check_index(self) -> str:
        """``kiln_check_index(record, call, v, lo, n, check)``: a checked index
        (``kiln.tir.check_index``) in a GPU kernel, counted from the end when negative. A value
        outside ``[lo, n)`` is written into the check record by the first thread that fails
        (:data:`kiln.runtime.gpu.program.CHECK_RECORD`: failed, check, value, lo, hi, call;
        the host raises RuntimeCheckError after the run) and reads element 0 instead of out
        of bounds."""
        name = "kiln_check_index"
        ptr = self.dialect.pointer_param("long", "r", const=False)
        return self._add(name, (
            f"static inline long {name}({ptr}, long call, long v, long lo, long n, "
            f"long check) {{\n"
            f"  if (v >= lo && v < n) return v < 0 ? v + n : v;\n"
            f"  if {self.dialect.claim('r')} {{\n"
            f"    r[1] = check; r[2] = v; r[3] = lo; r[4] = n; r[5] = call;\n  }}\n"
            f"  return 0;\n}}\n"))

    def mma_m16n8k16(self, dtype: str, ldmatrix: bool = False) -> str:
        """``kiln_mma_m16n8k16_<dt>(c, a, b, ldc, lda, ldb, lane_cols)``: one thread's part of
        a tensor-core product (:mod:`kiln.tir.tensor_intrin.gpu`). CUDA: the lane's operand
        fragments gathered from shared memory (``ldmatrix``: A's by ``ldmatrix.x4`` from a
        row-permuted tile) and ``mma.sync.aligned.m16n8k16`` in inline PTX (warp-collective:
        the lane is ``threadIdx.x``); OpenCL: the thread's own 2 x 2 x 16 product in float32,
        the values the instruction gives the lane (its own elements, whatever the layout)."""
        short = {"float16": "f16", "bfloat16": "bf16"}.get(dtype)
        if short is None:
            raise CodegenError(f"the tensor cores multiply float16 or bfloat16, not {dtype}")
        name = f"kiln_mma_m16n8k16_{short}"
        if self.dialect.is_cuda:
            if ldmatrix:
                name += "_ldmatrix"
                return self._add(name, _CUDA_MMA_LDMATRIX.replace("NAME", name).replace(
                    "DT", short))
            return self._add(name, _CUDA_MMA.replace("NAME", name).replace("DT", short))
        return self._thread_product(name, short, 2, 2, ", long lane_cols", "j")

    def mma_tile(self, dtype: str, mi: int, ni: int) -> str:
        """``kiln_mma_tile_<dt>_<MI>x<NI>(c, a, b, ldc, lda, ldb)``: one thread's part of a
        warp's ``MI x NI`` tensor-core products for one 16-deep step
        (:func:`kiln.tir.tensor_intrin.gpu.register_mma_tile_intrinsic`). CUDA: every fragment
        loaded once by ``ldmatrix`` (``.trans`` for B), then the ``mma.sync``; OpenCL: the
        thread's ``2 MI x 2 NI`` outputs in float32, read through the same layouts (A's rows
        ``lda`` apart, B's column ``2 n + e`` at ``8 n + e``)."""
        short = {"float16": "f16", "bfloat16": "bf16"}.get(dtype)
        if short is None:
            raise CodegenError(f"the tensor cores multiply float16 or bfloat16, not {dtype}")
        name = f"kiln_mma_tile_{short}_{mi}x{ni}"
        if self.dialect.is_cuda:
            return self._add(name, _CUDA_MMA_TILE.replace("NAME", name).replace(
                "DT", short).replace("MI", str(mi)).replace("NI", str(ni)))
        return self._thread_product(name, short, 2 * mi, 2 * ni, "", "(j >> 1) * 8 + (j & 1)")

    def wgmma(self, dtype: str, mi: int, nj: int, a: SharedOperand, b: SharedOperand,
              depth: int = 16, pipelined: bool = False) -> str:
        """``kiln_wgmma_<dt>_<MI>x<NJ>_k<depth>_<layouts>(c, a, b, ldc, lda, ldb)`` (and
        ``pending`` when ``pipelined``: whether to leave the step's products in flight): one
        thread's part of its warpgroup's ``MI`` products ``m64n<8 NJ>k16`` for each 16 of a
        ``depth``-deep step
        (:func:`kiln.tir.tensor_intrin.gpu.register_wgmma_intrinsic`). ``a`` and ``b`` point
        at the thread's own first elements; where the warpgroup's operands start follows from
        the thread's place in the accumulator fragment (warp ``w`` = ``threadIdx.y % 4``, lane
        ``4 g + t``: its first row is ``16 w + g``, its first column ``2 t``) and the
        operands' address arithmetic (:class:`~kiln.tir.tensor_intrin.wgmma.SharedOperand`),
        the same in both dialects. CUDA: the descriptors and ``wgmma.mma_async`` (sm_90a);
        OpenCL: the thread's ``2 MI x 2 NJ`` outputs in float32, each element of A and B read
        where the descriptor's layout puts it -- so PoCL checks the shared layouts, the
        thread's placement and the LBO/SBO values against each other."""
        short = {"float16": "f16", "bfloat16": "bf16"}.get(dtype)
        if short is None:
            raise CodegenError(f"the tensor cores multiply float16 or bfloat16, not {dtype}")
        name = (f"kiln_wgmma_{short}_{mi}x{nj}_k{depth}_{a.major}{a.lbo}_{a.sbo}_"
                f"{b.major}{b.lbo}_{b.sbo}" + ("_pipelined" if pipelined else ""))
        if self.dialect.is_cuda:
            self._add("kiln_arch_specific", _ARCH_SPECIFIC_GUARD)
            return self._add(name, _cuda_wgmma(name, short, mi, nj, a, b, depth, pipelined))
        self.use(short)
        ptr = "__local const uint16_t* "
        first_a = a.c_offset("16 * w + g", "0")
        first_b = b.c_offset("2 * t", "0")
        return self._add(name, (
            f"static inline void {name}(float* c, {ptr}a, {ptr}b, long ldc, long lda, "
            f"long ldb{', int pending' if pipelined else ''}) {{\n"
            f"  const int lane = (int)get_local_id(0) & 31, g = lane >> 2, t = lane & 3, "
            f"w = (int)get_local_id(1) & 3;\n"
            f"  {ptr}a0 = a - {first_a};\n"
            f"  {ptr}b0 = b - {first_b};\n"
            f"  for (int m = 0; m < {mi}; ++m)\n"
            f"    for (int h = 0; h < 2; ++h)\n"
            f"      for (int j = 0; j < {nj}; ++j)\n"
            f"        for (int e = 0; e < 2; ++e) {{\n"
            f"          const int row = 64 * m + 16 * w + 8 * h + g, col = 8 * j + 2 * t + e;\n"
            f"          float s = c[(2 * m + h) * ldc + 2 * j + e];\n"
            f"          for (int k = 0; k < {depth}; ++k)\n"
            f"            s += kiln_{short}_to_f32(a0[{a.c_offset('row', 'k')}]) *\n"
            f"                 kiln_{short}_to_f32(b0[{b.c_offset('col', 'k')}]);\n"
            f"          c[(2 * m + h) * ldc + 2 * j + e] = s;\n"
            f"        }}\n}}\n"))

    def _thread_product(self, name: str, short: str, rows: int, cols: int, extra: str,
                        b_col: str) -> str:
        """OpenCL's view of a tensor-core intrinsic: the thread's own ``rows x cols x 16``
        product in float32 (PoCL runs it in CI); ``b_col``: where B's column ``j`` lies."""
        self.use(short)
        ptr = "__local const uint16_t* "
        return self._add(name, (
            f"static inline void {name}(float* c, {ptr}a, {ptr}b, long ldc, long lda, "
            f"long ldb{extra}) {{\n"
            f"  for (int i = 0; i < {rows}; ++i)\n"
            f"    for (int j = 0; j < {cols}; ++j) {{\n"
            f"      float s = c[i * ldc + j];\n"
            f"      for (int k = 0; k < 16; ++k)\n"
            f"        s += kiln_{short}_to_f32(a[i * lda + k]) *\n"
            f"             kiln_{short}_to_f32(b[k * ldb + {b_col}]);\n"
            f"      c[i * ldc + j] = s;\n"
            f"    }}\n}}\n"))

    def cp_async(self, nbytes: int) -> str:
        """``kiln_cp_async_<n>(dst, src)`` (CUDA): start copying ``nbytes`` (4, 8, 16) bytes
        from global to shared memory (``cp.async``; ``.cg`` caches 16-byte copies in L2 only,
        ``.ca`` is the one form for 4 and 8). The shared address is the 32-bit one the
        instruction takes (``__cvta_generic_to_shared``)."""
        if nbytes not in (4, 8, 16):
            raise CodegenError(f"cp.async copies 4, 8 or 16 bytes, not {nbytes}")
        name = f"kiln_cp_async_{nbytes}"
        cache = "cg" if nbytes == 16 else "ca"
        return self._add(name, (
            f"static inline void {name}(void* dst, const void* src) {{\n"
            f"  const unsigned s = (unsigned)__cvta_generic_to_shared(dst);\n"
            f"  asm volatile(\"cp.async.{cache}.shared.global [%0], [%1], {nbytes};\" :: "
            f"\"r\"(s), \"l\"(src) : \"memory\");\n}}\n"))

    def fresh_seed(self) -> str:  # pragma: no cover - the kernel emitter reads a parameter
        raise CodegenError("GPU kernels read their fresh seed from a parameter")

    def render(self) -> str:
        text = super().render()
        # x86 instruction paths of the C helpers stay out of device code (an OpenCL compiler
        # for the host CPU, such as PoCL's, defines the x86 feature macros)
        for macro in ("__F16C__", "__AVX2__", "__AVX512F__", "__FMA__"):
            text = text.replace(f"defined({macro})", "0")
        return text.replace("static inline", self.dialect.function_qualifier)
