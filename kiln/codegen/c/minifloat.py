"""C conversions between float32 and the float8/float6/float4 formats, generated per format.

A format is described once, in :data:`kiln.ir.dtype.MINIFLOATS` (field widths, bias and how
the special values are encoded); this module turns that description into three static C
functions named after the format's tag (``f8e4m3fn`` for ``float8_e4m3fn``):

- ``float kiln_<tag>_to_f32(uint8_t)``: exact (every value of these formats is a float32);
- ``uint8_t kiln_f32_to_<tag>(float)``: round to nearest even, with ``ml_dtypes``' rules for
  what does not fit: overflow gives Inf (``ieee`` formats), NaN (``fn``/``fnuz``) or the largest
  finite value (``finite`` formats, which have neither); NaN keeps its sign where the format has
  a signed NaN; ``fnuz`` formats have no -0. ``float8_e8m0fnu`` (powers of two only) rounds
  half up, like ``ml_dtypes``, and maps zero, negative numbers, Inf and NaN to its NaN;
- ``float kiln_<tag>_round(float)``: the value rounded to the format (a cast's result held in
  float32).

ONNX's ``saturate`` (out of range -> largest finite value) is not a C concern: the ``cast``
operator clamps in float32 before converting (see :mod:`kiln.op.elementwise`). Values are
computed in float32 (like float16/bfloat16, see :mod:`.types`), so arithmetic never touches
the 8-bit patterns. The conversions are checked bit for bit against ``ml_dtypes`` over every
pattern and a sweep of float32 values (``tests/codegen/test_codegen_float8.py``).
"""

from __future__ import annotations

from ...ir.dtype import MiniFloat


def tag(fmt: MiniFloat) -> str:
    """Short C name of a format: ``float8_e4m3fn`` -> ``f8e4m3fn``."""
    width, rest = fmt.name.split("_", 1)
    return f"f{width[len('float'):]}{rest}"


def _hexf(exp: int) -> str:
    """The float32 C literal of ``2**exp``."""
    return f"0x1p{exp}f"


def _decode(fmt: MiniFloat, t: str) -> str:
    e_mask, m_mask = (1 << fmt.ebits) - 1, (1 << fmt.mbits) - 1
    lines = [f"static inline float kiln_{t}_to_f32(uint8_t b) {{",
             "  union { uint32_t u; float f; } v;"]
    if fmt.kind == "fnu":
        lines += ["  if (b == 0xffu) return NAN;",
                  "  v.u = b ? (uint32_t)b << 23 : 0x00400000u;  /* 2^(b - 127); b = 0: 2^-127 */",
                  "  return v.f;", "}"]
        return "\n".join(lines) + "\n"
    nbits = fmt.ebits + fmt.mbits
    lines += [f"  uint32_t s = (uint32_t)((b >> {nbits}) & 1u) << 31;",
              f"  uint32_t e = (uint32_t)(b >> {fmt.mbits}) & {e_mask}u, m = b & {m_mask}u;"]
    if fmt.kind == "ieee":
        lines.append(f"  if (e == {e_mask}u) {{ v.u = s | 0x7f800000u | (m ? 0x00400000u : 0u); "
                     f"return v.f; }}")
    elif fmt.kind == "fn":
        lines.append(f"  if (e == {e_mask}u && m == {m_mask}u) {{ v.u = s | 0x7fc00000u; "
                     f"return v.f; }}")
    elif fmt.kind == "fnuz":
        lines.append(f"  if (b == 0x{1 << nbits:x}u) return NAN;")
    lines += [
        f"  if (e == 0) {{ v.f = (float)m * {_hexf(1 - fmt.bias - fmt.mbits)}; v.u |= s; "
        f"return v.f; }}",
        f"  v.u = s | ((e + {127 - fmt.bias}u) << 23) | (m << {23 - fmt.mbits});",
        "  return v.f;", "}",
    ]
    return "\n".join(lines) + "\n"


def _encode(fmt: MiniFloat, t: str) -> str:
    e_mask, m_mask = (1 << fmt.ebits) - 1, (1 << fmt.mbits) - 1
    lines = [f"static inline uint8_t kiln_f32_to_{t}(float f) {{",
             "  union { uint32_t u; float f; } v, w;",
             "  v.f = f;",
             "  uint32_t a = v.u & 0x7fffffffu;"]
    if fmt.kind == "fnu":
        # Round half up on the exponent; float32 subnormals: above 2^-127 -> 2^-126 (as
        # ml_dtypes does), else the smallest value 2^-127.
        lines += ["  if ((v.u >> 31) || a == 0 || a >= 0x7f800000u) return 0xffu;",
                  "  if (a < 0x00800000u) return a > 0x00400000u ? 1u : 0u;  /* as ml_dtypes */",
                  "  return (uint8_t)((a + 0x00400000u) >> 23);  /* 255 (overflow) is NaN */",
                  "}"]
        return "\n".join(lines) + "\n"
    nbits = fmt.ebits + fmt.mbits
    lines.append(f"  uint8_t sb = (uint8_t)((v.u >> 31) << {nbits});")
    if fmt.kind == "ieee":
        max_code = ((e_mask - 1) << fmt.mbits) | m_mask
        nan, inf, over = (f"(uint8_t)(sb | {(e_mask << fmt.mbits) | (1 << (fmt.mbits - 1))}u)",
                          f"(uint8_t)(sb | {e_mask << fmt.mbits}u)",
                          f"(uint8_t)(sb | {e_mask << fmt.mbits}u)")
    elif fmt.kind == "fn":
        max_code = (e_mask << fmt.mbits) | (m_mask - 1)
        nan = inf = over = f"(uint8_t)(sb | {max_code + 1}u)"
    elif fmt.kind == "fnuz":
        max_code = (e_mask << fmt.mbits) | m_mask
        nan = inf = over = f"(uint8_t){1 << nbits}u"
    else:  # finite: saturate; NaN becomes a zero (ml_dtypes: the sign bit flipped)
        max_code = (e_mask << fmt.mbits) | m_mask
        nan = f"(uint8_t)(sb ^ {1 << nbits}u)"
        inf = over = f"(uint8_t)(sb | {max_code}u)"
    shift = 23 - fmt.mbits
    min_normal = (127 + 1 - fmt.bias) << 23
    magic_exp = 24 - fmt.bias - fmt.mbits  # ulp(2^magic_exp) is the subnormal quantum
    zero = "0" if fmt.kind == "fnuz" else "sb"
    lines += [
        f"  if (a > 0x7f800000u) return {nan};",
        f"  if (a == 0x7f800000u) return {inf};",
        f"  if (a < 0x{min_normal:08x}u) {{  /* subnormal or zero: RNE by the FPU */",
        "    v.u = a;",
        f"    w.f = v.f + {_hexf(magic_exp)};",
        f"    uint8_t c = (uint8_t)(w.u - 0x{(127 + magic_exp) << 23:08x}u);",
        f"    return c ? (uint8_t)(sb | c) : (uint8_t){zero};",
        "  }",
        f"  uint32_t r = (a + 0x{(1 << (shift - 1)) - 1:x}u + ((a >> {shift}) & 1u)) >> {shift};",
        f"  r -= {127 - fmt.bias}u << {fmt.mbits};",
        f"  if (r > {max_code}u) return {over};",
        "  return (uint8_t)(sb | r);",
        "}",
    ]
    return "\n".join(lines) + "\n"


def helper_code(fmt: MiniFloat) -> str:
    """The C conversions of one format (decode, encode, round)."""
    t = tag(fmt)
    return (f"/* {fmt.name}: {fmt.ebits} exponent bits (bias {fmt.bias}), {fmt.mbits} mantissa "
            f"bits, {fmt.kind}; one byte per element */\n"
            + _decode(fmt, t) + "\n" + _encode(fmt, t) + "\n"
            + f"static inline float kiln_{t}_round(float f) "
              f"{{ return kiln_{t}_to_f32(kiln_f32_to_{t}(f)); }}\n")
