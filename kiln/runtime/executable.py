"""Executable: compiled kernels + execution plans + constants, saved to and loaded from one file.

File format (little-endian), version 1::

    b"KILNEXE\\0"  magic
    u32           format version
    u32           number of distinct data types, then each packed with kiln.ir.abi.DTYPE_STRUCT
                  (derived from DTYPE_LAYOUT; JSON below refers to data types by index)
    u64 + bytes   JSON header: kernels' FunctionInfo, plans, constant table
    u64 + bytes   the shared library
    u64 + bytes   the generated source
    u64 + bytes   constant data (each constant at the offset the header gives)

A loaded executable runs without recompiling: the library is written to the kernel cache under
its content hash and loaded from there.
"""

from __future__ import annotations

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
from .executor import Executor
from .module import FunctionInfo, Module, ParamInfo
from .plan import Plan

MAGIC = b"KILNEXE\0"
VERSION = 1


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

    def _executor(self, name: str) -> Executor:
        ex = self._executors.get(name)
        if ex is None:
            if name not in self.plans:
                raise KilnError(
                    f"executable has no function {name!r} (it has: {', '.join(self.plans)})"
                )
            ex = self._executors[name] = Executor(self.plans[name], self.module)
        return ex

    def __getitem__(self, name: str):
        ex = self._executor(name)
        return lambda *args, **kwargs: ex.run(*_order(ex.plan, args, kwargs))

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        name = "main" if "main" in self.plans else next(iter(self.plans))
        ex = self._executor(name)
        return ex.run(*_order(ex.plan, args, kwargs))

    @property
    def num_kernels(self) -> int:
        """Kernel calls made by one run of main."""
        name = "main" if "main" in self.plans else next(iter(self.plans))
        return self.plans[name].num_kernels

    def summary(self) -> str:
        lines = [f"kiln executable: {len(self.module.functions)} kernels in {self.module.lib_path}"]
        for name, plan in self.plans.items():
            ins = ", ".join(
                f"{n}: {plan.slots[s].dtype}{list(plan.slots[s].shape)}"
                for n, s in zip(plan.input_names, plan.input_slots)
            )
            lines.append(f"  {name}({ins}): {plan.num_kernels} kernel calls")
            for c in plan.calls:
                lines.append(f"    {c.func}({', '.join(map(str, c.args))})")
        return "\n".join(lines)

    # ---- persistence --------------------------------------------------------------------
    def save(self, path: str) -> None:
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
    r = _Reader(data, path)
    if r.take(len(MAGIC)) != MAGIC:
        raise ModelFormatError(f"{path} is not a kiln executable (bad magic)")
    version, ndtypes = r.unpack("<II")
    if version != VERSION:
        raise ModelFormatError(f"{path}: unsupported executable version {version}")
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
                constants[c["slot"]] = np.frombuffer(raw, dtype=dt.to_numpy()).reshape(
                    c["shape"]).copy()
            plans[name] = Plan.from_json(pj, dtypes, constants)
    except (KeyError, IndexError, TypeError, ValueError) as err:
        raise ModelFormatError(f"{path}: malformed executable header ({err})") from err
    module = Module(lib_path, source, functions)
    return Executable(module, plans)
