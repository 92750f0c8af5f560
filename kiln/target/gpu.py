"""GPU targets: ``Target("cuda", arch="sm_90")`` and ``Target("opencl")``, and their limits.

Every number a GPU schedule or lowering pass needs about the hardware -- how many threads a
block may have, how much shared memory it may use, how many registers a thread may hold, the
warp width, how many bytes of kernel parameters a launch may pass -- comes from
:class:`GpuLimits`, read from the target (``target.gpu``), never from a constant in a pass.

CUDA limits are the documented ones of each architecture (CUDA C Programming Guide, "Technical
Specifications per Compute Capability"). OpenCL limits are read from the first OpenCL device
when ``pyopencl`` and a device are present (``CL_DEVICE_MAX_WORK_GROUP_SIZE``,
``CL_DEVICE_LOCAL_MEM_SIZE``, ``CL_DEVICE_MAX_PARAMETER_SIZE``...), else conservative values
that every OpenCL 1.2 device meets. A target's ``attrs`` may override any field by name
(``Target("opencl", attrs={"max_threads_per_block": 128})``).
"""

from __future__ import annotations

import dataclasses
import functools
from dataclasses import dataclass
from typing import Any

from ..ir.errors import KilnError

#: Target kinds that generate GPU kernels.
GPU_KINDS = ("cuda", "opencl")


@dataclass(frozen=True)
class GpuLimits:
    """What one GPU allows a kernel launch (see the module docstring)."""

    #: Threads in one block (work-group), all dimensions together.
    max_threads_per_block: int
    #: Largest block extent per dimension (x, y, z).
    max_block_dims: tuple[int, int, int]
    #: Largest grid extent (blocks) per dimension (x, y, z).
    max_grid_dims: tuple[int, int, int]
    #: Shared (OpenCL: local) memory a block may use without asking for more.
    shared_memory_per_block: int
    #: Shared memory a block may use after opting in (CUDA's dynamic shared memory attribute);
    #: equal to ``shared_memory_per_block`` where there is no opt-in.
    shared_memory_per_block_optin: int
    #: 32-bit registers one thread may use (the compiler spills beyond).
    max_registers_per_thread: int
    #: 32-bit registers of one block, all threads together.
    max_registers_per_block: int
    #: Threads that execute in lockstep (a warp; 1 where nothing is known).
    warp_size: int
    #: Bytes of kernel parameters one launch may pass.
    max_kernel_param_bytes: int
    #: Alignment (bytes) of buffer addresses given to kernels (OpenCL sub-buffer offsets must
    #: be multiples of the device's ``CL_DEVICE_MEM_BASE_ADDR_ALIGN``).
    buffer_alignment: int = 256
    #: Multiprocessors (OpenCL: compute units) of the device the schedules size their grids
    #: for: a schedule choosing between tile sizes keeps at least this many blocks.
    multiprocessors: int = 1

    def with_overrides(self, attrs: dict[str, Any]) -> GpuLimits:
        names = {f.name for f in dataclasses.fields(self)}
        changes = {k: v for k, v in attrs.items() if k in names}
        if not changes:
            return self
        for k, v in changes.items():
            if isinstance(getattr(self, k), tuple):
                if not (isinstance(v, (list, tuple)) and len(v) == 3):
                    raise KilnError(f"target attribute {k!r} must be 3 ints, got {v!r}")
                changes[k] = tuple(int(x) for x in v)
            elif not isinstance(v, int) or isinstance(v, bool) or v <= 0:
                raise KilnError(f"target attribute {k!r} must be a positive int, got {v!r}")
        return dataclasses.replace(self, **changes)


_KIB = 1024
_CUDA_COMMON = dict(
    max_threads_per_block=1024,
    max_block_dims=(1024, 1024, 64),
    max_grid_dims=(2**31 - 1, 65535, 65535),
    shared_memory_per_block=48 * _KIB,
    max_registers_per_thread=255,
    max_registers_per_block=64 * _KIB,
    warp_size=32,
    # 4 KiB: the limit of every CUDA version and architecture (CUDA 12.1+ allows 32764 bytes
    # on Volta and later, but only with a recent driver).
    max_kernel_param_bytes=4096,
    buffer_alignment=256,
)

#: Limits per CUDA architecture: the opt-in shared memory per block, and the multiprocessors
#: of the architecture's data-center part (A100 108, A10/RTX 3090 84, L40/RTX 4090 128 ~ 142,
#: H100 SXM 132); ``Target("cuda", attrs={"multiprocessors": n})`` sets another GPU's.
CUDA_ARCHS: dict[str, GpuLimits] = {
    "sm_80": GpuLimits(**_CUDA_COMMON, shared_memory_per_block_optin=163 * _KIB,
                       multiprocessors=108),
    "sm_86": GpuLimits(**_CUDA_COMMON, shared_memory_per_block_optin=99 * _KIB,
                       multiprocessors=84),
    "sm_89": GpuLimits(**_CUDA_COMMON, shared_memory_per_block_optin=99 * _KIB,
                       multiprocessors=128),
    "sm_90": GpuLimits(**_CUDA_COMMON, shared_memory_per_block_optin=227 * _KIB,
                       multiprocessors=132),
}
#: The architecture a bare ``Target("cuda")`` means.
DEFAULT_CUDA_ARCH = "sm_80"

#: What every OpenCL 1.2 device offers at least (used when no device can be queried).
OPENCL_DEFAULTS = GpuLimits(
    max_threads_per_block=256,
    max_block_dims=(256, 256, 256),
    max_grid_dims=(2**31 - 1, 2**31 - 1, 2**31 - 1),
    shared_memory_per_block=16 * _KIB,
    shared_memory_per_block_optin=16 * _KIB,
    max_registers_per_thread=255,
    max_registers_per_block=64 * _KIB,
    warp_size=1,
    max_kernel_param_bytes=1024,
    buffer_alignment=128,
)


def is_gpu_kind(kind: str) -> bool:
    return kind in GPU_KINDS


def check_target(target: Any) -> None:
    """Validate a GPU target's ``arch`` (the hook ``Target.__post_init__`` calls)."""
    if target.kind == "cuda":
        if target.arch and target.arch not in CUDA_ARCHS:
            raise KilnError(
                f"Target('cuda'): unsupported arch {target.arch!r} (supported: "
                f"{', '.join(CUDA_ARCHS)})")
    elif target.kind == "opencl":
        if target.arch:
            raise KilnError(f"Target('opencl') takes no arch (got {target.arch!r}); the device "
                            "is the first OpenCL device found")
    elif target.arch:
        raise KilnError(f"Target({target.kind!r}) takes no arch (got {target.arch!r})")


def cuda_arch(target: Any) -> str:
    """The ``sm_XY`` a CUDA target compiles for."""
    return target.arch or DEFAULT_CUDA_ARCH


@functools.lru_cache(maxsize=1)
def opencl_device_limits() -> GpuLimits | None:
    """The limits of the first OpenCL device, or None without pyopencl or a device."""
    try:
        import pyopencl as cl
    except ImportError:
        return None
    try:
        device = next(d for p in cl.get_platforms() for d in p.get_devices())
    except (StopIteration, cl.Error):
        return None
    sizes = tuple(int(s) for s in device.max_work_item_sizes)[:3]
    sizes = sizes + (1,) * (3 - len(sizes))
    local = int(device.local_mem_size)
    warp = 1
    if "nvidia" in device.vendor.lower():
        warp = 32
    elif "amd" in device.vendor.lower() and device.type & cl.device_type.GPU:
        warp = 64
    return dataclasses.replace(
        OPENCL_DEFAULTS,
        max_threads_per_block=int(device.max_work_group_size),
        max_block_dims=sizes,  # type: ignore[arg-type]
        shared_memory_per_block=local,
        shared_memory_per_block_optin=local,
        warp_size=warp,
        max_kernel_param_bytes=int(device.max_parameter_size),
        buffer_alignment=max(int(device.mem_base_addr_align) // 8, 16),
        multiprocessors=max(int(device.max_compute_units), 1),
    )


def limits_of(target: Any) -> GpuLimits:
    """The limits of a GPU target (``target.gpu``)."""
    if target.kind == "cuda":
        base = CUDA_ARCHS[cuda_arch(target)]
    elif target.kind == "opencl":
        base = opencl_device_limits() or OPENCL_DEFAULTS
    else:
        raise KilnError(f"target {target.kind!r} is not a GPU target")
    return base.with_overrides(target.attrs)
