"""DeadCodeElimination: drop bindings nobody uses and module functions nobody calls.

**Bindings.** A binding is removed when its variable is not used later in its function and
evaluating its value has no effect besides the value. That holds for every binding of a
dataflow block (side-effect-free by definition) and, elsewhere, for values that are *pure*:
leaves, tuples, operator calls, ``call_tir`` (destination passing: it only writes the output it
allocates), calls of graph functions whose bindings are all pure, and ``If`` whose condition
and branches are pure. Calls of ``ExternFunc``\\ s and direct calls of PrimFuncs may have side
effects and are kept. ``MatchCast`` bindings are always kept: they are run-time checks and may
define symbolic dimensions. Removal runs backwards, so a chain that only fed a dead binding
goes with it; the branches of a kept ``If`` are cleaned too. Blocks left empty disappear.

**Functions.** The entry points of a module are its graph functions named ``"main"`` or
carrying a ``"global_symbol"`` attribute, plus any named in ``entry_functions``. Every module
function not reachable from an entry (through ``GlobalVar`` references, including ``call_tir``
callees) is removed. A module with no such entry is a library whose callers are unknown: its
graph functions are all treated as entries (and a module without graph functions keeps all
its PrimFuncs).
"""

from __future__ import annotations

from collections.abc import Iterable

from ..graph import expr as gx
from ..graph.functor import free_vars
from ..ir.module import IRModule
from ..op.registry import get_op_def
from .normalize import called_functions
from .pass_infra import PassContext, module_pass

__all__ = ["DeadCodeElimination", "entry_functions", "is_pure", "remove_unused_bindings"]

#: Substrings of operator names that mark operators with effects or random results.
IMPURE_OP_MARKERS = ("random", "print", "assert")


def op_is_pure(name: str) -> bool:
    """Whether an operator call only computes its value (no effect, deterministic)."""
    if name == "call_tir":
        return True
    if any(m in name for m in IMPURE_OP_MARKERS):
        return False
    try:
        opdef = get_op_def(name)
    except Exception:  # noqa: BLE001 - an unknown op: assume the worst
        return False
    return bool(getattr(opdef, "pure", True))


class Purity:
    """Purity of values, with a memo of the module's graph functions."""

    def __init__(self, mod: IRModule | None):
        self.mod = mod
        self.funcs: dict[str, bool] = {}

    def function(self, name: str) -> bool:
        if name in self.funcs:
            return self.funcs[name]
        func = self.mod[name] if self.mod is not None and name in self.mod else None
        if not isinstance(func, gx.Function):
            return False
        self.funcs[name] = False  # a recursive call is treated as impure
        ok = self.seq(func.body)
        self.funcs[name] = ok
        return ok

    def seq(self, e: gx.Expr) -> bool:
        if not isinstance(e, gx.SeqExpr):
            return self.value(e)
        for blk in e.blocks:
            if isinstance(blk, gx.DataflowBlock):
                continue
            if not all(self.value(b.value) for b in blk.bindings):
                return False
        return self.value(e.body)

    def value(self, e: gx.Expr) -> bool:
        if isinstance(e, gx.Call):
            if isinstance(e.op, gx.Op):
                pure = op_is_pure(e.op.name)
            elif isinstance(e.op, gx.GlobalVar):
                pure = self.function(e.op.name)
            else:
                pure = False  # extern functions and calls of function values
            return pure and all(self.value(a) for a in e.args)
        if isinstance(e, gx.If):
            return self.value(e.cond) and self.seq(e.true_branch) and self.seq(e.false_branch)
        if isinstance(e, gx.Tuple):
            return all(self.value(f) for f in e.fields)
        if isinstance(e, gx.TupleGetItem):
            return self.value(e.tuple_value)
        if isinstance(e, gx.SeqExpr):
            return self.seq(e)
        return True  # leaves and function values


def is_pure(value: gx.Expr, mod: IRModule | None = None) -> bool:
    """Whether evaluating ``value`` has no effect besides producing it (see module doc)."""
    return Purity(mod).value(value)


def _uses(e: gx.Expr) -> set[gx.Var]:
    return set(free_vars(e))


class _BindingCleaner:
    def __init__(self, mod: IRModule | None):
        self.purity = Purity(mod)

    def seq(self, s: gx.SeqExpr) -> gx.SeqExpr:
        used = _uses(s.body)
        new_blocks: list[gx.BindingBlock] = []
        changed = False
        for blk in reversed(s.blocks):
            dataflow = isinstance(blk, gx.DataflowBlock)
            kept: list[gx.Binding] = []
            for b in reversed(blk.bindings):
                value = b.value
                if isinstance(b, gx.VarBinding) and b.var not in used and (
                    dataflow or self.purity.value(value)
                ):
                    continue
                if isinstance(value, gx.If):
                    value = self.branch_if(value)
                if value is not b.value:
                    b = b.replace(value=value)
                used |= _uses(value)
                kept.append(b)
            kept.reverse()
            if len(kept) != len(blk.bindings) or any(
                x is not y for x, y in zip(kept, blk.bindings)
            ):
                changed = True
                if kept:
                    new_blocks.append(blk.replace(bindings=tuple(kept)))
            else:
                new_blocks.append(blk)
        if not changed:
            return s
        new_blocks.reverse()
        return gx.SeqExpr(tuple(new_blocks), s.body)

    def branch_if(self, e: gx.If) -> gx.If:
        tb = self.seq(e.true_branch) if isinstance(e.true_branch, gx.SeqExpr) else e.true_branch
        fb = self.seq(e.false_branch) if isinstance(e.false_branch, gx.SeqExpr) else (
            e.false_branch)
        if tb is e.true_branch and fb is e.false_branch:
            return e
        return gx.If(e.cond, tb, fb, struct_info=e.struct_info)


def remove_unused_bindings(func: gx.Function, mod: IRModule | None = None) -> gx.Function:
    """``func`` without its dead bindings (the same object when there are none); ``mod`` is
    used to decide whether calls of other graph functions are pure."""
    if not isinstance(func.body, gx.SeqExpr):
        return func
    body = _BindingCleaner(mod).seq(func.body)
    if body is func.body:
        return func
    return gx.Function(func.params, body, func.ret_struct_info, func.attrs)


def entry_functions(mod: IRModule, extra: Iterable[str] = ()) -> list[str]:
    """The entry points of ``mod`` as defined in the module docstring."""
    extra = set(extra)
    graph = [n for n, f in mod.items() if isinstance(f, gx.Function)]
    entries = [n for n in graph if n == "main" or "global_symbol" in mod[n].attrs or n in extra]
    entries += [n for n in extra if n in mod and n not in entries]
    if not entries:
        entries = graph or list(mod)
    return entries


def reachable_functions(mod: IRModule, roots: Iterable[str]) -> set[str]:
    """Names of the functions reachable from ``roots`` through GlobalVar references."""
    seen: set[str] = set()
    todo = [r for r in roots if r in mod]
    while todo:
        name = todo.pop()
        if name in seen:
            continue
        seen.add(name)
        func = mod[name]
        if isinstance(func, gx.Function):
            todo.extend(c for c in called_functions(func) if c in mod and c not in seen)
    return seen


@module_pass(opt_level=1)
class DeadCodeElimination:
    """Remove unused pure bindings and functions unreachable from the module's entries."""

    def __init__(self, entry_functions: Iterable[str] = ()):
        if isinstance(entry_functions, str):
            entry_functions = (entry_functions,)
        self.entry_functions = tuple(entry_functions)

    def transform_module(self, mod: IRModule, ctx: PassContext) -> IRModule:
        new = mod.copy()
        for name, func in mod.items():
            if isinstance(func, gx.Function):
                cleaned = remove_unused_bindings(func, mod)
                if cleaned is not func:
                    new[name] = cleaned
        keep = reachable_functions(new, entry_functions(new, self.entry_functions))
        for name in list(new):
            if name not in keep:
                del new[name]
        return new
