"""Pass instruments: observers of every pass a PassContext runs.

An instrument sees each pass run (``run_before_pass``/``run_after_pass``), can veto it
(``should_run``), and is told when its owning context is entered and exited. kiln ships:

- :class:`PassTimingInstrument` — wall time per pass run, as a report and a dict;
- :class:`DumpIR` / :class:`PrintIRInstrument` — the module text before/after chosen passes,
  to numbered files (``003_after_FoldConstant.txt``) or to a stream;
- :class:`WellFormedInstrument` — ``kiln.graph.well_formed`` after every pass, so that a pass that
  breaks the IR is named by the error instead of a failure three passes later.
"""

from __future__ import annotations

import sys
import time
import weakref
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path
from typing import TextIO

from ..graph import expr as gx
from ..graph.well_formed import well_formed
from ..ir.errors import WellFormedError
from ..ir.module import IRModule
from ..ir.node import structural_equal
from .pass_infra import PassInfo

__all__ = [
    "DumpIR", "PassInstrument", "PassTimingInstrument", "PrintIRInstrument",
    "WellFormedInstrument",
]


class PassInstrument:
    """Base class: every hook is a no-op and every pass may run."""

    def enter_pass_ctx(self) -> None:
        """Called when a PassContext owning this instrument is entered."""

    def exit_pass_ctx(self) -> None:
        """Called when that PassContext is exited."""

    def should_run(self, mod: IRModule, info: PassInfo) -> bool:
        """Return False to skip the pass (the module passes through unchanged)."""
        return True

    def run_before_pass(self, mod: IRModule, info: PassInfo) -> None:
        """Called with the pass's input right before it runs."""

    def run_after_pass(self, mod: IRModule, info: PassInfo) -> None:
        """Called with the pass's result right after it ran."""

    def __repr__(self) -> str:
        return f"{type(self).__name__}()"


# ---------------------------------------------------------------------------------------------
# timing
# ---------------------------------------------------------------------------------------------
@dataclass(frozen=True)
class PassTiming:
    """One pass run: its name, wall time in milliseconds, nesting depth and run index."""

    name: str
    ms: float
    depth: int
    index: int


class PassTimingInstrument(PassInstrument):
    """Measure every pass run.

    ``records`` lists the runs (a pass called from inside another pass is nested one level
    deeper); ``timings`` sums milliseconds per pass name; ``report(sort=...)`` is a text table
    with one line per run, in run order (``"order"``) or slowest first (``"time"``).
    """

    def __init__(self) -> None:
        self._records: list[PassTiming] = []
        self._open: list[tuple[str, float, int]] = []
        self._count = 0

    @property
    def records(self) -> list[PassTiming]:
        """Every completed pass run, in the order the runs started."""
        return sorted(self._records, key=lambda r: r.index)

    def reset(self) -> None:
        self._records.clear()
        self._open.clear()
        self._count = 0

    def run_before_pass(self, mod: IRModule, info: PassInfo) -> None:
        self._open.append((info.name, time.perf_counter(), self._count))
        self._count += 1

    def run_after_pass(self, mod: IRModule, info: PassInfo) -> None:
        end = time.perf_counter()
        # A pass that raised never reaches run_after_pass; drop its dangling entries.
        while self._open and self._open[-1][0] != info.name:
            self._open.pop()
        if not self._open:
            return
        name, start, index = self._open.pop()
        self._records.append(PassTiming(name, (end - start) * 1e3, len(self._open), index))

    @property
    def timings(self) -> dict[str, float]:
        """Total milliseconds per pass name (over all its runs), in first-run order."""
        out: dict[str, float] = {}
        for r in self.records:
            out[r.name] = out.get(r.name, 0.0) + r.ms
        return out

    def report(self, sort: str = "order") -> str:
        """A table of every pass run: milliseconds, share of the top-level total, name."""
        if sort not in ("order", "time"):
            raise ValueError(f"report(sort=...) must be 'order' or 'time', got {sort!r}")
        total = sum(r.ms for r in self.records if r.depth == 0)
        key = (lambda r: r.index) if sort == "order" else (lambda r: (-r.ms, r.index))
        lines = [f"pass timings: {len(self.records)} runs, {total:.3f} ms in total"]
        for r in sorted(self.records, key=key):
            share = 100.0 * r.ms / total if total > 0 else 0.0
            indent = "  " * r.depth if sort == "order" else ""
            lines.append(f"{r.ms:10.3f} ms {share:6.1f}%  {indent}{r.name}")
        return "\n".join(lines)

    def __str__(self) -> str:
        return self.report()


# ---------------------------------------------------------------------------------------------
# IR printing / dumping
# ---------------------------------------------------------------------------------------------
def _selection(which: bool | str | Iterable[str] | None) -> bool | frozenset[str]:
    """True (every pass), or the set of selected pass names (empty: none)."""
    if which is True:
        return True
    if which is None or which is False:
        return frozenset()
    if isinstance(which, str):
        return frozenset((which,))
    return frozenset(which)


def _selected(sel: bool | frozenset[str], name: str) -> bool:
    return sel is True or name in sel  # type: ignore[operator]


class PrintIRInstrument(PassInstrument):
    """Write the module text before and/or after chosen passes to a stream.

    ``before``/``after``: True for every pass, or pass names (default: after every pass).
    Each dump starts with a header naming the pass, the moment and the run number.
    """

    def __init__(self, before: bool | str | Iterable[str] | None = (),
                 after: bool | str | Iterable[str] | None = True, file: TextIO | None = None):
        self.before = _selection(before)
        self.after = _selection(after)
        self.file = file
        self._count = 0
        self._open: list[int] = []

    def run_before_pass(self, mod: IRModule, info: PassInfo) -> None:
        self._count += 1
        self._open.append(self._count)
        if _selected(self.before, info.name):
            self._emit(mod, info, "before", self._count)

    def run_after_pass(self, mod: IRModule, info: PassInfo) -> None:
        index = self._open.pop() if self._open else self._count
        if _selected(self.after, info.name):
            self._emit(mod, info, "after", index)

    def _emit(self, mod: IRModule, info: PassInfo, when: str, index: int) -> None:
        out = self.file or sys.stdout
        out.write(_header(info, when, index) + mod.script() + "\n")


def _header(info: PassInfo, when: str, index: int) -> str:
    return f"# IR {when} pass {info.name} (run {index}, opt_level {info.opt_level})\n"


class DumpIR(PrintIRInstrument):
    """Write the module text to numbered files in ``dump_dir``: ``003_before_X.txt`` and
    ``003_after_X.txt`` for the third pass run (the number counts every run, dumped or not)."""

    def __init__(self, dump_dir: str | Path, before: bool | str | Iterable[str] | None = (),
                 after: bool | str | Iterable[str] | None = True):
        super().__init__(before, after)
        self.dump_dir = Path(dump_dir)
        self.files: list[Path] = []

    def _emit(self, mod: IRModule, info: PassInfo, when: str, index: int) -> None:
        self.dump_dir.mkdir(parents=True, exist_ok=True)
        safe = "".join(c if c.isalnum() or c in "._-" else "_" for c in info.name)
        path = self.dump_dir / f"{index:03d}_{when}_{safe}.txt"
        path.write_text(_header(info, when, index) + mod.script() + "\n")
        self.files.append(path)


# ---------------------------------------------------------------------------------------------
# well-formedness
# ---------------------------------------------------------------------------------------------
def _result_types(mod: IRModule) -> dict[str, object]:
    """Result StructInfo of every graph function of ``mod``, by name."""
    return {name: func.ret_struct_info for name, func in mod.items()
            if isinstance(func, gx.Function) and func.ret_struct_info is not None}


class WellFormedInstrument(PassInstrument):
    """Check ``kiln.graph.well_formed`` after every pass; the error names the pass that broke it.

    With ``check_input`` (default) a pass's input is checked too unless it is the module the
    previous check accepted, so an ill-formed *input* is not blamed on the first pass.

    A pass must also keep the *result* type of every graph function it does not remove: a
    function whose output turns from ``(4,)`` float32 into ``(1,)`` float16 is well formed on its
    own, but every caller (and every user of the executable) breaks. Parameters may change
    (BindParams removes some); results may not.
    """

    def __init__(self, check_input: bool = True):
        self.check_input = check_input
        self._last_ok: weakref.ref[IRModule] | None = None
        self._results: dict[str, object] = {}

    def _known_good(self, mod: IRModule) -> bool:
        return self._last_ok is not None and self._last_ok() is mod

    def run_before_pass(self, mod: IRModule, info: PassInfo) -> None:
        if self.check_input and not self._known_good(mod):
            self._check(mod, f"the input of pass {info.name} is not well formed (the IR was "
                             "built or changed outside a pass)")
        self._results = _result_types(mod)

    def run_after_pass(self, mod: IRModule, info: PassInfo) -> None:
        self._check(mod, f"pass {info.name} produced ill-formed IR")

        after = _result_types(mod)
        changed = [f"{name}: {before} -> {after[name]}" for name, before in self._results.items()
                   if name in after and not structural_equal(before, after[name])]
        if changed:
            listing = "\n  ".join(changed)
            raise WellFormedError(f"pass {info.name} changed the result type of graph "
                                  f"functions:\n  {listing}")

    def _check(self, mod: IRModule, what: str) -> None:
        problems = well_formed(mod, check=False)
        if problems:
            listing = "\n  ".join(problems)
            raise WellFormedError(f"{what}:\n  {listing}")
        self._last_ok = weakref.ref(mod)

    def __repr__(self) -> str:
        return f"WellFormedInstrument(check_input={self.check_input})"
