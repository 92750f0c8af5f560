"""``build``: scheduled PrimFuncs -> one CUDA C or OpenCL C program -> a loaded GPU module.

Each function is lowered for the target (``kiln.tir.transform.lower``: its body becomes host
allocations and :class:`~kiln.tir.gpu.KernelLaunch`\\ es), each kernel written by
:class:`~kiln.codegen.gpu.kernel.KernelEmitter`, and the program described for the runtime
(:class:`~kiln.runtime.gpu.program.DeviceProgram`: kernel arguments, grid and block extents,
workspaces). CUDA source is compiled with NVRTC here (:mod:`kiln.codegen.gpu.nvrtc`: a cubin
for the target's architecture, PTX for later ones); OpenCL source is compiled by the OpenCL
driver when the program is loaded.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from ...arith import Analyzer
from ...ir.dtype import DataType
from ...ir.errors import CodegenError, KilnError
from ...runtime import shape_expr
from ...runtime.gpu.module import GpuModule
from ...runtime.gpu.program import (
    DeviceFunction,
    DeviceProgram,
    KernelArg,
    KernelSpec,
    WorkspaceSpec,
)
from ...target import Target
from ...target.gpu import cuda_arch
from ...tir import expr as E
from ...tir import stmt as S
from ...tir.buffer import Buffer
from ...tir.function import ASSUME_ATTR, PrimFunc
from ...tir.gpu import KernelLaunch
from ...tir.transform.gpu_kernels import byte_size
from ...tir.transform.hoist_allocations import alloc_size
from ..c.build import function_info, lowered_functions
from ..c.func import FunctionSignature, analyze_signature, variable_uses
from ..c.names import NameTable
from .dialect import dialect_for
from .helpers import GpuHelpers
from .kernel import KernelEmitter, KernelParam, uses_checks, uses_fresh_seed
from .nvrtc import compile_cuda


def host_parts(func: PrimFunc) -> tuple[list[Buffer], list[KernelLaunch]]:
    """The workspace buffers and the kernels of a lowered GPU function, in order."""
    workspaces: list[Buffer] = []
    kernels: list[KernelLaunch] = []

    def walk(s: S.Stmt) -> None:
        if isinstance(s, S.Allocate):
            workspaces.append(s.buffer)
            walk(s.body)
        elif isinstance(s, S.SeqStmt):
            for x in s.seq:
                walk(x)
        elif isinstance(s, KernelLaunch):
            kernels.append(s)
        elif not (isinstance(s, S.Evaluate) and isinstance(s.value, E.IntImm)):
            raise CodegenError(f"{func.attrs.get('global_symbol')}: {type(s).__name__} at the "
                               "top level of a lowered GPU function (only kernels and "
                               "allocations)")

    walk(func.body)
    return workspaces, kernels


def _free_vars(launch: KernelLaunch) -> tuple[dict[E.Var, Buffer], list[E.Var]]:
    """The buffers (by data variable) and the scalar variables a kernel uses from outside."""
    buffers, used, defined = variable_uses(launch.body)
    defined |= {v for v, _ in launch.env} | {b.data for b in launch.shared}
    buffers = {v: b for v, b in buffers.items() if v not in defined}
    scalars = [v for v in used if v not in defined and v not in buffers]
    return buffers, scalars


def _kernel_params(name: str, launch: KernelLaunch, sig: FunctionSignature,
                   workspaces: list[Buffer]) -> tuple[list[KernelParam], list[KernelArg]]:
    buffers, scalars = _free_vars(launch)
    params: list[KernelParam] = []
    args: list[KernelArg] = []
    for i, (_, buf) in enumerate(sig.params):
        if buf is not None and buf.data in buffers:
            params.append(KernelParam(buffer=buffers.pop(buf.data)))
            args.append(KernelArg("buffer", i))
    for i, ws in enumerate(workspaces):
        if ws.data in buffers:
            params.append(KernelParam(buffer=buffers.pop(ws.data)))
            args.append(KernelArg("workspace", i))
    if buffers:
        names = ", ".join(b.name for b in buffers.values())
        raise CodegenError(f"{name}: kernel {launch.name} uses buffers that are neither "
                           f"parameters nor workspaces: {names}")
    scalar_params = [p for p, buf in sig.params if buf is None]
    for v in scalars:
        if v in sig.sym_vars:
            params.append(KernelParam(var=v))
            args.append(KernelArg("sym", sig.sym_vars.index(v), str(v.dtype)))
        elif v in scalar_params:
            params.append(KernelParam(var=v))
            index = [p for p, _ in sig.params].index(v)
            args.append(KernelArg("scalar", index, str(v.dtype)))
        else:
            raise CodegenError(f"{name}: kernel {launch.name} uses the undefined variable "
                               f"{v.name!r}")
    if uses_fresh_seed(launch.body):
        params.append(KernelParam(role="seed"))
        args.append(KernelArg("seed"))
    if uses_checks(launch.body):
        params += [KernelParam(role="checks"), KernelParam(role="call")]
        args += [KernelArg("checks"), KernelArg("call")]
    return params, args


def _sym_sources(sig: FunctionSignature) -> tuple[tuple[int, int], ...]:
    out = []
    for v in sig.sym_vars:
        for i, (_, buf) in enumerate(sig.params):
            if buf is None:
                continue
            axes = [a for a, d in enumerate(buf.shape) if d is v]
            if axes:
                out.append((i, axes[0]))
                break
        else:
            raise CodegenError(f"symbolic dim {v.name!r} is no plain dimension of a parameter")
    return tuple(out)


def generate_source(funcs: Mapping[str, PrimFunc], target: Any
                    ) -> tuple[str, dict[str, DeviceFunction]]:
    """The program's source for ``funcs`` (lowered first when needed) and each function's
    description for the runtime."""
    tgt = Target.create(target)
    if not tgt.is_gpu:
        raise KilnError(f"kiln.codegen.gpu: {tgt.kind!r} is not a GPU target")
    dialect = dialect_for(tgt.kind)
    limits = tgt.gpu
    helpers = GpuHelpers(dialect)
    symbols = NameTable()
    bodies: list[str] = []
    functions: dict[str, DeviceFunction] = {}
    for name, func in lowered_functions(funcs, tgt):
        symbol = symbols.get(name)
        sig = analyze_signature(func, name)
        workspaces, launches = host_parts(func)
        kernels = []
        checks: list[str] = []
        for k, launch in enumerate(launches):
            kname = symbols.get(f"{symbol}_k{k}")
            launch = launch.replace(name=kname)
            params, args = _kernel_params(name, launch, sig, workspaces)
            param_bytes = sum(8 if a.kind in ("buffer", "workspace", "seed", "sym", "checks",
                                              "call")
                              else max(DataType(a.dtype).itemsize, 4) for a in args)
            if param_bytes > limits.max_kernel_param_bytes:
                raise CodegenError(
                    f"{name}: kernel {kname} takes {len(args)} arguments ({param_bytes} bytes), "
                    f"more than the target's {limits.max_kernel_param_bytes} bytes of kernel "
                    "parameters (split the operation, e.g. a concat of fewer tensors)")
            shared = sum(byte_size(b) or 0 for b in launch.shared)
            dynamic = dialect.is_cuda and shared > limits.shared_memory_per_block
            emitter = KernelEmitter(func, launch, params, dialect, helpers, Analyzer(),
                                    dynamic_shared=dynamic, checks=checks)
            try:
                bodies.append(emitter.emit())
            except KilnError:
                raise
            except Exception as err:
                raise CodegenError(f"{name}: code generation of kernel {kname} failed: "
                                   f"{err}") from err
            grid = tuple(shape_expr.encode(g) for g in launch.grid)
            block = tuple(int(b.value) for b in launch.block)  # type: ignore[attr-defined]
            dyn_bytes = sum((((byte_size(b) or 0) + 15) // 16 * 16) for b in launch.shared)
            kernels.append(KernelSpec(kname, tuple(args), grid, block,  # type: ignore[arg-type]
                                      dyn_bytes if dynamic else 0))
        ws = tuple(WorkspaceSpec(b.name, b.dtype.element, shape_expr.encode(alloc_size(b)))
                   for b in workspaces)
        assumptions = tuple((shape_expr.encode(cond), message)
                            for cond, message in func.attrs.get(ASSUME_ATTR) or ())
        functions[name] = DeviceFunction(function_info(name, symbol, func, sig),
                                         _sym_sources(sig), ws, tuple(kernels), assumptions,
                                         tuple(checks))
    source = "\n".join([dialect.prelude, helpers.render(), *bodies])
    return source, functions


def build(funcs: Mapping[str, PrimFunc] | PrimFunc, target: Any) -> Any:
    """Generate and compile the GPU program of ``funcs``; returns a loaded
    :class:`~kiln.runtime.gpu.module.GpuModule` (the device runtime the target needs must be
    installed: ``pip install "kiln[cuda]"`` or ``"kiln[opencl]"``)."""
    if isinstance(funcs, PrimFunc):
        funcs = {str(funcs.attrs.get("global_symbol", "main")): funcs}
    tgt = Target.create(target)
    program = compile_program(funcs, tgt)
    return GpuModule(program)


def compile_program(funcs: Mapping[str, PrimFunc], target: Target) -> DeviceProgram:
    """The :class:`DeviceProgram` of ``funcs``: source, descriptions and (CUDA) binaries."""
    source, functions = generate_source(funcs, target)
    if target.kind == "cuda":
        arch = cuda_arch(target)
        result = compile_cuda(source, arch)  # sm_90a where the source needs it
        return DeviceProgram("cuda", arch, source, functions,
                             {"cubin": result.cubin, "ptx": result.ptx})
    return DeviceProgram("opencl", "", source, functions)
