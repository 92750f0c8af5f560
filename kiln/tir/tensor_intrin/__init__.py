"""Tensor intrinsics: hardware instructions (or hand-tuned C kernels) that compute a whole
small tile, described in TIR so that a schedule can swap a block for them (:mod:`.intrin`: the
description/implementation pairs, the extern functions they call, the registry). Importing the
package registers the CPU intrinsics (:mod:`.x86`).
"""

from . import x86  # noqa: F401 - registers the CPU intrinsics
from .intrin import (
    ADDRESS_OF,
    CALL_EXTERN,
    ELEM_OFFSET,
    ExternFunction,
    TensorIntrin,
    address_of,
    call_extern,
    elem_offset,
    extern_function,
    extern_functions,
    get,
    names,
    register,
    register_extern,
    root_body,
)

__all__ = [
    "ADDRESS_OF", "CALL_EXTERN", "ELEM_OFFSET", "ExternFunction", "TensorIntrin", "address_of",
    "call_extern", "elem_offset", "extern_function", "extern_functions", "get", "names",
    "register", "register_extern", "root_body",
]
