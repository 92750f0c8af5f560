"""C identifiers for TIR names: sanitized, unique, and clear of C keywords and library names.

Generated code keeps the original buffer and variable names where it can (``A``, ``T_add``,
``i0``), so the source reads like the TIR it came from. A name is changed only when it is not a
valid C identifier, when it would clash with a keyword, a type, a C library function or macro
(``exp``, ``free``, ``NAN``), with kiln's own helpers (``kiln_*``, vector typedefs), or with a
name already used in the same scope; then characters are replaced by ``_`` and a suffix added.
"""

from __future__ import annotations

import re

_KEYWORDS = """
auto break case char const continue default do double else enum extern float for goto if inline
int long register restrict return short signed sizeof static struct switch typedef union unsigned
void volatile while _Bool _Complex _Imaginary _Alignas _Alignof _Atomic _Generic _Noreturn
_Static_assert _Thread_local _Float16 _Float32 _Float64 _Float128 __thread asm typeof bool true
false
""".split()

_MATH = """
acos acosh asin asinh atan atan2 atanh cbrt ceil copysign cos cosh erf erfc exp exp2 expm1 fabs
fdim floor fma fmax fmin fmod frexp hypot ilogb ldexp lgamma llrint llround log log10 log1p log2
logb lrint lround modf nan nearbyint nextafter nexttoward pow remainder remquo rint round scalbln
scalbn sin sinh sqrt tan tanh tgamma trunc j0 j1 jn y0 y1 yn gamma drem significand exp10 pow10
sincos finite isinf isnan
""".split()

_OTHER = """
isfinite isnormal signbit fpclassify isgreater isgreaterequal isless islessequal islessgreater
isunordered malloc calloc realloc free aligned_alloc posix_memalign abort exit atexit abs labs
llabs div ldiv lldiv rand srand qsort bsearch atoi atol atof strtol strtod getenv system printf
fprintf sprintf snprintf vsnprintf puts putchar fputs stdin stdout stderr memcpy memset memmove
memcmp strlen strcmp strcpy strncpy strcat strchr strstr errno main va_list va_start va_end
va_arg NULL EOF FILE INFINITY NAN HUGE_VAL HUGE_VALF HUGE_VALL size_t ptrdiff_t intptr_t
uintptr_t offsetof DLTensor DLDevice DLDataType data sym args num_args
""".split()

RESERVED: frozenset[str] = frozenset(
    _KEYWORDS + _MATH + [m + "f" for m in _MATH] + [m + "l" for m in _MATH] + _OTHER
)

_INVALID = re.compile(r"[^A-Za-z0-9_]")
# Names that look like C fixed-width types, vector typedefs or macros we rely on.
_TYPE_LIKE = re.compile(r"^(\w+_t|(u?int|float|bfloat)\d+x\d+(_u)?|M_\w+|KILN_\w*|__\w*)$")


def sanitize(name: str) -> str:
    """A valid C identifier close to ``name`` that clashes with nothing reserved."""
    ident = _INVALID.sub("_", name) or "v"
    if ident[0].isdigit():
        ident = "v" + ident
    if ident in RESERVED or _TYPE_LIKE.match(ident) or ident.startswith("kiln_"):
        ident = ident + "_"
    return ident


class NameTable:
    """Hands out unique C identifiers within one scope (``x``, ``x_1``, ``x_2``...)."""

    def __init__(self, taken: set[str] | None = None):
        self.used: set[str] = set(taken or ())

    def get(self, name: str) -> str:
        base = sanitize(name)
        ident, k = base, 1
        while ident in self.used:
            ident = f"{base}_{k}"
            k += 1
        self.used.add(ident)
        return ident

    def reserve(self, ident: str) -> None:
        self.used.add(ident)
