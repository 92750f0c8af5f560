"""Random variables (handles to blocks and loops) and the replayable trace of a schedule.

A schedule is a program: every primitive call is recorded as an :class:`Instruction` (its kind,
its arguments by parameter name, and the handles it returned). A :class:`Trace` prints as the
Python that would redo it and replays onto another :class:`~kiln.tir.schedule.Schedule` of an
equal function, mapping each recorded handle to the one the replay produces. This is what
tuning records store and re-apply.
"""

from __future__ import annotations

import itertools
import json
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

from ...ir.errors import InternalError, ScheduleError

_ids = itertools.count()


class _RV:
    """A handle: stays valid across transformations as long as its node exists."""

    __slots__ = ("uid",)
    prefix = "rv"

    def __init__(self) -> None:
        self.uid = next(_ids)

    def __repr__(self) -> str:
        return f"{type(self).__name__}#{self.uid}"


class BlockRV(_RV):
    """A handle to a block of a schedule (see :meth:`Schedule.get_block`)."""

    __slots__ = ()
    prefix = "b"


class LoopRV(_RV):
    """A handle to a loop of a schedule (see :meth:`Schedule.get_loops`)."""

    __slots__ = ()
    prefix = "l"


RV = BlockRV | LoopRV


@dataclass(frozen=True, eq=False)
class Instruction:
    """One recorded primitive call.

    ``args`` are the call's arguments as ``(parameter name, value)`` pairs in signature order
    (the value of a ``*loops`` parameter is a tuple); ``outputs`` the handles it returned and
    ``output_form`` whether it returned nothing, one handle, or a list.
    """

    kind: str
    args: tuple[tuple[str, Any], ...]
    outputs: tuple[RV, ...]
    output_form: str = "none"  # "none" | "single" | "list"
    varargs: str | None = None

    @property
    def inputs(self) -> tuple[RV, ...]:
        """The handles the instruction consumes, in argument order."""
        out: list[RV] = []
        for _, value in self.args:
            out.extend(v for v in _flatten(value) if isinstance(v, _RV))
        return tuple(out)

    @property
    def attrs(self) -> dict[str, Any]:
        """The arguments that are not handles (factors, names, scopes, flags...)."""
        return {
            k: v for k, v in self.args if not any(isinstance(x, _RV) for x in _flatten(v))
        }


def _flatten(value: Any) -> Iterator[Any]:
    if isinstance(value, (list, tuple)):
        for v in value:
            yield from _flatten(v)
    else:
        yield value


def _map(value: Any, f) -> Any:
    if isinstance(value, tuple):
        return tuple(_map(v, f) for v in value)
    if isinstance(value, list):
        return [_map(v, f) for v in value]
    return f(value) if isinstance(value, _RV) else value


class Trace:
    """The instructions of a schedule, in order."""

    def __init__(self, insts: list[Instruction] | None = None):
        self._insts: list[Instruction] = list(insts or ())

    @property
    def insts(self) -> tuple[Instruction, ...]:
        return tuple(self._insts)

    def __len__(self) -> int:
        return len(self._insts)

    def __iter__(self) -> Iterator[Instruction]:
        return iter(self._insts)

    def append(self, inst: Instruction) -> None:
        self._insts.append(inst)

    def copy(self) -> Trace:
        return Trace(self._insts)

    # -- printing ------------------------------------------------------------------------------
    def as_python(self) -> list[str]:
        """One line of Python per instruction (``sch`` is the schedule)."""
        names: dict[int, str] = {}
        counter = itertools.count()

        def name(rv: RV) -> str:
            if rv.uid not in names:
                names[rv.uid] = f"{rv.prefix}{next(counter)}"
            return names[rv.uid]

        lines = []
        for inst in self._insts:
            parts = []
            for key, value in inst.args:
                if key == inst.varargs:
                    parts.extend(_format(v, name) for v in value)
                else:
                    parts.append(f"{key}={_format(value, name)}")
            call = f"sch.{inst.kind}({', '.join(parts)})"
            outs = [name(o) for o in inst.outputs]
            if inst.output_form == "single":
                lines.append(f"{outs[0]} = {call}")
            elif inst.output_form == "list" and len(outs) == 1:
                lines.append(f"({outs[0]},) = {call}")
            elif inst.output_form == "list" and outs:
                lines.append(f"{', '.join(outs)} = {call}")
            else:
                lines.append(call)
        return lines

    def __str__(self) -> str:
        return "\n".join(self.as_python())

    def __repr__(self) -> str:
        return f"Trace({len(self._insts)} instructions)"

    # -- replay --------------------------------------------------------------------------------
    def apply_to_schedule(self, sch: Any) -> Any:
        """Redo every instruction on ``sch`` (a :class:`~kiln.tir.schedule.Schedule` of an equal
        function: the schedule module builds on this one); returns it."""
        rv_map: dict[int, RV] = {}

        def lookup(rv: RV) -> RV:
            try:
                return rv_map[rv.uid]
            except KeyError:
                raise InternalError(
                    f"trace replay: handle {rv!r} is used before any instruction produced it"
                ) from None

        for step, inst in enumerate(self._insts):
            method = getattr(sch, inst.kind, None)
            if method is None:
                raise ScheduleError(f"trace replay: unknown instruction {inst.kind!r}")
            pos: list[Any] = []
            kw: dict[str, Any] = {}
            for key, value in inst.args:
                mapped = _map(value, lookup)
                if key == inst.varargs:
                    pos.extend(mapped)
                else:
                    kw[key] = mapped
            try:
                result = method(*pos, **kw)
            except ScheduleError as e:
                raise ScheduleError(
                    f"trace replay failed at instruction {step} ({inst.kind}): {e}"
                ) from e
            # an instruction that returns no handle (a knob returns its value) maps none
            new_outs = () if inst.output_form == "none" else _outputs(result)
            if len(new_outs) != len(inst.outputs):
                raise ScheduleError(
                    f"trace replay: instruction {step} ({inst.kind}) returned "
                    f"{len(new_outs)} handles, the trace recorded {len(inst.outputs)}"
                )
            for old, new in zip(inst.outputs, new_outs):
                rv_map[old.uid] = new
        return sch


def _outputs(result: Any) -> tuple[RV, ...]:
    if result is None:
        return ()
    if isinstance(result, _RV):
        return (result,)
    return tuple(result)


def output_form(result: Any) -> str:
    if result is None:
        return "none"
    return "single" if isinstance(result, _RV) else "list"


def _format(value: Any, name) -> str:
    if isinstance(value, _RV):
        return name(value)
    if isinstance(value, str):
        return json.dumps(value)
    if isinstance(value, list):
        return "[" + ", ".join(_format(v, name) for v in value) + "]"
    if isinstance(value, tuple):
        inner = ", ".join(_format(v, name) for v in value)
        return f"({inner},)" if len(value) == 1 else f"({inner})"
    return repr(value) if not hasattr(value, "dtype") else str(value)


def make_instruction(kind: str, bound: dict[str, Any], varargs: str | None, result: Any
                     ) -> Instruction:
    args = tuple(
        (k, tuple(v) if k == varargs else (list(v) if isinstance(v, list) else v))
        for k, v in bound.items()
    )
    return Instruction(kind, args, _outputs(result), output_form(result), varargs)
