"""Helpers shared by the operator tests (tests/op): graph-level inference and numerics.

The operator tests check two things per op: the StructInfo a call normalizes to (``tvar``,
``infer``, ``dims``) and the numbers its te compute + CPU schedule produce (``run_cases``,
``check``, ``check_exact``). Numeric cases are compiled in batches, many cases per generated C
module, because compiling a module is what dominates a test's run time. With
``KILN_TEST_TARGETS=c,opencl`` every case also runs on the GPU targets listed and must match the
CPU's result (:mod:`kiln.testing.gpu_testing`).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

import numpy as np

from kiln import te, tir
from kiln.build import build as kiln_build
from kiln.codegen import c as codegen_c
from kiln.codegen.gpu.build import build as gpu_build
from kiln.graph.block_builder import BlockBuilder
from kiln.graph.expr import Var
from kiln.graph.struct_info import StructInfo, TensorStructInfo
from kiln.op.registry import get_op_def
from kiln.schedule import lookup_schedule
from kiln.schedule.gpu import schedule_prim_func as gpu_schedule_prim_func
from kiln.target import Target
from kiln.testing.gpu_testing import (
    assert_close,
    compile_test_targets,
    draws_fresh_seed,
    gpu_test_targets,
)
from kiln.tir.schedule import Schedule

# An op case: (registered op name, inputs, attribute keywords). An input is an array, or a list
# of arrays for a variadic input (e.g. concat's tensors).
Case = tuple[str, Sequence[Any], dict[str, Any]]


def tvar(name: str, shape: Any, dtype: str = "float32", ndim: int = -1) -> Var:
    """A graph variable of tensor type (``shape`` None: unknown shape of rank ``ndim``)."""
    return Var(name, TensorStructInfo(shape, dtype, ndim))


def infer(call: Any) -> StructInfo:
    """The StructInfo that normalizing ``call`` in a fresh BlockBuilder infers for it."""
    return BlockBuilder().normalize(call).struct_info


def dims(sinfo: TensorStructInfo) -> tuple:
    """``sinfo``'s shape with constant dimensions as ints and symbolic ones left as tir exprs."""
    return tuple(d.value if isinstance(d, tir.IntImm) else d for d in sinfo.shape)


def graph_module(fn: Callable[..., Any], shapes: Sequence[Sequence[int]],
                 dtype: str | Sequence[str] = "float32") -> Any:
    """The module ``main(x0, x1, ...) = fn(x0, x1, ...)``: one ``dtype`` variable per shape of
    ``shapes`` (or a dtype per shape), ``fn`` building the graph of ops over them (the one-op
    models of the target tests)."""
    bb = BlockBuilder()
    dtypes = [dtype] * len(shapes) if isinstance(dtype, str) else list(dtype)
    xs = [Var(f"x{i}", TensorStructInfo(tuple(s), dt))
          for i, (s, dt) in enumerate(zip(shapes, dtypes))]
    with bb.function("main", xs):
        with bb.dataflow():
            out = bb.emit_output(fn(*xs))
        bb.emit_func_output(out)
    return bb.get()


def run_graph(fn: Callable[..., Any], *arrays: np.ndarray, target: str = "c") -> Any:
    """Build ``main(*arrays) = fn(bb, *vars)`` (a graph of ops over one variable per array, the
    BlockBuilder first for ops that emit steps) for ``target`` and run it on ``arrays``."""
    bb = BlockBuilder()
    params = [Var(f"x{i}", TensorStructInfo(a.shape, a.dtype.name)) for i, a in enumerate(arrays)]
    with bb.function("main"):
        with bb.dataflow():
            out = bb.emit_output(fn(bb, *params))
        bb.emit_func_output(out, params=params)
    return kiln_build(bb.get(), target)(*arrays)


def rand(
    rng: np.random.Generator,
    shape: Any,
    dtype: str = "float32",
    lo: float | None = None,
    hi: float | None = None,
    *,
    scale: float = 1.0,
    int_range: tuple[int, int] = (-4, 4),
) -> np.ndarray:
    """A random array drawn from ``rng`` (each test file keeps its own seeded generator).

    bool: fair coin flips. Integers: uniform over ``[lo, hi]`` when given, else ``int_range``
    (both inclusive). Floats: uniform over ``[lo, hi)`` when given, else standard normal times
    ``scale``. Test files bind their generator and defaults with ``make_rand``.
    """
    kind = np.dtype(dtype).kind
    if kind == "b":
        return rng.random(shape) < 0.5
    if kind in "iu":
        low, high = (int(lo), int(hi)) if lo is not None else int_range
        return rng.integers(low, high + 1, size=shape).astype(dtype)
    if lo is not None:
        return rng.uniform(lo, hi, size=shape).astype(dtype)
    return (rng.standard_normal(shape) * scale).astype(dtype)


def make_rand(
    rng: np.random.Generator,
    lo: float | None = None,
    hi: float | None = None,
    *,
    int_range: tuple[int, int] = (-4, 4),
) -> Callable[..., np.ndarray]:
    """``rand`` bound to a file's generator and default ranges.

    The result is called as ``rand(shape, dtype="float32", lo=..., hi=..., *, scale=1.0)``;
    ``lo``/``hi`` given there override the bound ones for that call.
    """

    def bound(
        shape: Any,
        dtype: str = "float32",
        lo: float | None = lo,
        hi: float | None = hi,
        *,
        scale: float = 1.0,
    ) -> np.ndarray:
        return rand(rng, shape, dtype, lo, hi, scale=scale, int_range=int_range)

    return bound


def _compile_case(
    name: str, args: Sequence[Any], attrs: dict[str, Any], schedule: bool, target: Target
) -> tuple[tir.PrimFunc, list[np.ndarray], list[te.Tensor], bool]:
    """Lower one case; returns (func, flat C-contiguous inputs, outputs, output-is-a-tuple)."""
    opdef = get_op_def(name)
    grouped, flat_ph, flat_arr = [], [], []
    for j, a in enumerate(args):
        group = a if isinstance(a, list) else [a]
        phs = [
            te.placeholder(x.shape, x.dtype, name=f"in{j}_{i}" if isinstance(a, list) else f"in{j}")
            for i, x in enumerate(group)
        ]
        grouped.append(phs if isinstance(a, list) else phs[0])
        flat_ph += phs
        flat_arr += [np.array(x, order="C") for x in group]
    out = opdef.compute(*grouped, attrs=opdef.make_attrs(**attrs))
    outs = list(out) if isinstance(out, tuple) else [out]

    sch = Schedule(te.create_prim_func([*flat_ph, *outs]))
    if schedule:
        lookup_schedule(name, target)(sch, target)
    return sch.func, flat_arr, outs, isinstance(out, tuple)


def scheduled(
    name: str,
    arrays: Sequence[Any],
    attrs: dict[str, Any],
    schedule: bool = True,
    target: Target | None = None,
) -> tuple[tir.PrimFunc, Any]:
    """The op's PrimFunc for inputs shaped like ``arrays`` (its schedule applied unless
    ``schedule`` is False) and its output tensor (a tuple for tuple-valued ops)."""
    func, _, outs, is_tuple = _compile_case(name, arrays, attrs, schedule, Target.create(target))
    return func, tuple(outs) if is_tuple else outs[0]


def run_cases(
    cases: Sequence[Case], schedule: bool = True, target: Target | None = None
) -> list[Any]:
    """Compile ``(op_name, inputs, attrs)`` cases into one C module and run each.

    Each case goes through the op's te compute and (unless ``schedule`` is False) the target's
    schedule for it. Output buffers are poisoned first (NaN for floats, 77 otherwise) so that a
    kernel which leaves part of its output unwritten fails the comparison. Returns one result
    per case: an array, or a tuple of arrays for tuple-valued ops.
    """
    target = Target.create(target)
    funcs, plans = {}, []
    for k, (name, args, attrs) in enumerate(cases):
        funcs[f"case{k}"], arrays, outs, is_tuple = _compile_case(
            name, args, attrs, schedule, target
        )
        plans.append((arrays, outs, is_tuple))
    mod = codegen_c.build(funcs, target)
    results = []
    for k, (arrays, outs, is_tuple) in enumerate(plans):
        bufs = [np.empty(tuple(d.value for d in o.shape), o.dtype.to_numpy()) for o in outs]
        for buf in bufs:
            buf.fill(np.nan if buf.dtype.kind == "f" else 77)
        mod[f"case{k}"](*arrays, *bufs)
        results.append(tuple(bufs) if is_tuple else bufs[0])
    for gpu in gpu_test_targets():
        _check_on_gpu(cases, results, gpu)
    for gpu in compile_test_targets():
        _gpu_module(cases, gpu)  # NVRTC compiles it; nothing runs
    return results


def _gpu_module(cases: Sequence[Case], target: Target) -> tuple[Any, list[Any]]:
    """``cases`` built for a GPU target (the op's GPU schedule or the generic rules): the
    module and per case (inputs, outputs, is_tuple)."""
    funcs, plans = {}, []
    for k, (name, args, attrs) in enumerate(cases):
        func, arrays, outs, is_tuple = _compile_case(name, args, attrs, False, target)
        # as LegalizeOps names it, so that the op's own GPU schedule (if any) is the one used
        func = func.with_attr("op_name", name).with_attr(
            "op_pattern", int(get_op_def(name).pattern))
        funcs[f"case{k}"] = gpu_schedule_prim_func(func, target)
        plans.append((arrays, outs, is_tuple))
    return gpu_build(funcs, target), plans


def _check_on_gpu(cases: Sequence[Case], results: list[Any], target: Target) -> None:
    """Run ``cases`` on a GPU target and compare with the CPU's ``results`` (see
    :mod:`kiln.testing.gpu_testing`)."""
    mod, plans = _gpu_module(cases, target)
    exact = not draws_fresh_seed(mod)
    for k, ((arrays, outs, is_tuple), cpu) in enumerate(zip(plans, results)):
        bufs = [np.empty(tuple(d.value for d in o.shape), o.dtype.to_numpy()) for o in outs]
        for buf in bufs:
            buf.fill(np.nan if buf.dtype.kind == "f" else 77)
        mod[f"case{k}"](*arrays, *bufs)
        got = tuple(bufs) if is_tuple else bufs[0]
        name, _, attrs = cases[k]
        assert_close(got, cpu, f"{target.kind}: {name} {attrs}", exact)


def check(out: np.ndarray, ref: Any, rtol: float = 1e-5, check_shape: bool = True) -> None:
    """Compare with a relative tolerance and an absolute floor scaled to ``ref``'s magnitude,
    so that near-zero entries of a large result are not held to a relative bound."""
    ref = np.asarray(ref)
    if check_shape:
        assert out.shape == ref.shape
    scale = float(np.max(np.abs(ref))) if ref.size else 1.0
    np.testing.assert_allclose(out, ref, rtol=rtol, atol=rtol * max(scale, 1.0))


def check_exact(
    cases: Sequence[Case], expected: Sequence[Any], target: Target | None = None
) -> None:
    """Run ``cases`` and require each result to equal ``expected`` exactly (shape and dtype
    too); an expected list/tuple stands for a tuple-valued op's outputs."""
    for (name, _, attrs), got, want in zip(cases, run_cases(cases, target=target), expected):
        if isinstance(want, (list, tuple)):
            assert isinstance(got, tuple) and len(got) == len(want), (name, attrs)
            for g, w in zip(got, want):
                assert g.shape == w.shape and g.dtype == w.dtype, (name, attrs)
                np.testing.assert_array_equal(g, w, err_msg=f"{name} {attrs}")
        else:
            assert got.shape == want.shape and got.dtype == want.dtype, (name, attrs, got.shape)
            np.testing.assert_array_equal(got, want, err_msg=f"{name} {attrs}")
