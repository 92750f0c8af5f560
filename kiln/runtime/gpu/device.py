"""The device interface the GPU runtime runs on, and how to get one per target kind.

A :class:`Device` allocates memory, copies between host and device, loads a
:class:`~kiln.runtime.gpu.program.DeviceProgram` and launches its kernels, in order, on one
queue (CUDA stream, OpenCL in-order command queue): a kernel sees everything the ones enqueued
before it wrote. Two implementations: :mod:`kiln.runtime.gpu.opencl` (``pyopencl``; with PoCL
it runs the kernels on the CPU, which is how CI tests GPU code without a GPU) and
:mod:`kiln.runtime.gpu.cuda` (``cuda-bindings``, the CUDA driver API). Each is an optional
extra of the package; without it :func:`kiln.runtime.gpu.module.get_device` raises a KilnError
naming the extra.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np

from ...ir.errors import KilnError

#: The pip extra that brings each kind's runtime.
EXTRAS = {"cuda": "kiln[cuda]", "opencl": "kiln[opencl]"}


def missing_runtime(kind: str, why: Any) -> KilnError:
    """The error for a target whose runtime is not installed or finds no device."""
    return KilnError(f"the {kind} runtime is not available ({why}); install it with "
                     f"pip install \"{EXTRAS[kind]}\"")


@dataclass
class DeviceBuffer:
    """Device memory: ``handle`` (a CUDA address, an OpenCL ``cl.Buffer``), ``nbytes``, and
    what keeps it allocated (``owner``: the allocation a view points into)."""

    handle: Any
    nbytes: int
    owner: Any = None


class Device:
    """One GPU (or OpenCL device) and its queue; see the module docstring."""

    kind: str = ""
    #: Alignment (bytes) of every buffer handed to a kernel.
    alignment: int = 256

    def alloc(self, nbytes: int) -> DeviceBuffer:
        raise NotImplementedError

    def view(self, buf: DeviceBuffer, offset: int, nbytes: int) -> DeviceBuffer:
        """``nbytes`` of ``buf`` from ``offset`` (a multiple of :attr:`alignment`)."""
        raise NotImplementedError

    def upload(self, buf: DeviceBuffer, array: np.ndarray) -> None:
        """Copy a C-contiguous host array into ``buf`` (ordered with the launches)."""
        raise NotImplementedError

    def download(self, buf: DeviceBuffer, array: np.ndarray) -> None:
        """Copy ``buf`` into a C-contiguous host array, after every launch enqueued before."""
        raise NotImplementedError

    def load(self, program: Any) -> dict[str, Any]:
        """Load a DeviceProgram: a handle per kernel name."""
        raise NotImplementedError

    def launch(self, kernel: Any, grid: tuple[int, int, int], block: tuple[int, int, int],
               args: list[Any], shared_bytes: int = 0) -> None:
        """Enqueue one launch; ``args`` are DeviceBuffers and numpy scalars."""
        raise NotImplementedError

    def synchronize(self) -> None:
        raise NotImplementedError

    def check_grid(self, name: str, grid: tuple[int, int, int], limits: Any) -> None:
        """A grid evaluated at run time must fit the device (symbolic extents)."""
        for axis, (g, limit) in enumerate(zip(grid, limits.max_grid_dims)):
            if g > limit:
                raise KilnError(f"kernel {name}: {g} blocks along {'xyz'[axis]} exceed the "
                                f"device's limit of {limit}")
