"""Executor: runs a graph function's Plan by calling its native kernels in order.

Inputs are checked against the function's signature before any kernel touches memory (a wrong
shape or dtype raises ArgumentError naming the input and both values). Constants are bound once
and shared by every call; intermediates of static shape live in a workspace laid out by the
plan's memory plan (``memory_plan``: temps not live at the same time share bytes);
intermediates of symbolic shape are allocated per run; outputs are fresh arrays each run, owned
by the caller.

Calls are thread-safe: everything a call writes besides its outputs -- the workspace, the
pointer arrays handed to the native entry, the frames of symbolic bindings -- is a
:class:`CallState`. A call takes one from the executor's pool (a new one when every state is
busy) and puts it back afterwards, so concurrent calls from several Python threads never share
one, and a thread that calls again reuses a warm workspace. ctypes releases the GIL around the
native call, so concurrent calls really run at the same time; their parallel loops run on the
library's thread pool with the executable's thread count (``kiln.runtime.threads``).

Plans with host steps (run-time shapes, ``kiln.runtime.shape_funcs``) bind symbolic names while
they run: a shape function step reads tensor values on the host, a match step binds the graph's
symbolic dims from them, and every tensor of symbolic shape is allocated just before the kernel
that writes it, once the names its shape uses are bound. A host function step
(``kiln.runtime.host_funcs``) computes a tensor in Python and binds its output's dim names; a
control-flow step (``kiln.runtime.control_flow``: If, Loop, Scan) runs other graph functions'
executors, which ``functions`` (set by the Executable) looks up by name. Sequences, optionals
and string tensors are held as Python values in their slots (lists of arrays, None or a value,
object arrays of ``str``), checked where they enter and copied where they leave
(``kiln.runtime.host_values``).

A plan with a whole-model native entry (``plan.entry``, see ``kiln.codegen.graph_entry``) runs
with one ctypes call after the Python input checks; other plans call each kernel's checked
entry in turn. When that plan has symbolic shapes (a dynamic batch), the executor evaluates
every slot's shape, plans the temps' memory and lays out the entry's ``temps`` and ``sym``
arrays once per binding of the symbolic names (a :class:`_Frame`, cached); the workspace is
one buffer, grown to the largest binding seen.
"""

from __future__ import annotations

import ctypes
import math
import time
from collections.abc import Sequence
from typing import Any

import numpy as np

from ..ir.dtype import DataType
from ..ir.errors import (
    ArgumentError,
    KilnError,
    MemoryLimitError,
    RuntimeCheckError,
    internal_error,
)
from ..ir.span import describe
from . import control_flow, host_funcs, host_values, memory_plan, shape_expr, shape_funcs, threads
from .ndarray import data_address
from .plan import Plan


def _fmt_shape(shape: Sequence[Any]) -> str:
    dims = [d if isinstance(d, int) else _fmt_dim(d) for d in shape]
    return "(" + ", ".join(str(d) for d in dims) + ("," if len(dims) == 1 else "") + ")"


_fmt_dim = shape_expr.to_str


def _flat(x: Any) -> list[Any]:
    return [y for e in x for y in _flat(e)] if isinstance(x, list) else [x]


def _map_outputs(out: Any, position: dict[int, int]) -> Any:
    """A plan's output structure (a slot, or nested lists of them) with each slot replaced by
    ``position[slot]``."""
    if isinstance(out, list):
        return [_map_outputs(o, position) for o in out]
    return position[out]


def _pick(where: Any, arrays: list[Any]) -> Any:
    """``where`` (from :func:`_map_outputs`) with each position replaced by its array; lists
    become tuples, as the graph function's tuple results."""
    if isinstance(where, list):
        return tuple(_pick(w, arrays) for w in where)
    return arrays[where]


def as_input_array(value: Any, name: str, dtype: DataType) -> np.ndarray:
    """Zero-copy view of an input (numpy or any ``__dlpack__`` producer) as a numpy array.

    Python scalars and lists are converted to the expected dtype; arrays must already have it
    (kiln never casts silently). A non-contiguous array is returned as it is: the executor
    copies it once its shape has been checked (a broadcast view may stand for terabytes).
    """
    if isinstance(value, np.ndarray):
        arr = value
    elif hasattr(value, "__dlpack__"):
        try:
            arr = np.from_dlpack(value)
        except (TypeError, BufferError, RuntimeError) as err:
            raise ArgumentError(
                f"input {name!r}: cannot view {type(value).__name__} through DLPack ({err}); "
                "kiln runs on CPU memory"
            ) from err
    elif isinstance(value, (int, float, bool, list, tuple, np.generic)):
        try:
            arr = np.asarray(value, dtype=dtype.to_numpy())
        except (OverflowError, ValueError, TypeError) as err:
            raise ArgumentError(f"input {name!r}: {type(value).__name__} value is not a "
                                f"{dtype} array ({err})") from err
    else:
        got = "None" if value is None else type(value).__name__
        raise ArgumentError(
            f"input {name!r}: expected an array (numpy or __dlpack__), got {got}"
        )
    return arr


def slot_shape(plan: Plan, slot: int, env: dict[str, int]) -> tuple[int, ...]:
    """The shape of ``slot`` for the bound names ``env``: an ArgumentError naming the step that
    makes it when a dim comes out negative (inputs the model's arithmetic does not fit: a
    pooling window larger than a symbolic input dim)."""
    shape = tuple(shape_expr.evaluate(d, env) for d in plan.slots[slot].shape)
    if any(d < 0 for d in shape):
        maker = next((c for c in plan.calls if slot in c.args[len(c.args) - c.num_outputs:]),
                     None)
        where = describe(maker.span, maker.func) if maker is not None else f"slot {slot}"
        names = ", ".join(f"{k} = {v}" for k, v in sorted(env.items()))
        raise ArgumentError(f"{plan.name}: {where}: the result would have the negative shape "
                            f"{shape} for {names}: the inputs do not fit the model")
    return shape


#: Bindings of symbolic names whose frames an executor keeps (see :class:`_Frame`).
MAX_FRAMES = 64


class _Frame:
    """What a native entry over symbolic shapes needs for one binding of the names: the output
    shapes, the temps' workspace offsets and bytes, their data pointers (once placed in a
    workspace) and the kernels' ``sym`` values."""

    def __init__(self, plan: Plan, env: dict[str, int]):
        shapes = [slot_shape(plan, slot, env) for slot in range(len(plan.slots))]
        self.shapes = shapes
        self.out_shapes = [shapes[s] for s, spec in enumerate(plan.slots) if spec.kind == "output"]
        self.offsets, self.nbytes = memory_plan.plan_memory(plan, shapes)
        self.temp_slots = [s for s, spec in enumerate(plan.slots) if spec.kind == "temp"]
        self.temps = (ctypes.c_void_p * max(len(self.temp_slots), 1))()
        sym = [shapes[call.args[arg]][axis]
               for call, dims in zip(plan.calls, plan.entry_sym_dims or ())
               for arg, axis in dims]
        self.sym = (ctypes.c_int64 * max(len(sym), 1))(*sym)

    def place(self, base: int) -> None:
        """Point the temps into a workspace whose data starts at address ``base``."""
        for i, slot in enumerate(self.temp_slots):
            self.temps[i] = base + self.offsets[slot] if slot in self.offsets else None


class _Segment:
    """A segment entry (``plan.segments``) ready to call: the C function, the calls it runs
    with their output slots, the slots its kernels read, and ``(slot, axis)`` of each value of
    its ``sym`` array."""

    def __init__(self, plan: Plan, seg: dict[str, Any], fn: Any):
        self.fn = fn
        self.stop = int(seg["stop"])
        calls = plan.calls[int(seg["start"]):self.stop]
        #: (call, slot, numpy dtype) of every slot the segment's kernels write
        self.writes = [(c, s, np.dtype(plan.slots[s].dtype.to_numpy()))
                       for c in calls for s in c.args[len(c.args) - c.num_outputs:]]
        self.reads = {s for c in calls for s in c.args[:len(c.args) - c.num_outputs]}
        self.sym = [(c.args[arg], axis)
                    for c, dims in zip(calls, seg["sym_dims"]) for arg, axis in dims]


#: Call states an executor keeps for reuse; more concurrent calls make extra ones, dropped
#: after use (each holds a workspace of ``plan.workspace_bytes``).
POOL_SIZE = 8


class CallState:
    """What one call writes besides its outputs (see the module docstring): the workspace and
    the static temps in it (or beside it, for temps the memory plan left out), the input and
    output pointer arrays of the native entry, and, for an entry over symbolic shapes, the
    frames of the bindings seen so far with the workspace they point into."""

    def __init__(self, plan: Plan, num_outputs: int):
        # made once a call's inputs passed the checks, and only if one run fits the memory
        # limit (a MemoryLimitError giving the size otherwise)
        memory_plan.check_run_memory(plan)
        self.workspace = memory_plan.aligned_workspace(plan.workspace_bytes)
        self.ws_ptr = self.workspace.ctypes.data
        self.temps: dict[int, np.ndarray] = {}
        for slot, spec in enumerate(plan.slots):
            if slot in plan.workspace_offsets:
                self.temps[slot] = memory_plan.temp_view(self.workspace, plan, slot)
            elif (spec.kind == "temp" and not spec.is_host_value
                  and all(shape_expr.is_static(d) for d in spec.shape)):
                self.temps[slot] = memory_plan.aligned_empty(spec.shape, spec.dtype.to_numpy())
        self.in_ptrs = (ctypes.c_void_p * max(len(plan.input_slots), 1))()
        self.out_ptrs = (ctypes.c_void_p * max(num_outputs, 1))()
        self.frames: dict[tuple[tuple[str, int], ...], _Frame] = {}
        #: the segment entries' slot pointers of the constants and static temps (made on the
        #: first run through segments, see ``Executor._run_segments``)
        self.slot_ptrs: Any = None
        self.dyn_workspace = memory_plan.aligned_workspace(0)

    def frame(self, plan: Plan, env: dict[str, int]) -> _Frame:
        """The frame of this binding of the symbolic names, made (and the workspace grown)
        on its first use."""
        key = tuple(sorted(env.items()))
        frame = self.frames.get(key)
        if frame is not None:
            return frame
        frame = _Frame(plan, env)
        memory_plan.check_run_memory(plan, frame.shapes, frame.nbytes)
        if frame.nbytes > self.dyn_workspace.nbytes:
            # the frames made so far point into the old buffer
            self.frames.clear()
            self.dyn_workspace = memory_plan.aligned_workspace(frame.nbytes)
        frame.place(self.dyn_workspace.ctypes.data)
        if len(self.frames) >= MAX_FRAMES:
            self.frames.pop(next(iter(self.frames)))
        self.frames[key] = frame
        return frame


def _simple_input_specs(plan: Plan) -> list[tuple[np.dtype, tuple[int | str, ...]]] | None:
    """Per input, (numpy dtype, dims as ints or symbolic names) when every input is a numeric
    tensor whose dims are numbers or plain symbolic names (what ``Executor._bind_simple``
    checks); None when an input is a host value, a string tensor or has a compound dim."""
    specs = []
    for slot in plan.input_slots:
        spec = plan.slots[slot]
        if spec.form != "tensor" or spec.dtype.is_string:
            return None
        dims: list[int | str] = []
        for d in spec.shape:
            if isinstance(d, int):
                dims.append(d)
            elif isinstance(d, list) and d[0] == "var":
                dims.append(str(d[1]))
            else:
                return None
        specs.append((spec.dtype.to_numpy(), tuple(dims)))
    return specs


class Executor:
    """Runs one Plan against a loaded native Module (thread-safe, see the module docstring).

    ``num_threads``: the thread count of this executor's calls, from whichever thread they are
    made (None: the library's default, see ``kiln.runtime.threads``)."""

    #: What ``_bind_simple`` checks (None: every call takes the general binding; subclasses
    #: that set up their own state, as the GPU executor, keep that).
    _simple_inputs: list[tuple[np.dtype, tuple[int | str, ...]]] | None = None

    def __init__(self, plan: Plan, module: Any, num_threads: int | None = None):
        self.plan = plan
        self.module = module
        self.num_threads = num_threads
        self._set_threads = threads.setter(module)
        #: ``name -> Executor`` of the sibling graph functions that control-flow steps run
        #: (set by the Executable; None: the plan has no such step).
        self.functions: Any = None
        #: Constants, bound once and shared by every call (read only).
        self._consts_by_slot: dict[int, np.ndarray] = {
            # plans made by kiln.build or kiln.load hold aligned constants already (no copy)
            slot: memory_plan.aligned_copy(plan.constants[slot])
            for slot, spec in enumerate(plan.slots) if spec.kind == "const"
        }
        self._out_slots = [s for s, spec in enumerate(plan.slots) if spec.kind == "output"]
        self._simple_inputs = _simple_input_specs(plan)
        self._pool: list[CallState] = []
        self._entry = self._profile_entry = None
        self._fast = None
        self._fast_outputs: Any = None
        self._funcs: dict[str, Any] | None = None
        self._segments = self._setup_segments()
        if plan.entry is not None:
            self._setup_entry(plan.entry)
            self._fast = self._fast_path()
        elif not self._segments:  # the kernels' checked entries, called one by one
            self._funcs = {c.func: module[c.func] for c in plan.calls if c.is_kernel}

    # ---- per-call state -----------------------------------------------------------------
    def acquire(self) -> CallState:
        """A call state no other call is using (from the pool, else a new one)."""
        try:
            return self._pool.pop()  # atomic: concurrent calls never get the same state
        except IndexError:
            return CallState(self.plan, len(self._out_slots))

    def release(self, state: CallState) -> None:
        """Give ``state`` back for later calls (kept only while the pool is small)."""
        if len(self._pool) < POOL_SIZE:
            self._pool.append(state)

    def _setup_entry(self, symbol: str) -> None:
        plan = self.plan
        self._dynamic = plan.entry_sym_dims is not None
        nargs = 5 if self._dynamic else 4
        fn = getattr(self.module.lib, symbol)
        fn.restype = ctypes.c_int32
        fn.argtypes = (ctypes.c_void_p,) * nargs
        self._entry = fn
        # the profiling twin; a library saved before it existed has none (profile then calls
        # the kernels' checked entries one by one)
        self._profile_entry = getattr(self.module.lib, plan.profile_entry, None)
        if self._profile_entry is not None:
            self._profile_entry.restype = ctypes.c_int32
            self._profile_entry.argtypes = (ctypes.c_void_p,) * (nargs + 1)
        self._out_specs = [(tuple(plan.slots[s].shape), plan.slots[s].dtype.to_numpy())
                           for s in self._out_slots]
        consts = [self._consts_by_slot[s] for s in sorted(plan.constants)]
        self._consts = (ctypes.c_void_p * max(len(consts), 1))(*[a.ctypes.data for a in consts])

    def _setup_segments(self) -> dict[int, _Segment]:
        """The plan's segment entries by first call (``kiln.codegen.graph_entry``); none when
        the library lacks one of them (the kernels are then called one by one)."""
        lib = getattr(self.module, "lib", None)
        out = {}
        for seg in self.plan.segments:
            fn = getattr(lib, seg["symbol"], None) if lib is not None else None
            if fn is None:
                return {}
            fn.restype = ctypes.c_int32
            fn.argtypes = (ctypes.c_void_p, ctypes.c_void_p)
            out[seg["start"]] = _Segment(self.plan, seg, fn)
        return out

    # ---- argument checking --------------------------------------------------------------
    def _input_array(self, value: Any, name: str, dtype: DataType) -> Any:
        """An input as an array with ``shape``/``dtype`` (the GPU executor also takes device
        arrays)."""
        return as_input_array(value, name, dtype)

    def _bind_simple(self, args: Sequence[Any]) -> tuple[list[np.ndarray], dict[str, int]] | None:
        """:meth:`_bind_inputs` in a few comparisons per input for C-contiguous numpy arrays
        of the plan's dtypes and ranks whose dims are numbers or plain symbolic names
        (``_simple_input_specs``; a run-time Loop's body is bound this way every iteration:
        ~3x less Python than the general checks); None (nothing bound) for anything else,
        which takes the general path and its errors."""
        specs = self._simple_inputs
        if specs is None or len(args) != len(specs):
            return None
        env: dict[str, int] = {}
        for (dt, dims), arr in zip(specs, args):
            if (type(arr) is not np.ndarray or arr.dtype != dt or arr.ndim != len(dims)
                    or not arr.flags.c_contiguous):
                return None
            for want, got in zip(dims, arr.shape):
                if type(want) is str:
                    if env.setdefault(want, got) != got:
                        return None
                elif want != got:
                    return None
        if self.plan.dim_ranges:
            self._check_ranges(env)
        return list(args), env

    def _bind_inputs(self, args: Sequence[Any]) -> tuple[list[np.ndarray], dict[str, int]]:
        bound = self._bind_simple(args)
        if bound is not None:
            return bound
        plan = self.plan
        fname = plan.name
        if len(args) != len(plan.input_slots):
            raise ArgumentError(
                f"{fname}: expected {len(plan.input_slots)} input(s) "
                f"({', '.join(plan.input_names)}) but got {len(args)}"
            )
        env: dict[str, int] = {}
        arrays = []
        for name, slot, value in zip(plan.input_names, plan.input_slots, args):
            spec = plan.slots[slot]
            if spec.form != "tensor":  # a sequence or optional (kiln.runtime.host_values)
                arrays.append(host_values.check_value(value, spec, f"{fname}: input {name!r}"))
                continue
            arr = (host_values.string_array(value, f"{fname}: input {name!r}")
                   if spec.dtype.is_string else self._input_array(value, name, spec.dtype))
            want_np = spec.dtype.to_numpy()
            if arr.dtype != want_np:
                raise ArgumentError(
                    f"{fname}: input {name!r} expected dtype {spec.dtype} but got "
                    f"{DataType.from_numpy(arr.dtype) if arr.dtype.kind in 'biuf' else arr.dtype}"
                )
            if arr.ndim != len(spec.shape):
                raise ArgumentError(
                    f"{fname}: input {name!r} expected shape {_fmt_shape(spec.shape)} "
                    f"(rank {len(spec.shape)}) but got {tuple(arr.shape)} (rank {arr.ndim})"
                )
            for axis, (want, got) in enumerate(zip(spec.shape, arr.shape)):
                if isinstance(want, list) and want[0] == "var" and want[1] not in env:
                    env[want[1]] = int(got)
                    continue
                expected = shape_expr.evaluate(want, env) if isinstance(want, list) else want
                if isinstance(want, list) and want[0] != "var":
                    continue  # compound dims are checked once all vars are bound (below)
                if expected != got:
                    raise ArgumentError(
                        f"{fname}: input {name!r} expected shape {_fmt_shape(spec.shape)} but "
                        f"got {tuple(arr.shape)} (axis {axis}: {expected} != {got})"
                    )
            arrays.append(arr)
        for name, slot, arr in zip(plan.input_names, plan.input_slots, arrays):
            if plan.slots[slot].form != "tensor":
                continue
            for axis, want in enumerate(plan.slots[slot].shape):
                if isinstance(want, list) and want[0] != "var":
                    expected = shape_expr.evaluate(want, env)
                    if expected != arr.shape[axis]:
                        raise ArgumentError(
                            f"{fname}: input {name!r} expected shape "
                            f"{_fmt_shape(plan.slots[slot].shape)} but got {tuple(arr.shape)}"
                        )
        if plan.dim_ranges:
            self._check_ranges(env)
        for k, (name, arr) in enumerate(zip(plan.input_names, arrays)):
            if isinstance(arr, np.ndarray) and not arr.flags.c_contiguous:
                memory_plan.check_memory(arr.nbytes, f"{fname}: input {name!r} (not contiguous: "
                                                     "kiln copies it)")
                arrays[k] = np.ascontiguousarray(arr)
        return arrays, env

    def _check_ranges(self, env: dict[str, int]) -> None:
        """ArgumentError naming the input and axis of the first dim bound outside the range
        the model was exported for (``plan.dim_ranges``)."""
        plan = self.plan
        for dim, (lo, hi) in plan.dim_ranges.items():
            size = env.get(dim)
            if size is None or (size >= lo and (hi is None or size <= hi)):
                continue
            where = next((f"input {n!r} axis {axis}"
                          for n, slot in zip(plan.input_names, plan.input_slots)
                          for axis, d in enumerate(plan.slots[slot].shape)
                          if d == ["var", dim]), "an input")
            raise ArgumentError(
                f"{plan.name}: {where} has size {size}, outside the range "
                f"[{lo}, {'inf' if hi is None else hi}] of dim {dim!r} the model was "
                "exported for")

    # ---- running ------------------------------------------------------------------------
    def run(self, *args: Any) -> Any:
        """One call. The inputs are checked before a call state (workspace) is taken; a
        KilnError passes as it is, running out of memory is a MemoryLimitError and anything
        else an InternalError naming the function (never a bare traceback)."""
        threads.use(self._set_threads, self.num_threads)
        try:
            if self._fast is not None:
                out = self._run_fast(args)
                if out is not None:
                    return out
            arrays, env = self._bind_inputs(args)
            state = self.acquire()
            try:
                if self._entry is not None:
                    return self._run_entry(state, arrays, env)
                return self._run_steps(state, arrays, env, self._funcs)
            finally:
                self.release(state)
        except KilnError:
            raise
        except MemoryError as err:
            raise MemoryLimitError(f"{self.plan.name}: out of memory while running (the "
                                   "memory limit is above what the machine can give; set "
                                   f"{memory_plan.MEMORY_LIMIT_ENV} lower)") from err
        except Exception as err:  # noqa: BLE001 - never a bare traceback from a run
            raise internal_error(f"running {self.plan.name}", err) from err

    def _fast_path(self) -> list[tuple[tuple[int, ...], np.dtype]] | None:
        """``[(input shape, numpy dtype)...]`` that :meth:`_run_fast` checks, for a plan with a
        native entry, static input shapes and outputs that are its ``output`` slots, each
        once (what it returns is then always fresh arrays); None otherwise."""
        plan = self.plan
        if self._entry is None or self._dynamic:
            return None
        specs = []
        for slot in plan.input_slots:
            spec = plan.slots[slot]
            if not all(isinstance(d, int) for d in spec.shape):
                return None
            specs.append((tuple(spec.shape), spec.dtype.to_numpy()))
        if sorted(_flat(plan.outputs)) != sorted(self._out_slots):
            return None
        position = {slot: i for i, slot in enumerate(self._out_slots)}
        self._fast_outputs = _map_outputs(plan.outputs, position)
        return specs

    def _run_fast(self, args: Sequence[Any]) -> Any:
        """One call of a static model on C-contiguous numpy inputs of the exact shapes and
        dtypes, checked in a few comparisons (a 784-1024-1024-10 MLP at batch 1 runs in ~0.1
        ms, and the general path's argument binding took ~20 us of Python per call); None
        (nothing run) for any other arguments, which take the general path and its errors.
        Its outputs are the plan's output slots, each once (see :meth:`_fast_path`), so they
        are returned as made, in the outputs' structure (``_fast_outputs``). About 5 us of
        Python per call for one input and output (13 us before the addresses went through
        :func:`data_address` and this path stopped building the general one's slot maps)."""
        specs = self._fast
        if len(args) != len(specs):
            return None
        for i, arr in enumerate(args):
            shape, dt = specs[i]
            if (type(arr) is not np.ndarray or arr.shape != shape or arr.dtype != dt
                    or not arr.flags.c_contiguous):
                return None
        state = self.acquire()  # the inputs are right: now the workspace
        try:
            in_ptrs = state.in_ptrs
            for i, arr in enumerate(args):
                in_ptrs[i] = data_address(arr)
            outs = self._new_outputs(state)
            rc = self._entry(in_ptrs, state.out_ptrs, state.ws_ptr, self._consts)
        finally:
            self.release(state)
        if rc:
            raise self._check_failed(rc - 1)
        where = self._fast_outputs
        if type(where) is int:
            return outs[where]
        return _pick(where, outs)

    def _new_outputs(self, state: CallState, shapes: Sequence[tuple[int, ...]] | None = None
                     ) -> list[np.ndarray]:
        """Fresh arrays for the entry's outputs (of these shapes, else the static ones), their
        addresses set in the state's output pointers."""
        out_ptrs = state.out_ptrs
        outs = []
        for i, (shape, dt) in enumerate(self._out_specs):
            arr = np.empty(shape if shapes is None else shapes[i], dt)
            out_ptrs[i] = data_address(arr)
            outs.append(arr)
        return outs

    def _values(self, state: CallState, arrays: list[np.ndarray]) -> list[Any]:
        """The arrays of a call's slots known before it runs: inputs, constants, static temps."""
        values: list[Any] = [None] * len(self.plan.slots)
        for slot, arr in zip(self.plan.input_slots, arrays):
            values[slot] = arr
        for table in (self._consts_by_slot, state.temps):
            for slot, arr in table.items():
                values[slot] = arr
        return values

    def _run_steps(self, state: CallState, arrays: list[np.ndarray], env: dict[str, int],
                   funcs: dict[str, Any] | None, times: list[float] | None = None) -> Any:
        """Run the plan call by call (host steps included); with ``times``, append each kernel
        call's wall time to it. Without, a plan with segment entries runs each run of kernels
        between host steps in one native call (:meth:`_run_segments`)."""
        if times is None and self._segments:
            return self._run_segments(state, arrays, env)
        plan = self.plan
        if funcs is None:
            funcs = {c.func: self.module[c.func] for c in plan.calls if c.is_kernel}
        values = self._values(state, arrays)
        allocated = 0
        for call in plan.calls:
            if not call.is_kernel:
                self._host_step(call, values, env)
                continue
            for s in call.args[len(call.args) - call.num_outputs:]:
                if values[s] is None:  # symbolic shape: its names are bound by now
                    spec = plan.slots[s]
                    shape = slot_shape(plan, s, env)
                    allocated += memory_plan.slot_nbytes(plan, s, shape)
                    memory_plan.check_memory(allocated, f"{self._step_name(call)} (with what "
                                                        "this run allocated before it)")
                    values[s] = memory_plan.aligned_empty(shape, spec.dtype.to_numpy())
            kernel_args = [values[s] for s in call.args]
            start = time.perf_counter()
            try:
                funcs[call.func](*kernel_args)
            except RuntimeCheckError as err:
                raise RuntimeCheckError(f"{self._step_name(call)}: {err}") from None
            if times is not None:
                times.append(time.perf_counter() - start)
        return self._collect(plan.outputs, values)

    def _run_segments(self, state: CallState, arrays: list[np.ndarray], env: dict[str, int]
                      ) -> Any:
        """Run the host steps in Python and each run of kernels between them through its
        segment entry, on one array of slot pointers. A tensor a host step made (an If's
        result, a host function's) is checked against its slot's dtype and shape before a
        kernel reads it -- what the kernels' checked entries did; the kernels' own outputs are
        allocated here from the plan's shapes."""
        plan = self.plan
        values = self._values(state, arrays)
        template = state.slot_ptrs
        if template is None:  # the constants' and static temps' addresses, once per state
            template = state.slot_ptrs = (ctypes.c_void_p * max(len(values), 1))()
            for table in (self._consts_by_slot, state.temps):
                for s, v in table.items():
                    if type(v) is np.ndarray:
                        template[s] = data_address(v)
        ptrs = (ctypes.c_void_p * len(template))()
        ctypes.memmove(ptrs, template, ctypes.sizeof(template))
        for s, v in zip(plan.input_slots, arrays):
            if type(v) is np.ndarray:
                ptrs[s] = data_address(v)
        from_host: set[int] = set()
        allocated, limit = 0, memory_plan.memory_limit()
        calls, k = plan.calls, 0
        while k < len(calls):
            seg = self._segments.get(k)
            if seg is None:
                call = calls[k]
                self._host_step(call, values, env)
                from_host.update(call.args[len(call.args) - call.num_outputs:])
                k += 1
                continue
            for s in from_host.intersection(seg.reads):
                values[s] = self._host_tensor(s, values[s], env)
                ptrs[s] = data_address(values[s])
                from_host.discard(s)
            allocated = self._allocate_segment(seg, values, ptrs, env, allocated, limit)
            sym = ((ctypes.c_int64 * len(seg.sym))(*[values[s].shape[a] for s, a in seg.sym])
                   if seg.sym else None)
            rc = seg.fn(ptrs, sym)
            if rc:
                raise self._check_failed(k + rc - 1)
            k = seg.stop
        return self._collect(plan.outputs, values)

    def _allocate_segment(self, seg: _Segment, values: list[Any], ptrs: Any,
                          env: dict[str, int], allocated: int, limit: int) -> int:
        """Make the arrays a segment's kernels write (its slots still empty), point ``ptrs`` at
        them and return the bytes this run allocated so far: the plan's outputs as arrays of
        their own (the caller keeps them), the temps as views of one buffer per segment (one
        allocation instead of one per temp)."""
        plan = self.plan
        temps = []
        end = 0
        for call, s, dtype in seg.writes:
            if values[s] is not None:
                continue
            shape = slot_shape(plan, s, env)
            nbytes = math.prod(shape) * dtype.itemsize
            allocated += nbytes
            if allocated > limit:
                memory_plan.check_memory(allocated, f"{self._step_name(call)} (with what this "
                                                    "run allocated before it)")
            if plan.slots[s].kind == "output" or dtype.kind == "O":
                values[s] = memory_plan.aligned_empty(shape, dtype)
                ptrs[s] = data_address(values[s])
            else:
                temps.append((s, shape, dtype, end))
                end += -(-nbytes // memory_plan.ALIGN) * memory_plan.ALIGN
        if temps:
            buf = memory_plan.aligned_workspace(end)
            for s, shape, dtype, offset in temps:
                size = math.prod(shape) * dtype.itemsize
                values[s] = buf[offset:offset + size].view(dtype).reshape(shape)
                ptrs[s] = data_address(values[s])
        return allocated

    def _host_tensor(self, slot: int, value: Any, env: dict[str, int]) -> np.ndarray:
        """``value``, made by a host step, as the C-contiguous array of its slot's dtype and
        shape that a kernel reads (an ArgumentError naming the step when it is not)."""
        plan = self.plan
        spec = plan.slots[slot]
        want = slot_shape(plan, slot, env)
        if isinstance(value, np.generic):
            value = np.asarray(value)
        if (not isinstance(value, np.ndarray) or value.dtype != spec.dtype.to_numpy()
                or value.shape != want):
            maker = next(c for c in plan.calls
                         if c.kind != "kernel" and slot in c.args[len(c.args) - c.num_outputs:])
            got = (f"{value.dtype} {tuple(value.shape)}" if isinstance(value, np.ndarray)
                   else type(value).__name__)
            raise ArgumentError(f"{plan.name}: {describe(maker.span, maker.func)} made a "
                                f"{got} value where {spec.dtype} {want} is needed")
        return value if value.flags.c_contiguous else np.ascontiguousarray(value)

    def _step_name(self, call: Any) -> str:
        """``main: Gather node 'g'``: the function and the model nodes of a plan step (its
        kernel's name when the plan does not know them)."""
        return f"{self.plan.name}: {describe(call.span, f'kernel {call.func}')}"

    def _check_failed(self, index: int) -> RuntimeCheckError:
        """The error of plan call ``index``, whose kernel failed a check inside the native
        entry (the message is the kernel's, from ``kiln_last_error``)."""
        call = self.plan.calls[index]
        message = self.module.last_error() or f"{call.func}: a run-time check failed"
        return RuntimeCheckError(f"{self._step_name(call)}: {message}")

    def sample_calls(self, *args: Any, repeat: int = 10
                     ) -> tuple[list[Any], np.ndarray, dict[str, int]]:
        """Wall time of every kernel call over ``repeat`` runs (after one warm-up run): the
        kernel calls in plan order, a ``(repeat, calls)`` array of seconds, and the symbolic
        dims of the last run. A plan with a native entry runs through its profiling twin, so
        the kernels run in the model's own sequence with nothing between them; other plans
        call each kernel's checked entry (a few microseconds of call overhead each)."""
        if not isinstance(repeat, int) or isinstance(repeat, bool) or repeat < 1:
            raise KilnError(f"profile: repeat must be a positive int, got {repeat!r}")
        plan = self.plan
        calls = [c for c in plan.calls if c.is_kernel]
        native = self._profile_entry is not None  # set only beside a native entry
        funcs = None if native else {c.func: self.module[c.func] for c in calls}
        samples = np.zeros((repeat + 1, len(calls)))
        threads.use(self._set_threads, self.num_threads)
        state = self.acquire()
        env: dict[str, int] = {}
        try:
            for run in range(repeat + 1):  # the first run warms caches and is not counted
                arrays, env = self._bind_inputs(args)
                if native:
                    seconds = (ctypes.c_double * max(len(calls), 1))()
                    self._run_entry(state, arrays, env, seconds)
                    samples[run] = seconds[:len(calls)]
                else:
                    times: list[float] = []
                    self._run_steps(state, arrays, env, funcs, times)  # binds env's names
                    samples[run] = times
        finally:
            self.release(state)
        return calls, samples[1:], env

    def call_samples(self, *args: Any, repeat: int = 10) -> tuple[list[str], np.ndarray]:
        """:meth:`sample_calls` with the calls as kernel names."""
        calls, samples, _ = self.sample_calls(*args, repeat=repeat)
        return [c.func for c in calls], samples

    def _host_step(self, call: Any, values: list[Any], env: dict[str, int]) -> None:
        """Run a shape function or a match step, binding symbolic names in ``env``."""
        extra = call.extra or {}
        if call.kind == "match":
            for target, src in extra["pairs"]:
                got = shape_expr.evaluate(src, env)
                if isinstance(target, list) and target[0] == "bind":
                    env[target[1]] = got
                elif shape_expr.evaluate(target, env) != got:
                    raise ArgumentError(
                        f"{self.plan.name}: match_cast of {extra.get('what', '?')}: dimension "
                        f"{_fmt_dim(target)} = {shape_expr.evaluate(target, env)} but the value "
                        f"has {got}"
                    )
            return
        if call.kind == "host_func":
            self._host_func(call, values, env)
            return
        if call.kind == "control":
            self._control(call, values, env)
            return
        if call.kind != "shape_func":
            raise KilnError(f"{self.plan.name}: unknown plan step kind {call.kind!r}")
        inputs: list[Any] = []
        for kind, v in extra["inputs"]:
            if kind == "tensor":
                inputs.append(values[call.args[v]])
            elif kind == "shape":
                inputs.append(tuple(shape_expr.evaluate(d, env) for d in v))
            else:
                inputs.append(shape_expr.evaluate(v, env))
        try:
            dims = shape_funcs.run(call.func, inputs)
        except KeyError:
            raise KilnError(f"{self.plan.name}: this kiln has no shape function "
                            f"{call.func!r}") from None
        except ValueError as err:
            raise ArgumentError(f"{self.plan.name}: {extra.get('what') or call.func}: {err}"
                                ) from None
        binds = extra["binds"]
        if len(dims) != len(binds):
            raise KilnError(f"{self.plan.name}: shape function {call.func} returned "
                            f"{len(dims)} dims, expected {len(binds)}")
        env.update(zip(binds, dims))

    def _host_func(self, call: Any, values: list[Any], env: dict[str, int]) -> None:
        """Run a host function (``kiln.runtime.host_funcs``): its result fills the output slot
        and binds the slot's dim names (``extra["binds"]``) to the result's shape."""
        extra = call.extra or {}
        what = extra.get("what") or call.func
        inputs = [values[s] for s in call.args[:len(call.args) - 1]]
        if self.plan.slots[call.args[-1]].form != "tensor":
            inputs = host_values.keep(self.plan, call.args[:len(call.args) - 1], inputs)
        if call.func not in host_funcs.HOST_FUNCS:
            raise KilnError(f"{self.plan.name}: this kiln has no host function {call.func!r}")
        try:
            result = host_funcs.run(call.func, inputs, extra.get("attrs") or {})
        except ValueError as err:
            raise ArgumentError(f"{self.plan.name}: {what}: {err}") from None
        except KilnError as err:
            raise KilnError(f"{self.plan.name}: {what}: {err}") from err
        out = call.args[-1]
        spec = self.plan.slots[out]
        binds = extra["binds"]
        if spec.form != "tensor":
            try:
                values[out] = host_values.check_value(result, spec, "the result")
            except ArgumentError as err:
                raise KilnError(f"{self.plan.name}: host function {call.func} returned "
                                f"{host_values.describe(result)}: {err}") from None
            return
        if (not isinstance(result, np.ndarray) or result.dtype != spec.dtype.to_numpy()
                or result.ndim != len(binds)):
            raise KilnError(f"{self.plan.name}: host function {call.func} returned "
                            f"{getattr(result, 'dtype', type(result).__name__)} of shape "
                            f"{getattr(result, 'shape', '?')}, expected {spec.dtype} of rank "
                            f"{len(binds)}")
        env.update(zip(binds, (int(d) for d in result.shape)))
        # (np.ascontiguousarray would make a 0-d result 1-d); a result that is one of the
        # arrays the step read (SequenceAt's element) is copied: it may be a constant or an
        # input the caller owns, and an output slot is handed out as it is
        fresh = result.flags.c_contiguous and not host_values.aliases(result, inputs)
        values[out] = result if fresh else np.array(result, order="C")

    def _control(self, call: Any, values: list[Any], env: dict[str, int]) -> None:
        """Run a control-flow step: its functions run through their own executors; the
        results fill the output slots and bind their dim names (``extra["binds"]``)."""
        extra = call.extra or {}
        what = f"{self.plan.name}: {describe(call.span, extra.get('what') or call.func)}"
        if self.functions is None:
            raise KilnError(f"{what}: control flow needs the executable's other functions")
        outs = call.args[len(call.args) - call.num_outputs:]
        inputs = [values[s] for s in call.args[:len(call.args) - call.num_outputs]]

        def run_function(name: str, args: Any) -> list[np.ndarray]:
            result = self.functions(name).run(*args)
            return list(result) if isinstance(result, tuple) else [result]

        try:
            results = control_flow.run(call.func, run_function, extra["funcs"], inputs,
                                       extra.get("attrs") or {}, what)
        except ValueError as err:
            raise ArgumentError(f"{what}: {err}") from None
        if len(results) != len(outs):
            raise KilnError(f"{what}: produced {len(results)} values, expected {len(outs)}")
        for slot, names, arr in zip(outs, extra["binds"], results):
            spec = self.plan.slots[slot]
            if spec.is_host_value:  # a sequence, an optional or a string tensor
                try:
                    values[slot] = host_values.check_value(arr, spec, "a result")
                except ArgumentError as err:
                    raise KilnError(f"{what}: {err}") from None
                if spec.form == "tensor":
                    env.update(zip(names, (int(d) for d in values[slot].shape)))
                continue
            arr = np.asarray(arr)
            if arr.dtype != spec.dtype.to_numpy() or arr.ndim != len(names):
                raise KilnError(f"{what}: a result is {arr.dtype} of shape {arr.shape}, "
                                f"expected {spec.dtype} of rank {len(names)}")
            env.update(zip(names, (int(d) for d in arr.shape)))
            # (np.ascontiguousarray would make a 0-d result 1-d)
            values[slot] = arr if arr.flags.c_contiguous else np.array(arr, order="C")

    def _run_entry(self, state: CallState, arrays: list[np.ndarray], env: dict[str, int],
                   seconds: Any = None) -> Any:
        """Run the native entry (its profiling twin, adding call times to ``seconds``, when
        that is given)."""
        plan = self.plan
        values = self._values(state, arrays)
        for i, arr in enumerate(arrays):
            state.in_ptrs[i] = data_address(arr)
        if self._dynamic:
            frame = state.frame(plan, env)
            args: tuple[Any, ...] = (state.in_ptrs, state.out_ptrs, frame.temps, self._consts,
                                     frame.sym)
            out_shapes = frame.out_shapes
        else:
            args = (state.in_ptrs, state.out_ptrs, state.ws_ptr, self._consts)
            out_shapes = None
        for slot, arr in zip(self._out_slots, self._new_outputs(state, out_shapes)):
            values[slot] = arr
        if seconds is None:
            rc = self._entry(*args)
        else:
            rc = self._profile_entry(*args, seconds)
        if rc:
            raise self._check_failed(rc - 1)
        return self._collect(plan.outputs, values)

    def _collect(self, out: Any, values: list[Any] | dict[int, Any]) -> Any:
        if isinstance(out, list):
            return tuple(self._collect(o, values) for o in out)
        arr = values[out]
        kind = self.plan.slots[out].kind
        if self.plan.slots[out].form != "tensor":
            return host_values.copy_value(arr)
        # Never hand out storage the executor keeps (inputs, constants, reused temps).
        return arr if kind == "output" else np.array(arr, copy=True)
