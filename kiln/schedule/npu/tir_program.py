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
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from ...ir.errors import KilnError
from ...npu.isa import UNIT_DMA_OUT, UNIT_TENSOR
from ...tir import expr as E
from ...tir.buffer import Buffer
from ...tir.function import PrimFunc
from ...tir.functor import post_order_visit
from ...tir.stmt import Block, BlockRealize, BufferStore, Evaluate, For, SeqStmt, Stmt
from ...tir.tensor_intrin import ADDRESS_OF
from ...tir.tensor_intrin.npu import NPU_MMA, SCOPE_ACC, SCOPE_INPUT, SCOPE_L1, SCOPE_WEIGHT
from .emit import DramTensor, DramView, KernelBuilder, Pipeline, block, itemsize
from .gemm import (
    DEFER_STORES,
    STAGGER_FIRST_LOADS,
    GemmShape,
    GemmTiling,
    SlotCache,
    acc_strides,
    emit_gemm,
    gemm_cost,
    held_tiles,
    kernel_acc_slots,
    residual_weights_product,
    store_floor,
    tail_pieces,
    used_acc_slots,
)
from .lowering import LoweringContext, NotSupported
from .ops import ConvGeometry

__all__ = ["BALANCE_KEY", "HELD_KEY", "OUT_SLOTS_KEY", "PIPELINE_KEY", "SCOPE_MEMORY",
           "STAGE_KEY", "STORE_FLOOR_KEY", "compile_index", "affine_copy", "emit_scheduled",
           "emit_scheduled_conv", "evaluate", "prefix_length"]

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
#: The block annotation of a copy into ``npu.l1`` that stages what a pipeline step's gather
#: reads (a convolution's input rows): the generator stages, per step, the rows of the step's
#: output tile and channels of its K step (the emitter's :class:`~.gemm.GemmShape` staging).
STAGE_KEY = "npu.stage"
#: The pipelined loop's annotation of whether the output tiles left over after a round per
#: core are split into one piece per core (:attr:`~.gemm.GemmTiling.balance`).
BALANCE_KEY = "npu.balance"
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


Index = tuple[int, ...]


def affine_copy(at: Callable[[list[int]], tuple[Index, Index]], extents: list[int], name: str
                ) -> tuple[Index, Index, list[Index], list[Index]]:
    """The affine form of copy nest ``name`` of loop ``extents``: ``at(point)`` gives its
    destination and source indices at a point of the nest. They are evaluated at the origin
    and one step along each loop -- the bases and the per-loop steps returned -- and checked at
    the far corner (a copy that is not affine there is :class:`~.lowering.NotSupported`): what
    a strided DMA can move."""
    zero = [0] * len(extents)
    base_d, base_s = at(zero)
    coef_d, coef_s = [], []
    for d in range(len(extents)):
        pt = zero.copy()
        pt[d] = 1
        dd, ss = at(pt)
        coef_d.append(tuple(x - y for x, y in zip(dd, base_d)))
        coef_s.append(tuple(x - y for x, y in zip(ss, base_s)))
    far = [n - 1 for n in extents]
    dd, ss = at(far)
    for got, base, coef in ((dd, base_d, coef_d), (ss, base_s, coef_s)):
        want = tuple(x + sum(c[i] * f for c, f in zip(coef, far)) for i, x in enumerate(base))
        if got != want:
            raise NotSupported(f"copy {name!r} is not affine in its loops")
    return base_d, base_s, coef_d, coef_s


def prefix_length(holds: Callable[[int], bool], n: int) -> int:
    """The first ``x`` in ``[0, n]`` where ``holds(x)`` fails, ``holds`` true on a prefix of
    ``[0, n)`` (a padding condition along one axis of a copy's box): a bisection, since the
    generators evaluate such conditions for every DMA of a kernel."""
    lo, hi = 0, n
    while lo < hi:
        mid = (lo + hi) // 2
        if holds(mid):
            lo = mid + 1
        else:
            hi = mid
    return lo


_PY_BINARY = {
    E.Add: "+", E.Sub: "-", E.Mul: "*", E.FloorDiv: "//", E.FloorMod: "%", E.LT: "<",
    E.LE: "<=", E.GT: ">", E.GE: ">=", E.EQ: "==", E.NE: "!=", E.And: "and", E.Or: "or",
}


def _python(e: Any, names: dict[Any, str]) -> str:
    """Python source computing index expression ``e`` as :func:`evaluate` does (Python's
    ``//`` and ``%`` on ints are floor division and modulo, as ``FloorDiv``/``FloorMod``)."""
    if isinstance(e, (E.IntImm, E.FloatImm)):
        return repr(e.value)
    if isinstance(e, E.Var):
        if e not in names:
            raise KilnError(f"NPU program generator: variable {e.name!r} has no value here")
        return names[e]
    op = _PY_BINARY.get(type(e))
    if op is not None:
        return f"({_python(e.a, names)} {op} {_python(e.b, names)})"
    if isinstance(e, (E.Min, E.Max)):
        fn = "min" if isinstance(e, E.Min) else "max"
        return f"{fn}({_python(e.a, names)}, {_python(e.b, names)})"
    if isinstance(e, E.Not):
        return f"(not {_python(e.a, names)})"
    if isinstance(e, E.Cast):
        return f"int({_python(e.value, names)})"
    if isinstance(e, E.Select):
        return (f"({_python(e.true_value, names)} if {_python(e.condition, names)} else "
                f"{_python(e.false_value, names)})")
    raise KilnError(f"NPU program generator: cannot evaluate {type(e).__name__} {e}")


def compile_index(exprs: list[Any], params: list[Any]) -> Any:
    """A Python function of ``params`` (variables) returning the tuple of ``exprs``' values:
    :func:`evaluate` compiled once, for index maps evaluated at every DMA of a kernel (a
    convolution's copies: 20x fewer interpreter steps than walking the expressions)."""
    names = {v: f"v{i}" for i, v in enumerate(params)}
    body = ", ".join(_python(e, names) for e in exprs)
    return eval(f"lambda {', '.join(names.values())}: ({body},)",  # noqa: S307 - IR-made
                {"__builtins__": {}, "min": min, "max": max, "int": int})


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
        self.defer_store = False           # the next statement, a tile's store, waits
        #: per core, the walk of its last output tile's store, deferred (DEFER_STORES)
        self.pending: list[Callable[[], None] | None] = [None] * self.cfg.cores

    # -- walking -----------------------------------------------------------------------------
    def walk(self, stmt: Stmt) -> None:
        if isinstance(stmt, SeqStmt):
            for i, s in enumerate(stmt.seq):
                self.after = stmt.seq[i + 1] if i + 1 < len(stmt.seq) else None
                defer, self.defer_store = self.defer_store, False
                if defer and self.is_store(s):
                    self.pending[self.core] = self.deferred(s)
                    continue
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
        # an odd core's first step loads B first, as the emitter's (STAGGER_FIRST_LOADS)
        residual = self.shape is not None and residual_weights_product(self.kb, self.shape)
        stagger = STAGGER_FIRST_LOADS and residual and self.nbuf > 1 and \
            self.core % 2 == 1 and tile < self.cfg.cores
        for v in range(lo, lo + n):
            self.env[loop.loop_var] = v
            self.slot, self.loaded, self.step = None, False, v - lo
            self.tail = store if last and v == lo + n - 1 and self.is_store(store) else None
            self.walk(self.loads_swapped(loop.body) if stagger and v == lo else loop.body)
            if not self.loaded:
                raise NotSupported(f"pipeline step {v} of loop {loop.loop_var.name!r} computes "
                                   "nothing on the tensor unit")
            self.core_steps[self.core] += 1
        self.env.pop(loop.loop_var, None)
        p.produced()
        self.slot, self.in_pipeline, self.tail = None, False, None
        # the tile's store (the statement after the loop) goes behind the core's next step's
        # loads, as the emitter's (DEFER_STORES); a core's last tile's is not deferred
        self.defer_store = DEFER_STORES and residual and self.nbuf > 1 and not last

    def deferred(self, store: Stmt) -> Callable[[], None]:
        """The walk of ``store`` (an output tile's store nest) as it would run now -- the
        loop values, the core, the tile staged in each buffer -- to run later
        (:meth:`run_pending`)."""
        env, core, staged, floor = dict(self.env), self.core, dict(self.staged), self.floor

        def run() -> None:
            saved = self.env, self.core, self.staged, self.floor, self.window, self.after
            self.env, self.core, self.staged, self.floor = dict(env), core, staged, floor
            self.window = None
            try:
                self.walk(store)
            finally:
                self.env, self.core, self.staged, self.floor, self.window, self.after = saved
        return run

    def run_pending(self, core: int) -> None:
        """Walk ``core``'s deferred store, if any."""
        run, self.pending[core] = self.pending[core], None
        if run is not None:
            run()

    def loads_swapped(self, body: Stmt) -> Stmt:
        """A pipeline step's body with its first two loads (A's and B's copies into scope
        buffers, in that order) swapped; ``body`` itself where it does not start so."""
        if not isinstance(body, SeqStmt) or len(body.seq) < 3:
            return body
        first = [_nest(x)[1] for x in body.seq[:2]]
        if any(r is None or not self.is_copy(r.block) or
               r.block.body.buffer.scope not in (SCOPE_INPUT, SCOPE_WEIGHT) for r in first):
            return body
        return SeqStmt([body.seq[1], body.seq[0], *body.seq[2:]])

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
            out.append(prefix_length(holds, n))
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
        base_d, base_s, coef_d, coef_s = affine_copy(
            lambda pt: tuple(self.at(loops, realize, pt, dst_idx, src_idx)), extents,
            b.name_hint)
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
        if mem in ("input", "weight"):  # a fused epilogue's buffers may go above the slots
            if slots * nbytes > self.kb.l0_top.get(mem, 0):
                self.kb.l0_slots[mem] = (slots, nbytes)
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
        self.run_pending(self.core)  # the core's previous tile's store, behind these loads
        p.compute_begin()
        self.loaded = True
        acc = str(cbuf.dtype)
        if first:
            c_bytes = bound[0] * bound[1] * itemsize(acc)
            cores = self.cfg.cores
            used = used_acc_slots(p.nout, self.total_tiles, cores, self.core)
            if used * c_bytes > self.cfg.memory("acc").size:
                raise NotSupported(f"{used} accumulator tiles of {c_bytes} B exceed acc")
            ndims = len(cidx)
            # a fused epilogue's buffers go above the output slots the busiest core uses
            self.kb.acc_top = max(self.kb.acc_top,
                                  used_acc_slots(p.nout, self.total_tiles, cores) * c_bytes)
            self.kb.acc_tile = max(self.kb.acc_tile, c_bytes)
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
                self.kb.tile_done(self.core)
                self.kb.pop(self.core, UNIT_TENSOR, UNIT_DMA_OUT)
                self.window, self.early = (r0, r0 + rows), True
                self.walk(self.tail)  # type: ignore[arg-type]
                self.early = False
        if len(pieces) > 1:  # the tile's own store (after the loop) moves the last piece
            self.window = (pieces[-1][0], pieces[-1][0] + pieces[-1][1])
        p.computed()

    def finish(self) -> None:
        for core in range(self.cfg.cores):
            self.run_pending(core)
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


# ---------------------------------------------------------------------------------------------
# the implicit GEMM of a convolution: L1 staging, per-tap gathers
# ---------------------------------------------------------------------------------------------
@dataclass
class _Copy:
    """A copy block of a scheduled convolution: ``dst[ivs] = select(cond, src[index], 0)``
    with ``dst`` indexed by the block's iter vars in order (a cache copy)."""

    block: Block
    dst: Buffer
    src: Buffer
    index: tuple[Any, ...]
    cond: Any
    fn: Any = None  # the index and the condition at a point (compile_index)

    @staticmethod
    def of(b: Block) -> _Copy:
        store = b.body
        if not isinstance(store, BufferStore) or b.init is not None:
            raise NotSupported(f"block {b.name_hint!r} is not a copy")
        ivs = [iv.var for iv in b.iter_vars]
        if list(store.indices) != ivs:
            raise NotSupported(f"copy {b.name_hint!r} does not write its buffer by its own "
                               "iterators (only a cache copy is generated)")
        value, cond = store.value, E.const("bool", 1)
        if isinstance(value, E.Select):
            fill = value.false_value
            if not isinstance(fill, (E.IntImm, E.FloatImm)) or fill.value != 0:
                raise NotSupported(f"copy {b.name_hint!r} pads with {fill}, not zero")
            value, cond = value.true_value, value.condition
        if not isinstance(value, E.BufferLoad):
            raise NotSupported(f"block {b.name_hint!r} is not a copy")
        index = tuple(value.indices)
        return _Copy(b, store.buffer, value.buffer, index, cond,
                     compile_index([*index, cond], ivs))

    def at(self, point: tuple[int, ...]) -> tuple[tuple[int, ...], bool]:
        """The source index and the padding condition at destination element ``point``."""
        *index, ok = self.fn(*point)
        return tuple(index), bool(ok)

    def steps(self, point: tuple[int, ...], moves: list[tuple[int, ...]]
              ) -> tuple[tuple[int, ...], list[tuple[int, ...]]]:
        """The source index at ``point`` and its change along each of ``moves`` (affine
        there: the far corner is checked by the caller's extents, see :meth:`affine`)."""
        base, _ = self.at(point)
        coefs = []
        for mv in moves:
            got, _ = self.at(tuple(p + d for p, d in zip(point, mv)))
            coefs.append(tuple(g - b for g, b in zip(got, base)))
        return base, coefs

    def affine(self, point: tuple[int, ...], moves: list[tuple[int, ...]], extents: list[int]
               ) -> tuple[tuple[int, ...], list[tuple[int, ...]]]:
        """:meth:`steps`, checked at the far corner of the box ``extents`` along ``moves``
        (a copy not affine over the box is refused) and for its padding condition there."""
        base, coefs = self.steps(point, moves)
        far = tuple(p + sum(mv[d] * (n - 1) for mv, n in zip(moves, extents))
                    for d, p in enumerate(point))
        got, _ = self.at(far)
        want = tuple(x + sum(c[d] * (n - 1) for c, n in zip(coefs, extents))
                     for d, x in enumerate(base))
        if got != want:
            raise NotSupported(f"copy {self.block.name_hint!r} is not affine over a DMA's box")
        return base, coefs


def _conv_blocks(func: PrimFunc) -> tuple[dict[str, _Copy], Block, For]:
    """The copies of a scheduled convolution by role (``stage``: global -> ``npu.l1``,
    marked :data:`STAGE_KEY`; ``gather``: ``npu.l1`` -> ``npu.l0.input``; ``weight``: global
    -> ``npu.l0.weight``; ``store``: ``npu.l0.acc`` -> global), its tensorized block and its
    pipelined loop."""
    found: list[Any] = []

    def visit(node: Any) -> None:
        if isinstance(node, (Block, For)):
            found.append(node)

    post_order_visit(func.body, visit, exprs=False)
    copies: dict[str, _Copy] = {}
    mma = [n for n in found if isinstance(n, Block) and n.annotations.get("kiln.tensor_intrin")]
    loops = [n for n in found if isinstance(n, For) and PIPELINE_KEY in n.annotations]
    for b in found:
        if not isinstance(b, Block) or not b.iter_vars or b in mma:
            continue
        cp = _Copy.of(b)
        role = {(SCOPE_L1, "global"): "stage", (SCOPE_INPUT, SCOPE_L1): "gather",
                (SCOPE_WEIGHT, "global"): "weight", ("global", SCOPE_ACC): "store"}.get(
                    (cp.dst.scope, cp.src.scope))
        if role is None or role in copies:
            raise NotSupported(f"copy {b.name_hint!r} from {cp.src.scope!r} to "
                               f"{cp.dst.scope!r} has no place in a convolution's pipeline")
        if role == "stage" and not b.annotations.get(STAGE_KEY):
            raise NotSupported(f"copy {b.name_hint!r} into {SCOPE_L1!r} is not marked "
                               f"{STAGE_KEY!r} (staged per pipeline step)")
        copies[role] = cp
    missing = {"stage", "gather", "weight", "store"} - set(copies)
    if missing or len(mma) != 1 or len(loops) != 1:
        raise NotSupported("a scheduled convolution needs one staging, gather, weight and store "
                           f"copy, one tensorized tile and one pipelined loop (missing: "
                           f"{sorted(missing)}, {len(mma)} tiles, {len(loops)} loops)")
    return copies, mma[0], loops[0]


def emit_scheduled_conv(ctx: LoweringContext, func: PrimFunc,
                        dram: dict[str, DramTensor | DramView], geo: ConvGeometry
                        ) -> GemmTiling:
    """Emit scheduled convolution ``func`` (:mod:`.tir_conv`) into ``ctx.kb``; returns the
    tiling it read from the schedule. ``dram`` maps the parameters (``X``, ``W``, ``Y``) to
    DRAM; ``geo``: the implicit GEMM both routes build (its units, its staging rules).

    The schedule gives the tiling (the tensorized tile's extents, the pipelined loop's
    slots, accumulator slots, store floor and the split of leftover tiles) and every DMA's
    addressing: each copy's source index is evaluated at a box's origin and one step along
    each of its axes (checked at the far corner) -- the staging box of a step's rows and
    channels (its padding condition clipped to the valid box: the DMA's padding), the gather
    box of each tap (a nest of rows, pixels, taps and channels is one DMA per tap; a tile of
    fewer rows than the kernel is wide one per row and kernel row), the weight tile, the
    store of each piece. The order of the program is :func:`~.gemm.emit_gemm`'s (staging
    before the slot wait, the staging a step ahead where :func:`~.gemm.prefetch_staging`
    says so, the weights before the gathers, the last tile in pieces, leftover tiles split
    over the cores), so the bits and the cycles are the emitter's."""
    kb, cfg, shape = ctx.kb, ctx.config, geo.shape
    copies, mma, loop = _conv_blocks(func)
    call = mma.body.value if isinstance(mma.body, Evaluate) else None
    if not (isinstance(call, E.Call) and call.op == NPU_MMA):
        raise NotSupported(f"block {mma.name_hint!r} is not tensorized onto {NPU_MMA}")
    mt, nt, kt = (int(evaluate(x, {})) for x in call.args[3:6])
    if mt % shape.m_unit or kt % shape.k_unit:
        raise NotSupported(f"the tile M{mt} x K{kt} is not whole output rows of {shape.m_unit} "
                           f"pixels and channels of {shape.k_unit} taps")
    nbuf = int(loop.annotations[PIPELINE_KEY])
    if nbuf != kb.nbuf:
        raise NotSupported(f"loop {loop.loop_var.name!r} asks for {nbuf} pipeline slots, the "
                           f"kernel builder has {kb.nbuf}")
    mu, ku = mt // shape.m_unit, kt // shape.k_unit
    balance = bool(loop.annotations.get(BALANCE_KEY, False))
    tiling = GemmTiling(mu, nt, ku, gemm_cost(cfg, shape, mu, nt, ku, nbuf, balance=balance),
                        balance)
    rules = {OUT_SLOTS_KEY: kernel_acc_slots(kb, shape, tiling),
             STORE_FLOOR_KEY: store_floor(cfg, shape, tiling, nbuf)}
    for key, want in rules.items():
        got = int(loop.annotations.get(key, 0))
        if got and got != want:
            raise NotSupported(f"loop {loop.loop_var.name!r}: {key} = {got}; the pipeline "
                               f"of this tiling has {want}")
    held = held_tiles(cfg, shape, tiling, nbuf)
    for role, keep in zip(("gather", "weight"), held):
        if bool(copies[role].block.annotations.get(HELD_KEY)) != keep:
            raise NotSupported(f"copy {copies[role].block.name_hint!r}: {HELD_KEY} does not "
                               "match the tiles that stay on their core")
    t = _ConvTransfers(ctx, geo, tiling, copies, dram)
    emit_gemm(kb, shape, tiling, t.load_a, t.load_b, t.store_c, t.stage_a)
    return tiling


class _ConvTransfers:
    """The DMAs of a scheduled convolution (see :func:`emit_scheduled_conv`), in
    :func:`~.gemm.emit_gemm`'s callback form. Box coordinates are the destination buffers'
    (the scheduled copies' iterators); local layouts are the generator's: an L1 staging slot
    per core and pipeline slot of ``stage_rows x width`` pixels of ``stage_pixel`` elements
    (bank-padded channel runs), L0 tiles row-major over their valid extents, the
    accumulator tile as :func:`~.gemm.acc_strides` lays it out. A box's steps are derived
    (and checked at its far corner) once per kind of box; each DMA then evaluates its
    origin."""

    def __init__(self, ctx: LoweringContext, geo: ConvGeometry, tiling: GemmTiling,
                 copies: dict[str, _Copy], dram: dict[str, DramTensor | DramView]):
        self.kb, self.geo, self.shape = ctx.kb, geo, geo.shape
        self.copies = copies
        self.dram: dict[str, DramTensor | DramView] = {}
        for role in ("stage", "weight", "store"):
            cp = copies[role]
            buf = cp.src if role != "store" else cp.dst
            if buf.name not in dram:
                raise KilnError(f"NPU program generator: no DRAM tensor for parameter "
                                f"{buf.name!r}")
            self.dram[role] = dram[buf.name]
        self.dt = self.shape.dtype
        self.isz = itemsize(self.dt)
        self.slot_bytes = self.shape.stage_bytes(tiling.m_units, tiling.k_units)
        self.px = self.shape.stage_pixel(tiling.k_units)
        self.row_px = geo.width * self.px
        self.c_row, self.c_col = acc_strides(ctx.config, self.shape, tiling, tiling.n)
        self.ku = tiling.k_units
        self.kt = tiling.k_units * self.shape.k_unit
        self.memo: dict[tuple[Any, ...], list[tuple[int, ...]]] = {}
        self.rows, self.pixels = self.image_box()

    def image_box(self) -> tuple[tuple[int, int], tuple[int, int]]:
        """The staged rows and pixels where the staging copy's padding condition holds (the
        image; a box, checked): ``[first, last)`` of each."""
        cp = self.copies["stage"]
        hq, width = (int(evaluate(x, {})) for x in cp.dst.shape[1:3])
        inside = next(((q, p) for q in range(hq) for p in range(width)
                       if cp.at((0, q, p, 0))[1]), None)
        if inside is None:
            raise NotSupported(f"copy {cp.block.name_hint!r} stages padding only")
        q0, p0 = inside
        rows = [q for q in range(hq) if cp.at((0, q, p0, 0))[1]]
        pixels = [p for p in range(width) if cp.at((0, q0, p, 0))[1]]
        box = ((rows[0], rows[-1] + 1), (pixels[0], pixels[-1] + 1))
        if len(rows) != box[0][1] - box[0][0] or len(pixels) != box[1][1] - box[1][0] or \
                not cp.at((0, rows[-1], pixels[-1], 0))[1] or \
                (box[0][0] and cp.at((0, box[0][0] - 1, p0, 0))[1]):
            raise NotSupported(f"copy {cp.block.name_hint!r}: its padding is not a box")
        return box

    def steps(self, role: str, key: tuple[Any, ...], point: tuple[int, ...],
              moves: list[tuple[int, ...]], extents: list[int]
              ) -> tuple[tuple[int, ...], list[tuple[int, ...]]]:
        """Copy ``role``'s source index at ``point`` and its steps along ``moves`` (derived
        and checked over ``extents`` the first time a box of kind ``key`` is moved)."""
        cp = self.copies[role]
        coefs = self.memo.get((role, *key))
        if coefs is None:
            _, coefs = cp.affine(point, moves, extents)
            self.memo[(role, *key)] = coefs
        return cp.at(point)[0], coefs

    def dram_at(self, role: str, index: tuple[int, ...], coefs: list[tuple[int, ...]]
                ) -> tuple[Any, int, tuple[int, ...]]:
        t = self.dram[role]
        offset = sum(i * s for i, s in zip(index, t.strides))
        return t, offset, tuple(sum(c * s for c, s in zip(cf, t.strides)) for cf in coefs)

    def l1(self, delta: tuple[int, ...]) -> int:
        """Elements a step of ``X_l1`` index ``delta`` (image, row, pixel, channel) moves in
        a staging slot."""
        return delta[1] * self.row_px + delta[2] * self.px + delta[3]

    def slot_addr(self, core: int, slot: int) -> int:
        return (core * self.kb.nbuf + slot) * self.slot_bytes

    # -- the staging copy: the tile's rows and channels, with their padding ------------------
    def stage_a(self, core: int, b: int, r0: int, rs: int, c0: int, cs: int, slot: int
                ) -> None:
        kb, dt = self.kb, self.dt
        nbox, width = self.shape.stage_rows(rs), self.geo.width
        q0 = r0 * self.shape.stage_stride
        first = min(nbox, max(0, self.rows[0] - q0))
        last = max(first, min(nbox, self.rows[1] - q0))
        left, right = self.pixels
        dst = block("l1", self.slot_addr(core, slot), dt, (1, self.row_px, self.px))
        if kb.stage_begin(core, dst, (cs, nbox, width), last == first):
            return
        # the box (channels, rows, pixels): the DMA's dims in the order of the source's
        # strides (channel planes, rows, contiguous runs of a row's pixels)
        index, coefs = self.steps(
            "stage", (cs, last - first), (b, q0 + first, left, c0),
            [(0, 0, 0, 1), (0, 1, 0, 0), (0, 0, 1, 0)], [cs, last - first, right - left])
        t, offset, strides = self.dram_at("stage", index, coefs)
        kb.load(core, shape=(cs, last - first, right - left), dst=dst,
                src=t.at(offset, strides), pad_lo=(0, first, left),
                pad_hi=(0, nbox - last, width - right), fill=0)

    # -- the gather: per tap, every row's windows from the staged rows -----------------------
    def load_a(self, core: int, b: int, r0: int, rs: int, c0: int, cs: int, addr: int,
               slot: int) -> None:
        kb, dt, isz, geo = self.kb, self.dt, self.isz, self.geo
        ow, taps, kw, kh = geo.ow, self.shape.k_unit, geo.kw, geo.kh
        kts = cs * taps
        origin = (b, r0 * self.shape.stage_stride, 0, c0)  # the staging slot's first element
        base = self.slot_addr(core, slot)
        i0, k0 = r0 * ow, (c0 // self.ku) * self.kt

        nbox = self.shape.stage_rows(rs)

        def src(index: tuple[int, ...], coefs: list[tuple[int, ...]], extents: list[int]
                ) -> Any:
            """The L1 block of a gather box from ``index`` along ``coefs``: both corners
            inside what the step staged (its image, rows, pixels and channels)."""
            far = tuple(x + sum(c[d] * (n - 1) for c, n in zip(coefs, extents))
                        for d, x in enumerate(index))
            for corner in (index, far):
                if corner[0] != b or not (0 <= corner[1] - origin[1] < nbox and
                                          0 <= corner[2] < geo.width and
                                          0 <= corner[3] - c0 < cs):
                    raise NotSupported(f"copy {self.copies['gather'].block.name_hint!r} "
                                       "reads outside the step's staged rows")
            at = self.l1(tuple(x - o for x, o in zip(index, origin)))
            return block("l1", base + at * isz, dt, tuple(self.l1(c) for c in coefs))

        if rs < kw:  # per row and kernel row: the row's pixels, the kernel row's taps
            for r in range(rs):
                for a in range(kh):
                    index, coefs = self.steps(
                        "gather", ("row", cs, a), (b, i0 + r * ow, k0 + a * kw * cs),
                        [(0, 1, 0), (0, 0, cs), (0, 0, 1)], [ow, kw, cs])
                    kb.load(core, shape=(ow, kw, cs),
                            dst=block("input", addr + (r * ow * kts + a * kw * cs) * isz, dt,
                                      (kts, cs, 1)), src=src(index, coefs, [ow, kw, cs]))
            return
        for t in range(taps):  # per tap: every row's pixels
            index, coefs = self.steps(
                "gather", ("tap", cs, rs, t), (b, i0, k0 + t * cs),
                [(0, ow, 0), (0, 1, 0), (0, 0, 1)], [rs, ow, cs])
            kb.load(core, shape=(rs, ow, cs),
                    dst=block("input", addr + t * cs * isz, dt, (ow * kts, kts, 1)),
                    src=src(index, coefs, [rs, ow, cs]))

    # -- the weights: every tap's block of channels ------------------------------------------
    def load_b(self, core: int, b: int, c0: int, cs: int, n0: int, ns: int, addr: int) -> None:
        taps = self.shape.k_unit
        k0 = (c0 // self.ku) * self.kt
        index, coefs = self.steps("weight", (cs, ns), (k0, n0), [(cs, 0), (1, 0), (0, 1)],
                                  [taps, cs, ns])
        t, offset, strides = self.dram_at("weight", index, coefs)
        self.kb.load(core, shape=(taps, cs, ns),
                     dst=block("weight", addr, self.dt, (cs * ns, ns, 1)),
                     src=t.at(offset, strides))

    # -- the store: the tile's channels, each a run of its rows' pixels ----------------------
    def store_c(self, core: int, b: int, r0: int, rs: int, n0: int, ns: int, addr: int) -> None:
        cp = self.copies["store"]
        point = (b, n0, r0 * self.geo.ow)  # Y[b, o, i] from C_acc[b, i, o]
        moves = [(0, 1, 0), (0, 0, 1)]
        _, coefs = self.steps("store", (ns, rs), point, moves, [ns, rs * self.geo.ow])
        if [c[1:] for c in coefs] != [(0, 1), (1, 0)]:
            raise NotSupported(f"copy {cp.block.name_hint!r} does not store the accumulator "
                               "tile's columns as channels")
        t, offset, strides = self.dram_at("store", point, moves)
        self.kb.store(core, shape=(1, ns, rs * self.geo.ow), dst=t.at(offset, (0, *strides)),
                      src=block("acc", addr, str(cp.src.dtype), (0, self.c_col, self.c_row)))
