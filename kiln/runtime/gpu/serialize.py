"""Saving and loading GPU executables: the program's source and binaries, plans, constants.

A GPU executable file reloads without a compiler: CUDA programs keep their cubin and PTX
(NVRTC is not needed to load them), OpenCL programs their source (the OpenCL driver compiles
it when the program is loaded, as it does after a build). Layout (little-endian)::

    b"KILNGPU\\0"   magic
    u32           format version (:data:`VERSION`)
    u64 + bytes   JSON header: the program's description (DeviceProgram.to_json), the plans
                  (data types by name), the constant table
    u64 + bytes   the program's source
    u32           number of binaries, then per binary: u32 + name, u64 + bytes
    u64 + bytes   constant data (each constant at the offset the header gives)
    32 bytes      sha256 of everything before it

The checksum makes a truncated or damaged file a ModelFormatError instead of a wrong model.
"""

from __future__ import annotations

import hashlib
import json
import os
import struct
from typing import Any

import numpy as np

from ...ir.dtype import DataType
from ...ir.errors import ModelFormatError
from .. import memory_plan
from ..plan import Plan
from .program import DeviceProgram

MAGIC = b"KILNGPU\0"
VERSION = 1


def is_gpu_file(data: bytes) -> bool:
    return data.startswith(MAGIC)


def save(exe: Any, path: str) -> None:
    """Write a GPU :class:`~kiln.runtime.executable.Executable` to ``path``."""
    program: DeviceProgram = exe.module.program
    dtypes: dict[DataType, int] = {}
    const_blob = bytearray()
    plans = {}
    for name, plan in exe.plans.items():
        for spec in plan.slots:
            dtypes.setdefault(spec.dtype, len(dtypes))
        pj = plan.to_json(dtypes)
        table = []
        for slot, arr in plan.constants.items():
            data = np.ascontiguousarray(arr).tobytes()
            table.append({"slot": slot, "offset": len(const_blob), "nbytes": len(data),
                          "shape": list(arr.shape)})
            const_blob += data
        pj["constants"] = table
        plans[name] = pj
    header = json.dumps({"program": program.to_json(), "plans": plans,
                         "dtypes": [str(d) for d in sorted(dtypes, key=dtypes.__getitem__)]})
    parts = [MAGIC, struct.pack("<I", VERSION), *_blob(header.encode()),
             *_blob(program.source.encode()), struct.pack("<I", len(program.binaries))]
    for key, data in program.binaries.items():
        name = key.encode()
        parts += [struct.pack("<I", len(name)), name, *_blob(data)]
    parts += _blob(bytes(const_blob))
    body = b"".join(parts)
    tmp = f"{path}.tmp{os.getpid()}"
    with open(tmp, "wb") as f:
        f.write(body + hashlib.sha256(body).digest())
    os.replace(tmp, path)


def _blob(data: bytes) -> list[bytes]:
    return [struct.pack("<Q", len(data)), data]


class _Reader:
    def __init__(self, data: bytes, path: str):
        self.data, self.pos, self.path = data, 0, path

    def take(self, n: int) -> bytes:
        if self.pos + n > len(self.data):
            raise ModelFormatError(f"{self.path}: truncated kiln GPU executable")
        out = self.data[self.pos:self.pos + n]
        self.pos += n
        return out

    def u32(self) -> int:
        return struct.unpack("<I", self.take(4))[0]

    def blob(self) -> bytes:
        (n,) = struct.unpack("<Q", self.take(8))
        return self.take(n)


def load(path: str, data: bytes) -> Any:
    """The executable saved by :func:`save` (``data`` is the file's content)."""
    from ..executable import Executable
    from .module import GpuModule

    if len(data) < len(MAGIC) + 32 or hashlib.sha256(data[:-32]).digest() != data[-32:]:
        raise ModelFormatError(f"{path}: damaged kiln GPU executable (checksum mismatch)")
    r = _Reader(data[:-32], path)
    r.take(len(MAGIC))
    version = r.u32()
    if version != VERSION:
        raise ModelFormatError(f"{path}: unsupported GPU executable version {version} (this "
                               f"kiln reads version {VERSION}; rebuild and save again)")
    try:
        header = json.loads(r.blob().decode())
        source = r.blob().decode()
        binaries = {}
        for _ in range(r.u32()):
            name = r.take(r.u32()).decode()
            binaries[name] = r.blob()
        const_blob = r.blob()
        dtypes = [DataType(d) for d in header["dtypes"]]
        program = DeviceProgram.from_json(header["program"], source, binaries)
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
    except (KeyError, IndexError, TypeError, ValueError, UnicodeDecodeError) as err:
        raise ModelFormatError(f"{path}: malformed GPU executable header ({err})") from err
    return Executable(GpuModule(program), plans)
