"""Features of a candidate for the cost model, read from its scheduled TIR.

The cost model (:mod:`kiln.tune.cost_model`) learns across kernels, so the features describe
the loop program, not the knob values (whose names differ per schedule): how much arithmetic
and memory traffic it does (and their ratio, the arithmetic intensity), how its loops run
(parallel, vectorized, unrolled extents, the compiler-unroll and register-tile annotations),
how deep the nest is, and how many bytes a parallel chunk and an innermost loop touch,
compared with the L1, L2 and L3 cache sizes. Counts are per call of the kernel, each
statement weighted by the iterations of the loops around it. They are read from the scheduled
loop program (before ``lower``, which expands vectorized and unrolled loops into vector
expressions and copies, so their kinds would no longer show).
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

import numpy as np

from ..ir.node import Node, node_field_names
from ..tir import expr as E
from ..tir.function import PrimFunc
from ..tir.functor import post_order_visit
from ..tir.stmt import FMA_IN_REGISTERS, JAM_TAILS, UNROLL_BY, Allocate, BufferStore, For, ForKind

__all__ = ["CACHE_BYTES", "FEATURE_NAMES", "extract_features"]

#: Cache sizes the footprints are compared with (per core L1d and L2, a shared L3 slice):
#: typical of the x86 cores kiln targets.
CACHE_BYTES = {"L1": 32 * 1024, "L2": 1024 * 1024, "L3": 16 * 1024 * 1024}

FEATURE_NAMES = (
    "log_flops", "log_bytes_loaded", "log_bytes_stored", "arith_intensity",
    "log_parallel_extent", "parallel_loops", "log_vector_lanes", "vector_fraction",
    "log_unrolled_product", "unrolled_loops", "unroll_by", "jam_tails", "fma_in_registers",
    "max_depth", "loops", "log_innermost_extent", "log_stores",
    "log_chunk_bytes", "chunk_over_L1", "chunk_over_L2", "chunk_over_L3",
    "log_inner_bytes", "inner_over_L1", "log_local_bytes", "log_param_bytes",
)

_ARITH = (E.Add, E.Sub, E.Mul, E.Div, E.Min, E.Max) + tuple(
    getattr(E, n) for n in ("FloorDiv", "FloorMod", "Mod", "Call") if hasattr(E, n))


def _const(x: Any) -> int:
    return int(x.value) if isinstance(x, E.IntImm) else 1


def _bytes(buf: Any) -> int:
    n = 1
    for d in buf.shape:
        n *= _const(d)
    return n * max(1, buf.dtype.bits * max(1, getattr(buf.dtype, "lanes", 1)) // 8)


@dataclass
class _Acc:
    flops: float = 0.0
    loaded: float = 0.0
    stored: float = 0.0
    stores: float = 0.0
    vector_stores: float = 0.0
    parallel_extent: int = 0
    parallel_loops: int = 0
    lanes: int = 1
    unrolled_product: int = 1
    unrolled_loops: int = 0
    unroll_by: int = 0
    jam: int = 0
    fma_regs: int = 0
    depth: int = 0
    loops: int = 0
    innermost: float = 0.0
    chunk_bytes: float = 0.0
    inner_bytes: float = 0.0
    local_bytes: int = 0


def _store_cost(store: BufferStore) -> tuple[int, int]:
    ops, loads = 0, 0

    def visit(n: Any) -> None:
        nonlocal ops, loads
        if isinstance(n, _ARITH):
            ops += 1
        elif isinstance(n, E.BufferLoad):
            loads += _bytes_of_elem(n.buffer)

    post_order_visit(store.value, visit)
    return ops, loads


def _bytes_of_elem(buf: Any) -> int:
    return max(1, buf.dtype.bits * max(1, getattr(buf.dtype, "lanes", 1)) // 8)


def _walk(node: Any, acc: _Acc, iters: float, depth: int, lanes: int, chunk: float | None
          ) -> float:
    """Visit ``node`` under loops of ``iters`` iterations in all; returns the bytes its
    statements touch per execution (for the footprint of the loops around it)."""
    if isinstance(node, For):
        ext = _const(node.extent)
        acc.loops += 1
        acc.depth = max(acc.depth, depth + 1)
        inner_lanes = lanes
        if node.kind == ForKind.PARALLEL:
            acc.parallel_loops += 1
            acc.parallel_extent = max(acc.parallel_extent, ext)
        elif node.kind == ForKind.VECTORIZED:
            inner_lanes = lanes * ext
            acc.lanes = max(acc.lanes, inner_lanes)
        elif node.kind == ForKind.UNROLLED:
            acc.unrolled_loops += 1
            acc.unrolled_product = max(acc.unrolled_product, ext)
        ann = node.annotations or {}
        acc.unroll_by = max(acc.unroll_by, int(ann.get(UNROLL_BY, 0) or 0))
        acc.jam = max(acc.jam, int(ann.get(JAM_TAILS, 0) or 0))
        acc.fma_regs |= int(bool(ann.get(FMA_IN_REGISTERS)))
        body = _walk(node.body, acc, iters * ext, depth + 1, inner_lanes, chunk)
        touched = body * ext
        if node.kind == ForKind.PARALLEL and chunk is None:
            acc.chunk_bytes = max(acc.chunk_bytes, touched / max(ext, 1))
        if not isinstance(node.body, For):
            acc.inner_bytes = max(acc.inner_bytes, touched)
            acc.innermost = max(acc.innermost, ext)
        return touched
    if isinstance(node, BufferStore):
        ops, loaded = _store_cost(node)
        width = _bytes_of_elem(node.buffer)
        acc.flops += ops * iters
        acc.loaded += loaded * iters
        acc.stored += width * iters
        acc.stores += iters
        if lanes > 1:
            acc.vector_stores += iters
        return loaded + width
    if isinstance(node, Allocate):
        acc.local_bytes += _bytes(node.buffer)
    total = 0.0
    if isinstance(node, Node):
        for name in node_field_names(node):
            value = getattr(node, name)
            for child in value if isinstance(value, (list, tuple)) else (value,):
                if isinstance(child, Node) and not isinstance(child, E.PrimExpr):
                    total += _walk(child, acc, iters, depth, lanes, chunk)
    return total


def _log(x: float) -> float:
    return math.log2(1.0 + max(x, 0.0))


def extract_features(func: PrimFunc) -> np.ndarray:
    """The feature vector (:data:`FEATURE_NAMES`) of a scheduled PrimFunc."""
    acc = _Acc()
    _walk(func.body, acc, 1.0, 0, 1, None)
    traffic = acc.loaded + acc.stored
    params = sum(_bytes(b) for b in func.buffers)
    chunk = acc.chunk_bytes or traffic
    values = [
        _log(acc.flops), _log(acc.loaded), _log(acc.stored), acc.flops / max(traffic, 1.0),
        _log(acc.parallel_extent), acc.parallel_loops, _log(acc.lanes),
        acc.vector_stores / max(acc.stores, 1.0),
        _log(acc.unrolled_product), acc.unrolled_loops, acc.unroll_by, acc.jam, acc.fma_regs,
        acc.depth, acc.loops, _log(acc.innermost), _log(acc.stores),
        _log(chunk), chunk / CACHE_BYTES["L1"], chunk / CACHE_BYTES["L2"],
        chunk / CACHE_BYTES["L3"],
        _log(acc.inner_bytes), acc.inner_bytes / CACHE_BYTES["L1"], _log(acc.local_bytes),
        _log(params),
    ]
    return np.asarray(values, dtype=np.float64)
