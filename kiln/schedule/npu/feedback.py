"""Feedback instead of failure: a product's tiling refused by a later check is re-chosen.

The planner (:func:`~.gemm.plan_gemm`) ranks the feasible tilings of a product by its cost
model, from the same hardware description the later steps read, so its first choice normally
lowers. But the later steps have checks of their own that its model does not restate: the
TIR program generator (:mod:`.tir_program`) counts the slots a scheduled copy really takes
("N slots of B bytes ... exceed input") and the accumulator tiles a core really keeps ("N
accumulator tiles of B B exceed acc"), and every instruction's fields must fit the binary
encoding's widths (an extent above ``encoding.max_extent``, a stride above ``max_stride``:
:func:`kiln.npu.encoding.encode`). Where such a check refuses the planner's choice, failing
the build -- or sending a product the NPU could run to the CPU -- would be wrong: the planner
had other candidates. :func:`lower_with_feedback` tries the candidates in order
(:func:`~.gemm.plan_candidates`: the knob's choice, then the cost model's next ones), undoes
what a refused attempt emitted (:meth:`~.lowering.LoweringContext.rollback`), and keeps the
first that lowers; the kernel's tiling text (``exe.describe()``) then names the candidates
refused before it and why, and the module's logger says so too. Only when every candidate is
refused does the lowering raise :class:`~.lowering.NotSupported`, with each reason.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, TypeVar

from ...npu.encoding import encode
from ...npu.isa import Block, Instr, IsaError
from ...npu.program import Program
from ...target.npu.config import NPUConfig
from .lowering import LoweringContext, NotSupported, Unfusable

__all__ = ["Refusal", "check_encodable", "choose_acc_slots", "choose_epilogue_home",
           "emit_choosing_slots",
           "field_limits", "lower_with_feedback", "within_fields"]

LOG = logging.getLogger(__name__)

T = TypeVar("T")


@dataclass(frozen=True)
class Refusal:
    """A candidate tiling a later check refused: its description and the check's message."""

    tiling: str
    reason: str


def field_limits(cfg: NPUConfig) -> tuple[int, int, int]:
    """The largest extent, stride magnitude and address the encoding of ``cfg`` holds (the
    encoding is derived from the memories on each access: read it once per check)."""
    enc = cfg.encoding
    return enc.max_extent, enc.max_stride, (1 << enc.addr_bits) - 1


def within_fields(instr: Instr, limits: tuple[int, int, int]) -> bool:
    """A quick test that ``instr``'s extents, strides and addresses fit the encoding's widths
    (``limits``: :func:`field_limits`; what a tiling can push past them); False sends it to
    the full :func:`encode`. Encoding every instruction of a kernel took a third of a ResNet
    block's build."""
    max_ext, max_stride, max_addr = limits
    for v in instr.args.values():
        if isinstance(v, Block):
            if not 0 <= v.addr <= max_addr or any(abs(s) > max_stride for s in v.strides):
                return False
        elif isinstance(v, tuple) and v and isinstance(v[0], int):
            if any(not 0 <= e <= max_ext for e in v):
                return False
    return True


def check_encodable(ctx: LoweringContext, lens: list[int]) -> None:
    """Raise :class:`NotSupported` when an instruction emitted since the streams had lengths
    ``lens`` has a field the encoding cannot hold (the binary program would not assemble):
    :func:`within_fields` first, the full :func:`encode` for what it doubts."""
    limits = field_limits(ctx.config)
    for core, (stream, n) in enumerate(zip(ctx.kb.streams, lens)):
        for instr in stream[n:]:
            if within_fields(instr, limits):
                continue
            try:
                encode(instr, ctx.config)
            except IsaError as err:
                raise NotSupported(f"instruction field limit on core {core}: {err}") from None


def lower_with_feedback(ctx: LoweringContext, op: str, candidates: list[T],
                        attempt: Callable[[T], None], describe: Callable[[T], str]) -> T:
    """Run ``attempt(candidate)`` for each of ``candidates`` in order until one emits without a
    :class:`NotSupported` (and with encodable instructions); a refused attempt's instructions,
    kernels and allocations are rolled back. Returns the candidate taken; the kernels it
    emitted carry the refusals in their tiling text. NotSupported naming every refusal when
    none lowers."""
    refusals: list[Refusal] = []
    for cand in candidates:
        mark = ctx.checkpoint()
        lens = [len(st) for st in ctx.kb.streams]
        nkernels = len(ctx.kb.kernels)
        ctx.kb.acc_slots_used = 0
        try:
            attempt(cand)
            check_encodable(ctx, lens)
        except Unfusable:
            raise  # the region emits the product and its epilogue apart instead
        except NotSupported as err:
            ctx.rollback(mark)
            refusals.append(Refusal(describe(cand), str(err)))
            continue
        if ctx.replay is not None and ctx.kb.acc_slots_used > ctx.kb.nbuf:
            choose_acc_slots(ctx, mark, lens, lambda c=cand: attempt(c))
        if refusals:
            note = "; ".join(f"{r.tiling}: {r.reason}" for r in refusals)
            LOG.info("%s: took %s after refusing %s", op, describe(cand), note)
            for info in ctx.kb.kernels[nkernels:]:
                info.tiling += f" [feedback: {len(refusals)} refused -- {note}]"
        return cand
    raise NotSupported(f"{op}: every candidate tiling was refused: " + "; ".join(
        f"{r.tiling}: {r.reason}" for r in refusals))


def _kernel_program(ctx: LoweringContext, lens: list[int]) -> Program:
    """The last kernel emitted since the streams had lengths ``lens`` (the product; a cast
    kernel of its operand may come before it), as a program of its own."""
    kb = ctx.kb
    streams = []
    for st, n in zip(kb.streams, lens):
        ends = [i for i in range(n, len(st)) if st[i].op == "barrier"]
        streams.append(list(st[ends[-2] + 1 if len(ends) > 1 else n:]))
    last = kb.kernels[-1].label
    labels = {bid: lab for bid, lab in kb.labels.items() if lab == last}
    return Program(ctx.config, streams, labels, ctx.top)


def choose_acc_slots(ctx: LoweringContext, mark: tuple[object, ...], lens: list[int],
                     redo: Callable[[], None]) -> None:
    """A product kernel just emitted (since ``mark``; ``redo`` emits it again) whose output
    tiles took more accumulator slots than ``nbuf`` (:func:`~.gemm.acc_slots`' third slot):
    emit it again with ``nbuf`` (``KernelBuilder.acc_slot_cap``) and keep the count whose
    program, replayed on its own after its bank placement (``ctx.replay``), takes fewer
    cycles, or as many with fewer bank-conflict cycles left (else the third slot stays).
    The third slot gives a tile's store a second step before its slot is taken again; the
    conflicts it leaves are what the slots' groups cost (two slots of a tile each straddling
    a group boundary take the accumulators' four groups, three would take six): the replay
    weighs both. The product's kernel records the choice (``KernelInfo.acc_choice``, its
    tiling text). Feedback, not failure: an attempt with fewer slots that does not lower keeps the
    first."""
    kb = ctx.kb
    more = kb.acc_slots_used
    assert ctx.replay is not None
    r_more = ctx.replay(_kernel_program(ctx, lens))
    ctx.rollback(mark)
    kb.acc_slot_cap, kb.acc_slots_used = kb.nbuf, 0
    try:
        redo()
        check_encodable(ctx, lens)
        r_fewer: tuple[float, float] | None = ctx.replay(_kernel_program(ctx, lens))
    except NotSupported:
        r_fewer = None
    finally:
        kb.acc_slot_cap = 0
    if r_fewer is None or r_fewer >= r_more:
        ctx.rollback(mark)
        kb.acc_slots_used = 0
        redo()
        choice = (more, r_more[0], kb.nbuf, float("nan") if r_fewer is None else r_fewer[0])
    else:
        choice = (kb.nbuf, r_fewer[0], more, r_more[0])
    info = kb.kernels[-1]  # the product (a cast kernel of its operand may come before)
    info.acc_choice = choice
    info.tiling += (f" [{choice[0]} output slots: {choice[1]:.0f} cycles replayed with "
                    f"bank placement, {choice[2]}: {choice[3]:.0f}]")


def emit_choosing_slots(ctx: LoweringContext, emit: Callable[[], None]) -> None:
    """Run ``emit`` (one product kernel, ended; a lowering without candidate tilings to fall
    back on: the emit route's convolutions, the depthwise kernels) and, where its output
    tiles took a third accumulator slot and the build replays kernels, keep the faster slot
    count (:func:`choose_acc_slots`), as :func:`lower_with_feedback` does for the others --
    both routes emit the same program."""
    mark = ctx.checkpoint()
    lens = [len(st) for st in ctx.kb.streams]
    ctx.kb.acc_slots_used = 0
    emit()
    if ctx.replay is not None and ctx.kb.acc_slots_used > ctx.kb.nbuf:
        choose_acc_slots(ctx, mark, lens, emit)


def choose_epilogue_home(ctx: LoweringContext, epilogue: Any, homes: tuple[str, ...],
                         emit: Callable[[], None]) -> str:
    """Run ``emit`` (a product's lowering with its fused ``epilogue`` installed, duck-typed:
    ``home``, ``placed``) once per home of ``homes`` (:data:`.epilogue.HOMES`) and keep the
    one whose kernels, replayed on their own after their bank placement
    (``ctx.home_replay``), take the fewest cycles, then the fewest bank-conflict cycles (the
    first of ``homes`` on a full tie). A home whose layout fell back to the accumulators
    (no whole bank groups free for it, :meth:`~.epilogue.Epilogue._layout`) is the
    accumulators' program again, not replayed twice; one that does not lower is skipped.
    Returns the home kept (its program is what the context holds); the product's kernel
    records every home's replayed cycles in its tiling text."""
    assert ctx.home_replay is not None
    mark = ctx.checkpoint()
    lens = [len(st) for st in ctx.kb.streams]
    nkernels = len(ctx.kb.kernels)
    tried: dict[str, tuple[float, float]] = {}
    for home in homes:
        ctx.rollback(mark)
        epilogue.home, epilogue.placed = home, set()
        try:
            emit()
        except NotSupported:
            continue
        if home != "acc" and epilogue.placed <= {"acc"}:
            continue  # the accumulators' layout again
        tried[home] = ctx.home_replay(_kernels_program(ctx, lens))
    if not tried:  # none lowered: the first one's refusal, raised again
        ctx.rollback(mark)
        epilogue.home = homes[0]
        emit()
        return homes[0]
    best = min(tried, key=lambda h: (tried[h], homes.index(h)))
    ctx.rollback(mark)
    epilogue.home, epilogue.placed = best, set()
    emit()
    if len(tried) > 1:
        note = ", ".join(f"{h}: {c:.0f} ({k:.0f} in conflicts)" for h, (c, k) in tried.items())
        for info in ctx.kb.kernels[nkernels:]:
            info.tiling += f" [epilogue buffers in {best}; replayed cycles {note}]"
    return best


def _kernels_program(ctx: LoweringContext, lens: list[int]) -> Program:
    """Every kernel emitted since the streams had lengths ``lens``, as a program of its
    own."""
    kb = ctx.kb
    streams = [list(st[n:]) for st, n in zip(kb.streams, lens)]
    ids = {i.args["id"] for st in streams for i in st if i.op == "barrier"}
    labels = {bid: lab for bid, lab in kb.labels.items() if bid in ids}
    return Program(ctx.config, streams, labels, ctx.top)
