"""Scheduled TIR -> NPU instructions: the program generator of the TIR lowering route.

The input is a PrimFunc scheduled for the NPU (see :mod:`.tir_gemm`): buffers staged into
storage scopes named after the description's memories (``npu.l0.input``, ``npu.l0.weight``,
``npu.l0.acc``; :mod:`kiln.tir.tensor_intrin.npu`), the inner tile tensorized onto
``npu.mma``, and the reduction loop annotated ``"software_pipeline": nbuf``. The generator walks
it with every loop unrolled into the instruction stream (the NPU has no loop control on its
DMA/tensor units) and turns:

- a **copy nest** (loops around a block ``dst[...] = src[...]``, or ``select(cond, src[...],
  0)`` for a padded copy) from a DRAM buffer into a scope buffer into one strided
  ``dma.load``, from a scope buffer into a DRAM buffer into one ``dma.store``. The copy is
  pattern-matched as affine: the indices are evaluated at the nest's origin and one step along
  each loop, and checked at the far corner; a non-affine copy or one of more than three loops is
  refused. The padding condition (or the block predicate of a store) clips each loop to the
  prefix where it holds -- the valid part of a tail tile; the rest is the padding's zeros.
- a **tensorized block** (``npu.mma``) into ``mma`` (``mma.set`` when the block's ``init``
  runs, i.e. its reduction variables are at their first value) over the valid part of its
  operands' tiles. Restricting the product to it is exact: the padded ``K`` columns hold zeros
  (a product term of 0), the padded ``M`` rows and ``N`` columns are never stored (the store's
  predicate clips them; a store reaching outside what was computed is refused).
- **scratchpad allocation by scope**: every tile staged in a scope gets the next slot of that
  memory (``nbuf`` slots of the tile's full size; more than the memory holds is a
  :class:`~.lowering.NotSupported`), laid out row-major over its valid extents. A copy marked
  :data:`HELD_KEY` (a tile that stays on its core for the whole kernel) gets one slot per
  step of the pipelined loop instead, loaded once. A load of the block the slot already holds
  is dropped (consecutive output tiles of a core sharing an operand tile), as
  :func:`.gemm.emit_gemm` drops it.
- **stores** are split into pieces by :meth:`~.emit.KernelBuilder.store`, as the emitter's;
  a core's last output tile runs the product of its last step in pieces of rows
  (:func:`~.gemm.tail_pieces`), the store nest after the pipelined loop walked for each
  piece's rows as soon as it is computed, so the kernel ends with one piece's store.
- **double buffering**: each iteration of the ``software_pipeline`` loop is one step of the
  per-core :class:`~.emit.Pipeline` (DMA-in waits for a free slot, the tensor unit for the
  loads, DMA-out for the product), with output tiles -- iterations of the loops around the
  pipelined loop -- spread round-robin over the cores, as :func:`.gemm.emit_gemm` does.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

from ...ir.errors import KilnError
from ...npu.isa import UNIT_DMA_OUT, UNIT_TENSOR
from ...tir import expr as E
from ...tir.buffer import Buffer
from ...tir.function import PrimFunc
from ...tir.stmt import Block, BlockRealize, BufferStore, Evaluate, For, SeqStmt, Stmt
from ...tir.tensor_intrin import ADDRESS_OF
from ...tir.tensor_intrin.npu import NPU_MMA, SCOPE_ACC, SCOPE_INPUT, SCOPE_L1, SCOPE_WEIGHT
from .emit import DramTensor, DramView, KernelBuilder, Pipeline, block, itemsize
from .gemm import GemmShape, SlotCache, tail_pieces
from .lowering import NotSupported

__all__ = ["HELD_KEY", "OUT_SLOTS_KEY", "PIPELINE_KEY", "SCOPE_MEMORY", "STORE_FLOOR_KEY",
           "emit_scheduled", "evaluate"]

#: The loop annotation that asks for a software pipeline of ``value`` slots per buffer.
PIPELINE_KEY = "software_pipeline"
#: The block annotation of a copy into a scope buffer whose tiles stay on their core for the
#: whole kernel: one slot per step of the pipelined loop, each loaded once (no token guards
#: it; a different block loaded into it is refused).
HELD_KEY = "npu.held"
#: The pipelined loop's annotation of how many accumulator slots its output tiles rotate
#: through (:func:`~.gemm.acc_slots`; default ``nbuf``).
OUT_SLOTS_KEY = "npu.out_slots"
#: The pipelined loop's annotation of the smallest piece its stores are split into
#: (:func:`~.gemm.store_floor`; default none).
STORE_FLOOR_KEY = "npu.store_floor"
#: Storage scope -> the description's memory.
SCOPE_MEMORY = {SCOPE_INPUT: "input", SCOPE_WEIGHT: "weight", SCOPE_ACC: "acc", SCOPE_L1: "l1"}

_BINARY = {
    E.Add: lambda a, b: a + b, E.Sub: lambda a, b: a - b, E.Mul: lambda a, b: a * b,
    E.FloorDiv: lambda a, b: a // b, E.FloorMod: lambda a, b: a % b,
    E.Min: min, E.Max: max, E.LT: lambda a, b: a < b, E.LE: lambda a, b: a <= b,
    E.GT: lambda a, b: a > b, E.GE: lambda a, b: a >= b, E.EQ: lambda a, b: a == b,
    E.NE: lambda a, b: a != b, E.And: lambda a, b: a and b, E.Or: lambda a, b: a or b,
}


def evaluate(e: Any, env: dict[Any, int]) -> int:
    """The integer (or truth) value of index expression ``e`` with variables from ``env``."""
    if isinstance(e, (E.IntImm, E.FloatImm)):
        return e.value
    if isinstance(e, E.Var):
        if e not in env:
            raise KilnError(f"NPU program generator: variable {e.name!r} has no value here")
        return env[e]
    fn = _BINARY.get(type(e))
    if fn is not None:
        return fn(evaluate(e.a, env), evaluate(e.b, env))
    if isinstance(e, E.Not):
        return not evaluate(e.a, env)
    if isinstance(e, E.Cast):
        return int(evaluate(e.value, env))
    if isinstance(e, E.Select):
        c = evaluate(e.condition, env)
        return evaluate(e.true_value if c else e.false_value, env)
    raise KilnError(f"NPU program generator: cannot evaluate {type(e).__name__} {e}")


@dataclass
class _Tile:
    """Where a staged tile of a scope buffer lives: ``addr`` (bytes) in ``mem``; buffer index
    ``origin`` is its first element; per buffer dim, ``extent`` valid elements laid out with
    local stride ``strides`` (elements; row-major over the extents)."""

    mem: str
    addr: int
    origin: tuple[int, ...]
    extent: tuple[int, ...]

    @property
    def strides(self) -> tuple[int, ...]:
        return _row_major(list(self.extent))

    def local(self, index: tuple[int, ...], isz: int) -> int:
        """Byte address of buffer element ``index`` (which must lie in the tile)."""
        if not all(0 <= i - o < n for i, o, n in zip(index, self.origin, self.extent)):
            raise KilnError(f"NPU program generator: index {index} outside the staged tile at "
                            f"{self.origin} (extents {self.extent})")
        return self.addr + sum((i - o) * s for i, o, s in
                               zip(index, self.origin, self.strides)) * isz


def _nest(stmt: Stmt) -> tuple[list[For], BlockRealize | None]:
    loops = []
    while isinstance(stmt, For):
        loops.append(stmt)
        stmt = stmt.body
    return loops, stmt if isinstance(stmt, BlockRealize) else None


def _pipelined_tiles(stmt: Stmt) -> int | None:
    """How many times the walk will run a pipelined loop (None where a loop's extent is not a
    constant): a core's last output tile is known before it is walked."""
    if isinstance(stmt, SeqStmt):
        counts = [_pipelined_tiles(s) for s in stmt.seq]
        return None if None in counts else sum(c for c in counts if c is not None)
    if isinstance(stmt, For):
        if PIPELINE_KEY in stmt.annotations:
            return 1
        inner = _pipelined_tiles(stmt.body)
        if inner is None or not isinstance(stmt.extent, E.IntImm):
            return None if inner else 0
        return stmt.extent.value * inner
    if isinstance(stmt, BlockRealize) and not stmt.block.iter_vars:
        return _pipelined_tiles(stmt.block.body)
    return 0


def _row_major(extents: list[int]) -> tuple[int, ...]:
    out, acc = [], 1
    for n in reversed(extents):
        out.append(acc)
        acc *= n
    return tuple(reversed(out))


class _Generator:
    """The walk's state: loop values, the per-core pipelines, the tiles staged per buffer."""

    def __init__(self, kb: KernelBuilder, dram: dict[Buffer, DramTensor | DramView]):
        self.kb, self.cfg = kb, kb.config
        self.dram = dram
        self.env: dict[Any, int] = {}
        self.pipes = [Pipeline(kb, c, UNIT_TENSOR) for c in range(self.cfg.cores)]
        self.tiles = 0
        self.core = 0
        self.slot: int | None = None       # the pipeline step's load slot (None: not yet taken)
        self.loaded = False                # the step's loads are done (compute may start)
        self.in_pipeline = False
        self.staged: dict[Buffer, _Tile] = {}
        self.nbuf = kb.nbuf
        self.slot_bytes: dict[Buffer, int] = {}
        #: each core's slots of each scope buffer (the emitter's LRU rule, keyed by DRAM block)
        self.slots: dict[tuple[int, Buffer], SlotCache] = {}
        self.core_steps = [0] * self.cfg.cores  # pipeline steps each core has run
        self.shape: GemmShape | None = None  # the product (its tail pieces), where known
        self.floor = 0                     # the smallest store piece (bytes)
        self.steps = 0                     # extent of the pipelined loop now walked
        self.step = 0                      # the step of it now walked
        self.total_tiles = 0               # pipelined loop instances in the function (0: unknown)
        self.after: Stmt | None = None     # the statement after the one walked (its store)
        self.tail: Stmt | None = None      # this step's product runs in pieces: their store
        self.window: tuple[int, int] | None = None  # the rows of the tile the next store moves
        self.early = False                 # the store walked is an early piece's

    # -- walking -----------------------------------------------------------------------------
    def walk(self, stmt: Stmt) -> None:
        if isinstance(stmt, SeqStmt):
            for i, s in enumerate(stmt.seq):
                self.after = stmt.seq[i + 1] if i + 1 < len(stmt.seq) else None
                self.walk(s)
        elif isinstance(stmt, For):
            self.loop(stmt)
        elif isinstance(stmt, BlockRealize):
            b = stmt.block
            if not b.iter_vars:  # the root block
                self.walk(b.body)
            elif b.annotations.get("kiln.tensor_intrin"):
                self.compute(stmt)
            else:
                self.copy([], stmt)
        else:
            raise NotSupported(f"the NPU program generator cannot lower {type(stmt).__name__}")

    def loop(self, loop: For) -> None:
        lo, n = evaluate(loop.min, self.env), evaluate(loop.extent, self.env)
        if PIPELINE_KEY in loop.annotations:
            return self.pipeline(loop, lo, n, self.after)
        self.after = None
        loops, realize = _nest(loop)
        if realize is not None and not realize.block.annotations.get("kiln.tensor_intrin") \
                and self.is_copy(realize.block):
            return self.copy(loops, realize)
        for v in range(lo, lo + n):
            self.env[loop.loop_var] = v
            self.walk(loop.body)
        self.env.pop(loop.loop_var, None)

    def pipeline(self, loop: For, lo: int, n: int, store: Stmt | None) -> None:
        """One output tile: each iteration a pipeline step on this tile's core. ``store``:
        the statement after the loop (the tile's store). A core's last tile runs its last
        step's product in pieces of rows, each stored as soon as it is done (the emitter's
        tail, :func:`~.gemm.tail_pieces`): the walk of ``store`` is then limited to each
        piece's rows."""
        nbuf = int(loop.annotations[PIPELINE_KEY])
        if nbuf != self.nbuf:
            raise NotSupported(f"loop {loop.loop_var.name!r} asks for {nbuf} pipeline slots, the "
                               f"kernel builder has {self.nbuf}")
        tile = self.tiles
        self.core = tile % self.cfg.cores
        self.tiles += 1
        last = 0 < self.total_tiles <= tile + self.cfg.cores
        p = self.pipes[self.core]
        p.nout = int(loop.annotations.get(OUT_SLOTS_KEY, self.nbuf))
        self.floor = int(loop.annotations.get(STORE_FLOOR_KEY, 0))
        self.in_pipeline, self.steps = True, n
        for v in range(lo, lo + n):
            self.env[loop.loop_var] = v
            self.slot, self.loaded, self.step = None, False, v - lo
            self.tail = store if last and v == lo + n - 1 and self.is_store(store) else None
            self.walk(loop.body)
            if not self.loaded:
                raise NotSupported(f"pipeline step {v} of loop {loop.loop_var.name!r} computes "
                                   "nothing on the tensor unit")
            self.core_steps[self.core] += 1
        self.env.pop(loop.loop_var, None)
        p.produced()
        self.slot, self.in_pipeline, self.tail = None, False, None

    # -- copies -> DMA -----------------------------------------------------------------------
    @staticmethod
    def is_copy(b: Block) -> bool:
        if not isinstance(b.body, BufferStore) or b.init is not None:
            return False
        v = b.body.value
        if isinstance(v, E.Select):
            v = v.true_value
        return isinstance(v, E.BufferLoad)

    def is_store(self, stmt: Stmt | None) -> bool:
        """Whether ``stmt`` is a copy nest from a scope buffer into a DRAM buffer."""
        if stmt is None:
            return False
        _, realize = _nest(stmt)
        if realize is None or not self.is_copy(realize.block):
            return False
        store = realize.block.body
        value = store.value.true_value if isinstance(store.value, E.Select) else store.value
        return value.buffer.scope in SCOPE_MEMORY and store.buffer.scope == "global"

    def bind(self, loops: list[For], realize: BlockRealize, point: list[int]) -> None:
        for lp, x in zip(loops, point):
            self.env[lp.loop_var] = evaluate(lp.min, self.env) + x
        for iv, val in zip(realize.block.iter_vars, realize.iter_values):
            self.env[iv.var] = evaluate(val, self.env)

    def at(self, loops: list[For], realize: BlockRealize, point: list[int], *exprs: Any
           ) -> list[Any]:
        self.bind(loops, realize, point)
        return [evaluate(e, self.env) if not isinstance(e, tuple) else
                tuple(evaluate(i, self.env) for i in e) for e in exprs]

    def valid_extents(self, loops: list[For], realize: BlockRealize, cond: Any,
                      extents: list[int]) -> list[int]:
        """Per loop, the length of the prefix where ``cond`` holds (the others at 0)."""
        if isinstance(cond, E.IntImm) and cond.value:
            return list(extents)
        if not all(extents):
            return list(extents)
        first = self.at(loops, realize, [0] * len(extents), cond)[0]
        last = self.at(loops, realize, [n - 1 for n in extents], cond)[0]
        if first and last:
            return list(extents)  # a box holding at both corners holds everywhere: a full tile
        if last:
            raise NotSupported(f"block {realize.block.name_hint!r} pads before its data (only "
                               "a tail of padding is lowered)")
        out = []
        for d, n in enumerate(extents):
            def holds(x: int, d: int = d) -> bool:
                pt = [0] * len(extents)
                pt[d] = x
                return bool(self.at(loops, realize, pt, cond)[0])
            lo, hi = 0, n  # first x in [0, n] where cond fails (a prefix holds)
            while lo < hi:
                mid = (lo + hi) // 2
                if holds(mid):
                    lo = mid + 1
                else:
                    hi = mid
            out.append(lo)
        if all(out) and not self.at(loops, realize, [v - 1 for v in out], cond)[0]:
            raise NotSupported(f"block {realize.block.name_hint!r}: its padding condition is not "
                               "a box")
        return out

    def copy(self, loops: list[For], realize: BlockRealize) -> None:
        b = realize.block
        if not self.is_copy(b):
            raise NotSupported(f"block {b.name_hint!r} is neither a copy nor a tensorized tile "
                               "(the NPU program generator lowers nothing else)")
        if len(loops) > 3:
            raise NotSupported(f"copy {b.name_hint!r} has {len(loops)} loops; a DMA moves 3-D "
                               "blocks")
        store = b.body
        value, cond = store.value, realize.predicate
        if isinstance(value, E.Select):
            fill = value.false_value
            if not isinstance(fill, (E.IntImm, E.FloatImm)) or fill.value != 0:
                raise NotSupported(f"copy {b.name_hint!r} pads with {fill}, not zero")
            cond, value = E.logical_and(cond, value.condition), value.true_value
        extents = [evaluate(lp.extent, self.env) for lp in loops]
        dst_idx, src_idx = tuple(store.indices), tuple(value.indices)
        zero = [0] * len(loops)
        base_d, base_s = self.at(loops, realize, zero, dst_idx, src_idx)
        coef_d, coef_s = [], []
        for d in range(len(loops)):
            pt = zero.copy()
            pt[d] = 1
            dd, ss = self.at(loops, realize, pt, dst_idx, src_idx)
            coef_d.append(tuple(x - y for x, y in zip(dd, base_d)))
            coef_s.append(tuple(x - y for x, y in zip(ss, base_s)))
        far = [n - 1 for n in extents]
        dd, ss = self.at(loops, realize, far, dst_idx, src_idx)
        for got, base, coef in ((dd, base_d, coef_d), (ss, base_s, coef_s)):
            want = tuple(x + sum(c[i] * f for c, f in zip(coef, far)) for i, x in enumerate(base))
            if got != want:
                raise NotSupported(f"copy {b.name_hint!r} is not affine in its loops")
        valid = self.valid_extents(loops, realize, cond, extents)
        for lp in loops:
            self.env.pop(lp.loop_var, None)
        if self.window is not None and store.buffer.scope == "global":
            base_s, base_d = self.clip_rows(b.name_hint, base_s, base_d, coef_s, coef_d, valid)
        if not all(valid):
            return
        if base_d == base_s:
            self.unit_dims(len(base_d), coef_d, coef_s, extents, valid)
        dst, src = store.buffer, value.buffer
        if src.scope == "global" and dst.scope in SCOPE_MEMORY:
            self.load(b.name_hint, dst, src, base_d, base_s, coef_d, coef_s, extents, valid,
                      bool(b.annotations.get(HELD_KEY)))
        elif src.scope in SCOPE_MEMORY and dst.scope == "global":
            self.store(b.name_hint, dst, src, base_d, base_s, coef_s, coef_d, valid)
        else:
            raise NotSupported(f"copy {b.name_hint!r} from scope {src.scope!r} to "
                               f"{dst.scope!r}: the NPU moves data between DRAM and a scratchpad")

    def clip_rows(self, name: str, base_s: tuple[int, ...], base_d: tuple[int, ...],
                  coef_s: list[tuple[int, ...]], coef_d: list[tuple[int, ...]],
                  valid: list[int]) -> tuple[tuple[int, ...], tuple[int, ...]]:
        """Limit a store to rows ``self.window`` of its tile (a piece of the tail): the loop
        walking the source tile's rows starts at the window and ends with it."""
        r0, r1 = self.window  # type: ignore[misc]
        self.window = None
        row = len(base_s) - 2
        d = next((d for d, c in enumerate(coef_s) if c[row] == 1 and sum(map(abs, c)) == 1),
                 None)
        if d is None:
            raise NotSupported(f"store {name!r} has no loop over its tile's rows to store a "
                               "piece of them")
        valid[d] = max(0, min(valid[d], r1) - r0)
        return (tuple(x + r0 * c for x, c in zip(base_s, coef_s[d])),
                tuple(x + r0 * c for x, c in zip(base_d, coef_d[d])))

    @staticmethod
    def unit_dims(nd: int, coef_d: list[tuple[int, ...]], coef_s: list[tuple[int, ...]],
                  extents: list[int], valid: list[int]) -> None:
        """Give back the DMA the matrix dims (the last two) of a copy that indexes both
        buffers alike (a cache copy) whose unit loops ``compute_at`` dropped: extent 1, the
        buffers' own strides -- the block the emitter writes for a one-row tile."""
        for dim in range(max(0, nd - 2), nd):
            covered = [c.index(1) for c in coef_d if 1 in c]
            if dim in covered or len(extents) >= 3:
                continue
            unit = tuple(int(i == dim) for i in range(nd))
            pos = sum(1 for c in covered if c < dim)
            coef_d.insert(pos, unit)
            coef_s.insert(pos, unit)
            extents.insert(pos, 1)
            valid.insert(pos, 1)

    def dram_block(self, buf: Buffer, index: tuple[int, ...], coef: list[tuple[int, ...]]
                   ) -> tuple[Any, tuple[int, ...]]:
        t = self.dram.get(buf)
        if t is None:
            raise KilnError(f"NPU program generator: buffer {buf.name!r} has no DRAM tensor")
        offset = sum(i * s for i, s in zip(index, t.strides))
        strides = tuple(sum(c * s for c, s in zip(cf, t.strides)) for cf in coef)
        return t, (offset, strides)

    def load(self, name: str, dst: Buffer, src: Buffer, base_d: tuple[int, ...],
             base_s: tuple[int, ...], coef_d: list[tuple[int, ...]],
             coef_s: list[tuple[int, ...]], extents: list[int], valid: list[int],
             held: bool = False) -> None:
        dims = []
        for cf in coef_d:
            if sorted(cf) != [0] * (len(cf) - 1) + [1]:
                raise NotSupported(f"copy {name!r} does not fill its scope buffer densely")
            dims.append(cf.index(1))
        if self.slot is None:
            self.slot = self.pipes[self.core].load_slot()  # the step's turn (tokens)
        if held and not self.in_pipeline:
            raise NotSupported(f"copy {name!r} is held across the steps of no pipelined loop")
        slots = self.steps if held else self.nbuf
        mem = SCOPE_MEMORY[dst.scope]
        isz = itemsize(str(dst.dtype))
        nbytes = math.prod(extents) * isz
        if self.slot_bytes.setdefault(dst, nbytes) != nbytes:
            raise NotSupported(f"copy {name!r}: tiles of {dst.name!r} change size")
        if slots * nbytes > self.cfg.memory(mem).size:
            raise NotSupported(f"{slots} slots of {nbytes} B for {dst.name!r} exceed "
                               f"{mem} ({self.cfg.memory(mem).size} B)")
        extent = [1] * len(base_d)
        for dim, n in zip(dims, valid):
            extent[dim] = n
        t, (offset, s_strides) = self.dram_block(src, base_s, coef_s)
        # the emitter's slot rule (gemm.SlotCache): a tile one of the core's slots holds is
        # read from there, a new one goes to the least recently read slot; a held tile has
        # the slot of its K step, loaded once
        cache = self.slots.setdefault((self.core, dst), SlotCache(self.nbuf))
        what = (t, offset, s_strides, tuple(valid))
        if held and cache.held[self.step] not in (None, what):
            raise NotSupported(f"copy {name!r}: a held tile of {dst.name!r} changes (only a "
                               "tile that stays on its core can be held)")
        slot, new = cache.take(what, self.core_steps[self.core], self.step if held else None)
        tile = _Tile(mem, slot * nbytes, base_d, tuple(extent))
        strides = tuple(tile.strides[dim] for dim in dims)
        self.staged[dst] = tile
        if not new:
            return
        pad = (1,) * (3 - len(valid))
        self.kb.load(self.core, shape=pad + tuple(valid),
                     dst=block(mem, tile.addr, str(dst.dtype), strides),
                     src=t.at(offset, s_strides))

    def store(self, name: str, dst: Buffer, src: Buffer, base_d: tuple[int, ...],
              base_s: tuple[int, ...], coef_s: list[tuple[int, ...]],
              coef_d: list[tuple[int, ...]], valid: list[int]) -> None:
        tile = self.staged.get(src)
        if tile is None:
            raise NotSupported(f"copy {name!r} reads {src.name!r}, which holds nothing yet")
        isz = itemsize(str(src.dtype))
        addr = tile.local(base_s, isz)
        far = tuple(x + sum(c[i] * (v - 1) for c, v in zip(coef_s, valid))
                    for i, x in enumerate(base_s))
        tile.local(far, isz)  # the store's last element was computed
        l_strides = []
        for cf in coef_s:
            if sorted(cf) != [0] * (len(cf) - 1) + [1]:
                raise NotSupported(f"copy {name!r} does not read its scope buffer densely")
            l_strides.append(tile.strides[cf.index(1)])
        t, (offset, d_strides) = self.dram_block(dst, base_d, coef_d)
        p = self.pipes[self.core]
        if not self.early:  # an early piece of the tail waits on its own token instead
            p.store_begin()
        pad = (1,) * (3 - len(valid))
        # split as the emitter's stores are (KernelBuilder.store, the annotated floor)
        self.kb.store_floor = self.floor
        self.kb.store(self.core, pad + tuple(valid), dst=t.at(offset, d_strides),
                      src=block(tile.mem, addr, str(src.dtype), tuple(l_strides)))
        self.kb.store_floor = 0
        if not self.early:
            p.stored()

    # -- the tensorized tile -> mma ----------------------------------------------------------
    def compute(self, realize: BlockRealize) -> None:
        b = realize.block
        body = b.body
        if not (isinstance(body, Evaluate) and isinstance(body.value, E.Call)
                and body.value.op == NPU_MMA):
            raise NotSupported(f"block {b.name_hint!r} is tensorized onto "
                               f"{b.annotations.get('kiln.tensor_intrin')!r}, not {NPU_MMA}")
        if not self.in_pipeline or self.loaded:
            raise NotSupported(f"block {b.name_hint!r}: a tensorized tile must be the one "
                               f"product of a step of a {PIPELINE_KEY!r} loop")
        for iv, val in zip(b.iter_vars, realize.iter_values):
            self.env[iv.var] = evaluate(val, self.env)
        first = b.init is not None and all(
            self.env[iv.var] == evaluate(iv.dom.min, self.env)
            for iv in b.iter_vars if iv.iter_type == E.IterType.COMM_REDUCE)
        c_ref, a_ref, b_ref, *ext = body.value.args
        bound = [evaluate(x, self.env) for x in ext]
        loads = []
        for ref in (c_ref, a_ref, b_ref):
            if not (isinstance(ref, E.Call) and ref.op == ADDRESS_OF):
                raise NotSupported(f"block {b.name_hint!r}: an mma operand is not an address")
            ld = ref.args[0]
            loads.append((ld.buffer, tuple(evaluate(i, self.env) for i in ld.indices)))
        (cbuf, cidx), (abuf, aidx), (bbuf, bidx) = loads
        ta, tb = self.staged.get(abuf), self.staged.get(bbuf)
        if ta is None or tb is None:
            raise NotSupported(f"block {b.name_hint!r} multiplies tiles never loaded")
        nd = len(aidx)
        a_rows, a_cols = ta.extent[nd - 2:]
        b_rows, b_cols = tb.extent[nd - 2:]
        m, k, n = a_rows, a_cols, b_cols
        if b_rows != k or m > bound[0] or n > bound[1] or k > bound[2]:
            raise NotSupported(f"block {b.name_hint!r}: tiles {a_rows}x{a_cols} @ "
                               f"{b_rows}x{b_cols} do not make a product")
        isz = itemsize(str(abuf.dtype))
        a_addr, b_addr = ta.local(aidx, isz), tb.local(bidx, isz)
        p = self.pipes[self.core]
        p.loaded()
        p.compute_begin()
        self.loaded = True
        acc = str(cbuf.dtype)
        if first:
            c_bytes = bound[0] * bound[1] * itemsize(acc)
            cores = self.cfg.cores  # a core with fewer tiles than slots uses as many
            used = min(p.nout, -(-(self.total_tiles - self.core) // cores)) \
                if self.total_tiles else p.nout
            if used * c_bytes > self.cfg.memory("acc").size:
                raise NotSupported(f"{used} accumulator tiles of {c_bytes} B exceed acc")
            ndims = len(cidx)
            self.staged[cbuf] = _Tile("acc", p.out_slot() * c_bytes, cidx,
                                      (1,) * (ndims - 2) + (m, n))
        tc = self.staged.get(cbuf)
        if tc is None or tc.origin != cidx or tc.extent[-2:] != (m, n):
            raise NotSupported(f"block {b.name_hint!r} accumulates into a tile it never "
                               "initialized")
        pieces = [(0, m, 0, n)]
        if self.tail is not None and self.shape is not None:
            pieces = tail_pieces(self.cfg, self.shape, m, n)
            if any((c0, cols) != (0, n) for _, _, c0, cols in pieces):
                raise NotSupported(f"block {b.name_hint!r}: the tail is cut in columns, which "
                                   "the generator does not store")
        for i, (r0, rows, _, _) in enumerate(pieces):
            c_row, a_row = tc.strides[-2], ta.strides[-2]
            self.kb.emit(self.core, "mma.set" if first else "mma", shape=(1, rows, n, k),
                         c=block("acc", tc.addr + r0 * c_row * itemsize(acc), acc,
                                 (0, c_row, 1)),
                         a=block("input", a_addr + r0 * a_row * isz, str(abuf.dtype),
                                 (0, a_row, 1)),
                         b=block("weight", b_addr, str(bbuf.dtype), (tb.strides[-2], 1, 0)))
            if i < len(pieces) - 1:  # an early piece: its own token to DMA-out, its store
                self.kb.push(self.core, UNIT_TENSOR, UNIT_DMA_OUT)
                self.kb.pop(self.core, UNIT_TENSOR, UNIT_DMA_OUT)
                self.window, self.early = (r0, r0 + rows), True
                self.walk(self.tail)  # type: ignore[arg-type]
                self.early = False
        if len(pieces) > 1:  # the tile's own store (after the loop) moves the last piece
            self.window = (pieces[-1][0], m)
        p.computed()

    def finish(self) -> None:
        for p in self.pipes:
            p.finish()


def emit_scheduled(kb: KernelBuilder, func: PrimFunc,
                   dram: dict[str, DramTensor | DramView], shape: GemmShape | None = None
                   ) -> None:
    """Emit scheduled PrimFunc ``func`` into ``kb``'s streams (see the module docstring);
    ``dram`` maps each parameter buffer's name to the DRAM tensor (or strided view) it is;
    ``shape``: the product's, for the pieces of its tail (none without it).
    Raises :class:`~.lowering.NotSupported` for what the generator cannot lower."""
    by_buffer = {}
    for buf in func.buffer_map.values():
        if buf.name not in dram:
            raise KilnError(f"NPU program generator: no DRAM tensor for parameter {buf.name!r}")
        by_buffer[buf] = dram[buf.name]
    gen = _Generator(kb, by_buffer)
    gen.total_tiles = _pipelined_tiles(func.body) or 0
    gen.shape = shape
    gen.walk(func.body)
    gen.finish()
