"""The whole-model native entry of a graph function: one C call runs every kernel of a Plan.

For a plan whose tensors all have static shapes, :func:`emit_entry` writes::

    int32_t kiln_entry_<name>(void** inputs, void** outputs, void* workspace, void** consts)

which calls the kernels' unchecked entries (``NAME_unchecked(void** data, const int64_t*
sym)``) in plan order. ``inputs`` are the data pointers of the inputs in parameter order,
``outputs`` those of the plan's ``"output"`` slots in increasing slot order, ``consts`` those of
the constants in increasing slot order, and every temp lives at its memory-plan offset in
``workspace`` (at least ``plan.workspace_bytes`` bytes, 64-byte aligned). Nothing is checked
in C: the Python executor validates inputs first. Beside it, ``<symbol>_profile``
(``Plan.profile_entry``) takes one more argument, ``double* seconds``, and adds each call's
wall time to ``seconds[i]`` (``i`` the call's index in ``plan.calls``): what
``Executable.profile`` reads, so a kernel's time is measured in the model's own sequence,
without per-call Python overhead. The kernels' C symbols are predicted with
the same naming rule the C backend uses (:func:`predict_unchecked_symbols`); the build checks
the prediction against the compiled module.

:data:`THREADS_SOURCE` adds ``void kiln_set_num_threads(int32_t)`` and ``int32_t
kiln_get_max_threads(void)`` around OpenMP's ``omp_set_num_threads``/``omp_get_max_threads``.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping

from ..runtime import memory_plan
from ..runtime.plan import Plan, profile_symbol
from ..tir.expr import IntImm
from ..tir.function import PrimFunc
from .c.names import NameTable, sanitize

THREADS_SOURCE = """
#include <time.h>
/* Monotonic wall clock in seconds, for the profiling entries. */
static double kiln_wall_seconds(void) {
  struct timespec t;
  clock_gettime(CLOCK_MONOTONIC, &t);
  return (double)t.tv_sec + 1e-9 * (double)t.tv_nsec;
}
/* Thread count of the OpenMP regions started from the calling thread (OpenMP keeps this
   setting per process thread, not per library: it also applies to other kiln libraries). */
#ifdef _OPENMP
#include <omp.h>
#endif
void kiln_set_num_threads(int32_t n) {
#ifdef _OPENMP
  if (n > 0) omp_set_num_threads(n);
#else
  (void)n;
#endif
}
int32_t kiln_get_max_threads(void) {
#ifdef _OPENMP
  return (int32_t)omp_get_max_threads();
#else
  return 1;
#endif
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


def _static_kernel(func: PrimFunc, nargs: int) -> bool:
    """Whether ``func`` takes exactly ``nargs`` buffers of constant shapes (a dim may be an
    unfolded constant expression such as ``1 * 512``, as a reshape's compute writes it)."""
    from ..arith import Analyzer

    if len(func.params) != nargs:
        return False
    ana = Analyzer()
    for p in func.params:
        buf = func.buffer_map.get(p)
        if buf is None or not all(isinstance(d, IntImm) or isinstance(ana.simplify(d), IntImm)
                                  for d in buf.shape):
            return False
    return True


def supports_entry(plan: Plan, funcs: Mapping[str, PrimFunc]) -> bool:
    """Whether ``plan`` can run through a native entry: static shapes everywhere and kernels
    whose parameters are exactly the call's tensors (no symbolic dims, no scalars), and no host
    steps (run-time shapes need the Python executor)."""
    if plan.has_host_steps:
        return False
    if not all(memory_plan.is_static_slot(plan, s) for s in range(len(plan.slots))):
        return False
    for call in plan.calls:
        func = funcs.get(call.func)
        if func is None or not _static_kernel(func, len(call.args)):
            return False
    return True


def output_slots(plan: Plan) -> list[int]:
    return [s for s, spec in enumerate(plan.slots) if spec.kind == "output"]


def const_slots(plan: Plan) -> list[int]:
    return sorted(plan.constants)


def emit_entry(plan: Plan, symbol: str, unchecked: Mapping[str, str]) -> str:
    """C source of the native entry ``symbol`` of ``plan`` (see the module docstring)."""
    where: dict[int, str] = {}
    for i, s in enumerate(plan.input_slots):
        where[s] = f"inputs[{i}]"
    for i, s in enumerate(output_slots(plan)):
        where[s] = f"outputs[{i}]"
    for i, s in enumerate(const_slots(plan)):
        where[s] = f"consts[{i}]"
    for s, off in plan.workspace_offsets.items():
        where[s] = f"(void*)(ws + {off})"
    lines = [
        f"/* whole-model entry of graph function {plan.name!r}: {len(plan.calls)} kernel calls, "
        f"workspace {plan.workspace_bytes} bytes */",
        f"int32_t {symbol}(void** inputs, void** outputs, void* workspace, void** consts) {{",
        "  char* ws = (char*)workspace;",
        "  (void)inputs; (void)outputs; (void)ws; (void)consts;",
    ]
    calls = [f"{{ void* a[] = {{{', '.join(where[s] for s in call.args)}}}; "
             f"{unchecked[call.func]}(a, NULL); }}" for call in plan.calls]
    lines += [f"  {c}" for c in calls] + ["  return 0;", "}"]
    lines += [
        f"/* {symbol} with each call's wall time added to seconds[call index] */",
        f"int32_t {profile_symbol(symbol)}(void** inputs, void** outputs, void* workspace, "
        "void** consts, double* seconds) {",
        "  char* ws = (char*)workspace;",
        "  (void)inputs; (void)outputs; (void)ws; (void)consts;",
        "  double t0;",
    ]
    lines += [f"  t0 = kiln_wall_seconds(); {c} seconds[{i}] += kiln_wall_seconds() - t0;"
              for i, c in enumerate(calls)]
    lines += ["  return 0;", "}"]
    return "\n".join(lines) + "\n"


def emit_entries(plans: Mapping[str, Plan], funcs: Mapping[str, PrimFunc]) -> str:
    """Set ``plan.entry`` on every plan that supports one and return all entries' C source
    (plus :data:`THREADS_SOURCE`), for ``codegen.c.build(..., extra_source=...)``."""
    unchecked = predict_unchecked_symbols(funcs)
    taken: set[str] = set()
    parts = [THREADS_SOURCE]
    for name, plan in plans.items():
        plan.entry = None
        if supports_entry(plan, funcs):
            plan.entry = entry_symbol(name, taken)
            parts.append(emit_entry(plan, plan.entry, unchecked))
    return "\n".join(parts)
