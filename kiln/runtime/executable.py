"""Executable: compiled kernels + execution plans + constants, saved to and loaded from one file.

The file (``kiln.runtime.file_format``: magic number, format version 3, named sections each
with a sha256 checked at load) holds these sections::

    meta        JSON: kiln's version, the target (``Target.spec``), the machine architecture
                and the CPU features the code needs (``kiln.load`` refuses the file on a CPU
                lacking any of them, before loading the library)
    dtypes      the distinct data types, each packed with kiln.ir.abi.DTYPE_STRUCT (derived
                from DTYPE_LAYOUT; JSON refers to data types by index)
    header      JSON: kernels' FunctionInfo, plans (with their workspace offsets, workspace
                size and whole-model entry symbol), constant table
    library     the shared library
    source      the generated source
    constants   constant data (each constant at the offset the header gives)

followed by any extra sections a code generator added (``Executable.add_section``: for example
device code for a GPU target), kept verbatim.

A loaded executable runs without recompiling: the library is written to the kernel cache under
its content hash and loaded from there. Where the cache cannot be written (a read-only
directory), the library is loaded from an anonymous in-memory file instead.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import mmap
import os
import tempfile
from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np

from ..ir import abi
from ..ir.dtype import DataType
from ..ir.errors import KilnError, ModelFormatError, TargetError
from ..target.cpu import host_features, host_machine
from ..version import __version__
from . import cache, file_format, memory_plan, profiling, pytree, shape_expr, threads
from .executor import Executor
from .gpu import serialize as gpu_serialize
from .gpu.executor import GpuExecutor
from .gpu.module import GpuModule
from .module import FunctionInfo, Module, ParamInfo
from .plan import Plan, TensorInfo
from .plan_file import plans_from_json, plans_to_json
from .profiling import Profile
from .state import apply_updates, check_updatable, with_state

MAGIC = file_format.MAGIC
VERSION = file_format.VERSION
#: The sections every executable file has (``Executable.add_section`` may not use these names).
CORE_SECTIONS = ("meta", "dtypes", "header", "library", "source", "constants")


def cache_dir() -> str:
    """Where compiled libraries live (``kiln.runtime.cache.cache_dir``), created if missing."""
    root = cache.cache_dir()
    os.makedirs(root, exist_ok=True)
    return str(root)


class Executable:
    """What ``kiln.build`` returns: call it like the graph function ``main``.

    ``exe(x, y)`` or ``exe(x=..., y=...)`` runs ``main``; ``exe["other"](...)`` runs another graph
    function; ``exe.save(path)`` writes one file that ``kiln.load`` reads back.
    """

    def __init__(self, module: Module, plans: dict[str, Plan], target: str = "c",
                 required_features: frozenset[str] | None = None,
                 kiln_version: str = __version__, machine: str | None = None):
        self.module = module
        self.plans = dict(plans)
        #: The target the code was built for (``Target.spec``: ``"c"``, ``"c -mcpu=znver3"``).
        self.target = target
        #: CPU features (/proc/cpuinfo names) the code may use; ``kiln.load`` checks them.
        self.required_features = frozenset(required_features or ())
        #: The kiln that built the code, and the machine architecture it is for.
        self.kiln_version = kiln_version
        self.machine = machine or host_machine()
        #: Extra named sections saved with the file (see :meth:`add_section`).
        self.sections: dict[str, bytes] = {}
        self._executors: dict[str, Executor] = {}
        self._main: Executor | None = None  # what calling the executable runs
        self._num_threads: int | None = None

    def _plan(self, name: str) -> Plan:
        try:
            return self.plans[name]
        except KeyError:
            raise KilnError(
                f"executable has no function {name!r} (it has: {', '.join(self.plans)})"
            ) from None

    def _executor(self, name: str) -> Executor:
        ex = self._executors.get(name)
        if ex is None:
            self._plan(name)
            check_runs_here(self.meta(), "this executable")
            if isinstance(self.module, GpuModule):
                ex = self._executors[name] = GpuExecutor(self.plans[name], self.module)
            else:
                ex = self._executors[name] = Executor(self.plans[name], self.module,
                                                      self._num_threads)
            ex.functions = self._executor  # what control-flow steps run (If/Loop bodies)
        return ex

    def __getitem__(self, name: str):
        ex = self._executor(name)
        return lambda *args, **kwargs: _call(ex, args, kwargs)

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        ex = self._main
        if ex is None:
            ex = self._main = self._executor(self.main_name)
        if ex.plan.input_tree is not None:
            return _call(ex, args, kwargs)
        return ex.run(*args) if not kwargs else ex.run(*_order(ex.plan, args, kwargs))

    @property
    def main_name(self) -> str:
        """The graph function calling the executable runs: ``main``, else the first one."""
        return "main" if "main" in self.plans else next(iter(self.plans))

    # ---- onnxruntime-style description and call -----------------------------------------
    @property
    def inputs(self) -> list[TensorInfo]:
        """main's inputs in call order: name, shape (names for symbolic dims), dtype (as
        onnxruntime's ``get_inputs()``)."""
        return self.plans[self.main_name].inputs

    @property
    def outputs(self) -> list[TensorInfo]:
        """main's outputs in the order :meth:`run` returns them, named after the model's
        outputs (an ONNX graph's output names; ``output_0``... for a graph built in Python)."""
        return self.plans[self.main_name].output_infos

    def run(self, feeds: Mapping[str, Any] | Sequence[Any],
            output_names: Sequence[str] | None = None, as_dict: bool = False) -> Any:
        """Run main as onnxruntime's ``session.run`` does: ``feeds`` maps input names to
        arrays (or lists them in input order); the result is the list of outputs named by
        ``output_names`` in that order (all of them when None), or a ``{name: array}`` dict
        with ``as_dict``. Nested tuple results are flattened, in the order of
        :attr:`outputs`."""
        return run_session_style(self, self.plans[self.main_name].output_names, feeds,
                                 output_names, as_dict)

    def profile(self, *args: Any, repeat: int = 10, trace: str | None = None,
                **kwargs: Any) -> Profile:
        """Time main's kernels over ``repeat`` runs (inputs as for calling the executable):
        a :class:`~kiln.runtime.profiling.Profile` whose rows give, per kernel, its calls per
        run, median time per run, share of the total, its calls' shapes and the model nodes
        it was made from; ``str()`` of it is a table, slowest first. ``trace``: also write a
        Chrome trace of the runs to that path. What TVM's debug executor gives: where a
        model's time goes, kernel by kernel, named after the model."""
        ex = self._executor(self.main_name)
        calls, samples, env = ex.sample_calls(*_order(ex.plan, args, kwargs), repeat=repeat)
        prof = profiling.make_profile(ex.plan, calls, samples, env)
        if trace is not None:
            try:
                prof.write_chrome_trace(trace)
            except OSError as err:
                raise KilnError(f"cannot write the trace {trace}: {err.strerror or err}"
                                ) from err
        return prof

    def call_times(self, *args: Any, repeat: int = 10, **kwargs: Any) -> list[tuple[str, float]]:
        """Median wall time of each kernel call of main, in the order the calls run:
        ``(kernel, seconds)``. With a native entry the kernels are timed inside it, one after
        the other as in a normal run."""
        name = self.main_name
        ex = self._executor(name)
        kernels, samples = ex.call_samples(*_order(ex.plan, args, kwargs), repeat=repeat)
        return [(k, float(t)) for k, t in zip(kernels, np.median(samples, axis=0))]

    @property
    def num_kernels(self) -> int:
        """Kernel calls made by one run of main."""
        name = self.main_name
        return self.plans[name].num_kernels

    def summary(self) -> str:
        lines = [f"kiln executable: {len(self.module.functions)} kernels in {self.module.lib_path}"]
        for name, plan in self.plans.items():
            ins = ", ".join(
                f"{n}: {plan.slots[s].dtype}"
                f"[{', '.join(shape_expr.to_str(c) for c in plan.slots[s].shape)}]"
                for n, s in zip(plan.input_names, plan.input_slots)
            )
            outs = ", ".join(f"{o.name}: {o.dtype}[{', '.join(map(str, o.shape))}]"
                             for o in plan.output_infos)
            lines.append(f"  {name}({ins}) -> ({outs}): {plan.num_kernels} kernel calls")
            for c in plan.calls:
                lines.append(f"    {c.func}({', '.join(map(str, c.args))})")
        return "\n".join(lines)

    # ---- memory and threads -------------------------------------------------------------
    @property
    def workspace_bytes(self) -> int:
        """Workspace bytes of main's memory plan (the peak of its static intermediates)."""
        name = self.main_name
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

    def set_num_threads(self, n: int | None) -> None:
        """Run later calls of this executable with ``n`` threads, from whichever thread they
        are made (None: back to the default, ``KILN_NUM_THREADS``, else ``OMP_NUM_THREADS``,
        else every CPU the process may use).

        The count belongs to the executable: other executables keep theirs, and each call
        applies it in its own thread (``kiln.runtime.threads``). Concurrent calls share the
        library's thread pool (docs/executables.md, "Calls from several threads"). Kernels
        compiled for a target with an explicit ``num_threads`` keep that count.
        """
        if n is not None and (not isinstance(n, int) or isinstance(n, bool) or n < 1):
            raise KilnError(f"set_num_threads: expected a positive int or None, got {n!r}")
        self._num_threads = n
        for ex in self._executors.values():
            ex.num_threads = n

    @property
    def num_threads(self) -> int | None:
        """The thread count set with :meth:`set_num_threads` (None: the default)."""
        return self._num_threads

    def get_max_threads(self) -> int:
        """How many threads a call made now from this thread uses."""
        return threads.effective_count(threads.setter(self.module), self._num_threads)

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
        plan = self._plan(name)
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

    # ---- extra sections ------------------------------------------------------------------
    def add_section(self, name: str, data: bytes) -> None:
        """Save ``data`` with the executable as section ``name`` (checksummed like the core
        sections and returned by :meth:`section` after ``kiln.load``): where a code generator
        keeps what the CPU library does not hold, such as device code of a GPU target."""
        if not isinstance(name, str) or not name or len(name.encode("utf-8")) > 255:
            raise KilnError(f"section name must be a non-empty string of at most 255 bytes, "
                            f"got {name!r}")
        if name in CORE_SECTIONS:
            raise KilnError(f"section name {name!r} is reserved (core sections: "
                            f"{', '.join(CORE_SECTIONS)})")
        if not isinstance(data, (bytes, bytearray, memoryview)):
            raise KilnError(f"section {name!r}: expected bytes, got {type(data).__name__}")
        self.sections[name] = bytes(data)

    def section(self, name: str) -> bytes:
        """The bytes of extra section ``name`` (KilnError listing the sections if absent)."""
        try:
            return self.sections[name]
        except KeyError:
            raise KilnError(f"executable has no section {name!r} (extra sections: "
                            f"{', '.join(self.sections) or 'none'})") from None

    # ---- persistence --------------------------------------------------------------------
    def meta(self) -> dict[str, Any]:
        """What the file's ``meta`` section records (see the module docstring)."""
        return {"kiln_version": self.kiln_version, "format": VERSION, "target": self.target,
                "machine": self.machine, "required_features": sorted(self.required_features)}

    def save(self, path: str) -> None:
        """Write the executable to ``path`` (one file, see the module docstring)."""
        if isinstance(self.module, GpuModule):
            self._write(path, [("meta", json.dumps(self.meta()).encode()),
                               *gpu_serialize.sections(self.module.program, self.plans),
                               *self.sections.items()])
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
        # the constants come first: their file offset is known before the header is written,
        # so each can sit at an aligned offset and load in place (``kiln.runtime.plan_file``)
        names = ["constants", *(n for n in CORE_SECTIONS if n != "constants"), *self.sections]
        plans_json, const_blob = plans_to_json(self.plans, dtypes,
                                               base=file_format.sections_start(names))
        header = json.dumps({"kernels": kernels, "plans": plans_json}).encode()
        try:
            with open(self.module.lib_path, "rb") as f:
                lib = f.read()
        except OSError as err:
            raise KilnError(f"cannot read the executable's library {self.module.lib_path}: "
                            f"{err}") from err
        ordered = sorted(dtypes, key=dtypes.__getitem__)
        sections = {
            "constants": const_blob,
            "meta": json.dumps(self.meta()).encode(),
            "dtypes": b"".join(abi.pack_dtype(dt) for dt in ordered),
            "header": header,
            "library": lib,
            "source": self.module.source.encode(),
            **self.sections,
        }
        self._write(path, [(n, sections[n]) for n in names])

    @staticmethod
    def _write(path: str, sections: list[tuple[str, bytes]]) -> None:
        try:
            file_format.write(path, sections)
        except OSError as err:
            raise KilnError(f"cannot write executable {path}: {err.strerror or err}") from err


def run_session_style(fn: Any, names: Sequence[str], feeds: Mapping[str, Any] | Sequence[Any],
                      output_names: Sequence[str] | None, as_dict: bool) -> Any:
    """:meth:`Executable.run` of callable ``fn`` whose flattened outputs are named ``names``
    (shared with callables that stand for an executable, e.g. a guarded ONNX model)."""
    if output_names is None:
        picked = list(range(len(names)))
    else:
        if isinstance(output_names, str):
            raise KilnError("run: output_names must be a list of names, got the string "
                            f"{output_names!r}")
        unknown = [n for n in output_names if n not in names]
        if unknown:
            raise KilnError(f"run: unknown output name(s) {unknown}; the outputs are "
                            f"{list(names)}")
        picked = [list(names).index(n) for n in output_names]
    if isinstance(feeds, Mapping):
        result = fn(**dict(feeds))
    elif isinstance(feeds, Sequence) and not isinstance(feeds, (str, bytes)):
        result = fn(*feeds)
    else:
        raise KilnError(f"run: feeds must be a dict of input name -> array or a list of "
                        f"arrays, got {type(feeds).__name__}")
    flat = flatten_outputs(result)
    if as_dict:
        return {names[i]: flat[i] for i in picked}
    return [flat[i] for i in picked]


def flatten_outputs(result: Any) -> list[Any]:
    """The arrays of a call's result (an array or nested tuples of them), in order."""
    if isinstance(result, tuple):
        return [a for r in result for a in flatten_outputs(r)]
    return [result]


def _call(ex: Executor, args: tuple, kwargs: dict) -> Any:
    """Run ``ex`` on a call's arguments: flattened and rebuilt along the plan's call trees
    when it has them (``kiln.runtime.pytree``), else as flat inputs."""
    plan = ex.plan
    if plan.input_tree is None:
        return ex.run(*_order(plan, args, kwargs))
    inputs = pytree.flatten_call(args, kwargs, plan.input_tree)
    if plan.mutations:  # the executable's state in, each update written where it belongs
        inputs = with_state(plan, inputs)
        check_updatable(plan, inputs)
        out = ex.run(*inputs)
        out = tuple(apply_updates(plan, inputs, out if isinstance(out, tuple) else (out,)))
    else:
        out = ex.run(*inputs)
    if plan.output_tree is None:
        return out
    return pytree.unflatten(out if isinstance(out, tuple) else (out,), plan.output_tree)


#: An input not given (None is a value: an empty optional).
_MISSING = object()


def _order(plan: Plan, args: tuple, kwargs: dict) -> list[Any]:
    """Positional args, or inputs by name (``exe(x=...)``), in the function's parameter order."""
    if not kwargs:
        return list(args)
    names = plan.input_names
    unknown = set(kwargs) - set(names)
    if unknown:
        raise KilnError(f"{plan.name}: unknown input(s) {sorted(unknown)}; inputs are {names}")
    values = list(args) + [_MISSING] * (len(names) - len(args))
    for name, value in kwargs.items():
        i = names.index(name)
        if i < len(args):
            raise KilnError(f"{plan.name}: input {name!r} given twice")
        values[i] = value
    missing = [n for n, v in zip(names, values) if v is _MISSING]
    if missing:
        raise KilnError(f"{plan.name}: missing input(s) {missing}")
    return values


def check_runs_here(meta: dict[str, Any], path: str) -> None:
    """Refuse (TargetError) an executable built for another architecture or for CPU features
    this CPU lacks: its code would die of an illegal instruction."""
    machine = meta.get("machine")
    if machine and machine != host_machine():
        raise TargetError(f"{path} was built for {machine} (target {meta.get('target')!r}); "
                          f"this machine is {host_machine()}")
    have = host_features()
    missing = sorted(set(meta.get("required_features") or ()) - have) if have else []
    if missing:
        raise TargetError(
            f"{path} was built for target {meta.get('target')!r}, whose code uses CPU "
            f"features this CPU lacks: {', '.join(missing)}. Build the model for a CPU this "
            "machine has (for example Target('c', mcpu='x86-64-v3'), `kiln compile --target "
            "x86-64-v3`, or the default 'native' on this machine)")


def _library_file(lib: bytes, path: str) -> tuple[str, Any]:
    """A file holding ``lib`` to load: the cache's copy (written if missing or different), or,
    where the cache cannot be written, an anonymous in-memory file (Linux) or a private
    temporary file. Returns the path and an object to keep alive while the library is used."""
    digest = hashlib.sha256(lib).hexdigest()[:32]
    try:
        root = cache_dir()
        lib_path = os.path.join(root, f"exe-{digest}.so")
        try:
            with open(lib_path, "rb") as f:
                same = f.read() == lib
        except FileNotFoundError:
            same = False
        if same:
            cache.touch(lib_path)
            return lib_path, None
        fd, tmp = tempfile.mkstemp(dir=root, suffix=".so.tmp")
        try:
            with os.fdopen(fd, "wb") as f:
                f.write(lib)
            os.replace(tmp, lib_path)
        except BaseException:
            with contextlib.suppress(OSError):
                os.unlink(tmp)
            raise
        cache.evict(keep=lib_path)
        return lib_path, None
    except OSError:
        pass  # a read-only (or full) cache: load without it
    if hasattr(os, "memfd_create"):
        fd = os.memfd_create(f"kiln-{digest}.so")
        holder = os.fdopen(fd, "wb")
        holder.write(lib)
        holder.flush()
        return f"/proc/self/fd/{fd}", holder
    handle = tempfile.NamedTemporaryFile(prefix="kiln-", suffix=".so")  # noqa: SIM115
    handle.write(lib)
    handle.flush()
    return handle.name, handle


#: Loaders of the executables other code generators save in the same container (the NPU's):
#: ``(is_mine(sections), load(sections, path))``, tried in order before the CPU/GPU formats.
_LOADERS: list[tuple[Any, Any]] = []


def register_loader(is_mine: Any, load_fn: Any) -> None:
    """Teach :func:`load` another kind of executable file: ``is_mine(sections)`` says whether
    a file's sections are of that kind, ``load_fn(sections, path)`` loads it (a code
    generator registers its own, so the runtime need not import it)."""
    _LOADERS.append((is_mine, load_fn))


def _file_bytes(path: str, use_mmap: bool) -> Any:
    """The bytes of the file at ``path`` at a :data:`memory_plan.ALIGN`-byte address: a
    read-only private mapping of it (``use_mmap``, where the file can be mapped), else one
    read into an aligned buffer."""
    with open(path, "rb") as f:
        size = os.fstat(f.fileno()).st_size
        if use_mmap and size:
            # not mappable (a pipe, a system without these mmap flags): read it
            with contextlib.suppress(OSError, ValueError, AttributeError):
                return mmap.mmap(f.fileno(), 0, flags=mmap.MAP_PRIVATE | _MAP_POPULATE,
                                 prot=mmap.PROT_READ)
        buf = memory_plan.aligned_workspace(size)
        got = f.readinto(buf)
        return buf[:got]


#: Map every page at once (Linux): one system call instead of a fault per 64 KiB.
_MAP_POPULATE = getattr(mmap, "MAP_POPULATE", 0)


def load(path: str, mmap: bool = False) -> Executable:
    """Load an executable saved with :meth:`Executable.save` (no compiler needed).

    The file is read once into aligned memory and its constants are used where they lie in it
    (no second copy). ``mmap=True`` maps the file instead of reading it: the constants stay in
    the page cache, shared by every process that maps the file, and loading costs little more
    than checking the checksums (how the executable cache loads its entries). The file must
    then not be rewritten in place while the executable is in use (``Executable.save`` and
    ``kiln cache`` replace or remove files, which is safe; ``cp`` over it is not).

    Raises ModelFormatError for a file that is not a kiln executable, is of an unknown format
    version or fails a section's checksum (naming the section), and TargetError for code this
    CPU cannot run."""
    try:
        data = _file_bytes(path, mmap)
    except OSError as err:
        raise ModelFormatError(f"cannot read kiln executable {path}: "
                               f"{err.strerror or err}") from err
    sections = file_format.read(memoryview(data), path)
    for is_mine, load_fn in _LOADERS:
        if is_mine(sections):
            return load_fn(sections, path)
    if gpu_serialize.is_gpu_file(sections):
        return _load_gpu(sections, path)
    missing = [n for n in CORE_SECTIONS if n not in sections]
    if missing:
        raise ModelFormatError(f"{path}: malformed kiln executable (no section(s) "
                               f"{', '.join(missing)})")
    meta = _read_meta(sections, path)
    raw_dtypes = bytes(sections["dtypes"])
    size = abi.DTYPE_STRUCT.size
    if len(raw_dtypes) % size:
        raise ModelFormatError(f"{path}: malformed dtypes section ({len(raw_dtypes)} bytes)")
    dtypes = [abi.unpack_dtype(raw_dtypes, i) for i in range(0, len(raw_dtypes), size)]
    try:
        header = json.loads(bytes(sections["header"]).decode())
        source = bytes(sections["source"]).decode()
    except (UnicodeDecodeError, json.JSONDecodeError) as err:
        raise ModelFormatError(f"{path}: corrupt header ({err})") from err
    const_blob = sections["constants"]
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
        plans = plans_from_json(header["plans"], dtypes, const_blob, share=True)
    except (KeyError, IndexError, TypeError, ValueError) as err:
        raise ModelFormatError(f"{path}: malformed executable header ({err})") from err
    lib_path, holder = _library_file(bytes(sections["library"]), path)
    module = Module(lib_path, source, functions, keep_alive=holder)
    for name, plan in plans.items():
        if plan.entry is not None and not hasattr(module.lib, plan.entry):
            raise ModelFormatError(
                f"{path}: function {name!r} names native entry {plan.entry!r}, which the "
                "library lacks"
            )
    return _executable(module, plans, meta, sections, CORE_SECTIONS)


def _read_meta(sections: Mapping[str, Any], path: str) -> dict[str, Any]:
    """The meta section, checked for this machine (see :func:`check_runs_here`)."""
    if "meta" not in sections:
        raise ModelFormatError(f"{path}: malformed kiln executable (no section meta)")
    try:
        meta = json.loads(bytes(sections["meta"]).decode())
        if not isinstance(meta, dict):
            raise ValueError("not a JSON object")
    except (UnicodeDecodeError, ValueError) as err:
        raise ModelFormatError(f"{path}: malformed meta section ({err})") from err
    check_runs_here(meta, path)
    return meta


def _executable(module: Any, plans: dict[str, Plan], meta: dict[str, Any],
                sections: Mapping[str, Any], core: Sequence[str]) -> Executable:
    """The loaded executable, with the file's sections beyond ``core`` kept as extra ones."""
    exe = Executable(module, plans, target=str(meta.get("target", "c")),
                     required_features=frozenset(meta.get("required_features") or ()),
                     kiln_version=str(meta.get("kiln_version", "?")),
                     machine=meta.get("machine"))
    for name, view in sections.items():
        if name != "meta" and name not in core:
            exe.sections[name] = bytes(view)
    return exe


def _load_gpu(sections: Mapping[str, Any], path: str) -> Executable:
    """A GPU executable's file (:mod:`kiln.runtime.gpu.serialize`): no compiler needed, CUDA
    programs reload from their cubin/PTX, OpenCL ones from their source."""
    meta = _read_meta(sections, path)
    program, plans, core = gpu_serialize.load(sections, path)
    return _executable(GpuModule(program), plans, meta, sections, core)
