"""The minimal pass protocol every transformation follows.

A pass is an object with a ``name``, an ``opt_level`` and the names of passes it ``required``;
calling it on an IRModule returns a new IRModule (the input is never modified).
"""

from __future__ import annotations

from ..ir.module import IRModule


class Pass:
    """Base class of module-to-module transformations."""

    name: str = "Pass"
    opt_level: int = 0
    required: tuple[str, ...] = ()

    def transform_module(self, mod: IRModule) -> IRModule:
        raise NotImplementedError

    def __call__(self, mod: IRModule) -> IRModule:
        return self.transform_module(mod)

    def __repr__(self) -> str:
        return f"{type(self).__name__}(opt_level={self.opt_level})"
