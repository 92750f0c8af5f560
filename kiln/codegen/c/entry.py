"""The checked entry ``int32_t NAME(DLTensor** args, int32_t num_args)`` of a function.

It validates everything the unchecked body relies on before touching memory, in two passes:

1. per argument (``kiln_check_arg``): not NULL, on the CPU, the expected ``ndim`` and dtype
   (code, bits, lanes); symbolic dimensions are bound from their first plain occurrence (see
   :func:`.func.analyze_signature`);
2. per argument (``kiln_check_shape``): every dimension (constants, bound variables,
   expressions of them), strides (NULL, or compact row-major, or the buffer's declared
   strides) and a non-NULL data pointer.

A failure stores a message naming the function, the argument index and buffer name and both
the expected and actual value (``"add: argument 1 (B): expected shape (4, 8) but got (4, 9)"``)
for ``kiln_last_error()`` and returns -1. On success the data pointers (``data + byte_offset``)
and the bound dimensions are handed to ``NAME_unchecked``, whose result it returns (0, or
``KILN_CHECK_FAILED`` when a check inside the kernel failed).
"""

from __future__ import annotations

from ...ir.errors import CodegenError
from ...runtime.ndarray import dl_dtype_fields
from ...tir import expr as E
from ...tir.buffer import Buffer
from .expr import ExprEmitter
from .func import FunctionSignature
from .helpers import Helpers
from .types import c_string


def dim_text(dim: E.PrimExpr) -> str:
    """How a dimension reads in messages and metadata (``8``, ``n``, ``n * 2``)."""
    if isinstance(dim, E.IntImm):
        return str(dim.value)
    if isinstance(dim, E.Var):
        return dim.name
    try:
        return str(dim)
    except Exception:  # noqa: BLE001 - a message must never fail
        return "?"


def shape_text(shape: tuple[E.PrimExpr, ...]) -> str:
    inner = ", ".join(dim_text(d) for d in shape)
    return f"({inner},)" if len(shape) == 1 else f"({inner})"


class _SymEmitter(ExprEmitter):
    """Prints shape expressions with symbolic variables read from the ``sym`` array."""

    def define_var(self, v: E.Var) -> str:  # pragma: no cover - shapes define no variables
        raise CodegenError("shape expressions cannot bind variables")


def checked_signature(symbol: str) -> str:
    """The C declarator of a function's checked entry."""
    return f"int32_t {symbol}(DLTensor** args, int32_t num_args)"


def emit_checked_entry(name: str, symbol: str, sig: FunctionSignature, helpers: Helpers) -> str:
    n = len(sig.params)
    ex = _SymEmitter(helpers)
    for k, v in enumerate(sig.sym_vars):
        ex.var_names[v] = f"sym[{k}]"
    lines: list[str] = []

    def line(depth: int, text: str) -> None:
        lines.append("  " * depth + text)

    sig_text = ", ".join(
        f"{buf.name} {buf.dtype} {shape_text(buf.shape)}" if buf is not None
        else f"{p.name} {p.dtype} scalar" for p, buf in sig.params
    )
    lines.append(f"/* {name}: checked entry. Arguments: {sig_text.replace('*/', '* /')} */")
    lines.append(f"{checked_signature(symbol)} {{")
    line(1, f"void* data[{max(n, 1)}];")
    if sig.sym_vars:
        line(1, f"int64_t sym[{len(sig.sym_vars)}];")
    line(1, f"if (num_args != {n}) {{")
    line(2, f"return kiln_fail({_fmt(f'{name}: expected {n} arguments but got ', '%d')}, "
            f"(int)num_args);")
    line(1, "}")
    if n:
        line(1, f"if (args == NULL) return kiln_fail({_fmt(f'{name}: argument array is NULL')});")
    wheres = [c_string(f"{name}: argument {i} ({buf.name if buf is not None else p.name})")
              for i, (p, buf) in enumerate(sig.params)]

    # ---- pass 1: device, rank, dtype of each argument; bind symbolic dims -------------------
    bound: set[E.Var] = set()
    for i, (p, buf) in enumerate(sig.params):
        dtype = buf.dtype if buf is not None else p.dtype
        ndim = len(buf.shape) if buf is not None else 0
        code, bits, lanes = dl_dtype_fields(dtype)
        line(1, f"if (kiln_check_arg(args[{i}], {wheres[i]}, {ndim}, {code}, {bits}, {lanes}, "
                f"{c_string(str(dtype))})) return -1;")
        if buf is None:
            continue
        for d, dim in enumerate(buf.shape):
            if isinstance(dim, E.Var) and dim not in bound:
                line(1, f"sym[{sig.sym_vars.index(dim)}] = args[{i}]->shape[{d}];  "
                        f"/* {dim.name} */")
                bound.add(dim)
        if buf.strides:
            _bind_strides(line, f"args[{i}]", buf, sig, bound)

    # ---- pass 2: shapes, strides and data pointers -----------------------------------------
    for i, (_p, buf) in enumerate(sig.params):
        t = f"args[{i}]"
        if buf is None or not buf.shape:
            line(1, f"if (kiln_check_shape({t}, {wheres[i]}, 0, NULL, NULL, NULL)) return -1;")
        else:
            nd = len(buf.shape)
            line(1, "{")
            line(2, f"/* {buf.name}: {buf.dtype} {shape_text(buf.shape)} */")
            exp = ", ".join(ex.expr(d) for d in buf.shape)
            line(2, f"const int64_t shape[{nd}] = {{{exp}}};")
            names = "NULL"
            if not all(isinstance(d, E.IntImm) for d in buf.shape):
                items = ", ".join(
                    "NULL" if isinstance(d, E.IntImm) else c_string(dim_text(d))
                    for d in buf.shape
                )
                line(2, f"static const char* const names[{nd}] = {{{items}}};")
                names = "names"
            strides = "NULL"
            if buf.strides:
                items = ", ".join(ex.expr(st) for st in buf.strides)
                line(2, f"const int64_t strides[{nd}] = {{{items}}};")
                strides = "strides"
            line(2, f"if (kiln_check_shape({t}, {wheres[i]}, {nd}, shape, {names}, {strides})) "
                    f"return -1;")
            line(1, "}")
        line(1, f"data[{i}] = kiln_data({t});")
    sym_arg = "sym" if sig.sym_vars else "NULL"
    line(1, f"return {symbol}_unchecked(data, {sym_arg});")
    lines.append("}")
    return "\n".join(lines) + "\n"


def _fmt(text: str, spec: str = "") -> str:
    """A printf format string: ``text`` with ``%`` escaped, then the conversion ``spec``."""
    return c_string(text, printf=True)[:-1] + spec + '"'


def _bind_strides(line, t: str, buf: Buffer, sig: FunctionSignature, bound: set) -> None:
    """Bind symbolic strides (from the array's strides, or the compact ones when NULL)."""
    nd = len(buf.shape)
    for d, st in enumerate(buf.strides):
        if isinstance(st, E.Var) and st not in bound:
            compact = " * ".join(f"{t}->shape[{k}]" for k in range(d + 1, nd)) or "1"
            line(1, f"sym[{sig.sym_vars.index(st)}] = {t}->strides ? {t}->strides[{d}] : "
                    f"({compact});  /* {st.name} */")
            bound.add(st)
