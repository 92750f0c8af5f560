"""A fuzzer for kiln: seeded mutations of models, inputs and saved executables.

kiln promises that bad input gets a clear KilnError naming the culprit, never a crash, a hang or
a silent wrong answer. This package checks it the way an attacker or a careless exporter would:
each seed makes one case (``cases.make_case``: a sample -- one of ONNX's node test models or a
small hand-built one -- and one mutation of its attributes, declared dims, graph edges, opset,
initializers, serialized bytes, run-time inputs, or of a saved executable), a worker process
runs it under a time limit (``runner.Pool``) and classifies it against onnxruntime and
onnx.reference (``cases.CLASSES``). :func:`fuzz` runs a range of seeds and returns a
:class:`Report`; ``python benchmarks/fuzz.py`` is the command line, and
``tests/testing/test_testing_fuzz.py`` runs a fixed few hundred seeds in CI.

A case is reproduced from its seed alone::

    python benchmarks/fuzz.py --seed 1234 --verbose
"""

from __future__ import annotations

import json
import os
from collections.abc import Callable, Iterable
from dataclasses import asdict, dataclass, field

import onnx

from ...runtime.executable import cache_dir
from .cases import CLASSES, KINDS, Case, Outcome, execute, make_case, same_outputs
from .corpus import Sample, handbuilt, load_corpus
from .runner import MEMORY_LIMIT, Pool

__all__ = [
    "CLASSES", "FAILURES", "KINDS", "Case", "Outcome", "Report", "Sample", "corpus_cache",
    "execute", "fuzz", "handbuilt", "load_corpus", "make_case", "run_one", "same_outputs",
]

#: Classes that break kiln's promise (the "wrong answers explained by the references' own
#: disagreement" are listed apart, "unverified" is kiln running what no reference would).
FAILURES = ("crash", "hang", "other_exception", "wrong", "harness_error")


@dataclass
class Report:
    """The outcomes of a fuzz run, with a table by class and by kind."""

    outcomes: list[Outcome] = field(default_factory=list)

    def count(self, cls: str, kind: str | None = None) -> int:
        return sum(1 for o in self.outcomes if o.cls == cls and (kind is None or o.kind == kind))

    def failures(self, kinds: Iterable[str] | None = None) -> list[Outcome]:
        """Outcomes that break the promise (in the given kinds of case, default all)."""
        wanted = set(kinds) if kinds is not None else None
        return [o for o in self.outcomes
                if o.cls in FAILURES and (wanted is None or o.kind in wanted)]

    def noted(self, note: str) -> list[Outcome]:
        """KilnErrors whose message was flagged (``"python wording"``, ``"names no node"``)."""
        return [o for o in self.outcomes if note in o.notes]

    def table(self, examples: int = 3) -> str:
        """Counts per class (with example seeds) and per kind of case."""
        lines = [f"{len(self.outcomes)} cases"]
        lines.append(f"{'class':22s} {'count':>7s}  examples (seed: kind, where, error)")
        for cls in CLASSES:
            found = [o for o in self.outcomes if o.cls == cls]
            shown = "; ".join(_example(o) for o in _distinct(found)[:examples])
            lines.append(f"{cls:22s} {len(found):7d}  {shown}")
        for note in ("python wording", "names no node"):
            found = self.noted(note)
            shown = "; ".join(_example(o) for o in _distinct(found)[:examples])
            lines.append(f"{'  KilnError: ' + note:22s} {len(found):7d}  {shown}")
        kinds = sorted({o.kind for o in self.outcomes})
        lines.append("")
        lines.append(f"{'kind':12s} " + " ".join(f"{c[:9]:>9s}" for c in CLASSES))
        for kind in kinds:
            lines.append(f"{kind:12s} " + " ".join(f"{self.count(c, kind):9d}" for c in CLASSES))
        return "\n".join(lines)

    def to_json(self) -> str:
        return "\n".join(json.dumps(asdict(o)) for o in self.outcomes)


def _distinct(outcomes: list[Outcome]) -> list[Outcome]:
    """One outcome per distinct (error, place), so examples show different problems."""
    seen: dict[tuple[str, str], Outcome] = {}
    for o in outcomes:
        seen.setdefault((o.error, o.notes[0] if o.notes and o.cls != "kiln_error"
                         else o.message[:40]), o)
    return list(seen.values())


def _example(o: Outcome) -> str:
    where = f", {o.notes[0]}" if o.notes and o.cls == "other_exception" else ""
    err = f", {o.error}: {o.message[:80]}" if o.error else ""
    return f"{o.seed}: {o.kind} {o.source} [{o.what[:60]}]{where}{err}"


def corpus_cache() -> str:
    """Where the node test samples are kept between runs (next to kiln's kernel cache), per
    onnx version (the node tests come with it)."""
    return os.path.join(cache_dir(), f"fuzz_corpus_onnx{onnx.__version__}.pkl")


def fuzz(seeds: Iterable[int], workers: int = 2, timeout: float = 60.0,
         kinds: dict[str, float] | None = None, corpus_path: str | None = None,
         memory_limit: int = MEMORY_LIMIT,
         progress: Callable[[Outcome, Report], None] | None = None,
         run: Callable[..., Outcome] = execute) -> Report:
    """Run the case of every seed in ``workers`` processes (``timeout`` seconds each) and
    report; ``kinds`` weights the kinds of case (default :data:`KINDS`), ``progress`` is
    called after each case; ``run(case, report)`` is what a worker does with a case (a
    module-level function, for the workers to import)."""
    path = corpus_path or corpus_cache()
    load_corpus(path)  # made once, here, so workers only read it
    report = Report()
    pool = Pool(workers, timeout, path, memory_limit, kinds, run)
    for outcome in pool.run(seeds):
        report.outcomes.append(outcome)
        if progress is not None:
            progress(outcome, report)
    report.outcomes.sort(key=lambda o: o.seed)
    return report


def run_one(seed: int, kinds: dict[str, float] | None = None,
            corpus_path: str | None = None) -> Outcome:
    """Run the case of ``seed`` in this process (to debug it: exceptions are classified, a
    crash takes this process down)."""
    corpus = load_corpus(corpus_path or corpus_cache())
    case = make_case(seed, corpus, kinds)
    return execute(case, lambda *a: None)

