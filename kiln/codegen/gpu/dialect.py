"""The spellings that differ between CUDA C and OpenCL C.

One renderer (:mod:`kiln.codegen.gpu.kernel`) writes both languages; everything it must spell
differently comes from a :class:`Dialect`: how a kernel and its pointer parameters are declared,
the thread indices, the barrier, shared memory, vector types and their loads and stores, warp
shuffles, atomics, and the prelude (fixed-width integer types, IEEE constants, and in OpenCL
the C library's float32 math names -- ``expf`` -- mapped onto its overloaded built-ins).
float16 and bfloat16 are stored as 16-bit patterns and computed in float32 in both
(conversions in :mod:`kiln.codegen.gpu.helpers`), so neither language needs its half-precision
headers or extensions.
"""

from __future__ import annotations

from dataclasses import dataclass

from ...ir.dtype import DataType
from ...tir.gpu import axis_of, is_block_tag
from ..c.helpers import LIBM

_INT_TYPES = ("int8_t", "uint8_t", "int16_t", "uint16_t", "int32_t", "uint32_t", "int64_t",
              "uint64_t")

#: Element types (by storage C type) that have 2- and 4-lane vector types in both languages.
VECTOR_ELEMENTS = {
    "float": "float", "int32_t": "int", "uint32_t": "uint", "int16_t": "short",
    "uint16_t": "ushort", "double": "double", "int64_t": "long", "uint64_t": "ulong",
}


@dataclass(frozen=True)
class Dialect:
    """Spellings of one C-family GPU language (see the module docstring)."""

    name: str

    # ---- declarations ---------------------------------------------------------------------
    @property
    def is_cuda(self) -> bool:
        return self.name == "cuda"

    def kernel_decl(self, name: str, params: list[str], threads: tuple[int, int, int]) -> str:
        n = threads[0] * threads[1] * threads[2]
        args = ", ".join(params) if params else "void"
        if self.is_cuda:
            return f'extern "C" __global__ void __launch_bounds__({n}) {name}({args})'
        x, y, z = threads
        return (f"__kernel __attribute__((reqd_work_group_size({x}, {y}, {z}))) "
                f"void {name}({args})")

    def pointer_param(self, ctype: str, name: str, const: bool = False) -> str:
        c = "const " if const else ""
        if self.is_cuda:
            return f"{c}{ctype}* __restrict__ {name}"
        return f"__global {c}{ctype}* restrict {name}"

    def shared_decl(self, ctype: str, name: str, size: int) -> str:
        if self.is_cuda:
            return f"__shared__ __align__(16) {ctype} {name}[{size}];"
        return f"__local {ctype} {name}[{size}] __attribute__((aligned(16)));"

    def dynamic_shared_decl(self, ctype: str, name: str, offset: int) -> str:
        """A view into CUDA's dynamic shared memory (``kiln_dyn_shared``) at ``offset``."""
        return f"{ctype}* {name} = ({ctype}*)(kiln_dyn_shared + {offset});"

    @property
    def function_qualifier(self) -> str:
        """What replaces ``static inline`` in front of helper functions."""
        return "static __device__ __forceinline__" if self.is_cuda else "static inline"

    # ---- threads ----------------------------------------------------------------------------
    def thread_index(self, tag: str) -> str:
        """The int32 value of a thread index (``blockIdx.x``, ``threadIdx.y``...)."""
        if self.is_cuda:
            return f"(int32_t){tag}"
        fn = "get_group_id" if is_block_tag(tag) else "get_local_id"
        return f"(int32_t){fn}({axis_of(tag)})"

    @property
    def barrier(self) -> str:
        if self.is_cuda:
            return "__syncthreads();"
        return "barrier(CLK_LOCAL_MEM_FENCE | CLK_GLOBAL_MEM_FENCE);"

    def shuffle(self, down: bool, value: str, lane: str, width: str) -> str:
        """A warp shuffle of a 32/64-bit value (CUDA only: OpenCL reduces in local memory)."""
        fn = "__shfl_down_sync" if down else "__shfl_sync"
        return f"{fn}(0xffffffffu, {value}, {lane}, {width})"

    def atomic_add(self, ptr: str, value: str, dtype: DataType) -> str:
        """Atomically add ``value`` to ``*ptr`` (an integer; CUDA also float), giving the old
        value; 64-bit integers as unsigned (two's complement adds alike)."""
        if self.is_cuda:
            if dtype.bits == 64 and dtype.is_integer:
                ct = "int64_t" if dtype.is_int else "uint64_t"
                return (f"(({ct})atomicAdd((unsigned long long*){ptr}, "
                        f"(unsigned long long){value}))")
            return f"atomicAdd({ptr}, {value})"
        if dtype.bits == 64:
            return f"atom_add({ptr}, {value})"  # cl_khr_int64_base_atomics
        return f"atomic_add({ptr}, {value})"

    def claim(self, ptr: str) -> str:
        """Atomically set the 32-bit int at ``ptr`` (a global pointer) from 0 to 1; true for
        the one thread that did (``atomic_cmpxchg`` is core OpenCL 1.1)."""
        fn = "atomicCAS" if self.is_cuda else "atomic_cmpxchg"
        qual = "" if self.is_cuda else "volatile __global "
        return f"({fn}(({qual}int*)({ptr}), 0, 1) == 0)"

    # ---- vectors ----------------------------------------------------------------------------
    def vector_type(self, ctype: str, lanes: int) -> str | None:
        """The built-in vector type of ``lanes`` ``ctype`` values, None where there is none."""
        base = VECTOR_ELEMENTS.get(ctype)
        if base is None or lanes not in (2, 4) or (lanes == 4 and ctype in (
                "double", "int64_t", "uint64_t")):
            return None
        if self.is_cuda:
            base = {"long": "longlong", "ulong": "ulonglong"}.get(base, base)
        return f"{base}{lanes}"

    def vector_load(self, vtype: str, lanes: int, address: str) -> str:
        if self.is_cuda:
            return f"*(const {vtype}*)({address})"
        return f"vload{lanes}(0, {address})"

    def vector_store(self, vtype: str, lanes: int, address: str, values: list[str]) -> str:
        if self.is_cuda:
            return f"*({vtype}*)({address}) = make_{vtype}({', '.join(values)});"
        return f"vstore{lanes}(({vtype})({', '.join(values)}), 0, {address});"

    def vector_copy(self, vtype: str, lanes: int, address: str, source: str) -> str:
        """Copy ``lanes`` elements from vector address ``source`` to ``address`` unchanged."""
        if self.is_cuda:
            return f"*({vtype}*)({address}) = *(const {vtype}*)({source});"
        return f"vstore{lanes}(vload{lanes}(0, {source}), 0, {address});"

    @staticmethod
    def lane(vector: str, k: int) -> str:
        return f"{vector}.{'xyzw'[k]}"

    @property
    def vector_needs_alignment(self) -> bool:
        """CUDA's vector loads need an address aligned to the vector (OpenCL's vloadN don't)."""
        return self.is_cuda

    # ---- scalars ----------------------------------------------------------------------------
    @property
    def bool_type(self) -> str:
        return "bool"

    @property
    def prelude(self) -> str:
        if self.is_cuda:
            types = ("signed char", "unsigned char", "short", "unsigned short", "int",
                     "unsigned int", "long long", "unsigned long long")
            head = ["/* generated by kiln: CUDA C, compiled with NVRTC */"]
            consts = ["#define INFINITY __int_as_float(0x7f800000)",
                      "#define NAN __int_as_float(0x7fffffff)",
                      "#define _Bool bool"]
        else:
            types = ("char", "uchar", "short", "ushort", "int", "uint", "long", "ulong")
            head = ["/* generated by kiln: OpenCL C */"]
            for ext in ("cl_khr_fp64", "cl_khr_int64_base_atomics"):
                head += [f"#ifdef {ext}", f"#pragma OPENCL EXTENSION {ext} : enable",
                         "#endif"]
            # the C library's float32 spellings (expf...) of OpenCL's overloaded built-ins
            consts = [f"#define {fn}f {fn}" for fn in sorted(set(LIBM.values()) | {"fabs"})
                      if fn != "nearbyint"]
            consts += ["#define nearbyintf rint", "#define nearbyint rint"]
        typedefs = [f"typedef {t} {n};" for t, n in zip(types, _INT_TYPES)]
        return "\n".join(head + typedefs + consts) + "\n"


CUDA = Dialect("cuda")
OPENCL = Dialect("opencl")


def dialect_for(kind: str) -> Dialect:
    return CUDA if kind == "cuda" else OPENCL
