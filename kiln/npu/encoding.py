"""Binary encoding of NPU instructions and programs.

An instruction is a bit string: the 8-bit opcode, then its schema's fields (:mod:`.isa`) in
order, each as wide as the hardware description says (:attr:`NPUConfig.encoding`: an address
field holds any byte address of the largest memory, an extent any element count of the largest
on-chip buffer, strides are signed and span the largest memory), padded to whole 32-bit words.
A block operand is ``mem, addr, dtype, 3 strides``; an immediate is a 1-bit tag (0: int32,
1: float32) and 32 bits; an ``opnd`` field starts with a 1-bit "immediate" flag.

A program file (:func:`encode_program`) is ``b"KNPU"``, a format version, the name of the
hardware description and a fingerprint of its encoding (a program only decodes under the field
widths it was encoded with), then per core the number of 32-bit words and the words.
"""

from __future__ import annotations

import struct
import zlib
from typing import Any

import numpy as np

from ..target.npu.config import Encoding, NPUConfig
from .isa import DTYPES, OPCODE_BY_CODE, OPCODES, SUB_TABLES, Block, Instr, IsaError

__all__ = ["decode", "decode_program", "encode", "encode_program", "encoding_fingerprint"]

MAGIC = b"KNPU"
FORMAT_VERSION = 1
OPCODE_BITS = 8
DTYPE_BITS = 4
SUB_BITS = 4
UNIT_BITS = 3
SHIFT_BITS = 6
OFF_BITS = 24
ID_BITS = 16


class _Writer:
    def __init__(self) -> None:
        self.value = 0
        self.nbits = 0

    def put(self, v: int, bits: int, what: str) -> None:
        if not 0 <= v < (1 << bits):
            raise IsaError(f"{what}: {v} does not fit {bits} bits")
        self.value |= v << self.nbits
        self.nbits += bits

    def signed(self, v: int, bits: int, what: str) -> None:
        lim = 1 << (bits - 1)
        if not -lim <= v < lim:
            raise IsaError(f"{what}: {v} does not fit a signed {bits}-bit field")
        self.put(v & ((1 << bits) - 1), bits, what)

    def words(self) -> list[int]:
        n = max(1, -(-self.nbits // 32))
        return [(self.value >> (32 * i)) & 0xFFFFFFFF for i in range(n)]


class _Reader:
    def __init__(self, words: Any, pos: int):
        self.words, self.start, self.bit = words, pos, 0

    def get(self, bits: int) -> int:
        out, got = 0, 0
        while got < bits:
            w = self.start + (self.bit >> 5)
            if w >= len(self.words):
                raise IsaError("truncated instruction stream")
            off = self.bit & 31
            take = min(32 - off, bits - got)
            out |= ((int(self.words[w]) >> off) & ((1 << take) - 1)) << got
            got += take
            self.bit += take
        return out

    def signed(self, bits: int) -> int:
        v = self.get(bits)
        return v - (1 << bits) if v >> (bits - 1) else v

    @property
    def next_pos(self) -> int:
        return self.start + max(1, -(-self.bit // 32))


def _f32_bits(v: float) -> int:
    return struct.unpack("<I", struct.pack("<f", v))[0]


def _put_imm(w: _Writer, v: Any, what: str) -> None:
    if isinstance(v, (bool, np.bool_)):
        v = int(v)
    if isinstance(v, (int, np.integer)):
        w.put(0, 1, what)
        w.signed(int(v), 32, what)
        return
    f = float(v)
    if np.isfinite(f) and float(np.float32(f)) != f:
        raise IsaError(f"{what}: immediate {f!r} is not a float32 value")
    w.put(1, 1, what)
    w.put(_f32_bits(f), 32, what)


def _get_imm(r: _Reader) -> Any:
    if r.get(1) == 0:
        return r.signed(32)
    return float(struct.unpack("<f", struct.pack("<I", r.get(32)))[0])


def _put_block(w: _Writer, b: Block, enc: Encoding, what: str) -> None:
    if not isinstance(b, Block):
        raise IsaError(f"{what}: expected a block operand, got {b!r}")
    w.put(b.mem, enc.mem_bits, what)
    w.put(b.addr, enc.addr_bits, what)
    if b.dtype not in DTYPES:
        raise IsaError(f"{what}: dtype {b.dtype!r} is not an NPU element type")
    w.put(DTYPES.index(b.dtype), DTYPE_BITS, what)
    if len(b.strides) != 3:
        raise IsaError(f"{what}: a block has 3 strides, got {b.strides}")
    for s in b.strides:
        w.signed(int(s), enc.stride_bits, what)


def _get_block(r: _Reader, enc: Encoding) -> Block:
    mem = r.get(enc.mem_bits)
    addr = r.get(enc.addr_bits)
    dtype = DTYPES[r.get(DTYPE_BITS)]
    strides = (r.signed(enc.stride_bits), r.signed(enc.stride_bits), r.signed(enc.stride_bits))
    return Block(mem, addr, dtype, strides)


def encode(instr: Instr, cfg: NPUConfig) -> list[int]:
    """The 32-bit words of one instruction."""
    enc = cfg.encoding
    spec = OPCODES[instr.op]
    w = _Writer()
    w.put(spec.code, OPCODE_BITS, instr.op)
    for name, kind in spec.fields:
        what = f"{instr.op} {name}"
        if name not in instr.args:
            raise IsaError(f"{what}: missing field")
        v = instr.args[name]
        if kind in ("shape3", "shape4", "ext3"):
            n = 4 if kind == "shape4" else 3
            if len(v) != n:
                raise IsaError(f"{what}: expected {n} extents, got {v}")
            for e in v:
                if kind != "ext3" and e < 1:
                    raise IsaError(f"{what}: extents must be >= 1, got {v}")
                w.put(int(e), enc.extent_bits, what)
        elif kind == "block":
            _put_block(w, v, enc, what)
        elif kind == "opnd":
            if isinstance(v, Block):
                w.put(0, 1, what)
                _put_block(w, v, enc, what)
            else:
                w.put(1, 1, what)
                _put_imm(w, v, what)
        elif kind == "imm":
            _put_imm(w, v, what)
        elif kind.startswith("sub:"):
            table = SUB_TABLES[kind[4:]]
            if v not in table:
                raise IsaError(f"{what}: {v!r} is not one of {', '.join(table)}")
            w.put(table.index(v), SUB_BITS, what)
        elif kind == "dtype":
            if v not in DTYPES:
                raise IsaError(f"{what}: {v!r} is not an NPU element type")
            w.put(DTYPES.index(v), DTYPE_BITS, what)
        elif kind == "reg":
            w.put(int(v), enc.reg_bits, what)
        elif kind == "mem":
            w.put(int(v), enc.mem_bits, what)
        elif kind == "addr":
            w.put(int(v), enc.addr_bits, what)
        elif kind == "unit":
            w.put(int(v), UNIT_BITS, what)
        elif kind == "flag":
            w.put(int(bool(v)), 1, what)
        elif kind == "shift":
            w.put(int(v), SHIFT_BITS, what)
        elif kind == "off":
            w.signed(int(v), OFF_BITS, what)
        elif kind == "id":
            w.put(int(v), ID_BITS, what)
        else:  # pragma: no cover - the schema table is closed
            raise IsaError(f"{what}: unknown field kind {kind!r}")
    return w.words()


def decode(words: Any, pos: int, cfg: NPUConfig) -> tuple[Instr, int]:
    """The instruction starting at word ``pos`` and the position of the next one."""
    enc = cfg.encoding
    r = _Reader(words, pos)
    code = r.get(OPCODE_BITS)
    spec = OPCODE_BY_CODE.get(code)
    if spec is None:
        raise IsaError(f"word {pos}: unknown opcode {code}")
    args: dict[str, Any] = {}
    for name, kind in spec.fields:
        if kind in ("shape3", "shape4", "ext3"):
            n = 4 if kind == "shape4" else 3
            args[name] = tuple(r.get(enc.extent_bits) for _ in range(n))
        elif kind == "block":
            args[name] = _get_block(r, enc)
        elif kind == "opnd":
            args[name] = _get_imm(r) if r.get(1) else _get_block(r, enc)
        elif kind == "imm":
            args[name] = _get_imm(r)
        elif kind.startswith("sub:"):
            table = SUB_TABLES[kind[4:]]
            i = r.get(SUB_BITS)
            if i >= len(table):
                raise IsaError(f"word {pos}: {spec.name} {name}: bad code {i}")
            args[name] = table[i]
        elif kind == "dtype":
            i = r.get(DTYPE_BITS)
            if i >= len(DTYPES):
                raise IsaError(f"word {pos}: {spec.name} {name}: bad dtype code {i}")
            args[name] = DTYPES[i]
        elif kind == "reg":
            args[name] = r.get(enc.reg_bits)
        elif kind == "mem":
            args[name] = r.get(enc.mem_bits)
        elif kind == "addr":
            args[name] = r.get(enc.addr_bits)
        elif kind == "unit":
            args[name] = r.get(UNIT_BITS)
        elif kind == "flag":
            args[name] = bool(r.get(1))
        elif kind == "shift":
            args[name] = r.get(SHIFT_BITS)
        elif kind == "off":
            args[name] = r.signed(OFF_BITS)
        elif kind == "id":
            args[name] = r.get(ID_BITS)
    return Instr(spec.name, **args), r.next_pos


def encode_stream(instrs: list[Instr], cfg: NPUConfig) -> np.ndarray:
    words: list[int] = []
    for ins in instrs:
        words += encode(ins, cfg)
    return np.asarray(words, dtype=np.uint32)


def decode_stream(words: Any, cfg: NPUConfig) -> list[Instr]:
    out, pos = [], 0
    words = [int(w) for w in words]
    while pos < len(words):
        ins, pos = decode(words, pos, cfg)
        out.append(ins)
    return out


def encoding_fingerprint(cfg: NPUConfig) -> int:
    """A 32-bit digest of the field widths (programs decode only under the same widths)."""
    e = cfg.encoding
    text = f"{e.addr_bits},{e.extent_bits},{e.stride_bits},{e.mem_bits},{e.reg_bits}"
    return zlib.crc32(text.encode())


def encode_program(streams: list[list[Instr]], cfg: NPUConfig) -> bytes:
    """A program (one instruction list per core) as bytes."""
    name = cfg.name.encode()
    parts = [MAGIC, struct.pack("<IIH", FORMAT_VERSION, encoding_fingerprint(cfg), len(name)),
             name, struct.pack("<I", len(streams))]
    for s in streams:
        words = encode_stream(s, cfg)
        parts += [struct.pack("<Q", len(words)), words.astype("<u4").tobytes()]
    return b"".join(parts)


def decode_program(data: bytes, cfg: NPUConfig) -> list[list[Instr]]:
    """Inverse of :func:`encode_program` (checks the magic, version and encoding)."""
    if data[:4] != MAGIC:
        raise IsaError("not an NPU program (bad magic)")
    try:
        version, fp, nlen = struct.unpack_from("<IIH", data, 4)
        pos = 14
        name = data[pos:pos + nlen].decode()
        pos += nlen
        (ncores,) = struct.unpack_from("<I", data, pos)
        pos += 4
        if version != FORMAT_VERSION:
            raise IsaError(f"NPU program format {version}, this kiln reads {FORMAT_VERSION}")
        if fp != encoding_fingerprint(cfg):
            raise IsaError(f"NPU program was encoded for description {name!r} with other field "
                           f"widths than {cfg.name!r}'s")
        streams = []
        for _ in range(ncores):
            (n,) = struct.unpack_from("<Q", data, pos)
            pos += 8
            words = np.frombuffer(data, dtype="<u4", count=n, offset=pos)
            pos += 4 * n
            streams.append(decode_stream(words, cfg))
    except struct.error as err:
        raise IsaError(f"truncated NPU program ({err})") from None
    return streams
