"""Where a target's schedules are registered and how the build finds them.

An operator's declaration (``kiln.op``) says what it computes; how its loops run on a target is
the target's business, written in that target's room (``kiln/schedule/cpu/``,
``kiln/schedule/gpu/``, ``kiln/schedule/npu/``) and registered here. Targets are grouped in
*families* that share one set of schedules (:data:`TARGET_FAMILIES`): ``"c"`` (the CPU, C code),
``"gpu"`` (CUDA and OpenCL kernels from one emitter), ``"npu"``.

A room registers, for its families:

- **rules** (:func:`register_rule`): a schedule for every op that matches, by fusion pattern
  (``OpPattern.INJECTIVE`` ...) or by a predicate on the op's declaration -- what most ops get
  (the CPU's injective and reduction schedules, a GPU's thread-binding ones);
- **per-op entries** (:func:`register_schedule`) for the ops that need their own: stored in
  the op's declaration (``get_op_def(name).schedules[family]``), and tried before the rules;
- **no schedule, with the reason** (:func:`register_no_schedule`): an op that has no kernel on
  the family (a host function) or runs elsewhere; the registry audit accepts it;
- **layout preferences** (:func:`register_alter_layout`): the op's ``alter_layout[family]``
  hook, ``hook(call, target) -> kiln.op.layout.LayoutRewrite | None`` (used by AlterOpLayout);
- for fused PrimFuncs, the family's **fallback** (:func:`register_fallback`: the generic
  schedule of a function whose anchor schedule refuses it) and **epilogue** hook
  (:func:`register_epilogue`: how an element-wise consumer the anchor schedule left alone is
  placed; see :mod:`kiln.schedule.apply`).

A schedule is ``fn(sch: tir.Schedule, target: Target) -> None``: it transforms ``sch`` (a
schedule of the legalized PrimFunc, blocks named as in the op's compute) in place.
:func:`lookup_schedule` gives the one that applies: the op's own entry, else the first rule that
matches (in registration order), else None. Importing :mod:`kiln.schedule` imports every room,
so whatever can call a lookup sees all registrations.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from dataclasses import dataclass
from typing import Any, TypeVar

from ..ir.errors import KilnError
from ..op.registry import OpDef, OpPattern, get_op_def
from ..target.target import Target

__all__ = [
    "FAMILIES", "TARGET_FAMILIES", "Rule", "ScheduleFn", "lookup_alter_layout", "lookup_epilogue",
    "lookup_fallback", "lookup_schedule", "no_schedule_reason", "register_alter_layout",
    "register_epilogue", "register_fallback", "register_no_schedule", "register_rule",
    "register_schedule", "registered_hooks", "rules", "schedule_source", "target_family",
]

#: Target kind -> the family whose schedules it uses.
TARGET_FAMILIES: dict[str, str] = {"c": "c", "cuda": "gpu", "opencl": "gpu", "npu": "npu"}
#: The families, each with its room ``kiln/schedule/<room>/``.
FAMILIES: dict[str, str] = {"c": "cpu", "gpu": "gpu", "npu": "npu"}

#: ``schedule(sch, target)``: transforms a ``tir.Schedule`` of a legalized PrimFunc in place.
ScheduleFn = Callable[[Any, Any], None]
F = TypeVar("F", bound=Callable[..., Any])


@dataclass(frozen=True)
class Rule:
    """A schedule for every op whose declaration ``matches``; ``name`` says which in reports."""

    name: str
    matches: Callable[[OpDef], bool]
    schedule: ScheduleFn


_RULES: dict[str, list[Rule]] = {family: [] for family in FAMILIES}
_NO_SCHEDULE: dict[tuple[str, str], str] = {}
_FALLBACK: dict[str, ScheduleFn] = {}
_EPILOGUE: dict[str, Callable[..., None]] = {}


def target_family(target: Target | str | None) -> str:
    """The schedule family of a target (or of a target kind, or of a family name)."""
    if isinstance(target, str) and target in FAMILIES:
        return target
    if isinstance(target, str) and target in TARGET_FAMILIES:
        return TARGET_FAMILIES[target]
    kind = Target.create(target).kind
    family = TARGET_FAMILIES.get(kind)
    if family is None:
        raise KilnError(f"target kind {kind!r} belongs to no schedule family "
                        f"(kiln.schedule.registry.TARGET_FAMILIES: {sorted(TARGET_FAMILIES)})")
    return family


def _families(targets: str | Iterable[str]) -> list[str]:
    items = [targets] if isinstance(targets, str) else list(targets)
    if not items:
        raise KilnError("a schedule registration names no target family")
    out = []
    for t in items:
        family = t if t in FAMILIES else TARGET_FAMILIES.get(t)
        if family is None:
            raise KilnError(f"unknown target family or kind {t!r} (families: {sorted(FAMILIES)}, "
                            f"kinds: {sorted(TARGET_FAMILIES)})")
        if family not in out:
            out.append(family)
    return out


def _names(op_names: str | Iterable[str]) -> list[str]:
    names = [op_names] if isinstance(op_names, str) else list(op_names)
    if not names:
        raise KilnError("a schedule registration names no operator")
    return names


def _register_per_op(op_names: str | Iterable[str], targets: str | Iterable[str], table: str,
                     what: str) -> Callable[[F], F]:
    """Decorator storing ``fn`` in ``get_op_def(name).<table>[family]`` for every op and family,
    refusing a second entry (and, for schedules, an op registered as having none)."""
    names, families = _names(op_names), _families(targets)

    def register(fn: F) -> F:
        for name in names:
            entries = getattr(get_op_def(name), table)
            for family in families:
                if family in entries:
                    raise KilnError(f"operator {name!r} already has a {family!r} {what} "
                                    f"({getattr(entries[family], '__qualname__', '?')})")
                if table == "schedules" and (family, name) in _NO_SCHEDULE:
                    raise KilnError(f"operator {name!r} is registered as having no {family!r} "
                                    f"schedule ({_NO_SCHEDULE[family, name]})")
                entries[family] = fn
        return fn

    return register


def register_schedule(op_names: str | Iterable[str], targets: str | Iterable[str]
                      ) -> Callable[[F], F]:
    """Decorator: ``fn`` is the schedule of each op in ``op_names`` on each family of
    ``targets`` (stored as ``get_op_def(name).schedules[family]``). An op has at most one per
    family: registering a second is an error, never a silent replacement."""
    return _register_per_op(op_names, targets, "schedules", "schedule")


def register_rule(match: OpPattern | Iterable[OpPattern] | Callable[[OpDef], bool],
                  targets: str | Iterable[str], *, name: str | None = None
                  ) -> Callable[[F], F]:
    """Decorator: ``fn`` schedules every op without its own entry that ``match`` accepts: a
    fusion pattern, a collection of patterns, or a predicate ``(OpDef) -> bool``. Rules are
    tried in registration order."""
    families = _families(targets)
    if isinstance(match, OpPattern):
        patterns = frozenset([match])
    elif callable(match):
        patterns = None
    else:
        patterns = frozenset(OpPattern(p) for p in match)
    if patterns is not None:
        def matches(opdef: OpDef) -> bool:
            return opdef.pattern in patterns
        label = "pattern " + "/".join(p.name for p in sorted(patterns))
    else:
        matches = match  # type: ignore[assignment]
        label = getattr(match, "__name__", "predicate")

    def register(fn: F) -> F:
        rule = Rule(name or f"{label}: {getattr(fn, '__name__', 'schedule')}", matches, fn)
        for family in families:
            _RULES[family].append(rule)
        return fn

    return register


def register_no_schedule(op_names: str | Iterable[str], targets: str | Iterable[str],
                         reason: str) -> None:
    """Record that the ops have no schedule on these families, and why (no kernel to schedule:
    a host function; or they run on another device). The build then leaves their PrimFuncs
    unscheduled and the registry audit accepts them."""
    if not reason:
        raise KilnError("register_no_schedule needs the reason")
    for name in _names(op_names):
        opdef = get_op_def(name)
        for family in _families(targets):
            if family in opdef.schedules:
                raise KilnError(f"operator {name!r} already has a {family!r} schedule")
            _NO_SCHEDULE[family, name] = reason


def register_alter_layout(op_names: str | Iterable[str], targets: str | Iterable[str]
                          ) -> Callable[[F], F]:
    """Decorator: ``hook(call, target) -> LayoutRewrite | None`` is the layout preference of
    each op on each family (``get_op_def(name).alter_layout[family]``, applied by
    AlterOpLayout). One per op and family."""
    return _register_per_op(op_names, targets, "alter_layout", "alter_layout hook")


def _register_family_hook(table: dict[str, Callable[..., Any]], what: str,
                          targets: str | Iterable[str]) -> Callable[[F], F]:
    families = _families(targets)

    def register(fn: F) -> F:
        for family in families:
            if family in table:
                raise KilnError(f"family {family!r} already has {what}")
            table[family] = fn
        return fn

    return register


def register_fallback(targets: str | Iterable[str]) -> Callable[[F], F]:
    """Decorator: ``fn(sch, target)``, the generic schedule of a family: what a fused PrimFunc
    gets when its anchor op's schedule refuses it (raises ScheduleError)."""
    return _register_family_hook(_FALLBACK, "a fallback schedule", targets)


def register_epilogue(targets: str | Iterable[str]) -> Callable[[F], F]:
    """Decorator: ``fn(sch, target, block, anchor_blocks)`` places an element-wise block of a
    fused PrimFunc that the anchor op's schedule left alone (``anchor_blocks``: the names of the
    anchor's own blocks)."""
    return _register_family_hook(_EPILOGUE, "an epilogue hook", targets)


def rules(target: Target | str) -> list[Rule]:
    """The rules of ``target``'s family, in the order they are tried."""
    return list(_RULES[target_family(target)])


def registered_hooks() -> list[Callable[..., Any]]:
    """Every rule (its matcher and schedule), fallback and epilogue hook of every family: the
    code besides the op declarations that decides a build's schedules (the executable cache,
    ``kiln.build_cache``, keys on the code registered from outside kiln)."""
    out: list[Callable[..., Any]] = []
    for family_rules in _RULES.values():
        for rule in family_rules:
            out += [rule.matches, rule.schedule]
    return out + list(_FALLBACK.values()) + list(_EPILOGUE.values())


def lookup_schedule(op_name: str, target: Target | str) -> ScheduleFn | None:
    """The schedule of op ``op_name`` on ``target``: its own entry, else the first matching
    rule, else None (no schedule: the PrimFunc is lowered as its compute wrote it)."""
    family = target_family(target)
    opdef = get_op_def(op_name)
    own = opdef.schedules.get(family)
    if own is not None:
        return own
    if (family, op_name) in _NO_SCHEDULE:
        return None
    for rule in _RULES[family]:
        if rule.matches(opdef):
            return rule.schedule
    return None


def no_schedule_reason(op_name: str, target: Target | str) -> str | None:
    """Why op ``op_name`` has no schedule on ``target``'s family (None: none was given)."""
    return _NO_SCHEDULE.get((target_family(target), op_name))


def schedule_source(op_name: str, target: Target | str) -> str | None:
    """Where op ``op_name``'s schedule on ``target``'s family comes from: ``"own"``, ``"rule
    <name>"``, ``"none: <reason>"``, or None when the op has neither a schedule nor a reason
    (what the registry audit reports)."""
    family = target_family(target)
    opdef = get_op_def(op_name)
    if family in opdef.schedules:
        return "own"
    reason = _NO_SCHEDULE.get((family, op_name))
    if reason is not None:
        return f"none: {reason}"
    for rule in _RULES[family]:
        if rule.matches(opdef):
            return f"rule {rule.name}"
    return None


def lookup_alter_layout(op_name: str, target: Target | str) -> Callable[..., Any] | None:
    """The op's layout preference hook on ``target``'s family, or None."""
    return get_op_def(op_name).alter_layout.get(target_family(target))


def lookup_fallback(target: Target | str) -> ScheduleFn | None:
    """The generic schedule of ``target``'s family (None: the family registered none)."""
    return _FALLBACK.get(target_family(target))


def lookup_epilogue(target: Target | str) -> Callable[..., None] | None:
    """The epilogue hook of ``target``'s family (None: the family registered none)."""
    return _EPILOGUE.get(target_family(target))
