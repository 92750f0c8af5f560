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
from ..c.helpers import Helpers
from ..c.types import value_ctype
from .dialect import Dialect

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

    def fresh_seed(self) -> str:  # pragma: no cover - the kernel emitter reads a parameter
        raise CodegenError("GPU kernels read their fresh seed from a parameter")

    def render(self) -> str:
        text = super().render()
        # x86 instruction paths of the C helpers stay out of device code (an OpenCL compiler
        # for the host CPU, such as PoCL's, defines the x86 feature macros)
        for macro in ("__F16C__", "__AVX2__", "__AVX512F__", "__FMA__"):
            text = text.replace(f"defined({macro})", "0")
        return text.replace("static inline", self.dialect.function_qualifier)
