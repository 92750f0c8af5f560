"""The CUDA device (the driver API through ``cuda-bindings``; ``pip install "kiln[cuda]"``).

kiln uses the device's *primary* context, the one PyTorch, CuPy and the CUDA runtime use, so
device pointers are shared with them (DLPack inputs and outputs need no copies), and launches
go to the legacy default stream, which orders them with those frameworks' default-stream work.
A program is loaded from its cubin when the device's architecture is the one it was compiled
for, else from its PTX (JIT-compiled by the driver for newer devices). Kernels with more than
48 KiB of dynamic shared memory get the opt-in attribute when they are loaded.

:meth:`CudaDevice.graph` records a list of launches as a CUDA Graph (kernel nodes in a chain),
which a static plan replays with one call per run; :class:`LaunchGraph` updates the
parameters of the nodes whose buffers change between runs (inputs and outputs given by the
caller).
"""

from __future__ import annotations

import ctypes
import weakref
from typing import Any

import numpy as np

from ...ir.errors import KilnError
from .device import Device, DeviceBuffer, missing_runtime

_CTYPES = {
    np.dtype(np.int64): ctypes.c_int64, np.dtype(np.int32): ctypes.c_int32,
    np.dtype(np.int16): ctypes.c_int16, np.dtype(np.int8): ctypes.c_int8,
    np.dtype(np.uint64): ctypes.c_uint64, np.dtype(np.uint32): ctypes.c_uint32,
    np.dtype(np.uint16): ctypes.c_uint16, np.dtype(np.uint8): ctypes.c_uint8,
    np.dtype(np.float32): ctypes.c_float, np.dtype(np.float64): ctypes.c_double,
}


class _Allocation:
    """Frees a cuMemAlloc'ed pointer when the last buffer using it goes."""

    def __init__(self, cu: Any, ptr: int):
        self.cu, self.ptr = cu, ptr

    def __del__(self) -> None:
        try:
            self.cu.cuMemFree(self.ptr)
        except Exception:  # noqa: BLE001 - interpreter shutdown
            pass


class CudaDevice(Device):
    kind = "cuda"
    alignment = 256

    def __init__(self, ordinal: int = 0) -> None:
        try:
            from cuda.bindings import driver as cu

            self.cu = cu
            self._check(cu.cuInit(0), "cuInit")
            self.dev = self._check(cu.cuDeviceGet(ordinal), "cuDeviceGet")
            attr = cu.CUdevice_attribute
            major = self._check(cu.cuDeviceGetAttribute(
                attr.CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MAJOR, self.dev), "attribute")
            minor = self._check(cu.cuDeviceGetAttribute(
                attr.CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MINOR, self.dev), "attribute")
            self.ctx = self._check(cu.cuDevicePrimaryCtxRetain(self.dev), "context")
            self._check(cu.cuCtxSetCurrent(self.ctx), "cuCtxSetCurrent")
        except KilnError:
            raise
        except Exception as err:  # noqa: BLE001 - no package, no driver, no device
            raise missing_runtime("cuda", err) from err
        self.arch = f"sm_{major}{minor}"
        self.ordinal = ordinal
        self.stream = cu.CUstream(0)  # the legacy default stream
        #: the kernels loaded for each live program, by ``id`` -- with a weak reference to the
        #: program, so that a later program that Python places at a dead one's address (the
        #: same ``id``) is loaded, not given the dead one's kernels (same names, other code)
        self._modules: dict[int, tuple[weakref.ref, dict[str, Any]]] = {}

    def __repr__(self) -> str:
        return f"CudaDevice({self.ordinal}, {self.arch})"

    def _check(self, result: Any, what: str) -> Any:
        err = result[0] if isinstance(result, tuple) else result
        if int(err) != 0:
            raise KilnError(f"CUDA {what} failed: {err}")
        if isinstance(result, tuple):
            return result[1] if len(result) == 2 else result[1:]
        return None

    def current(self) -> None:
        """Make kiln's context current on the calling thread."""
        self._check(self.cu.cuCtxSetCurrent(self.ctx), "cuCtxSetCurrent")

    # ---- memory -----------------------------------------------------------------------------
    def alloc(self, nbytes: int) -> DeviceBuffer:
        ptr = int(self._check(self.cu.cuMemAlloc(max(int(nbytes), 1)), f"cuMemAlloc({nbytes})"))
        return DeviceBuffer(ptr, int(nbytes), _Allocation(self.cu, ptr))

    def view(self, buf: DeviceBuffer, offset: int, nbytes: int) -> DeviceBuffer:
        return DeviceBuffer(int(buf.handle) + int(offset), int(nbytes), buf.owner or buf)

    def upload(self, buf: DeviceBuffer, array: np.ndarray) -> None:
        arr = np.ascontiguousarray(array)
        if arr.nbytes:
            self._check(self.cu.cuMemcpyHtoD(buf.handle, arr.ctypes.data, arr.nbytes), "HtoD")

    def download(self, buf: DeviceBuffer, array: np.ndarray) -> None:
        if array.nbytes:
            self._check(self.cu.cuMemcpyDtoH(array.ctypes.data, buf.handle, array.nbytes),
                        "DtoH")

    def copy(self, dst: DeviceBuffer, src: DeviceBuffer, nbytes: int) -> None:
        if nbytes:
            self._check(self.cu.cuMemcpyDtoDAsync(dst.handle, src.handle, nbytes, self.stream),
                        "DtoD")

    # ---- programs ---------------------------------------------------------------------------
    def load(self, program: Any) -> dict[str, Any]:
        key = id(program)
        entry = self._modules.get(key)
        if entry is not None and entry[0]() is program:
            return entry[1]
        cu = self.cu
        image = program.binaries.get("cubin") if program.arch == self.arch else None
        if not image:
            image = program.binaries.get("ptx")
        if not image:
            raise KilnError("the CUDA program holds neither a cubin for this device "
                            f"({self.arch}) nor PTX")
        module = self._check(cu.cuModuleLoadData(image), "cuModuleLoadData")
        kernels = {}
        attr = cu.CUfunction_attribute.CU_FUNC_ATTRIBUTE_MAX_DYNAMIC_SHARED_SIZE_BYTES
        for f in program.functions.values():
            for k in f.kernels:
                fn = self._check(cu.cuModuleGetFunction(module, k.name.encode()), k.name)
                if k.dynamic_shared_bytes > 48 * 1024:
                    self._check(cu.cuFuncSetAttribute(fn, attr, k.dynamic_shared_bytes),
                                f"dynamic shared memory of {k.name}")
                kernels[k.name] = fn
        kernels["__module__"] = module
        modules = self._modules

        def forget(ref: weakref.ref) -> None:  # the program is gone: so is its entry
            if modules.get(key, (None,))[0] is ref:
                del modules[key]

        self._modules[key] = (weakref.ref(program, forget), kernels)
        return kernels

    @staticmethod
    def params(args: list[Any]) -> tuple[tuple[Any, ...], tuple[Any, ...]]:
        """``kernelParams`` in cuda-bindings' (values, ctypes types) form."""
        values, types = [], []
        for a in args:
            if isinstance(a, DeviceBuffer):
                values.append(int(a.handle))
                types.append(ctypes.c_void_p)
            else:
                v = np.asarray(a)
                values.append(v.item())
                types.append(_CTYPES[v.dtype])
        return tuple(values), tuple(types)

    def launch(self, kernel: Any, grid: tuple[int, int, int], block: tuple[int, int, int],
               args: list[Any], shared_bytes: int = 0) -> None:
        self._check(self.cu.cuLaunchKernel(kernel, *(int(g) for g in grid),
                                           *(int(b) for b in block), int(shared_bytes),
                                           self.stream, self.params(args), 0), "cuLaunchKernel")

    def synchronize(self) -> None:
        self._check(self.cu.cuStreamSynchronize(self.stream), "cuStreamSynchronize")

    # ---- graphs -----------------------------------------------------------------------------
    def graph(self, launches: list[tuple[Any, tuple, tuple, list[Any], int]]) -> LaunchGraph:
        return LaunchGraph(self, launches)


class LaunchGraph:
    """A CUDA Graph of a fixed sequence of kernel launches (see the module docstring)."""

    def __init__(self, device: CudaDevice, launches: list[tuple[Any, tuple, tuple, list[Any],
                                                                   int]]):
        cu = device.cu
        self.device = device
        self.graph = device._check(cu.cuGraphCreate(0), "cuGraphCreate")
        self.nodes: list[Any] = []
        self.params: list[Any] = []
        prev: list[Any] = []
        for kernel, grid, block, args, shared in launches:
            p = self._node_params(kernel, grid, block, args, shared)
            node = device._check(cu.cuGraphAddKernelNode(self.graph, prev, len(prev), p),
                                 "cuGraphAddKernelNode")
            self.nodes.append(node)
            self.params.append(p)
            prev = [node]
        self.exec = device._check(cu.cuGraphInstantiate(self.graph, 0), "cuGraphInstantiate")

    def _node_params(self, kernel: Any, grid: tuple, block: tuple, args: list[Any],
                     shared: int) -> Any:
        p = self.device.cu.CUDA_KERNEL_NODE_PARAMS()
        p.func = kernel
        p.gridDimX, p.gridDimY, p.gridDimZ = (int(g) for g in grid)
        p.blockDimX, p.blockDimY, p.blockDimZ = (int(b) for b in block)
        p.sharedMemBytes = int(shared)
        p.kernelParams = CudaDevice.params(args)
        return p

    def update(self, index: int, launch: tuple[Any, tuple, tuple, list[Any], int]) -> None:
        """Give node ``index`` new arguments (its buffers changed)."""
        p = self._node_params(*launch)
        self.device._check(self.device.cu.cuGraphExecKernelNodeSetParams(
            self.exec, self.nodes[index], p), "cuGraphExecKernelNodeSetParams")
        self.params[index] = p

    def launch(self) -> None:
        self.device._check(self.device.cu.cuGraphLaunch(self.exec, self.device.stream),
                           "cuGraphLaunch")
