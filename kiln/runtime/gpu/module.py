"""A loaded GPU program: the GPU counterpart of :class:`kiln.runtime.module.Module`.

:class:`GpuModule` holds a :class:`~kiln.runtime.gpu.program.DeviceProgram`, loads it onto the
target's device on first use and runs its functions: :meth:`GpuModule.run_function` enqueues
one function's kernels on device buffers (what the executor does, call after call), and
``mod[name](*arrays)`` runs one function on host arrays (inputs and outputs, destination
passing, like the C module): the arrays are copied to the device, the kernels run, and every
buffer is copied back (tests and debugging).
"""

from __future__ import annotations

import functools
import os
from collections.abc import Callable, Sequence
from typing import Any

import numpy as np

from ...ir.dtype import DataType
from ...ir.errors import ArgumentError, KilnError, RuntimeCheckError
from ...target.target import Target
from .. import shape_expr
from ..executor import as_input_array
from ..module import FunctionInfo
from .cuda import CudaDevice
from .device import Device, DeviceBuffer
from .opencl import OpenCLDevice
from .program import DeviceFunction, DeviceProgram, check_failure, empty_check_record

#: One kernel launch: (kernel handle, grid, block, arguments, dynamic shared bytes).
Launch = tuple[Any, tuple[int, int, int], tuple[int, int, int], list[Any], int]


def align_up(n: int, align: int) -> int:
    return (n + align - 1) // align * align


def scalar_arg(value: Any, dtype: DataType) -> Any:
    """A scalar kernel argument of ``dtype`` as the numpy scalar the kernel takes (a soft
    float as its bit pattern, a bool as a byte)."""
    arr = np.asarray(value, dtype=dtype.to_numpy()).reshape(())
    if dtype.is_bool:
        return np.uint8(bool(arr))
    if dtype.is_float and dtype.bits < 32 or dtype.is_bfloat:
        return arr.view(np.uint16 if dtype.bits == 16 else np.uint8)[()]
    return arr[()]


@functools.cache
def get_device(kind: str) -> Device:
    """The device of a target kind (made once per process)."""
    if kind == "opencl":
        return OpenCLDevice()
    if kind == "cuda":
        return CudaDevice()
    raise KilnError(f"no GPU runtime for target kind {kind!r}")


class GpuModule:
    """See the module docstring. ``functions`` maps names to their ``FunctionInfo``."""

    def __init__(self, program: DeviceProgram, device: Device | None = None):
        self.program = program
        self.functions: dict[str, FunctionInfo] = {n: f.info for n, f in
                                                   program.functions.items()}
        self.source = program.source
        self.lib_path = None
        self._device = device
        self._kernels: dict[str, Any] | None = None

    @property
    def kind(self) -> str:
        return self.program.kind

    @property
    def device(self) -> Device:
        if self._device is None:
            self._device = get_device(self.program.kind)
        return self._device

    @property
    def kernels(self) -> dict[str, Any]:
        if self._kernels is None:
            self._kernels = self.device.load(self.program)
        return self._kernels

    def function(self, name: str) -> DeviceFunction:
        try:
            return self.program.functions[name]
        except KeyError:
            raise KilnError(f"GPU module has no function {name!r}") from None

    def __contains__(self, name: str) -> bool:
        return name in self.program.functions

    def info(self, name: str) -> FunctionInfo:
        return self.function(name).info

    # ---- running ----------------------------------------------------------------------------
    def scratch_bytes(self, name: str, env: dict[str, int]) -> int:
        """Device bytes the function's own workspaces take in one call."""
        align = self.device.alignment
        return sum(align_up(max(w.nbytes(env), 1), align) for w in self.function(name).workspaces)

    def scratch_for(self, name: str, shapes: Sequence[tuple[int, ...]]) -> int:
        """:meth:`scratch_bytes` of a call whose arguments have ``shapes``."""
        return self.scratch_bytes(name, self.function(name).bind_dims(list(shapes)))

    def launches(self, name: str, args: Sequence[Any], shapes: Sequence[tuple[int, ...]],
                 scratch: DeviceBuffer | None = None, seed: Callable[[], DeviceBuffer] | None
                 = None, checks: DeviceBuffer | None = None, call: int = 0) -> list[Launch]:
        """The kernel launches of one call of function ``name``: ``args`` are its parameters
        in order (DeviceBuffers; values for scalar parameters), ``shapes`` their shapes
        (symbolic dims are read from them), ``scratch`` at least :meth:`scratch_bytes` of
        device memory for the function's workspaces, ``seed`` gives a buffer holding a fresh
        seed (default: :meth:`fresh_seed`), ``checks`` is the check record kernels that check
        indices write (:meth:`check_record`) and ``call`` the tag they write with it."""
        f = self.function(name)
        device = self.device
        env = f.bind_dims(list(shapes))
        for code, message in f.assumptions:
            if not shape_expr.evaluate(code, env):
                dims = ", ".join(f"{k} = {v}" for k, v in env.items())
                raise RuntimeCheckError(f"{message} ({dims})" if dims else message)
        workspaces = []
        offset = 0
        for w in f.workspaces:
            nbytes = max(w.nbytes(env), 1)
            if scratch is None or offset + nbytes > scratch.nbytes:
                raise KilnError(f"{name}: scratch memory too small for its workspaces")
            workspaces.append(device.view(scratch, offset, nbytes))
            offset += align_up(nbytes, device.alignment)
        kernels = self.kernels
        out: list[Launch] = []
        for k in f.kernels:
            grid = tuple(shape_expr.evaluate(g, env) for g in k.grid)
            if any(g <= 0 for g in grid):
                continue
            if any(not isinstance(g, int) for g in k.grid):
                device.check_grid(k.name, grid, self.limits)  # type: ignore[arg-type]
            values: list[Any] = []
            for a in k.args:
                if a.kind == "buffer":
                    values.append(args[a.index])
                elif a.kind == "workspace":
                    values.append(workspaces[a.index])
                elif a.kind == "sym":
                    values.append(np.int64(env[f.info.sym_vars[a.index]]))
                elif a.kind == "scalar":
                    value = args[a.index]
                    if isinstance(value, DeviceBuffer):  # a 0-d tensor of the plan
                        host = np.empty((), DataType(a.dtype).to_numpy())
                        device.download(value, host)
                        value = host
                    values.append(scalar_arg(value, DataType(a.dtype)))
                elif a.kind == "checks":
                    if checks is None:
                        raise KilnError(f"{name}: kernel {k.name} checks indices; give it a "
                                        "check record")
                    values.append(checks)
                elif a.kind == "call":
                    values.append(np.int64(call))
                else:
                    values.append((seed or self.fresh_seed)())
            out.append((kernels[k.name], grid, k.block, values,  # type: ignore[arg-type]
                        k.dynamic_shared_bytes))
        return out

    def run_function(self, name: str, args: Sequence[Any], shapes: Sequence[tuple[int, ...]],
                     scratch: DeviceBuffer | None = None, checks: DeviceBuffer | None = None
                     ) -> None:
        """Enqueue the kernels of one call of ``name`` (see :meth:`launches`)."""
        for launch in self.launches(name, args, shapes, scratch, checks=checks):
            self.device.launch(*launch)

    def check_record(self) -> DeviceBuffer:
        """A new, cleared check record on the device (see :mod:`kiln.runtime.gpu.program`)."""
        record = empty_check_record()
        buf = self.device.alloc(record.nbytes)
        self.device.upload(buf, record)
        return buf

    def read_check_record(self, buf: DeviceBuffer) -> np.ndarray:
        """The check record in ``buf`` (after the kernels that write it finished); a failure
        in it is cleared on the device, so the next run starts clean."""
        record = empty_check_record()
        self.device.download(buf, record)
        if record[0]:
            self.device.upload(buf, empty_check_record())
        return record

    @functools.cached_property
    def limits(self) -> Any:
        """The target's limits (grids evaluated at run time are checked against them)."""
        return Target(self.program.kind, arch=self.program.arch).gpu

    def fresh_seed(self, buf: DeviceBuffer | None = None) -> DeviceBuffer:
        """``buf`` (default: a new one) holding a new random uint64, the seed an unseeded
        random op reads."""
        buf = buf or self.device.alloc(8)
        self.device.upload(buf, np.frombuffer(os.urandom(8), dtype=np.uint64).copy())
        return buf

    def __getitem__(self, name: str):
        f = self.function(name)

        def call(*arrays: Any) -> None:
            self.run_host(f, arrays)

        return call

    def run_host(self, f: DeviceFunction, arrays: Sequence[Any]) -> None:
        """Run ``f`` on host arrays (destination passing; every buffer is copied back)."""
        info = f.info
        if len(arrays) != len(info.params):
            raise ArgumentError(f"{info.name}: expected {len(info.params)} arguments, got "
                                f"{len(arrays)}")
        device = self.device
        host, args, shapes = [], [], []
        for p, value in zip(info.params, arrays):
            if p.is_scalar:
                host.append(None)
                args.append(value)
                shapes.append(())
                continue
            arr = as_input_array(value, p.name, p.dtype)
            if arr.dtype != p.dtype.to_numpy() or arr.ndim != len(p.shape):
                raise ArgumentError(f"{info.name}: argument {p.name!r} expected "
                                    f"{p.dtype}{list(p.shape)}, got {arr.dtype}{arr.shape}")
            buf = device.alloc(arr.nbytes)
            device.upload(buf, arr)
            host.append(arr)
            args.append(buf)
            shapes.append(tuple(arr.shape))
        env = f.bind_dims(shapes)
        for p, shape in zip(info.params, shapes):
            for want, got in zip(p.shape, shape):
                if isinstance(want, int) and want != got:
                    raise ArgumentError(f"{info.name}: argument {p.name!r} expected shape "
                                        f"{p.shape}, got {shape}")
        scratch = device.alloc(self.scratch_bytes(info.name, env))
        checks = self.check_record() if f.has_checks else None
        self.run_function(info.name, args, shapes, scratch, checks)
        if checks is not None:
            failure = check_failure(self.read_check_record(checks), f)
            if failure is not None:
                raise RuntimeCheckError(f"{info.name}: {failure}")
        for value, arr, buf in zip(arrays, host, args):
            if arr is None:
                continue
            device.download(buf, arr)
            if arr is not value and isinstance(value, np.ndarray):
                value[...] = arr

    def __repr__(self) -> str:
        return (f"GpuModule({self.program.kind}, {len(self.program.functions)} functions, "
                f"{sum(len(f.kernels) for f in self.program.functions.values())} kernels)")

