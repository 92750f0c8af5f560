"""Text assembly of NPU instructions: :func:`disassemble` writes it, :func:`assemble` reads it.

One instruction per line, ``opcode`` then every schema field as ``name=value``::

    dma.load shape=[16,8,56] dst=input[0x0]:int8{1,1024,16} src=dram[0x4000]:int8{3136,56,1} \
        pad_lo=[0,1,1] pad_hi=[0,1,1] fill=#0
    mma shape=[8,56,64,144] c=acc[0x0]:int32{3584,64,1} a=input[0x0]:int8{1152,32,1} ...
    vadd shape=[1,448,64] dst=acc[0x0]:int32{0,64,1} a=acc[0x0]:int32{0,64,1} \
        b=weight[0x80]:int32{0,0,1}
    tok.push src=dma_in dst=tensor

Values: extents ``[a,b,c]``; blocks ``mem[addr]:dtype{s0,s1,s2}``; immediates ``#3`` (int32) or
``#1.5`` / ``#-inf`` (float32: a decimal point, an exponent, inf or nan); units and table entries
by name; registers ``r3``; memories by name. ``; text`` is a comment (kept as the instruction's
note). A stream of several cores is written as sections ``.core N``. Text and
:class:`~kiln.npu.isa.Instr` round-trip exactly, as do instructions and their binary encoding.
"""

from __future__ import annotations

import re
from typing import Any

from .isa import OPCODES, SUB_TABLES, UNITS, Block, Instr, IsaError, mem_id, mem_name

__all__ = ["assemble", "assemble_program", "disassemble", "disassemble_program", "format_instr"]

_BLOCK = re.compile(r"^([a-z0-9_]+)\[(0x[0-9a-fA-F]+|\d+)\]:([a-z0-9]+)"
                    r"\{(-?\d+),(-?\d+),(-?\d+)\}$")


def _fmt_imm(v: Any) -> str:
    if isinstance(v, bool):
        v = int(v)
    if isinstance(v, int):
        return f"#{v}"
    return f"#{float(v)!r}"


def _fmt(kind: str, v: Any) -> str:
    if kind in ("shape3", "shape4", "ext3"):
        return "[" + ",".join(str(int(e)) for e in v) + "]"
    if kind == "block":
        return str(v)
    if kind == "opnd":
        return str(v) if isinstance(v, Block) else _fmt_imm(v)
    if kind == "imm":
        return _fmt_imm(v)
    if kind == "reg":
        return f"r{int(v)}"
    if kind == "mem":
        return mem_name(int(v))
    if kind == "unit":
        return UNITS[int(v)]
    if kind == "flag":
        return str(int(bool(v)))
    return str(v)


def format_instr(ins: Instr) -> str:
    """One line of assembly for ``ins`` (with its note as a comment)."""
    parts = [ins.op] + [f"{name}={_fmt(kind, ins.args[name])}" for name, kind in ins.spec.fields]
    line = " ".join(parts)
    return f"{line} ; {ins.note}" if ins.note else line


def _parse_imm(text: str, what: str) -> Any:
    if not text.startswith("#"):
        raise IsaError(f"{what}: expected an immediate '#value', got {text!r}")
    body = text[1:]
    try:
        if re.search(r"[.eE]|inf|nan", body):
            return float(body)
        return int(body, 0)
    except ValueError:
        raise IsaError(f"{what}: bad immediate {text!r}") from None


def _parse_block(text: str, what: str) -> Block:
    m = _BLOCK.match(text)
    if not m:
        raise IsaError(f"{what}: expected a block 'mem[addr]:dtype{{s0,s1,s2}}', got {text!r}")
    mem, addr, dtype = m.group(1), int(m.group(2), 0), m.group(3)
    return Block(mem_id(mem), addr, dtype, (int(m.group(4)), int(m.group(5)), int(m.group(6))))


def _parse(kind: str, text: str, what: str) -> Any:
    try:
        if kind in ("shape3", "shape4", "ext3"):
            if not (text.startswith("[") and text.endswith("]")):
                raise IsaError(f"{what}: expected [a,b,...], got {text!r}")
            return tuple(int(x) for x in text[1:-1].split(","))
        if kind == "block":
            return _parse_block(text, what)
        if kind == "opnd":
            return _parse_imm(text, what) if text.startswith("#") else _parse_block(text, what)
        if kind == "imm":
            return _parse_imm(text, what)
        if kind.startswith("sub:"):
            if text not in SUB_TABLES[kind[4:]]:
                raise IsaError(f"{what}: {text!r} is not one of "
                               f"{', '.join(SUB_TABLES[kind[4:]])}")
            return text
        if kind == "dtype":
            return text
        if kind == "reg":
            if not re.fullmatch(r"r\d+", text):
                raise IsaError(f"{what}: expected a register rN, got {text!r}")
            return int(text[1:])
        if kind == "mem":
            return mem_id(text)
        if kind == "unit":
            if text not in UNITS:
                raise IsaError(f"{what}: unknown unit {text!r} (units: {', '.join(UNITS)})")
            return UNITS.index(text)
        if kind == "flag":
            if text not in ("0", "1"):
                raise IsaError(f"{what}: expected 0 or 1, got {text!r}")
            return text == "1"
        return int(text, 0)
    except ValueError:
        raise IsaError(f"{what}: cannot read {text!r}") from None


def parse_line(line: str, lineno: int = 0) -> Instr | None:
    """The instruction on one line of assembly (None for a blank or comment-only line)."""
    code, _, note = line.partition(";")
    tokens = code.split()
    if not tokens:
        return None
    op = tokens[0]
    where = f"line {lineno}: {op}" if lineno else op
    spec = OPCODES.get(op)
    if spec is None:
        raise IsaError(f"{where}: unknown opcode")
    kinds = dict(spec.fields)
    args: dict[str, Any] = {}
    for tok in tokens[1:]:
        name, eq, value = tok.partition("=")
        if not eq or name not in kinds:
            raise IsaError(f"{where}: unexpected {tok!r} (fields: {', '.join(kinds)})")
        if name in args:
            raise IsaError(f"{where}: field {name!r} given twice")
        args[name] = _parse(kinds[name], value, f"{where} {name}")
    missing = [n for n in kinds if n not in args]
    if missing:
        raise IsaError(f"{where}: missing field(s) {', '.join(missing)}")
    return Instr(op, note=note.strip(), **args)


def assemble(text: str) -> list[Instr]:
    """Instructions from assembly text (one stream)."""
    out = []
    for i, line in enumerate(text.splitlines(), 1):
        ins = parse_line(line, i)
        if ins is not None:
            out.append(ins)
    return out


def disassemble(instrs: list[Instr]) -> str:
    """Assembly text of one stream."""
    return "\n".join(format_instr(i) for i in instrs) + ("\n" if instrs else "")


def disassemble_program(streams: list[list[Instr]]) -> str:
    """Assembly text of a program: one ``.core N`` section per core."""
    return "".join(f".core {c}\n{disassemble(s)}" for c, s in enumerate(streams))


def assemble_program(text: str) -> list[list[Instr]]:
    """Inverse of :func:`disassemble_program`."""
    streams: list[list[Instr]] = []
    for i, line in enumerate(text.splitlines(), 1):
        stripped = line.split(";")[0].strip()
        if stripped.startswith(".core"):
            parts = stripped.split()
            if len(parts) != 2 or not parts[1].isdigit() or int(parts[1]) != len(streams):
                raise IsaError(f"line {i}: expected '.core {len(streams)}'")
            streams.append([])
            continue
        ins = parse_line(line, i)
        if ins is None:
            continue
        if not streams:
            raise IsaError(f"line {i}: instruction before the first '.core N' section")
        streams[-1].append(ins)
    return streams
