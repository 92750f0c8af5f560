"""Code generation for the NPU: graph -> programs for the simulator (:mod:`.compile`) and the
executable that runs them (:mod:`.executable`)."""

from .compile import DEPTHWISE_KEY, LOWERING_KEY, NPUUnsupportedError, build_npu, npu_config_of
from .executable import NPUExecutable

__all__ = ["DEPTHWISE_KEY", "LOWERING_KEY", "NPUExecutable", "NPUUnsupportedError", "build_npu",
           "npu_config_of"]
