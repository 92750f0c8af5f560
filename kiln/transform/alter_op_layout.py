"""AlterOpLayout: let each operator pick the layout it runs fastest in on the target.

A target's room registers, next to its schedules, an ``alter_layout`` hook per operator
(``kiln.schedule.register_alter_layout``, looked up with ``kiln.schedule.lookup_alter_layout``);
the hook sees the call (with its argument types) and the Target and returns a
:class:`~kiln.op.layout.LayoutRewrite` or None.
On CPUs ``nn.conv2d`` asks to become ``nn.conv2d_nchwc``: NCHW[x]c data, an OIHW[x]i[y]o weight,
output channels in blocks of one SIMD vector of float32 (see ``kiln.op.nn``); a depthwise
convolution becomes ``nn.depthwise_conv2d_nchwc`` (OIHW[y]o weight) and a grouped one whose
groups hold whole blocks a grouped ``nn.conv2d_nchwc``, so networks such as MobileNetV2 stay in
NCHW[y]c across their depthwise layers.

The rewrite goes through the layout propagation engine
(:mod:`kiln.transform.layout_propagation`): the data gets a ``layout_transform`` where it
enters a blocked region, constant weights are transformed at compile time, element-wise ops,
batch_norm (unless the channels are blocked) and pooling follow the blocked layout, so
consecutive convolutions stay in NCHW[x]c, and the layout goes back to NCHW only where an op
cannot follow (a reshape, a dense, the function's outputs).
"""

from __future__ import annotations

from ..graph import expr as gx
from ..ir.module import IRModule
from ..op.layout import LayoutRewrite
from ..schedule.registry import lookup_alter_layout
from ..target import Target
from .layout_propagation import LayoutRewriter
from .pass_infra import PassContext, function_pass

__all__ = ["AlterOpLayout"]


@function_pass(opt_level=2)
class AlterOpLayout:
    """Rewrite ops to the layouts their per-target alter_layout hooks choose (conv2d -> NCHWc)."""

    def __init__(self, target: Target | str | None = None):
        self.target = Target.create(target)

    def transform_function(self, func: gx.Function, mod: IRModule,
                           ctx: PassContext) -> gx.Function:
        target = self.target

        def decide(call: gx.Call) -> LayoutRewrite | None:
            hook = lookup_alter_layout(call.op.name, target)
            return hook(call, target) if hook is not None else None

        return LayoutRewriter(mod, decide).visit(func)
