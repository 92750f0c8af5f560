"""The NPU's per-op lowerings and what they emit into.

A lowering turns one graph op call into NPU kernels: ``fn(ctx, call, args, out)`` where
``args`` are the call's operands -- a :class:`~.emit.DramTensor` for a tensor computed at run
time, a numpy array for a constant (which the lowering may lay out for the hardware: weights
transposed, cast to the tensor unit's type) -- and ``out`` the DRAM tensor to write. A lowering
that cannot handle the call (an attribute, a dtype the units lack) raises :class:`NotSupported`
*before* emitting anything; the caller then runs the op on the CPU, or reports it
(``strict=True``).

Lowerings are registered per op name with :func:`register_lowering`. They are not TIR
schedules (``kiln.schedule.registry``'s ``fn(sch, target)``): the NPU's coarse instructions are
emitted per op from its attributes and the hardware description, like a vendor's kernel
library for a BYOC partition.

A second route goes through TIR (:func:`register_tir_lowering`; :mod:`.tir_gemm`,
:mod:`.tir_vector`, :mod:`.tir_rows`, :mod:`.tir_pool`): the op's PrimFunc scheduled with
``cache_read``/``cache_write`` into NPU scopes and ``tensorize``, then turned into
instructions by a program generator (:mod:`.tir_program`; the vector kernels' in
:mod:`.tir_vector`). A context's ``route`` (``"tir"``, the
default, or ``"emit"``; the build takes it from the PassContext option ``"npu.lowering"``)
picks it for the ops that have one; a TIR lowering hands what it does not cover back to the
emitter.
"""

from __future__ import annotations

import hashlib
from collections.abc import Callable, Iterable
from typing import Any

import numpy as np

from ...ir.errors import KilnError
from ...npu.program import Program
from ...target.npu.config import NPUConfig
from .emit import DRAM_ALIGN, ITEMSIZE, DramTensor, KernelBuilder, dram_itemsize

__all__ = ["DEFAULT_ROUTE", "DEPTHWISE_KEY", "DEPTHWISE_ROUTES", "LOWERING_KEY",
           "LOWERING_ROUTES", "LoweringContext", "LoweringFn", "PLAN_RESIDENCY_KEY",
           "NotSupported", "Unfusable", "lookup_lowering", "lowered_ops", "lowering_rejection",
           "register_lowering", "register_tir_lowering"]


class NotSupported(KilnError):
    """The NPU cannot run this op call (the message says why)."""


class Unfusable(NotSupported):
    """A product's fused epilogue (:mod:`.epilogue`) cannot run with it: the region emits the
    two apart. Not a reason to try the product's other tilings (:mod:`.feedback`): a smaller
    tile that leaves room for the epilogue's buffers cost more than the unfused kernels (a
    3x3 convolution with a residual add on 1 KiB of accumulators: 10216 estimated cycles
    against 2768 + 3670 apart)."""


LoweringFn = Callable[["LoweringContext", Any, list[Any], DramTensor], None]
_LOWERINGS: dict[str, LoweringFn] = {}
_TIR_LOWERINGS: dict[str, LoweringFn] = {}
#: PassContext option naming the route a build lowers with (registered, with its help text,
#: by :mod:`kiln.codegen.npu.compile`; the partitioning passes' probes read it too).
LOWERING_KEY = "npu.lowering"
#: PassContext option (bool, registered by :mod:`kiln.codegen.npu.compile`): the tiling
#: planner counts a convolution's input as on chip where residency will keep it in L1
#: (:attr:`LoweringContext.plan_residency`).
PLAN_RESIDENCY_KEY = "npu.plan_residency"
#: The default route: products (dense, matmul, pointwise conv2d), element-wise kernels (fused
#: chains and casts), softmax, layer_norm, row means, pooling and depthwise convolutions
#: through scheduled, tensorized TIR, everything else emitted per op -- the same bits and
#: cycles as emitting them all.
DEFAULT_ROUTE = "tir"
#: The lowering routes a context may take: instruction emission per op, or through TIR.
LOWERING_ROUTES = ("emit", "tir")
#: PassContext option (registered by :mod:`kiln.codegen.npu.compile`) choosing the unit of
#: depthwise convolutions (:func:`.ops.depthwise_route`): ``"auto"`` (per layer, the
#: cheapest by the cost model), ``"tensor"`` (the cheaper of the tensor unit's two forms),
#: ``"diagonal"`` (block-diagonal grouped products), ``"banded"`` (banded products over the
#: rows, :mod:`.banded`) or ``"vector"`` (the pooling kernel's taps) -- all but ``"auto"``
#: force it where it can run.
DEPTHWISE_KEY = "npu.depthwise"
#: The values :data:`DEPTHWISE_KEY` takes.
DEPTHWISE_ROUTES = ("auto", "tensor", "diagonal", "banded", "vector")


def register_lowering(op_names: str | Iterable[str]) -> Callable[[LoweringFn], LoweringFn]:
    """Decorator: ``fn`` lowers each op of ``op_names`` onto the NPU (one per op)."""
    names = [op_names] if isinstance(op_names, str) else list(op_names)

    def register(fn: LoweringFn) -> LoweringFn:
        for name in names:
            if name in _LOWERINGS:
                raise KilnError(f"operator {name!r} already has an NPU lowering")
            _LOWERINGS[name] = fn
        return fn

    return register


def register_tir_lowering(op_names: str | Iterable[str]
                          ) -> Callable[[LoweringFn], LoweringFn]:
    """Decorator: ``fn`` lowers each op of ``op_names`` through TIR when a context's route is
    ``"tir"`` (the op must have an emitted lowering too: the default route, and the fallback
    for what the TIR lowering does not cover)."""
    names = [op_names] if isinstance(op_names, str) else list(op_names)

    def register(fn: LoweringFn) -> LoweringFn:
        for name in names:
            if name in _TIR_LOWERINGS:
                raise KilnError(f"operator {name!r} already has a TIR lowering for the NPU")
            _TIR_LOWERINGS[name] = fn
        return fn

    return register


def lookup_lowering(op_name: str) -> LoweringFn | None:
    """The lowering of ``op_name`` (None: the NPU cannot run it); where a TIR lowering exists
    too, the one the context's ``route`` names runs."""
    emit, tir = _LOWERINGS.get(op_name), _TIR_LOWERINGS.get(op_name)
    if emit is None or tir is None:
        return emit

    def routed(ctx: LoweringContext, call: Any, args: list[Any], out: DramTensor) -> None:
        (tir if ctx.route == "tir" else emit)(ctx, call, args, out)

    return routed


def lowered_ops() -> list[str]:
    """The ops the NPU can run (subject to their attributes and dtypes)."""
    return sorted(_LOWERINGS)


class LoweringContext:
    """DRAM layout (a bump allocator; bytes ``[0, DRAM_ALIGN)`` hold zeros, the source of
    all-padding DMAs), constants to preload, and the kernel builder of the current NPU region."""

    def __init__(self, config: NPUConfig, double_buffer: bool = True,
                 route: str = DEFAULT_ROUTE, depthwise: str = "auto"):
        if route not in LOWERING_ROUTES:
            raise KilnError(f"NPU lowering route {route!r}: expected one of {LOWERING_ROUTES}")
        if depthwise not in DEPTHWISE_ROUTES:
            raise KilnError(f"NPU depthwise route {depthwise!r}: expected one of "
                            f"{DEPTHWISE_ROUTES}")
        self.config = config
        self.double_buffer = double_buffer
        self.route = route
        #: Where depthwise convolutions run (:data:`DEPTHWISE_KEY`).
        self.depthwise = depthwise
        self.kb = KernelBuilder(config, double_buffer)
        self.top = DRAM_ALIGN
        self.constants: list[tuple[DramTensor, np.ndarray]] = []
        #: Every DRAM range handed out, in order (what a DRAM plan may relocate).
        self.allocations: list[DramTensor] = []
        self.zero = DramTensor(0, (DRAM_ALIGN // 8,), "int64")
        #: Whether the planner may count on on-chip residency (:data:`PLAN_RESIDENCY_KEY`):
        #: a convolution whose input is an intermediate that fits L1 plans its staging from
        #: L1 (:func:`~.ops.onchip_input`). Off in the probes of the partitioning passes.
        self.plan_residency = False
        #: DRAM addresses of the tensors that stay in DRAM whatever residency decides: the
        #: program's inputs and the constants (:meth:`constant`, :meth:`pin`).
        self.pinned: set[int] = set()
        #: ``(op, schedule)`` of each kernel the TIR route lowered (what ``kiln show --stage
        #: tir`` prints for the NPU).
        self.tir: list[tuple[str, Any]] = []
        self._kernel_count = 0
        #: the cycles and bank-conflict cycles of one kernel's program, replayed timing-only
        #: after its bank placement (set by ``build_npu`` where the description has bank
        #: groups; :func:`.feedback.choose_acc_slots` ranks a product's output slot counts
        #: by it); None: no such choice (the partitioning passes' probes)
        self.replay: Callable[[Program], tuple[float, float]] | None = None
        #: where a fused epilogue keeps its operand and cast buffers (``"npu.epilogue_home"``,
        #: :data:`.epilogue.HOMES`, or ``"auto"``: chosen per product by replay)
        self.epilogue_home = "acc"
        #: :attr:`replay`'s kind for the choice of a fused epilogue's home (set by
        #: ``build_npu`` where ``"npu.epilogue_home"`` is ``"auto"`` and the description has
        #: bank groups; :func:`.feedback.choose_epilogue_home`)
        self.home_replay: Callable[[Program], tuple[float, float]] | None = None
        #: while not None, :meth:`constant` uploads equal arrays once (content -> index in
        #: :attr:`constants`): the sub-batches of a region (:mod:`.sub_batch`) each lay
        #: out the same weights
        self.shared_constants: dict[tuple[Any, ...], int] | None = None

    def alloc(self, shape: tuple[int, ...], dtype: str) -> DramTensor:
        t = DramTensor(self.top, tuple(int(s) for s in shape), dtype)
        isz = dram_itemsize(dtype)
        if not isz:
            raise NotSupported(f"{dtype} tensors have no fixed width: the NPU's DRAM cannot "
                               "hold them")
        nbytes = int(np.prod(t.shape, dtype=np.int64)) * isz
        self.top += max(DRAM_ALIGN, -(-nbytes // DRAM_ALIGN) * DRAM_ALIGN)
        self.allocations.append(t)
        return t

    def is_constant(self, t: Any) -> bool:
        """Whether ``t`` (a DRAM tensor or a view of one) is one of :attr:`constants`."""
        addr = getattr(getattr(t, "tensor", t), "addr", None)
        return any(c.addr == addr for c, _ in self.constants)

    def constant(self, value: np.ndarray, dtype: str | None = None) -> DramTensor:
        arr = np.ascontiguousarray(value, dtype=dtype or str(value.dtype))
        key = None
        if self.shared_constants is not None:
            key = (arr.shape, str(arr.dtype), hashlib.sha256(arr.tobytes()).digest())
            n = self.shared_constants.get(key)
            if n is not None and n < len(self.constants) and \
                    np.array_equal(self.constants[n][1], arr):  # not rolled back since
                return self.constants[n][0]
        t = self.alloc(arr.shape, str(arr.dtype))
        if key is not None:
            self.shared_constants[key] = len(self.constants)  # type: ignore[index]
        self.constants.append((t, arr))
        self.pinned.add(t.addr)
        return t

    def pin(self, t: DramTensor) -> DramTensor:
        """Mark ``t`` as a tensor that stays in DRAM (an input of the program): residency
        never moves it, so the planner does not count on it being on chip."""
        self.pinned.add(t.addr)
        return t

    def tensor(self, arg: Any) -> DramTensor:
        """An operand as a DRAM tensor (a constant is uploaded as it is)."""
        return arg if isinstance(arg, DramTensor) else self.constant(np.asarray(arg))

    def label(self, op: str) -> str:
        self._kernel_count += 1
        return f"{self._kernel_count:03d}:{op}"

    def checkpoint(self) -> tuple[Any, ...]:
        """What :meth:`rollback` needs to undo everything emitted and allocated after this
        point (a tiling the program generator refused half-way, see :mod:`.feedback`; a fused
        epilogue found impossible midway, :func:`.region.lower_region`)."""
        kb = self.kb
        ep = kb.epilogue
        return (kb, [len(st) for st in kb.streams], dict(kb.labels), len(kb.kernels),
                (kb.store_floor, kb.acc_top, kb.acc_tile, dict(kb.l0_slots)), self.top,
                len(self.constants),
                len(self.allocations), len(self.tir), self._kernel_count,
                (ep, ep.snapshot() if ep is not None else None), frozenset(self.pinned))

    def rollback(self, mark: tuple[Any, ...]) -> None:
        """Undo what was emitted and allocated since :meth:`checkpoint` returned ``mark``."""
        kb, lens, labels, nk, floor, top, nconst, nalloc, ntir, count, (ep, state), pinned = \
            mark
        if kb is not self.kb:
            raise KilnError("LoweringContext.rollback: a new region began since the checkpoint")
        for st, n in zip(kb.streams, lens):
            del st[n:]
        kb.labels = dict(labels)  # a copy: a mark may be rolled back to again
        del kb.kernels[nk:]
        kb.store_floor, kb.acc_top, kb.acc_tile, l0_slots = floor
        kb.l0_slots = dict(l0_slots)
        self.top = top
        del self.constants[nconst:]
        del self.allocations[nalloc:]
        del self.tir[ntir:]
        self._kernel_count = count
        self.pinned = set(pinned)
        if ep is not None and ep is kb.epilogue:
            ep.restore(state)

    def new_region(self) -> KernelBuilder:
        """Start the kernels of the next NPU region (after a CPU op); returns the old one."""
        old, self.kb = self.kb, KernelBuilder(self.config, self.double_buffer)
        return old


def lowering_rejection(config: NPUConfig, call: Any, args: list[Any],
                       out: tuple[tuple[int, ...], str], double_buffer: bool = True,
                       route: str = DEFAULT_ROUTE, depthwise: str = "auto") -> str | None:
    """Why the NPU cannot run op ``call`` (None: it can): its registered lowering is run into a
    scratch :class:`LoweringContext` -- the very check the build applies, not a second list of
    rules. ``args`` are the operands as a lowering gets them (a :class:`DramTensor` for a
    run-time tensor, whatever its address; a numpy array for a constant), ``out`` the result's
    static shape and dtype. What the probe emits is thrown away."""
    lower = lookup_lowering(call.op.name)
    if lower is None:
        return "no NPU lowering"
    for t in [out[1], *(str(getattr(a, "dtype", "")) for a in args
                        if isinstance(a, DramTensor))]:
        if t not in ITEMSIZE:  # DRAM holds no such tensor (float64)
            return f"{t} is no NPU dtype"
    ctx = LoweringContext(config, double_buffer, route, depthwise)

    def operand(a: Any) -> Any:
        if isinstance(a, list):  # a tuple of tensors (concat's)
            return [operand(x) for x in a]
        return ctx.alloc(a.shape, a.dtype) if isinstance(a, DramTensor) else a

    operands = [operand(a) for a in args]
    try:
        lower(ctx, call, operands, ctx.alloc(*out))
    except NotSupported as err:
        return str(err)
    return None
