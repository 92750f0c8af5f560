"""The DRAM tensors a program's lowerings allocated, indexed by address: which tensor an
instruction's DRAM block falls in (the DRAM plan relocates them, the residency pass moves some
to L1)."""

from __future__ import annotations

import bisect

import numpy as np

from .emit import DRAM_ALIGN, DramTensor, dram_itemsize

__all__ = ["DramRanges", "tensor_bytes"]


def tensor_bytes(t: DramTensor) -> int:
    """The bytes of a DRAM tensor's elements."""
    return int(np.prod(t.shape, dtype=np.int64)) * dram_itemsize(t.dtype)


class DramRanges:
    """The allocations by start address (each rounded up to whole ``DRAM_ALIGN`` units); each
    address maps to the one holding it. ``first``/``last`` record a live interval per range
    (:meth:`use`)."""

    def __init__(self, allocations: list[DramTensor]):
        self.tensors = sorted(allocations, key=lambda t: t.addr)
        self.starts = [t.addr for t in self.tensors]
        self.ends = [t.addr + max(DRAM_ALIGN, -(-tensor_bytes(t) // DRAM_ALIGN) * DRAM_ALIGN)
                     for t in self.tensors]
        self.first: dict[int, int] = {}
        self.last: dict[int, int] = {}

    def index(self, addr: int) -> int | None:
        """The range holding byte ``addr`` (None: none)."""
        i = bisect.bisect_right(self.starts, addr) - 1
        return i if i >= 0 and addr < self.ends[i] else None

    def use(self, addr: int, time: int) -> None:
        """Extend the live interval of the range holding ``addr`` (if any) to ``time``."""
        i = self.index(addr)
        if i is not None:
            self.first[i] = min(self.first.get(i, time), time)
            self.last[i] = max(self.last.get(i, time), time)
