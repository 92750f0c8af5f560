"""The OpenCL device (``pyopencl``; ``pip install "kiln[opencl]"``).

The first OpenCL device that builds a probe kernel (:func:`pick_device`; with PoCL, its CPU
device: kernels run on the host's cores through LLVM, work-groups, local memory and barriers
included) gets one context and one in-order command queue. The probe matters where several
platforms are installed: the PoCL 3.0 in the ``pyopencl`` / ``pocl-binary-distribution``
wheels (LLVM 14) lists a device on a CPU its LLVM does not know (an AMD family 1Ah host) but
builds nothing there ("unknown target CPU 'generic'"), while Debian's ``pocl-opencl-icd``
(LLVM 15) maps it to a known variant; ``make venv`` installs the latter where it can.
Buffers handed to kernels are sub-buffers of allocations at offsets that are multiples of the
device's ``CL_DEVICE_MEM_BASE_ADDR_ALIGN``. Programs are built once per process per source
text.
"""

from __future__ import annotations

import hashlib
import warnings
from typing import Any

import numpy as np

from ...ir.errors import CompileError, KilnError
from .device import Device, DeviceBuffer, missing_runtime

#: A kernel every OpenCL C compiler builds: a device whose compiler fails on it cannot run kiln.
PROBE_SOURCE = "__kernel void kiln_probe(__global float *a) { a[get_global_id(0)] = 1.0f; }"


def pick_device(cl: Any) -> Any:
    """The first device of ``cl.get_platforms()`` (platforms, then devices, in order) whose
    compiler builds :data:`PROBE_SOURCE`; a KilnError naming every device and why it was
    refused when none does (or none is found)."""
    refused = []
    for platform in cl.get_platforms():
        for device in platform.get_devices():
            try:
                with warnings.catch_warnings():
                    warnings.simplefilter("ignore", cl.CompilerWarning)
                    cl.Program(cl.Context([device]), PROBE_SOURCE).build()
            except cl.Error as err:
                why = " ".join(str(err).split())
                refused.append(f"{device.name} ({platform.version}): {why[:300]}")
                continue
            return device
    raise missing_runtime("opencl", "no OpenCL device builds a kernel: " + "; ".join(refused) +
                          " -- a PoCL whose LLVM knows this CPU (Debian's pocl-opencl-icd) may"
                          if refused else "no OpenCL device found")


class OpenCLDevice(Device):
    kind = "opencl"

    def __init__(self) -> None:
        try:
            import pyopencl as cl
        except ImportError as err:
            raise missing_runtime("opencl", err) from err
        self.cl = cl
        try:
            device = pick_device(cl)
        except cl.Error as err:  # listing the platforms failed (no ICD)
            raise missing_runtime("opencl", f"no OpenCL device: {err}") from err
        self.device = device
        self.context = cl.Context([device])
        self.queue = cl.CommandQueue(self.context)
        self.alignment = max(int(device.mem_base_addr_align) // 8, 16)
        self._programs: dict[str, dict[str, Any]] = {}

    def __repr__(self) -> str:
        return f"OpenCLDevice({self.device.name!r})"

    def alloc(self, nbytes: int) -> DeviceBuffer:
        size = max(int(nbytes), self.alignment)
        try:
            buf = self.cl.Buffer(self.context, self.cl.mem_flags.READ_WRITE, size)
        except self.cl.Error as err:
            raise KilnError(f"OpenCL: cannot allocate {nbytes} bytes ({err})") from err
        return DeviceBuffer(buf, int(nbytes))

    def view(self, buf: DeviceBuffer, offset: int, nbytes: int) -> DeviceBuffer:
        if offset == 0 and nbytes >= buf.nbytes:
            return buf
        if offset % self.alignment:
            raise KilnError(f"OpenCL: sub-buffer offset {offset} is not a multiple of "
                            f"{self.alignment}")
        sub = buf.handle.get_sub_region(offset, max(int(nbytes), 1))
        return DeviceBuffer(sub, int(nbytes), buf)

    def upload(self, buf: DeviceBuffer, array: np.ndarray) -> None:
        if array.nbytes:
            self.cl.enqueue_copy(self.queue, buf.handle, np.ascontiguousarray(array))

    def download(self, buf: DeviceBuffer, array: np.ndarray) -> None:
        if array.nbytes:
            self.cl.enqueue_copy(self.queue, array, buf.handle)

    def load(self, program: Any) -> dict[str, Any]:
        key = hashlib.sha256(program.source.encode()).hexdigest()
        kernels = self._programs.get(key)
        if kernels is None:
            try:
                with warnings.catch_warnings():  # the compiler's notes on generated code
                    warnings.simplefilter("ignore", self.cl.CompilerWarning)
                    built = self.cl.Program(self.context, program.source).build(
                        options=["-cl-std=CL1.2"])
            except self.cl.Error as err:
                raise CompileError(f"OpenCL could not build the generated program:\n{err}"
                                   ) from err
            names = [k.name for f in program.functions.values() for k in f.kernels]
            kernels = {n: self.cl.Kernel(built, n) for n in names}
            self._programs[key] = kernels
        return kernels

    def launch(self, kernel: Any, grid: tuple[int, int, int], block: tuple[int, int, int],
               args: list[Any], shared_bytes: int = 0) -> None:
        for i, a in enumerate(args):
            kernel.set_arg(i, a.handle if isinstance(a, DeviceBuffer) else a)
        gsize = tuple(int(g) * int(b) for g, b in zip(grid, block))
        if 0 in gsize:
            return
        self.cl.enqueue_nd_range_kernel(self.queue, kernel, gsize, tuple(block))

    def synchronize(self) -> None:
        self.queue.finish()
