"""AnnotateTarget: which op calls of ``main`` the NPU runs (the first step of the NPU's
bring-your-own-codegen partitioning, as TVM's pass of that name).

A call goes to the NPU when a lowering is registered for its op in
:mod:`kiln.schedule.npu` *and accepts the call*: its attributes, dtypes and static shapes. The
acceptance test is the lowering itself, run into a scratch context
(:func:`kiln.schedule.npu.lowering.lowering_rejection`), so the annotation can never disagree
with what the build will do. A view (reshape, squeeze, expand_dims) of a tensor is an alias of
its operand's DRAM, supported wherever its operand is. Every other call is marked
``"cpu: <reason>"`` -- the reason ``kiln.build(..., strict=True)`` reports.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from ... import graph as g
from ...ir.module import IRModule
from ...schedule.npu.emit import DramTensor
from ...schedule.npu.lowering import (
    DEPTHWISE_KEY,
    LOWERING_KEY,
    NotSupported,
    lowering_rejection,
)
from ...schedule.npu.region import is_view, static_tensor
from ...target.npu import NPUConfig, load_config
from ..pass_infra import PassContext, module_pass
from .common import HW_ATTR, TARGET_ATTR, main_bindings, main_function, with_unique_names

__all__ = ["AnnotateTarget", "npu_rejection"]


def npu_rejection(config: NPUConfig, var: g.Var, call: g.Call, double_buffer: bool = True
                  ) -> str | None:
    """Why the NPU of ``config`` cannot compute ``var = call`` (None: it can)."""
    try:
        out = static_tensor(var)
        if is_view(call):
            static_tensor(call.args[0])
            return None
        return lowering_rejection(config, call, [_probe_operand(a) for a in call.args], out,
                                  double_buffer, PassContext.current().get_config(LOWERING_KEY),
                                  PassContext.current().get_config(DEPTHWISE_KEY))
    except NotSupported as err:
        return str(err)


def _probe_operand(a: Any) -> Any:
    """An operand as the lowering gets it, for the probe: a constant's array, a tensor's static
    shape and dtype (at address 0), a tuple (concat's tensors) as a list of them."""
    if isinstance(a, g.Constant):
        return np.asarray(a.data)
    if isinstance(a, g.Var):
        return DramTensor(0, *static_tensor(a))
    if isinstance(a, g.Tuple):
        return [_probe_operand(f) for f in a.fields]
    raise NotSupported(f"operand {type(a).__name__} is not a tensor")


@module_pass(opt_level=0)
class AnnotateTarget:
    """Mark each op call of main "npu" when an NPU lowering accepts it, else "cpu: <why>".

    ``hw``: the hardware description (a name such as ``"edge"``, a TOML path, or an
    :class:`~kiln.target.npu.NPUConfig`); ``double_buffer``: whether the build will double
    buffer (which changes the tilings that fit, so what is accepted). The marks are recorded
    as main's ``"npu.target"`` attribute (binding name -> mark).
    """

    def __init__(self, hw: str | NPUConfig = "default", double_buffer: bool = True):
        self.config = hw if isinstance(hw, NPUConfig) else load_config(hw)
        self.double_buffer = double_buffer

    def transform_module(self, mod: IRModule, ctx: PassContext) -> IRModule:
        main = with_unique_names(mod, main_function(mod, "AnnotateTarget"))
        marks: dict[str, str] = {}
        for b in main_bindings(main):
            name = b.var.name_hint
            if isinstance(b, g.VarBinding) and isinstance(b.value, g.Call) and \
                    isinstance(b.value.op, g.Op):
                why = npu_rejection(self.config, b.var, b.value, self.double_buffer)
                marks[name] = "npu" if why is None else f"cpu: {why}"
        main = main.with_attr(TARGET_ATTR, marks).with_attr(HW_ATTR, self.config.name)
        return mod.with_function("main", main)
