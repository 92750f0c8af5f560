"""C expressions for TIR PrimExprs (scalars and GCC vectors).

Every expression is printed fully parenthesised, so the C precedence rules never matter.
Semantics kept from TIR, not inherited from C:

- narrow integers (8/16 bit) wrap after each operation, like numpy (C would promote to int);
- ``FloorDiv``/``FloorMod`` round toward minus infinity: plain ``/`` and ``%`` only when the
  operands are provably non-negative (``analyzer``), a helper otherwise;
- ``Min``/``Max`` on floats propagate NaN like numpy;
- 2/4-bit integers are held in 8 bits and wrap to their width (loads sign-extend);
- float16/bfloat16 (and float8/float6/float4) values are held in float32 (``float``,
  ``float32xN`` vectors): loads widen exactly, arithmetic is float32 arithmetic, stores and
  explicit casts to these types round to nearest even. With ``helpers.native_fp16`` (a target
  with AVX512-FP16) float16 values are ``_Float16`` and arithmetic rounds to float16 after
  every operation (see :mod:`.types`);
- shifts are defined for every amount (see ``E.ShiftLeft``/``E.ShiftRight``), reinterpret
  copies bits (no pointer punning);
- bool vectors are lane masks (see :mod:`.types`); :meth:`ExprEmitter.mask_bits` tracks the
  lane width of the mask an expression produces and conversions are inserted where widths meet.
"""

from __future__ import annotations

from ...ir.dtype import DataType
from ...ir.errors import CodegenError
from ...tir import expr as E
from ...tir.buffer import Buffer
from . import externs
from .helpers import LIBM, Helpers
from .types import (
    F32,
    c_string,
    compute_dtype,
    float_literal,
    int_literal,
    is_low_float,
    storage_ctype,
    value_ctype,
    wrap_int,
)

_BIN_OPS = {
    E.Add: "+", E.Sub: "-", E.Mul: "*", E.Div: "/", E.Mod: "%",
    E.EQ: "==", E.NE: "!=", E.LT: "<", E.LE: "<=", E.GT: ">", E.GE: ">=",
}
_WRAPPING = (E.Add, E.Sub, E.Mul, E.Div, E.Mod)


def _is_narrow_int(dt: DataType) -> bool:
    return dt.is_integer and dt.bits < 32


class ExprEmitter:
    """Prints PrimExprs as C; subclasses provide statement emission and variable names."""

    def __init__(self, helpers: Helpers, analyzer=None):
        self.helpers = helpers
        self.analyzer = analyzer
        self.var_names: dict[E.Var, str] = {}
        self.var_mask_bits: dict[E.Var, int] = {}
        #: Data variables of the buffers the function allocates itself (stack arrays and
        #: ``kiln_alloc`` memory, both 64-byte aligned): their vector accesses at offsets
        #: that are multiples of the vector's size take the aligned type (see ``vector_ref``).
        self.aligned_data: set[E.Var] = set()
        # the function's small arrays on the stack (register tiles among them)
        self.stack_data: set[E.Var] = set()
        # depth of loops annotated FMA_IN_REGISTERS around the statement being written
        self.fma_in_registers = 0
        self._tmp = 0
        self.native_fp16 = helpers.native_fp16

    # ---- names ----------------------------------------------------------------------------
    def var_name(self, v: E.Var) -> str:
        try:
            return self.var_names[v]
        except KeyError:
            raise CodegenError(
                f"variable {v.name!r} is used but not defined (free variable in the function)"
            ) from None

    def buffer_ptr(self, buffer) -> str:
        return self.var_name(buffer.data)

    def fresh(self, hint: str) -> str:
        self._tmp += 1
        return f"kiln_{hint}{self._tmp}"

    # ---- types ----------------------------------------------------------------------------
    def compute_dtype(self, dt: DataType) -> DataType:
        """Element type holding ``dt``'s values in C (float32 for widened float16/bfloat16)."""
        return compute_dtype(dt, self.native_fp16)

    def widened(self, dt: DataType) -> bool:
        """``dt`` is a float16/bfloat16 type whose values are held in float32."""
        return is_low_float(dt) and self.compute_dtype(dt) == F32

    def storage_ctype(self, dt: DataType) -> str:
        return storage_ctype(dt, self.native_fp16)

    def scalar_ctype(self, dt: DataType) -> str:
        return value_ctype(dt, self.native_fp16)

    def vec_type(self, dt: DataType) -> str:
        """C type of a vector expression of ``dt`` (bool vectors: use mask_type)."""
        return self.helpers.vec(self.compute_dtype(dt), dt.lanes)

    def lane_bits(self, dt: DataType) -> int:
        """Bits of one lane of the C vector holding ``dt`` values."""
        return self.compute_dtype(dt).bits

    def mask_type(self, bits: int, lanes: int) -> str:
        return self.helpers.vec(DataType(f"int{bits}"), lanes)

    def ctype_of(self, e: E.PrimExpr) -> str:
        dt = e.dtype
        if dt.lanes == 1:
            return self.scalar_ctype(dt)
        if dt.is_bool:
            return self.mask_type(self.mask_bits(e), dt.lanes)
        return self.vec_type(dt)

    def mask_bits(self, e: E.PrimExpr) -> int:
        """Lane width of the mask a bool vector expression evaluates to."""
        if isinstance(e, E.CmpOp):
            a = e.a
            return self.mask_bits(a) if a.dtype.is_bool else self.lane_bits(a.dtype)
        if isinstance(e, (E.And, E.Or, E.Not, E.BitwiseAnd, E.BitwiseOr, E.BitwiseXor)):
            return self.mask_bits(e.a)
        if isinstance(e, E.BufferLoad):
            return 8
        if isinstance(e, E.Select):
            return self.mask_bits(e.true_value)
        if isinstance(e, E.Cast):
            v = e.value
            return self.mask_bits(v) if v.dtype.is_bool else self.lane_bits(v.dtype)
        if isinstance(e, E.Let):
            return self.mask_bits(e.body)
        if isinstance(e, E.Var):
            return self.var_mask_bits.get(e, 32)
        if isinstance(e, E.Call) and e.args:
            return self.lane_bits(e.args[0].dtype)
        return 32

    def to_mask(self, e: E.PrimExpr, bits: int) -> str:
        """``e`` (a bool vector) as a mask with ``bits``-wide lanes."""
        code = self.expr(e)
        have = self.mask_bits(e)
        if have == bits:
            return code
        return f"__builtin_convertvector({code}, {self.mask_type(bits, e.dtype.lanes)})"

    # ---- dispatch -------------------------------------------------------------------------
    def expr(self, e: E.PrimExpr) -> str:
        method = getattr(self, "expr_" + type(e).__name__, None)
        if method is None:
            if isinstance(e, E.CmpOp):
                return self.expr_compare(e)
            raise CodegenError(f"cannot generate C for {type(e).__name__} expressions")
        return method(e)

    # ---- leaves ---------------------------------------------------------------------------
    def expr_Var(self, v: E.Var) -> str:
        return self.var_name(v)

    expr_SizeVar = expr_Var

    def expr_IntImm(self, e: E.IntImm) -> str:
        return int_literal(e.value, e.dtype)

    def expr_FloatImm(self, e: E.FloatImm) -> str:
        return float_literal(e.value, e.dtype, self.native_fp16)

    def expr_StringImm(self, e: E.StringImm) -> str:
        raise CodegenError(f"string constant {e.value!r} cannot appear in generated code")

    # ---- arithmetic -----------------------------------------------------------------------
    def _operand(self, e: E.PrimExpr, other: E.PrimExpr) -> str:
        # Two int64 literals would multiply as C ints: force the 64-bit suffix.
        if isinstance(e, E.IntImm) and isinstance(other, E.IntImm) and e.dtype.bits == 64:
            return int_literal(e.value, e.dtype, force_wide=True)
        return self.expr(e)

    def _binary(self, e: E.BinaryOp, op: str) -> str:
        a, b = self._operand(e.a, e.b), self._operand(e.b, e.a)
        text = f"({a} {op} {b})"
        dt = e.dtype
        if isinstance(e, _WRAPPING) and dt.is_integer and dt.bits < 8:
            text = wrap_int(dt, text)
            if dt.lanes == 1:
                text = f"(({value_ctype(dt)}){text})"
        elif dt.lanes == 1 and isinstance(e, _WRAPPING) and _is_narrow_int(dt):
            text = f"(({value_ctype(dt)}){text})"
        return text

    def expr_Add(self, e: E.Add) -> str:
        return self._binary(e, "+")

    def expr_Sub(self, e: E.Sub) -> str:
        return self._binary(e, "-")

    def expr_Mul(self, e: E.Mul) -> str:
        return self._binary(e, "*")

    def expr_Div(self, e: E.Div) -> str:
        return self._binary(e, "/")

    def expr_Mod(self, e: E.Mod) -> str:
        if e.dtype.is_float:
            return self.expr(E.Call(e.dtype, "fmod", (e.a, e.b)))
        return self._binary(e, "%")

    def _non_negative(self, e: E.PrimExpr, strictly: bool = False) -> bool:
        if isinstance(e, E.IntImm):
            return e.value > 0 if strictly else e.value >= 0
        if self.analyzer is None or e.dtype.lanes != 1:
            return False
        try:
            lo = self.analyzer.const_int_bound(e).min_value
        except Exception:  # noqa: BLE001 - no proof means the safe helper is used
            return False
        return lo > 0 if strictly else lo >= 0

    def _floor_op(self, e: E.BinaryOp, name: str, c_op: str) -> str:
        dt = e.dtype
        if dt.is_float:
            raise CodegenError(f"{type(e).__name__} on {dt} must be lowered to floor()")
        if dt.is_uint or dt.is_bool or (
            self._non_negative(e.a) and self._non_negative(e.b, strictly=True)
        ):
            return self._binary(E.Div(e.a, e.b) if c_op == "/" else E.Mod(e.a, e.b), c_op)
        fn = self.helpers.floordivmod(name, dt)
        return f"{fn}({self.expr(e.a)}, {self.expr(e.b)})"

    def expr_FloorDiv(self, e: E.FloorDiv) -> str:
        return self._floor_op(e, "floordiv", "/")

    def expr_FloorMod(self, e: E.FloorMod) -> str:
        return self._floor_op(e, "floormod", "%")

    def _minmax(self, e: E.BinaryOp, op: str) -> str:
        dt = e.dtype
        if dt.is_bool:
            if dt.lanes == 1:
                c = "&&" if op == "min" else "||"
                return f"({self.expr(e.a)} {c} {self.expr(e.b)})"
            bits = self.mask_bits(e.a)
            c = "&" if op == "min" else "|"
            return f"({self.to_mask(e.a, bits)} {c} {self.to_mask(e.b, bits)})"
        fn = self.helpers.minmax(op, self.compute_dtype(dt).with_lanes(dt.lanes))
        return f"{fn}({self.expr(e.a)}, {self.expr(e.b)})"

    def expr_Min(self, e: E.Min) -> str:
        return self._minmax(e, "min")

    def expr_Max(self, e: E.Max) -> str:
        return self._minmax(e, "max")

    # ---- comparisons and logic ------------------------------------------------------------
    def expr_compare(self, e: E.CmpOp) -> str:
        op = _BIN_OPS[type(e)]
        if e.dtype.lanes > 1 and e.a.dtype.is_bool:
            bits = self.mask_bits(e.a)
            return f"({self.to_mask(e.a, bits)} {op} {self.to_mask(e.b, bits)})"
        return f"({self._operand(e.a, e.b)} {op} {self._operand(e.b, e.a)})"

    def _logic(self, e: E.BinaryOp, scalar_op: str, vec_op: str) -> str:
        if e.dtype.lanes == 1:
            return f"({self.expr(e.a)} {scalar_op} {self.expr(e.b)})"
        bits = self.mask_bits(e.a)
        return f"({self.to_mask(e.a, bits)} {vec_op} {self.to_mask(e.b, bits)})"

    def expr_And(self, e: E.And) -> str:
        return self._logic(e, "&&", "&")

    def expr_Or(self, e: E.Or) -> str:
        return self._logic(e, "||", "|")

    def expr_Not(self, e: E.Not) -> str:
        if e.dtype.lanes == 1:
            return f"(!{self.expr(e.a)})"
        return f"(~{self.expr(e.a)})"

    # ---- bit operations -------------------------------------------------------------------
    def _bitwise(self, e: E.BinaryOp, op: str) -> str:
        dt = e.dtype
        if dt.is_bool:
            if dt.lanes == 1:
                return f"({self.expr(e.a)} {op} {self.expr(e.b)})"
            bits = self.mask_bits(e.a)
            return f"({self.to_mask(e.a, bits)} {op} {self.to_mask(e.b, bits)})"
        text = f"({self._operand(e.a, e.b)} {op} {self._operand(e.b, e.a)})"
        if dt.is_uint and dt.bits < 8:  # ``x ^ 15`` on a uint4 held in a byte stays in range
            text = wrap_int(dt, text)
        return f"(({self.scalar_ctype(dt)}){text})" if dt.lanes == 1 else text

    def expr_BitwiseAnd(self, e: E.BitwiseAnd) -> str:
        return self._bitwise(e, "&")

    def expr_BitwiseOr(self, e: E.BitwiseOr) -> str:
        return self._bitwise(e, "|")

    def expr_BitwiseXor(self, e: E.BitwiseXor) -> str:
        return self._bitwise(e, "^")

    def _shift_amount(self, b: E.PrimExpr, nbits: int) -> int | None:
        """The constant shift amount when it is one in ``[0, nbits)`` (a plain C shift)."""
        c = b.value if isinstance(b, E.Broadcast) else b
        if isinstance(c, E.IntImm) and 0 <= c.value < nbits:
            return c.value
        return None

    def _shift(self, e: E.BinaryOp, left: bool) -> str:
        """Shifts with TIR's defined out-of-range results (C leaves them undefined): the
        amount is compared as unsigned, so negative amounts are out of range too; a left shift
        is done in the unsigned type (no signed-overflow UB)."""
        dt = e.dtype
        nbits = dt.bits
        cdt = self.compute_dtype(dt)
        udt = DataType(f"uint{cdt.bits}")
        a, b = self.expr(e.a), self.expr(e.b)
        k = self._shift_amount(e.b, nbits)
        if dt.lanes == 1:
            t, u = self.scalar_ctype(dt), value_ctype(udt)
            if k is not None:
                text = f"(({u}){a} << {k})" if left else f"({a} >> {k})"
            elif left:
                text = f"(({u}){b} < {nbits} ? ({u}){a} << ({u}){b} : 0)"
            elif dt.is_uint:
                text = f"(({u}){b} < {nbits} ? {a} >> {b} : 0)"
            else:
                text = f"({a} >> (({u}){b} < {nbits} ? {b} : {nbits - 1}))"
            if dt.bits < 8:
                text = wrap_int(dt, text)
            return f"(({t}){text})"
        vt = self.vec_type(dt)
        if k is not None:
            uvt = self.helpers.vec(udt, dt.lanes)
            text = f"({vt})(({uvt}){a} << {k})" if left else f"({a} >> {k})"
        else:
            fn = self.helpers.shift("shl" if left else "shr", cdt, dt.lanes, nbits)
            text = f"{fn}({a}, {b})"
        return wrap_int(dt, text) if dt.bits < 8 else text

    def expr_ShiftLeft(self, e: E.ShiftLeft) -> str:
        return self._shift(e, left=True)

    def expr_ShiftRight(self, e: E.ShiftRight) -> str:
        return self._shift(e, left=False)

    def _reinterpret(self, e: E.Call) -> str:
        """Bit copy between types of one width: GCC vector casts between vectors of one size
        are bit copies; scalars go through ``__builtin_memcpy`` (no pointer punning). Soft
        floats (float16/bfloat16/float8 held in float32) are rounded to their storage bits
        first (exact for their values; a NaN keeps its sign but may lose its payload)."""
        (x,) = e.args
        src, dst = x.dtype, e.dtype
        value = self.expr(x)
        src_soft = self.widened(src)
        dst_soft = self.widened(dst)
        if dst.lanes > 1:
            if not src_soft and not dst_soft:
                text = f"(({self.vec_type(dst)})({value}))"
                return wrap_int(dst, text) if dst.is_integer and dst.bits < 8 else text
            arg = self.ctype_of(x)
            ret = self.vec_type(dst)
            fn = self.helpers.lanewise(
                f"reinterpret_{arg}_{ret}_{src.element}_{dst.element}".replace(" ", ""), ret,
                [arg], dst.lanes, self._reinterpret_scalar(src.element, dst.element, "a0[l]"))
            return f"{fn}({value})"
        if src_soft and isinstance(x, E.BufferLoad) and len(x.indices) == 1:
            # the stored bits themselves: exact, NaN payloads included
            raw = f"{self.buffer_ptr(x.buffer)}[{self.expr(x.indices[0])}]"
            return self._reinterpret_scalar(DataType(f"uint{max(8, src.bits)}"), dst, raw)
        return self._reinterpret_scalar(src, dst, value)

    def _reinterpret_scalar(self, src: DataType, dst: DataType, value: str) -> str:
        storage = DataType(f"uint{max(8, src.bits)}")
        if self.widened(src):
            value, src = self.narrow_scalar(src, value), storage
        if self.widened(dst):
            if not src.is_integer:  # e.g. a native _Float16 -> bfloat16
                value = self.helpers.bitcast(self.compute_dtype(src), storage) + f"({value})"
            bits = wrap_int(DataType(f"uint{dst.bits}"), value) if dst.bits < 8 else value
            return self.widen_scalar(dst, f"(({value_ctype(storage)}){bits})")
        cs, cd = self.compute_dtype(src), self.compute_dtype(dst)
        if cs.is_integer and cd.is_integer:
            text = f"(({self.scalar_ctype(dst)})({value}))"
        else:
            text = self.helpers.bitcast(cs, cd) + f"({value})"
        if dst.is_integer and dst.bits < 8:
            text = f"(({self.scalar_ctype(dst)}){wrap_int(dst, text)})"
        return text

    def expr_Select(self, e: E.Select) -> str:
        cond = e.condition
        if e.dtype.lanes == 1 or cond.dtype.lanes == 1 or isinstance(cond, E.Broadcast):
            c = self.expr(cond.value if isinstance(cond, E.Broadcast) and e.dtype.lanes > 1
                          else cond)
            t, f = self.expr(e.true_value), self.expr(e.false_value)
            if e.dtype.lanes > 1 and not e.dtype.is_bool:
                # both arms in the one vector type: a load is the unaligned ``_u`` twin type,
                # and ``?:`` rejects arms of different types
                vt = self.helpers.vec(self.compute_dtype(e.dtype), e.dtype.lanes)
                t, f = f"(({vt}){t})", f"(({vt}){f})"
            return f"({c} ? {t} : {f})"
        dt = e.dtype
        if dt.is_bool:
            bits = self.mask_bits(e.true_value)
            m = self.to_mask(cond, bits)
            t, f = self.to_mask(e.true_value, bits), self.to_mask(e.false_value, bits)
            return f"(({m} & {t}) | (~{m} & {f}))"
        el = self.compute_dtype(dt)
        fn = self.helpers.select(el, dt.lanes)
        m = self.to_mask(cond, el.bits)
        return f"{fn}({m}, {self.expr(e.true_value)}, {self.expr(e.false_value)})"

    # ---- casts ----------------------------------------------------------------------------
    def expr_Cast(self, e: E.Cast) -> str:
        src, dst = e.value.dtype, e.dtype
        if dst.lanes != src.lanes:
            raise CodegenError(f"cast from {src} to {dst} changes the number of lanes")
        if dst.lanes > 1:
            return self._vector_cast(e)
        v = self.expr(e.value)
        if dst.is_bool:
            return f"({v} != 0)"
        if self.widened(dst):
            if src.element == dst.element:
                return v
            return f"kiln_{self.helpers.soft_float(dst)}_round((float)({v}))"
        if dst.is_integer and dst.bits < 8:
            return f"(({self.scalar_ctype(dst)}){wrap_int(dst, f'(int64_t)({v})')})"
        return f"(({self.scalar_ctype(dst)})({v}))"

    def float32_value(self, e: E.PrimExpr) -> str:
        """``e`` (a number, scalar or vector) as float32 C value(s), for a store that rounds to
        float16/bfloat16 itself: a cast to that type is skipped (rounding twice is rounding
        once)."""
        if isinstance(e, E.Cast) and self.widened(e.dtype):
            e = e.value
        code = self.expr(e)
        if e.dtype.is_bool:
            code = self.expr(E.Cast(F32.with_lanes(e.dtype.lanes), e))
        elif self.compute_dtype(e.dtype) != F32:
            if e.dtype.lanes == 1:
                code = f"((float)({code}))"
            else:
                code = f"__builtin_convertvector({code}, {self.helpers.vec(F32, e.dtype.lanes)})"
        return code

    def _vector_cast(self, e: E.Cast) -> str:
        src, dst = e.value.dtype, e.dtype
        if dst.is_bool:
            if src.is_bool:
                return self.expr(e.value)
            zero = f"({self.vec_type(src)}){{0}}"
            return f"({self.expr(e.value)} != {zero})"
        target = self.vec_type(dst)
        if src.is_bool:
            # masks are -1/0; negate to 1/0 before converting.
            m = self.expr(e.value)
            return f"__builtin_convertvector(-{m}, {target})"
        v = self.expr(e.value)
        if dst.is_integer and dst.bits < 8:  # wrap from 32 bits: exact for any int32 value
            if src.is_float:
                i32 = self.helpers.vec(DataType("int32"), dst.lanes)
                v = f"__builtin_convertvector({v}, {i32})"
            v = wrap_int(dst, v)
        if self.compute_dtype(src) != self.compute_dtype(dst) or dst.is_integer and dst.bits < 8:
            v = f"__builtin_convertvector({v}, {target})"
        if self.widened(dst) and src.element != dst.element:
            v = f"{self.helpers.lowp_round(dst, dst.lanes)}({v})"
        return v

    # ---- vectors --------------------------------------------------------------------------
    def expr_Broadcast(self, e: E.Broadcast) -> str:
        v = e.value
        if v.dtype.is_bool:
            fn = self.helpers.broadcast(DataType("int32"), e.lanes)
            return f"{fn}(-(int32_t)({self.expr(v)}))"
        fn = self.helpers.broadcast(self.compute_dtype(v.dtype), e.lanes)
        return f"{fn}({self.expr(v)})"

    def expr_Ramp(self, e: E.Ramp) -> str:
        el = self.compute_dtype(e.base.dtype)
        vt = self.helpers.vec(el, e.lanes)
        base = self.expr_Broadcast(E.Broadcast(e.base, e.lanes))
        if isinstance(e.stride, E.IntImm):
            offs = ", ".join(int_literal(k * e.stride.value, el) for k in range(e.lanes))
            return f"({base} + ({vt}){{{offs}}})"
        iota = ", ".join(str(k) for k in range(e.lanes))
        stride = self.expr_Broadcast(E.Broadcast(e.stride, e.lanes))
        return f"({base} + ({vt}){{{iota}}} * {stride})"

    # ---- memory ---------------------------------------------------------------------------
    def vector_ref(self, vt: str, buffer: Buffer, base: E.PrimExpr, lanes: int, itemsize: int
                   ) -> str:
        """``*(T*)(ptr + base)``: the ``lanes``-wide vector of type ``vt`` stored at element
        ``base`` of ``buffer``, through the aligned twin type (``vt_a``) where the address is
        provably a multiple of the vector's size, else through the unaligned one."""
        size = lanes * itemsize
        aligned = (buffer.data in self.aligned_data and size & (size - 1) == 0
                   and size <= 64 and self._multiple_of(base, lanes))
        return f"*({vt}_{'a' if aligned else 'u'}*)({self.buffer_ptr(buffer)} + {self.expr(base)})"

    def _multiple_of(self, e: E.PrimExpr, n: int) -> bool:
        if isinstance(e, E.IntImm):
            return e.value % n == 0
        if self.analyzer is None:
            return False
        zero = E.IntImm(e.dtype, 0)
        return self.analyzer.can_prove(E.EQ(E.FloorMod(e, E.IntImm(e.dtype, n)), zero))

    def contiguous_base(self, index: E.PrimExpr) -> E.PrimExpr | None:
        if (isinstance(index, E.Ramp) and isinstance(index.stride, E.IntImm)
                and index.stride.value == 1):
            return index.base
        return None

    def expr_BufferLoad(self, e: E.BufferLoad) -> str:
        if len(e.indices) != 1:
            raise CodegenError(
                f"load from {e.buffer.name} has {len(e.indices)} indices: lower (flatten) the "
                f"function before code generation"
            )
        ptr = self.buffer_ptr(e.buffer)
        idx = e.indices[0]
        el = e.buffer.dtype.element
        if e.dtype.lanes == 1:
            raw = f"{ptr}[{self.expr(idx)}]"
            if el.is_bool:
                return f"({raw} != 0)"
            if self.widened(el):
                return self.widen_scalar(el, raw)
            if el.is_int and el.bits < 8:  # stored zero-extended: sign-extend
                return f"(({self.scalar_ctype(el)}){wrap_int(el, raw)})"
            return raw
        lanes = e.dtype.lanes
        if self.widened(el):
            return self._widened_vector_load(e, ptr, idx)
        storage_el = DataType("uint8") if el.is_bool else self.compute_dtype(el)
        vt = self.helpers.vec(storage_el, lanes)
        base = self.contiguous_base(idx)
        if base is not None:
            raw = f"({self.vector_ref(vt, e.buffer, base, lanes, storage_el.itemsize)})"
        elif isinstance(idx, E.Broadcast):
            fn = self.helpers.broadcast(storage_el, lanes)
            raw = f"{fn}({ptr}[{self.expr(idx.value)}])"
        else:
            it = self.ctype_of(idx)
            fn = self.helpers.lanewise(
                f"gather_{vt}_{it}", vt, [f"const {self.storage_ctype(el)}*", it], lanes,
                "a0[a1[l]]",
            )
            raw = f"{fn}({ptr}, {self.expr(idx)})"
        if el.is_bool:
            return f"({raw} != ({vt}){{0}})"
        if el.is_int and el.bits < 8:
            return wrap_int(el, raw)
        return raw

    def widen_scalar(self, el: DataType, raw: str) -> str:
        """A soft float's storage bits (float16/bfloat16/float8...) as a float."""
        return f"kiln_{self.helpers.soft_float(el)}_to_f32({raw})"

    def narrow_scalar(self, el: DataType, value: str) -> str:
        """A float value rounded to a soft float's storage bits (nearest even)."""
        return f"kiln_f32_to_{self.helpers.soft_float(el)}({value})"

    def _widened_vector_load(self, e: E.BufferLoad, ptr: str, idx: E.PrimExpr) -> str:
        el, lanes = e.buffer.dtype.element, e.dtype.lanes
        base = self.contiguous_base(idx)
        if base is not None:
            return f"{self.helpers.lowp_load(el, lanes)}({ptr} + {self.expr(base)})"
        if isinstance(idx, E.Broadcast):
            fn = self.helpers.broadcast(F32, lanes)
            return f"{fn}({self.widen_scalar(el, f'{ptr}[{self.expr(idx.value)}]')})"
        vt = self.helpers.vec(F32, lanes)
        it = self.ctype_of(idx)
        lane = self.widen_scalar(el, "a0[a1[l]]")
        fn = self.helpers.lanewise(f"gather_{el}_{vt}_{it}", vt,
                                   [f"const {self.storage_ctype(el)}*", it], lanes, lane)
        return f"{fn}({ptr}, {self.expr(idx)})"

    # ---- calls ----------------------------------------------------------------------------
    def expr_Call(self, e: E.Call) -> str:
        if e.op in externs.EXTERN_OPS:  # tensor intrinsics: C helpers and buffer addresses
            return externs.emit(self, e)
        if e.op not in E.INTRINSICS:
            raise CodegenError(f"unknown intrinsic {e.op!r}")
        if e.op == "reinterpret":
            return self._reinterpret(e)
        if e.op == "check_index":
            return self._check_index(e)
        if e.op == "rounded":  # any lanes: the barrier takes vectors too
            return f"{self.helpers.rounded()}({self.expr(e.args[0])})"
        if e.op == "fresh_seed":
            if e.dtype != DataType("uint64"):
                raise CodegenError(f"fresh_seed gives uint64, not {e.dtype}")
            return f"{self.helpers.fresh_seed()}()"
        if e.dtype.lanes > 1:
            return self._vector_call(e)
        return self.scalar_call(e.op, e.dtype, [self.expr(a) for a in e.args],
                                [a.dtype for a in e.args])

    def _check_index(self, e: E.Call) -> str:
        """``kiln_check_index(kiln_chk, v, lo, n, what)``: the kernel's check record is in
        scope wherever a check is (see ``FunctionEmitter.emit``)."""
        value, lo, n, what = e.args
        if e.dtype.lanes != 1 or not isinstance(what, E.StringImm):
            raise CodegenError(f"check_index takes scalars and a message, got {e}")
        self.helpers.use("check")
        args = ", ".join(self.expr(a) for a in (value, lo, n))
        return f"kiln_check_index(kiln_chk, {args}, {c_string(what.value)})"

    def scalar_call(self, op: str, dt: DataType, args: list[str],
                    arg_types: list[DataType]) -> str:
        """C for a scalar intrinsic call on already printed arguments."""
        at = arg_types[0]
        if op in E.SPECIAL_FUNCTIONS:  # float64 helpers (tir.special casts to float64 around)
            if dt != DataType("float64") or any(t != dt for t in arg_types):
                raise CodegenError(f"special function {op} takes and gives float64, got "
                                   f"{[str(t) for t in arg_types]} -> {dt}")
            return f"{self.helpers.special_function(op)}({', '.join(args)})"
        if op in ("isnan", "isinf"):
            a = args[0] if at.is_float and at.bits != 16 else f"(float)({args[0]})"
            if not at.is_float:
                return "0"
            return f"({op}({a}) != 0)"
        if dt.is_integer:
            # integer math through double (pow on ints, floor of an int...)
            conv = ", ".join(f"(double)({a})" for a in args)
            if op in ("rsqrt", "sigmoid"):
                inner = self.scalar_call(op, DataType("float64"), [conv], [DataType("float64")])
            else:
                inner = f"{LIBM[op]}({conv})"
            return f"(({value_ctype(dt)}){inner})"
        wide = dt.bits == 64
        suffix = "" if wide else "f"
        if is_low_float(dt):  # evaluated in float32
            args = [f"(float)({a})" for a in args]
        if op in ("rsqrt", "sigmoid"):
            fn = self.helpers.scalar_intrinsic(op, DataType("float64" if wide else "float32"))
            text = f"{fn}({args[0]})"
        else:
            text = f"{LIBM[op]}{suffix}({', '.join(args)})"
        if is_low_float(dt) and not self.widened(dt):
            return f"((_Float16){text})"
        return text

    def _vector_call(self, e: E.Call) -> str:
        dt = e.dtype
        lanes = dt.lanes
        if e.op == "fabs" and dt.is_float:
            vt = self.vec_type(dt)
            bits = self.lane_bits(dt)
            mt = self.mask_type(bits, lanes)
            sign = {16: "0x7fff", 32: "0x7fffffff"}.get(bits, "0x7fffffffffffffffLL")
            return f"(({vt})(({mt}){self.expr(e.args[0])} & {sign}))"
        elem_types = [a.dtype.element for a in e.args]
        arg_ctypes = [self.ctype_of(a) for a in e.args]
        lane_args = [f"a{i}[l]" for i in range(len(e.args))]
        if dt.is_bool:
            ret = self.mask_type(self.mask_bits(e), lanes)
            lane = f"-({self.scalar_call(e.op, dt.element, lane_args, elem_types)})"
        else:
            ret = self.vec_type(dt)
            lane = self.scalar_call(e.op, dt.element, lane_args, elem_types)
        fn = self.helpers.lanewise(f"{e.op}_{ret}", ret, arg_ctypes, lanes, lane)
        return f"{fn}({', '.join(self.expr(a) for a in e.args)})"

    # ---- let --------------------------------------------------------------------------------
    def expr_Let(self, e: E.Let) -> str:
        name = self.define_var(e.var)
        if e.var.dtype.lanes > 1 and e.var.dtype.is_bool:
            self.var_mask_bits[e.var] = self.mask_bits(e.value)
        ct = self.ctype_of(e.value)
        return f"({{ {ct} {name} = {self.expr(e.value)}; {self.expr(e.body)}; }})"

    def define_var(self, v: E.Var) -> str:  # pragma: no cover - provided by the subclass
        raise NotImplementedError

    def expr_Reduce(self, e: E.Reduce) -> str:
        raise CodegenError("Reduce expressions must be lowered to blocks before codegen")
