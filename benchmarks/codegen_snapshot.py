"""Snapshot of the C that kiln generates, to prove a refactoring changes no generated code.

    python benchmarks/codegen_snapshot.py OUT_DIR               # write the snapshot
    python benchmarks/codegen_snapshot.py OUT_DIR --compare REF # write it, then diff against REF
    python benchmarks/codegen_snapshot.py OUT_DIR --only resnet # cases whose name contains it

What it builds (``kiln.build``, target ``"c"``), each written as ``<case>.c`` (the whole
library's source, ``Executable.module.source``: every kernel and the whole-model entry) next to
``<case>.plan.json`` (the execution plans with a SHA-256 of every constant, so constant folding
and layout rewrites of the weights are compared too):

- the networks of ``benchmarks/models.py`` that build without downloads (ResNet-18,
  MobileNetV2, the MLP at batch 1 and 64, the BERT-style encoder; exported from PyTorch with
  seeded random weights) and the bundled demo model ``examples/models/demo_resnet.onnx``, at
  the default opt level;
- one ONNX backend node test per operator type (the first case of that type kiln runs), at opt
  levels 2 (fused) and 0 (every op legalized and scheduled on its own);
- graph functions calling kiln's operators directly, for those no ONNX node reaches (gradient
  adjoint ops, the NCHWc and packed-GEMM ops, collapse/reduce helpers), at opt levels 2 and 0.

The comparison lists every case whose files differ or exist on one side only and exits with
status 1 if there is any. Cases are built in parallel (``-j``, default the CPU count); kernels
compile once into kiln's cache, so a run on an unchanged compiler is mostly Python.
"""

from __future__ import annotations

import argparse
import difflib
import hashlib
import json
import multiprocessing as mp
import os
import sys
import warnings
from collections.abc import Callable
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))  # snapshot the tree this script is in, not an installed kiln
DEMO = ROOT / "examples" / "models" / "demo_resnet.onnx"
sys.path.insert(0, str(ROOT / "benchmarks"))
from models import CASES as NETWORKS  # noqa: E402 - name -> (torch_models name, batch)


# ---------------------------------------------------------------------------------------------
# what a case writes
# ---------------------------------------------------------------------------------------------
def _plan_json(exe) -> str:
    dtypes: dict = {}
    plans = {}
    for name, plan in sorted(exe.plans.items()):
        for spec in plan.slots:
            dtypes.setdefault(spec.dtype, len(dtypes))
        pj = plan.to_json(dtypes)
        pj["constants"] = {
            str(slot): [list(arr.shape), str(arr.dtype),
                        hashlib.sha256(np.ascontiguousarray(arr).tobytes()).hexdigest()]
            for slot, arr in sorted(plan.constants.items())
        }
        plans[name] = pj
    return json.dumps({"dtypes": [str(d) for d in dtypes], "plans": plans}, indent=1,
                      sort_keys=True, default=str)


def _write(out: Path, case: str, exe) -> None:
    (out / f"{case}.c").write_text(exe.module.source)
    (out / f"{case}.plan.json").write_text(_plan_json(exe))


def _build(mod, params, opt_level: int):
    import kiln
    from kiln.transform import PassContext

    with PassContext(opt_level=opt_level):
        return kiln.build(mod, params=params)


# ---------------------------------------------------------------------------------------------
# the cases
# ---------------------------------------------------------------------------------------------
def _network(name: str) -> Callable[[Path], None]:
    def run(out: Path) -> None:
        from kiln.frontend.onnx import from_onnx
        from kiln.testing import torch_models

        model_name, batch = NETWORKS[name]
        data, _ = torch_models.onnx_model(model_name, batch)
        mod, params = from_onnx(data)
        _write(out, f"model_{name}", _build(mod, params, 2))

    return run


def _demo(out: Path) -> None:
    from kiln.frontend.onnx import from_onnx

    mod, params = from_onnx(str(DEMO))
    _write(out, "model_demo_resnet", _build(mod, params, 2))


def _node_cases() -> dict[str, object]:
    """The first node test kiln runs of every ONNX operator type, by case name."""
    from onnx.backend.test.loader import load_model_tests

    from kiln.frontend.onnx.exclusions import exclusion_reason

    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        cases = sorted(load_model_tests(kind="node"), key=lambda c: c.name)
    chosen: dict[str, object] = {}
    seen: set[str] = set()
    for case in cases:
        types = frozenset(n.op_type for n in case.model.graph.node)
        if len(types) != 1 or types <= seen or exclusion_reason(case.model, case.name):
            continue
        seen |= types
        chosen[case.name] = case.model
    return chosen


def _node(name: str) -> Callable[[Path], None]:
    def run(out: Path) -> None:
        from kiln.frontend.onnx import from_onnx

        model = _node_cases()[name]
        for level in (2, 0):
            mod, params = from_onnx(model)
            _write(out, f"{name}.O{level}", _build(mod, params, level))

    return run


def _op_graphs() -> dict[str, Callable[[], object]]:
    """Graph functions of kiln ops that no ONNX node reaches, by case name."""
    from kiln import graph as g
    from kiln import op

    def func(name: str, params: dict[str, tuple], body: Callable[..., list]):
        def make():
            bb = g.BlockBuilder()
            vs = [g.Var(n, g.TensorStructInfo(s, d)) for n, (s, d) in params.items()]
            with bb.function("main", vs):
                outs = [bb.emit(e) for e in body(*vs)]
                bb.emit_func_output(outs[0] if len(outs) == 1 else g.Tuple(outs))
            return bb.get()

        return name, make

    f32 = "float32"
    cases = [
        func("conv2d_backward", {"gy": ((2, 8, 14, 14), f32), "x": ((2, 4, 16, 16), f32),
                                 "w": ((8, 4, 3, 3), f32)},
             lambda gy, x, w: [op.conv2d_backward_data(gy, w, x),
                               op.conv2d_backward_weight(gy, x, w)]),
        func("pool_backward", {"gy": ((2, 4, 8, 8), f32), "x": ((2, 4, 16, 16), f32),
                               "y": ((2, 4, 8, 8), f32)},
             lambda gy, x, y: [
                 op.max_pool2d_backward(gy, x, y, pool_size=(2, 2), strides=(2, 2)),
                 op.avg_pool2d_backward(gy, x, pool_size=(3, 3), strides=(2, 2),
                                           padding=(1, 1, 1, 1))]),
        func("adaptive_pool_backward", {"gy": ((2, 4, 3, 3), f32), "x": ((2, 4, 10, 10), f32),
                                        "y": ((2, 4, 3, 3), f32)},
             lambda gy, x, y: [
                 op.adaptive_avg_pool2d_backward(gy, x, output_size=(3, 3)),
                 op.adaptive_max_pool2d_backward(gy, x, y, output_size=(3, 3))]),
        func("take_slice_pad_backward", {"gy": ((3, 5), f32), "x": ((7, 5), f32),
                                         "gs": ((2, 5), f32), "gp": ((9, 7), f32)},
             lambda gy, x, gs, gp: [
                 op.take_backward(gy, x, g.const(np.array([0, 2, 6], "int64")), axis=0),
                 op.strided_slice_backward(gs, x, begin=[1], end=[5], strides=[2], axes=[0]),
                 op.pad_backward(gp, x, pad_width=[(1, 1), (1, 1)])]),
        func("collapse_sum", {"x": ((4, 3, 5), f32), "t": ((3, 1), f32)},
             lambda x, t: [op.collapse_sum_like(x, t), op.collapse_sum_to(x, shape=(5,)),
                           op.reduce_to(x, shape=(1, 3, 1))]),
        func("nchwc", {"x": ((1, 2, 14, 14, 8), f32)},
             lambda x: [
                 op.nn.conv2d_nchwc(x, g.const(np.ones((4, 2, 3, 3, 8, 8), f32)),
                                    padding=(1, 1, 1, 1)),
                 op.nn.depthwise_conv2d_nchwc(x, g.const(np.ones((2, 1, 3, 3, 8), f32)),
                                              padding=(1, 1, 1, 1))]),
        func("matmul_packed", {"a": ((50, 64), f32)},
             lambda a: [op.matmul_packed(a, g.const(np.ones((2, 64, 16), f32)))]),
        func("layout_transform", {"x": ((1, 16, 7, 7), f32)},
             lambda x: [op.layout_transform(x, "NCHW", "NCHW8c")]),
        func("conv_relu_dense", {"x": ((2, 16, 28, 28), f32)},
             lambda x: [op.nn.relu(op.nn.conv2d(
                 x, g.const(np.ones((32, 16, 3, 3), f32)), padding=(1, 1, 1, 1)))]),
        func("dense_gelu", {"x": ((8, 256), f32)},
             lambda x: [op.gelu(op.dense(x, g.const(np.ones((512, 256), f32))))]),
        func("fast_math", {"x": ((4, 100), f32)},
             lambda x: [op.fast_exp(x), op.fast_tanh(x), op.fast_erf(x), op.fast_sigmoid(x)]),
        func("norms", {"x": ((2, 16, 12, 12), f32), "s": ((8, 64), f32)},
             lambda x, s: [op.nn.batch_norm(x, *(g.const(np.ones(16, f32)) for _ in range(4))),
                           op.nn.layer_norm(s, g.const(np.ones(64, f32)),
                                            g.const(np.zeros(64, f32))),
                           op.nn.log_softmax(s), op.nn.softmax(s)]),
        func("float16_bfloat16", {"x": ((4, 33), "float16"), "y": ((4, 33), "bfloat16")},
             lambda x, y: [op.exp(x), op.sigmoid(op.cast(y, "float32"))]),
    ]
    return dict(cases)


def _op_graph(name: str) -> Callable[[Path], None]:
    def run(out: Path) -> None:
        make = _op_graphs()[name]
        for level in (2, 0):
            _write(out, f"op_{name}.O{level}", _build(make(), None, level))

    return run


def all_cases() -> dict[str, Callable[[Path], None]]:
    cases: dict[str, Callable[[Path], None]] = {f"model_{n}": _network(n) for n in NETWORKS}
    cases["model_demo_resnet"] = _demo
    cases.update({n: _node(n) for n in _node_cases()})
    cases.update({f"op_{n}": _op_graph(n) for n in _op_graphs()})
    return cases


# ---------------------------------------------------------------------------------------------
# running and comparing
# ---------------------------------------------------------------------------------------------
def _run_one(job: tuple[str, str]) -> tuple[str, str]:
    name, out = job
    try:
        all_cases()[name](Path(out))
    except Exception as err:  # noqa: BLE001 - a failing build is part of the snapshot
        Path(out, f"{name}.error.txt").write_text(f"{type(err).__name__}: {err}\n")
        return name, f"{type(err).__name__}: {str(err).splitlines()[0][:200]}"
    return name, ""


def compare(new: Path, ref: Path, cases: set[str] | None = None, context: int = 3) -> list[str]:
    """The files that differ between two snapshot directories (a short diff for each); with
    ``cases``, only the files of those cases (a file ``<case>[.O<n>].<ext>``)."""
    problems = []
    names = sorted({p.name for p in new.iterdir()} | {p.name for p in ref.iterdir()})
    if cases is not None:
        names = [n for n in names if n.split(".")[0] in cases]
    for name in names:
        a, b = ref / name, new / name
        if not a.exists() or not b.exists():
            problems.append(f"{name}: only in {'new' if b.exists() else 'reference'}")
            continue
        ta, tb = a.read_text(), b.read_text()
        if ta != tb:
            diff = list(difflib.unified_diff(ta.splitlines(), tb.splitlines(), str(a), str(b),
                                             n=context, lineterm=""))
            problems.append(f"{name}: differs\n" + "\n".join(diff[:40]))
    return problems


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("out", type=Path, help="directory to write the snapshot to")
    ap.add_argument("--compare", type=Path, metavar="REF", help="snapshot to diff against")
    ap.add_argument("--only", default="", help="only cases whose name contains this")
    ap.add_argument("-j", "--jobs", type=int, default=os.cpu_count() or 1)
    args = ap.parse_args(argv)

    args.out.mkdir(parents=True, exist_ok=True)
    names = [n for n in all_cases() if args.only in n]
    jobs = [(n, str(args.out)) for n in names]
    with mp.get_context("fork").Pool(args.jobs) as pool:
        results = pool.map(_run_one, jobs, chunksize=1)
    failed = [(n, e) for n, e in results if e]
    print(f"{len(names)} cases, {len(failed)} failed to build (kept as .error.txt):")
    for n, e in failed:
        print(f"  {n}: {e}")
    if args.compare is None:
        return 0
    ref = args.compare
    problems = compare(args.out, ref, set(names) if args.only else None)
    files = len([p for p in args.out.iterdir() if p.name.split(".")[0] in names])
    if problems:
        print(f"{len(problems)} of {files} files differ from {ref}:")
        for p in problems:
            print(p)
        return 1
    print(f"all {files} files are byte-identical to {ref}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
