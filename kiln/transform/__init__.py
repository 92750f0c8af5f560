"""Pass infrastructure and graph-level passes (one file per pass).

See ``kiln/transform/pass_infra.py`` for the pass API and ``instruments.py`` for timing, IR
dumps and the well-formed checker. Each pass module below declares its pass(es) on import, so
importing this package makes ``list_passes()`` complete. Add one import line per pass module.
"""
# ruff: noqa: F401

from .alter_op_layout import AlterOpLayout
from .annotate_tir_op_pattern import AnnotateTIROpPattern
from .bind_params import BindParams
from .canonicalize_ops import CanonicalizeOps
from .combine_parallel_conv2d import CombineParallelConv2D
from .combine_parallel_dense import CombineParallelDense
from .convert_layout import ConvertLayout
from .dead_code_elimination import DeadCodeElimination
from .defuse_ops import DefuseOps
from .eliminate_common_subexpr import EliminateCommonSubexpr
from .fast_math import FastMath
from .fold_constant import FoldConstant
from .fuse_ops import FuseOps
from .fuse_tir import FuseTIR
from .gradient import Gradient
from .inline import Inline
from .instruments import (
    DumpIR,
    PassInstrument,
    PassTimingInstrument,
    PrintIRInstrument,
    WellFormedInstrument,
)
from .legalize_ops import LegalizeOps
from .normalize import InferStructInfo, Normalize
from .npu import (
    AnnotateMemoryScope,
    AnnotateTarget,
    MergeCompilerRegions,
    PartitionGraph,
    partition_for_npu,
)
from .pass_infra import (
    FunctionPass,
    ModulePass,
    Pass,
    PassContext,
    PassInfo,
    PrimFuncPass,
    Sequential,
    function_pass,
    get_pass,
    list_configs,
    list_passes,
    module_pass,
    prim_func_pass,
    register_config,
)
from .simplify_expr import SimplifyExpr
from .simplify_inference import SimplifyInference
from .split_args import SplitArgs
from .to_mixed_precision import ToMixedPrecision
