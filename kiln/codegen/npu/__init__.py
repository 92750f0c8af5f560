"""Code generation for the NPU: graph -> programs for the simulator (:mod:`.compile`) and the
executable that runs them (:mod:`.executable`)."""

from .compile import NPUUnsupportedError, build_npu, npu_config_of
from .executable import NPUExecutable

__all__ = ["NPUExecutable", "NPUUnsupportedError", "build_npu", "npu_config_of"]
