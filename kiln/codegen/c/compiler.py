"""Compiling generated C into a shared library, with an on-disk cache.

The compiler is ``$CC`` (may include arguments, e.g. ``"ccache gcc"``) or else ``gcc`` / ``cc``
from ``PATH``. Flags: ``-O3 -march=<mcpu> -fopenmp-simd -pthread -shared -fPIC
-std=gnu11 -ffp-contract=fast -fno-math-errno -fwrapv -fno-predictive-commoning`` (``mcpu`` is the
target's CPU, ``native`` by default: ``flags(march)``). Deliberately *not*
``-ffast-math``: NaN and infinity must behave as IEEE says. ``-fopenmp-simd`` reads ``#pragma
omp simd`` only: parallel loops run on kiln's own thread pool, not OpenMP's
(``kiln.codegen.c.thread_pool``). ``-fno-math-errno`` only stops libm
calls from setting ``errno`` (which lets GCC vectorize ``sqrtf`` and call libmvec), ``-fwrapv``
gives signed integer overflow the wrap-around numpy has. ``-fno-predictive-commoning``: that
-O3 pass keeps values loaded in one iteration in registers for the next ones; in a
register-tiled kernel whose taps overlap (a strided 7x7 convolution) it kept dozens of input
scalars live next to the 12 accumulators and spilled them (ResNet-18's stem ran 2.8x slower
once its tail guards were gone).

Libraries are cached under ``$KILN_CACHE_DIR``, else ``$XDG_CACHE_HOME/kiln``, else
``~/.cache/kiln``, in ``c/<key>.so`` with the source next to it as ``c/<key>.c``; ``key`` is the
sha256 of the source, the flags, the compiler's version text and, for ``-march=native``, the
host CPU's features (code for a named CPU is the same on every host). Files are written to a
temporary name and renamed, so concurrent builds (parallel test workers) never see a
half-written library. A cache hit marks the entry used and a new library may evict the least
recently used ones (``kiln.runtime.cache``: the ``KILN_CACHE_MAX_SIZE`` cap).

A large file (:data:`PARALLEL_MIN_CHARS`) whose text is divided into compilation units
(:data:`UNIT_MARK` lines after a common prelude, as ``kiln.codegen.c.build`` writes it) is
compiled as several translation units at once -- each the prelude plus a share of the units,
balanced by size -- and linked: one per CPU this process may use, or ``$KILN_COMPILE_JOBS``.
ResNet-18's kernels took 7.5 s of GCC in one piece, 3.9 s in two on 2 cores. The library
is cached under the whole file's key, however many pieces made it.
"""

from __future__ import annotations

import contextlib
import ctypes
import ctypes.util
import functools
import hashlib
import os
import platform
import shlex
import subprocess
import tempfile
from dataclasses import dataclass
from pathlib import Path

from ... import progress
from ...ir.errors import CompileError
from ...runtime import cache
from ...runtime.cache import cache_dir
from ...target.c_compiler import Compiler, find_compiler
from ...target.cpu import host_features
from .helpers import MVEC_CANDIDATES

#: The line between compilation units of a generated file (see the module docstring).
UNIT_MARK = "/* ---- kiln: compilation unit ---- */"
#: Size of a generated file (characters) from which it is compiled in parallel pieces: below,
#: one more compiler process costs more than it saves.
PARALLEL_MIN_CHARS = 100_000

BASE_FLAGS: tuple[str, ...] = (
    "-O3", "-fopenmp-simd", "-pthread", "-shared", "-fPIC", "-std=gnu11",
    "-ffp-contract=fast", "-fno-math-errno", "-fwrapv", "-fno-predictive-commoning",
)


def flags(march: str = "native") -> tuple[str, ...]:
    """The compiler flags for code built for CPU ``march`` (see the module docstring)."""
    return (BASE_FLAGS[0], f"-march={march}", *BASE_FLAGS[1:])


#: The flags of code built for this CPU (the default target).
FLAGS = flags("native")


@functools.lru_cache(maxsize=1)
def _host_fingerprint() -> str:
    return platform.machine() + ":" + ",".join(sorted(host_features()))


@functools.lru_cache(maxsize=1)
def libmvec_functions() -> frozenset[str]:
    """libm functions (float32 spelling, e.g. ``expf``) with vector variants in libmvec.

    GCC only calls libmvec for functions declared ``__attribute__((simd))``; glibc declares
    them so only under ``-ffast-math``, so the generated code declares the ones this glibc's
    libmvec provides (probed by symbol name: ``_ZGVbN4v_expf``...).
    """
    if platform.machine() not in ("x86_64", "AMD64"):
        return frozenset()
    name = ctypes.util.find_library("mvec")
    if name is None:
        return frozenset()
    try:
        lib = ctypes.CDLL(name)
    except OSError:
        return frozenset()

    found = set()
    for fn in MVEC_CANDIDATES:
        arity = "vv" if fn == "pow" else "v"
        if hasattr(lib, f"_ZGVbN4{arity}_{fn}f") and hasattr(lib, f"_ZGVbN2{arity}_{fn}"):
            found.add(fn)
    return frozenset(found)


@functools.lru_cache(maxsize=8)
def _supports(command: tuple[str, ...], snippet: str) -> bool:
    with tempfile.TemporaryDirectory() as tmp:
        src = Path(tmp) / "probe.c"
        src.write_text(snippet)
        try:
            out = subprocess.run([*command, "-fsyntax-only", "-std=gnu11", str(src)],
                                 capture_output=True, timeout=60, check=False)
        except (OSError, subprocess.SubprocessError):
            return False
        return out.returncode == 0


def supports_float16() -> bool:
    """Whether the C compiler accepts ``_Float16`` (GCC 12+ on x86-64)."""
    try:
        cc = find_compiler()
    except CompileError:
        return False
    return _supports(cc.command, "_Float16 f(_Float16 x) { return x * (_Float16)2; }\n")


def _link_flags() -> list[str]:
    flags = ["-lm"]
    if libmvec_functions():
        flags.append("-lmvec")
    return flags


def cache_key(source: str, compiler: Compiler, march: str = "native") -> str:
    h = hashlib.sha256()
    host = _host_fingerprint() if march == "native" else ""
    for part in (source, " ".join(flags(march) + tuple(_link_flags())),
                 " ".join(compiler.command), compiler.version, host):
        h.update(part.encode("utf-8"))
        h.update(b"\0")
    return h.hexdigest()


def _atomic_write(path: Path, data: str) -> None:
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=path.name + ".", suffix=".tmp")
    try:
        with os.fdopen(fd, "w", encoding="utf-8") as f:
            f.write(data)
        os.replace(tmp, path)
    except BaseException:
        if os.path.exists(tmp):
            os.unlink(tmp)
        raise


@dataclass(frozen=True)
class CompileResult:
    lib_path: str
    source_path: str
    from_cache: bool


def compile_source(source: str, force: bool = False, march: str = "native") -> CompileResult:
    """Compile ``source`` for CPU ``march`` into a shared library (or reuse the cached one)."""
    compiler = find_compiler()
    key = cache_key(source, compiler, march)
    directory = cache_dir() / "c"
    src_path = directory / f"{key}.c"
    lib_path = directory / f"{key}.so"
    try:
        directory.mkdir(parents=True, exist_ok=True)
        if lib_path.exists() and not force:
            if not src_path.exists():
                _atomic_write(src_path, source)
            cache.touch(lib_path, src_path)
            progress.info("C compile: library found in the cache (%s)", lib_path.name)
            return CompileResult(str(lib_path), str(src_path), True)
        _atomic_write(src_path, source)
        fd, tmp_lib = tempfile.mkstemp(dir=directory, prefix=f"{key}.", suffix=".so.tmp")
        os.close(fd)
    except OSError as err:
        raise CompileError(
            f"cannot write the kiln build cache in {directory} ({err}); set KILN_CACHE_DIR to a "
            f"writable directory"
        ) from err
    pieces = _pieces(source, compile_jobs())
    cflags = flags(march)
    stage = progress.Stage(f"C compile ({len(source) // 1024} KiB, -march={march}, "
                           f"{len(pieces)} translation unit{'s' if len(pieces) > 1 else ''})")
    try:
        if len(pieces) == 1:
            _run([*compiler.command, *cflags, "-o", tmp_lib, str(src_path), *_link_flags()],
                 src_path)
        else:
            _compile_pieces(compiler, pieces, directory, key, tmp_lib, cflags)
    except BaseException:
        with contextlib.suppress(FileNotFoundError):  # a failed link may have removed it
            os.unlink(tmp_lib)
        raise
    os.replace(tmp_lib, lib_path)
    stage.finish()
    cache.evict(keep=lib_path)
    return CompileResult(str(lib_path), str(src_path), False)


def compile_jobs() -> int:
    """How many compiler processes a large file is compiled by: ``$KILN_COMPILE_JOBS``, else
    the CPUs this process may run on."""
    env = os.environ.get("KILN_COMPILE_JOBS", "").strip()
    if env:
        try:
            return max(1, int(env))
        except ValueError:
            raise CompileError(f"KILN_COMPILE_JOBS={env!r} is not a number of processes") from None
    try:
        return len(os.sched_getaffinity(0))
    except (AttributeError, OSError):
        return os.cpu_count() or 1


def _pieces(source: str, jobs: int) -> list[str]:
    """``source`` as translation units: itself, or (a large file with compilation units, more
    than one job) the prelude followed by a share of the units, at most ``jobs`` pieces of
    about equal size, each keeping the units' order."""
    parts = source.split(f"\n{UNIT_MARK}\n")
    if jobs < 2 or len(parts) < 3 or len(source) < PARALLEL_MIN_CHARS:
        return [source]
    prelude, units = parts[0], parts[1:]
    n = min(jobs, len(units))
    shares: list[list[int]] = [[] for _ in range(n)]
    sizes = [0] * n
    for i in sorted(range(len(units)), key=lambda i: -len(units[i])):
        k = sizes.index(min(sizes))
        shares[k].append(i)
        sizes[k] += len(units[i])
    return [prelude + "".join(f"\n{UNIT_MARK}\n{units[i]}" for i in sorted(share))
            for share in shares if share]


def _compile_pieces(compiler: Compiler, pieces: list[str], directory: Path, key: str,
                    lib: str, cflags: tuple[str, ...]) -> None:
    """Compile the translation units ``pieces`` at once, then link them into ``lib``. A piece
    that fails keeps its source, as ``<key>.<i>.c`` in the cache, for its diagnostics."""
    with tempfile.TemporaryDirectory(dir=directory, prefix=f"{key}.") as tmp:
        procs = []
        for i, text in enumerate(pieces):
            src, obj = Path(tmp) / f"{key}.{i}.c", Path(tmp) / f"{key}.{i}.o"
            src.write_text(text, encoding="utf-8")
            cmd = [*compiler.command, *cflags, "-c", "-o", str(obj), str(src)]
            try:
                procs.append((cmd, src, subprocess.Popen(cmd, stdout=subprocess.PIPE,
                                                         stderr=subprocess.PIPE, text=True)))
            except OSError as err:
                _stop(procs)
                raise CompileError(f"running the C compiler failed: {err}", str(src)) from err
        failure = None
        for i, (cmd, src, proc) in enumerate(procs):
            try:
                stdout, stderr = proc.communicate(timeout=600)
            except subprocess.TimeoutExpired:
                _stop(procs)
                raise CompileError("the C compiler ran for more than 600 s", str(src)) from None
            if proc.returncode != 0 and failure is None:
                kept = directory / f"{key}.{i}.c"
                _atomic_write(kept, pieces[i])
                failure = _failed(proc.returncode, [str(kept) if c == str(src) else c for c in cmd],
                                  kept, (stderr or "") + (stdout or ""))
        if failure is not None:
            raise failure
        objs = [str(Path(tmp) / f"{key}.{i}.o") for i in range(len(pieces))]
        _run([*compiler.command, *cflags, "-o", lib, *objs, *_link_flags()],
             directory / f"{key}.c")


def _stop(procs: list) -> None:
    for *_, proc in procs:
        if proc.poll() is None:
            proc.kill()
            proc.wait()


def _run(cmd: list[str], src_path: Path) -> None:
    """Run one compiler command; a failure raises CompileError with its diagnostics."""
    try:
        out = subprocess.run(cmd, capture_output=True, text=True, timeout=600, check=False)
    except (OSError, subprocess.SubprocessError) as err:
        raise CompileError(f"running the C compiler failed: {err}", str(src_path)) from err
    if out.returncode != 0:
        raise _failed(out.returncode, cmd, src_path, (out.stderr or "") + (out.stdout or ""))


def _failed(code: int, cmd: list[str], src_path: Path, diagnostics: str) -> CompileError:
    return CompileError(
        f"C compilation failed (exit {code}) for {src_path}\n"
        f"command: {' '.join(shlex.quote(c) for c in cmd)}\n{diagnostics.strip()}",
        str(src_path),
        diagnostics,
    )
