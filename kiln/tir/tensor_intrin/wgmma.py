"""The shared-memory operands of sm_90's ``wgmma.mma_async``: matrix descriptors and the
element addresses they describe, one model for the CUDA generator and the OpenCL view.

A warpgroup (4 consecutive warps) multiplies a 64 x 16 tile of A by a 16 x N tile of B
(``wgmma.mma_async.m64nNk16``) with both operands in shared memory, each named by a 64-bit
*matrix descriptor* (PTX ISA, "Matrix Descriptor Format"): bits 0-13 the start address, 16-29
the leading dimension byte offset (LBO), 32-45 the stride dimension byte offset (SBO), each
encoded ``(x & 0x3FFFF) >> 4``; 62-63 the swizzle mode (0: none, the only one kiln uses).
Without swizzling an operand is made of *core matrices*: 8 rows of 16 bytes (8 float16 or
bfloat16), 128 contiguous bytes. The PTX ISA's canonical layouts ("Canonical Layouts", in
CuTe notation, ``T`` = 8 elements of 16 bits, offsets in elements):

- K-major (a row of A, or a column of B, contiguous along K): ``((8, m), (T, 2k)) :
  ((1T, SBO), (1, LBO))`` -- row ``r`` of the M (or N) extent, column ``c`` of K lie at
  ``(r % 8) * 8 + (r // 8) * SBO + c % 8 + (c // 8) * LBO``;
- MN-major (contiguous along M or N; ``imm-trans`` 1, float16/bfloat16 only): ``((T, 1, m),
  (8, k)) : ((1, T, SBO), (1T, LBO))`` -- element ``n`` of M/N, ``k`` of K at
  ``n % 8 + (n // 8) * SBO + (k % 8) * 8 + (k // 8) * LBO``.

So in both, LBO steps between core matrices along K and SBO along M/N.
:class:`SharedOperand` is one such operand: :meth:`SharedOperand.offset` computes those
addresses (numbers or numpy arrays: what the tests hold against the ISA's examples),
:meth:`SharedOperand.c_offset` writes the same arithmetic as C (what both dialects' code uses:
CUDA to find the descriptor's start from a thread's own element, OpenCL to read every element
the instruction would), :meth:`SharedOperand.descriptor` packs the 64 bits.

The GEMM schedule (``kiln.schedule.gpu.linalg``'s wgmma route) stores A's tile K-major in
panels of 8 columns (``[bk / 8][rows][8]``: SBO 128 bytes, LBO ``rows * 16``) and B's tile
MN-major in panels of 8 columns of N (``[cols / 8][bk][8]``: LBO 128 bytes, SBO ``bk * 16``):
:func:`a_operand`, :func:`b_operand`; a ``dense`` weight ``W[n, k]`` is B K-major, stored like A
(:func:`b_operand_k_major`).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

__all__ = ["CORE_ROWS", "ELEMENT_BYTES", "SharedOperand", "a_operand", "b_operand",
           "b_operand_k_major", "descriptor_encode"]

#: Rows of a core matrix, and its row's elements (16 bytes of 16-bit elements).
CORE_ROWS = 8
#: Bytes of one float16/bfloat16 element.
ELEMENT_BYTES = 2
_MAJORS = ("k", "mn")


def descriptor_encode(x: int) -> int:
    """The PTX ISA's ``matrix-descriptor-encode(x) = (x & 0x3FFFF) >> 4``."""
    return (x & 0x3FFFF) >> 4


@dataclass(frozen=True)
class SharedOperand:
    """One operand of ``wgmma`` in shared memory without swizzling: ``major`` ``"k"`` (A, or
    a K-major B) or ``"mn"`` (``imm-trans`` 1), ``lbo``/``sbo`` in bytes (multiples of 16
    below 2^18, as the descriptor's 14-bit fields hold them)."""

    major: str
    lbo: int
    sbo: int

    def __post_init__(self) -> None:
        if self.major not in _MAJORS:
            raise ValueError(f"wgmma operand: major {self.major!r} is not one of {_MAJORS}")
        for name, v in (("LBO", self.lbo), ("SBO", self.sbo)):
            if v <= 0 or v % 16 or v >= 1 << 18:
                raise ValueError(f"wgmma operand: {name} {v} bytes is not a positive multiple "
                                 "of 16 below 2^18 (the descriptor's 14-bit field)")

    @property
    def transposed(self) -> int:
        """The instruction's ``imm-trans`` for this operand."""
        return int(self.major == "mn")

    def offset(self, mn: Any, k: Any) -> Any:
        """The element offset (from the descriptor's start) of element ``mn`` of the M/N extent
        and ``k`` of K: ints or numpy integer arrays alike."""
        lbo, sbo = self.lbo // ELEMENT_BYTES, self.sbo // ELEMENT_BYTES
        if self.major == "k":
            return (mn % 8) * 8 + (mn // 8) * sbo + k % 8 + (k // 8) * lbo
        return mn % 8 + (mn // 8) * sbo + (k % 8) * 8 + (k // 8) * lbo

    def c_offset(self, mn: str, k: str) -> str:
        """:meth:`offset` as a C expression of the (non-negative, integer) C expressions
        ``mn`` and ``k``."""
        lbo, sbo = self.lbo // ELEMENT_BYTES, self.sbo // ELEMENT_BYTES
        if self.major == "k":
            return (f"((({mn}) & 7) * 8 + (({mn}) >> 3) * {sbo} + (({k}) & 7) + "
                    f"(({k}) >> 3) * {lbo})")
        return (f"((({mn}) & 7) + (({mn}) >> 3) * {sbo} + (({k}) & 7) * 8 + "
                f"(({k}) >> 3) * {lbo})")

    def descriptor_bits(self) -> int:
        """The descriptor without its start address: LBO, SBO, swizzle mode 0."""
        return (descriptor_encode(self.lbo) << 16) | (descriptor_encode(self.sbo) << 32)

    def descriptor(self, start: int) -> int:
        """The 64-bit descriptor of the operand starting at shared byte address ``start``
        (16-byte aligned)."""
        if start % 16:
            raise ValueError(f"wgmma operand: start address {start} is not 16-byte aligned")
        return self.descriptor_bits() | descriptor_encode(start)


def a_operand(rows: int, bk: int) -> SharedOperand:
    """A's tile of ``rows`` x ``bk`` stored ``[bk / 8][rows][8]`` (K-major): consecutive rows'
    core matrices 128 bytes apart (SBO), K's panels ``rows * 16`` bytes (LBO)."""
    if rows % 64 or bk % 16:
        raise ValueError(f"wgmma A tile {rows} x {bk}: rows a multiple of 64, K of 16")
    return SharedOperand("k", lbo=rows * 8 * ELEMENT_BYTES, sbo=CORE_ROWS * 8 * ELEMENT_BYTES)


def b_operand_k_major(cols: int, bk: int) -> SharedOperand:
    """B's tile given as ``cols`` rows of ``bk`` (a ``dense`` weight ``W[n, k]``) stored
    ``[bk / 8][cols][8]`` (K-major, ``imm-trans-b`` 0): as :func:`a_operand`, SBO 128 bytes,
    LBO ``cols * 16``."""
    if cols % 8 or bk % 16:
        raise ValueError(f"wgmma B tile {cols} x {bk}: columns a multiple of 8, K of 16")
    return SharedOperand("k", lbo=cols * 8 * ELEMENT_BYTES, sbo=CORE_ROWS * 8 * ELEMENT_BYTES)


def b_operand(bk: int, cols: int) -> SharedOperand:
    """B's tile of ``bk`` x ``cols`` stored ``[cols / 8][bk][8]`` (MN-major): K's core
    matrices 128 bytes apart (LBO), N's panels ``bk * 16`` bytes (SBO)."""
    if cols % 8 or bk % 16:
        raise ValueError(f"wgmma B tile {bk} x {cols}: columns a multiple of 8, K of 16")
    return SharedOperand("mn", lbo=CORE_ROWS * 8 * ELEMENT_BYTES, sbo=bk * 8 * ELEMENT_BYTES)
