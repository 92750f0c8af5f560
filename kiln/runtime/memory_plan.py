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
import os
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from ..ir.errors import MemoryLimitError
from ..ir.span import describe
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
    return math.prod(int(d) for d in dims) * np.dtype(spec.dtype.to_numpy()).itemsize


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
        if spec.kind != "temp" or slot not in start or spec.is_host_value:
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


#: Environment variable: the most memory (bytes; a K, M, G or T suffix multiplies by 1024 each)
#: one run of a plan may allocate for its intermediates and outputs. Default: the machine's
#: physical memory.
MEMORY_LIMIT_ENV = "KILN_MEMORY_LIMIT"


def memory_limit() -> int:
    """The memory limit in bytes (see :data:`MEMORY_LIMIT_ENV`)."""
    text = os.environ.get(MEMORY_LIMIT_ENV, "").strip()
    if text:
        scale = 1
        if text[-1].upper() in "KMGT":
            scale = 1024 ** ("KMGT".index(text[-1].upper()) + 1)
            text = text[:-1]
        try:
            return int(float(text) * scale)
        except ValueError:
            raise MemoryLimitError(f"{MEMORY_LIMIT_ENV}={os.environ[MEMORY_LIMIT_ENV]!r} is not "
                                   "a size (bytes, or a number with a K/M/G/T suffix)") from None
    try:
        return os.sysconf("SC_PHYS_PAGES") * os.sysconf("SC_PAGE_SIZE")
    except (ValueError, OSError):  # pragma: no cover - not POSIX
        return 1 << 40


def format_bytes(n: int) -> str:
    """``1.5 GiB``: a size for messages."""
    for unit in ("bytes", "KiB", "MiB", "GiB", "TiB", "PiB"):
        if n < 1024 or unit == "PiB":
            return f"{n} {unit}" if unit == "bytes" else f"{n:.1f} {unit}"
        n /= 1024
    return str(n)  # pragma: no cover


def run_bytes(plan: Plan, shapes: Sequence[Sequence[int]] | None = None,
              workspace: int | None = None) -> tuple[int, int | None]:
    """What one run of ``plan`` allocates, and its largest slot (None: no temps or outputs).

    Without ``shapes``: the static plan's workspace, the static temps outside it and the
    static outputs (slots of symbolic shape are left out). With the concrete ``shapes`` of all
    slots and the size of a ``workspace`` holding every temp (a binding's frame): that
    workspace and the outputs."""
    total = plan.workspace_bytes if workspace is None else workspace
    biggest, big = None, -1
    for slot, spec in enumerate(plan.slots):
        if spec.kind not in ("temp", "output") or spec.is_host_value:
            continue
        if shapes is None and not is_static_slot(plan, slot):
            continue
        size = slot_nbytes(plan, slot, None if shapes is None else shapes[slot])
        if size > big:
            biggest, big = slot, size
        in_workspace = workspace is not None or slot in plan.workspace_offsets
        if spec.kind == "output" or not in_workspace:
            total += size
    return total, biggest


def check_memory(nbytes: int, what: str) -> None:
    """MemoryLimitError when ``what`` needs more than :func:`memory_limit` (both sizes given)."""
    limit = memory_limit()
    if nbytes > limit:
        raise MemoryLimitError(f"{what} needs {format_bytes(nbytes)} ({nbytes} bytes), more "
                               f"than the memory limit of {format_bytes(limit)} (set "
                               f"{MEMORY_LIMIT_ENV} to change it)")


def check_run_memory(plan: Plan, shapes: Sequence[Sequence[int]] | None = None,
                     workspace: int | None = None) -> None:
    """MemoryLimitError when one run of ``plan`` (see :func:`run_bytes`) needs more than the
    memory limit, naming its largest tensor and the model nodes that make it."""
    need, slot = run_bytes(plan, shapes, workspace)
    what = f"one run of {plan.name}"
    if slot is not None:
        size = format_bytes(slot_nbytes(plan, slot, None if shapes is None else shapes[slot]))
        maker = next((c for c in plan.calls if slot in c.args[len(c.args) - c.num_outputs:]),
                     None)
        where = f", made by {describe(maker.span, maker.func)}" if maker is not None else ""
        what += f" (largest tensor {size}{where})"
    check_memory(need, what)


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
    if dt.kind == "O":  # string tensors (host functions only): references, not bytes
        return np.empty(shape, object)
    return aligned_workspace(math.prod(shape) * dt.itemsize).view(dt).reshape(shape)


def aligned_copy(array: np.ndarray) -> np.ndarray:
    """``array`` as a C-contiguous array at an :data:`ALIGN`-byte address: itself when it
    already is one, else a copy (see :func:`aligned_empty`). An object array (strings, host
    only) is returned as it is: its elements are references, never read by a kernel."""
    if array.dtype == object:
        return array
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
