"""Runtime: arrays at the native boundary and loading of compiled modules."""

from .module import Function, FunctionInfo, Module, ParamInfo
from .ndarray import DLTensorArg, as_dltensor, as_numpy, from_dl_dtype, to_dl_dtype

__all__ = [
    "DLTensorArg", "Function", "FunctionInfo", "Module", "ParamInfo", "as_dltensor", "as_numpy",
    "from_dl_dtype", "to_dl_dtype",
]
