"""TIR lowering passes: scheduled block TIR -> loop TIR ready for code generation.

Each pass is a function ``PrimFunc -> PrimFunc`` in its own module; :func:`lower` runs them in
the order documented in docs/internals.md.
"""

from .convert_blocks_to_loops import convert_blocks_to_loops
from .flatten_buffers import flat_index, flatten_buffers
from .hoist_checks import has_checks, hoist_checks
from .lower import LOWERED_ATTR, is_lowered, lower
from .npu_prepare import npu_prepare
from .simplify import simplify, simplify_stmt
from .vectorize_loops import simd_safe, vectorize_loops

__all__ = [
    "LOWERED_ATTR", "convert_blocks_to_loops", "flat_index", "flatten_buffers", "has_checks",
    "hoist_checks", "is_lowered", "lower", "npu_prepare", "simd_safe", "simplify", "simplify_stmt",
    "vectorize_loops",
]
