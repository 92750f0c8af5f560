"""Where a piece of IR came from: the model nodes behind a graph call and the kernels made of it.

A frontend records, for every call it emits, the model node it converts (``SourceNode(name,
op_type)``, e.g. the ONNX node ``"conv1"`` of type ``Conv``). The record is a :class:`Span` on the
graph :class:`~kiln.graph.expr.Call` (a field that structural equality and hashing ignore), and
it travels with the IR: a pass that rewrites a binding emits its new calls under the old call's
span (:class:`kiln.graph.functor.ExprMutator` does this for every pass built on it), fusion joins
the spans of a group's members, and the execution plan keeps each kernel call's span. Errors,
profiles and the printed IR name the model nodes through it (TVM's LabelOps and source spans).
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass


@dataclass(frozen=True)
class SourceNode:
    """One node of the source model: its name and operator type (``op_type`` may be empty)."""

    name: str
    op_type: str = ""

    def __str__(self) -> str:
        return f"{self.op_type} node {self.name!r}" if self.op_type else f"node {self.name!r}"


@dataclass(frozen=True)
class Span:
    """The source nodes a piece of IR was made from, in model order, without repeats."""

    nodes: tuple[SourceNode, ...]

    @staticmethod
    def of(name: str, op_type: str = "") -> Span:
        return Span((SourceNode(name, op_type),))

    @staticmethod
    def merge(spans: Iterable[Span | None]) -> Span | None:
        """The union of ``spans`` (None entries skipped), first occurrence order; None if empty."""
        seen: dict[SourceNode, None] = {}
        for s in spans:
            if s is not None:
                seen.update(dict.fromkeys(s.nodes))
        return Span(tuple(seen)) if seen else None

    def to_json(self) -> list[list[str]]:
        return [[n.name, n.op_type] for n in self.nodes]

    @staticmethod
    def from_json(data: Iterable[Iterable[str]] | None) -> Span | None:
        nodes = tuple(SourceNode(str(name), str(op)) for name, op in (data or ()))
        return Span(nodes) if nodes else None

    def __str__(self) -> str:
        shown = ", ".join(str(n) for n in self.nodes[:4])
        more = len(self.nodes) - 4
        return shown + (f" and {more} more" if more > 0 else "")


def describe(span: Span | None, default: str = "") -> str:
    """``str(span)``, or ``default`` when there is no span."""
    return default if span is None else str(span)
