"""Executable: compiled kernels + execution plans + constants, saved to and loaded from one file.

File format (little-endian), version 2 (version 1 files, without memory plans and native
entries, are rejected with ModelFormatError: rebuild them)::

    b"KILNEXE\\0"  magic
    u32           format version
    u32           number of distinct data types, then each packed with kiln.ir.abi.DTYPE_STRUCT
                  (derived from DTYPE_LAYOUT; JSON below refers to data types by index)
    u64 + bytes   JSON header: kernels' FunctionInfo, plans (with their workspace offsets,
                  workspace size and whole-model entry symbol), constant table
    u64 + bytes   the shared library
    u64 + bytes   the generated source
    u64 + bytes   constant data (each constant at the offset the header gives)

A loaded executable runs without recompiling: the library is written to the kernel cache under
its content hash and loaded from there.
"""

from __future__ import annotations

import ctypes
import hashlib
import json
import os
import struct
import tempfile
from typing import Any

import numpy as np

from ..ir import abi
from ..ir.dtype import DataType
from ..ir.errors import KilnError, ModelFormatError
from . import memory_plan, shape_expr
from .executor import Executor
from .module import FunctionInfo, Module, ParamInfo
from .plan import Plan

MAGIC = b"KILNEXE\0"
VERSION = 2


def cache_dir() -> str:
    """Where compiled libraries live: $KILN_CACHE_DIR, $XDG_CACHE_HOME/kiln or ~/.cache/kiln."""
    root = os.environ.get("KILN_CACHE_DIR")
    if not root:
        xdg = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
        root = os.path.join(xdg, "kiln")
    os.makedirs(root, exist_ok=True)
    return root


class Executable:
    """What ``kiln.build`` returns: call it like the graph function ``main``.

    ``exe(x, y)`` or ``exe(x=..., y=...)`` runs ``main``; ``exe["other"](...)`` runs another graph
    function; ``exe.save(path)`` writes one file that ``kiln.load`` reads back.
    """

    def __init__(self, module: Module, plans: dict[str, Plan]):
        self.module = module
        self.plans = dict(plans)
        self._executors: dict[str, Executor] = {}
        self._main: Executor | None = None  # what calling the executable runs

    def _executor(self, name: str) -> Executor:
        ex = self._executors.get(name)
        if ex is None:
            if name not in self.plans:
                raise KilnError(
                    f"executable has no function {name!r} (it has: {', '.join(self.plans)})"
                )
            make = getattr(self.module, "executor_class", Executor)  # GPU modules bring theirs
            ex = self._executors[name] = make(self.plans[name], self.module)
        return ex

    def __getitem__(self, name: str):
        ex = self._executor(name)
        return lambda *args, **kwargs: ex.run(*_order(ex.plan, args, kwargs))

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        ex = self._main
        if ex is None:
            ex = self._main = self._executor("main" if "main" in self.plans
                                             else next(iter(self.plans)))
        return ex.run(*args) if not kwargs else ex.run(*_order(ex.plan, args, kwargs))

    def profile(self, *args: Any, repeat: int = 10, **kwargs: Any) -> str:
        """A table of main's kernels, slowest first: calls per run, median milliseconds per
        run and share of the total (inputs as for calling the executable). What TVM's debug
        executor gives: where a model's time goes, kernel by kernel."""
        name = "main" if "main" in self.plans else next(iter(self.plans))
        ex = self._executor(name)
        rows = ex.profile(*_order(ex.plan, args, kwargs), repeat=repeat)
        total = sum(t for _, _, t in rows) or 1.0
        width = max([len(r[0]) for r in rows] + [6])
        lines = [f"{'kernel':{width}s} {'calls':>5s} {'ms':>9s} {'share':>6s}"]
        for kname, n, t in rows:
            lines.append(f"{kname:{width}s} {n:5d} {t * 1e3:9.3f} {t / total:6.1%}")
        lines.append(f"{'total':{width}s} {sum(n for _, n, _ in rows):5d} {total * 1e3:9.3f}")
        return "\n".join(lines)

    def call_times(self, *args: Any, repeat: int = 10, **kwargs: Any) -> list[tuple[str, float]]:
        """Median wall time of each kernel call of main, in the order the calls run:
        ``(kernel, seconds)``. With a native entry the kernels are timed inside it, one after
        the other as in a normal run."""
        name = "main" if "main" in self.plans else next(iter(self.plans))
        ex = self._executor(name)
        kernels, samples = ex.call_samples(*_order(ex.plan, args, kwargs), repeat=repeat)
        return [(k, float(t)) for k, t in zip(kernels, np.median(samples, axis=0))]

    @property
    def num_kernels(self) -> int:
        """Kernel calls made by one run of main."""
        name = "main" if "main" in self.plans else next(iter(self.plans))
        return self.plans[name].num_kernels

    def summary(self) -> str:
        lines = [f"kiln executable: {len(self.module.functions)} kernels in {self.module.lib_path}"]
        for name, plan in self.plans.items():
            ins = ", ".join(
                f"{n}: {plan.slots[s].dtype}"
                f"[{', '.join(shape_expr.to_str(c) for c in plan.slots[s].shape)}]"
                for n, s in zip(plan.input_names, plan.input_slots)
            )
            lines.append(f"  {name}({ins}): {plan.num_kernels} kernel calls")
            for c in plan.calls:
                lines.append(f"    {c.func}({', '.join(map(str, c.args))})")
        return "\n".join(lines)

    # ---- memory and threads -------------------------------------------------------------
    @property
    def workspace_bytes(self) -> int:
        """Workspace bytes of main's memory plan (the peak of its static intermediates)."""
        name = "main" if "main" in self.plans else next(iter(self.plans))
        return self.plans[name].workspace_bytes

    def memory_report(self) -> dict[str, dict[str, Any]]:
        """Per graph function: number of planned temps, the workspace (peak) bytes, the bytes
        the same temps take without sharing, and whether it runs through a native entry."""
        report = {}
        for name, plan in self.plans.items():
            stats = memory_plan.memory_stats(plan)
            stats["native_entry"] = plan.entry
            report[name] = stats
        return report

    def set_num_threads(self, n: int) -> None:
        """Use ``n`` OpenMP threads for later runs from the calling thread.

        This calls ``omp_set_num_threads``: OpenMP keeps the setting per process *thread* (it
        applies to runs started from the thread that set it, in this and every other kiln
        executable of the process). Kernels compiled for a target with an explicit
        ``num_threads`` keep that count.
        """
        if not isinstance(n, int) or isinstance(n, bool) or n < 1:
            raise KilnError(f"set_num_threads: expected a positive int, got {n!r}")
        fn = self._native("kiln_set_num_threads")
        fn.restype, fn.argtypes = None, (ctypes.c_int32,)
        fn(n)

    def get_max_threads(self) -> int:
        """OpenMP's thread count for the next parallel region started from this thread."""
        fn = self._native("kiln_get_max_threads")
        fn.restype, fn.argtypes = ctypes.c_int32, ()
        return int(fn())

    def _native(self, symbol: str) -> Any:
        try:
            return getattr(self.module.lib, symbol)
        except AttributeError:
            raise KilnError(f"library {self.module.lib_path} lacks {symbol} (not built by "
                            "kiln.build)") from None

    # ---- native export -------------------------------------------------------------------
    def export_native(self, directory: str, name: str = "main") -> None:
        """Write what a C program needs to run graph function ``name`` without Python.

        ``directory`` gets ``lib.so`` (the kernels and the whole-model entry), ``consts.bin``
        (the constants in increasing slot order, each at a 64-byte aligned offset) and
        ``manifest.txt``, whitespace-separated text (see docs/executables.md)::

            kiln-native 1
            entry <symbol>
            workspace <bytes>
            inputs <n>        then per input:  <name> <itemsize> <ndim> <dims...>
            outputs <n>       then per output: <itemsize> <ndim> <dims...>
            consts <n>        then per constant: <offset> <nbytes>

        ``examples/run_from_c.c`` reads it. Only functions with a native entry over static
        shapes can be exported.
        """
        self._executor(name)  # validates the name
        plan = self.plans[name]
        if plan.entry is None or plan.entry_sym_dims is not None:
            raise KilnError(f"export_native: function {name!r} has symbolic shapes (its native "
                            "entry, if any, needs the shapes planned per call by kiln's runtime)")
        os.makedirs(directory, exist_ok=True)
        with open(self.module.lib_path, "rb") as src, \
                open(os.path.join(directory, "lib.so"), "wb") as dst:
            dst.write(src.read())

        def dims(slot: int) -> str:
            spec = plan.slots[slot]
            size = np.dtype(spec.dtype.to_numpy()).itemsize
            return " ".join(str(v) for v in (size, len(spec.shape), *spec.shape))

        lines = ["kiln-native 1", f"entry {plan.entry}", f"workspace {plan.workspace_bytes}",
                 f"inputs {len(plan.input_slots)}"]
        lines += [f"{n} {dims(s)}" for n, s in zip(plan.input_names, plan.input_slots)]
        outs = [s for s, spec in enumerate(plan.slots) if spec.kind == "output"]
        lines += [f"outputs {len(outs)}"] + [dims(s) for s in outs]
        blob = bytearray()
        table = []
        for slot in sorted(plan.constants):
            data = np.ascontiguousarray(plan.constants[slot]).tobytes()
            blob += bytes(-len(blob) % memory_plan.ALIGN)
            table.append(f"{len(blob)} {len(data)}")
            blob += data
        lines += [f"consts {len(table)}"] + table
        with open(os.path.join(directory, "consts.bin"), "wb") as f:
            f.write(bytes(blob))
        with open(os.path.join(directory, "manifest.txt"), "w") as f:
            f.write("\n".join(lines) + "\n")

    # ---- persistence --------------------------------------------------------------------
    def save(self, path: str) -> None:
        if getattr(self.module, "is_device_module", False):  # GPU: its own file format
            from .gpu.serialize import save as save_gpu

            save_gpu(self, path)
            return
        dtypes: dict[DataType, int] = {}

        def idx(dt: DataType) -> int:
            return dtypes.setdefault(dt, len(dtypes))

        kernels = []
        for info in self.module.functions.values():
            kernels.append({
                "name": info.name, "symbol": info.symbol,
                "unchecked_symbol": info.unchecked_symbol, "sym_vars": list(info.sym_vars),
                "num_outputs": info.num_outputs,
                "params": [
                    {"name": p.name, "shape": list(p.shape), "dtype": idx(p.dtype),
                     "is_scalar": p.is_scalar}
                    for p in info.params
                ],
            })
        const_blob = bytearray()
        plans_json = {}
        for name, plan in self.plans.items():
            for spec in plan.slots:
                idx(spec.dtype)
            pj = plan.to_json(dtypes)
            table = []
            for slot, arr in plan.constants.items():
                data = np.ascontiguousarray(arr).tobytes()
                table.append({"slot": slot, "offset": len(const_blob), "nbytes": len(data),
                              "shape": list(arr.shape)})
                const_blob += data
            pj["constants"] = table
            plans_json[name] = pj
        header = json.dumps({"kernels": kernels, "plans": plans_json}).encode()
        with open(self.module.lib_path, "rb") as f:
            lib = f.read()
        source = self.module.source.encode()
        ordered = sorted(dtypes, key=dtypes.__getitem__)
        parts = [MAGIC, struct.pack("<II", VERSION, len(ordered))]
        parts += [abi.pack_dtype(dt) for dt in ordered]
        for blob in (header, lib, source, bytes(const_blob)):
            parts += [struct.pack("<Q", len(blob)), blob]
        tmp = f"{path}.tmp{os.getpid()}"
        with open(tmp, "wb") as f:
            for p in parts:
                f.write(p)
        os.replace(tmp, path)


def _order(plan: Plan, args: tuple, kwargs: dict) -> list[Any]:
    """Positional args, or inputs by name (``exe(x=...)``), in the function's parameter order."""
    if not kwargs:
        return list(args)
    names = plan.input_names
    unknown = set(kwargs) - set(names)
    if unknown:
        raise KilnError(f"{plan.name}: unknown input(s) {sorted(unknown)}; inputs are {names}")
    values = list(args) + [None] * (len(names) - len(args))
    for name, value in kwargs.items():
        i = names.index(name)
        if i < len(args):
            raise KilnError(f"{plan.name}: input {name!r} given twice")
        values[i] = value
    missing = [n for n, v in zip(names, values) if v is None]
    if missing:
        raise KilnError(f"{plan.name}: missing input(s) {missing}")
    return values


class _Reader:
    def __init__(self, data: bytes, path: str):
        self.data, self.pos, self.path = data, 0, path

    def take(self, n: int) -> bytes:
        if self.pos + n > len(self.data):
            raise ModelFormatError(f"{self.path}: truncated kiln executable")
        out = self.data[self.pos:self.pos + n]
        self.pos += n
        return out

    def unpack(self, fmt: str) -> tuple:
        return struct.unpack(fmt, self.take(struct.calcsize(fmt)))

    def blob(self) -> bytes:
        (n,) = self.unpack("<Q")
        return self.take(n)


def load(path: str) -> Executable:
    """Load an executable saved with :meth:`Executable.save` (no compiler needed)."""
    try:
        with open(path, "rb") as f:
            data = f.read()
    except OSError as err:
        raise ModelFormatError(f"cannot read kiln executable {path}: {err}") from err
    from .gpu.serialize import is_gpu_file

    if is_gpu_file(data):
        from .gpu.serialize import load as load_gpu

        return load_gpu(path, data)
    r = _Reader(data, path)
    if r.take(len(MAGIC)) != MAGIC:
        raise ModelFormatError(f"{path} is not a kiln executable (bad magic)")
    version, ndtypes = r.unpack("<II")
    if version != VERSION:
        raise ModelFormatError(
            f"{path}: unsupported executable version {version} (this kiln reads version "
            f"{VERSION}; rebuild and save the model again)"
        )
    dtypes = [abi.unpack_dtype(r.take(abi.DTYPE_STRUCT.size)) for _ in range(ndtypes)]
    try:
        header = json.loads(r.blob().decode())
    except (UnicodeDecodeError, json.JSONDecodeError) as err:
        raise ModelFormatError(f"{path}: corrupt header ({err})") from err
    lib, source, const_blob = r.blob(), r.blob().decode(), r.blob()

    digest = hashlib.sha256(lib).hexdigest()[:32]
    lib_path = os.path.join(cache_dir(), f"exe-{digest}.so")
    if not os.path.exists(lib_path):
        fd, tmp = tempfile.mkstemp(dir=cache_dir(), suffix=".so")
        with os.fdopen(fd, "wb") as f:
            f.write(lib)
        os.replace(tmp, lib_path)
    try:
        functions = {
            k["name"]: FunctionInfo(
                name=k["name"], symbol=k["symbol"], unchecked_symbol=k["unchecked_symbol"],
                params=tuple(
                    ParamInfo(p["name"], tuple(p["shape"]), dtypes[p["dtype"]], p["is_scalar"])
                    for p in k["params"]
                ),
                sym_vars=tuple(k["sym_vars"]), num_outputs=k["num_outputs"],
            )
            for k in header["kernels"]
        }
        plans = {}
        for name, pj in header["plans"].items():
            constants = {}
            for c in pj["constants"]:
                dt = dtypes[pj["slots"][c["slot"]]["dtype"]]
                raw = const_blob[c["offset"]:c["offset"] + c["nbytes"]]
                const = memory_plan.aligned_empty(c["shape"], dt.to_numpy())
                const[...] = np.frombuffer(raw, dtype=dt.to_numpy()).reshape(c["shape"])
                constants[c["slot"]] = const
            plans[name] = Plan.from_json(pj, dtypes, constants)
    except (KeyError, IndexError, TypeError, ValueError) as err:
        raise ModelFormatError(f"{path}: malformed executable header ({err})") from err
    module = Module(lib_path, source, functions)
    for name, plan in plans.items():
        if plan.entry is not None and not hasattr(module.lib, plan.entry):
            raise ModelFormatError(
                f"{path}: function {name!r} names native entry {plan.entry!r}, which the "
                "library lacks"
            )
    return Executable(module, plans)
