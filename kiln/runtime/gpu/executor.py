"""GpuExecutor: runs a graph function's Plan on a GPU (CUDA, or OpenCL through PoCL).

The plan is the one the CPU runs (:mod:`kiln.runtime.plan`); what changes is where tensors
live. Constants are copied to the device once. Intermediates of static shape share one device
workspace laid out by the same static memory plan as on the CPU (:mod:`kiln.runtime.memory_plan`,
offsets aligned for the device); intermediates of symbolic shape are allocated when a run
needs them. Host<->device copies happen at the edge only:

- numpy inputs are copied into device buffers the executor keeps, and the outputs are copied
  back into fresh numpy arrays;
- device arrays (``torch.cuda`` tensors, CuPy arrays: anything whose DLPack device is CUDA) are
  used in place, and the outputs are new device arrays of the same framework, written in place
  by the kernels (zero copies).

Every kernel of every call is enqueued from one ``run`` (no synchronization in between). On
CUDA a static plan (no host steps) is recorded once as a CUDA Graph and replayed, with the
parameters of the nodes whose buffers changed (a caller's device arrays) updated first.

Host steps (run-time shapes, host functions; see :mod:`kiln.runtime.executor`) run on the
host: the tensors they read are copied back first, a host function's result is copied to the
device. Sequences, optionals and string tensors (``SlotSpec.is_host_value``) never go to the
device: their slots hold the Python value itself, which host functions read and write, and an
output of that kind is returned as the CPU executor returns it. Like the CPU executor, an
instance is not re-entrant.
"""

from __future__ import annotations

import time
from typing import Any

import numpy as np

from ...ir.dtype import DataType
from ...ir.errors import KilnError, RuntimeCheckError
from .. import host_values, memory_plan, shape_expr
from ..executor import Executor
from ..plan import Plan
from .device import DeviceBuffer
from .dlpack import DeviceArray, empty_like_framework, import_cuda_array, is_cuda_array
from .module import GpuModule, Launch
from .program import check_failure


class GpuExecutor(Executor):
    """Runs one Plan on the device of a :class:`GpuModule` (see the module docstring)."""

    def __init__(self, plan: Plan, module: GpuModule):  # noqa: D107 - no CPU setup
        self.plan = plan
        self.module = module
        self.device = device = module.device
        self._const: dict[int, Any] = {}
        for slot, arr in plan.constants.items():
            if plan.slots[slot].is_host_value:  # text stays on the host
                self._const[slot] = arr
                continue
            data = np.ascontiguousarray(arr)
            buf = device.alloc(data.nbytes)
            device.upload(buf, data)
            self._const[slot] = buf
        offsets, nbytes = memory_plan.place(memory_plan.live_intervals(plan), device.alignment)
        self._workspace = device.alloc(nbytes) if nbytes else None
        self._temps = {slot: device.view(self._workspace, off,  # type: ignore[arg-type]
                                         memory_plan.slot_nbytes(plan, slot))
                       for slot, off in offsets.items()}
        self._staging: dict[int, DeviceBuffer] = {}
        self._scratch: DeviceBuffer | None = None
        self._seeds: list[DeviceBuffer] = []
        self._graph: Any = None
        self._graph_launches: list[Launch] | None = None
        self.use_graphs = device.kind == "cuda" and not plan.has_host_steps
        #: the check record of the kernels that check indices (read after every run)
        self._checks = module.check_record() if any(
            module.function(c.func).has_checks for c in plan.calls if c.is_kernel) else None

    # ---- inputs -------------------------------------------------------------------------------
    def _input_array(self, value: Any, name: str, dtype: DataType) -> Any:
        if is_cuda_array(value):
            if self.device.kind != "cuda":
                raise KilnError(f"input {name!r}: a CUDA array given to an executable built for "
                                f"{self.device.kind}")
            return import_cuda_array(value, name)
        return super()._input_array(value, name, dtype)

    def _buffer(self, key: int, nbytes: int) -> DeviceBuffer:
        """The executor's device buffer ``key`` (an input or output slot), grown as needed."""
        buf = self._staging.get(key)
        if buf is None or buf.nbytes < nbytes:
            buf = self._staging[key] = self.device.alloc(nbytes)
        return self.device.view(buf, 0, nbytes)

    def _scratch_of(self, nbytes: int) -> DeviceBuffer | None:
        if nbytes == 0:
            return None
        if self._scratch is None or self._scratch.nbytes < nbytes:
            self._scratch = self.device.alloc(nbytes)
        return self._scratch

    # ---- running ------------------------------------------------------------------------------
    def run(self, *args: Any) -> Any:
        arrays, env = self._bind_inputs(args)
        return self._execute(arrays, env)

    def _execute(self, arrays: list[Any], env: dict[str, int],
                 times: list[float] | None = None) -> Any:
        plan, device, module = self.plan, self.device, self.module
        n = len(plan.slots)
        bufs: list[Any] = [None] * n
        shapes: list[Any] = [None] * n
        template = next((a.obj for a in arrays if isinstance(a, DeviceArray)), None)
        for slot, arr in zip(plan.input_slots, arrays):
            if plan.slots[slot].is_host_value:
                bufs[slot] = arr
            elif isinstance(arr, DeviceArray):
                bufs[slot] = arr.buffer
            else:
                bufs[slot] = self._buffer(slot, arr.nbytes)
                device.upload(bufs[slot], arr)
            shapes[slot] = tuple(getattr(arr, "shape", ()))
        for slot, buf in self._const.items():
            bufs[slot] = buf
            shapes[slot] = tuple(plan.constants[slot].shape)
        for slot, buf in self._temps.items():
            bufs[slot] = buf
            shapes[slot] = tuple(plan.slots[slot].shape)
        framework_out: dict[int, Any] = {}
        launches: list[Launch] = []
        seeds = iter(self._seeds)

        def seed() -> DeviceBuffer:
            buf = next(seeds, None)
            if buf is None:
                buf = device.alloc(8)
                self._seeds.append(buf)
            return module.fresh_seed(buf)

        for index, call in enumerate(plan.calls):
            if not call.is_kernel:
                self._flush(launches)
                self._raise_failed_check()
                launches = []
                self._gpu_host_step(call, bufs, shapes, env)
                continue
            for s in call.args[len(call.args) - call.num_outputs:]:
                if bufs[s] is None:
                    self._allocate(s, bufs, shapes, env, template, framework_out)
            args = [bufs[s] for s in call.args]
            arg_shapes = [shapes[s] for s in call.args]
            scratch = self._scratch_of(module.scratch_for(call.func, arg_shapes))
            try:
                new = module.launches(call.func, args, arg_shapes, scratch, seed, self._checks,
                                      index)
            except RuntimeCheckError as err:  # a condition on the symbolic dims
                raise RuntimeCheckError(f"{self._step_name(call)}: {err}") from None
            if times is not None:
                start = time.perf_counter()
                for launch in new:
                    device.launch(*launch)
                device.synchronize()
                times.append(time.perf_counter() - start)
            else:
                launches += new
        self._flush(launches)
        self._raise_failed_check()
        return self._results(plan.outputs, bufs, shapes, framework_out)

    def _raise_failed_check(self) -> None:
        """Raise the RuntimeCheckError of an index check a kernel failed (read back from the
        check record after the kernels enqueued so far; a host step reads tensors anyway)."""
        if self._checks is None:
            return
        record = self.module.read_check_record(self._checks)
        if not record[0]:
            return
        tag = int(record[5])
        if not 0 <= tag < len(self.plan.calls):
            raise RuntimeCheckError(f"{self.plan.name}: an index check failed in a call "
                                    f"tagged {tag}, which the plan does not have")
        call = self.plan.calls[tag]
        failure = check_failure(record, self.module.function(call.func))
        raise RuntimeCheckError(f"{self._step_name(call)}: {failure}")

    def _allocate(self, slot: int, bufs: list[Any], shapes: list[Any], env: dict[str, int],
                  template: Any, framework_out: dict[int, Any]) -> None:
        spec = self.plan.slots[slot]
        shape = tuple(shape_expr.evaluate(d, env) for d in spec.shape)
        np_dtype = np.dtype(spec.dtype.to_numpy())
        nbytes = int(np.prod(shape, dtype=np.int64)) * np_dtype.itemsize
        shapes[slot] = shape
        if spec.kind == "output" and template is not None:
            arr = empty_like_framework(template, shape, np_dtype)
            if arr is not None:
                framework_out[slot] = arr
                bufs[slot] = import_cuda_array(arr, f"output {slot}").buffer
                return
        if spec.kind == "output":
            bufs[slot] = self._buffer(slot, nbytes)
        else:
            bufs[slot] = self.device.alloc(nbytes)

    def _flush(self, launches: list[Launch]) -> None:
        """Enqueue ``launches``: through the CUDA Graph of a static plan, else one by one."""
        if not launches:
            return
        device = self.device
        if self.use_graphs:
            try:
                self._replay(launches)
                return
            except KilnError:
                self.use_graphs = False  # e.g. a driver without graph updates: launch plainly
                self._graph = None
        for launch in launches:
            device.launch(*launch)

    def _replay(self, launches: list[Launch]) -> None:
        if self._graph is None or self._graph_launches is None or len(
                self._graph_launches) != len(launches):
            self._graph = self.device.graph(launches)  # type: ignore[attr-defined]
            self._graph_launches = launches
        else:
            for i, (old, new) in enumerate(zip(self._graph_launches, launches)):
                if not _same_launch(old, new):
                    self._graph.update(i, new)
            self._graph_launches = launches
        self._graph.launch()

    def _results(self, out: Any, bufs: list[Any], shapes: list[Any],
                 framework_out: dict[int, Any]) -> Any:
        if isinstance(out, list):
            return tuple(self._results(o, bufs, shapes, framework_out) for o in out)
        if out in framework_out:
            self.device.synchronize()
            return framework_out[out]
        spec = self.plan.slots[out]
        if spec.is_host_value:
            return host_values.copy_value(bufs[out])
        arr = np.empty(shapes[out], spec.dtype.to_numpy())
        self.device.download(bufs[out], arr)
        return arr

    # ---- host steps ---------------------------------------------------------------------------
    def _gpu_host_step(self, call: Any, bufs: list[Any], shapes: list[Any],
                       env: dict[str, int]) -> None:
        """A host step on host copies of the tensors it reads (see the module docstring)."""
        plan = self.plan
        host: list[Any] = [None] * len(plan.slots)
        reads = call.args if call.kind != "host_func" else call.args[:len(call.args) - 1]
        for s in reads:
            if plan.slots[s].is_host_value:
                host[s] = bufs[s]
            elif bufs[s] is not None:
                arr = np.empty(shapes[s], plan.slots[s].dtype.to_numpy())
                self.device.download(bufs[s], arr)
                host[s] = arr
        self._host_step(call, host, env)
        if call.kind == "host_func":
            out = call.args[-1]
            result = host[out]
            if plan.slots[out].is_host_value:
                bufs[out] = result
                return
            bufs[out] = self.device.alloc(result.nbytes)
            self.device.upload(bufs[out], result)
            shapes[out] = tuple(result.shape)

    # ---- profiling ----------------------------------------------------------------------------
    def call_samples(self, *args: Any, repeat: int = 10) -> tuple[list[str], np.ndarray]:
        """Wall time of every kernel call (its kernels enqueued, then the device synchronized),
        over ``repeat`` runs after a warm-up."""
        if not isinstance(repeat, int) or isinstance(repeat, bool) or repeat < 1:
            raise KilnError(f"profile: repeat must be a positive int, got {repeat!r}")
        kernels = [c.func for c in self.plan.calls if c.is_kernel]
        samples = np.zeros((repeat + 1, len(kernels)))
        for run in range(repeat + 1):
            arrays, env = self._bind_inputs(args)
            times: list[float] = []
            self._execute(arrays, env, times)
            samples[run] = times
        return kernels, samples[1:]


def _same_launch(a: Launch, b: Launch) -> bool:
    if a[0] is not b[0] or a[1] != b[1] or a[2] != b[2] or a[4] != b[4]:
        return False
    for x, y in zip(a[3], b[3]):
        if isinstance(x, DeviceBuffer) or isinstance(y, DeviceBuffer):
            if not (isinstance(x, DeviceBuffer) and isinstance(y, DeviceBuffer)
                    and x.handle == y.handle):
                return False
        elif x != y:
            return False
    return True

