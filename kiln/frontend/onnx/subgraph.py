"""ONNX subgraphs (If branches, Loop and Scan bodies) imported as graph functions of their own.

Control flow decided at run time (``kiln.runtime.control_flow``) runs a branch or a body as a
separate graph function, compiled like ``main``. ``import_function`` builds one: the subgraph's
formal inputs become the first parameters; every outer-scope value the subgraph uses becomes a
further parameter (a *capture*: the caller passes the outer value). Outer constants are not
captured but embedded, so shapes computed from them still fold at import. A capture keeps the
outer value's StructInfo where the function can bind it from its argument (static dims and
plain symbolic dims, which keep their relation to the caller's); a compound dim (``n + 1``)
becomes a fresh symbolic dim.

Nested subgraphs become functions too: they are added to the ``sink`` BlockBuilder (the
module being imported; a throwaway one while a loop body is imported once only to learn how
its carried shapes change).
"""

from __future__ import annotations

from collections import ChainMap
from collections.abc import Sequence
from typing import Any

import numpy as np

from ... import graph as g
from ... import tir
from ...graph.struct_info import erase_sym_vars, sinfo_equal
from ...op.common import dims_equal
from .converters.dynamic import safe_name
from .importer import GraphContext, convert_subgraph


class SubgraphContext(GraphContext):
    """The import state of one subgraph function: outer constants visible (read through),
    outer Exprs captured as extra parameters on first use."""

    def __init__(self, parent: GraphContext, sink: g.BlockBuilder):
        super().__init__(g.BlockBuilder(), parent.bind_params, parent.base_dir)
        self.parent = parent
        self.sink = sink
        self.opsets = parent.opsets
        self.consts = ChainMap({}, parent.consts)  # type: ignore[assignment]
        #: ONNX name -> (outer Expr, the parameter standing for it), in first-use order.
        self.captures: dict[str, tuple[Any, g.Var]] = {}

    def value(self, name: str) -> Any:
        if name in self.values:
            return self.values[name]
        outer = self.parent.value(name)  # KilnError when it is not defined anywhere
        if isinstance(outer, g.Constant):
            self.values[name] = outer
            return outer
        var = g.Var(safe_name(name), capture_sinfo(outer.struct_info))
        self.captures[name] = (outer, var)
        self.values[name] = var
        return var


def function_sink(ctx: GraphContext) -> g.BlockBuilder:
    """Where the functions of subgraphs imported under ``ctx`` go."""
    return ctx.sink if isinstance(ctx, SubgraphContext) else ctx.bb


#: The StructInfo kinds a subgraph function takes and returns besides tensors (host values:
#: the executor holds them as Python lists / None; ``kiln.runtime.host_values``).
HOST_VALUE_SINFO = (g.SequenceStructInfo, g.OptionalStructInfo)


def capture_sinfo(sinfo: Any) -> Any:
    """The StructInfo of a parameter standing for an outer value of ``sinfo``: compound dims
    (which a call could not bind) become fresh symbolic dims; a sequence or optional keeps
    only its static parts (no argument binds the dims of its elements)."""
    if isinstance(sinfo, HOST_VALUE_SINFO):
        return erase_sym_vars(sinfo, set())
    if not isinstance(sinfo, g.TensorStructInfo) or sinfo.shape is None:
        return sinfo
    dims = [d if isinstance(d, (tir.IntImm, tir.Var)) else tir.Var(f"d{i}", "int64")
            for i, d in enumerate(sinfo.shape)]
    return g.TensorStructInfo(tuple(dims), sinfo.dtype)


def widen_sinfo(want: g.TensorStructInfo, got: g.TensorStructInfo, base: str,
                fresh: set[int]) -> g.TensorStructInfo | None:
    """The StructInfo of a loop-carried parameter that is ``want`` before an iteration and
    ``got`` after it: dims that agree stay, and so do dims made fresh before (their ids in
    ``fresh``: such a parameter takes any size), the others become fresh symbolic dims
    (added to ``fresh``). None when nothing changes."""
    rank = len(want.shape) if want.shape is not None else want.ndim
    dims, changed = [], False
    for i in range(rank):
        w = want.shape[i] if want.shape is not None else None
        if w is not None and (id(w) in fresh or (got.shape is not None
                                                 and dims_equal(w, got.shape[i]))):
            dims.append(w)
            continue
        v = tir.Var(f"{base}_d{i}", "int64")
        fresh.add(id(v))
        dims.append(v)
        changed = True
    return g.TensorStructInfo(tuple(dims), want.dtype) if changed else None


def as_carried(want: Any, got: Any) -> Any:
    """``got``, a loop body's result for a carried value of ``want``, as that value: an
    optional when ``want`` is one (a body may return the optional's element)."""
    if isinstance(want, g.OptionalStructInfo) and not isinstance(got, g.OptionalStructInfo):
        return g.OptionalStructInfo(got)
    return got


def widen_host_value(want: Any, got: Any) -> Any:
    """:func:`widen_sinfo` for a loop-carried sequence or optional (``want`` before an
    iteration, ``got`` after it): the least common StructInfo of both with only static dims
    (no argument binds the dims of a sequence's elements), a sequence's length kept only where
    the iteration keeps it. A sequence known to be empty (``SequenceEmpty``) says nothing about
    its elements, so the elements appended to it decide. A body may return the value of a
    carried optional (ONNX allows it; the executor holds both alike), which stays an optional.
    None when nothing changes."""
    got = erase_sym_vars(as_carried(want, got), set())
    if isinstance(want, g.SequenceStructInfo) and want.static_length == 0:
        want = g.SequenceStructInfo(got.elem, want.length)
    wider = erase_sym_vars(g.struct_info_lca(want, got), set())
    return None if sinfo_equal(wider, want) else wider


class SubgraphFunction:
    """An imported subgraph: the GlobalVar of its function, the outer Exprs to pass for its
    captures (after the formal arguments), and its outputs' StructInfo (tensors, sequences,
    optionals)."""

    def __init__(self, gvar: g.GlobalVar, captures: list[tuple[str, Any]],
                 outputs: list[Any]):
        self.gvar = gvar
        self.captures = captures
        self.outputs = outputs


def import_function(ctx: GraphContext, node: Any, graph: Any, name: str,
                    formals: Sequence[tuple[str, Any]], sink: g.BlockBuilder | None = None,
                    captures: Sequence[str] = ()) -> SubgraphFunction:
    """Import ONNX subgraph ``graph`` of ``node`` as graph function ``name`` with parameters
    ``formals`` (ONNX input name, StructInfo) then its captures: first those named in
    ``captures`` (so that two branches can share an order), then the others it uses."""
    child = SubgraphContext(ctx, function_sink(ctx) if sink is None else sink)
    for c in captures:
        child.value(c)
    bb = child.bb
    params = [g.Var(safe_name(n), s) for n, s in formals]
    with bb.function(name):
        with bb.dataflow():
            outs = convert_subgraph(child, graph, {n: p for (n, _), p in zip(formals, params)})
            results = []
            for k, o in enumerate(outs):
                e = g.const(np.asarray(o)) if isinstance(o, (np.ndarray, np.generic)) else o
                if not isinstance(e.struct_info, (g.TensorStructInfo, *HOST_VALUE_SINFO)):
                    raise node.error(f"output {k} of {name} is {e.struct_info}; tensors, "
                                     "sequences and optionals cross a subgraph")
                results.append(bb.emit_output(e, f"out{k}"))
        bb.emit_func_output(results, params=[*params, *(v for _, v in
                                                         child.captures.values())])
    func = bb.get()[name]
    gvar = child.sink.add_func(func, name)
    gvar = g.GlobalVar(gvar.name, struct_info=func.struct_info)
    return SubgraphFunction(gvar, [(n, outer) for n, (outer, _) in child.captures.items()],
                            [r.struct_info for r in results])


def outer_vars(exprs: Sequence[Any]) -> set[int]:
    """The symbolic dims the caller knows (their ids): those in the shapes of ``exprs``."""
    out: set[int] = set()
    for e in exprs:
        sinfo = getattr(e, "struct_info", None)
        if isinstance(sinfo, g.TensorStructInfo) and sinfo.shape is not None:
            for d in sinfo.shape:
                out.update(id(v) for v in tir.collect_vars(d))
    return out


def result_dims(candidates: Sequence[Any], known: set[int], base: str) -> tuple[Any, ...]:
    """The shape the caller gives a result: per dim, the candidates' dim (one per branch) when
    they agree and use only ``known`` symbols, else a fresh symbolic dim ``{base}_d{i}``."""
    rank = len(candidates[0])
    dims = []
    for i in range(rank):
        ds = [c[i] for c in candidates]
        first = ds[0]
        if (all(dims_equal(first, d) for d in ds[1:])
                and {id(v) for v in tir.collect_vars(first)} <= known):
            dims.append(first)
        else:
            dims.append(tir.Var(f"{base}_d{i}", "int64"))
    return tuple(dims)


def outer_names(graph: Any) -> list[str]:
    """The outer-scope values ONNX subgraph ``graph`` uses (nested subgraphs included), in
    first-use order: names read by its nodes that it does not define itself."""
    defined = {vi.name for vi in graph.input} | {i.name for i in graph.initializer}
    used: dict[str, None] = {}
    for node in graph.node:
        for name in node.input:
            if name and name not in defined:
                used.setdefault(name)
        for attr in node.attribute:
            for sub in ([attr.g] if attr.HasField("g") else []) + list(attr.graphs):
                for name in outer_names(sub):
                    if name not in defined:
                        used.setdefault(name)
        defined.update(o for o in node.output if o)
    return list(used)
