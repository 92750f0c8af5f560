"""SplitArgs: keep every kernel's parameters within what the target can pass to a kernel.

A GPU kernel's arguments travel in a parameter buffer of a fixed size (CUDA 4 KiB, OpenCL as
small as 1 KiB: ``Target.gpu.max_kernel_param_bytes``), one pointer (8 bytes) per tensor. A
``concat`` of a few hundred tensors (a model's feature list, a stack of per-step outputs) does
not fit, and neither does a fused kernel reading many distinct tensors. TVM splits the concat
and caps fusion; so does kiln:

- this pass rewrites ``concat`` of more than ``max_args - 1`` tensors into a concat of concats
  of at most that many each (along the same axis: exact, the order kept), recursively;
- FuseOps stops growing a group whose kernel would take more than ``max_args`` tensors
  (``transform.fuse_ops.max_args``, set by the build from the target).

:func:`max_kernel_args` gives the count for a target (``None``: no limit, the CPU).
"""

from __future__ import annotations

from typing import Any

from ..graph import expr as gx
from ..ir.module import IRModule
from ..target import Target
from .pass_infra import PassContext, function_pass
from .simplify_expr import RewriteMutator, call_op, op_name

__all__ = ["SplitArgs", "max_kernel_args"]

#: Parameters a kernel may need besides its tensors (symbolic dims, the seed, the check
#: record and the call's tag), each 8 bytes.
RESERVED_PARAMS = 8


def max_kernel_args(target: Any) -> int | None:
    """The most tensors one kernel of ``target`` may take (``None``: no limit)."""
    tgt = Target.create(target)
    if not tgt.is_gpu:
        return None
    return max(2, tgt.gpu.max_kernel_param_bytes // 8 - RESERVED_PARAMS)


class _Splitter(RewriteMutator):
    def __init__(self, mod: IRModule, max_args: int):
        super().__init__(mod)
        self.group = max(2, max_args - 1)  # inputs of one concat, plus its output

    def rewrite(self, var: gx.Var, value: gx.Expr) -> gx.Expr | None:
        if op_name(value) != "concat" or not isinstance(value.args[0], gx.Tuple):
            return None
        fields = list(value.args[0].fields)
        if len(fields) <= self.group:
            return None
        attrs = value.attrs
        parts = [call_op("concat", [gx.Tuple(fields[i:i + self.group])], attrs)
                 for i in range(0, len(fields), self.group)]
        return call_op("concat", [gx.Tuple(parts)], attrs)  # asked again when still too many


@function_pass(opt_level=0)
class SplitArgs:
    """Split ``concat``\\ s with more tensors than a kernel may take (see the module doc)."""

    def __init__(self, max_args: int | None = None, target: Any = None):
        self.max_args = max_args if max_args is not None else (
            max_kernel_args(target) if target is not None else None)

    def transform_function(self, func: gx.Function, mod: IRModule,
                           ctx: PassContext) -> gx.Function:
        if self.max_args is None:
            return func
        return _Splitter(mod, self.max_args).visit(func)
