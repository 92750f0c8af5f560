"""The OpenMP thread count of kiln's calls: a setting per executable, honoured from any thread.

OpenMP keeps its thread count (``omp_set_num_threads``) per *calling thread*, and one libgomp
serves every kiln library of a process, so a count set by one executable in one thread would
leak into the next executable that thread runs, and would not reach calls made from other
threads at all. kiln therefore keeps the count with the executable (``Executable.
set_num_threads``) and applies it just before each call, in the calling thread:
:func:`use` sets OpenMP's count only when it differs from what the thread has now (kiln
remembers that per thread, so a call costs one attribute lookup, not a ctypes call). An
executable without a count of its own runs with the count the thread had before kiln first
touched it (OpenMP's default: ``OMP_NUM_THREADS`` or every CPU the process may use).
"""

from __future__ import annotations

import ctypes
import threading
from collections.abc import Callable
from typing import Any


class _ThreadCounts(threading.local):
    #: The count OpenMP uses for regions started from this thread now (None: not read yet).
    current: int | None = None
    #: The thread's count before kiln set one (what an executable without a setting uses).
    default: int | None = None


_COUNTS = _ThreadCounts()

#: ``(set, get)`` native functions of a library: ``kiln_set_num_threads`` and
#: ``kiln_get_max_threads``, which every library made by ``kiln.build`` exports.
Setter = tuple[Callable[[int], None], Callable[[], int]]


def setter(module: Any) -> Setter | None:
    """The thread-count functions of ``module``'s library, None when it has none (a library
    not made by ``kiln.build``: its calls then run with whatever count the thread has)."""
    lib = getattr(module, "lib", None)
    try:
        set_fn, get_fn = lib.kiln_set_num_threads, lib.kiln_get_max_threads
    except AttributeError:
        return None
    set_fn.restype, set_fn.argtypes = None, (ctypes.c_int32,)
    get_fn.restype, get_fn.argtypes = ctypes.c_int32, ()
    return set_fn, get_fn


def default_count(fns: Setter) -> int:
    """The calling thread's count before kiln set any (read once per thread)."""
    counts = _COUNTS
    if counts.default is None:
        counts.default = counts.current = int(fns[1]())
    return counts.default


def use(fns: Setter | None, count: int | None) -> None:
    """Make the calling thread's next OpenMP regions use ``count`` threads (None: the
    thread's default), calling into OpenMP only when that changes the setting."""
    if fns is None:
        return
    counts = _COUNTS
    if counts.default is None:
        default_count(fns)
    want = counts.default if count is None else count
    if counts.current != want:
        fns[0](want)
        counts.current = want


def effective_count(fns: Setter | None, count: int | None) -> int:
    """How many threads a call made now from this thread would use."""
    if count is not None:
        return count
    return 1 if fns is None else default_count(fns)
