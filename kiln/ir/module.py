"""IRModule: a named collection of graph functions and TIR PrimFuncs."""

from __future__ import annotations

from collections.abc import Iterator, Mapping
from typing import Any

from .errors import KilnError
from .node import printer_of


class IRModule:
    """Functions by name. Graph functions call PrimFuncs through ``GlobalVar``s of this module.

    A module is a container: ``mod[name] = func`` adds or replaces a function, but passes build
    new modules (``mod.copy()`` / :meth:`with_function`) rather than editing their input.
    """

    def __init__(self, functions: Mapping[Any, Any] | None = None, attrs: dict | None = None):
        self._funcs: dict[str, Any] = {}
        self.attrs: dict[str, Any] = dict(attrs or {})
        for key, func in (functions or {}).items():
            self[key] = func

    @staticmethod
    def _name(key: Any) -> str:
        return key if isinstance(key, str) else key.name_hint

    def __getitem__(self, key: Any) -> Any:
        name = self._name(key)
        if name not in self._funcs:
            raise KilnError(f"IRModule has no function named {name!r}")
        return self._funcs[name]

    def __setitem__(self, key: Any, func: Any) -> None:
        self._funcs[self._name(key)] = func

    def __delitem__(self, key: Any) -> None:
        del self._funcs[self._name(key)]

    def __contains__(self, key: Any) -> bool:
        return self._name(key) in self._funcs

    def __iter__(self) -> Iterator[str]:
        return iter(self._funcs)

    def __len__(self) -> int:
        return len(self._funcs)

    def items(self):
        return self._funcs.items()

    @property
    def functions(self) -> dict[str, Any]:
        return dict(self._funcs)

    def copy(self) -> IRModule:
        return IRModule(self._funcs, self.attrs)

    def with_function(self, name: str, func: Any) -> IRModule:
        new = self.copy()
        new[name] = func
        return new

    def without(self, name: str) -> IRModule:
        new = self.copy()
        del new[name]
        return new

    def script(self) -> str:
        parts = []
        for name, func in self._funcs.items():
            layer = "kiln.tir" if type(func).__module__.startswith("kiln.tir") else "kiln.graph"
            printer = printer_of(layer)
            body = printer(func, name=name) if printer else repr(func)
            parts.append(body)
        return "\n\n".join(parts)

    def __repr__(self) -> str:
        return self.script()

    __str__ = __repr__
