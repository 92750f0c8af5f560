"""The sections of a GPU executable's file: the program's source and binaries, plans, constants.

A GPU executable is saved in the same container as a CPU one (:mod:`kiln.runtime.file_format`:
named sections, each checksummed) with ``meta`` as on the CPU and these sections instead of the
CPU library's::

    gpu.header          JSON: the program's description (DeviceProgram.to_json), the plans
                        (data types by name), each plan's constant table, the binaries' names
    gpu.source          the CUDA C or OpenCL C source
    gpu.binary.<name>   each binary of the program (CUDA: the cubin and the PTX)
    gpu.constants       the constants' bytes, at the offsets the header gives

It reloads without a compiler: CUDA programs from their cubin and PTX (NVRTC is not needed),
OpenCL programs from their source (the OpenCL driver compiles it when the program is loaded, as
it does after a build).
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from typing import Any

from ...ir.dtype import DataType
from ...ir.errors import ModelFormatError
from ..plan import Plan
from ..plan_file import plans_from_json, plans_to_json
from .program import DeviceProgram

HEADER = "gpu.header"
SOURCE = "gpu.source"
CONSTANTS = "gpu.constants"
BINARY_PREFIX = "gpu.binary."


def is_gpu_file(sections: Mapping[str, Any]) -> bool:
    """Whether a file's sections are a GPU executable's."""
    return HEADER in sections


def sections(program: DeviceProgram, plans: Mapping[str, Plan]) -> list[tuple[str, bytes]]:
    """The sections (``(name, bytes)``) that save ``program`` and ``plans``."""
    dtypes: dict[DataType, int] = {}
    plans_json, blob = plans_to_json(plans, dtypes)
    header = json.dumps({
        "program": program.to_json(), "plans": plans_json, "binaries": list(program.binaries),
        "dtypes": [str(d) for d in sorted(dtypes, key=dtypes.__getitem__)]}).encode()
    return [(HEADER, header), (SOURCE, program.source.encode()),
            *((BINARY_PREFIX + n, bytes(b)) for n, b in program.binaries.items()),
            (CONSTANTS, blob)]


def load(secs: Mapping[str, Any], path: str) -> tuple[DeviceProgram, dict[str, Plan],
                                                       tuple[str, ...]]:
    """The program and plans saved by :func:`sections`, and the names of the sections they
    took (the file's other sections are the executable's extra ones)."""
    try:
        header = json.loads(bytes(secs[HEADER]).decode())
        names = header["binaries"]
        core = (HEADER, SOURCE, CONSTANTS, *(BINARY_PREFIX + n for n in names))
        missing = [n for n in core if n not in secs]
        if missing:
            raise ModelFormatError(f"{path}: malformed GPU executable (no section(s) "
                                   f"{', '.join(missing)})")
        binaries = {n: bytes(secs[BINARY_PREFIX + n]) for n in names}
        program = DeviceProgram.from_json(header["program"], bytes(secs[SOURCE]).decode(),
                                          binaries)
        dtypes = [DataType(d) for d in header["dtypes"]]
        plans = plans_from_json(header["plans"], dtypes, secs[CONSTANTS])
    except (KeyError, IndexError, TypeError, ValueError, UnicodeDecodeError) as err:
        raise ModelFormatError(f"{path}: malformed GPU executable header ({err})") from err
    return program, plans, core
