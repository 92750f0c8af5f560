"""The ``kiln`` command: print any compilation stage, inspect and run saved executables."""

from __future__ import annotations

import argparse
import importlib.util
import sys
from typing import Any

import numpy as np

STAGES = ("graph", "optimized", "tir", "scheduled", "lowered", "c")


def _load_module(spec: str) -> Any:
    """``demo:mlp`` / ``demo:small_cnn``, or ``path/to/file.py`` defining ``module()``."""
    from .testing import models

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
    target = Target.create(args.target)
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


def cmd_inspect(args: argparse.Namespace) -> int:
    from .runtime.executable import load

    exe = load(args.file)
    print(exe.summary())
    if args.source:
        print(exe.module.source)
    return 0


def cmd_run(args: argparse.Namespace) -> int:
    from .runtime.executable import load

    exe = load(args.file)
    inputs = [np.load(p) for p in args.inputs]
    out = exe(*inputs)
    outs = out if isinstance(out, tuple) else (out,)
    for i, o in enumerate(outs):
        if args.output:
            path = args.output if len(outs) == 1 else f"{args.output}.{i}.npy"
            np.save(path, o)
            print(f"output {i}: {o.shape} {o.dtype} -> {path}")
        else:
            print(f"output {i}: shape {o.shape} dtype {o.dtype}\n{o}")
    return 0


def main(argv: list[str] | None = None) -> int:
    from . import __version__
    from .ir.errors import KilnError

    parser = argparse.ArgumentParser(prog="kiln", description=__doc__)
    parser.add_argument("--version", action="version", version=f"kiln {__version__}")
    sub = parser.add_subparsers(dest="command", required=True)

    show = sub.add_parser("show", help="print a compilation stage of a model")
    show.add_argument("model", help="demo:mlp, demo:small_cnn, or a .py file defining module()")
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

    run = sub.add_parser("run", help="run a saved executable on .npy inputs")
    run.add_argument("file")
    run.add_argument("inputs", nargs="*")
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
