"""What an element-wise nest is, as instruction selection needs it, and where a model's work ran.

:func:`analyse_elementwise` turns the kernel ``out = steps(inputs)`` -- the result and its
operands as DRAM tensors or strided views (a broadcast operand read with stride 0), the vector
instructions of its op chain -- into a :class:`NestInfo`: the result's dims (size-1 dims
dropped, nothing merged yet: merging is one of the choices :mod:`.isel` makes), per buffer its
element strides over those dims and its alignment (its first element's byte address modulo the
L0 memories' bank width and the DRAM burst), the opcodes and dtypes. :mod:`.isel` enumerates
the instruction forms of it.

:func:`unit_shares` reads a built executable back: how many multiply-accumulates ran on the
tensor unit, on the vector unit (depthwise convolutions, by design) and on the CPU, how many
other element operations on the vector unit (or, a copy, by the DMA engines alone), on the
scalar unit and on the CPU, and every
scalar-unit fallback with its reason -- the numbers issue 23's goal is stated in (>= 99% of
the MACs on the tensor unit, >= 95% of the other element operations on the vector unit).
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from ...ir.errors import KilnError
from ...npu.isa import OPCODES, UNIT_SCALAR, UNIT_TENSOR, UNIT_VECTOR
from ...target.npu.config import DRAM
from .emit import DramTensor, DramView, itemsize

__all__ = ["BufferAccess", "NestInfo", "UnitShares", "analyse_elementwise", "broadcast_strides",
           "scalar_kernel_elements", "unit_shares", "COPY_TILING", "SCALAR_TILING"]


@dataclass(frozen=True)
class BufferAccess:
    """One buffer of a nest: ``strides`` its element strides over the nest's dims (0: the
    operand is broadcast along that dim), ``bank_offset`` / ``burst_offset`` its first
    element's byte address modulo the L0 bank width / the DRAM burst (0: aligned)."""

    dtype: str
    strides: tuple[int, ...]
    bank_offset: int
    burst_offset: int

    @property
    def itemsize(self) -> int:
        return itemsize(self.dtype)


@dataclass(frozen=True)
class NestInfo:
    """An element-wise nest: ``dims`` the result's dims of extent > 1 (outermost first; ``(1,)``
    for a single element), the result and each operand as a :class:`BufferAccess` over them,
    the vector ``opcodes`` it runs per block (a chain's steps, the final ``vcast`` when it
    computes in ``compute_dtype`` other than the result's dtype)."""

    dims: tuple[int, ...]
    out: BufferAccess
    inputs: tuple[BufferAccess, ...]
    opcodes: tuple[str, ...]
    compute_dtype: str

    @property
    def elements(self) -> int:
        return int(np.prod(self.dims, dtype=np.int64))

    def mergeable(self, i: int) -> bool:
        """Dims ``i`` and ``i + 1`` merge into one (a reshape every buffer allows): each
        buffer's stride of dim ``i`` is its stride of ``i + 1`` times that dim's extent."""
        n = self.dims[i + 1]
        return all(b.strides[i] == b.strides[i + 1] * n for b in (self.out, *self.inputs))


def broadcast_strides(t: DramTensor | DramView, rank: int) -> tuple[int, ...]:
    """The element strides of operand ``t`` over a result of ``rank`` dims (numpy
    broadcasting: missing leading dims and dims of extent 1 read with stride 0)."""
    shape = (1,) * (rank - len(t.shape)) + tuple(t.shape)
    st = (0,) * (rank - len(t.shape)) + tuple(t.strides)
    return tuple(0 if n == 1 else s for n, s in zip(shape, st))


def _address(t: DramTensor | DramView) -> int:
    if isinstance(t, DramView):
        return t.tensor.addr + t.offset * itemsize(t.tensor.dtype)
    return t.addr


def analyse_elementwise(cfg: Any, out: DramTensor | DramView,
                        inputs: list[DramTensor | DramView], compute_dtype: str,
                        opcodes: tuple[str, ...] = ()) -> NestInfo:
    """The :class:`NestInfo` of ``out = f(inputs)`` computed in ``compute_dtype`` by the
    vector instructions ``opcodes``. Raises KilnError naming an operand of more dims than
    the result (numpy broadcasting cannot produce it)."""
    rank = len(out.shape)
    for k, t in enumerate(inputs):
        if len(t.shape) > rank:
            raise KilnError(f"element-wise nest: operand {k} has {len(t.shape)} dims, more than "
                            f"the result's {rank}")
    strides = [tuple(out.strides)] + [broadcast_strides(t, rank) for t in inputs]
    keep = [i for i, n in enumerate(out.shape) if n != 1]
    dims = tuple(out.shape[i] for i in keep) or (1,)
    bank = min(cfg.memory(m).bank_width for m in ("input", "weight", "acc"))
    burst = cfg.memory(DRAM).burst

    def access(t: DramTensor | DramView, st: tuple[int, ...]) -> BufferAccess:
        kept = tuple(st[i] for i in keep) or (0,)
        addr = _address(t)
        return BufferAccess(t.dtype, kept, addr % bank, addr % burst)

    if compute_dtype != out.dtype:
        opcodes = (*opcodes, "vcast")
    return NestInfo(dims, access(out, strides[0]),
                    tuple(access(t, s) for t, s in zip(inputs, strides[1:])),
                    tuple(opcodes), compute_dtype)


# ---- where a model's work ran ------------------------------------------------------------------

#: How the scalar unit's element-wise kernels describe themselves (``scalar.py`` writes it,
#: :func:`scalar_kernel_elements` reads it back): ``scalar unit (<reason>): <n> elements, ...``.
SCALAR_TILING = "scalar unit ({reason}): {n} elements"
_SCALAR_RE = re.compile(r"^scalar unit \((?P<reason>.*)\): (?P<n>\d+) elements")
_SCALAR_ANY = re.compile(r"^scalar unit \((?P<reason>.*?)\)")
#: How a copy kernel's tiling begins (``movement.py`` writes it): a kernel of DMAs only, whose
#: stores' elements :func:`unit_shares` counts as ``dma_ops``.
COPY_TILING = "DMA copy"

#: Ops whose CPU fallback performs products (their MACs count against the tensor unit).
_PRODUCT_OPS = ("nn.dense", "dense", "matmul", "nn.matmul", "nn.batch_matmul", "nn.conv2d",
                "nn.conv2d.depthwise")
#: Ops whose NPU kernels may run MACs on the vector unit (``vmul``/``vmac``).
_VECTOR_MAC_OPS = ("nn.conv2d", "nn.conv2d.depthwise")


def scalar_kernel_elements(tiling: str) -> tuple[str, int] | None:
    """``(reason, elements)`` of a scalar-unit element-wise kernel's tiling text; ``(reason,
    0)`` for a scalar kernel that moves data only (``take``); None for other kernels."""
    m = _SCALAR_RE.match(tiling)
    if m:
        return m.group("reason"), int(m.group("n"))
    m = _SCALAR_ANY.match(tiling)
    return (m.group("reason"), 0) if m else None


@dataclass
class UnitShares:
    """Where a model's arithmetic ran (see the module docstring). MACs: ``tensor_macs`` (the
    ``mma`` instructions' M x K x N, or a kernel's recorded useful MACs, ``KernelInfo.macs``:
    a depthwise convolution on the tensor unit counts its own, not the zeros of its
    block-diagonal weights), ``vector_macs`` (``vmul``/``vmac`` of a convolution's
    kernel on the vector unit: the depthwise ones), ``cpu_macs`` (a product left on the CPU).
    Element operations (one per element an instruction writes): ``vector_ops`` (every other
    vector instruction), ``dma_ops`` (a copy kernel's stores: transpose, slices, concat move
    their elements by DMA alone, no unit computes), ``scalar_ops`` (one per element of a
    scalar-unit loop), ``cpu_ops``
    (each CPU op's result elements). ``fallbacks``: ``(kernel label, reason)`` of every
    scalar-unit kernel; ``cpu``: the ops left on the CPU."""

    tensor_macs: int = 0
    vector_macs: int = 0
    cpu_macs: int = 0
    vector_ops: int = 0
    dma_ops: int = 0
    scalar_ops: int = 0
    cpu_ops: int = 0
    fallbacks: list[tuple[str, str]] = field(default_factory=list)
    cpu: list[str] = field(default_factory=list)

    @property
    def tensor_mac_share(self) -> float:
        """MACs on the tensor unit over all MACs (1.0 for a model without products)."""
        total = self.tensor_macs + self.vector_macs + self.cpu_macs
        return self.tensor_macs / total if total else 1.0

    @property
    def vector_op_share(self) -> float:
        """Other element operations on the vector unit -- or copies the DMA engines move
        alone, which before they did around a ``vmov`` -- over all of them (1.0 when none):
        what is not a scalar-unit or CPU fallback."""
        total = self.vector_ops + self.dma_ops + self.scalar_ops + self.cpu_ops
        return (self.vector_ops + self.dma_ops) / total if total else 1.0

    def summary(self) -> str:
        reasons: dict[str, int] = {}
        for _, r in self.fallbacks:
            reasons[r] = reasons.get(r, 0) + 1
        why = "; ".join(f"{n} x {r}" for r, n in reasons.items())
        return (f"MACs on tensor unit: {100 * self.tensor_mac_share:.2f}% "
                f"(vector {self.vector_macs:,}, CPU {self.cpu_macs:,} of "
                f"{self.tensor_macs + self.vector_macs + self.cpu_macs:,}); element ops on "
                f"vector unit: {100 * self.vector_op_share:.2f}% (scalar {self.scalar_ops:,}, "
                f"CPU {self.cpu_ops:,} of "
                f"{self.vector_ops + self.dma_ops + self.scalar_ops + self.cpu_ops:,}; "
                f"copies by DMA {self.dma_ops:,}); scalar fallbacks: "
                f"{len(self.fallbacks)}" + (f" ({why})" if why else ""))


def _cpu_macs(op: str, inputs: list[Any], out: DramTensor) -> int:
    n_out = int(np.prod(out.shape, dtype=np.int64))
    if op not in _PRODUCT_OPS or len(inputs) < 2:
        return 0
    w = inputs[1][0].shape
    if op == "nn.conv2d":
        return n_out * int(np.prod(w[1:], dtype=np.int64))
    a = inputs[0][0].shape
    return n_out * int(a[-1])


def unit_shares(exe: Any) -> UnitShares:
    """The :class:`UnitShares` of a built NPU executable (``kiln.build(..., target="npu")``),
    from its programs (every instruction's extents, each attributed to its kernel by the
    barrier that closes it) and its CPU steps. Static: a scalar loop counts its elements
    from its kernel's record, not by running it."""
    shares = UnitShares()
    for step in exe.steps:
        program = getattr(step, "program", None)
        if program is None:
            n_out = int(np.prod(step.out.shape, dtype=np.int64))
            macs = _cpu_macs(step.op, step.inputs, step.out)
            shares.cpu_macs += macs
            if not macs:
                shares.cpu_ops += n_out
            shares.cpu.append(step.op)
            continue
        kernels = step.kernels
        for info in kernels:
            sc = scalar_kernel_elements(info.tiling)
            if sc is not None:
                shares.fallbacks.append((info.label, sc[0]))
                shares.scalar_ops += sc[1]
        # a kernel that records its useful MACs (a depthwise convolution's block-diagonal
        # products): those, not its mma instructions' extents
        shares.tensor_macs += sum(info.macs for info in kernels)
        for stream in program.streams:
            k = 0  # the kernel: the barriers close them in order
            for ins in stream:
                if ins.op == "barrier":
                    k += 1
                    continue
                unit = OPCODES[ins.op].unit
                if unit == UNIT_TENSOR:
                    if not (k < len(kernels) and kernels[k].macs):
                        shares.tensor_macs += int(np.prod(ins.args["shape"], dtype=np.int64))
                elif unit == UNIT_VECTOR:
                    n = int(np.prod(ins.args["shape"], dtype=np.int64))
                    op = kernels[k].op if k < len(kernels) else ""
                    # only a convolution's kernel multiplies on the vector unit (a depthwise
                    # one's taps); a dense or matmul kernel's vmul is its fused epilogue's
                    # element op (Q @ K^T's scale: ops.divide_multiplier)
                    if op in _VECTOR_MAC_OPS and ins.op in ("vmul", "vmac"):
                        shares.vector_macs += n
                    else:
                        shares.vector_ops += n
                elif unit == UNIT_SCALAR:
                    pass  # counted per element from the kernel's record above
                elif ins.op == "dma.store" and k < len(kernels) and \
                        kernels[k].tiling.startswith(COPY_TILING):
                    shares.dma_ops += int(np.prod(ins.args["shape"], dtype=np.int64))
    return shares
