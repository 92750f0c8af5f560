"""Running the test suite's numeric cases on GPU targets too, against the CPU's results.

``KILN_TEST_TARGETS=c,opencl`` (a comma-separated list; ``c`` is always run; ``nvrtc`` adds
CUDA builds that are compiled with NVRTC but not run, :data:`COMPILE_ONLY`) makes

- :func:`kiln.testing.op_testing.run_cases` compile every case a second time for each GPU
  target (the op's GPU schedule, else the generic rules of :mod:`kiln.schedule.gpu`), run it
  there and compare with the CPU's result (:func:`assert_close`);
- every ``kiln.build`` for the CPU a test makes (``tests/conftest.py`` patches it; GPU and
  NPU builds are returned as they are) return a
  :class:`CrossCheckExecutable`: each call runs the CPU build, then the GPU build on the same
  inputs, compares, and returns the CPU's result, so the test's own checks still apply.

The comparison is exact for integers and bools; floats may differ by reduction order and math
library rounding (a relative bound on the largest magnitude, NaNs where the CPU has them). A
function reading a fresh random seed (``random_*`` ops without a seed) draws other numbers on
each run, so its results are only checked for shape and dtype. Without a GPU (``cuda``) or an
OpenCL device, asking for that target fails: the variable asks for it explicitly.
"""

from __future__ import annotations

import os
from typing import Any

import numpy as np

from ..target import Target
from ..tir.function import PrimFunc
from ..tir.functor import post_order_visit
from ..tir.gpu import KernelLaunch
from ..tir.tensor_intrin.gpu import MMA_SYNC, MMA_TILE, WGMMA

#: The environment variable listing the targets tests run on.
TARGETS_ENV = "KILN_TEST_TARGETS"


#: In :data:`TARGETS_ENV`: compile every GPU build for CUDA with NVRTC too, without running it
#: (no GPU needed): CI catches CUDA-only compile errors (e.g. a construct OpenCL compilers
#: accept and NVRTC does not) in every op and model test, not only on a GPU machine.
COMPILE_ONLY = "nvrtc"
#: The CUDA architecture compile-only builds are made for.
COMPILE_ONLY_ARCH = "sm_80"


def _names() -> list[str]:
    return [t.strip() for t in os.environ.get(TARGETS_ENV, "").split(",") if t.strip()]


def gpu_test_targets() -> list[Target]:
    """The GPU targets of :data:`TARGETS_ENV` that tests run on (empty: CPU only)."""
    return [Target.create(n) for n in _names()
            if n != COMPILE_ONLY and Target.create(n).is_gpu]


def compile_test_targets() -> list[Target]:
    """The targets tests only compile for (:data:`COMPILE_ONLY` given: CUDA via NVRTC)."""
    return [Target("cuda", arch=COMPILE_ONLY_ARCH)] if COMPILE_ONLY in _names() else []


def tolerance(dtype: np.dtype) -> float:
    """Relative bound between a GPU and the CPU for results of ``dtype``."""
    if dtype.itemsize <= 2:
        return 2e-2  # float16/bfloat16/float8: one rounding of a different float32 value
    return 1e-4


def assert_close(gpu: Any, cpu: Any, what: str, exact: bool = True) -> None:
    """A GPU result equals the CPU's (floats within :func:`tolerance`; see module docstring);
    ``exact=False``: only shapes and dtypes (results drawn from a fresh seed)."""
    if isinstance(cpu, (tuple, list)):
        assert isinstance(gpu, (tuple, list)) and len(gpu) == len(cpu), what
        for k, (a, b) in enumerate(zip(gpu, cpu)):
            assert_close(a, b, f"{what}, output {k}", exact)
        return
    gpu = np.asarray(gpu)
    cpu = np.asarray(cpu)
    assert gpu.shape == cpu.shape, f"{what}: shape {gpu.shape} != CPU {cpu.shape}"
    assert gpu.dtype == cpu.dtype, f"{what}: dtype {gpu.dtype} != CPU {cpu.dtype}"
    if not exact or cpu.size == 0:
        return
    if cpu.dtype.kind not in "fcV" and not _is_low_float(cpu.dtype):
        np.testing.assert_array_equal(gpu, cpu, err_msg=what)
        return
    a, b = gpu.astype(np.float64), cpu.astype(np.float64)
    rtol = tolerance(cpu.dtype)
    finite = np.isfinite(b)
    scale = float(np.max(np.abs(b[finite]))) if finite.any() else 1.0
    np.testing.assert_allclose(a, b, rtol=rtol, atol=rtol * max(scale, 1.0), equal_nan=True,
                               err_msg=what)


def _is_low_float(dtype: np.dtype) -> bool:
    return dtype.kind == "V" or dtype.name in ("bfloat16",) or dtype.name.startswith("float8")


def draws_fresh_seed(module: Any) -> bool:
    """Whether a GPU module's kernels draw a fresh seed (results differ from run to run)."""
    return any(a.kind == "seed" for f in module.program.functions.values()
               for k in f.kernels for a in k.args)


class CrossCheckExecutable:
    """A CPU executable that runs each call on GPU builds too (see the module docstring).
    Everything but calling is the CPU executable's."""

    def __init__(self, cpu: Any, gpus: list[tuple[Target, Any]], exact: bool):
        self._cpu = cpu
        self._gpus = gpus
        self._exact = exact

    def __getattr__(self, name: str) -> Any:
        return getattr(self._cpu, name)

    def _check(self, name: str | None, args: tuple, kwargs: dict, result: Any) -> Any:
        for target, gpu in self._gpus:
            got = (gpu if name is None else gpu[name])(*args, **kwargs)
            assert_close(got, result, f"{target.kind} vs CPU ({name or 'main'})", self._exact)
        return result

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        return self._check(None, args, kwargs, self._cpu(*args, **kwargs))

    def __getitem__(self, name: str):
        fn = self._cpu[name]
        return lambda *args, **kwargs: self._check(name, args, kwargs, fn(*args, **kwargs))


def cross_checked_build(original: Any) -> Any:
    """``kiln.build`` that also builds for the GPU test targets (see the module docstring)."""
    targets = gpu_test_targets()

    def build(mod: Any, target: Any = "c", params: Any = None, pipeline: Any = None,
              **cpu_only: Any) -> Any:
        exe = original(mod, target, params=params, pipeline=pipeline, **cpu_only)
        if Target.create(target).kind != "c":
            # GPU builds are the targets under test; an NPU build computes its products in
            # float16 by design, so a float32 GPU build is no reference for it
            return exe
        for t in compile_test_targets():
            original(mod, t, params=params, pipeline=pipeline)  # compiles; never run
        if not targets:
            return exe
        gpus = [(t, original(mod, t, params=params, pipeline=pipeline)) for t in targets]
        exact = not any(draws_fresh_seed(g.module) for _, g in gpus)
        return CrossCheckExecutable(exe, gpus, exact)

    build.__wrapped__ = original  # type: ignore[attr-defined]
    return build


def kernel_launches(func: PrimFunc) -> list[KernelLaunch]:
    """The kernel launches of a lowered GPU function, in order."""
    out: list[KernelLaunch] = []
    post_order_visit(func.body, lambda n: out.append(n) if isinstance(n, KernelLaunch) else None)
    return out


def mma_calls(func: PrimFunc) -> int:
    """How many tensor-core calls a lowered function holds: per-``mma`` ones (:data:`MMA_SYNC`),
    warp tiles (:data:`MMA_TILE`, each several ``mma``) and warpgroup products
    (:data:`WGMMA`)."""
    calls: list[Any] = []
    post_order_visit(func.body, lambda n: calls.append(n) if getattr(n, "op", None) in (
        MMA_SYNC, MMA_TILE, WGMMA) else None)
    return len(calls)
