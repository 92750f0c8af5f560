"""Static memory planning: intermediates of static shape share one workspace by liveness.

A temp slot is *live* from the kernel call that writes it to the last call that reads it (both
inclusive: a kernel reads its inputs while it writes its outputs, so an input dying at call k
and an output born at call k must not share bytes). Temps whose live ranges intersect get
disjoint byte ranges of one workspace; the others may reuse each other's bytes.

Placement is greedy best-fit: temps are taken largest first, and each goes into the smallest
gap (between the already placed temps it is live together with) that holds it, else above
all of them. Every offset and size is a multiple of :data:`ALIGN` bytes, so vector loads of any
width the code generator uses stay aligned when the workspace itself is.

Outputs (handed to the caller, fresh per run), inputs and constants are not planned. Temps of
symbolic shape are planned by the executor once per binding of the symbolic names when the plan
has a native entry (:func:`plan_memory` with the slots' concrete shapes), else allocated per
run.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from . import shape_expr
from .plan import Plan

#: Alignment of every temp's offset (and of the workspace base) in bytes.
ALIGN = 64


def _round_up(n: int, align: int = ALIGN) -> int:
    return (n + align - 1) // align * align


@dataclass(frozen=True)
class Interval:
    """One buffer to place: its size in bytes and live range ``[start, end]`` (call indices)."""

    key: int
    size: int
    start: int
    end: int

    def overlaps(self, other: Interval) -> bool:
        return self.start <= other.end and other.start <= self.end


def place(intervals: list[Interval], align: int = ALIGN) -> tuple[dict[int, int], int]:
    """Offsets (by key) for ``intervals`` such that two live at once never share a byte, and
    the peak (total bytes needed). Sizes are rounded up to ``align`` (default :data:`ALIGN`;
    a GPU device asks for its own) first."""
    offsets: dict[int, int] = {}
    placed: list[tuple[int, int, Interval]] = []  # (offset, aligned size, interval)
    peak = 0
    order = sorted(intervals, key=lambda iv: (-iv.size, iv.start, iv.key))
    for iv in order:
        size = _round_up(max(iv.size, 1), align)
        busy = sorted((off, sz) for off, sz, other in placed if other.overlaps(iv))
        best: tuple[int, int] | None = None  # (gap size, offset)
        cursor = 0
        for off, sz in busy:
            gap = off - cursor
            if gap >= size and (best is None or gap < best[0]):
                best = (gap, cursor)
            cursor = max(cursor, off + sz)
        offset = best[1] if best is not None else cursor
        offsets[iv.key] = offset
        placed.append((offset, size, iv))
        peak = max(peak, offset + size)
    return offsets, peak


def slot_nbytes(plan: Plan, slot: int, shape: Sequence[int] | None = None) -> int:
    """Bytes of ``slot`` (its static shape, or ``shape`` when given)."""
    spec = plan.slots[slot]
    dims = spec.shape if shape is None else shape
    count = int(np.prod(dims, dtype=np.int64)) if len(dims) else 1
    return count * np.dtype(spec.dtype.to_numpy()).itemsize


def is_static_slot(plan: Plan, slot: int) -> bool:
    return all(shape_expr.is_static(d) for d in plan.slots[slot].shape)


def live_intervals(plan: Plan, shapes: Sequence[Sequence[int] | None] | None = None
                   ) -> list[Interval]:
    """The live range of every static-shape temp slot of ``plan``, or, given the concrete
    ``shapes`` of the slots (those of one binding of the symbolic names), of every temp."""
    start: dict[int, int] = {}
    end: dict[int, int] = {}
    for k, call in enumerate(plan.calls):
        n_in = len(call.args) - call.num_outputs
        for s in call.args[:n_in]:
            end[s] = k
        for s in call.args[n_in:]:
            start.setdefault(s, k)
            end.setdefault(s, k)
    out = []
    for slot, spec in enumerate(plan.slots):
        if spec.kind != "temp" or slot not in start:
            continue
        if shapes is None and not is_static_slot(plan, slot):
            continue
        last = max(end[slot], start[slot])
        size = slot_nbytes(plan, slot, None if shapes is None else shapes[slot])
        out.append(Interval(slot, size, start[slot], last))
    return out


def plan_memory(plan: Plan, shapes: Sequence[Sequence[int] | None] | None = None
                ) -> tuple[dict[int, int], int]:
    """Workspace offsets of ``plan``'s static temps and the workspace size (its peak); given
    the concrete ``shapes`` of all slots, of all its temps."""
    return place(live_intervals(plan, shapes))


def memory_stats(plan: Plan) -> dict[str, Any]:
    """Peak workspace bytes vs. the bytes the static temps would take unshared."""
    ivs = live_intervals(plan)
    total = sum(_round_up(max(iv.size, 1)) for iv in ivs)
    return {"temps": len(ivs), "workspace_bytes": plan.workspace_bytes,
            "unshared_bytes": total}


def aligned_workspace(nbytes: int) -> np.ndarray:
    """A uint8 array of ``nbytes`` whose data address is a multiple of :data:`ALIGN`."""
    raw = np.empty(nbytes + ALIGN, dtype=np.uint8)
    shift = (-raw.__array_interface__["data"][0]) % ALIGN
    return raw[shift:shift + nbytes]


def aligned_empty(shape: Sequence[int], dtype: Any) -> np.ndarray:
    """``np.empty(shape, dtype)`` whose data address is a multiple of :data:`ALIGN`.

    numpy aligns its allocations to 16 bytes only, so half of the arrays it makes start in the
    middle of a 32-byte vector: every 256-bit load of a kernel that streams such a weight from
    L2 then straddles two cache lines (ResNet-18's 56x56x64 3x3 convolution took 1.09x the time
    with its packed weight 16 bytes off, paired calls, Zen 3)."""
    dt = np.dtype(dtype)
    return aligned_workspace(math.prod(shape) * dt.itemsize).view(dt).reshape(shape)


def aligned_copy(array: np.ndarray) -> np.ndarray:
    """``array`` as a C-contiguous array at an :data:`ALIGN`-byte address: itself when it
    already is one, else a copy (see :func:`aligned_empty`)."""
    if array.flags.c_contiguous and array.__array_interface__["data"][0] % ALIGN == 0:
        return array
    out = aligned_empty(array.shape, array.dtype)
    out[...] = array
    return out


def temp_view(workspace: np.ndarray, plan: Plan, slot: int) -> np.ndarray:
    """The numpy view of temp ``slot`` inside ``workspace``."""
    spec = plan.slots[slot]
    off = plan.workspace_offsets[slot]
    nbytes = slot_nbytes(plan, slot)
    return workspace[off:off + nbytes].view(spec.dtype.to_numpy()).reshape(spec.shape)
