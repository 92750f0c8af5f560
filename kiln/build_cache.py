"""The executable cache: ``kiln.build`` of a model built before is a file load.

The kernel cache (``kiln.runtime.cache``, ``c/<hash>.so``) saves the C compile of a rebuild,
but not the graph passes, scheduling, lowering and code generation before it: 3-6 s for
ResNet-18 or MobileNetV2 on a 2-core machine, paid by every process that builds the model (a
service at each start). This second level keeps the whole executable, in the format of
``kiln.save`` (``docs/executables.md``), at ``<cache dir>/executables/<key>.kiln``, where the
key is the sha256 of everything that decides the compiled result:

- the input module (:func:`kiln.ir.fingerprint.fingerprint`: every node and field, variable
  names, source spans, attributes, the bytes of every constant) and the ``params`` bound into
  it (names, dtypes, shapes, bytes);
- the target: its spec, the features the schedules may use, the vector width (also set by
  ``KILN_VECTOR_BITS``), the machine, and the C compiler (command and version);
- the pass configuration of the current ``PassContext``: opt level, required and disabled
  passes, config; and the memory limit the build checks (``KILN_MEMORY_LIMIT``);
- kiln: its version and a digest of its source files (a development checkout whose code
  changed gets new keys), numpy's version, and the source of any op declaration, schedule
  rule or hook registered from outside kiln (user extensions change schedules too).

A build with its own ``pipeline``, with pass instruments (timing, IR dumps: the passes must
run), for a non-CPU target, or of IR holding a value without stable content (a Python object
known only by its address, :class:`~kiln.ir.fingerprint.NotFingerprintable`) is not cached.

A cached file is checked as ``kiln.load`` checks any file (every section's sha256, the CPU
features): a damaged or unloadable entry is logged, removed, rebuilt and stored again -- never
used. Entries share the kernel cache's LRU size cap (``KILN_CACHE_MAX_SIZE``) and ``kiln cache
info`` / ``kiln cache clear``. Off: ``kiln.build(..., cache=False)`` or
``KILN_EXECUTABLE_CACHE=0``.
"""

from __future__ import annotations

import contextlib
import dataclasses
import functools
import hashlib
import inspect
import json
import logging
import os
from collections.abc import Callable, Iterator, Mapping
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import numpy as np

from .graph.op_registry import get_op_def, list_ops
from .ir.errors import KilnError
from .ir.fingerprint import NotFingerprintable, fingerprint, fingerprint_array
from .ir.module import IRModule
from .runtime import cache
from .runtime.executable import Executable, load
from .runtime.memory_plan import MEMORY_LIMIT_ENV
from .schedule.registry import registered_hooks
from .target import Target
from .target.c_compiler import find_compiler
from .target.cpu import host_machine
from .transform.pass_infra import PassContext
from .version import __version__

__all__ = ["ENV", "build_key", "enabled", "entry_path", "kiln_source_digest", "lookup",
           "store"]

LOGGER = logging.getLogger("kiln")
#: Environment variable: ``0`` (or off/false/no) turns the executable cache off.
ENV = "KILN_EXECUTABLE_CACHE"
#: Top-level module names whose code is not kiln's but is stable for a given version of it
#: (registered hooks may be numpy functions); numpy's version is part of the key.
_LIBRARY_MODULES = ("numpy", "builtins", "math", "operator", "functools")
_KILN_ROOT = Path(__file__).resolve().parent


def enabled(option: bool | None = None) -> bool:
    """Whether builds use the cache: ``option`` when given, else ``$KILN_EXECUTABLE_CACHE``
    (on unless ``0``, ``off``, ``false`` or ``no``)."""
    if option is not None:
        return bool(option)
    return os.environ.get(ENV, "").strip().lower() not in ("0", "off", "false", "no")


@functools.lru_cache(maxsize=1)
def kiln_source_digest() -> str:
    """sha256 of kiln's own files (paths and bytes, ``__pycache__`` aside), once per process:
    a changed kiln compiles differently even when its version string did not change."""
    h = hashlib.sha256()
    for path in sorted(_KILN_ROOT.rglob("*")):
        if "__pycache__" in path.parts or not path.is_file() or path.suffix == ".pyc":
            continue
        h.update(str(path.relative_to(_KILN_ROOT)).encode() + b"\0")
        h.update(hashlib.sha256(path.read_bytes()).digest())
    return h.hexdigest()


def _callables(x: Any, depth: int = 0) -> Iterator[Callable[..., Any]]:
    """The functions and classes held by an op declaration's fields (dicts and sequences of
    them included; a ``functools.partial`` by its function and arguments)."""
    if depth > 4:
        return
    if isinstance(x, functools.partial):
        yield from _callables(x.func, depth + 1)
        for a in (*x.args, *x.keywords.values()):
            yield from _callables(a, depth + 1)
    elif callable(x):
        yield x
    elif isinstance(x, Mapping):
        for v in x.values():
            yield from _callables(v, depth + 1)
    elif isinstance(x, (list, tuple)):
        for v in x:
            yield from _callables(v, depth + 1)


def _external_code() -> list[tuple[str, str]]:
    """``(qualified name, sha256 of its source)`` of every op hook, schedule and rule that
    comes from outside kiln (and is not library code); NotFingerprintable for one whose source
    cannot be read."""
    found: dict[str, str] = {}
    funcs: list[Any] = list(registered_hooks())
    for name in list_ops():
        opdef = get_op_def(name)
        funcs += [getattr(opdef, f.name) for f in dataclasses.fields(opdef)]
    for fn in (c for f in funcs for c in _callables(f)):
        module = getattr(fn, "__module__", None) or ""
        if module == "kiln" or module.startswith("kiln.") or \
                module.split(".")[0] in _LIBRARY_MODULES:
            continue
        qual = f"{module}.{getattr(fn, '__qualname__', type(fn).__qualname__)}"
        if qual in found:
            continue
        try:
            source = inspect.getsource(fn)
        except (OSError, TypeError) as err:
            raise NotFingerprintable(f"registered code {qual} has no readable source "
                                     f"({err})") from None
        found[qual] = hashlib.sha256(source.encode()).hexdigest()
    return sorted(found.items())


def _target_key(tgt: Target) -> dict[str, Any]:
    compiler = find_compiler()
    return {"spec": tgt.spec, "features": sorted(tgt.features or ()),
            "vector_bits": tgt.vector_bits, "attrs": repr(sorted(tgt.attrs.items())),
            "machine": host_machine(), "compiler": [list(compiler.command), compiler.version]}


def _params_key(params: Mapping[str, Any] | None) -> list[list[str]]:
    """``[name, digest]`` of every param. The arrays are hashed on one thread per CPU:
    sha256 releases the GIL, and a transformer's weights are hundreds of megabytes (the
    BERT-style encoder's: 0.5 s of one core's time, most of a cached build)."""
    items = sorted((params or {}).items())
    try:
        with ThreadPoolExecutor(max_workers=max(1, min(len(items), os.cpu_count() or 1))) as ex:
            digests = list(ex.map(fingerprint_array, [v for _, v in items]))
    except Exception as err:  # noqa: BLE001 - not an array: the build reports it
        raise NotFingerprintable(f"params: {err}") from None
    return [[str(k), d.hex()] for (k, _), d in zip(items, digests)]


def build_key(mod: IRModule, tgt: Target, params: Mapping[str, Any] | None = None,
              ctx: PassContext | None = None) -> str:
    """The cache key of building ``mod`` (with ``params``) for ``tgt`` in ``ctx`` (default:
    the current PassContext): see the module docstring. Raises NotFingerprintable when some
    part has no stable content (the build should then not be cached)."""
    ctx = PassContext.current() if ctx is None else ctx
    parts = {
        "kiln": [__version__, kiln_source_digest(), np.__version__],
        "external_code": _external_code(),
        "target": _target_key(tgt),
        "passes": {"opt_level": ctx.opt_level, "required": sorted(ctx.required_pass),
                   "disabled": sorted(ctx.disabled_pass),
                   "config": fingerprint(dict(sorted(ctx.config.items())))},
        "memory_limit": os.environ.get(MEMORY_LIMIT_ENV, "").strip(),
        "module": fingerprint(mod),
        "params": _params_key(params),
    }
    return hashlib.sha256(json.dumps(parts, sort_keys=True).encode()).hexdigest()


def entry_path(key: str, root: Path | None = None) -> Path:
    """Where the executable of ``key`` is stored."""
    root = cache.cache_dir() if root is None else root
    return root / cache.EXECUTABLES / f"{key}{cache.EXECUTABLE_SUFFIX}"


def lookup(key: str) -> Executable | None:
    """The cached executable of ``key``, or None (none stored, or a stored one that fails to
    load: it is logged and removed, and the caller rebuilds)."""
    path = entry_path(key)
    if not path.is_file():
        return None
    try:
        exe = load(str(path), mmap=True)
    except KilnError as err:
        LOGGER.warning("kiln: the cached executable %s cannot be used and is rebuilt: %s",
                       path, err)
        with contextlib.suppress(OSError):
            path.unlink()
        return None
    cache.touch(path)
    return exe


def store(key: str, exe: Executable) -> None:
    """Save ``exe`` as the entry of ``key`` (atomically), then apply the cache's size cap.
    Best effort: a cache that cannot be written is logged and skipped."""
    path = entry_path(key)
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        exe.save(str(path))
    except (OSError, KilnError) as err:
        LOGGER.info("kiln: executable not cached (%s)", err)
        return
    cache.evict(keep=path)
