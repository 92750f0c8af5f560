"""``build``: PrimFuncs -> one C file -> compiled, cached, loaded :class:`~kiln.runtime.Module`.

The file starts with ``kiln.ir.abi.c_header()`` (the DLTensor structs, never restated here),
then the C library includes, libmvec vector-variant declarations for the libm functions the
code uses, the error-reporting support, the vector typedefs and helpers the functions need and
the prototypes of every function's entries. That prelude is followed by compilation units
(separated by :data:`~kiln.codegen.c.compiler.UNIT_MARK` lines): the error buffer's
definition, kiln's thread pool (``thread_pool.py``), then per function its unchecked entry
(with the static functions it calls) followed by its checked entry, then the extra source.
The file is one valid C file; a large one is compiled in pieces in parallel
(:func:`~kiln.codegen.c.compiler.compile_source`).
"""

from __future__ import annotations

import re
from collections.abc import Iterator, Mapping
from typing import Any

from ... import progress
from ...arith import Analyzer
from ...ir.abi import c_header
from ...ir.errors import CodegenError, KilnError
from ...runtime.module import FunctionInfo, Module, ParamInfo
from ...target.target import Target
from ...tir.expr import IntImm
from ...tir.function import PrimFunc
from ...tir.transform.lower import is_lowered, lower
from . import externs, thread_pool
from .compiler import UNIT_MARK, compile_source, libmvec_functions, supports_float16
from .entry import checked_signature, dim_text, emit_checked_entry
from .func import FunctionEmitter, FunctionSignature, unchecked_signature
from .helpers import ENTRY_SUPPORT, ERROR_BUFFER, Helpers
from .names import NameTable

INCLUDES = "#include <math.h>\n#include <stdarg.h>\n#include <stdio.h>\n#include <stdlib.h>\n"
#: First line of every file: the thread pool asks glibc for the CPUs the process may use.
FEATURES = "#ifndef _GNU_SOURCE\n#define _GNU_SOURCE\n#endif\n"


def _make_analyzer() -> Any:
    return Analyzer()


def _mvec_declarations(code: str) -> str:
    decls = []
    called = set(re.findall(r"\b(\w+)\(", code))  # one scan, not one per libm function
    for fn in sorted(libmvec_functions()):
        for name, ct in ((fn + "f", "float"), (fn, "double")):
            if name in called:
                params = f"{ct}, {ct}" if fn == "pow" else ct
                decls.append(f"{ct} {name}({params}) __attribute__((__simd__(\"notinbranch\")));")
    if not decls:
        return ""
    return ("/* libm functions with vector variants in libmvec (glibc only declares them so "
            "under -ffast-math) */\n" + "\n".join(decls) + "\n")


def function_info(name: str, symbol: str, func: PrimFunc, signature: FunctionSignature
                  ) -> FunctionInfo:
    """The metadata callers need of a generated function (shared with the GPU backend)."""
    params = []
    for p, buf in signature.params:
        if buf is None:
            params.append(ParamInfo(p.name, (), p.dtype, True))
        else:
            shape = tuple(d.value if isinstance(d, IntImm) else dim_text(d) for d in buf.shape)
            params.append(ParamInfo(buf.name, shape, buf.dtype))
    num_outputs = func.attrs.get("num_outputs")
    return FunctionInfo(
        name=name,
        symbol=symbol,
        unchecked_symbol=symbol + "_unchecked",
        params=tuple(params),
        sym_vars=tuple(v.name for v in signature.sym_vars),
        num_outputs=int(num_outputs) if num_outputs is not None else None,
    )


def lowered_functions(funcs: Mapping[str, PrimFunc], target: Target
                      ) -> Iterator[tuple[str, PrimFunc]]:
    """``(name, func)`` of each function, lowered for ``target`` when it is not yet (shared
    with the GPU backend)."""
    for name, func in funcs.items():
        if not isinstance(func, PrimFunc):
            raise CodegenError(f"{name}: expected a tir.PrimFunc, got {type(func).__name__}")
        yield name, func if is_lowered(func) else lower(func, target)


def native_float16(target: Any = None) -> bool:
    """Whether float16 is computed natively (``_Float16`` arithmetic) for ``target``: the
    target has AVX512-FP16 and the C compiler knows ``_Float16``. Otherwise float16, like
    bfloat16, is stored in 16 bits and computed in float32."""
    tgt = Target.create(target)
    return tgt.has_fp16 and supports_float16()


def generate_source(funcs: Mapping[str, PrimFunc], target: Any = None, extra_source: str = ""
                    ) -> tuple[str, dict[str, FunctionInfo]]:
    """The C source for ``funcs`` (lowered first when needed) and each function's metadata.

    ``extra_source`` is appended after all functions (e.g. a whole-model entry that calls the
    ``*_unchecked`` entries; it may use the static helpers such as ``kiln_fail``), as a
    compilation unit of its own.
    """
    tgt = Target.create(target)
    helpers = Helpers(native_fp16=native_float16(tgt))
    symbols = NameTable()
    bodies: list[str] = []
    infos: dict[str, FunctionInfo] = {}
    stage = progress.Stage("lowering kernels and generating C", len(funcs))
    for name, func in lowered_functions(funcs, tgt):
        symbol = symbols.get(name)
        while symbol + "_unchecked" in symbols.used:
            symbol = symbols.get(name)
        symbols.reserve(symbol + "_unchecked")
        emitter = FunctionEmitter(func, name, symbol, helpers, tgt.num_threads, _make_analyzer())
        try:
            unchecked = emitter.emit()
        except KilnError:
            raise
        except Exception as err:
            raise CodegenError(f"{name}: C code generation failed: {err}") from err
        checked = emit_checked_entry(name, symbol, emitter.signature, helpers)
        bodies.append(unchecked + "\n" + checked)
        infos[name] = function_info(name, symbol, func, emitter.signature)
        stage.step(len(infos))
    stage.finish()
    support = helpers.render()
    code = support + "\n".join(bodies)
    prototypes = ["/* every function's entries (units call each other's: the model entry) */"]
    for info in infos.values():
        prototypes += [unchecked_signature(info.symbol) + ";",
                       checked_signature(info.symbol) + ";"]
    prelude = "\n".join([
        FEATURES + c_header(),
        INCLUDES,
        _mvec_declarations(code + extra_source),
        ENTRY_SUPPORT.strip("\n") + "\n",
        thread_pool.DECLARATIONS.strip("\n") + "\n",
        support,
        "\n".join(prototypes) + "\n",
    ])
    units = [ERROR_BUFFER, thread_pool.SOURCE, *bodies] + ([extra_source] if extra_source else [])
    source = prelude + "".join(f"\n{UNIT_MARK}\n{u}" for u in units)
    return source, infos


def build(funcs: Mapping[str, PrimFunc] | PrimFunc, target: Any = None,
          extra_source: str = "") -> Module:
    """Generate, compile (cached) and load the C code of ``funcs`` (see the module docstring).

    ``funcs`` maps names to PrimFuncs (an IRModule's PrimFuncs also work); a single PrimFunc is
    named after its ``global_symbol`` attribute. Functions not lowered yet are lowered here.
    ``extra_source`` is C code appended to the file (see :func:`generate_source`).
    """
    if isinstance(funcs, PrimFunc):
        funcs = {str(funcs.attrs.get("global_symbol", "main")): funcs}
    elif not isinstance(funcs, Mapping):
        items = getattr(funcs, "items", None)
        if items is None:
            raise CodegenError(f"build expects a dict of PrimFuncs, got {type(funcs).__name__}")
        funcs = {k: v for k, v in items() if isinstance(v, PrimFunc)}
    tgt = Target.create(target)
    source, infos = generate_source(funcs, tgt, extra_source)
    externs.before_load(source, tgt)  # e.g. AMX permission (tensor intrins)
    result = compile_source(source, march=tgt.mcpu)
    try:
        return Module(result.lib_path, source, infos, result.source_path, result.from_cache)
    except KilnError:
        if not result.from_cache:
            raise
        # A damaged cache entry: rebuild it once.
        result = compile_source(source, force=True, march=tgt.mcpu)
        return Module(result.lib_path, source, infos, result.source_path, False)
