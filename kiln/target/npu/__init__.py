"""The NPU target's hardware descriptions and their loader (see :mod:`.config`)."""

from .config import (
    CONFIG_DIR,
    DRAM,
    L0_NAMES,
    L1,
    MEMORY_NAMES,
    ConfigError,
    Encoding,
    MemorySpec,
    NPUConfig,
    TensorDType,
    available_configs,
    load_config,
    parse_size,
)

__all__ = [
    "CONFIG_DIR", "DRAM", "ConfigError", "Encoding", "L0_NAMES", "L1", "MEMORY_NAMES",
    "MemorySpec", "NPUConfig", "TensorDType", "available_configs", "load_config", "parse_size",
]
