"""Saving and loading GPU executables: the program's source and binaries, plans, constants.

A GPU executable file reloads without a compiler: CUDA programs keep their cubin and PTX
(NVRTC is not needed to load them), OpenCL programs their source (the OpenCL driver compiles
it when the program is loaded, as it does after a build). Layout (little-endian)::

    b"KILNGPU\0"   magic
    u32           format version (:data:`VERSION`)
    u64 + bytes   JSON header: the program's description (DeviceProgram.to_json), the plans
                  (data types by name), the constant table, and where each section is
    bytes         the sections: the source, each binary, each constant
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
    binaries = list(program.binaries)
    sections: list[bytes] = [program.source.encode(), *program.binaries.values()]
    plans = {}
    for name, plan in exe.plans.items():
        for spec in plan.slots:
            dtypes.setdefault(spec.dtype, len(dtypes))
        pj = plan.to_json(dtypes)
        table = []
        for slot, arr in plan.constants.items():
            table.append([slot, len(sections), list(arr.shape)])
            sections.append(np.ascontiguousarray(arr).tobytes())
        pj["constants"] = table
        plans[name] = pj
    offsets, at = [], 0
    for data in sections:
        offsets.append([at, len(data)])
        at += len(data)
    header = json.dumps({
        "program": program.to_json(), "plans": plans, "binaries": binaries,
        "dtypes": [str(d) for d in sorted(dtypes, key=dtypes.__getitem__)],
        "sections": offsets}).encode()
    body = b"".join([MAGIC, struct.pack("<IQ", VERSION, len(header)), header, *sections])
    tmp = f"{path}.tmp{os.getpid()}"
    with open(tmp, "wb") as f:
        f.write(body + hashlib.sha256(body).digest())
    os.replace(tmp, path)


def load(path: str, data: bytes) -> Any:
    """The executable saved by :func:`save` (``data`` is the file's content)."""
    from ..executable import Executable
    from .module import GpuModule

    fixed = len(MAGIC) + struct.calcsize("<IQ")
    if len(data) < fixed + 32 or hashlib.sha256(data[:-32]).digest() != data[-32:]:
        raise ModelFormatError(f"{path}: damaged kiln GPU executable (checksum mismatch)")
    version, size = struct.unpack_from("<IQ", data, len(MAGIC))
    if version != VERSION:
        raise ModelFormatError(f"{path}: unsupported GPU executable version {version} (this "
                               f"kiln reads version {VERSION}; rebuild and save again)")
    try:
        header = json.loads(data[fixed:fixed + size].decode())
        base = fixed + size
        sections = [data[base + o:base + o + n] for o, n in header["sections"]]
        names = header["binaries"]
        binaries = dict(zip(names, sections[1:1 + len(names)]))
        program = DeviceProgram.from_json(header["program"], sections[0].decode(), binaries)
        dtypes = [DataType(d) for d in header["dtypes"]]
        plans = {}
        for name, pj in header["plans"].items():
            constants = {
                slot: memory_plan.aligned_copy(np.frombuffer(sections[section], dtype=dtypes[
                    pj["slots"][slot]["dtype"]].to_numpy()).reshape(shape))
                for slot, section, shape in pj["constants"]}
            plans[name] = Plan.from_json(pj, dtypes, constants)
    except (KeyError, IndexError, TypeError, ValueError, UnicodeDecodeError) as err:
        raise ModelFormatError(f"{path}: malformed GPU executable header ({err})") from err
    return Executable(GpuModule(program), plans)
