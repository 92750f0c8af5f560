"""AMX tile-data permission: Linux hands AMX registers to a process only after it asks.

Since Linux 5.16 a process must call ``arch_prctl(ARCH_REQ_XCOMP_PERM, XFEATURE_XTILEDATA)``
before its first AMX instruction (otherwise the instruction faults). The generated C helpers
of the AMX tensor intrinsics (:mod:`kiln.tir.tensor_intrin.x86`) ask once themselves and fall
back to portable C when refused; :func:`request_amx_permission` asks from Python so that a
module built for an AMX target fails at load time with a clear error instead of running the
slow path silently.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import functools
import os
import platform

from ..ir.errors import KilnError

SYS_ARCH_PRCTL = 158  # x86-64 system call number
ARCH_GET_XCOMP_PERM = 0x1022
ARCH_REQ_XCOMP_PERM = 0x1023
XFEATURE_XTILEDATA = 18


class AMXPermissionError(KilnError):
    """The kernel refused (or cannot grant) the AMX tile-data permission."""


@functools.lru_cache(maxsize=1)
def _libc() -> ctypes.CDLL:
    return ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6", use_errno=True)


def amx_permitted() -> bool:
    """Whether this process may already use AMX tile data."""
    if platform.system() != "Linux" or platform.machine() not in ("x86_64", "AMD64"):
        return False
    mask = ctypes.c_uint64(0)
    rc = _libc().syscall(SYS_ARCH_PRCTL, ARCH_GET_XCOMP_PERM, ctypes.byref(mask))
    return rc == 0 and bool(mask.value & (1 << XFEATURE_XTILEDATA))


def request_amx_permission() -> None:
    """Ask Linux for AMX tile data for this process (idempotent); raise AMXPermissionError
    naming the reason when it is refused."""
    if platform.system() != "Linux" or platform.machine() not in ("x86_64", "AMD64"):
        raise AMXPermissionError(
            f"AMX needs Linux on x86-64, this is {platform.system()} {platform.machine()}"
        )
    rc = _libc().syscall(SYS_ARCH_PRCTL, ARCH_REQ_XCOMP_PERM, XFEATURE_XTILEDATA)
    if rc != 0:
        err = ctypes.get_errno()
        raise AMXPermissionError(
            "the kernel refused AMX tile data (arch_prctl(ARCH_REQ_XCOMP_PERM, "
            f"XFEATURE_XTILEDATA) failed: {os.strerror(err)}); AMX needs a CPU with amx_tile "
            "and Linux 5.16 or newer"
        )
