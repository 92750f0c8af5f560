"""Instruction selection for element-wise nests: every form, the description's limits, a cost.

An element-wise kernel (:func:`~.vector.emit_elementwise` and its TIR twin) runs as blocks of
1-3-D vector instructions between DMAs. Which blocks is a choice with several axes, each
enumerated here for a :class:`~.nest_analysis.NestInfo`:

- **the reshape**: the result's dims merged wherever every buffer's strides allow (a
  contiguous run of dims is one axis: the fixed plan's only choice), or all but the innermost
  mergeable pair (the tensor's own rows), or the fully merged innermost axis split into rows
  of ``f`` elements (``f`` a divisor that is a whole number of DRAM bursts: long rows of a
  one-dimensional nest become a 2-D block, fewer and larger instructions);
- **the block's rank and axis assignment**: the instruction's three dims take the last three
  dims of the reshaped nest (outer ones are block loops); the block spans every dim inside
  axis ``a`` whole, a part of axis ``a`` and one index of the dims outside it -- rank 1
  (``a`` = 2), 2 or 3;
- **the block extent** along ``a``: every halving of it (the fixed plan's candidates) and every
  balanced split ``ceil(d / k)`` (equal blocks, no short tail; a count of blocks that the
  cores share evenly).

Each form is checked against the hardware description's limits -- ``encoding.max_extent``
(an extent field), ``encoding.max_stride`` (every DMA's and L0 block's strides), ``nbuf``
slots of each operand block in L0 input/weight and of the result (and its compute block) in
the accumulators, the result never broadcast (stride 0), the compute dtype one the vector unit
has -- and the survivors are ranked by :func:`form_cost`, written from the description only:

- per block, the vector unit's instructions: ``ceil(elements x widest itemsize / width)`` times
  the opcode's ``[vector.cost]`` class, plus ``vector.latency`` for the fence before the next;
- per transfer, ``dma.latency`` cycles of issue; its DRAM cycles are whole bursts per
  contiguous run (a short row wastes the rest of its burst) at the chip's bandwidth, plus one
  burst per run that does not start on a burst boundary (the alignment penalty);
- the kernel's time: a DMA queue's token push waits for its transfers to land, so a core's
  next loads issue only once this block's have arrived -- per block, the loads' issue, the
  DRAM latency and a round of the shared channel (every active core's loads and stores), or
  the block's vector work if longer; the kernel is the first block's load, ``ceil(blocks /
  cores) - 1`` such steps and the last block's compute and store (one slot, ``nbuf = 1``:
  each step load, compute and store in a row), at least the chip's total DRAM cycles.

The cheapest form wins, but the fixed plan's form (fully merged, halved) is kept unless
another is estimated at least ``MARGIN`` cheaper: the model is an estimate, and a marginal
"win" is within its error. ``KILN_NPU_ISEL=0`` in the environment turns the search off (the
fixed plan, for measuring the search against it).
"""

from __future__ import annotations

import math
import os
from dataclasses import dataclass
from typing import Any

from ...npu.isa import OPCODES
from ...target.npu.config import DRAM
from .emit import itemsize
from .lowering import NotSupported
from .nest_analysis import NestInfo

__all__ = ["FORM_CANDIDATES", "Form", "MARGIN", "Selection", "check_form", "enumerate_forms",
           "fixed_form", "form_cost", "isel_enabled", "select_form", "select_forms"]

#: How much cheaper (as a fraction of its estimate) a form must be to replace the fixed plan's.
MARGIN = 0.03
#: Balanced splits ``ceil(d / k)`` tried per axis: ``k`` up to this many blocks.
_SPLITS = 32
#: Selections made, per (description, slots, nest): a build lowers a kernel several times
#: (the partitioning passes' probes, then the build), each time to the same choice.
_CHOSEN: dict[tuple[Any, ...], list[Selection]] = {}
#: How many forms :func:`select_forms` offers: the chosen one, then the next by estimate
#: (what the lowering falls back on when a later check refuses a block: :mod:`.feedback`).
FORM_CANDIDATES = 4
L0_INPUTS = ("input", "weight")


def isel_enabled() -> bool:
    """Whether the search runs (``KILN_NPU_ISEL`` unset or not ``0``)."""
    return os.environ.get("KILN_NPU_ISEL", "1") != "0"


@dataclass(frozen=True)
class Form:
    """One instruction form: ``dims`` the reshaped nest (at least three; the last three are
    the instruction's, the others block loops), ``strides`` each buffer's element strides
    over them (the result first), ``tile`` the block over the last three, ``reshape`` how the
    dims were formed (``"merged"``, ``"rows"``: the innermost pair kept apart, ``"split f"``)."""

    dims: tuple[int, ...]
    strides: tuple[tuple[int, ...], ...]
    tile: tuple[int, int, int]
    reshape: str

    @property
    def rank(self) -> int:
        """The instruction's rank: how many of its three dims have extent > 1."""
        return max(1, sum(t > 1 for t in self.tile))

    def describe(self) -> str:
        return f"{self.rank}-D, {self.reshape}"


@dataclass(frozen=True)
class Selection:
    """The form chosen for a nest, its estimate, how many forms were considered, and the
    rejected ones counted per reason."""

    form: Form
    estimate: float
    considered: int
    rejected: tuple[tuple[str, int], ...]
    searched: bool

    def describe(self) -> str:
        if not self.searched:
            return "fixed plan"
        rej = sum(n for _, n in self.rejected)
        why = ", ".join(f"{n} {r}" for r, n in self.rejected)
        return (f"isel {self.form.describe()}; {self.considered} forms, {rej} rejected"
                + (f" ({why})" if why else "") + f"; est {self.estimate:.0f} cycles")


# ---- the forms ---------------------------------------------------------------------------------
def _merge(dims: tuple[int, ...], strides: list[tuple[int, ...]], cut: set[int]
           ) -> tuple[list[int], list[list[int]]]:
    """Merge adjacent dims whose strides allow it, except across the boundaries in ``cut``
    (boundary ``i``: between dims ``i`` and ``i + 1``); padded to three dims in front."""
    out: list[tuple[int, list[int]]] = []
    for i, n in enumerate(dims):
        ss = [s[i] for s in strides]
        if out and (i - 1) not in cut and all(p == q * n for p, q in zip(out[-1][1], ss)):
            out[-1] = (out[-1][0] * n, ss)
        else:
            out.append((n, ss))
    while len(out) < 3:
        out.insert(0, (1, [0] * len(strides)))
    return [n for n, _ in out], [[ss[k] for _, ss in out] for k in range(len(strides))]


def _reshapes(cfg: Any, nest: NestInfo) -> list[tuple[str, list[int], list[list[int]]]]:
    bufs = [nest.out.strides] + [b.strides for b in nest.inputs]
    dims = nest.dims
    merged = _merge(dims, bufs, set())
    out = [("merged", *merged)]
    mergeable = [i for i in range(len(dims) - 1) if nest.mergeable(i)]
    if mergeable:
        out.append(("rows", *_merge(dims, bufs, {mergeable[-1]})))
    # the innermost merged axis as rows of f elements (each a whole number of bursts)
    mdims, mstr = merged
    d = mdims[-1]
    if mdims[0] == 1 and d > 1 and all(s[-1] in (0, 1) for s in mstr):
        isz = max([nest.out.itemsize] + [b.itemsize for b in nest.inputs])
        burst_elems = max(1, cfg.memory(DRAM).burst // isz)
        f = burst_elems
        while f < d:
            if d % f == 0 and f <= cfg.encoding.max_extent:
                dd = mdims[1:-1] + [d // f, f]
                ss = [s[1:-1] + [s[-1] * f, s[-1]] for s in mstr]
                out.append((f"split {f}", dd, ss))
            f *= 4
    return out


def _candidates(d: int) -> list[int]:
    """Block extents along one axis: the halvings of ``d`` and its balanced splits."""
    c = {d}
    e = d
    while e > 1:
        e = math.ceil(e / 2)
        c.add(e)
    k = 2
    while k <= min(d, _SPLITS):
        c.add(math.ceil(d / k))
        k += 1
    return sorted(c, reverse=True)


def enumerate_forms(cfg: Any, nest: NestInfo) -> list[Form]:
    """Every form of ``nest`` (see the module docstring), unchecked."""
    forms: list[Form] = []
    seen: set[tuple[Any, ...]] = set()
    for name, dims, strides in _reshapes(cfg, nest):
        last = dims[-3:]
        for a in (2, 1, 0):
            for e in _candidates(last[a]):
                tile = tuple(last[i] if i > a else e if i == a else 1 for i in range(3))
                key = (tuple(dims), tile)
                if key in seen:
                    continue
                seen.add(key)
                forms.append(Form(tuple(dims), tuple(tuple(s) for s in strides),
                                  tile, name))  # type: ignore[arg-type]
    return forms


def fixed_form(cfg: Any, nbuf: int, nest: NestInfo) -> Form | None:
    """The fixed plan's form: fully merged, the largest halved block (innermost axis first,
    stopping at the first axis it cuts) that passes :func:`check_form`; None if none does."""
    name, dims, strides = _reshapes(cfg, nest)[0]
    last = dims[-3:]
    t = [1, 1, 1]

    def ok(tt: list[int]) -> bool:
        return check_form(cfg, nbuf, nest, Form(tuple(dims), tuple(tuple(s) for s in strides),
                                                tuple(tt), name)) is None  # type: ignore[arg-type]

    for axis in (2, 1, 0):
        e = last[axis]
        while e > 1 and not ok([e if i == axis else t[i] for i in range(3)]):
            e = math.ceil(e / 2)
        t[axis] = e
        if e < last[axis]:
            break
    if not ok(t):
        return None
    return Form(tuple(dims), tuple(tuple(s) for s in strides), tuple(t), name)  # type: ignore


# ---- the limits --------------------------------------------------------------------------------
def _compact(t: tuple[int, ...], s: tuple[int, ...]) -> tuple[int, ...]:
    return tuple(n if st else 1 for n, st in zip(t, s[-3:]))


def _prod(xs: Any) -> int:
    p = 1
    for x in xs:
        p *= int(x)
    return p


def check_form(cfg: Any, nbuf: int, nest: NestInfo, form: Form) -> str | None:
    """Why ``form`` breaks a limit of the description (None: it is legal)."""
    t = form.tile
    enc = cfg.encoding
    if any(op != "vmov" for op in nest.opcodes) and \
            not cfg.supports_vector_dtype(nest.compute_dtype):
        return "dtype"
    if max(t) > enc.max_extent:
        return "max_extent"
    out_st = form.strides[0]
    if any(s == 0 for s, n in zip(out_st, form.dims) if n > 1):
        return "broadcast result"
    if any(abs(s) > enc.max_stride for st in form.strides for s in st) or \
            t[1] * t[2] > enc.max_stride:
        return "max_stride"
    osz = nest.out.itemsize + (itemsize(nest.compute_dtype)
                               if nest.compute_dtype != nest.out.dtype else 0)
    need = {m: 0 for m in L0_INPUTS}
    for k, (b, s) in enumerate(zip(nest.inputs, form.strides[1:])):
        need[L0_INPUTS[k % 2]] += nbuf * _prod(_compact(t, s)) * b.itemsize
    for mem in L0_INPUTS:
        if need[mem] > cfg.memory(mem).size:
            return f"L0 {mem}"
    if nbuf * (_prod(t) * osz + 16) > cfg.memory("acc").size:
        return "L0 acc"
    return None


# ---- the cost ----------------------------------------------------------------------------------
def _axis_blocks(d: int, t: int) -> list[tuple[int, int]]:
    """(extent, count) of the blocks along an axis of ``d`` cut by ``t``."""
    full, tail = divmod(d, t)
    return [(t, full)] + ([(tail, 1)] if tail else [])


def _runs(shape: tuple[int, ...], strides: tuple[int, ...]) -> tuple[int, int, int]:
    """(contiguous runs, elements per run, the stride between runs) of a DRAM block."""
    dims = [(e, s) for e, s in zip(shape, strides) if e > 1]
    run = 1
    while dims and dims[-1][1] == run:
        run *= dims[-1][0]
        dims.pop()
    runs = _prod(e for e, _ in dims) if dims else 1
    return runs, run, (dims[-1][1] if dims else 0)


def form_cost(cfg: Any, nbuf: int, nest: NestInfo, form: Form) -> float:
    """The estimated cycles of ``nest`` run as ``form`` (see the module docstring)."""
    dram = cfg.memory(DRAM)
    bw, burst = dram.bandwidth, dram.burst
    outer = _prod(form.dims[:-3])
    last = form.dims[-3:]
    kinds: list[tuple[tuple[int, int, int], int]] = [((), 1)]  # type: ignore[list-item]
    for d, t in zip(last, form.tile):
        kinds = [(e + (x,), c * n) for e, c in kinds for x, n in _axis_blocks(d, t)]
    bufs = [nest.out, *nest.inputs]
    wide = max([itemsize(nest.compute_dtype)] + [b.itemsize for b in bufs])
    costs = [cfg.vector_cost.get(OPCODES[op].cost, cfg.vector_cost.get("default", 1))
             for op in nest.opcodes]
    blocks = 0
    dram_total = load_busy = store_busy = vec_busy = 0.0
    for ext, count in kinds:
        count *= outer
        if not count:
            continue
        blocks += count
        n = _prod(ext)
        cycles = [0.0, 0.0]  # load, store DRAM cycles of one block
        for k, (b, s) in enumerate(zip(bufs, form.strides)):
            runs, run, pitch = _runs(_compact(ext, s), tuple(s[-3:]))
            rb = run * b.itemsize
            moved = runs * math.ceil(rb / burst) * burst
            if b.burst_offset or (runs > 1 and (pitch * b.itemsize) % burst):
                moved += runs * burst  # rows that do not start on a burst
            cycles[k == 0] += moved / bw
        vec = sum(math.ceil(n * wide / cfg.vector_width) * c + cfg.vector_latency
                  for c in costs)
        dram_total += count * (cycles[0] + cycles[1])
        load_busy += count * cycles[0]
        store_busy += count * cycles[1]
        vec_busy += count * vec
    rounds = math.ceil(blocks / cfg.cores)
    active = min(cfg.cores, blocks)
    load_c, store_c, vec = load_busy / blocks, store_busy / blocks, vec_busy / blocks
    # a DMA queue's token push waits for its transfers to complete, so a core's loads of the
    # next block issue only once this block's have landed: per block, their issue, the DRAM
    # latency and a round of the shared channel (every active core's loads and stores)
    issue_in = len(nest.inputs) * cfg.dma_latency + dram.latency
    first = issue_in + active * load_c
    drain = cfg.dma_latency + dram.latency + active * store_c
    if nbuf >= 2:
        step = max(issue_in + active * (load_c + store_c), vec)
    else:  # one slot: load, compute and store one after the other
        step = first + vec + drain
    return max(first + (rounds - 1) * step + vec + drain, dram_total)


def select_form(cfg: Any, nbuf: int, nest: NestInfo) -> Selection:
    """The cheapest legal form of ``nest`` (the fixed plan's unless another is ``MARGIN``
    cheaper; only the fixed plan's when :func:`isel_enabled` is false). Raises NotSupported
    when no form fits."""
    return select_forms(cfg, nbuf, nest)[0]


def select_forms(cfg: Any, nbuf: int, nest: NestInfo) -> list[Selection]:
    """:func:`select_form`'s choice, then up to ``FORM_CANDIDATES - 1`` other legal forms,
    cheapest first by :func:`form_cost`: the candidates a lowering tries in turn when a later
    check (the TIR program generator's slot count, the encoding's field widths) refuses a
    block (:func:`~.feedback.lower_with_feedback`). Raises NotSupported when no form fits."""
    key = (repr(cfg), nbuf, nest, isel_enabled())
    if key in _CHOSEN:
        return _CHOSEN[key]
    sels = _select(cfg, nbuf, nest)
    if len(_CHOSEN) > 4096:
        _CHOSEN.clear()
    _CHOSEN[key] = sels
    return sels


def _select(cfg: Any, nbuf: int, nest: NestInfo) -> list[Selection]:
    base = fixed_form(cfg, nbuf, nest)
    if not isel_enabled():
        if base is None:
            raise NotSupported("not even one element of each operand fits the L0 buffers")
        return [Selection(base, 0.0, 1, (), False)]
    rejected: dict[str, int] = {}
    legal: list[tuple[float, int, Form]] = []
    forms = enumerate_forms(cfg, nest)
    for i, f in enumerate(forms):
        why = check_form(cfg, nbuf, nest, f)
        if why is not None:
            rejected[why] = rejected.get(why, 0) + 1
            continue
        legal.append((form_cost(cfg, nbuf, nest, f), i, f))
    if not legal:
        reasons = ", ".join(sorted(rejected))
        raise NotSupported(f"no instruction form of the element-wise nest fits ({reasons})")
    legal.sort(key=lambda t: t[:2])  # by estimate, ties in enumeration order
    best = legal[0][0], legal[0][2]
    if base is not None:
        c0 = form_cost(cfg, nbuf, nest, base)
        if best[0] > (1 - MARGIN) * c0:
            best = (c0, base)
    rej = tuple(sorted(rejected.items()))
    chosen = Selection(best[1], best[0], len(forms), rej, True)
    others = [Selection(f, c, len(forms), rej, True) for c, _, f in legal if f != best[1]]
    return [chosen] + others[:FORM_CANDIDATES - 1]
