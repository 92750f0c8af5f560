"""The C backend: lowered PrimFuncs -> readable C (GCC vector types, kiln's thread pool) ->
native module.

``build(funcs, target) -> kiln.runtime.Module``; ``generate_source`` gives the C text alone.
See docs/internals.md ("kiln.tir.transform (lowering) and kiln.codegen.c") for the ABI.
"""

from .build import build, generate_source, native_float16
from .compiler import cache_dir, compile_source, find_compiler, supports_float16

__all__ = ["build", "cache_dir", "compile_source", "find_compiler", "generate_source",
           "native_float16", "supports_float16"]
