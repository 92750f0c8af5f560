"""The thread count of kiln's calls: a setting per executable, honoured from any thread.

Kernels run their parallel loops on the thread pool of their library
(``kiln.codegen.c.thread_pool``), which takes its thread count from the *calling thread*
(``kiln_set_num_threads``, a thread-local of the library; 0 means the default:
``KILN_NUM_THREADS``, else ``OMP_NUM_THREADS``, else every CPU the process may use). kiln
keeps the count with the executable instead (``Executable.set_num_threads``) and applies it
just before each call, in the calling thread: :func:`use` calls into the library only when the
count differs from what that thread last set in that library (kiln remembers it per thread
and library, so a call costs a dictionary lookup, not a ctypes call). Two executables sharing
a library (the same compiled code) therefore never see each other's setting.
"""

from __future__ import annotations

import ctypes
import threading
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any


class _ThreadCounts(threading.local):
    def __init__(self) -> None:
        #: library handle -> the count this thread last set there (0: the default)
        self.current: dict[int, int] = {}


_COUNTS = _ThreadCounts()


@dataclass(frozen=True)
class Setter:
    """The thread-count functions of one loaded library."""

    key: int  # the library's handle
    set: Callable[[int], None]
    get: Callable[[], int]


def setter(module: Any) -> Setter | None:
    """The thread-count functions of ``module``'s library, None when it has none (then its
    calls run with whatever the thread has)."""
    lib = getattr(module, "lib", None)
    try:
        set_fn, get_fn = lib.kiln_set_num_threads, lib.kiln_get_max_threads
    except AttributeError:
        return None
    set_fn.restype, set_fn.argtypes = None, (ctypes.c_int32,)
    get_fn.restype, get_fn.argtypes = ctypes.c_int32, ()
    return Setter(int(lib._handle), set_fn, get_fn)


def use(fns: Setter | None, count: int | None) -> None:
    """Make the calling thread's next parallel loops in ``fns``' library use ``count`` threads
    (None: the default), calling into the library only when that changes its setting."""
    if fns is None:
        return
    want = count or 0
    current = _COUNTS.current
    if current.get(fns.key, 0) != want:
        fns.set(want)
        current[fns.key] = want


def effective_count(fns: Setter | None, count: int | None) -> int:
    """How many threads a call made now from this thread would use."""
    if count is not None:
        return count
    if fns is None:
        return 1
    use(fns, None)
    return int(fns.get())
