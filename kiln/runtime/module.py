"""Loading and calling a compiled native module (a shared library made by a code generator).

A :class:`Module` wraps one shared library together with the metadata of its functions
(:class:`FunctionInfo`: parameter names, shapes, dtypes, the order of symbolic dimensions). Per
function ``name`` the library exports (see docs/internals.md)

- ``int32_t <symbol>(DLTensor** args, int32_t num_args)``: the checked entry; -1 on a bad
  argument, ``kiln.ir.abi.CHECK_FAILED`` when a check inside the kernel failed (an index out of
  range), with the message readable through ``const char* kiln_last_error(void)``;
- ``int32_t <unchecked_symbol>(void** data, const int64_t* sym)``: raw data pointers in
  parameter order, and the symbolic dimensions in the order of :attr:`FunctionInfo.sym_vars`
  (NULL when there are none); 0 or ``CHECK_FAILED``. Scalar parameters are passed as a pointer
  to the value.

``symbol`` is ``name`` made into a C identifier (a suffix is added when it would clash with a C
library name), ``unchecked_symbol`` is ``symbol + "_unchecked"``.

``mod[name](*arrays)`` calls the checked entry; arguments are numpy arrays or objects with
``__dlpack__`` (outputs are passed like inputs and written in place), Python numbers for scalar
parameters. A rejected argument raises :class:`kiln.ir.ArgumentError` with the native message,
a failed check :class:`kiln.ir.RuntimeCheckError`.
The library stays loaded as long as the Module or any function taken from it is referenced.
"""

from __future__ import annotations

import ctypes
from dataclasses import dataclass
from typing import Any

from ..ir.abi import CHECK_FAILED
from ..ir.dtype import DataType
from ..ir.errors import ArgumentError, KilnError, RuntimeCheckError
from .ndarray import DLTensorArg, as_dltensor

# ``DLTensor**`` is passed as an array of addresses (cheaper than ctypes pointer objects).
CHECKED_SIGNATURE = (ctypes.c_int32, (ctypes.c_void_p, ctypes.c_int32))
UNCHECKED_ARGTYPES = (ctypes.POINTER(ctypes.c_void_p), ctypes.POINTER(ctypes.c_int64))


@dataclass(frozen=True)
class ParamInfo:
    """One parameter of a native function.

    ``shape`` holds ints for constant dimensions and the text of the expression (usually a
    variable name such as ``"n"``) for symbolic ones. A scalar parameter has ``shape == ()``
    and ``is_scalar`` set; it is passed as a 0-d array.
    """

    name: str
    shape: tuple[int | str, ...]
    dtype: DataType
    is_scalar: bool = False


@dataclass(frozen=True)
class FunctionInfo:
    """What a caller needs to know to call a native function (see the module docstring)."""

    name: str
    symbol: str
    unchecked_symbol: str
    params: tuple[ParamInfo, ...]
    sym_vars: tuple[str, ...] = ()
    num_outputs: int | None = None

    @property
    def num_params(self) -> int:
        return len(self.params)


class Function:
    """A callable native function of a :class:`Module` (keeps the module alive)."""

    def __init__(self, module: Module, info: FunctionInfo):
        self.module = module
        self.info = info
        self._fn = getattr(module.lib, info.symbol)
        self._fn.restype, self._fn.argtypes = CHECKED_SIGNATURE

    @property
    def name(self) -> str:
        return self.info.name

    def __call__(self, *args: Any) -> None:
        info = self.info
        if len(args) != len(info.params):
            raise ArgumentError(
                f"{info.name}: expected {len(info.params)} arguments but got {len(args)}"
            )
        holders: list[DLTensorArg] = []
        for i, (arg, p) in enumerate(zip(args, info.params)):
            what = f"{info.name}: argument {i} ({p.name})"
            holders.append(as_dltensor(arg, what, p.dtype if p.is_scalar else None))
        n = len(holders)
        argv = (ctypes.c_void_p * max(n, 1))(*[h.address for h in holders])
        rc = self._fn(argv, n)
        if rc != 0:
            error = RuntimeCheckError if rc == CHECK_FAILED else ArgumentError
            raise error(self.module.last_error() or f"{info.name}: failed (code {rc})")
        first_out = 0 if info.num_outputs is None else n - info.num_outputs
        for h in holders[first_out:]:
            h.writeback()

    def __repr__(self) -> str:
        return f"<kiln native function {self.info.name}>"


class Module:
    """A loaded shared library of generated kernels (see the module docstring).

    ``lib_path`` is the shared library, ``source`` the generated source text and
    ``source_path`` where it was written; ``from_cache`` tells whether the library came from
    the build cache instead of a fresh compile. ``keep_alive`` is held as long as the module
    (the open in-memory file a library was loaded from, when the cache was read-only).
    """

    def __init__(self, lib_path: str, source: str, functions: dict[str, FunctionInfo],
                 source_path: str | None = None, from_cache: bool = False,
                 keep_alive: Any = None):
        self.lib_path = str(lib_path)
        self.keep_alive = keep_alive
        self.source = source
        self.source_path = source_path
        self.from_cache = from_cache
        self.functions = dict(functions)
        try:
            self.lib = ctypes.CDLL(self.lib_path)
        except OSError as err:
            raise KilnError(f"cannot load native module {self.lib_path}: {err}") from err
        self._last_error = self.lib.kiln_last_error
        self._last_error.restype = ctypes.c_char_p
        self._last_error.argtypes = ()
        self._cache: dict[str, Function] = {}

    @property
    def function_names(self) -> list[str]:
        return list(self.functions)

    def __contains__(self, name: str) -> bool:
        return name in self.functions

    def info(self, name: str) -> FunctionInfo:
        try:
            return self.functions[name]
        except KeyError:
            raise KilnError(
                f"module has no function {name!r} (it has: {', '.join(self.functions)})"
            ) from None

    def get_function(self, name: str) -> Function:
        fn = self._cache.get(name)
        if fn is None:
            fn = self._cache[name] = Function(self, self.info(name))
        return fn

    __getitem__ = get_function

    def last_error(self) -> str:
        """The message of the last failed checked call on this thread."""
        raw = self._last_error()
        return raw.decode("utf-8", "replace") if raw else ""

    def checked_address(self, name: str) -> int:
        """Address of the checked entry ``int32_t f(DLTensor**, int32_t)``."""
        return ctypes.cast(getattr(self.lib, self.info(name).symbol), ctypes.c_void_p).value

    def unchecked_address(self, name: str) -> int:
        """Address of the unchecked entry ``int32_t f(void** data, const int64_t* sym)``."""
        sym = self.info(name).unchecked_symbol
        return ctypes.cast(getattr(self.lib, sym), ctypes.c_void_p).value

    def unchecked_function(self, name: str) -> Any:
        """The unchecked entry as a ctypes function (no argument checks: use with care)."""
        fn = getattr(self.lib, self.info(name).unchecked_symbol)
        fn.restype, fn.argtypes = ctypes.c_int32, UNCHECKED_ARGTYPES
        return fn

    def __repr__(self) -> str:
        return f"<kiln Module {self.lib_path} functions={self.function_names}>"


__all__ = ["Function", "FunctionInfo", "Module", "ParamInfo"]
