"""kiln.runtime.gpu.cuda without a GPU: what ``CudaDevice`` decides on the host (its module
cache), against a fake of the driver calls it makes. (The device tests, marked ``gpu``, are in
test_runtime_gpu_cuda.py.)"""

from __future__ import annotations

from kiln.runtime.gpu.cuda import CudaDevice
from kiln.runtime.gpu.program import DeviceProgram


class _FakeDriver:
    """The few driver calls ``CudaDevice.load`` makes, counting module loads (no GPU)."""

    class CUfunction_attribute:  # noqa: N801 - the driver's name
        CU_FUNC_ATTRIBUTE_MAX_DYNAMIC_SHARED_SIZE_BYTES = 8

    def __init__(self):
        self.loaded = []

    def cuModuleLoadData(self, image):  # noqa: N802 - the driver's name
        self.loaded.append(image)
        return 0, f"module{len(self.loaded)}"

    def cuModuleGetFunction(self, module, name):  # noqa: N802
        return 0, (module, name)

    def cuFuncSetAttribute(self, fn, attr, value):  # noqa: N802
        return 0


def test_a_program_at_a_dead_programs_address_gets_its_own_kernels():
    """CudaDevice.load keeps the kernels it loaded by ``id(program)``: a program Python later
    puts at a dead program's address (the same ``id``; kernels of the same names, e.g. every
    test's ``f_k0``) must be loaded, not handed the dead one's code -- on the H100 two
    convolution tests once ran an earlier test's kernel. The entry of a program that is gone
    goes with it."""
    device = object.__new__(CudaDevice)  # no driver: the load logic alone
    device.cu, device.arch, device._modules = _FakeDriver(), "sm_90", {}
    first = DeviceProgram("cuda", "sm_90", "first", {}, {"cubin": b"first"})
    second = DeviceProgram("cuda", "sm_90", "second", {}, {"cubin": b"second"})
    assert device.load(first)["__module__"] == "module1"
    assert device.load(first)["__module__"] == "module1"  # loaded once
    # what a reused address looks like: the entry under second's id is another program's
    device._modules[id(second)] = device._modules.pop(id(first))
    assert device.load(second)["__module__"] == "module2"
    assert device.cu.loaded == [b"first", b"second"]
    del second
    assert not device._modules  # first's entry was moved away, second's went with it
