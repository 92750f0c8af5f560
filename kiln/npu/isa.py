"""The NPU instruction set: opcodes, their operands and the units that execute them.

Every instruction belongs to one unit of a core: the two DMA queues (``dma_in``, ``dma_out``),
the tensor unit, the vector unit or the scalar unit. A core dispatches its instruction stream
into per-unit in-order queues; units run concurrently and order themselves only through
dependency tokens (``tok.push`` / ``tok.pop`` on a queue between two units of the core) and
chip-wide ``barrier`` s, as in VTA's decoupled access-execute design.

Data operands are *blocks*: ``mem[addr]:dtype{s0,s1,s2}``, the element at index ``(i0, i1, i2)``
being at byte ``addr + (i0*s0 + i1*s1 + i2*s2) * itemsize`` of memory ``mem`` (strides in
elements, 0 broadcasts); the instruction's ``shape`` gives the extents. Each opcode's operand
list is its *schema* (:data:`OPCODES`): the binary encoding (:mod:`.encoding`), the text
assembler (:mod:`.asm`) and the simulator's checks are all driven by it, so adding an
instruction is one entry here plus its semantics in :mod:`.simulator`.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, NamedTuple

from ..ir.errors import KilnError
from ..target.npu.config import MEMORY_NAMES, SCALAR_FUNCTIONS

__all__ = [
    "ALU_FUNCS", "Block", "BRANCH_CONDS", "CAST_MODES", "CMP_CONDS", "DTYPES", "Instr",
    "IsaError", "OPCODES", "OpSpec", "TRAP_CODES", "UNITS", "UNIT_DMA_IN", "UNIT_DMA_OUT",
    "UNIT_SCALAR", "UNIT_TENSOR", "UNIT_VECTOR", "mem_id", "mem_name", "unit_of",
]


class IsaError(KilnError):
    """A malformed instruction, program or assembly text (names the instruction)."""


UNITS = ("dma_in", "dma_out", "tensor", "vector", "scalar")
UNIT_DMA_IN, UNIT_DMA_OUT, UNIT_TENSOR, UNIT_VECTOR, UNIT_SCALAR = range(5)

#: Element types an instruction can name, by their 4-bit code.
DTYPES = ("int8", "uint8", "int16", "int32", "float16", "bfloat16", "float32", "int64")
#: ``vcmp`` conditions.
CMP_CONDS = ("lt", "le", "eq", "ne", "gt", "ge")
#: ``vcast`` rounding modes of float -> int conversions (float -> float always rounds to
#: nearest even): nearest even, toward zero, toward -inf.
CAST_MODES = ("rne", "rtz", "floor")
#: ``s.alu`` / ``s.alui`` functions.
ALU_FUNCS = ("add", "sub", "mul", "div", "rem", "min", "max", "and", "or", "xor", "shl", "shr",
             "lt", "le", "eq", "ne")
#: ``s.br`` conditions (compare two registers).
BRANCH_CONDS = ("lt", "ge", "eq", "ne")
#: ``s.trap`` codes: why the program stops (the register named is reported with it).
TRAP_CODES = ("index",)


def mem_id(name: str) -> int:
    try:
        return MEMORY_NAMES.index(name)
    except ValueError:
        raise IsaError(f"unknown memory {name!r} (memories: {', '.join(MEMORY_NAMES)})") from None


def mem_name(i: int) -> str:
    if not 0 <= i < len(MEMORY_NAMES):
        raise IsaError(f"memory id {i} out of range")
    return MEMORY_NAMES[i]


class Block(NamedTuple):
    """A data operand: memory id, byte address, element dtype, element strides (3 dims)."""

    mem: int
    addr: int
    dtype: str
    strides: tuple[int, int, int]

    def __str__(self) -> str:
        s = ",".join(str(x) for x in self.strides)
        return f"{mem_name(self.mem)}[{self.addr:#x}]:{self.dtype}{{{s}}}"


# Field kinds of a schema:
#   shape3 / shape4: extents (>= 1);  ext3: three extents (>= 0, DMA padding)
#   block: a data operand;  opnd: a block or an immediate;  imm: an immediate (int or float)
#   sub:<table>: an index into one of the tables above;  dtype: an element type
#   reg: a scalar register;  mem: a memory id;  addr: a byte address;  unit: a unit id
#   flag: 0/1;  shift: 0..63;  off: a signed branch offset (scalar instructions);  id: 0..65535
@dataclass(frozen=True)
class OpSpec:
    """One opcode: its number, the unit that runs it (None: decided by its ``src``/``dst``
    fields -- the token instructions), its schema and its class in the vector unit's cost
    table (``[vector.cost]`` of the hardware description)."""

    name: str
    code: int
    unit: int | None
    fields: tuple[tuple[str, str], ...]
    cost: str = "default"


def _specs() -> dict[str, OpSpec]:
    shape3, blk = ("shape", "shape3"), "block"
    table: list[tuple[str, int | None, tuple[tuple[str, str], ...], str]] = [
        ("dma.load", UNIT_DMA_IN, (shape3, ("dst", blk), ("src", blk), ("pad_lo", "ext3"),
                                   ("pad_hi", "ext3"), ("fill", "imm")), "default"),
        ("dma.store", UNIT_DMA_OUT, (shape3, ("dst", blk), ("src", blk)), "default"),
        ("mma", UNIT_TENSOR, (("shape", "shape4"), ("c", blk), ("a", blk), ("b", blk)), "default"),
        ("mma.set", UNIT_TENSOR, (("shape", "shape4"), ("c", blk), ("a", blk), ("b", blk)),
         "default"),
    ]
    for name, cost in (("vadd", "default"), ("vsub", "default"), ("vmul", "default"),
                       ("vdiv", "div"), ("vmin", "default"), ("vmax", "default"),
                       ("vmac", "default")):
        table.append((name, UNIT_VECTOR, (shape3, ("dst", blk), ("a", blk), ("b", "opnd")), cost))
    table += [
        ("vshl", UNIT_VECTOR, (shape3, ("dst", blk), ("a", blk), ("b", "opnd")), "default"),
        ("vshr", UNIT_VECTOR, (shape3, ("dst", blk), ("a", blk), ("b", "opnd"),
                               ("round", "flag")), "default"),
        ("vqmul", UNIT_VECTOR, (shape3, ("dst", blk), ("a", blk), ("b", "opnd"),
                                ("shift", "shift")), "default"),
    ]
    for name, cost in (("vmov", "default"), ("vrelu", "default"), ("vneg", "default"),
                       ("vabs", "default"), ("vexp", "exp"), ("vrsqrt", "rsqrt"),
                       ("verf", "erf")):
        table.append((name, UNIT_VECTOR, (shape3, ("dst", blk), ("a", blk)), cost))
    table += [
        ("vcast", UNIT_VECTOR, (shape3, ("mode", "sub:cast"), ("dst", blk), ("a", blk)),
         "default"),
        ("vcmp", UNIT_VECTOR, (shape3, ("cond", "sub:cmp"), ("dst", blk), ("a", blk),
                               ("b", "opnd")), "default"),
        ("vsel", UNIT_VECTOR, (shape3, ("dst", blk), ("mask", blk), ("a", "opnd"),
                               ("b", "opnd")), "default"),
        ("vfill", UNIT_VECTOR, (shape3, ("dst", blk), ("value", "imm")), "default"),
        ("vred.sum", UNIT_VECTOR, (shape3, ("dst", blk), ("a", blk), ("acc", "flag")), "reduce"),
        ("vred.max", UNIT_VECTOR, (shape3, ("dst", blk), ("a", blk), ("acc", "flag")), "reduce"),
        ("vred.min", UNIT_VECTOR, (shape3, ("dst", blk), ("a", blk), ("acc", "flag")), "reduce"),
        ("s.li", UNIT_SCALAR, (("dtype", "dtype"), ("rd", "reg"), ("value", "imm")), "default"),
        ("s.alu", UNIT_SCALAR, (("fn", "sub:alu"), ("dtype", "dtype"), ("rd", "reg"),
                                ("rs1", "reg"), ("rs2", "reg")), "default"),
        ("s.alui", UNIT_SCALAR, (("fn", "sub:alu"), ("dtype", "dtype"), ("rd", "reg"),
                                 ("rs1", "reg"), ("value", "imm")), "default"),
        ("s.ld", UNIT_SCALAR, (("dtype", "dtype"), ("rd", "reg"), ("mem", "mem"),
                               ("base", "reg"), ("offset", "addr")), "default"),
        ("s.st", UNIT_SCALAR, (("dtype", "dtype"), ("rs", "reg"), ("mem", "mem"),
                               ("base", "reg"), ("offset", "addr")), "default"),
        ("s.cvt", UNIT_SCALAR, (("mode", "sub:cast"), ("to", "dtype"), ("from", "dtype"),
                                ("rd", "reg"), ("rs", "reg")), "default"),
        ("s.br", UNIT_SCALAR, (("cond", "sub:br"), ("rs1", "reg"), ("rs2", "reg"),
                               ("target", "off")), "default"),
        ("s.jmp", UNIT_SCALAR, (("target", "off"),), "default"),
        ("tok.push", None, (("src", "unit"), ("dst", "unit")), "default"),
        ("tok.pop", None, (("src", "unit"), ("dst", "unit")), "default"),
        ("barrier", None, (("id", "id"),), "default"),
        ("nop", UNIT_SCALAR, (), "default"),
        # appended, so that the earlier opcodes keep their numbers
        ("s.fn", UNIT_SCALAR, (("fn", "sub:fn"), ("dtype", "dtype"), ("rd", "reg"),
                               ("rs", "reg")), "default"),
        ("s.trap", UNIT_SCALAR, (("code", "sub:trap"), ("rs", "reg")), "default"),
        ("s.copy", UNIT_SCALAR, (("rd", "reg"), ("dst", "addr"), ("rs", "reg"), ("src", "addr"),
                                 ("nbytes", "addr")), "default"),
        # IEEE 754 maxNum: a NaN operand gives the other one (NaN only when both are), as
        # ONNX MaxPool skips NaNs; vmax propagates them
        ("vmaxnm", UNIT_VECTOR, (shape3, ("dst", blk), ("a", blk), ("b", "opnd")), "default"),
    ]
    return {name: OpSpec(name, code, unit, fields, cost)
            for code, (name, unit, fields, cost) in enumerate(table)}


#: Every opcode by name (its ``code`` is its number in the binary encoding).
OPCODES: dict[str, OpSpec] = _specs()
OPCODE_BY_CODE: dict[int, OpSpec] = {s.code: s for s in OPCODES.values()}
SUB_TABLES = {"cast": CAST_MODES, "cmp": CMP_CONDS, "alu": ALU_FUNCS, "br": BRANCH_CONDS,
              "fn": SCALAR_FUNCTIONS, "trap": TRAP_CODES}


@dataclass(eq=True)
class Instr:
    """One instruction: ``op`` and its fields by schema name (``Instr("vadd", shape=(1, 4, 64),
    dst=Block(...), a=Block(...), b=1.5)``). ``note`` is a free comment kept by the assembler
    (``; ...``) but not encoded."""

    op: str
    args: dict[str, Any] = field(default_factory=dict)
    note: str = field(default="", compare=False)

    def __init__(self, op: str, note: str = "", **args: Any):
        if op not in OPCODES:
            raise IsaError(f"unknown opcode {op!r}")
        self.op = op
        self.args = args
        self.note = note

    def __getattr__(self, name: str) -> Any:
        try:
            return self.__dict__["args"][name]
        except KeyError:
            raise AttributeError(name) from None

    @property
    def spec(self) -> OpSpec:
        return OPCODES[self.op]

    @property
    def unit(self) -> int | None:
        """The unit running the instruction (a barrier runs on every unit: None)."""
        return unit_of(self)

    def __repr__(self) -> str:
        return f"Instr({self.op!r}, {self.args!r})"


def unit_of(instr: Instr) -> int | None:
    spec = OPCODES[instr.op]
    if spec.unit is not None:
        return spec.unit
    if instr.op == "tok.push":
        return instr.args["src"]
    if instr.op == "tok.pop":
        return instr.args["dst"]
    return None  # barrier
