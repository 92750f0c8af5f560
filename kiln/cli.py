"""The ``kiln`` command: compile ONNX models, print any compilation stage, inspect and run saved
executables, manage the compile cache.

Every failure is one line on stderr, ``kiln: error: ...``: exit status 2 for a mistake on the
command line (an unknown option or choice, a malformed value, a name the model does not have, a
missing or unreadable file it names), 1 for a failure of the work itself (an operator kiln
cannot convert, a compile error), 130 when interrupted. ``--verbose`` adds progress (stages,
kernels done of total, times) and the full text of multi-line errors; ``--traceback`` the
Python traceback of an unexpected error.
"""

from __future__ import annotations

import argparse
import difflib
import importlib.util
import logging
import os
import re
import sys
import time
import traceback as tb
from collections.abc import Sequence
from typing import Any

import numpy as np

from . import __version__, progress
from .build import build, check_buildable, default_pipeline, npu_pipeline, schedule_prim_func
from .codegen import c as codegen_c
from .codegen.gpu.build import generate_source as generate_gpu_source
from .codegen.npu import LOWERING_KEY, NPUExecutable, build_npu, npu_config_of
from .frontend.onnx import GuardedExecutable, compile_onnx, from_onnx
from .frontend.onnx.importer import import_model, load_model
from .frontend.torch import from_pt2
from .ir.errors import ArgumentError, KilnError, ModelFormatError
from .runtime import cache, shape_expr
from .runtime.executable import load
from .schedule.gpu import schedule_and_lower
from .schedule.npu.nest_analysis import unit_shares
from .target import Target
from .testing import models
from .tir.function import PrimFunc
from .tir.transform import lower
from .transform import PassContext
from .transform.npu import partition_for_npu
from .tune.database import TuningDatabase
from .tune.graph_tuning import extract_graph_tasks, tune_graph
from .tune.npu_tuning import tune_npu
from .tune.ray_runner import RayMeasurer
from .tune.report import (
    graph_summary,
    graph_trial_line,
    npu_summary,
    npu_trial_line,
    parse_duration,
    progress_line,
    report,
    summary,
)
from .tune.tasks import extract_tasks
from .tune.tuner import Tuner

STAGES = ("graph", "optimized", "tir", "scheduled", "lowered", "c", "cuda", "opencl",
          "partition", "npu", "asm")
#: The stages of an NPU target: the NPU lowers graph ops, the module partitioned into NPU region
#: functions (``partition``: with each tensor's memory scope), the kernels lowered through TIR
#: (``scheduled``: products and vector kernels, each PrimFunc staged into NPU scopes and
#: tensorized, with its schedule's trace), its kernels and tilings (``npu``) and its assembly
#: (``asm``).
NPU_STAGES = ("graph", "optimized", "partition", "scheduled", "npu", "asm")
OPT_LEVELS = (0, 1, 2, 3)

EXAMPLES = """\
examples:
  kiln compile model.onnx -o model.kiln                  import, compile, save
  kiln compile model.onnx --shape image=1,3,224,224      fix an input's dynamic shape
  kiln compile model.onnx --target x86-64-v3 --verbose   build for any AVX2 CPU, with progress
  kiln run model.kiln --input image=x.npy -o outputs/    run; outputs saved by name
  kiln run model.kiln --dim batch=8 --profile            random inputs; time per kernel
  kiln run model.onnx x.npy                              compile in memory, then run
  kiln inspect model.kiln                                target, inputs, outputs, kernels
  kiln show model.onnx --stage c                         print a compilation stage
  kiln compile model.onnx --target cuda -o model.kiln    GPU kernels (also: --target opencl)
  kiln show model.onnx --stage cuda                      the CUDA source (also: opencl)
  kiln cache info                                        the compile cache and its cap

exit status: 0 success, 1 error, 2 command-line mistake, 130 interrupted
environment: KILN_CACHE_DIR, KILN_CACHE_MAX_SIZE (default 2G), KILN_EXECUTABLE_CACHE (0: off),
             KILN_COMPILE_JOBS, CC, OMP_NUM_THREADS
"""


class UsageError(KilnError):
    """A mistake on the command line or in a file it names (exit status 2)."""


class ArgumentParser(argparse.ArgumentParser):
    """argparse, with usage mistakes raised as :class:`UsageError` (one line, exit 2) instead
    of a usage block printed by argparse itself."""

    def error(self, message: str) -> Any:
        raise UsageError(_with_suggestion(message, self))


def _all_options(parser: argparse.ArgumentParser) -> list[str]:
    opts = []
    for action in parser._actions:  # argparse offers no public listing
        opts += [o for o in action.option_strings if o.startswith("--")]
        if isinstance(action, argparse._SubParsersAction):
            for sub in action.choices.values():
                opts += _all_options(sub)
    return opts


def _with_suggestion(message: str, parser: argparse.ArgumentParser) -> str:
    """``unrecognized arguments: --shpae`` + ``(did you mean --shape?)``."""
    m = re.match(r"unrecognized arguments: (\S+)", message)
    if m:
        close = difflib.get_close_matches(m.group(1), sorted(set(_all_options(parser))), n=1)
        if close:
            return f"{message} (did you mean {close[0]}?)"
    return message


def _closest(name: str, choices: Sequence[str]) -> str:
    """`` (did you mean 'N'?)`` for a near miss, case-insensitively first."""
    folded = [c for c in choices if c.lower() == name.lower()]
    close = folded or difflib.get_close_matches(name, list(choices), n=1)
    return f" (did you mean {close[0]!r}?)" if close else ""


# ---- values ----------------------------------------------------------------------------------
def _count(text: str, what: str, minimum: int) -> int:
    try:
        value = int(text)
    except ValueError:
        raise UsageError(f"{what}: expected an integer, got {text!r}") from None
    if value < minimum:
        raise UsageError(f"{what}: expected an integer >= {minimum}, got {value}")
    return value


def _int_type(what: str, minimum: int):
    def parse(text: str) -> int:
        try:
            return _count(text, what, minimum)
        except UsageError as err:
            raise argparse.ArgumentTypeError(str(err).split(": ", 1)[1]) from None
    parse.__name__ = what
    return parse


def _pair(spec: str, option: str, value_help: str) -> tuple[str, str]:
    name, eq, value = spec.partition("=")
    if not eq or not name or not value:
        raise UsageError(f"{option} {spec!r}: expected {value_help}")
    return name, value


def _check_output_folder(path: str, what: str) -> None:
    """Refuse, before any work, an output path whose folder does not exist."""
    folder = os.path.dirname(os.path.abspath(path))
    if not os.path.isdir(folder):
        raise UsageError(f"{what} {path!r}: folder {os.path.dirname(path) or folder!r} does "
                         "not exist")
    if os.path.isdir(path):
        raise UsageError(f"{what} {path!r} is a folder; give a file name")


def _existing_file(path: str, what: str) -> str:
    if not os.path.exists(path):
        raise UsageError(f"{what} {path!r} does not exist")
    if os.path.isdir(path):
        raise UsageError(f"{what} {path!r} is a folder, not a file")
    return path


def _load_executable(path: str) -> Any:
    _existing_file(path, "executable")
    try:
        return load(path)
    except ModelFormatError as err:
        raise UsageError(str(err)) from err


def _load_onnx(path: str) -> Any:
    _existing_file(path, "model")
    try:
        return load_model(path)
    except ModelFormatError as err:
        raise UsageError(str(err)) from err


def _target(spec: str) -> Any:
    try:
        return Target.create(spec)
    except KilnError as err:
        raise UsageError(f"--target {spec!r}: {err}") from err


# ---- show ------------------------------------------------------------------------------------
def _load_module(spec: str) -> Any:
    """``demo:mlp`` / ``demo:small_cnn``, an ``.onnx`` file (weights bound as constants), or
    ``path/to/file.py`` defining ``module()``."""
    if spec.startswith("demo:"):
        name = spec.split(":", 1)[1]
        demos = ("mlp", "small_cnn", "resnet_block_cnn")
        if name not in demos:
            raise UsageError(f"unknown demo model {name!r} (choose from "
                             f"{', '.join(demos)}){_closest(name, demos)}")
        return getattr(models, name)().mod
    if spec.endswith(".onnx"):
        proto = _load_onnx(spec)
        return from_onnx(proto, bind_params=True,
                         base_dir=os.path.dirname(os.path.abspath(spec)))[0]
    if not spec.endswith(".py"):
        raise UsageError(f"model {spec!r}: expected demo:NAME, an .onnx file or a .py file "
                         "defining module()")
    _existing_file(spec, "model")
    loader = importlib.util.spec_from_file_location("kiln_user_model", spec)
    if loader is None or loader.loader is None:
        raise UsageError(f"cannot load {spec!r}")
    user = importlib.util.module_from_spec(loader)
    loader.loader.exec_module(user)
    if not hasattr(user, "module"):
        raise UsageError(f"{spec} must define module() returning an IRModule")
    return user.module()


def cmd_show(args: argparse.Namespace) -> int:
    target = _target(args.stage if args.stage in ("cuda", "opencl") else args.target)
    check_buildable(target)
    mod = _load_module(args.model)
    if args.stage == "graph":
        print(mod)
        return 0
    if target.kind == "npu":
        return _show_npu(mod, target, args)
    if args.stage in ("partition", "npu", "asm"):
        raise UsageError(f"--stage {args.stage} is for --target npu")
    with PassContext(opt_level=args.opt_level):
        mod = default_pipeline(target=target)(mod)
    if args.stage == "optimized":
        print(mod)
        return 0
    funcs = {n: f for n, f in mod.items() if isinstance(f, PrimFunc)}
    if args.func:
        if args.func not in funcs:
            raise UsageError(f"--func {args.func!r}: no such PrimFunc (the module has: "
                             f"{', '.join(funcs)}){_closest(args.func, list(funcs))}")
        funcs = {args.func: funcs[args.func]}
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


def _show_npu(mod: Any, target: Target, args: argparse.Namespace) -> int:
    if args.stage not in NPU_STAGES:
        raise UsageError(f"--stage {args.stage}: an NPU target has the stages "
                         f"{', '.join(NPU_STAGES)}")
    with PassContext(opt_level=args.opt_level):
        mod = npu_pipeline()(mod)
    if args.stage == "optimized":
        print(mod)
        return 0
    mod = partition_for_npu(npu_config_of(target))(mod)
    if args.stage == "partition":
        print(mod.script())
        return 0
    if args.stage == "scheduled":
        with PassContext(config={LOWERING_KEY: "tir"}):
            exe = build_npu(mod, target)
        for op_name, sch in exe.tir:
            print(f"# {op_name}: scheduled for {target}\n{sch.func}\n# trace\n{sch.trace}",
                  end="\n\n")
        if not exe.tir:
            print("# no kernel of this model is lowered through TIR")
        return 0
    exe = build_npu(mod, target)
    if args.stage == "npu":
        print(exe.describe())
        shares = unit_shares(exe)
        print(shares.summary())
        for label, why in shares.fallbacks:
            print(f"  scalar fallback {label}: {why}")
        return 0
    for step in exe.steps:
        print(step.program.assembly() if hasattr(step, "program") else
              f"; CPU: {step.op}", end="\n\n")
    return 0


def _show_gpu(stage: str, funcs: dict[str, Any], target: Any) -> int:
    """The scheduled/lowered TIR or the CUDA/OpenCL source of a GPU target's functions."""
    pairs = {n: schedule_and_lower(f, target) for n, f in funcs.items()}
    if stage in ("scheduled", "lowered"):
        for scheduled, lowered in pairs.values():
            print(scheduled if stage == "scheduled" else lowered, end="\n\n")
        return 0
    source, _ = generate_gpu_source({n: p[1] for n, p in pairs.items()}, target)
    print(source)
    return 0


# ---- inspect ---------------------------------------------------------------------------------
def _describe(infos: Sequence[Any]) -> str:
    return ", ".join(f"{t.name}: {t.dtype}[{', '.join(map(str, t.shape))}]" for t in infos)


def cmd_inspect(args: argparse.Namespace) -> int:
    exe = _load_executable(args.file)
    size = os.path.getsize(args.file)
    if isinstance(exe, NPUExecutable):
        print(f"{args.file}: {size / 1024:.0f} KiB, target {exe.target!r}")
        print("inputs:  " + ", ".join(f"{n}: {t.dtype}{list(t.shape)}" for n, t in exe.inputs))
        print("outputs: " + ", ".join(f"{t.dtype}{list(t.shape)}" for t in exe.outputs))
        print(exe.describe())
        return 0
    print(f"{args.file}: {size / 1024:.0f} KiB, built by kiln {exe.kiln_version} for target "
          f"{exe.target!r} ({exe.machine})")
    print(f"needs CPU features: {' '.join(sorted(exe.required_features)) or '(none recorded)'}")
    print(f"inputs:  {_describe(exe.inputs)}")
    print(f"outputs: {_describe(exe.outputs)}")
    if exe.sections:
        print("extra sections: " + ", ".join(f"{n} ({len(d)} bytes)"
                                             for n, d in exe.sections.items()))
    print(exe.summary())
    if args.source:
        print(exe.module.source)
    return 0


# ---- compile ---------------------------------------------------------------------------------
def _graph_inputs(proto: Any) -> dict[str, list[Any]]:
    """The model's real inputs (not initializers) and their declared dims (int, name or None)."""
    inits = {i.name for i in proto.graph.initializer}
    out: dict[str, list[Any]] = {}
    for vi in proto.graph.input:
        if vi.name in inits:
            continue
        dims: list[Any] = []
        tt = vi.type.tensor_type if vi.type.HasField("tensor_type") else None
        if tt is not None and tt.HasField("shape"):
            for d in tt.shape.dim:
                if d.HasField("dim_value"):
                    dims.append(int(d.dim_value))
                else:
                    dims.append(d.dim_param or None)
        out[vi.name] = dims if tt is not None and tt.HasField("shape") else None
    return out


def _parse_shapes(specs: Sequence[str], inputs: dict[str, Any]) -> dict[str, list[Any]]:
    """``--shape NAME=D0,D1,...`` checked against the model's inputs: each dim a positive
    integer or a name (a symbolic dim), as many as the input's declared rank."""
    shapes: dict[str, list[Any]] = {}
    names = list(inputs)
    for spec in specs:
        name, dims_text = _pair(spec, "--shape", "NAME=D0,D1,... (e.g. image=1,3,224,224)")
        if name not in inputs:
            raise UsageError(f"--shape {spec!r}: the model has no input {name!r} (its inputs: "
                             f"{', '.join(names) or 'none'}){_closest(name, names)}")
        if name in shapes:
            raise UsageError(f"--shape: input {name!r} given twice")
        dims: list[Any] = []
        for d in dims_text.split(","):
            d = d.strip()
            if re.fullmatch(r"\d+", d):
                if int(d) < 1:
                    raise UsageError(f"--shape {spec!r}: dimension {d} must be positive")
                dims.append(int(d))
            elif re.fullmatch(r"[A-Za-z_][A-Za-z0-9_]*", d):
                dims.append(d)
            else:
                raise UsageError(f"--shape {spec!r}: {d!r} is not a dimension (expected a "
                                 "positive integer, or a name for a symbolic dimension)")
        declared = inputs[name]
        if declared is not None and len(declared) != len(dims):
            shown = "x".join("?" if v is None else str(v) for v in declared)
            raise UsageError(f"--shape {spec!r}: input {name!r} has rank {len(declared)} "
                             f"({shown}), not {len(dims)}")
        shapes[name] = dims
    return shapes


def _import_model(path: str, shape_args: list[str] | None) -> tuple[Any, Any]:
    """(module, params) of an ONNX model or a ``torch.export.save``'d ``.pt2`` program
    (``shape_args``: ``--shape`` values, ONNX only)."""
    stage = progress.Stage(f"importing {path}")
    if path.endswith(".pt2"):  # a torch.export.save'd ExportedProgram
        if shape_args:
            raise UsageError("--shape is for ONNX models (a .pt2 program has its shapes)")
        _existing_file(path, "model")
        mod, params = from_pt2(path)
        stage.finish()
        return mod, params
    proto = _load_onnx(path)
    shapes = _parse_shapes(shape_args or [], _graph_inputs(proto))
    mod, params, guard = import_model(proto, shape_dict=shapes or None, specialize=True,
                                      base_dir=os.path.dirname(os.path.abspath(path)))
    if guard is not None:
        raise KilnError(_guarded_message(path, guard.node))
    stage.finish(f"{len(proto.graph.node)} nodes")
    return mod, params


def cmd_compile(args: argparse.Namespace) -> int:
    target = _target(args.target)
    out = args.output or os.path.splitext(args.model)[0] + ".kiln"
    _check_output_folder(out, "output")
    t0 = time.perf_counter()
    mod, params = _import_model(args.model, args.shape)
    t1 = time.perf_counter()
    with PassContext(opt_level=args.opt_level):
        exe = build(mod, target=target, params=params, tuning_db=args.tuning_db)
    t2 = time.perf_counter()
    exe.save(out)
    if isinstance(exe, NPUExecutable):
        print(f"imported {args.model} in {t1 - t0:.2f} s, compiled {len(exe.kernels)} NPU "
              f"kernels for target {exe.target!r} (CPU ops: {', '.join(exe.cpu_ops) or 'none'})"
              f" in {t2 - t1:.2f} s -> {out}")
        return 0
    print(f"imported {args.model} in {t1 - t0:.2f} s, compiled {exe.num_kernels} kernels for "
          f"target {exe.target!r} in {t2 - t1:.2f} s -> {out}")
    print(f"inputs:  {_describe(exe.inputs)}")
    print(f"outputs: {_describe(exe.outputs)}")
    return 0


def _guarded_message(model: str, node: str) -> str:
    """Why ``kiln compile`` cannot save a model that needs guarded specialization."""
    return (f"{model}: {node} is an If on a run-time condition whose branches differ in rank "
            "or dtype; kiln compiles the rest of such a model per condition value when it "
            "runs (kiln.frontend.onnx.compile_onnx), which a .kiln file does not hold: run "
            f"it with `kiln run {model}` (or compile_onnx in Python)")


# ---- run -------------------------------------------------------------------------------------
def _read_npy(path: str, name: str) -> np.ndarray:
    """The array of input ``name`` from the .npy file ``path``."""
    what = f"input file for {name!r},"
    _existing_file(path, what)
    try:
        with open(path, "rb") as f:
            magic = f.read(6)
        if magic != b"\x93NUMPY":
            raise UsageError(f"{what} {path!r}, is not a .npy file (save arrays with "
                             "numpy.save)")
        arr = np.load(path, allow_pickle=False)
    except (ValueError, OSError, EOFError) as err:
        raise UsageError(f"{what} {path!r}, cannot be read as a .npy file ({err})") from err
    return arr


def _symbolic_names(plan: Any) -> list[str]:
    """The names of the symbolic dims of the plan's inputs, in order of appearance."""
    names: dict[str, None] = {}

    def walk(code: Any) -> None:
        if isinstance(code, list):
            if code[0] == "var":
                names[code[1]] = None
            else:
                for c in code[1:]:
                    walk(c)

    for slot in plan.input_slots:
        for d in plan.slots[slot].shape:
            walk(d)
    return list(names)


def _file_feeds(args: argparse.Namespace, names: Sequence[str]) -> dict[str, np.ndarray]:
    """Feeds from positional .npy files (in input order) and ``--input NAME=FILE``."""
    if len(args.inputs) > len(names):
        raise UsageError(f"{len(args.inputs)} input files given, but the model has "
                         f"{len(names)} input(s): {', '.join(names) or 'none'}")
    feeds = {name: _read_npy(path, name) for name, path in zip(names, args.inputs)}
    for spec in args.input:
        name, path = _pair(spec, "--input", "NAME=FILE.npy")
        if name not in names:
            raise UsageError(f"--input {spec!r}: the model has no input {name!r} (its inputs: "
                             f"{', '.join(names)}){_closest(name, names)}")
        if name in feeds:
            raise UsageError(f"input {name!r} given twice")
        feeds[name] = _read_npy(path, name)
    return feeds


def _random_input(rng: np.random.Generator, shape: Sequence[int], dt: np.dtype) -> np.ndarray:
    if dt.kind == "f":
        return rng.standard_normal(shape).astype(dt)
    if dt.kind == "b":
        return rng.integers(0, 2, size=shape).astype(bool)
    return rng.integers(0, 10, size=shape).astype(dt)


def _parse_feeds(args: argparse.Namespace, plan: Any) -> dict[str, np.ndarray]:
    """Feeds from positional .npy files (in input order) and ``--input NAME=FILE``; random
    arrays for the rest, with symbolic dims from ``--dim NAME=N`` (default 1)."""
    names = plan.input_names
    feeds = _file_feeds(args, names)
    symbolic = _symbolic_names(plan)
    dims: dict[str, int] = {}
    for spec in args.dim:
        name, value = _pair(spec, "--dim", "NAME=N (e.g. batch=8)")
        if name not in symbolic:
            known = (f"its symbolic dimensions: {', '.join(symbolic)}" if symbolic
                     else "all its input dimensions are fixed")
            raise UsageError(f"--dim {spec!r}: the model has no symbolic dimension {name!r} "
                             f"({known}){_closest(name, symbolic)}")
        dims[name] = _count(value, f"--dim {spec!r}", 1)
    rng = np.random.default_rng(args.seed)
    for name, slot in zip(names, plan.input_slots):
        if name in feeds:
            continue
        spec = plan.slots[slot]
        unbound = [n for n in symbolic if n not in dims]
        shape = []
        for code in spec.shape:
            shape.append(shape_expr.evaluate(code, {**dict.fromkeys(unbound, 1), **dims}))
        dt = spec.dtype.to_numpy()
        arr = _random_input(rng, shape, dt)
        note = (f" (symbolic {', '.join(unbound)} = 1; set with --dim)"
                if unbound and any(isinstance(c, list) for c in spec.shape) else "")
        print(f"input {name}: random {dt} {tuple(shape)}{note}")
        feeds[name] = arr
    return feeds


def _output_paths(target: str | None, names: Sequence[str]) -> list[str | None]:
    """Where each output goes: ``-o FILE.npy`` for a single output, else ``-o FOLDER`` holding
    ``<name>.npy`` per output (the name made a file name); None without ``-o``."""
    if target is None:
        return [None] * len(names)
    if target.endswith(".npy"):
        if len(names) != 1:
            raise UsageError(f"-o {target!r}: the model has {len(names)} outputs "
                             f"({', '.join(names)}); give a folder to write one .npy per output")
        _check_output_folder(target, "-o")
        return [target]
    if os.path.exists(target) and not os.path.isdir(target):
        raise UsageError(f"-o {target!r} exists and is not a folder")
    parent = os.path.dirname(os.path.abspath(target))
    if not os.path.isdir(parent):
        raise UsageError(f"-o {target!r}: folder {os.path.dirname(target) or parent!r} does "
                         "not exist")
    paths, used = [], set()
    for name in names:
        base = re.sub(r"[^A-Za-z0-9._-]+", "_", name).strip("._") or "output"
        stem, k = base, 1
        while stem in used:
            stem, k = f"{base}_{k}", k + 1
        used.add(stem)
        paths.append(os.path.join(target, stem + ".npy"))
    return paths


#: Files ``kiln run`` compiles before running (anything else is a saved executable).
MODEL_SUFFIXES = (".onnx", ".pt2")


def _executable_to_run(path: str, target_spec: str | None) -> Any:
    """A saved executable (``--target``, when given, must be the kind it was compiled for),
    or a model compiled here for ``--target`` (default: this CPU). An ONNX model for a CPU
    goes through ``compile_onnx``, so a model whose Ifs need guarded specialization runs too
    (the rest of the model compiled for the condition value each run meets, on first meeting
    it)."""
    if path.endswith(MODEL_SUFFIXES):
        target = _target(target_spec or "native")
        if path.endswith(".onnx") and target.kind == "c":
            stage = progress.Stage(f"compiling {path}")
            exe = compile_onnx(_load_onnx(path), target=target,
                               base_dir=os.path.dirname(os.path.abspath(path)))
            stage.finish()
            return exe
        mod, params = _import_model(path, None)
        stage = progress.Stage(f"compiling for {target.kind}")
        exe = build(mod, target=target, params=params)
        stage.finish()
        return exe
    stage = progress.Stage(f"loading {path}")
    exe = _load_executable(path)
    stage.finish()
    if target_spec is not None:
        want, have = _target(target_spec).kind, Target.create(exe.target).kind
        if want != have:
            raise UsageError(f"--target {target_spec!r}: {path} was compiled for {have!r} "
                             f"(run the model file with --target {target_spec}, or compile it "
                             f"again with `kiln compile --target {target_spec}`)")
    return exe


def cmd_run(args: argparse.Namespace) -> int:
    if args.trace is not None:
        _check_output_folder(args.trace, "--trace")
    exe = _executable_to_run(args.file, args.target)
    if isinstance(exe, NPUExecutable):
        return _run_npu(exe, args)
    if isinstance(exe, GuardedExecutable):
        if args.profile or args.trace:
            raise UsageError(f"{args.file} is compiled per condition value of {exe.guard} "
                             "(guarded specialization): --profile and --trace do not apply")
        plan, output_names = exe.prefix.plans[exe.prefix.main_name], exe.output_names
    else:
        plan = exe.plans[exe.main_name]
        output_names = plan.output_names
    paths = _output_paths(args.output, output_names)
    if args.threads:
        exe.set_num_threads(args.threads)
    feeds = _parse_feeds(args, plan)
    try:
        outs = exe.run(feeds)
    except ArgumentError as err:  # an input file of the wrong shape or dtype
        raise UsageError(str(err)) from err
    times = []
    for _ in range(args.repeat):
        t0 = time.perf_counter()
        exe.run(feeds)
        times.append(time.perf_counter() - t0)
    if args.output and not args.output.endswith(".npy"):
        os.makedirs(args.output, exist_ok=True)
    for name, o, path in zip(output_names, outs, paths):
        o = np.asarray(o)
        line = f"output {name}: shape {o.shape} dtype {o.dtype}"
        if o.size and o.dtype.kind in "fiub":
            line += (f" min {o.min():.6g} max {o.max():.6g} "
                     f"mean {o.astype(np.float64).mean():.6g}")
        if path is not None:
            np.save(path, o)
            line += f" -> {path}"
        print(line)
        if args.print_values:
            print(o)
    if times:
        print(f"latency: median {np.median(times) * 1e3:.3f} ms, min {min(times) * 1e3:.3f} ms "
              f"over {len(times)} runs ({exe.get_max_threads()} threads)")
    if args.profile or args.trace:
        prof = exe.profile(repeat=max(args.repeat, 1), trace=args.trace, **feeds)
        print(prof)
        if args.trace:
            print(f"trace of {prof.runs} runs -> {args.trace}")
    return 0


def _run_npu(exe: NPUExecutable, args: argparse.Namespace) -> int:
    """``kiln run`` of an NPU executable: one simulated run (static shapes: no ``--dim``)."""
    if args.dim or args.profile or args.trace or args.threads:
        raise UsageError("an NPU executable runs on the simulator: --dim, --profile, --trace "
                         "and --threads do not apply")
    names = [n for n, _ in exe.inputs]
    feeds = _file_feeds(args, names)
    rng = np.random.default_rng(args.seed)
    for name, t in exe.inputs:
        if name not in feeds:
            feeds[name] = _random_input(rng, t.shape, np.dtype(t.dtype))
            print(f"input {name}: random {t.dtype} {t.shape}")
    try:
        outs = exe(*(feeds[n] for n in names))
    except ArgumentError as err:
        raise UsageError(str(err)) from err
    outs = list(outs) if exe.tuple_output else [outs]
    out_names = [f"output{i}" for i in range(len(outs))] if len(outs) > 1 else ["output"]
    for name, o, path in zip(out_names, outs, _output_paths(args.output, out_names)):
        line = f"output {name}: shape {o.shape} dtype {o.dtype}"
        if path is not None:
            if args.output and not args.output.endswith(".npy"):
                os.makedirs(args.output, exist_ok=True)
            np.save(path, o)
            line += f" -> {path}"
        print(line)
        if args.print_values:
            print(o)
    print(f"simulated: {exe.last_cycles:,.0f} NPU cycles on {exe.config.name!r}; CPU ops: "
          f"{', '.join(exe.cpu_ops) or 'none'}")
    return 0


# ---- cache -----------------------------------------------------------------------------------
def cmd_cache(args: argparse.Namespace) -> int:
    if args.action == "clear":
        files, freed = cache.clear()
        print(f"removed {files} files ({cache.format_bytes(freed)}) from {cache.cache_dir()}")
        return 0
    info = cache.info()
    cap = info["max_bytes"]
    print(f"directory: {info['directory']}"
          + ("" if info["writable"] in (True, None) else " (read-only)"))
    print(f"entries:   {info['entries']} ({info['libraries']} libraries, "
          f"{info['executables']} executables), "
          f"{cache.format_bytes(info['bytes'])}")
    print(f"size cap:  {cache.format_bytes(cap) if cap else 'none'} "
          "(KILN_CACHE_MAX_SIZE; least recently used entries are evicted beyond it)")
    if info["newest_use"] is not None:
        fmt = "%Y-%m-%d %H:%M"
        print(f"last used: {time.strftime(fmt, time.localtime(info['newest_use']))}, oldest "
              f"entry last used {time.strftime(fmt, time.localtime(info['oldest_use']))}")
    return 0


# ---- the parser ------------------------------------------------------------------------------
def build_parser() -> ArgumentParser:
    formatter = argparse.RawDescriptionHelpFormatter
    parser = ArgumentParser(prog="kiln", description=__doc__.split("\n\n")[0],
                            epilog=EXAMPLES, formatter_class=formatter)
    parser.add_argument("--version", action="version", version=f"kiln {__version__}")
    common = ArgumentParser(add_help=False)
    common.add_argument("-v", "--verbose", action="store_true",
                        help="print progress (stages, kernels done, times) on stderr, and the "
                        "full text of multi-line errors")
    common.add_argument("--traceback", action="store_true",
                        help="print the Python traceback of an unexpected error")
    sub = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")

    def command(name: str, help_text: str, examples: str) -> ArgumentParser:
        return sub.add_parser(name, help=help_text, description=help_text[0].upper()
                              + help_text[1:] + ".", parents=[common], formatter_class=formatter,
                              epilog="examples:\n" + examples)

    target_help = ("the CPU to build for: native (this CPU, the default), x86-64-v2/v3/v4, a "
                   "CPU name the C compiler knows (znver3, skylake-avx512...), or "
                   "'c -mcpu=NAME'")
    opt_help = "optimization level of the pass pipeline (0-3, default 2)"

    comp = command("compile", "compile an ONNX model into a saved executable (.kiln)", """\
  kiln compile model.onnx                                 -> model.kiln
  kiln compile model.onnx -o m.kiln --shape image=1,3,224,224
  kiln compile bert.onnx --shape input_ids=1,seq --shape attention_mask=1,seq
  kiln compile model.onnx --target x86-64-v3 --verbose
""")
    comp.add_argument("model", help="path of the .onnx file (external data files next to it) "
                      "or of a torch.export .pt2 program")
    comp.add_argument("-o", "--output", help="executable path (default: MODEL with .kiln)")
    comp.add_argument("-O", "--opt-level", type=int, choices=OPT_LEVELS, default=2,
                      help=opt_help)
    comp.add_argument("--shape", action="append", default=[], metavar="NAME=D0,D1,...",
                      help="an input's shape: integers fix dimensions, a name keeps one "
                      "symbolic (repeatable)")
    comp.add_argument("--target", default="native", help=target_help)
    comp.add_argument("--tuning-db", metavar="DB.sqlite",
                      help="schedule each kernel as its best record in this tuning database "
                      "says (made by `kiln tune`); kernels without one get the default")
    comp.set_defaults(fn=cmd_compile)

    run = command("run", "run a saved executable or a model: prints outputs and latency", """\
  kiln run model.kiln                                     random inputs
  kiln run model.kiln x.npy                               inputs in order
  kiln run model.kiln --input image=x.npy -o out/         out/<output name>.npy
  kiln run model.kiln --dim batch=8 --threads 4 --profile --trace trace.json
  kiln run model.onnx --target opencl                     compile for a target, then run
""")
    run.add_argument("file", help="the .kiln executable, or an .onnx/.pt2 model (compiled "
                     "for --target first; on a CPU, an ONNX model's Ifs whose branches differ "
                     "in rank are specialized at run time)")
    run.add_argument("--target", default=None,
                     help="the target to compile a model file for (cuda, opencl, a CPU: "
                     "default native); for a .kiln file, the kind it must have been "
                     "compiled for")
    run.add_argument("inputs", nargs="*", help=".npy files for the inputs, in input order")
    run.add_argument("--input", action="append", default=[], metavar="NAME=FILE.npy",
                     help="an input by name (inputs not given are random)")
    run.add_argument("--dim", action="append", default=[], metavar="NAME=N",
                     help="value of a symbolic dimension for random inputs (default 1)")
    run.add_argument("--repeat", type=_int_type("--repeat", 0), default=10,
                     help="timed runs after the first (default 10)")
    run.add_argument("--threads", type=_int_type("--threads", 1), default=None,
                     help="threads per run (default: KILN_NUM_THREADS, else all CPUs)")
    run.add_argument("--seed", type=int, default=0, help="seed of the random inputs")
    run.add_argument("--print-values", action="store_true", help="print the output arrays")
    run.add_argument("--profile", action="store_true",
                     help="also time every kernel: source nodes, shapes, share of the time")
    run.add_argument("--trace", metavar="FILE.json",
                     help="write a Chrome trace of the profiled runs (implies --profile)")
    run.add_argument("-o", "--output", metavar="PATH",
                     help="FILE.npy (one output) or a FOLDER for <output name>.npy files")
    run.set_defaults(fn=cmd_run)

    insp = command("inspect", "describe a saved executable", """\
  kiln inspect model.kiln
  kiln inspect model.kiln --source
""")
    insp.add_argument("file", help="the .kiln executable")
    insp.add_argument("--source", action="store_true", help="also print the generated C")
    insp.set_defaults(fn=cmd_inspect)

    show = command("show", "print a compilation stage of a model", """\
  kiln show model.onnx                                    the imported graph
  kiln show model.onnx --stage lowered --func fused_conv2d_nchwc_add_relu
  kiln show demo:mlp --stage c
""")
    show.add_argument("model", help="demo:mlp, demo:small_cnn, an .onnx file, or a .py "
                      "defining module()")
    show.add_argument("--stage", choices=STAGES, default="graph",
                      help=f"what to print ({', '.join(STAGES)}; default graph)")
    show.add_argument("--target", default="native", help=target_help)
    show.add_argument("-O", "--opt-level", type=int, choices=OPT_LEVELS, default=2,
                      help=opt_help)
    show.add_argument("--func", help="only this PrimFunc (tir/scheduled/lowered/c stages)")
    show.set_defaults(fn=cmd_show)

    cache_cmd = command("cache", "show or empty the compile cache", """\
  kiln cache info
  kiln cache clear
  KILN_CACHE_MAX_SIZE=500M kiln cache info
""")
    cache_cmd.add_argument("action", choices=("info", "clear"),
                           help="info: location, size and cap; clear: remove every entry")
    cache_cmd.set_defaults(fn=cmd_cache)

    tune = command("tune", "tune a model's kernels into a tuning database (resumable)", """\
  kiln tune model.onnx --target c --budget 10m --db tuning.sqlite
  kiln tune model.onnx --budget 30m --db tuning.sqlite    again: continues where it stopped
  kiln tune demo:resnet_block_cnn --trials 16 --db t.sqlite --ray local
  kiln tune model.onnx --db tuning.sqlite --ray 10.0.0.5:6379
  kiln tune model.onnx --target npu --db tuning.sqlite     NPU tilings, on the simulator
  kiln tune --report --db tuning.sqlite
  kiln compile model.onnx --tuning-db tuning.sqlite        build with the tuned schedules
""")
    tune.add_argument("model", nargs="?", help="an .onnx file, demo:NAME, or a .py file "
                      "defining module() (not needed with --report)")
    tune.add_argument("--db", required=True, metavar="DB.sqlite",
                      help="the tuning database (created if missing, never overwritten)")
    tune.add_argument("--target", default="native", help=target_help)
    tune.add_argument("--budget", default="10m", metavar="TIME",
                      help="tuning time: 600, 90s, 10m, 1.5h (default 10m)")
    tune.add_argument("--trials", type=_int_type("--trials", 1), default=None,
                      help="stop a kernel after this many measured candidates")
    tune.add_argument("--batch", type=_int_type("--batch", 1), default=8,
                      help="candidates measured per round (default 8)")
    tune.add_argument("--shape", action="append", default=[], metavar="NAME=D0,D1,...",
                      help="an ONNX input's shape (tuning needs fixed shapes; repeatable)")
    tune.add_argument("--ray", metavar="ADDRESS",
                      help="build and measure on a Ray cluster (host:port, or 'local' to start "
                      "one here); needs the ray extra")
    tune.add_argument("--graph-share", type=float, default=0.25, metavar="F",
                      help="at most this share of the budget goes to the layout blocks of the "
                           "convolutions (whole-model measurements), first; 0: kernels only "
                           "(default 0.25)")
    tune.add_argument("--report", action="store_true",
                      help="print a summary of the database and exit")
    tune.set_defaults(fn=cmd_tune)
    return parser


# ---- tune ------------------------------------------------------------------------------------
def _tune_module(args: argparse.Namespace) -> tuple[Any, Any]:
    if args.model.endswith(".onnx"):
        proto = _load_onnx(args.model)
        shapes = _parse_shapes(args.shape, _graph_inputs(proto))
        return from_onnx(proto, shape_dict=shapes or None,
                         base_dir=os.path.dirname(os.path.abspath(args.model)))
    if args.shape:
        raise UsageError("--shape is for ONNX models")
    return _load_module(args.model), None


def cmd_tune(args: argparse.Namespace) -> int:
    db = TuningDatabase(args.db)
    if args.report:
        print(report(db))
        return 0
    if args.model is None:
        raise UsageError("kiln tune: name the model to tune (or give --report)")
    try:
        budget = parse_duration(args.budget)
    except ValueError as err:
        raise UsageError(f"--budget: {err}") from None
    target = _target(args.target)
    if target.kind not in ("c", "npu"):
        raise UsageError(f"--target {args.target!r}: tuning is for CPU and NPU targets")
    mod, params = _tune_module(args)
    if target.kind == "npu":
        return _tune_npu(args, db, mod, params, target, budget)
    start = time.monotonic()
    graph = None
    if args.graph_share > 0 and extract_graph_tasks(mod, target, params):
        print(f"tuning the layouts of {args.model} for at most "
              f"{budget * args.graph_share:g} s into {args.db}", file=sys.stderr)
        graph = tune_graph(mod, db, target, params, budget * args.graph_share,
                           on_trial=lambda t, c, r: print(graph_trial_line(t.key, c, r),
                                                          file=sys.stderr, flush=True))
    tasks = extract_tasks(mod, target, params, db=db)
    if not tasks:
        print("nothing to tune: no kernel of the model has a tunable schedule with fixed shapes")
        return 0
    budget = max(0.0, budget - (time.monotonic() - start))
    measurer = None
    if args.ray:
        measurer = RayMeasurer(None if args.ray == "local" else args.ray)
    print(f"tuning {len(tasks)} kernels of {args.model} for {budget:g} s into {args.db}",
          file=sys.stderr)
    tuner = Tuner(db, measurer, batch=args.batch,
                  on_round=lambda s, states, left: print(progress_line(s, states, left),
                                                         file=sys.stderr, flush=True))
    try:
        states = tuner.tune(tasks, budget, args.trials)
    finally:
        tuner.close()
    if graph is not None:
        print(graph_summary(graph))
    print(summary(states))
    print(f"build with: kiln compile {args.model} --tuning-db {args.db}")
    return 0


def _tune_npu(args: argparse.Namespace, db: TuningDatabase, mod: Any, params: Any, target: Any,
              budget: float) -> int:
    """``kiln tune --target npu``: every product's tiling candidates on the simulator."""
    if args.ray or args.trials is not None:
        raise UsageError("--ray and --trials are for CPU tuning (the NPU's candidates are "
                         "simulated here, each once)")
    print(f"simulating the NPU tiling candidates of {args.model} for at most {budget:g} s "
          f"into {args.db}", file=sys.stderr)
    result = tune_npu(mod, db, target, params, budget,
                      on_trial=lambda t, c, d: print(npu_trial_line(t, c, d), file=sys.stderr,
                                                     flush=True))
    if not result.tasks:
        print("nothing to tune: no product of the model has more than one feasible tiling")
        return 0
    print(npu_summary(result))
    print(f"build with: kiln compile {args.model} --target '{target.spec}' --tuning-db "
          f"{args.db}")
    return 0


# ---- main ------------------------------------------------------------------------------------
class _ProgressFormatter(logging.Formatter):
    def __init__(self) -> None:
        super().__init__()
        self.start = time.perf_counter()

    def format(self, record: logging.LogRecord) -> str:
        return f"kiln: [{time.perf_counter() - self.start:6.2f} s] {record.getMessage()}"


def _configure_progress(verbose: bool) -> logging.Handler | None:
    if not verbose:
        return None
    handler = logging.StreamHandler(sys.stderr)
    handler.setFormatter(_ProgressFormatter())
    logger = logging.getLogger("kiln")
    logger.addHandler(handler)
    logger.setLevel(logging.INFO)
    return handler


def _one_line(err: BaseException, verbose: bool) -> str:
    """The message of ``err`` on one line: short multi-line messages joined, long ones cut
    to their first line (all of it with --verbose, printed after)."""
    lines = [ln.strip() for ln in str(err).strip().splitlines() if ln.strip()]
    if not lines:
        return type(err).__name__
    if len(lines) == 1:
        return lines[0]
    joined = "; ".join(lines)
    if len(joined) <= 300:
        return joined
    return lines[0] + ("" if verbose else f" ({len(lines) - 1} more lines with --verbose)")


def main(argv: list[str] | None = None) -> int:
    parser = build_parser()
    verbose = traceback = False
    handler = None
    try:
        args, extra = parser.parse_known_args(argv)
        if args.command == "run":
            # `kiln run m.kiln --threads 2 x.npy`: argparse leaves input files given after an
            # option unparsed
            args.inputs += [a for a in extra if not a.startswith("-")]
            extra = [a for a in extra if a.startswith("-")]
        if extra:
            parser.error(f"unrecognized arguments: {' '.join(extra)}")
        verbose, traceback = args.verbose, args.traceback
        handler = _configure_progress(verbose)
        return args.fn(args)
    except UsageError as err:
        print(f"kiln: error: {_one_line(err, verbose)}", file=sys.stderr)
        return 2
    except KilnError as err:
        print(f"kiln: error: {_one_line(err, verbose)}", file=sys.stderr)
        if verbose and len(str(err).strip().splitlines()) > 1:
            print(str(err).strip(), file=sys.stderr)
        return 1
    except BrokenPipeError:
        # the reader went away (`kiln run ... | head`): stop quietly, as other tools do
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, sys.stdout.fileno())
        return 141
    except KeyboardInterrupt:
        print("kiln: interrupted", file=sys.stderr)
        return 130
    except Exception as err:  # noqa: BLE001 - a bug in kiln: still one line, not a traceback
        if traceback:
            tb.print_exc()
        print(f"kiln: error: internal error: {type(err).__name__}: {_one_line(err, verbose)} "
              "(please report it; --traceback shows where)", file=sys.stderr)
        return 1
    finally:
        if handler is not None:
            logging.getLogger("kiln").removeHandler(handler)


if __name__ == "__main__":
    sys.exit(main())
