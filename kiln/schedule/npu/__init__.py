"""The NPU's room: per-op lowerings onto its instruction set (:mod:`.ops`: products,
convolutions, element-wise; :mod:`.pooling`: pooling, reductions, normalizations;
:mod:`.movement`: transpose/slice/concat as strided DMAs; :mod:`.scalar`: the scalar unit's
fallback; :mod:`.quantize`: int8 requantize, quantize, dequantize), the tiled GEMM
(:mod:`.gemm`), vector kernels (:mod:`.vector`), the pipeline's token protocol and DRAM tensors
(:mod:`.emit`), the lowering registry (:mod:`.lowering`), and the TIR route: products
(:mod:`.tir_gemm`: schedule with NPU scopes and tensorize; :mod:`.tir_program`: scheduled TIR ->
instructions), element-wise kernels (:mod:`.tir_vector`, with the vector kernels' program
generator), row kernels (:mod:`.tir_rows`: softmax, layer_norm, row means), pooling and
depthwise convolutions (:mod:`.tir_pool`), and the lowering of last resort for injective ops
with none of those (:mod:`.tir_nests`: the op's own TIR through the loop pre-passes, nest by
nest onto the vector or the scalar unit); the element-wise instruction search (:mod:`.isel` over
:mod:`.nest_analysis`'s nests, which also reads back where a model's work ran)."""

from . import (  # noqa: F401 - register the lowerings
    movement,
    ops,
    pooling,
    quantize,
    tir_gemm,
    tir_nests,
    tir_pool,
    tir_rows,
    tir_vector,
)
from .emit import DramTensor, KernelBuilder, KernelInfo
from .gemm import GemmShape, GemmTiling, gemm_cost, gemm_roofline, plan_gemm
from .lowering import LoweringContext, NotSupported, lookup_lowering, lowered_ops

__all__ = ["DramTensor", "GemmShape", "GemmTiling", "KernelBuilder", "KernelInfo",
           "LoweringContext", "NotSupported", "gemm_cost", "gemm_roofline", "lookup_lowering",
           "lowered_ops", "plan_gemm"]
