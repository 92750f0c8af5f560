"""Which OpenCL device kiln takes (kiln/runtime/gpu/opencl.py's ``pick_device``): the first
whose compiler builds a kernel -- a platform that lists a device but builds nothing there
(PoCL 3.0 of the wheels on a CPU its LLVM 14 does not know) is passed over; with none, a
KilnError names each device and its compiler's error. A fake ``pyopencl``: no device needed."""

from __future__ import annotations

import pytest

from kiln.ir.errors import KilnError
from kiln.runtime.gpu.opencl import pick_device


class _Error(Exception):
    pass


class _Device:
    def __init__(self, name: str, builds: bool):
        self.name, self.builds = name, builds


class _Platform:
    def __init__(self, version: str, devices: list[_Device]):
        self.version, self.devices = version, devices

    def get_devices(self) -> list[_Device]:
        return self.devices


class _FakeCL:
    """The parts of pyopencl ``pick_device`` uses."""

    Error = _Error
    CompilerWarning = UserWarning

    def __init__(self, platforms: list[_Platform]):
        self.platforms = platforms
        self.built: list[str] = []

    def get_platforms(self) -> list[_Platform]:
        return self.platforms

    def Context(self, devices):  # noqa: N802 -- pyopencl's spelling
        return devices[0]

    def Program(self, device, source):  # noqa: N802
        cl = self

        class _Program:
            def build(self):
                cl.built.append(device.name)
                if not device.builds:
                    raise _Error("clBuildProgram failed: BUILD_PROGRAM_FAILURE\n"
                                 "error: unknown target CPU 'generic'")
                return self
        assert "__kernel" in source
        return _Program()


def test_the_first_device_that_builds_is_taken():
    broken = _Device("pthread-AMD EPYC", builds=False)
    good = _Device("pthread-skylake-avx512-AMD EPYC", builds=True)
    cl = _FakeCL([_Platform("PoCL 3.0-rc2 LLVM 14", [broken]),
                  _Platform("PoCL 3.1 LLVM 15", [good])])
    assert pick_device(cl) is good
    assert cl.built == [broken.name, good.name]
    first = _FakeCL([_Platform("a", [good, broken])])
    assert pick_device(first) is good and first.built == [good.name]


def test_no_device_that_builds_is_a_kiln_error_naming_each():
    cl = _FakeCL([_Platform("PoCL 3.0-rc2 LLVM 14", [_Device("pthread-AMD EPYC", False)])])
    with pytest.raises(KilnError, match=r"pthread-AMD EPYC \(PoCL 3.0-rc2 LLVM 14\).*"
                                        r"unknown target CPU 'generic'.*kiln\[opencl\]"):
        pick_device(cl)
    with pytest.raises(KilnError, match="no OpenCL device found"):
        pick_device(_FakeCL([_Platform("empty", [])]))
