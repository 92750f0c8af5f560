"""The NPU's bring-your-own-codegen partitioning, as graph passes (TVM's names), in the order
they run: :class:`PreProcess` (split op calls the NPU lacks into ones it has),
:class:`AnnotateTarget` (which op calls the NPU runs), :class:`MergeCompilerRegions`
(group them into regions without dependency cycles), :class:`PartitionGraph` (each region
becomes a graph function with ``"Codegen": "npu"``), :class:`AnnotateMemoryScope` (where each
tensor of a region lives). :func:`partition_for_npu` is the five in a Sequential."""

from ..pass_infra import Sequential
from .annotate_memory_scope import AnnotateMemoryScope, memory_scopes
from .annotate_target import AnnotateTarget, npu_rejection
from .common import (
    CODEGEN,
    HW_ATTR,
    MEMORY_SCOPE_ATTR,
    REGION_ATTR,
    TARGET_ATTR,
    npu_functions,
)
from .merge_compiler_regions import MergeCompilerRegions, merge_regions
from .partition_graph import PartitionGraph
from .preprocess import PREPROCESS_ATTR, PreProcess

__all__ = ["AnnotateMemoryScope", "AnnotateTarget", "CODEGEN", "HW_ATTR", "MEMORY_SCOPE_ATTR",
           "MergeCompilerRegions", "PREPROCESS_ATTR", "PartitionGraph", "PreProcess",
           "REGION_ATTR", "TARGET_ATTR", "memory_scopes", "merge_regions", "npu_functions",
           "npu_rejection",
           "partition_for_npu"]


def partition_for_npu(hw: object = "default", double_buffer: bool = True) -> Sequential:
    """PreProcess, AnnotateTarget, MergeCompilerRegions, PartitionGraph and
    AnnotateMemoryScope for the hardware description ``hw`` (a name, a TOML path or an
    NPUConfig)."""
    return Sequential([PreProcess(hw, double_buffer), AnnotateTarget(hw, double_buffer),
                       MergeCompilerRegions(), PartitionGraph(),
                       AnnotateMemoryScope(hw, double_buffer)],
                      name="kiln.npu.partition")
