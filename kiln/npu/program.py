"""An NPU program: one instruction stream per core, plus what the runtime and reports need.

``streams[c]`` is core ``c``'s instruction list (its dispatcher splits it into per-unit queues;
see :mod:`kiln.npu.isa`). ``labels`` names the phases between barriers (``barrier id ->
label``, e.g. the kernel a barrier ends), which the simulator reports per phase.
``dram_bytes`` is the DRAM the program touches (its data layout is the compiler's business:
:mod:`kiln.codegen.npu`). ``to_bytes``/``from_bytes`` wrap the binary encoding
(:mod:`kiln.npu.encoding`) with the labels.
"""

from __future__ import annotations

import json
import struct
from dataclasses import dataclass, field

from ..ir.errors import KilnError
from ..target.npu.config import NPUConfig, load_config
from .asm import disassemble_program
from .encoding import decode_program, encode_program
from .isa import Instr

__all__ = ["Program"]


@dataclass
class Program:
    """Instruction streams per core for one hardware description."""

    config: NPUConfig
    streams: list[list[Instr]]
    labels: dict[int, str] = field(default_factory=dict)
    dram_bytes: int = 0

    def __post_init__(self) -> None:
        if len(self.streams) != self.config.cores:
            raise KilnError(f"NPU program has {len(self.streams)} stream(s) but "
                            f"{self.config.name!r} has {self.config.cores} core(s)")

    @property
    def num_instructions(self) -> int:
        return sum(len(s) for s in self.streams)

    def op_counts(self) -> dict[str, int]:
        counts: dict[str, int] = {}
        for s in self.streams:
            for ins in s:
                counts[ins.op] = counts.get(ins.op, 0) + 1
        return dict(sorted(counts.items()))

    def assembly(self) -> str:
        return disassemble_program(self.streams)

    def to_bytes(self) -> bytes:
        meta = json.dumps({"config": self.config.name, "labels": self.labels,
                           "dram_bytes": self.dram_bytes}).encode()
        body = encode_program(self.streams, self.config)
        return struct.pack("<Q", len(meta)) + meta + body

    @staticmethod
    def from_bytes(data: bytes, config: NPUConfig | str | None = None) -> Program:
        (n,) = struct.unpack_from("<Q", data, 0)
        meta = json.loads(data[8:8 + n].decode())
        cfg = load_config(config if config is not None else meta["config"])
        streams = decode_program(data[8 + n:], cfg)
        labels = {int(k): v for k, v in meta["labels"].items()}
        return Program(cfg, streams, labels, int(meta["dram_bytes"]))
