"""The whole-model native entry of a graph function: one C call runs every kernel of a Plan.

For a plan whose tensors all have static shapes, :func:`emit_entry` writes::

    int32_t kiln_entry_<name>(void** inputs, void** outputs, void* workspace, void** consts)

which calls the kernels' unchecked entries (``NAME_unchecked(void** data, const int64_t*
sym)``) in plan order. ``inputs`` are the data pointers of the inputs in parameter order,
``outputs`` those of the plan's ``"output"`` slots in increasing slot order, ``consts`` those of
the constants in increasing slot order, and every temp lives at its memory-plan offset in
``workspace`` (at least ``plan.workspace_bytes`` bytes, 64-byte aligned). The inputs are not
checked in C: the Python executor validates them first. It returns 0, or ``k + 1`` when call
``k`` of the plan failed a check inside its kernel (an index out of range; the message is in
``kiln_last_error()``), after which it runs nothing more. Beside it, ``<symbol>_profile``
(``Plan.profile_entry``) takes one more argument, ``double* seconds``, and adds each call's
wall time to ``seconds[i]`` (``i`` the call's index in ``plan.calls``): what
``Executable.profile`` reads, so a kernel's time is measured in the model's own sequence,
without per-call Python overhead. The kernels' C symbols are predicted with
the same naming rule the C backend uses (:func:`predict_unchecked_symbols`); the build checks
the prediction against the compiled module.

A plan with symbolic dims (a dynamic batch) gets an entry too, as long as it has no host steps
and every symbolic dim of every kernel is a plain dimension of one of the call's tensors::

    int32_t kiln_entry_<name>(void** inputs, void** outputs, void** temps, void** consts,
                              const int64_t* sym)

``temps`` holds the data pointer of every temp slot in increasing slot order and ``sym`` the
kernels' symbolic dims one call after another, each call's in its kernel's ``sym`` order;
``plan.entry_sym_dims`` says where each of them is read from (``[arg index, axis]`` of the
call's tensors). The executor evaluates the shapes, plans the workspace and fills both arrays
once per distinct binding of the symbolic names (:class:`kiln.runtime.executor.Executor`), so a
call costs the same as with static shapes. Its profiling twin again adds ``double* seconds``.

A plan with host steps (run-time shapes, control flow) cannot have one entry: the Python
executor must run the host steps between kernels. It gets *segment entries* instead, one per
maximal run of consecutive kernel calls between host steps::

    int32_t kiln_segment_<name>_<k>(void** slots, const int64_t* sym)

``slots`` holds the data pointer of every slot of the plan (indexed by slot number; the executor
sets each pointer when the slot's array exists) and ``sym`` the segment's kernels' symbolic dims
one call after another, as for a dynamic entry; ``plan.segments`` records each segment's calls,
symbol and where its dims come from. It returns 0, or ``j + 1`` when the segment's ``j``-th call
failed a check. A MoE layer's routing (NonZero, run-time Reshape) or an ONNX ``If`` cut a model
into a few such segments; before, each of their kernels was a separate ctypes call through its
checked entry (tens of microseconds of Python each).

:data:`CLOCK_SOURCE` is the clock of the profiling twins (the thread count functions,
``kiln_set_num_threads``/``kiln_get_max_threads``, come with the thread pool of every library,
``kiln.codegen.c.thread_pool``).
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping

from ..arith import Analyzer
from ..ir.errors import KilnError
from ..runtime import memory_plan
from ..runtime.plan import Plan, profile_symbol
from ..tir.expr import IntImm, Var
from ..tir.function import PrimFunc
from .c.func import analyze_signature
from .c.names import NameTable, sanitize

CLOCK_SOURCE = """
#include <time.h>
/* Monotonic wall clock in seconds, for the profiling entries. */
static double kiln_wall_seconds(void) {
  struct timespec t;
  clock_gettime(CLOCK_MONOTONIC, &t);
  return (double)t.tv_sec + 1e-9 * (double)t.tv_nsec;
}
"""


def predict_unchecked_symbols(names: Iterable[str]) -> dict[str, str]:
    """The unchecked-entry symbol the C backend gives each function (same order, same rule)."""
    table = NameTable()
    out = {}
    for name in names:
        symbol = table.get(name)
        while symbol + "_unchecked" in table.used:
            symbol = table.get(name)
        table.reserve(symbol + "_unchecked")
        out[name] = symbol + "_unchecked"
    return out


def entry_symbol(name: str, taken: set[str]) -> str:
    base = "kiln_entry_" + sanitize(name).rstrip("_")
    sym, k = base, 1
    while sym in taken or profile_symbol(sym) in taken:
        sym, k = f"{base}_{k}", k + 1
    taken.update((sym, profile_symbol(sym)))
    return sym


def kernel_sym_dims(func: PrimFunc, nargs: int) -> list[tuple[int, int]] | None:
    """Where the unchecked entry of ``func`` reads each of its symbolic dims from, in the
    order of its ``sym`` array: ``(parameter index, axis)`` of a buffer dim that is exactly
    that variable (what the C backend binds it from, see ``analyze_signature``). ``[]`` for a
    kernel of constant shapes (a dim may be an unfolded constant expression such as
    ``1 * 512``, as a reshape's compute writes it); None when ``func`` does not take exactly
    ``nargs`` buffers or binds a dim from a stride."""
    if len(func.params) != nargs or any(p not in func.buffer_map for p in func.params):
        return None
    ana = Analyzer()
    buffers = [func.buffer_map[p] for p in func.params]
    if all(isinstance(d, IntImm) or isinstance(ana.simplify(d), IntImm)
           for b in buffers for d in b.shape):
        return []
    where: dict[Var, tuple[int, int]] = {}
    for i, buf in enumerate(buffers):
        for axis, dim in enumerate(buf.shape):
            if isinstance(dim, Var):
                where.setdefault(dim, (i, axis))
    try:
        order = analyze_signature(func, "kernel").sym_vars
    except KilnError:
        return None
    if any(v not in where for v in order):
        return None
    return [where[v] for v in order]


def entry_sym_dims(plan: Plan, funcs: Mapping[str, PrimFunc]) -> list[list[tuple[int, int]]] | None:
    """Per call of ``plan``, where its kernel's symbolic dims come from (:func:`kernel_sym_dims`),
    or None when the plan cannot run through a native entry: it has host steps (run-time shapes
    need the Python executor) or a kernel whose parameters are not exactly the call's tensors."""
    if plan.has_host_steps:
        return None
    dims = []
    for call in plan.calls:
        func = funcs.get(call.func)
        where = None if func is None else kernel_sym_dims(func, len(call.args))
        if where is None:
            return None
        dims.append(where)
    return dims


def supports_entry(plan: Plan, funcs: Mapping[str, PrimFunc]) -> bool:
    """Whether ``plan`` can run through a native entry (see :func:`entry_sym_dims`)."""
    return entry_sym_dims(plan, funcs) is not None


def is_dynamic(plan: Plan) -> bool:
    """Whether some tensor of ``plan`` has a symbolic shape (its entry then takes ``temps`` and
    ``sym``, see the module docstring)."""
    return not all(memory_plan.is_static_slot(plan, s) for s in range(len(plan.slots)))


def output_slots(plan: Plan) -> list[int]:
    return [s for s, spec in enumerate(plan.slots) if spec.kind == "output"]


def const_slots(plan: Plan) -> list[int]:
    return sorted(plan.constants)


def temp_slots(plan: Plan) -> list[int]:
    return [s for s, spec in enumerate(plan.slots) if spec.kind == "temp"]


def emit_entry(plan: Plan, symbol: str, unchecked: Mapping[str, str]) -> str:
    """C source of the native entry ``symbol`` of ``plan`` and its profiling twin (see the
    module docstring); a plan with symbolic shapes needs ``plan.entry_sym_dims`` set."""
    dynamic = plan.entry_sym_dims is not None
    where: dict[int, str] = {}
    for i, s in enumerate(plan.input_slots):
        where[s] = f"inputs[{i}]"
    for i, s in enumerate(output_slots(plan)):
        where[s] = f"outputs[{i}]"
    for i, s in enumerate(const_slots(plan)):
        where[s] = f"consts[{i}]"
    if dynamic:
        for i, s in enumerate(temp_slots(plan)):
            where[s] = f"temps[{i}]"
        params = "void** inputs, void** outputs, void** temps, void** consts, const int64_t* sym"
        used = "(void)inputs; (void)outputs; (void)temps; (void)consts; (void)sym;"
        head = "symbolic shapes, workspace planned per binding by the caller"
    else:
        for s, off in plan.workspace_offsets.items():
            where[s] = f"(void*)(ws + {off})"
        params = "void** inputs, void** outputs, void* workspace, void** consts"
        used = ("char* ws = (char*)workspace;\n"
                "  (void)inputs; (void)outputs; (void)ws; (void)consts;")
        head = f"workspace {plan.workspace_bytes} bytes"
    lines = [
        f"/* whole-model entry of graph function {plan.name!r}: {len(plan.calls)} kernel calls, "
        f"{head} */",
        f"int32_t {symbol}({params}) {{",
        f"  {used}",
    ]
    calls, base = [], 0
    for k, call in enumerate(plan.calls):
        n_sym = len(plan.entry_sym_dims[k]) if dynamic else 0
        sym = f"sym + {base}" if n_sym else "NULL"
        base += n_sym
        calls.append(f"{{ void* a[] = {{{', '.join(where[s] for s in call.args)}}}; "
                     f"if ({unchecked[call.func]}(a, {sym})) return {k + 1}; }}")
    lines += [f"  {c}" for c in calls] + ["  return 0;", "}"]
    lines += [
        f"/* {symbol} with each call's wall time added to seconds[call index] */",
        f"int32_t {profile_symbol(symbol)}({params}, double* seconds) {{",
        f"  {used}",
        "  double t0;",
    ]
    lines += [f"  t0 = kiln_wall_seconds(); {c} seconds[{i}] += kiln_wall_seconds() - t0;"
              for i, c in enumerate(calls)]
    lines += ["  return 0;", "}"]
    return "\n".join(lines) + "\n"


def kernel_runs(plan: Plan) -> list[tuple[int, int]]:
    """``(start, stop)`` of each maximal run of consecutive kernel calls of ``plan``."""
    runs: list[tuple[int, int]] = []
    start = None
    for k, call in enumerate(plan.calls + [None]):
        if call is not None and call.is_kernel:
            start = k if start is None else start
        elif start is not None:
            runs.append((start, k))
            start = None
    return runs


def emit_segments(plan: Plan, funcs: Mapping[str, PrimFunc], unchecked: Mapping[str, str],
                  taken: set[str]) -> list[str]:
    """Set ``plan.segments`` (see the module docstring) for a plan with host steps whose every
    kernel takes exactly its call's tensors (:func:`kernel_sym_dims`), and return the segment
    entries' C source; ``[]`` (and no segments) otherwise."""
    plan.segments = []
    dims: dict[int, list[tuple[int, int]]] = {}
    for k, call in enumerate(plan.calls):
        if not call.is_kernel:
            continue
        func = funcs.get(call.func)
        where = None if func is None else kernel_sym_dims(func, len(call.args))
        if where is None:
            return []
        dims[k] = where
    parts = []
    for start, stop in kernel_runs(plan):
        symbol = entry_symbol(f"{plan.name}_segment_{len(plan.segments)}", taken)
        lines = [f"/* graph function {plan.name!r}: calls {start}..{stop - 1} between host "
                 "steps */",
                 f"int32_t {symbol}(void** slots, const int64_t* sym) {{",
                 "  (void)slots; (void)sym;"]
        base = 0
        for j, call in enumerate(plan.calls[start:stop]):
            n_sym = len(dims[start + j])
            ptr = f"sym + {base}" if n_sym else "NULL"
            base += n_sym
            lines.append(f"  {{ void* a[] = {{{', '.join(f'slots[{s}]' for s in call.args)}}}; "
                         f"if ({unchecked[call.func]}(a, {ptr})) return {j + 1}; }}")
        lines += ["  return 0;", "}"]
        parts.append("\n".join(lines) + "\n")
        plan.segments.append({"start": start, "stop": stop, "symbol": symbol,
                              "sym_dims": [[list(d) for d in dims[k]]
                                           for k in range(start, stop)]})
    return parts


def emit_entries(plans: Mapping[str, Plan], funcs: Mapping[str, PrimFunc]) -> str:
    """Set ``plan.entry`` on every plan that supports one (``plan.segments`` on a plan with
    host steps, :func:`emit_segments`) and return all entries' C source
    (plus :data:`CLOCK_SOURCE`), for ``codegen.c.build(..., extra_source=...)``."""
    unchecked = predict_unchecked_symbols(funcs)
    taken: set[str] = set()
    parts = [CLOCK_SOURCE]
    for name, plan in plans.items():
        plan.entry, plan.entry_sym_dims, plan.segments = None, None, []
        dims = entry_sym_dims(plan, funcs)
        if dims is None:
            if plan.has_host_steps:
                parts += emit_segments(plan, funcs, unchecked, taken)
            continue
        if is_dynamic(plan) or any(dims):
            plan.entry_sym_dims = [[list(d) for d in call] for call in dims]
        plan.entry = entry_symbol(name, taken)
        parts.append(emit_entry(plan, plan.entry, unchecked))
    return "\n".join(parts)
