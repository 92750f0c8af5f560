"""The container of a ``.kiln`` file: a magic number, a format version and named, checksummed
sections. What the sections hold is ``kiln.runtime.executable``'s business; this module only
writes and verifies them, so a damaged or foreign file is reported before anything in it is
used.

Layout, format version 3 (little-endian, no gaps: every byte of the file is checked)::

    offset 0   b"KILNEXE\\0"   magic number
           8   u32            format version
          12   u32            byte length T of the section table
          16   32 bytes       sha256 of bytes [0, 16) followed by the section table
          48   T bytes        section table: per section
                                u16 name length, name (UTF-8), u64 offset, u64 size,
                                32 bytes sha256 of the section's bytes
      48 + T   ...            the sections' bytes, in table order, back to back; the file ends
                              where the last section ends

The preamble (magic, version, table length and the table's checksum) keeps this shape in every
later version, so a reader can tell a file from a newer kiln (its preamble checksum holds: "upgrade
kiln") from a damaged one (it does not), and a damaged magic number or version field from a
file that is no kiln executable at all. Files of versions 1 and 2 (before checksums) are refused
with a request to rebuild them.
"""

from __future__ import annotations

import hashlib
import os
import struct
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

from ..ir.errors import ModelFormatError

MAGIC = b"KILNEXE\0"
VERSION = 3
#: Versions before sections and checksums.
OLD_VERSIONS = (1, 2)
_PREAMBLE = struct.Struct("<8sII32s")
_ENTRY = struct.Struct("<QQ32s")
_NAME_LEN = struct.Struct("<H")


@dataclass(frozen=True)
class SectionInfo:
    """One section of a file: its name, where its bytes are, their sha256."""

    name: str
    offset: int
    size: int
    sha256: bytes


def _table_bytes(sections: list[tuple[str, bytes]], start: int) -> bytes:
    out = bytearray()
    offset = start
    for name, data in sections:
        raw = name.encode("utf-8")
        out += _NAME_LEN.pack(len(raw)) + raw
        out += _ENTRY.pack(offset, len(data), hashlib.sha256(data).digest())
        offset += len(data)
    return bytes(out)


def sections_start(names: Sequence[str]) -> int:
    """The file offset of the first section's bytes in a file whose sections are ``names``
    (the preamble and the table have a fixed size per name): where a writer learns the file
    offsets of its data, to align arrays it wants read in place."""
    return _PREAMBLE.size + sum(_NAME_LEN.size + len(n.encode("utf-8")) + _ENTRY.size
                                for n in names)


def _preamble_digest(head: bytes, table: bytes) -> bytes:
    return hashlib.sha256(head + table).digest()


def encode(sections: list[tuple[str, bytes]]) -> list[bytes]:
    """The pieces of a file holding ``sections`` (``(name, bytes)``, names unique)."""
    names = [n for n, _ in sections]
    if len(set(names)) != len(names):
        raise ValueError(f"duplicate section names in {names}")
    # the table's length does not depend on the offsets (fixed-size fields), so size it first
    table_len = len(_table_bytes(sections, 0))
    table = _table_bytes(sections, _PREAMBLE.size + table_len)
    head = MAGIC + struct.pack("<II", VERSION, len(table))
    return [head, _preamble_digest(head, table), table, *[bytes(d) for _, d in sections]]


def write(path: str, sections: list[tuple[str, bytes]]) -> None:
    """Write a file of ``sections``, atomically (a temporary file renamed over ``path``)."""
    pieces = encode(sections)
    tmp = f"{path}.tmp{os.getpid()}"
    try:
        with open(tmp, "wb") as f:
            for p in pieces:
                f.write(p)
        os.replace(tmp, path)
    except BaseException:
        if os.path.exists(tmp):
            os.unlink(tmp)
        raise


def _parse_table(table: bytes, path: str) -> list[SectionInfo]:
    out = []
    pos = 0
    while pos < len(table):
        (n,) = _NAME_LEN.unpack_from(table, pos)
        pos += _NAME_LEN.size
        name = table[pos:pos + n].decode("utf-8")
        pos += n
        offset, size, digest = _ENTRY.unpack_from(table, pos)
        pos += _ENTRY.size
        out.append(SectionInfo(name, offset, size, digest))
    return out


def read_table(data: bytes | memoryview, path: str) -> list[SectionInfo]:
    """The verified section table of a file's bytes; ModelFormatError naming the problem for a
    foreign, old, newer or damaged file."""
    if len(data) < len(MAGIC) or bytes(data[:len(MAGIC)]) != MAGIC:
        if len(data) >= _PREAMBLE.size and _preamble_holds(data, magic=MAGIC):
            raise ModelFormatError(f"{path}: damaged kiln executable: its magic number (bytes "
                                   "0-7) is corrupt; the rest of the file is intact")
        raise ModelFormatError(f"{path} is not a kiln executable (bad magic number: it does not "
                               f"start with {MAGIC!r})")
    if len(data) < 12:
        raise ModelFormatError(f"{path}: truncated kiln executable ({len(data)} bytes)")
    (version,) = struct.unpack_from("<I", data, 8)
    if version != VERSION:
        if _preamble_holds(data):
            raise ModelFormatError(
                f"{path} was written by a newer kiln (executable format version {version}; "
                f"this kiln reads version {VERSION}): upgrade kiln, or build and save the "
                "model with this one" if version > VERSION else
                f"{path}: unsupported executable format version {version}")
        if _preamble_holds(data, version=VERSION):
            raise ModelFormatError(f"{path}: damaged kiln executable: its format version field "
                                   "(bytes 8-11) is corrupt; the rest of the file is intact")
        if version in OLD_VERSIONS:
            raise ModelFormatError(
                f"{path} was written by an older kiln (executable format version {version}, "
                f"without checksums); this kiln reads version {VERSION}: rebuild and save the "
                "model again")
        raise ModelFormatError(f"{path}: damaged kiln executable: its header (the first "
                               f"{_PREAMBLE.size} bytes or the section table) is corrupt")
    if len(data) < _PREAMBLE.size:
        raise ModelFormatError(f"{path}: truncated kiln executable ({len(data)} bytes)")
    _, _, table_len, _ = _PREAMBLE.unpack_from(data, 0)
    end = _PREAMBLE.size + table_len
    if len(data) < end:
        raise ModelFormatError(f"{path}: truncated kiln executable (the section table needs "
                               f"{end} bytes, the file has {len(data)})")
    if not _preamble_holds(data):
        raise ModelFormatError(f"{path}: damaged kiln executable: its header (the first "
                               f"{_PREAMBLE.size} bytes or the section table) is corrupt")
    try:
        sections = _parse_table(bytes(data[_PREAMBLE.size:end]), path)
    except (struct.error, UnicodeDecodeError) as err:  # a table whose checksum holds: a bug
        raise ModelFormatError(f"{path}: malformed section table ({err})") from err
    pos = end
    for s in sections:
        if s.offset != pos:
            raise ModelFormatError(f"{path}: malformed section table (section {s.name!r} at "
                                   f"{s.offset}, expected {pos})")
        pos += s.size
    if pos != len(data):
        what = "truncated" if pos > len(data) else "has extra bytes after its last section"
        raise ModelFormatError(f"{path}: {what} kiln executable ({len(data)} bytes, the "
                               f"sections end at {pos})")
    return sections


def _preamble_holds(data: bytes | memoryview, magic: bytes | None = None,
                    version: int | None = None) -> bool:
    """Whether the preamble checksum matches, reading the magic number or version as given
    (to tell a damaged field from a genuine value)."""
    if len(data) < _PREAMBLE.size:
        return False
    stored_magic, stored_version, table_len, digest = _PREAMBLE.unpack_from(data, 0)
    end = _PREAMBLE.size + table_len
    if end > len(data):
        return False
    head = (magic or stored_magic) + struct.pack("<II", version or stored_version, table_len)
    return _preamble_digest(head, bytes(data[_PREAMBLE.size:end])) == digest


def read(data: bytes | memoryview, path: str) -> dict[str, memoryview]:
    """Every section of a file's bytes (anything with the buffer protocol: bytes, a mapped
    file) by name, each a view of ``data`` checked against its sha256 (a ModelFormatError
    names the first damaged section)."""
    view = memoryview(data)
    out: dict[str, memoryview] = {}
    for s in read_table(view, path):
        part = view[s.offset:s.offset + s.size]
        if hashlib.sha256(part).digest() != s.sha256:
            raise ModelFormatError(
                f"{path}: damaged kiln executable: section {s.name!r} ({s.size} bytes at offset "
                f"{s.offset}) fails its checksum; the file was changed or corrupted after it "
                "was saved (copy or build it again)")
        out[s.name] = part
    return out


def sections_summary(sections: Mapping[str, memoryview] | list[SectionInfo]) -> list[str]:
    """``name: size`` lines for ``kiln inspect``."""
    if isinstance(sections, list):
        return [f"{s.name}: {s.size} bytes, sha256 {s.sha256.hex()[:16]}" for s in sections]
    return [f"{name}: {len(v)} bytes" for name, v in sections.items()]
