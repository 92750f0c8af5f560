"""AnnotateMemoryScope: record on each tensor of an NPU region function the memories it lives
in -- DRAM, the shared L1 buffer, a core's L0 input/weight/accumulator buffers.

The region is lowered into a scratch context, exactly as the build will lower it
(:func:`kiln.schedule.npu.region.lower_region`), and the DMA traffic of the resulting program is
read back: a ``dma.load`` from a tensor's DRAM range into memory M (or from an on-chip block a
previous load filled from that tensor, e.g. conv rows staged in L1 then gathered into L0 input)
puts the tensor in M; a ``dma.store`` into its DRAM range from M says where it was computed. A
tensor of a fused element-wise chain that never reaches DRAM lives only in the block of the
chain's result; an intermediate the build keeps in L1 across kernels
(:mod:`kiln.schedule.npu.residency`, decided here on the region's program as the build decides
it) is ``"l0.acc -> l1 (kept on chip, never in DRAM) -> l0.input"``. The result is the function
attribute ``"npu.memory_scope"`` (variable name -> e.g. ``"dram -> l1, l0.input"``,
``"l0.acc -> dram"``, ``"l0.acc (fused, never in DRAM)"``),
which ``kiln show`` prints with the function. Constant weights (laid out for the hardware by
the lowering) are not graph variables and are not listed.
"""

from __future__ import annotations

import bisect
from typing import Any

import numpy as np

from ... import graph as g
from ...ir.module import IRModule
from ...npu.isa import Block
from ...schedule.npu.emit import DramTensor, itemsize
from ...schedule.npu.lowering import DEPTHWISE_KEY, LOWERING_KEY, LoweringContext
from ...schedule.npu.region import (
    FUSE_EPILOGUE_KEY,
    lower_region,
    region_outputs,
    static_tensor,
)
from ...schedule.npu.residency import RESIDENCY_KEY, ResidencyPlan, plan_residency
from ...target.npu import NPUConfig, load_config
from ...target.npu.config import DRAM, L0_NAMES, L1, MEMORY_NAMES
from ..pass_infra import PassContext, module_pass
from .common import MEMORY_SCOPE_ATTR, npu_functions

__all__ = ["AnnotateMemoryScope", "memory_scopes"]

_DRAM_ID = MEMORY_NAMES.index(DRAM)
_L1_ID = MEMORY_NAMES.index(L1)


def _mem_name(mem: int) -> str:
    name = MEMORY_NAMES[mem]
    return f"l0.{name}" if name in L0_NAMES else name


def _ordered(mems: set[str]) -> str:
    """Memory names from DRAM down to L0 (the hierarchy's order), comma separated."""
    order = [_mem_name(i) for i in range(len(MEMORY_NAMES))]
    return ", ".join(sorted(mems, key=order.index))


def _extent(shape: Any, blk: Block) -> int:
    """Bytes from a block's first element to just past its last."""
    span = sum((int(n) - 1) * abs(int(s)) for n, s in zip(shape, blk.strides))
    return (span + 1) * itemsize(blk.dtype)


class _Ranges:
    """Address ranges -> the variable names stored there (aliases share a range)."""

    def __init__(self) -> None:
        self.starts: list[int] = []
        self.items: list[tuple[int, int, list[str]]] = []

    def add(self, start: int, end: int, names: list[str]) -> None:
        i = bisect.bisect_left(self.starts, start)
        if i < len(self.starts) and self.starts[i] == start:
            self.items[i][2].extend(n for n in names if n not in self.items[i][2])
            return
        self.starts.insert(i, start)
        self.items.insert(i, (start, end, list(names)))

    def find(self, addr: int) -> list[str]:
        i = bisect.bisect_right(self.starts, addr) - 1
        if i >= 0 and addr < self.items[i][1]:
            return self.items[i][2]
        return []


def memory_scopes(config: NPUConfig, func: g.Function, double_buffer: bool = True
                  ) -> dict[str, str]:
    """Variable name -> the memories it lives in, for region function ``func``."""
    pc = PassContext.current()
    ctx = LoweringContext(config, double_buffer, pc.get_config(LOWERING_KEY),
                          pc.get_config(DEPTHWISE_KEY))
    env = {id(p): ctx.alloc(*static_tensor(p)) for p in func.params}
    res = lower_region(ctx, func, env,
                       fuse_epilogue=bool(PassContext.current().get_config(FUSE_EPILOGUE_KEY)))
    variables = [*func.params, *(b.var for blk in func.body.blocks for b in blk.bindings)]
    program = ctx.kb.program(ctx.top)
    resident = ResidencyPlan()
    if PassContext.current().get_config(RESIDENCY_KEY):  # as the build will place them
        pinned = [*env.values(), *region_outputs(func, res, ctx), *(t for t, _ in ctx.constants)]
        resident = plan_residency(config, [program], pinned, ctx.allocations)
    dram = _Ranges()
    l1 = _Ranges()  # the tensors kept in L1, at their L1 addresses
    for v in variables:
        t = res.env.get(id(v))
        if isinstance(t, DramTensor):
            nbytes = int(np.prod(t.shape, dtype=np.int64)) * itemsize(t.dtype)
            dram.add(t.addr, t.addr + max(nbytes, 1), [v.name_hint])
    for start, addr in resident.l1_addr.items():
        l1.add(addr, addr + resident.nbytes[start], dram.find(start))
    home = {n for _, _, names in l1.items for n in names}
    loaded: dict[str, set[str]] = {}
    stored: dict[str, set[str]] = {}
    on_chip: dict[int, list[tuple[int, int, list[str]]]] = {}  # loads into each memory
    for stream in program.streams:
        for ins in stream:
            if ins.op == "dma.load":
                src, dst = ins.args["src"], ins.args["dst"]
                if src.mem == _DRAM_ID:
                    names = dram.find(src.addr)
                elif src.mem == _L1_ID and l1.find(src.addr):
                    names = l1.find(src.addr)
                else:
                    names = next((n for lo, hi, n in reversed(on_chip.get(src.mem, []))
                                  if lo <= src.addr < hi), [])
                for n in names:
                    loaded.setdefault(n, set()).add(_mem_name(dst.mem))
                if names and dst.mem != _DRAM_ID:
                    on_chip.setdefault(dst.mem, []).append(
                        (dst.addr, dst.addr + _extent(ins.args["shape"], dst), names))
            elif ins.op == "dma.store":
                dst = ins.args["dst"]
                names = dram.find(dst.addr) if dst.mem == _DRAM_ID else \
                    l1.find(dst.addr) if dst.mem == _L1_ID else []
                for n in names:
                    stored.setdefault(n, set()).add(_mem_name(ins.args["src"].mem))
    scopes: dict[str, str] = {}
    for v in variables:
        n = v.name_hint
        if n in res.on_chip:
            home = _ordered(stored.get(res.on_chip[n], set())) or "on chip"
            scopes[n] = f"{home} (fused, never in DRAM)"
            continue
        if not isinstance(res.env.get(id(v)), DramTensor):
            continue
        src = _ordered(stored.get(n, set()))
        dst = _ordered(loaded.get(n, set()))
        where = "l1 (kept on chip, never in DRAM)" if n in home else "dram"
        scopes[n] = (f"{src} -> " if src else "") + where + (f" -> {dst}" if dst else "")
    return scopes


@module_pass(opt_level=0)
class AnnotateMemoryScope:
    """Record on each NPU region function which memories each of its tensors lives in.

    ``hw`` and ``double_buffer`` as for :class:`AnnotateTarget` (the tilings, hence the
    buffers used, depend on them). Sets the ``"npu.memory_scope"`` attribute of every function
    with ``"Codegen": "npu"``.
    """

    def __init__(self, hw: str | NPUConfig = "default", double_buffer: bool = True):
        self.config = hw if isinstance(hw, NPUConfig) else load_config(hw)
        self.double_buffer = double_buffer

    def transform_module(self, mod: IRModule, ctx: PassContext) -> IRModule:
        out = mod.copy()
        for name in npu_functions(mod):
            scopes = memory_scopes(self.config, mod[name], self.double_buffer)
            out[name] = mod[name].with_attr(MEMORY_SCOPE_ATTR, scopes)
        return out
