"""The ``kiln`` command: compile ONNX models, print any compilation stage, inspect and run
saved executables."""

from __future__ import annotations

import argparse
import importlib.util
import os
import sys
from typing import Any

import numpy as np

STAGES = ("graph", "optimized", "tir", "scheduled", "lowered", "c", "cuda", "opencl")


def _load_module(spec: str) -> Any:
    """``demo:mlp`` / ``demo:small_cnn``, an ``.onnx`` file (weights bound as constants), or
    ``path/to/file.py`` defining ``module()``."""
    from .testing import models

    if spec.endswith(".onnx"):
        from .frontend.onnx import from_onnx

        return from_onnx(spec, bind_params=True)[0]

    if spec.startswith("demo:"):
        name = spec.split(":", 1)[1]
        builder = getattr(models, name, None)
        if builder is None:
            raise SystemExit(f"kiln: unknown demo model {name!r} (try mlp, small_cnn)")
        return builder().mod
    loader = importlib.util.spec_from_file_location("kiln_user_model", spec)
    if loader is None or loader.loader is None:
        raise SystemExit(f"kiln: cannot load {spec!r}")
    user = importlib.util.module_from_spec(loader)
    loader.loader.exec_module(user)
    if not hasattr(user, "module"):
        raise SystemExit(f"kiln: {spec} must define module() returning an IRModule")
    return user.module()


def cmd_show(args: argparse.Namespace) -> int:
    from .build import default_pipeline, schedule_prim_func
    from .codegen import c as codegen_c
    from .target import Target
    from .tir.function import PrimFunc
    from .tir.transform import lower
    from .transform import PassContext

    mod = _load_module(args.model)
    if args.stage == "graph":
        print(mod)
        return 0
    target = Target.create(args.stage if args.stage in ("cuda", "opencl") else args.target)
    with PassContext(opt_level=args.opt_level):
        mod = default_pipeline(target=target)(mod)
    if args.stage == "optimized":
        print(mod)
        return 0
    funcs = {n: f for n, f in mod.items() if isinstance(f, PrimFunc)}
    if args.func:
        funcs = {n: f for n, f in funcs.items() if n == args.func}
    if args.stage == "tir":
        for f in funcs.values():
            print(f, end="\n\n")
        return 0
    if target.is_gpu:
        return _show_gpu(args.stage, funcs, target)
    funcs = {n: schedule_prim_func(f, target) for n, f in funcs.items()}
    if args.stage == "scheduled":
        for f in funcs.values():
            print(f, end="\n\n")
        return 0
    if args.stage == "lowered":
        for f in funcs.values():
            print(lower(f, target), end="\n\n")
        return 0
    source, _ = codegen_c.generate_source(funcs, target)
    print(source)
    return 0


def _show_gpu(stage: str, funcs: dict[str, Any], target: Any) -> int:
    """The scheduled/lowered TIR or the CUDA/OpenCL source of a GPU target's functions."""
    from .codegen.gpu.build import generate_source
    from .schedule.gpu import schedule_and_lower

    pairs = {n: schedule_and_lower(f, target) for n, f in funcs.items()}
    if stage in ("scheduled", "lowered"):
        for scheduled, lowered in pairs.values():
            print(scheduled if stage == "scheduled" else lowered, end="\n\n")
        return 0
    source, _ = generate_source({n: p[1] for n, p in pairs.items()}, target)
    print(source)
    return 0


def cmd_inspect(args: argparse.Namespace) -> int:
    from .runtime.executable import load

    exe = load(args.file)
    print(exe.summary())
    if args.source:
        print(exe.module.source)
    return 0


def cmd_compile(args: argparse.Namespace) -> int:
    import time

    from .build import build
    from .frontend.onnx import from_onnx
    from .transform import PassContext

    shapes = {}
    for spec in args.shape:
        name, _, dims = spec.partition("=")
        if not dims:
            raise SystemExit(f"kiln: --shape expects NAME=D0,D1,..., got {spec!r}")
        shapes[name] = [int(d) if d.lstrip("-").isdigit() else d for d in dims.split(",")]
    t0 = time.perf_counter()
    mod, params = from_onnx(args.model, shape_dict=shapes or None)
    t1 = time.perf_counter()
    with PassContext(opt_level=args.opt_level):
        exe = build(mod, params=params)
    t2 = time.perf_counter()
    out = args.output or os.path.splitext(args.model)[0] + ".kiln"
    exe.save(out)
    print(f"imported {args.model} in {t1 - t0:.2f} s, compiled {exe.num_kernels} kernels in "
          f"{t2 - t1:.2f} s -> {out}")
    print(exe.summary().splitlines()[1].strip())
    return 0


def _parse_inputs(args: argparse.Namespace, plan: Any) -> dict[str, np.ndarray]:
    """Feeds from ``--input name=file.npy`` / positional .npy files; random for the rest."""
    from .runtime import shape_expr

    feeds: dict[str, np.ndarray] = {}
    for name, path in zip(plan.input_names, args.inputs):
        feeds[name] = np.load(path)
    for spec in args.input:
        name, _, path = spec.partition("=")
        if name not in plan.input_names or not path:
            raise SystemExit(f"kiln: --input {spec!r}: expected NAME=FILE.npy with NAME one of "
                             f"{plan.input_names}")
        feeds[name] = np.load(path)
    dims = {}
    for spec in args.dim:
        name, _, value = spec.partition("=")
        dims[name] = int(value)
    rng = np.random.default_rng(args.seed)
    for name, slot in zip(plan.input_names, plan.input_slots):
        if name in feeds:
            continue
        spec = plan.slots[slot]
        shape = []
        for code in spec.shape:
            try:
                shape.append(shape_expr.evaluate(code, dims))
            except Exception:  # noqa: BLE001 - unbound symbolic dim: default 1, said below
                shape.append(1)
        dt = spec.dtype.to_numpy()
        if dt.kind == "f":
            arr = rng.standard_normal(shape).astype(dt)
        elif dt.kind == "b":
            arr = rng.integers(0, 2, size=shape).astype(bool)
        else:
            arr = rng.integers(0, 10, size=shape).astype(dt)
        print(f"input {name}: random {dt} {tuple(shape)}")
        feeds[name] = arr
    return feeds


def cmd_run(args: argparse.Namespace) -> int:
    import time

    from .runtime.executable import load

    exe = load(args.file)
    if args.threads:
        exe.set_num_threads(args.threads)
    plan = exe.plans["main"] if "main" in exe.plans else next(iter(exe.plans.values()))
    feeds = _parse_inputs(args, plan)
    out = exe(**feeds)
    times = []
    for _ in range(args.repeat):
        t0 = time.perf_counter()
        exe(**feeds)
        times.append(time.perf_counter() - t0)
    outs = out if isinstance(out, tuple) else (out,)
    for i, o in enumerate(outs):
        o = np.asarray(o)
        line = f"output {i}: shape {o.shape} dtype {o.dtype}"
        if o.size and o.dtype.kind in "fiub":
            line += f" min {o.min():.6g} max {o.max():.6g} mean {o.astype(np.float64).mean():.6g}"
        if args.output:
            path = args.output if len(outs) == 1 else f"{args.output}.{i}.npy"
            np.save(path, o)
            line += f" -> {path}"
        print(line)
        if args.print_values:
            print(o)
    if times:
        print(f"latency: median {np.median(times) * 1e3:.3f} ms, min {min(times) * 1e3:.3f} ms "
              f"over {len(times)} runs")
    if args.profile:
        print(exe.profile(repeat=max(args.repeat, 1), **feeds))
    return 0


def main(argv: list[str] | None = None) -> int:
    from . import __version__
    from .ir.errors import KilnError

    parser = argparse.ArgumentParser(prog="kiln", description=__doc__)
    parser.add_argument("--version", action="version", version=f"kiln {__version__}")
    sub = parser.add_subparsers(dest="command", required=True)

    show = sub.add_parser("show", help="print a compilation stage of a model")
    show.add_argument("model",
                      help="demo:mlp, demo:small_cnn, an .onnx file, or a .py defining module()")
    show.add_argument("--stage", choices=STAGES, default="graph")
    show.add_argument("--target", default="c")
    show.add_argument("-O", "--opt-level", type=int, default=2,
                      help="optimization level of the pass pipeline (0-3, default 2)")
    show.add_argument("--func", help="only this PrimFunc (tir/scheduled/lowered stages)")
    show.set_defaults(fn=cmd_show)

    insp = sub.add_parser("inspect", help="summarize a saved executable (.kiln)")
    insp.add_argument("file")
    insp.add_argument("--source", action="store_true", help="also print the generated C")
    insp.set_defaults(fn=cmd_inspect)

    comp = sub.add_parser("compile", help="compile an ONNX model into a saved executable")
    comp.add_argument("model", help="path of the .onnx file")
    comp.add_argument("-o", "--output", help="executable path (default: MODEL with .kiln)")
    comp.add_argument("-O", "--opt-level", type=int, default=2,
                      help="optimization level of the pass pipeline (0-3, default 2)")
    comp.add_argument("--shape", action="append", default=[], metavar="NAME=D0,D1,...",
                      help="input shape (fixes dynamic dimensions; a name keeps one symbolic)")
    comp.set_defaults(fn=cmd_compile)

    run = sub.add_parser("run", help="run a saved executable; prints outputs and latency")
    run.add_argument("file")
    run.add_argument("inputs", nargs="*", help=".npy files for the inputs, in order")
    run.add_argument("--input", action="append", default=[], metavar="NAME=FILE.npy",
                     help="an input by name (inputs not given are random)")
    run.add_argument("--dim", action="append", default=[], metavar="SYM=N",
                     help="value of a symbolic dimension for random inputs (default 1)")
    run.add_argument("--repeat", type=int, default=10, help="timed runs after a warm-up run")
    run.add_argument("--threads", type=int, default=0, help="OpenMP threads (default: all)")
    run.add_argument("--seed", type=int, default=0, help="seed of the random inputs")
    run.add_argument("--print-values", action="store_true", help="print the output arrays")
    run.add_argument("--profile", action="store_true",
                     help="also time every kernel (median per run, slowest first)")
    run.add_argument("-o", "--output", help="write outputs as .npy")
    run.set_defaults(fn=cmd_run)

    args = parser.parse_args(argv)
    try:
        return args.fn(args)
    except KilnError as err:
        print(f"kiln: error: {err}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())
