"""ConvertLayout: compute chosen operators in the layouts the user asks for.

``ConvertLayout({"nn.conv2d": ("NHWC", "HWIO")})`` rewrites every ``nn.conv2d`` to NHWC data
and an HWIO weight (a kernel layout of ``"default"`` or None picks HWIO for NHWC and OIHW for
NCHW); the pooling ops take ``{"nn.max_pool2d": ("NHWC",)}``. Element-wise and broadcasting ops,
batch_norm and pooling between converted ops follow the new layout, so ``layout_transform``\\ s
appear only at graph inputs/outputs and around ops that cannot follow; constant weights and
per-channel constants are transformed at compile time (see
:mod:`kiln.transform.layout_propagation`, the engine shared with AlterOpLayout).

Without arguments the pass reads the desired layouts from the PassContext config
``transform.convert_layout.desired_layouts`` and does nothing when none are set, so a pipeline
can include it unconditionally and users opt in per build::

    with PassContext(opt_level=2, config={
            "transform.convert_layout.desired_layouts": {"nn.conv2d": ("NHWC", "default")}}):
        exe = kiln.build(mod)
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping, Sequence
from typing import Any

from ..graph import expr as gx
from ..ir.errors import KilnError
from ..ir.module import IRModule
from ..op.layout import Layout, LayoutRewrite
from .layout_propagation import POOL_OPS, LayoutRewriter
from .pass_infra import PassContext, function_pass, register_config

__all__ = ["DESIRED_LAYOUTS_KEY", "ConvertLayout"]

DESIRED_LAYOUTS_KEY = "transform.convert_layout.desired_layouts"
register_config(
    DESIRED_LAYOUTS_KEY, dict, None,
    "ConvertLayout's desired layouts when it is given none: {op name: (data layout[, kernel "
    "layout])}, e.g. {'nn.conv2d': ('NHWC', 'default')}.",
)

#: The kernel layout that goes with a data layout when the user says "default".
_DEFAULT_KERNEL = {"NCHW": "OIHW", "NHWC": "HWIO"}


def _check_desired(desired: Mapping[str, Any]) -> dict[str, tuple[str, ...]]:
    """Validated ``{op: layouts}``; errors name the op and the bad layout."""
    if not isinstance(desired, Mapping):
        raise KilnError(f"ConvertLayout: desired_layouts must be a dict, got {desired!r}")
    out: dict[str, tuple[str, ...]] = {}
    for name, spec in desired.items():
        if isinstance(spec, str):
            spec = (spec,)
        if not isinstance(spec, Sequence) or not spec:
            raise KilnError(f"ConvertLayout: layouts for {name!r} must be a tuple like "
                            f"('NHWC', 'HWIO'), got {spec!r}")
        if name == "nn.conv2d":
            data = spec[0]
            kernel = spec[1] if len(spec) > 1 else None
            if kernel in (None, "default"):
                if data not in _DEFAULT_KERNEL:
                    raise KilnError(f"ConvertLayout: no default kernel layout for nn.conv2d "
                                    f"data layout {data!r}; give one, e.g. ({data!r}, 'HWIO')")
                kernel = _DEFAULT_KERNEL[data]
            for what, lay, axes in (("data", data, "NCHW"), ("kernel", kernel, "OIHW")):
                parsed = Layout(lay)
                if parsed.is_split() or sorted(parsed.primal) != sorted(axes):
                    raise KilnError(f"ConvertLayout: nn.conv2d {what} layout must be a "
                                    f"permutation of {axes!r}, got {lay!r}")
            out[name] = (Layout(data).name, Layout(kernel).name)
        elif name in POOL_OPS:
            lay = Layout(spec[0])
            if lay.index("H") < 0 or lay.index("W") < 0 or lay.factor("H") or lay.factor("W"):
                raise KilnError(f"ConvertLayout: {name} layout must have unsplit H and W, got "
                                f"{spec[0]!r}")
            out[name] = (lay.name,)
        else:
            raise KilnError(f"ConvertLayout: cannot convert {name!r}; supported: nn.conv2d, "
                            f"{', '.join(POOL_OPS)}")
    return out


def _decider(desired: dict[str, tuple[str, ...]]):
    def decide(call: gx.Call) -> LayoutRewrite | None:
        spec = desired.get(call.op.name)
        if spec is None:
            return None
        attrs = call.attrs
        if call.op.name == "nn.conv2d":
            data, kernel = spec
            if (attrs.data_layout, attrs.kernel_layout) == (data, kernel):
                return None
            new_attrs = dataclasses.replace(attrs, data_layout=data, kernel_layout=kernel)
            return LayoutRewrite(
                inputs=((attrs.data_layout, data), (attrs.kernel_layout, kernel)),
                output=(attrs.data_layout, data),
                build=lambda d, w: gx.Call(call.op, (d, w), new_attrs),
            )
        (layout,) = spec
        if attrs.layout == layout or not Layout(attrs.layout).same_axes(Layout(layout)):
            return None
        new_attrs = dataclasses.replace(attrs, layout=layout)
        return LayoutRewrite(inputs=((attrs.layout, layout),), output=(attrs.layout, layout),
                             build=lambda d: gx.Call(call.op, (d,), new_attrs))

    return decide


@function_pass(opt_level=2)
class ConvertLayout:
    """Rewrite chosen ops (conv2d, pooling) to desired layouts; transforms only at boundaries."""

    def __init__(self, desired_layouts: Mapping[str, Any] | None = None):
        self.desired = None if desired_layouts is None else _check_desired(desired_layouts)

    def transform_function(self, func: gx.Function, mod: IRModule,
                           ctx: PassContext) -> gx.Function:
        desired = self.desired
        if desired is None:
            configured = ctx.get_config(DESIRED_LAYOUTS_KEY)
            if not configured:
                return func
            desired = _check_desired(configured)
        return LayoutRewriter(mod, _decider(desired)).visit(func)
