"""CombineParallelConv2D: several ``nn.conv2d`` calls on the same input become one.

Convolutions of the same input with equal attributes (strides, padding, dilation, layouts,
``out_dtype``; ``groups == 1``) and weights that differ only in their number of output channels
(same kernel size and input channels) become one convolution on the weights concatenated along
the output-channel axis, followed by a ``split`` along the result's channel axis; per-channel
bias adds and activations that every branch applies are combined too. Typical source: the
parallel 1x1 branches of Inception-style blocks. Constant weights are concatenated at compile
time. The engine is :class:`kiln.transform.combine_parallel.ParallelCombiner`.
"""

from __future__ import annotations

from ..graph import expr as gx
from ..graph.struct_info import TensorStructInfo
from ..ir.module import IRModule
from ..op.layout import Layout
from .combine_parallel import BranchInfo, ParallelCombiner
from .pass_infra import PassContext, function_pass

__all__ = ["CombineParallelConv2D"]


def analyze_conv2d(call: gx.Call) -> BranchInfo | None:
    """Combinability of one ``nn.conv2d`` call (see the module docstring)."""
    if call.op.name != "nn.conv2d" or call.attrs.groups != 1:
        return None
    x, w = call.args
    ws = w.struct_info
    if not isinstance(x, gx.Var) or not isinstance(ws, TensorStructInfo) or not ws.is_static:
        return None
    o_axis = Layout(call.attrs.kernel_layout).index("O")
    shape = ws.static_shape()
    rest = shape[:o_axis] + shape[o_axis + 1:]
    return BranchInfo(key=(x, call.attrs, str(ws.dtype), rest), weight_axis=o_axis,
                      out_axis=Layout(call.attrs.data_layout).index("C"), units=shape[o_axis])


@function_pass(opt_level=2)
class CombineParallelConv2D:
    """Combine conv2d ops that share their input into one conv2d on concatenated weights.

    Groups of at least ``min_num_branches`` (3 by default, as in TVM): the ``split`` after the
    combined call has no NCHWc form, so on the CPU it costs a layout transform to NCHW and back
    around the split, and the branches' bias/activation leave the conv's epilogue. Two
    branches gain too little to pay for that: in the text detector of ``benchmarks/models.py``
    (an FPN lateral 1x1 conv beside the next block's 1x1 expansion) the pair combined ran at
    1.3x the time of the two convs apart (per-kernel sums, paired rounds)."""

    def __init__(self, min_num_branches: int = 3):
        self.min_num_branches = max(2, int(min_num_branches))

    def transform_function(self, func: gx.Function, mod: IRModule,
                           ctx: PassContext) -> gx.Function:
        return ParallelCombiner(mod, func, analyze_conv2d, self.min_num_branches).visit(func)
