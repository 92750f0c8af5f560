"""Timelines of a simulation (``Simulator(..., trace=True)``): Chrome trace JSON and a PNG.

:func:`chrome_trace` writes the Trace Event Format that ``chrome://tracing``, Perfetto
(https://ui.perfetto.dev) and Edge's ``edge://tracing`` open: one process per core, one thread
per unit, one complete event (``"ph": "X"``) per instruction with its note (the kernel and tile
it belongs to) in ``args``; timestamps are cycles shown as microseconds (1 cycle = 1 us on the
axis, whatever the clock). Phases (the kernels between barriers) are a separate "phases" row.

:func:`timeline_png` draws the same picture without any plotting library: a row per unit of
each core, time left to right, one colour per instruction class (DMA in/out, matrix, vector,
scalar, waits drawn as gaps), phase boundaries as grey lines; written with zlib as a plain PNG.
"""

from __future__ import annotations

import json
import struct
import zlib
from typing import Any

import numpy as np

from .simulator import Report

__all__ = ["chrome_trace", "timeline_png"]

_UNIT_ORDER = ("dma_in", "tensor", "vector", "dma_out", "scalar")


def chrome_trace(report: Report, path: str | None = None) -> dict[str, Any]:
    """The trace as a dict (and written to ``path`` when given)."""
    events: list[dict[str, Any]] = []
    cores = sorted({c for c, _ in report.units})
    for c in cores:
        events.append({"name": "process_name", "ph": "M", "pid": c,
                       "args": {"name": f"core {c}"}})
        for i, u in enumerate(_UNIT_ORDER):
            events.append({"name": "thread_name", "ph": "M", "pid": c, "tid": i,
                           "args": {"name": u}})
    for core, unit, op, start, end, note in report.events:
        if op == "barrier":
            continue
        ev = {"name": op, "cat": unit, "ph": "X", "pid": core, "tid": _UNIT_ORDER.index(unit),
              "ts": float(start), "dur": max(float(end - start), 0.001)}
        if note:
            ev["args"] = {"note": note}
        events.append(ev)
    phase_pid = len(cores)
    events.append({"name": "process_name", "ph": "M", "pid": phase_pid,
                   "args": {"name": "phases"}})
    for label, start, end in report.phases:
        events.append({"name": label, "cat": "phase", "ph": "X", "pid": phase_pid, "tid": 0,
                       "ts": float(start), "dur": max(float(end - start), 0.001)})
    trace = {"traceEvents": events, "displayTimeUnit": "ns",
             "otherData": {"config": report.config, "cycles": report.cycles,
                           "clock_mhz": report.clock_mhz, "time_unit": "cycle"}}
    if path is not None:
        with open(path, "w", encoding="utf-8") as f:
            json.dump(trace, f)
    return trace


_COLOURS = {"dma.load": (66, 133, 244), "dma.store": (52, 168, 83), "mma": (234, 67, 53),
            "mma.set": (234, 67, 53), "scalar code": (154, 160, 166)}
_VECTOR = (251, 188, 4)
_SYNC = (120, 120, 120)


def _png(rgb: np.ndarray) -> bytes:
    h, w, _ = rgb.shape
    raw = b"".join(b"\x00" + rgb[y].tobytes() for y in range(h))

    def chunk(tag: bytes, data: bytes) -> bytes:
        return (struct.pack(">I", len(data)) + tag + data
                + struct.pack(">I", zlib.crc32(tag + data) & 0xFFFFFFFF))

    return (b"\x89PNG\r\n\x1a\n" + chunk(b"IHDR", struct.pack(">IIBBBBB", w, h, 8, 2, 0, 0, 0))
            + chunk(b"IDAT", zlib.compress(raw, 6)) + chunk(b"IEND", b""))


def timeline_png(report: Report, path: str, width: int = 1600, row: int = 14) -> None:
    """Draw the timeline (see the module docstring) into a PNG file ``path``."""
    cores = sorted({c for c, _ in report.units})
    rows = [(c, u) for c in cores for u in _UNIT_ORDER]
    gap = 6
    height = len(rows) * row + (len(cores) - 1) * gap + 2 * row
    img = np.full((height, width, 3), 255, np.uint8)
    total = max(report.cycles, 1.0)
    scale = (width - 1) / total

    def y_of(core: int, unit: str) -> int:
        i = rows.index((core, unit))
        return row + i * row + cores.index(core) * gap

    for i, (c, u) in enumerate(rows):  # light band per row
        y = y_of(c, u)
        if i % 2:
            img[y:y + row - 1, :] = (246, 246, 246)
    for core, unit, op, start, end, _ in report.events:
        if op == "barrier" or (core, unit) not in rows:
            continue
        colour = _COLOURS.get(op, _SYNC if op.startswith("tok") else _VECTOR)
        x0 = int(start * scale)
        x1 = max(x0 + 1, int(end * scale))
        y = y_of(core, unit)
        img[y + 2:y + row - 2, x0:x1] = colour
    for _, start, _ in report.phases[1:]:
        x = int(start * scale)
        img[:, x:x + 1] = (160, 160, 160)
    with open(path, "wb") as f:
        f.write(_png(img))
