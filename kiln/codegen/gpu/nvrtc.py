"""Compiling CUDA C with NVRTC: PTX and a cubin for one architecture, with ptxas' report.

NVRTC (the ``nvidia-cuda-nvrtc`` wheel, driven through ``cuda-bindings``; ``pip install
"kiln[cuda]"``) needs no GPU and no CUDA toolkit: kiln compiles CUDA kernels on any machine.
For a real architecture (``sm_90``) NVRTC runs ptxas itself and returns a cubin, and with
``--ptxas-options=-v`` its log reports each kernel's registers, shared memory, stack frame and
spills (:func:`resource_usage`), which the tests hold against the target's limits. The PTX is
kept too: a driver JIT-compiles it for architectures newer than the cubin's.

Results are cached like the C backend's libraries, under ``cache_dir()/cuda/<key>.*`` with
``key`` the sha256 of the source, the options and NVRTC's version.
"""

from __future__ import annotations

import hashlib
import json
import os
import re
import tempfile
from dataclasses import dataclass

from ...ir.errors import CompileError, KilnError
from ...runtime.executable import cache_dir

#: Options of every compilation (the architecture is added per call).
OPTIONS = ("--std=c++17", "-default-device", "--ptxas-options=-v")
#: The comment a generated program carries when it uses instructions only an arch-specific
#: target has (wgmma: ``sm_90a``; :mod:`kiln.codegen.gpu.helpers` writes it).
ARCH_SPECIFIC_MARKER = "/* kiln: arch-specific instructions (wgmma: sm_90a) */"


def compile_arch(source: str, arch: str) -> str:
    """The architecture NVRTC compiles ``source`` for: ``arch``, or its arch-specific variant
    (``sm_90a``) when the source carries :data:`ARCH_SPECIFIC_MARKER`. A program keeps ``arch``
    as its own: a cubin for ``sm_90a`` loads on the sm_90 devices it was built for."""
    if ARCH_SPECIFIC_MARKER in source and not arch.endswith("a"):
        return arch + "a"
    return arch


@dataclass(frozen=True)
class KernelResources:
    """What ptxas reports for one kernel."""

    registers: int
    shared_bytes: int
    stack_bytes: int
    spill_stores: int
    spill_loads: int


@dataclass(frozen=True)
class CudaBinary:
    ptx: bytes
    cubin: bytes
    log: str

    def resources(self) -> dict[str, KernelResources]:
        return resource_usage(self.log)

    def kernel_ptx(self) -> dict[str, str]:
        """Each kernel's PTX (``.entry`` to the next function), by name: what tests and
        benchmarks count instructions in (device helpers are inlined into their kernels)."""
        return kernel_ptx(self.ptx.decode(errors="replace"))


def nvrtc_module():
    """``cuda.bindings.nvrtc``, or a KilnError saying what to install."""
    try:
        from cuda.bindings import nvrtc
    except ImportError as err:
        raise KilnError(
            "CUDA code generation needs NVRTC: install kiln's CUDA extra "
            "(pip install \"kiln[cuda]\": cuda-bindings and nvidia-cuda-nvrtc)") from err
    return nvrtc


def _check(result, what: str) -> None:
    err = result[0] if isinstance(result, tuple) else result
    if int(err) != 0:
        raise CompileError(f"NVRTC {what} failed: {err}")


def nvrtc_version() -> tuple[int, int]:
    nvrtc = nvrtc_module()
    try:
        result = nvrtc.nvrtcVersion()
    except RuntimeError as err:  # the library itself is missing
        raise KilnError(f"NVRTC cannot be loaded ({err}); install kiln's CUDA extra "
                        "(pip install \"kiln[cuda]\")") from err
    _check(result, "version")
    return int(result[1]), int(result[2])


def _cache_paths(key: str) -> dict[str, str]:
    root = os.path.join(cache_dir(), "cuda")
    os.makedirs(root, exist_ok=True)
    return {ext: os.path.join(root, f"{key}.{ext}") for ext in ("ptx", "cubin", "log")}


def _write(path: str, data: bytes) -> None:
    fd, tmp = tempfile.mkstemp(dir=os.path.dirname(path))
    with os.fdopen(fd, "wb") as f:
        f.write(data)
    os.replace(tmp, path)


def compile_cuda(source: str, arch: str, options: tuple[str, ...] = ()) -> CudaBinary:
    """PTX and cubin of ``source`` for ``arch`` (``sm_80``...; ``sm_90a`` for a source that
    needs it, :func:`compile_arch`), from the cache when it has them; a CompileError carries
    NVRTC's log."""
    opts = (*OPTIONS, f"--gpu-architecture={compile_arch(source, arch)}", *options)
    version = nvrtc_version()
    key = hashlib.sha256(json.dumps([source, opts, version]).encode()).hexdigest()[:40]
    paths = _cache_paths(key)
    if all(os.path.exists(p) for p in paths.values()):
        with open(paths["ptx"], "rb") as f1, open(paths["cubin"], "rb") as f2, \
                open(paths["log"], encoding="utf-8") as f3:
            return CudaBinary(f1.read(), f2.read(), f3.read())
    nvrtc = nvrtc_module()
    result = nvrtc.nvrtcCreateProgram(source.encode(), b"kiln.cu", 0, [], [])
    _check(result, "program creation")
    prog = result[1]
    try:
        encoded = [o.encode() for o in opts]
        (err,) = nvrtc.nvrtcCompileProgram(prog, len(encoded), encoded)
        size = nvrtc.nvrtcGetProgramLogSize(prog)[1]
        log_buf = b" " * size
        nvrtc.nvrtcGetProgramLog(prog, log_buf)
        log = log_buf.rstrip(b"\0 ").decode(errors="replace")
        if int(err) != 0:
            raise CompileError(f"NVRTC could not compile the generated CUDA ({arch}):\n{log}")
        size = nvrtc.nvrtcGetPTXSize(prog)[1]
        ptx = b" " * size
        _check(nvrtc.nvrtcGetPTX(prog, ptx), "PTX")
        size = nvrtc.nvrtcGetCUBINSize(prog)[1]
        cubin = b" " * size
        _check(nvrtc.nvrtcGetCUBIN(prog, cubin), "cubin")
    finally:
        nvrtc.nvrtcDestroyProgram(prog)
    _write(paths["ptx"], ptx)
    _write(paths["cubin"], cubin)
    _write(paths["log"], log.encode())
    return CudaBinary(ptx, cubin, log)


_ENTRY = re.compile(r"Compiling entry function '(\w+)'")
_USED = re.compile(r"Used (\d+) registers(?:.*?(\d+) bytes smem)?")
_FRAME = re.compile(r"(\d+) bytes stack frame, (\d+) bytes spill stores, (\d+) bytes spill loads")


_FUNCTION = re.compile(r"^\s*(?:\.visible\s+|\.weak\s+)?\.(entry|func)\s+(?:\([^)]*\)\s*)?(\w+)",
                       re.MULTILINE)


def kernel_ptx(ptx: str) -> dict[str, str]:
    """The text of each ``.entry`` of ``ptx`` (up to the next ``.entry`` or ``.func``)."""
    heads = list(_FUNCTION.finditer(ptx))
    out: dict[str, str] = {}
    for k, m in enumerate(heads):
        if m.group(1) == "entry":
            end = heads[k + 1].start() if k + 1 < len(heads) else len(ptx)
            out[m.group(2)] = ptx[m.start():end]
    return out


def resource_usage(log: str) -> dict[str, KernelResources]:
    """Per kernel, the registers, static shared memory, stack frame and spills ptxas reports
    (``--ptxas-options=-v``)."""
    out: dict[str, KernelResources] = {}
    name = None
    frame = (0, 0, 0)
    for line in log.splitlines():
        m = _ENTRY.search(line)
        if m:
            name, frame = m.group(1), (0, 0, 0)
            continue
        m = _FRAME.search(line)
        if m and name:
            frame = (int(m.group(1)), int(m.group(2)), int(m.group(3)))
            continue
        m = _USED.search(line)
        if m and name:
            out[name] = KernelResources(int(m.group(1)), int(m.group(2) or 0), *frame)
            name = None
    return out
