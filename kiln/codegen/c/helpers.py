"""Support code emitted at the top of a generated C file, only what the functions use.

``Helpers`` collects vector typedefs and static helper functions by name; requesting a helper
also requests the helpers and typedefs it depends on, and :meth:`Helpers.render` prints them in
dependency order. Fixed snippets live in ``_FIXED``; per-type helpers (vector broadcast, select,
NaN-propagating min/max, floor division) are generated from the type.
"""

from __future__ import annotations

from ...ir.dtype import MINIFLOATS, DataType
from .minifloat import helper_code as minifloat_helper_code
from .special_math import SPECIAL_C
from .types import soft_float_storage, soft_float_tag, value_ctype, vector_name

ENTRY_SUPPORT = r"""
/* ---- argument checking; failures leave a message for kiln_last_error() ---- */
/* defined once (ERROR_BUFFER), shared by the file's compilation units */
extern __thread char kiln_error_buf[1024] __attribute__((visibility("hidden")));

static int32_t kiln_fail(const char* fmt, ...) {
  va_list ap;
  va_start(ap, fmt);
  vsnprintf(kiln_error_buf, sizeof(kiln_error_buf), fmt, ap);
  va_end(ap);
  return -1;
}

static void kiln_dtype_str(char* out, size_t n, DLDataType t) {
  const char* base;
  switch (t.code) {
    case 0: base = "int"; break;
    case 1: base = "uint"; break;
    case 2: base = "float"; break;
    case 3: base = "handle"; break;
    case 4: base = "bfloat"; break;
    case 6: base = "bool"; break;
@MINIFLOAT_CASES@
    default: base = "unknown"; break;
  }
  int named = t.code >= 6;  /* bool and the float8/float6/float4 names carry their width */
  int k = named ? snprintf(out, n, "%s", base) : snprintf(out, n, "%s%d", base, (int)t.bits);
  if (t.lanes != 1 && k > 0 && (size_t)k < n) snprintf(out + k, n - (size_t)k, "x%d", (int)t.lanes);
}

/* Device, rank and dtype of one argument (the first checks of the checked entry). */
static int32_t kiln_check_arg(const DLTensor* t, const char* where, int32_t ndim, int code,
                              int bits, int lanes, const char* dtype) {
  if (t == NULL) return kiln_fail("%s: is NULL", where);
  if (t->device.device_type != KILN_DEVICE_CPU) {
    return kiln_fail("%s: expected a CPU array but got device type %d", where,
                     (int)t->device.device_type);
  }
  if (t->ndim != ndim) {
    return kiln_fail("%s: expected ndim %d but got %d", where, (int)ndim, (int)t->ndim);
  }
  if (t->dtype.code != code || t->dtype.bits != bits || t->dtype.lanes != lanes) {
    char buf[64];
    kiln_dtype_str(buf, sizeof(buf), t->dtype);
    return kiln_fail("%s: expected dtype %s but got %s", where, dtype, buf);
  }
  return 0;
}

/* "expected shape (n=4, 8) but got (5, 8)"; names[d] is NULL for constant dimensions. */
static int32_t kiln_fail_dims(const char* where, const char* what, int ndim,
                              const int64_t* expected, const char* const* names,
                              const int64_t* got) {
  char exp_s[512], got_s[512];
  size_t a = 0, b = 0;
  exp_s[0] = got_s[0] = 0;
  for (int d = 0; d < ndim; ++d) {
    const char* sep = d ? ", " : "";
    if (a < sizeof(exp_s)) {
      if (names != NULL && names[d] != NULL) {
        a += (size_t)snprintf(exp_s + a, sizeof(exp_s) - a, "%s%s=%lld", sep, names[d],
                              (long long)expected[d]);
      } else {
        a += (size_t)snprintf(exp_s + a, sizeof(exp_s) - a, "%s%lld", sep,
                              (long long)expected[d]);
      }
    }
    if (b < sizeof(got_s)) {
      b += (size_t)snprintf(got_s + b, sizeof(got_s) - b, "%s%lld", sep, (long long)got[d]);
    }
  }
  const char* comma = ndim == 1 ? "," : "";
  return kiln_fail("%s: expected %s (%s%s) but got (%s%s)", where, what, exp_s, comma, got_s,
                   comma);
}

/* Shape, strides (NULL or compact row-major, or `strides` when given) and data pointer. */
static int32_t kiln_check_shape(const DLTensor* t, const char* where, int ndim,
                                const int64_t* expected, const char* const* names,
                                const int64_t* strides) {
  int64_t numel = 1;
  for (int d = 0; d < ndim; ++d) {
    if (t->shape[d] != expected[d]) {
      return kiln_fail_dims(where, "shape", ndim, expected, names, t->shape);
    }
    numel *= t->shape[d];
  }
  if (ndim > 0 && (t->strides != NULL || strides != NULL)) {
    int64_t want[ndim > 0 ? ndim : 1], have[ndim > 0 ? ndim : 1], compact = 1;
    int bad = 0;
    for (int d = ndim - 1; d >= 0; --d) {
      want[d] = strides != NULL ? strides[d] : compact;
      have[d] = t->strides != NULL ? t->strides[d] : compact;
      if (have[d] != want[d] && (strides != NULL || t->shape[d] != 1)) bad = 1;
      compact *= t->shape[d];
    }
    if (bad) {
      return kiln_fail_dims(where, strides != NULL ? "strides" : "compact row-major strides",
                            ndim, want, NULL, have);
    }
  }
  if (t->data == NULL && numel != 0) return kiln_fail("%s: data pointer is NULL", where);
  return 0;
}

static inline void* kiln_data(const DLTensor* t) {
  return (void*)((char*)t->data + t->byte_offset);
}
"""

#: The definitions :data:`ENTRY_SUPPORT` declares: a compilation unit of their own.
ERROR_BUFFER = r"""/* the last failure's message, one per thread, and its reader */
__attribute__((visibility("hidden"))) __thread char kiln_error_buf[1024];
const char* kiln_last_error(void) { return kiln_error_buf; }
"""

# The dtype names of the float8/float6/float4 type codes, from kiln.ir.dtype's one table.
ENTRY_SUPPORT = ENTRY_SUPPORT.replace("@MINIFLOAT_CASES@", "\n".join(
    f'    case {int(code)}: base = "{fmt.name}"; break;' for code, fmt in MINIFLOATS.items()))

_FIXED: dict[str, tuple[str, tuple[str, ...]]] = {
    "alloc": (r"""
/* 64-byte aligned heap storage for `count` intermediate elements of `itemsize` bytes; NULL when
   the size overflows or the memory is not there (the kernel records the failure and skips
   what would use the buffer: see kiln_check_t). */
static void* kiln_alloc(int64_t count, size_t itemsize) {
  size_t nbytes;
  if (count < 0 || __builtin_mul_overflow((size_t)count, itemsize, &nbytes) ||
      nbytes > SIZE_MAX - 63) {
    return NULL;
  }
  size_t n = (nbytes + 63) & ~(size_t)63;
  return aligned_alloc(64, n ? n : 64);
}
""", ("check",)),
    "check": (r"""
/* ---- checks inside a kernel while it runs ----
   An index out of range or a failed assertion is recorded in the kernel's check record, which
   lives on the stack of the thread that called the kernel and is shared with the threads of
   its parallel loops (the first failure wins). The kernel finishes -- a failed index reads
   position 0, a failed assertion skips what it guards -- and returns KILN_CHECK_FAILED with
   the message in the calling thread's kiln_error_buf (kiln_check_report). */
typedef struct {
  int failed;
  int kind;  /* KILN_CHECK_ASSERT, KILN_CHECK_INDEX (value out of [lo, hi)), KILN_CHECK_ALLOC */
  long long value, lo, hi;
  const char* what;
} kiln_check_t;
enum { KILN_CHECK_ASSERT = 0, KILN_CHECK_INDEX = 1, KILN_CHECK_ALLOC = 2 };

static void kiln_check_record(kiln_check_t* c, const char* what, int kind,
                              long long value, long long lo, long long hi) {
  int expected = 0;
  if (__atomic_compare_exchange_n(&c->failed, &expected, 1, 0, __ATOMIC_ACQ_REL,
                                  __ATOMIC_RELAXED)) {
    c->kind = kind;
    c->value = value;
    c->lo = lo;
    c->hi = hi;
    c->what = what;
  }
}

/* An index along an axis of size n, allowed in [lo, n) (lo is -n or 0), counted from the end
   when negative; 0 after recording a failure. */
static inline int64_t kiln_check_index(kiln_check_t* c, int64_t v, int64_t lo, int64_t n,
                                       const char* what) {
  /* lo <= v < n in one unsigned comparison (wrapping subtraction) */
  if (__builtin_expect((uint64_t)v - (uint64_t)lo < (uint64_t)n - (uint64_t)lo, 1)) {
    return v < 0 ? v + n : v;
  }
  kiln_check_record(c, what, KILN_CHECK_INDEX, (long long)v, (long long)lo, (long long)n);
  return 0;
}

static int32_t kiln_check_report(const kiln_check_t* c) {
  if (c->kind == KILN_CHECK_INDEX) {
    kiln_fail("%s: index %lld is out of range [%lld, %lld)", c->what, c->value, c->lo, c->hi);
  } else if (c->kind == KILN_CHECK_ALLOC) {
    kiln_fail("%s: out of memory allocating %lld elements of %lld bytes", c->what, c->value,
              c->lo);
  } else {
    kiln_fail("%s", c->what);
  }
  return KILN_CHECK_FAILED;
}
""", ()),
    "bf16": (r"""
/* bfloat16 is stored as the upper 16 bits of a float32; math runs in float32. */
#if defined(__AVX2__)
#include <immintrin.h>
#endif
static inline float kiln_bf16_to_f32(uint16_t h) {
  union { uint32_t u; float f; } v;
  v.u = (uint32_t)h << 16;
  return v.f;
}

static inline uint16_t kiln_f32_to_bf16(float f) {
  union { uint32_t u; float f; } v;
  v.f = f;
  if ((v.u & 0x7fffffffu) > 0x7f800000u) return (uint16_t)((v.u >> 16) | 0x40u); /* quiet NaN */
  uint32_t rounding = 0x7fffu + ((v.u >> 16) & 1u); /* round to nearest even */
  return (uint16_t)((v.u + rounding) >> 16);
}

static inline float kiln_bf16_round(float f) { return kiln_bf16_to_f32(kiln_f32_to_bf16(f)); }
""", ()),
    "f16": (r"""
/* float16 (IEEE binary16) stored as uint16_t bits; math runs in float32. Portable conversions
   (round to nearest even; every NaN becomes a quiet NaN of the same sign), and F16C
   instructions when the compiler targets them. */
static inline float kiln_f16_to_f32_soft(uint16_t h) {
  union { uint32_t u; float f; } o, magic;
  magic.u = 113u << 23;
  o.u = (uint32_t)(h & 0x7fffu) << 13;
  uint32_t exp = o.u & 0x0f800000u;
  o.u += (127u - 15u) << 23;
  if (exp == 0x0f800000u) o.u += (128u - 16u) << 23;     /* Inf or NaN */
  else if (exp == 0) { o.u += 1u << 23; o.f -= magic.f; } /* zero or subnormal */
  o.u |= (uint32_t)(h & 0x8000u) << 16;
  return o.f;
}

static inline uint16_t kiln_f32_to_f16_soft(float f) {
  union { uint32_t u; float f; } v, magic;
  v.f = f;
  uint32_t sign = v.u & 0x80000000u;
  uint16_t o;
  v.u ^= sign;
  magic.u = ((127u - 15u) + (23u - 10u) + 1u) << 23;
  if (v.u >= (127u + 16u) << 23) {              /* overflow, Inf or NaN */
    o = v.u > 0x7f800000u ? 0x7e00u : 0x7c00u;
  } else if (v.u < (127u - 14u) << 23) {        /* subnormal result or zero */
    v.f += magic.f;
    o = (uint16_t)(v.u - magic.u);
  } else {
    uint32_t odd = (v.u >> 13) & 1u;
    v.u += ((uint32_t)(15 - 127) << 23) + 0xfffu + odd;
    o = (uint16_t)(v.u >> 13);
  }
  return (uint16_t)(o | (sign >> 16));
}

#if defined(__F16C__)
#include <immintrin.h>
static inline float kiln_f16_to_f32(uint16_t h) { return _cvtsh_ss(h); }
static inline uint16_t kiln_f32_to_f16(float f) {
  return (uint16_t)_cvtss_sh(f, _MM_FROUND_TO_NEAREST_INT);
}
#else
static inline float kiln_f16_to_f32(uint16_t h) { return kiln_f16_to_f32_soft(h); }
static inline uint16_t kiln_f32_to_f16(float f) { return kiln_f32_to_f16_soft(f); }
#endif

static inline float kiln_f16_round(float f) { return kiln_f16_to_f32(kiln_f32_to_f16(f)); }
""", ()),
}

def _avx2_bf16_chunks(lanes: int) -> str:
    """bfloat16 bits to float32, 8 lanes per AVX2 zero-extend + shift (GCC splits the generic
    vector conversion into 128-bit halves); remaining lanes one by one."""
    lines = []
    for c in range(0, lanes - lanes % 8, 8):
        lines.append(f"  {{ __m256i x = _mm256_slli_epi32(_mm256_cvtepu16_epi32(_mm_loadu_si128("
                     f"(const __m128i*)(p + {c}))), 16); "
                     f"__builtin_memcpy((float*)&r + {c}, &x, sizeof(x)); }}")
    for c in range(lanes - lanes % 8, lanes):
        lines.append(f"  r[{c}] = kiln_bf16_to_f32(p[{c}]);")
    return "\n".join(lines) + "\n"


def _f16c_chunks(lanes: int, load: bool) -> str:
    """F16C conversion of a float32 vector from/to float16 bits, 8 (or 4) lanes at a time, with
    any remaining lanes converted one by one (``p``/``r`` or ``v``/``r`` as in the callers)."""
    lines = []
    c = 0
    while c < lanes:
        step = 8 if lanes - c >= 8 else (4 if lanes - c >= 4 else 1)
        if step == 1:
            lines.append(f"  r[{c}] = " + (f"kiln_f16_to_f32(p[{c}]);" if load
                                           else f"kiln_f32_to_f16(v[{c}]);"))
        elif load:
            cvt, ld, vt = (("_mm256_cvtph_ps", "_mm_loadu_si128", "__m256") if step == 8 else
                           ("_mm_cvtph_ps", "_mm_loadl_epi64", "__m128"))
            lines.append(f"  {{ {vt} x = {cvt}({ld}((const __m128i*)(p + {c}))); "
                         f"__builtin_memcpy((float*)&r + {c}, &x, sizeof(x)); }}")
        else:
            vt, cvt = ("__m256", "_mm256_cvtps_ph") if step == 8 else ("__m128", "_mm_cvtps_ph")
            st = "_mm_storeu_si128" if step == 8 else "_mm_storel_epi64"
            lines.append(f"  {{ {vt} x; __builtin_memcpy(&x, (const float*)&v + {c}, sizeof(x)); "
                         f"{st}((__m128i*)((uint16_t*)&r + {c}), "
                         f"{cvt}(x, _MM_FROUND_TO_NEAREST_INT)); }}")
        c += step
    return "\n".join(lines) + "\n"


#: libm function of each intrinsic (float64 spelling; float32 appends ``f``).
LIBM = {
    "exp": "exp", "log": "log", "sqrt": "sqrt", "tanh": "tanh", "erf": "erf", "fabs": "fabs",
    "floor": "floor", "ceil": "ceil", "round": "nearbyint", "trunc": "trunc", "pow": "pow",
    "sin": "sin", "cos": "cos", "log2": "log2", "log1p": "log1p", "exp2": "exp2",
    "fmod": "fmod", "nextafter": "nextafter",
}

#: libm functions that libmvec may provide vector variants of (see compiler.libmvec_functions).
MVEC_CANDIDATES = ("exp", "log", "pow", "sin", "cos", "tanh", "erf", "exp2", "log2", "log1p")


class Helpers:
    """The typedefs and helper functions one generated file needs.

    ``native_fp16``: float16 values are ``_Float16`` computed natively (the target has
    AVX512-FP16); otherwise float16, like bfloat16, is stored as 16 bits and computed in
    float32 (see :mod:`.types`).
    """

    def __init__(self, native_fp16: bool = False) -> None:
        self.native_fp16 = native_fp16
        self._vec_types: dict[str, str] = {}
        self._funcs: dict[str, str] = {}

    # ---- vector typedefs ---------------------------------------------------------------
    def vec(self, elem: DataType, lanes: int) -> str:
        """Typedef name of a vector type (registered on first use, with its twins for memory
        access: ``_u`` for any address, ``_a`` for addresses aligned to the vector's size).

        Both twins may alias their element type. The aligned one is not only about the
        instruction (unaligned loads are as fast on aligned data): GCC keeps a register
        tile held in a local array in registers less well through the ``_u`` type. Through
        ``_u``, the accumulators of a 6 x 16 float32 GEMM tile rotated through extra register
        moves and 1024^3 took 1.2x the time (Zen 3, GCC 12; ``_a`` or a plain vector array
        both avoid it)."""
        name = vector_name(elem, lanes)
        if name not in self._vec_types:
            el = elem.element
            ctype = value_ctype(el)
            size = el.itemsize * lanes
            self._vec_types[name] = (
                f"typedef {ctype} {name} __attribute__((vector_size({size})));\n"
                f"typedef {ctype} {name}_u __attribute__((vector_size({size}), "
                f"aligned({el.itemsize}), __may_alias__));\n"
                f"typedef {ctype} {name}_a __attribute__((vector_size({size}), "
                f"aligned({size}), __may_alias__));"
            )
        return name

    # ---- functions ---------------------------------------------------------------------
    def use(self, key: str) -> None:
        """Request one of the fixed helpers (``alloc``, ``check``, ``bf16``, ``f16``)."""
        if key not in self._funcs:
            code, deps = _FIXED[key]
            for d in deps:
                self.use(d)
            self._funcs[key] = code

    def opaque(self, dt: DataType) -> str:
        """``kiln_opaque_<type>(v)``: ``v``, through an empty ``asm`` GCC cannot see into.

        Each step of a scalar float sum that kiln leaves to the C compiler (``B[i] = B[i] + v``
        in a loop kiln did not vectorize) passes through it. GCC 12's loop vectorizer
        miscompiles in-order (fold-left) float sums whose loads it groups out of order: a
        4-iteration ``a += x[2k + 2]; a += x[2k + 1]`` added x[1] and x[3] twice (GCC 12.2 at
        -O3, float and double; a ReduceSum of a Concat of two Split halves summed wrong). With
        the asm in the cycle GCC keeps the sum scalar -- in order, as the C says -- and emits
        the same adds (the asm is no instruction)."""
        ct = value_ctype(dt)
        name = f"kiln_opaque_{dt.element}"
        return self._add(name, (
            f"static inline {ct} {name}({ct} v) {{\n"
            "#if defined(__x86_64__) || defined(__i386__)\n"
            '  __asm__("" : "+x"(v));\n'
            "#elif defined(__aarch64__)\n"
            '  __asm__("" : "+w"(v));\n'
            "#else\n"
            '  __asm__("" : "+g"(v));\n'
            "#endif\n"
            "  return v;\n"
            "}\n"))

    def rounded(self) -> str:
        """``KILN_ROUNDED(x)``: ``x`` (scalar or vector) rounded before use, never contracted
        into an FMA with what uses it (``kiln.tir.rounded``): GCC's ``__builtin_assoc_barrier``
        (GCC 12), clang's ``__arithmetic_fence``; older compilers may contract."""
        name = "KILN_ROUNDED"
        return self._add(name, (
            "#if defined(__has_builtin)\n"
            "#if __has_builtin(__builtin_assoc_barrier)\n"
            f"#define {name}(x) __builtin_assoc_barrier(x)\n"
            "#elif __has_builtin(__arithmetic_fence)\n"
            f"#define {name}(x) __arithmetic_fence(x)\n"
            "#endif\n"
            "#endif\n"
            f"#ifndef {name}\n"
            f"#define {name}(x) (x)\n"
            "#endif\n"))

    def soft_float(self, dt: DataType) -> str:
        """Request the float32 conversions of a soft float (see :mod:`.types`); returns its
        tag, so that the functions are ``kiln_<tag>_to_f32``, ``kiln_f32_to_<tag>`` and
        ``kiln_<tag>_round``."""
        t = soft_float_tag(dt, self.native_fp16)
        if t is None:
            raise KeyError(f"{dt} is not held in float32")
        if t in _FIXED:
            self.use(t)
        else:
            self._add(t, minifloat_helper_code(dt.element.minifloat))
        return t

    def _add(self, name: str, code: str) -> str:
        if name not in self._funcs:
            self._funcs[name] = code
        return name

    def broadcast(self, elem: DataType, lanes: int) -> str:
        vt = self.vec(elem, lanes)
        name = f"kiln_broadcast_{vt}"
        items = ", ".join(["x"] * lanes)
        return self._add(name, f"static inline {vt} {name}({value_ctype(elem)} x) "
                               f"{{ return ({vt}){{{items}}}; }}\n")

    def tile_fma(self, elem: DataType, lanes: int) -> str:
        """``fma(c, a, b) = c + a * b`` on a float32/float64 vector held in a register tile.

        On x86 with FMA it is one ``vfmadd231`` in inline assembly whose operands must be
        registers. Written as ``c + a * b``, GCC (12) contracts it to the same instruction
        but, short of registers in a register-blocked kernel, folds the reused operand's
        load into the FMA instead of keeping it in a register: a 3 x 4 convolution tile
        then loaded every weight vector three times (one load per FMA, besides the
        broadcasts) and ran at 0.8x the speed of the 6 x 2 one; with the register form the
        two tiles are alike, and the 6 x 2 tile of ResNet-18's 3x3 convolutions took 0.95 of
        the time (Zen 3). Not everywhere: the packed GEMM's 6 x 16 tile, which streams its
        panel through FMAs with a memory operand, took 1.05-1.10 of the time in registers. So
        a schedule asks for it by annotating a loop ``FMA_IN_REGISTERS``."""
        vt = self.vec(elem, lanes)
        name = f"kiln_fma_{vt}"
        size = elem.itemsize * lanes
        isa = "__AVX512F__" if size == 64 else "__FMA__"
        insn = "vfmadd231ps" if elem.bits == 32 else "vfmadd231pd"
        return self._add(name, (
            f"static inline {vt} {name}({vt} c, {vt} a, {vt} b) {{\n"
            f"#if defined(__x86_64__) && defined({isa})\n"
            f'  __asm__("{insn} %2, %1, %0" : "+v"(c) : "v"(a), "v"(b));\n'
            f"  return c;\n"
            f"#else\n"
            f"  return c + a * b;\n"
            f"#endif\n"
            f"}}\n"))

    def select(self, elem: DataType, lanes: int) -> str:
        """``select(mask, t, f)`` on vectors; the mask has the lane width of ``elem``."""
        vt = self.vec(elem, lanes)
        mt = self.vec(DataType(f"int{elem.bits}"), lanes)
        name = f"kiln_select_{vt}"
        if elem.is_float:
            body = f"return ({vt})((({mt})t & m) | (({mt})f & ~m));"
        else:
            body = f"return (t & ({vt})m) | (f & ~({vt})m);"
        return self._add(name, f"static inline {vt} {name}({mt} m, {vt} t, {vt} f) "
                               f"{{ {body} }}\n")

    def minmax(self, op: str, dt: DataType) -> str:
        """NaN-propagating (like numpy) min/max for floats; plain min/max for integers."""
        cmp = ">" if op == "max" else "<"
        if dt.lanes == 1:
            ct = value_ctype(dt)
            tname = "bfloat16" if dt.is_bfloat else str(dt)
            name = f"kiln_{op}_{tname}"
            if dt.is_float:
                # Written so that GCC if-converts it (and vectorizes loops calling it).
                body = f"{ct} m = a {cmp} b ? a : b; return a != a ? a : m;"
            else:
                body = f"return a {cmp} b ? a : b;"
            return self._add(name, f"static inline {ct} {name}({ct} a, {ct} b) {{ {body} }}\n")
        el = dt.element
        vt = self.vec(el, dt.lanes)
        sel = self.select(el, dt.lanes)
        name = f"kiln_{op}_{vt}"
        mask = f"(a {cmp} b) | (a != a)" if el.is_float else f"(a {cmp} b)"
        return self._add(name, f"static inline {vt} {name}({vt} a, {vt} b) "
                               f"{{ return {sel}({mask}, a, b); }}\n")

    def floordivmod(self, op: str, dt: DataType) -> str:
        """Floor division / modulo for signed integers (C's ``/`` and ``%`` truncate)."""
        if dt.lanes == 1:
            ct = value_ctype(dt)
            name = f"kiln_{op}_{dt}"
            # Branch-free so that loops calling it still vectorize.
            if op == "floordiv":
                body = (f"{ct} q = ({ct})(a / b); "
                        f"return ({ct})(q - (({ct})(q * b != a) & ({ct})((a ^ b) < 0)));")
            else:
                body = (f"{ct} r = ({ct})(a % b); "
                        f"return ({ct})(r + b * (({ct})(r != 0) & ({ct})((r ^ b) < 0)));")
            return self._add(name, f"static inline {ct} {name}({ct} a, {ct} b) {{ {body} }}\n")
        vt = self.vec(dt.element, dt.lanes)
        name = f"kiln_{op}_{vt}"
        # Comparisons give -1 in true lanes: adding the mask subtracts one where needed.
        if op == "floordiv":
            body = "{vt} q = a / b; return q + ({vt})((q * b != a) & ((a ^ b) < 0));"
        else:
            body = "{vt} r = a % b; return r + (b & ({vt})((r != 0) & ((r ^ b) < 0)));"
        return self._add(name, f"static inline {vt} {name}({vt} a, {vt} b) "
                               f"{{ {body.format(vt=vt)} }}\n")

    def shift(self, op: str, el: DataType, lanes: int, nbits: int) -> str:
        """``shl``/``shr`` of integer vectors with the amount in every lane, defined for
        amounts outside ``[0, nbits)`` (0, or the sign fill for a signed right shift):
        comparisons give -1 lanes, so the in-range test is a mask."""
        vt = self.vec(el, lanes)
        uvt = self.vec(DataType(f"uint{el.bits}"), lanes)
        name = f"kiln_{op}{nbits}_{vt}"
        ok = f"({uvt})((({uvt})b) < {nbits})"
        if op == "shl":
            body = f"return ({vt})((({uvt})a << (({uvt})b & {nbits - 1})) & {ok});"
        elif el.is_uint:
            body = f"return (a >> (b & {nbits - 1})) & ({vt}){ok};"
        else:
            body = (f"{uvt} m = {ok}; "
                    f"return a >> ({vt})((({uvt})b & m) | ({nbits - 1} & ~m));")
        return self._add(name, f"static inline {vt} {name}({vt} a, {vt} b) {{ {body} }}\n")

    def fresh_seed(self) -> str:
        """``uint64_t kiln_fresh_seed(void)``: a new seed on every call, for unseeded random
        ops: a process-wide atomic counter, the wall clock, the CPU clock and a stack address
        (ASLR) mixed by splitmix64. Distinct per call and per process; not cryptographic."""
        name = "kiln_fresh_seed"
        code = (
            "#include <time.h>\n"
            f"static uint64_t {name}(void) {{\n"
            "  static uint64_t counter;\n"
            "  uint64_t n = __atomic_fetch_add(&counter, 1, __ATOMIC_RELAXED);\n"
            "  uint64_t x = n * 0x9E3779B97F4A7C15ull\n"
            "      ^ (uint64_t)time(NULL) * 0xD6E8FEB86659FD93ull\n"
            "      ^ (uint64_t)clock() ^ (uint64_t)(uintptr_t)&n;\n"
            "  x = (x ^ (x >> 30)) * 0xBF58476D1CE4E5B9ull;\n"
            "  x = (x ^ (x >> 27)) * 0x94D049BB133111EBull;\n"
            "  return x ^ (x >> 31);\n"
            "}\n"
        )
        return self._add(name, code)

    def bitcast(self, src: DataType, dst: DataType) -> str:
        """``dst f(src x)``: the bits of a scalar ``src`` as a ``dst`` of one width (a copy,
        which the compiler turns into a register move; no aliasing UB)."""
        s, d = value_ctype(src), value_ctype(dst)
        name = f"kiln_bitcast_{src}_{dst}"
        return self._add(name, f"static inline {d} {name}({s} x) {{ {d} r; "
                               f"__builtin_memcpy(&r, &x, sizeof r); return r; }}\n")

    def scalar_intrinsic(self, op: str, dt: DataType) -> str:
        """Helpers for intrinsics libm lacks: ``rsqrt`` and ``sigmoid`` (float or double)."""
        ct = "double" if dt.bits == 64 else "float"
        f = "" if dt.bits == 64 else "f"
        one = "1.0" + f
        name = f"kiln_{op}_{'float64' if dt.bits == 64 else 'float32'}"
        if op == "rsqrt":
            body = f"return {one} / sqrt{f}(x);"
        elif op == "sigmoid":  # exp(-|x|) never overflows: e / (1 + e) keeps tiny results
            body = (f"{ct} e = exp{f}(-fabs{f}(x)); "
                    f"return (x >= 0 ? {one} : e) / ({one} + e);")
        else:  # pragma: no cover - guarded by the caller
            raise KeyError(op)
        return self._add(name, f"static inline {ct} {name}({ct} x) {{ {body} }}\n")

    def special_function(self, op: str) -> str:
        """``kiln_sf_<op>``: a special function's float64 helper (see :mod:`.special_math`),
        with the helpers it calls."""
        code, deps = SPECIAL_C[op]
        for d in deps:
            self.special_function(d)
        return self._add(f"kiln_sf_{op}", code)

    # ---- low-precision float vectors (held as float32 vectors) -----------------------------
    def lowp_load(self, dt: DataType, lanes: int) -> str:
        """``load(const uint16_t* p) -> float32xL``: ``lanes`` contiguous float16/bfloat16
        values widened to float32 (exact); float8/float4 (``const uint8_t* p``) lane by lane."""
        fv = self.vec(DataType("float32"), lanes)
        if dt.element.is_minifloat:
            t = self.soft_float(dt)
            name = f"kiln_load_{t}_{fv}"
            body = (f"  {fv} r;\n"
                    f"  for (int l = 0; l < {lanes}; ++l) r[l] = kiln_{t}_to_f32(p[l]);\n"
                    f"  return r;\n")
            return self._add(name, f"static inline {fv} {name}(const uint8_t* p) {{\n{body}}}\n")
        if dt.element.is_bfloat:
            self.use("bf16")
            hv = self.vec(DataType("uint16"), lanes)
            uv = self.vec(DataType("uint32"), lanes)
            name = f"kiln_load_bf16_{fv}"
            body = (f"#if defined(__AVX2__)\n  {fv} r;\n{_avx2_bf16_chunks(lanes)}  return r;\n"
                    f"#else\n  {hv} h = *(const {hv}_u*)p;\n"
                    f"  return ({fv})(__builtin_convertvector(h, {uv}) << 16);\n#endif\n")
        else:
            self.use("f16")
            name = f"kiln_load_f16_{fv}"
            body = (f"  {fv} r;\n"
                    f"#if defined(__F16C__)\n{_f16c_chunks(lanes, load=True)}"
                    f"#else\n"
                    f"  for (int l = 0; l < {lanes}; ++l) r[l] = kiln_f16_to_f32(p[l]);\n"
                    f"#endif\n"
                    f"  return r;\n")
        return self._add(name, f"static inline {fv} {name}(const uint16_t* p) {{\n{body}}}\n")

    def lowp_bits(self, dt: DataType, lanes: int) -> str:
        """``bits(float32xL v) -> uint16xL``: each lane rounded to nearest even float16 or
        bfloat16 (NaN stays NaN), as 16-bit patterns (``uint8xL`` for float8/float4)."""
        fv = self.vec(DataType("float32"), lanes)
        if dt.element.is_minifloat:
            t = self.soft_float(dt)
            bv = self.vec(DataType("uint8"), lanes)
            name = f"kiln_bits_{t}_{fv}"
            body = (f"  {bv} r;\n"
                    f"  for (int l = 0; l < {lanes}; ++l) r[l] = kiln_f32_to_{t}(v[l]);\n"
                    f"  return r;\n")
            return self._add(name, f"static inline {bv} {name}({fv} v) {{\n{body}}}\n")
        hv = self.vec(DataType("uint16"), lanes)
        if dt.element.is_bfloat:
            uv = self.vec(DataType("uint32"), lanes)
            name = f"kiln_bits_bf16_{fv}"
            body = (f"  {uv} u = ({uv})v;\n"
                    f"  {uv} r = (u + 0x7fffu + ((u >> 16) & 1u)) >> 16;\n"
                    f"  {uv} nan = ({uv})((u & 0x7fffffffu) > 0x7f800000u);\n"
                    f"  r = (r & ~nan) | (((u >> 16) | 0x40u) & nan);\n"
                    f"  return __builtin_convertvector(r, {hv});\n")
        else:
            self.use("f16")
            name = f"kiln_bits_f16_{fv}"
            body = (f"  {hv} r;\n"
                    f"#if defined(__F16C__)\n{_f16c_chunks(lanes, load=False)}"
                    f"#else\n"
                    f"  for (int l = 0; l < {lanes}; ++l) r[l] = kiln_f32_to_f16(v[l]);\n"
                    f"#endif\n"
                    f"  return r;\n")
        return self._add(name, f"static inline {hv} {name}({fv} v) {{\n{body}}}\n")

    def lowp_unbits(self, dt: DataType, lanes: int) -> str:
        """``unbits(uint16xL h) -> float32xL``: 16-bit patterns widened to float32."""
        fv = self.vec(DataType("float32"), lanes)
        st = soft_float_storage(dt)
        hv = self.vec(st, lanes)
        load = self.lowp_load(dt, lanes)
        name = f"kiln_unbits_{self.soft_float(dt)}_{fv}"
        return self._add(name, f"static inline {fv} {name}({hv} h) {{ return {load}((const "
                               f"{value_ctype(st)}*)&h); }}\n")

    def lowp_round(self, dt: DataType, lanes: int) -> str:
        """``round(float32xL v) -> float32xL``: each lane rounded to float16/bfloat16."""
        fv = self.vec(DataType("float32"), lanes)
        bits = self.lowp_bits(dt, lanes)
        unbits = self.lowp_unbits(dt, lanes)
        name = f"kiln_round_{self.soft_float(dt)}_{fv}"
        return self._add(name, f"static inline {fv} {name}({fv} v) {{ return {unbits}({bits}"
                               f"(v)); }}\n")

    def lanewise(self, name_hint: str, ret: str, args: list[str], lanes: int,
                 lane_expr: str) -> str:
        """A helper applying ``lane_expr`` (on ``a0[l], a1[l]...``) to every lane."""
        name = f"kiln_{name_hint}"
        params = ", ".join(f"{t} a{i}" for i, t in enumerate(args))
        code = (
            f"static inline {ret} {name}({params}) {{\n"
            f"  {ret} r;\n"
            f"  for (int l = 0; l < {lanes}; ++l) r[l] = {lane_expr};\n"
            f"  return r;\n"
            f"}}\n"
        )
        return self._add(name, code)

    # ---- output ------------------------------------------------------------------------
    def render(self) -> str:
        parts: list[str] = []
        if self._vec_types:
            parts.append("/* ---- vector types (GCC vector extensions; _u: any address, "
                         "_a: aligned to the size) ---- */")
            parts.extend(self._vec_types.values())
            parts.append("")
        if self._funcs:
            parts.append("/* ---- helpers ---- */")
            parts.extend(code.strip("\n") + "\n" for code in self._funcs.values())
        return "\n".join(parts) + ("\n" if parts else "")
