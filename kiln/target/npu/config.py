"""The NPU hardware description: one TOML file per configuration, loaded into :class:`NPUConfig`.

The description is the single source of truth for the accelerator. Everything else derives from
it: the instruction encoding's field widths (:attr:`NPUConfig.encoding`), the simulator's timing
(:mod:`kiln.npu.simulator` reads latencies, bandwidths, widths and bank geometry from here), the
compiler's cost model (:mod:`kiln.codegen.npu.cost`) and its limits (buffer sizes, the largest
block extent an instruction can encode, element alignment).

Shipped configurations live next to this module (``default.toml``, ``edge.toml``);
:func:`load_config` takes one of their names or the path of any other file written in the same
format (docs/npu.md: "Retargeting kiln to a new NPU").
"""

from __future__ import annotations

import functools
import math
import os
import re
import tomllib
from dataclasses import dataclass, field
from typing import Any

from ...ir.dtype import DataType
from ...ir.errors import KilnError

__all__ = [
    "CONFIG_DIR", "DRAM", "Encoding", "L0_NAMES", "L1", "MEMORY_NAMES", "MemorySpec",
    "NPUConfig", "SCALAR_FUNCTIONS", "TensorDType", "available_configs", "config_from_dict",
    "load_config", "parse_size",
]

CONFIG_DIR = os.path.dirname(os.path.abspath(__file__))

#: Memory spaces in the order of their ids in instructions: DRAM (chip-wide), L1 (shared by the
#: cores), then each core's own L0 buffers (an instruction names its core's).
DRAM, L1 = "dram", "l1"
L0_NAMES = ("input", "weight", "acc")
MEMORY_NAMES = (DRAM, L1, *L0_NAMES)
#: The float functions a scalar unit may implement (``s.fn``; ``[scalar] functions`` lists
#: those of a description, ``kiln.npu.numerics.scalar_function`` specifies each).
SCALAR_FUNCTIONS = ("exp", "log", "sqrt", "rsqrt", "sin", "cos", "tanh", "erf", "floor",
                    "ceil", "round")

_UNITS = {"b": 1, "kib": 1 << 10, "mib": 1 << 20, "gib": 1 << 30}


class ConfigError(KilnError):
    """A hardware description that is malformed or inconsistent (names the file and the key)."""


def _scalar_functions(table: Any, what: str) -> tuple[str, ...]:
    names = table.get("functions", [])
    if not isinstance(names, list) or any(n not in SCALAR_FUNCTIONS for n in names):
        raise ConfigError(f"{what}: expected a list of {', '.join(SCALAR_FUNCTIONS)}, "
                          f"got {names!r}")
    return tuple(names)


def parse_size(value: Any, what: str) -> int:
    """``"128 KiB"`` / ``"1 GiB"`` / ``4096`` -> bytes."""
    if isinstance(value, int) and not isinstance(value, bool) and value > 0:
        return value
    m = re.fullmatch(r"\s*(\d+)\s*([KMG]iB|B)\s*", str(value), re.IGNORECASE)
    if not m:
        raise ConfigError(f"{what}: expected a size such as \"128 KiB\", got {value!r}")
    return int(m.group(1)) * _UNITS[m.group(2).lower()]


@dataclass(frozen=True)
class MemorySpec:
    """One memory: ``size`` bytes in ``banks`` banks of ``bank_width`` bytes per access, each
    bank serving ``ports`` accesses per cycle; ``latency`` cycles to the first byte of a DMA;
    ``bandwidth`` bytes per cycle (DRAM: the chip's; on-chip: banks x width x ports).

    ``bank_groups`` splits an on-chip memory by address range into that many equal groups
    (``size / bank_groups`` bytes each); each group is a whole set of ``banks`` banks of
    ``bank_width`` bytes, interleaved inside it as the memory was before (``banks`` counts a
    group's banks: the memory has ``banks x bank_groups``). A group is the unit of arbitration
    between the units of a core: two units touching one group at once share its ``ports``
    (the simulator's rule: :mod:`kiln.npu.simulator`). One group (the default) has no such
    arbitration: the memory is multi-ported between units, as before groups existed."""

    name: str
    size: int
    banks: int
    bank_width: int
    ports: int
    latency: int
    bandwidth: int
    burst: int = 1
    bank_groups: int = 1

    @property
    def group_bytes(self) -> int:
        """Bytes of one bank group (an address range ``[g * group_bytes, (g+1) * ...)``)."""
        return self.size // self.bank_groups

    @property
    def per_core(self) -> bool:
        return self.name in L0_NAMES


@dataclass(frozen=True)
class TensorDType:
    """A dtype combination of the tensor unit: A x B accumulated in ``acc``."""

    a: DataType
    b: DataType
    acc: DataType
    cycles_per_tile: int


@dataclass(frozen=True)
class Encoding:
    """Field widths of the binary instruction encoding, derived from the memories' sizes: an
    address field holds any byte address of the largest memory, an extent any element count of
    the largest on-chip buffer, a stride (signed, in elements) any distance within the largest
    memory."""

    addr_bits: int
    extent_bits: int
    stride_bits: int
    mem_bits: int
    reg_bits: int
    queue_bits: int

    @property
    def max_extent(self) -> int:
        return (1 << self.extent_bits) - 1

    @property
    def max_stride(self) -> int:
        return (1 << (self.stride_bits - 1)) - 1


@dataclass(frozen=True)
class NPUConfig:
    """A loaded hardware description (see the module docstring and docs/npu.md)."""

    name: str
    path: str
    clock_mhz: int
    cores: int
    memories: dict[str, MemorySpec]
    dma_channels: int
    dma_latency: int
    dma_onchip_bandwidth: int
    tensor_shape: tuple[int, int, int]  # (m, k, n)
    tensor_latency: int
    tensor_dtypes: tuple[TensorDType, ...]
    vector_width: int
    vector_latency: int
    vector_dtypes: tuple[DataType, ...]
    vector_cost: dict[str, int]
    scalar_registers: int
    scalar_latency: int
    scalar_memory_latency: int
    token_queue_depth: int
    barrier_latency: int
    raw: dict[str, Any] = field(repr=False, compare=False, hash=False, default_factory=dict)
    #: ``s.fn`` functions of the scalar unit and the cycles of one (``[scalar] functions``,
    #: ``function_latency``; none when the description lists none)
    scalar_functions: tuple[str, ...] = ()
    scalar_function_latency: int = 1

    # ---- derived facts -------------------------------------------------------------------
    @property
    def encoding(self) -> Encoding:
        largest = max(m.size for m in self.memories.values())
        onchip = max(self.memories[n].size for n in L0_NAMES)
        addr_bits = max(1, (largest - 1).bit_length())
        return Encoding(
            addr_bits=addr_bits,
            extent_bits=max(1, onchip.bit_length()),
            stride_bits=addr_bits + 1,
            mem_bits=max(1, (len(MEMORY_NAMES) - 1).bit_length()),
            reg_bits=max(1, (self.scalar_registers - 1).bit_length()),
            queue_bits=3,
        )

    def memory(self, name: str) -> MemorySpec:
        try:
            return self.memories[name]
        except KeyError:
            raise KilnError(f"NPU {self.name!r} has no memory {name!r} "
                            f"(memories: {', '.join(self.memories)})") from None

    def tensor_dtype(self, a: Any, b: Any) -> TensorDType | None:
        """The tensor unit's combination for operand dtypes ``a`` x ``b`` (None: unsupported)."""
        for td in self.tensor_dtypes:
            if td.a == a and td.b == b:
                return td
        return None

    def supports_vector_dtype(self, dtype: Any) -> bool:
        return DataType(str(dtype)) in self.vector_dtypes

    @property
    def tensor_macs_per_cycle(self) -> float:
        """Peak multiply-accumulates per cycle of one core at the fastest dtype."""
        m, k, n = self.tensor_shape
        return m * k * n / min(td.cycles_per_tile for td in self.tensor_dtypes)

    def vector_ops_cycles(self, nbytes: int, op_class: str = "default") -> int:
        """Cycles the vector unit is busy streaming ``nbytes`` (of its widest operand)."""
        cost = self.vector_cost.get(op_class, self.vector_cost.get("default", 1))
        return max(1, math.ceil(nbytes / self.vector_width)) * cost

    def dram_cycles(self, nbytes: int) -> float:
        """Cycles of DRAM bandwidth that moving ``nbytes`` takes (ideal bursts)."""
        return nbytes / self.memories[DRAM].bandwidth

    def describe(self) -> str:
        """A one-paragraph summary (for ``kiln show`` and the benchmark)."""
        m, k, n = self.tensor_shape
        l0 = ", ".join(f"{nm} {self.memories[nm].size >> 10} KiB" for nm in L0_NAMES)
        return (f"NPU {self.name!r}: {self.cores} core(s) at {self.clock_mhz} MHz, tensor unit "
                f"{m}x{k}x{n}, vector {self.vector_width} B/cycle, L0 {l0}, L1 "
                f"{self.memories[L1].size >> 10} KiB, DRAM {self.memories[DRAM].bandwidth} "
                f"B/cycle")


def available_configs() -> list[str]:
    """Names of the shipped hardware descriptions."""
    return sorted(f[:-5] for f in os.listdir(CONFIG_DIR) if f.endswith(".toml"))


def _get(table: dict[str, Any], key: str, what: str, kind: type = int) -> Any:
    if key not in table:
        raise ConfigError(f"{what}: missing key {key!r}")
    value = table[key]
    if kind is int and (not isinstance(value, int) or isinstance(value, bool) or value <= 0):
        raise ConfigError(f"{what}.{key}: expected a positive integer, got {value!r}")
    if kind is str and not isinstance(value, str):
        raise ConfigError(f"{what}.{key}: expected a string, got {value!r}")
    return value


def _memory(name: str, table: dict[str, Any], what: str) -> MemorySpec:
    if not isinstance(table, dict):
        raise ConfigError(f"{what}: expected a table")
    size = parse_size(_get(table, "size", what, object), f"{what}.size")
    if name == DRAM:
        bw = _get(table, "bandwidth", what)
        return MemorySpec(name, size, 1, bw, 1, _get(table, "latency", what), bw,
                          _get(table, "burst", what))
    banks, width = _get(table, "banks", what), _get(table, "bank_width", what)
    ports = _get(table, "ports", what)
    if size % (banks * width):
        raise ConfigError(f"{what}: size {size} is not a multiple of banks x bank_width "
                          f"({banks} x {width})")
    latency = int(table.get("latency", 1))
    groups = table.get("bank_groups", 1)
    if not isinstance(groups, int) or isinstance(groups, bool) or groups <= 0:
        raise ConfigError(f"{what}.bank_groups: expected a positive integer, got {groups!r}")
    if size % (groups * banks * width):
        raise ConfigError(f"{what}: size {size} is not a multiple of bank_groups x banks x "
                          f"bank_width ({groups} x {banks} x {width}): every group holds "
                          "whole lines of its banks")
    return MemorySpec(name, size, banks, width, ports, latency, banks * width * ports,
                      bank_groups=groups)


def _dtype(value: Any, what: str) -> DataType:
    try:
        return DataType(str(value))
    except Exception as err:  # noqa: BLE001 - any parse failure is the file's fault
        raise ConfigError(f"{what}: unknown dtype {value!r} ({err})") from None


@functools.lru_cache(maxsize=32)
def _load_path(path: str) -> NPUConfig:
    try:
        with open(path, "rb") as f:
            raw = tomllib.load(f)
    except OSError as err:
        raise ConfigError(f"cannot read NPU description {path}: {err}") from None
    except tomllib.TOMLDecodeError as err:
        raise ConfigError(f"{path}: not valid TOML ({err})") from None
    return config_from_dict(raw, path)


def config_from_dict(raw: dict[str, Any], path: str) -> NPUConfig:
    """The description whose TOML tables are ``raw`` (as ``tomllib`` reads them; kept as
    ``NPUConfig.raw``), read from ``path``: how a saved NPU executable carries its own."""
    if not isinstance(raw, dict):
        raise ConfigError(f"{path}: an NPU description is a table of tables")
    what = os.path.basename(path)
    memories = {DRAM: _memory(DRAM, raw.get("dram"), f"{what}: [dram]"),
                L1: _memory(L1, raw.get("l1"), f"{what}: [l1]")}
    l0 = raw.get("l0")
    if not isinstance(l0, dict):
        raise ConfigError(f"{what}: missing the [l0.<buffer>] tables ({', '.join(L0_NAMES)})")
    for name in L0_NAMES:
        if name not in l0:
            raise ConfigError(f"{what}: missing [l0.{name}]")
        memories[name] = _memory(name, l0[name], f"{what}: [l0.{name}]")
    unknown = set(l0) - set(L0_NAMES)
    if unknown:
        raise ConfigError(f"{what}: unknown L0 buffer(s) {sorted(unknown)} (the ISA names "
                          f"{', '.join(L0_NAMES)})")
    dma, tensor, vector = raw.get("dma", {}), raw.get("tensor", {}), raw.get("vector", {})
    scalar, sync = raw.get("scalar", {}), raw.get("sync", {})
    tdtypes = []
    for i, entry in enumerate(tensor.get("dtypes", ())):
        w = f"{what}: tensor.dtypes[{i}]"
        tdtypes.append(TensorDType(_dtype(entry.get("a"), w), _dtype(entry.get("b"), w),
                                   _dtype(entry.get("acc"), w),
                                   _get(entry, "cycles_per_tile", w)))
    if not tdtypes:
        raise ConfigError(f"{what}: tensor.dtypes lists no dtype combination")
    cost = {str(k): int(v) for k, v in vector.get("cost", {}).items()}
    cores = _get(raw, "cores", what)
    channels = _get(dma, "channels", f"{what}: [dma]")
    if channels != 2:
        raise ConfigError(f"{what}: dma.channels must be 2 (an inbound and an outbound queue)")
    cfg = NPUConfig(
        name=_get(raw, "name", what, str), path=path,
        clock_mhz=_get(raw, "clock_mhz", what), cores=cores, memories=memories,
        dma_channels=channels,
        dma_latency=_get(dma, "latency", f"{what}: [dma]"),
        dma_onchip_bandwidth=_get(dma, "onchip_bandwidth", f"{what}: [dma]"),
        tensor_shape=tuple(_get(tensor, d, f"{what}: [tensor]") for d in "mkn"),  # type: ignore[arg-type]
        tensor_latency=_get(tensor, "latency", f"{what}: [tensor]"),
        tensor_dtypes=tuple(tdtypes),
        vector_width=_get(vector, "width", f"{what}: [vector]"),
        vector_latency=_get(vector, "latency", f"{what}: [vector]"),
        vector_dtypes=tuple(_dtype(d, f"{what}: vector.dtypes") for d in vector.get("dtypes", ())),
        vector_cost=cost,
        scalar_registers=_get(scalar, "registers", f"{what}: [scalar]"),
        scalar_latency=_get(scalar, "latency", f"{what}: [scalar]"),
        scalar_memory_latency=_get(scalar, "memory_latency", f"{what}: [scalar]"),
        token_queue_depth=_get(sync, "token_queue_depth", f"{what}: [sync]"),
        barrier_latency=_get(sync, "barrier_latency", f"{what}: [sync]"),
        raw=raw,
        scalar_functions=_scalar_functions(scalar, f"{what}: scalar.functions"),
        scalar_function_latency=int(scalar.get("function_latency", 1)),
    )
    if cfg.scalar_function_latency < 1:
        raise ConfigError(f"{what}: scalar.function_latency must be >= 1")
    if cfg.scalar_registers > 64:
        raise ConfigError(f"{what}: scalar.registers is at most 64")
    if cores > 16:
        raise ConfigError(f"{what}: at most 16 cores")
    return cfg


def load_config(name_or_path: str | NPUConfig = "default") -> NPUConfig:
    """The hardware description named ``name_or_path`` (a shipped configuration: ``"default"``,
    ``"edge"``) or read from a ``.toml`` path; an :class:`NPUConfig` is returned as is."""
    if isinstance(name_or_path, NPUConfig):
        return name_or_path
    spec = str(name_or_path)
    if spec.endswith(".toml") or os.sep in spec:
        return _load_path(os.path.abspath(spec))
    path = os.path.join(CONFIG_DIR, f"{spec}.toml")
    if not os.path.exists(path):
        raise ConfigError(f"unknown NPU configuration {spec!r} (shipped: "
                          f"{', '.join(available_configs())}; or give a .toml path)")
    return _load_path(path)
