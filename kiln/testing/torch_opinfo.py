"""PyTorch's own operator tests (OpInfo) run through ``torch.export`` and kiln.

``torch.testing._internal.common_methods_invocations.op_db`` lists every PyTorch operator with
sample inputs. For each op and float32 sample, :func:`cases` wraps the call in a module whose
inputs are the sample's tensors (every other argument is baked in), exports it with
``torch.export`` and records eager's result; :func:`run` imports the exportable ones with
``from_exported_program``, compiles them many per kiln build (one C library for a batch of
cases: compiling dominates the time) and compares with eager.

Exporting dominates the time of a whole sweep (about half a second a sample, some 19000
samples), so :func:`cases` can keep each exported case in a cache directory (the program
saved with ``torch.export.save``, the inputs and eager's result with ``torch.save``) and later
sweeps import and compile from there.

A sample that ``torch.export`` cannot export (or whose exported program disagrees with eager)
is not kiln's to pass: it is counted apart. Ops that cannot be compared at all (random
results, uninitialized memory) are in ``kiln.frontend.torch.exclusions``.
"""

from __future__ import annotations

import contextlib
import io
import os
import time
import warnings
from collections.abc import Iterable, Iterator
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from kiln.build import build
from kiln.frontend.torch import from_exported_program
from kiln.frontend.torch.exclusions import EXCLUDED_OPS
from kiln.frontend.torch.tensors import to_numpy
from kiln.ir.module import IRModule

#: Tolerances of the comparison with eager (float results).
RTOL = 1e-5
ATOL = 1e-5

#: Ops whose vectors are unique only up to sign (eigenvectors; singular vector pairs, a ``U``
#: column and the matching ``V`` column or ``Vh`` row flipping together): how their results
#: hold them. See :func:`align_signs`.
SIGN_FREE = {"linalg.eigh": "eigh", "svd": "svd_v", "linalg.svd": "svd_vh"}


@dataclass
class Case:
    """One float32 sample of one OpInfo."""

    op: str
    index: int
    inputs: tuple[Any, ...] = ()
    expected: Any = None
    program: Any = None
    #: why the sample is not a kiln test (not exportable, export disagrees with eager)
    not_exportable: str | None = None
    #: the result: None (not run), "pass", or the failure message
    result: str | None = None
    stage: str = ""
    extra: dict[str, Any] = field(default_factory=dict)

    @property
    def exportable(self) -> bool:
        """Whether the sample is a kiln test: exported, and the program agrees with eager
        (checked when kiln's result differs)."""
        return self.program is not None and self.not_exportable is None

    @property
    def key(self) -> str:
        return f"{self.op}#{self.index}"


def op_names(ops: Iterable[Any] | None = None) -> list[str]:
    """OpInfo names (``name`` or ``name.variant``) of every float32-capable op in op_db."""
    return [_full_name(o) for o in (ops or _float32_ops())]


def _full_name(opinfo: Any) -> str:
    return opinfo.name + (f".{opinfo.variant_test_name}" if opinfo.variant_test_name else "")


def _float32_ops() -> list[Any]:
    import torch
    from torch.testing._internal.common_methods_invocations import op_db

    return [o for o in op_db if torch.float32 in o.supported_dtypes("cpu")]


def _module(fn: Any, sample: Any) -> tuple[Any, tuple[Any, ...]]:
    """A module computing ``fn(sample.input, *sample.args, **sample.kwargs)`` from the
    sample's tensors only (in pytree order); other leaves are kept as constants. Named tuple
    results (``torch.return_types``) come back as plain tuples."""
    import torch
    from torch.utils import _pytree as pytree

    leaves, spec = pytree.tree_flatten((sample.input, sample.args, sample.kwargs))
    where = [i for i, v in enumerate(leaves) if isinstance(v, torch.Tensor)]
    consts = list(leaves)

    class OpCall(torch.nn.Module):
        def forward(self, *tensors: Any) -> Any:
            vals = list(consts)
            for i, t in zip(where, tensors):
                vals[i] = t
            inp, args, kwargs = pytree.tree_unflatten(vals, spec)
            out = fn(inp, *args, **kwargs)
            # torch.return_types named tuples as plain ones (a saved program cannot name them)
            return tuple(out) if type(out).__module__ == "torch.return_types" else out

    return OpCall(), tuple(leaves[i] for i in where)


def _same(a: Any, b: Any) -> bool:
    """Whether two eager results are the same values (NaNs equal)."""
    import torch
    from torch.utils import _pytree as pytree

    la, sa = pytree.tree_flatten(a)
    lb, sb = pytree.tree_flatten(b)
    if sa != sb or len(la) != len(lb):
        return False
    for x, y in zip(la, lb):
        if isinstance(x, torch.Tensor) != isinstance(y, torch.Tensor):
            return False
        if isinstance(x, torch.Tensor):
            if x.shape != y.shape or x.dtype != y.dtype:
                return False
            if not torch.equal(torch.nan_to_num(x.float(), 1.0),
                               torch.nan_to_num(y.float(), 1.0)):
                if not torch.allclose(x.float(), y.float(), rtol=1e-6, atol=1e-6,
                                      equal_nan=True):
                    return False
        elif x != y and not (x != x and y != y):
            return False
    return True


def cases(names: Iterable[str] | None = None, max_samples: int | None = None,
          cache: str | None = None, shard: tuple[int, int] = (0, 1)) -> Iterator[Case]:
    """Every float32 sample of the named ops (all float32-capable ops by default), exported;
    excluded ops (``EXCLUDED_OPS``) are skipped. ``cache``: a directory where each exported
    case is kept (and read back when it is there); ``shard=(k, n)``: only the ops at
    positions ``k mod n`` of op_db (to export in several processes)."""
    import torch

    wanted = set(names) if names is not None else None
    for position, opinfo in enumerate(_float32_ops()):
        name = _full_name(opinfo)
        if (wanted is not None and name not in wanted) or name in EXCLUDED_OPS or (
                position % shard[1] != shard[0]):
            continue
        cached = _cached_cases(cache, name, max_samples)
        if cached is not None:
            yield from cached
            continue
        try:
            samples = list(opinfo.sample_inputs("cpu", torch.float32, requires_grad=False))
        except Exception as err:  # noqa: BLE001 - a broken sample generator
            samples, broken = [], Case(name, 0, not_exportable=f"sample_inputs failed: {err}")
        else:
            broken = None
        done = [broken] if broken is not None else [
            _export_case(opinfo, name, index, sample)
            for index, sample in enumerate(samples[:max_samples])]
        _save_cases(cache, name, done, max_samples)
        yield from done


def _cache_stem(cache: str, name: str, max_samples: int | None) -> str:
    return os.path.join(cache, f"{name}@{max_samples or 'all'}")


def _save_cases(cache: str | None, name: str, done: list[Case], max_samples: int | None
                ) -> None:
    """Keep an op's exported cases: one ``.pt2`` per program, one ``.pt`` file for the rest
    (written last, so an interrupted sweep never leaves a half-kept op). An op torch cannot
    serialize is not kept (a later sweep exports it again), so caching never changes which
    samples count as exportable."""
    if cache is None:
        return
    import torch
    from torch.utils import _pytree as pytree

    def own(v: Any) -> Any:  # tensors with storages of their own (views cannot be saved)
        return v.detach().clone() if isinstance(v, torch.Tensor) else v

    os.makedirs(cache, exist_ok=True)
    stem = _cache_stem(cache, name, max_samples)
    records = []
    try:
        for case in done:
            program = None
            if case.program is not None:
                program = f"{stem}#{case.index}.pt2"
                _atomic(program, lambda path, c=case: torch.export.save(c.program, path))
            records.append({"op": case.op, "index": case.index,
                            "inputs": pytree.tree_map(own, case.inputs),
                            "expected": pytree.tree_map(own, case.expected),
                            "not_exportable": case.not_exportable, "program": program})
        _atomic(stem + ".pt", lambda path: torch.save(records, path))
    except Exception:  # noqa: BLE001 - programs or values torch cannot serialize: not kept
        if os.path.exists(stem + ".pt"):
            os.remove(stem + ".pt")


def _atomic(path: str, write: Any) -> None:
    """``write(tmp)`` then a rename onto ``path``: sweeps sharing a cache never read a file
    another one is still writing."""
    root, ext = os.path.splitext(path)
    tmp = f"{root}.{os.getpid()}.tmp{ext}"  # torch.export.save wants the .pt2 ending
    write(tmp)
    os.replace(tmp, path)


def _cached_cases(cache: str | None, name: str, max_samples: int | None
                  ) -> list[Case] | None:
    if cache is None or not os.path.exists(_cache_stem(cache, name, max_samples) + ".pt"):
        return None
    import torch

    out = []
    try:
        records = torch.load(_cache_stem(cache, name, max_samples) + ".pt", weights_only=False)
        for r in records:
            case = Case(r["op"], r["index"], r["inputs"], r["expected"],
                        not_exportable=r["not_exportable"])
            if r["program"] is not None:
                case.program = torch.export.load(r["program"])
            out.append(case)
    except Exception:  # noqa: BLE001 - an unreadable entry: exported again
        return None
    return out


def _export_case(opinfo: Any, name: str, index: int, sample: Any) -> Case:
    import torch

    case = Case(name, index)
    module, inputs = _module(opinfo.op, sample)
    if any(t.layout != torch.strided for t in inputs):
        case.not_exportable = "sparse or other non-strided tensors"
        return case
    case.inputs = inputs
    try:
        with torch.no_grad():
            case.expected = module(*inputs)
    except Exception as err:  # noqa: BLE001 - a sample eager itself rejects
        case.not_exportable = f"eager fails: {type(err).__name__}"
        return case
    try:
        with warnings.catch_warnings(), contextlib.redirect_stderr(io.StringIO()):
            warnings.simplefilter("ignore")
            ep = torch.export.export(module, inputs, strict=False)
            case.program = ep.run_decompositions()
    except Exception as err:  # noqa: BLE001 - torch.export's own limits
        case.not_exportable = f"export fails: {type(err).__name__}: {str(err)[:120]}"
    return case


def export_agrees(case: Case) -> bool:
    """Whether the exported program itself computes eager's result (checked for cases kiln
    fails: a program torch.export got wrong is not kiln's to pass)."""
    import torch

    try:
        with torch.no_grad(), warnings.catch_warnings():
            warnings.simplefilter("ignore")
            again = case.program.module()(*case.inputs)
        return _same(case.expected, again)
    except Exception:  # noqa: BLE001 - a program that does not run, or results torch
        return False  # cannot compare (sparse)


def compare(got: Any, expected: Any) -> str | None:
    """None when kiln's result matches eager's (structure, dtypes, values within RTOL/ATOL),
    else what differs."""
    import torch
    from torch.utils import _pytree as pytree

    want, spec = pytree.tree_flatten(expected)
    have, spec_got = pytree.tree_flatten(_as_tree(got, expected))
    if len(want) != len(have):
        return f"{len(have)} results, eager has {len(want)}"
    for i, (h, w) in enumerate(zip(have, want)):
        if not isinstance(w, torch.Tensor):
            if h != w:
                return f"result {i}: {h!r} != {w!r}"
            continue
        ref = to_numpy(w)
        out = np.asarray(h)
        if out.shape != ref.shape:
            return f"result {i}: shape {out.shape} != {ref.shape}"
        if out.dtype != ref.dtype:
            return f"result {i}: dtype {out.dtype} != {ref.dtype}"
        if ref.dtype.kind in "fcV" or ref.dtype.name == "bfloat16":
            out, ref = out.astype(np.float64), ref.astype(np.float64)
            if not np.allclose(out, ref, rtol=RTOL, atol=ATOL, equal_nan=True):
                bad = ~np.isclose(out, ref, rtol=RTOL, atol=ATOL, equal_nan=True)
                err = np.nanmax(np.abs(out[bad].astype(np.float64) - ref[bad]))
                return f"result {i}: {int(bad.sum())} of {ref.size} values differ (max {err:.3g})"
        elif not np.array_equal(out, ref):
            return f"result {i}: {int((out != ref).sum())} of {ref.size} values differ"
    return None


def align_signs(op: str, got: Any, expected: Any) -> tuple[Any, str | None]:
    """kiln's result for a :data:`SIGN_FREE` op with each vector's sign set to eager's (the
    sign of its dot product with eager's), and None -- or what differs when kiln's factors do
    not reconstruct the matrix eager's reconstruct (``V diag(w) Vᵀ``, ``U diag(s) Vᵀ``, in
    float64, within RTOL/ATOL). The aligned result is then compared as any other (the same
    tolerances), so a vector that differs by more than its sign still fails."""
    kind = SIGN_FREE[op]
    got = [np.asarray(x) for x in got]
    want = [to_numpy(x) for x in expected]
    if any(x.shape != y.shape for x, y in zip(got, want)) or any(x.size == 0 for x in got):
        return got, None  # the plain comparison reports it (or there is nothing to align)
    if kind == "eigh":
        (w, v), (w0, v0) = got, want
        u, s, vt, u0, s0, vt0 = v, w, v.swapaxes(-1, -2), v0, w0, v0.swapaxes(-1, -2)
    else:
        (u, s, v), (u0, s0, v0) = got, want
        vt, vt0 = (v.swapaxes(-1, -2), v0.swapaxes(-1, -2)) if kind == "svd_v" else (v, v0)
    k = s.shape[-1]

    def rebuilt(u: Any, s: Any, vt: Any) -> Any:
        return (u[..., :, :k].astype(np.float64) * s[..., None, :]) @ vt[..., :k, :]

    if not np.allclose(rebuilt(u, s, vt), rebuilt(u0, s0, vt0), rtol=RTOL, atol=ATOL,
                       equal_nan=True):
        return got, "the factors do not reconstruct eager's matrix"
    def signs(x: Any, y: Any, axis: int) -> Any:  # +-1 per vector of x along axis
        return np.where(np.sum(x * y, axis=axis) < 0, -1, 1).astype(x.dtype)

    flip = signs(u, u0, -2)  # one per U column; a V vector takes its U column's sign
    if kind == "eigh":
        return [w, u * flip[..., None, :]], None
    axis = -2 if kind == "svd_v" else -1  # V's vectors are its columns, Vh's its rows
    flip_v = signs(v, v0, axis)
    flip_v[..., :k] = flip[..., :k]
    v = v * (flip_v[..., None, :] if kind == "svd_v" else flip_v[..., :, None])
    return [u * flip[..., None, :], s, v], None


def _as_tree(got: Any, expected: Any) -> Any:
    """kiln's result in eager's container types (tuples for named tuples and lists)."""
    import torch

    if isinstance(expected, torch.Tensor) or not isinstance(expected, (tuple, list)):
        return got
    items = [_as_tree(g, e) for g, e in zip(got, expected)]
    if isinstance(expected, list):
        return items
    return type(expected)(*items) if hasattr(expected, "_fields") else tuple(items)


def run(all_cases: list[Case], batch: int = 32, log: Any = None) -> None:
    """Import, compile (``batch`` cases per kiln build) and run every exportable case, setting
    ``case.result`` (and ``case.stage`` of a failure: import, build or run). ``log``: a
    function of one progress line (per build)."""
    pending: list[tuple[Case, Any]] = []
    for case in all_cases:
        if case.program is None:
            continue
        try:
            mod, params = from_exported_program(case.program, bind_params=True,
                                                run_decompositions=False)
        except Exception as err:  # noqa: BLE001 - recorded per case
            case.result, case.stage = f"{type(err).__name__}: {err}", "import"
            if not export_agrees(case):
                case.not_exportable = "the exported program disagrees with eager"
            continue
        pending.append((case, mod))
    for start in range(0, len(pending), batch):
        group = [(f"case{start + i}", case, mod)
                 for i, (case, mod) in enumerate(pending[start:start + batch])]
        t0 = time.perf_counter()
        try:
            exe = build(_merge([(name, mod) for name, _, mod in group]))
            if log is not None:
                log(f"built {len(group)} cases ({group[0][1].key} ...) in "
                    f"{time.perf_counter() - t0:.1f} s")
        except Exception:  # noqa: BLE001 - find the culprits one by one
            if log is not None:
                log(f"build of {len(group)} cases ({group[0][1].key} ...) failed; one by one")
            for name, case, mod in group:
                try:
                    one = build(_merge([(name, mod)]))
                except Exception as err:  # noqa: BLE001
                    case.result, case.stage = f"{type(err).__name__}: {err}"[:400], "build"
                    continue
                _run_one(case, one, name)
            continue
        for name, case, _ in group:
            _run_one(case, exe, name)


def _merge(named: list[tuple[str, Any]]) -> Any:
    """One IRModule holding each module's ``main`` under the given name."""
    return IRModule({name: mod["main"] for name, mod in named})


def _run_one(case: Case, exe: Any, name: str) -> None:
    try:
        got = exe[name](*[to_numpy(t) for t in case.inputs])
    except Exception as err:  # noqa: BLE001
        case.result, case.stage = f"{type(err).__name__}: {err}"[:400], "run"
        return
    try:
        diff = None
        if case.op in SIGN_FREE:
            got, diff = align_signs(case.op, got, case.expected)
        diff = diff or compare(got, case.expected)
    except Exception as err:  # noqa: BLE001 - results numpy cannot hold (complex, sparse)
        diff = f"not comparable: {type(err).__name__}: {err}"[:200]
    case.result = "pass" if diff is None else diff
    case.stage = "" if diff is None else "compare"
    if diff is not None and not export_agrees(case):
        case.not_exportable = "the exported program disagrees with eager"
