"""The converter registry: ONNX (domain, op type) -> converters keyed by opset version.

ONNX operators change meaning across opsets (Softmax at 13, Reduce axes moving from attribute to
input, ...). Each converter states the opset it implements from (``since``); a model of opset N
uses the converter with the largest ``since <= N``.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

Converter = Callable[..., Any]

_CONVERTERS: dict[tuple[str, str], list[tuple[int, Converter]]] = {}


def _norm_domain(domain: str) -> str:
    return "" if domain in ("", "ai.onnx") else domain


def converter(op_type: str, since: int = 1, domain: str = "") -> Callable[[Converter], Converter]:
    """Register ``fn(ctx, node) -> Expr | list[Expr]`` for ``op_type`` from opset ``since`` on."""

    def register(fn: Converter) -> Converter:
        entries = _CONVERTERS.setdefault((_norm_domain(domain), op_type), [])
        if any(s == since for s, _ in entries):
            raise ValueError(f"converter for {op_type} since opset {since} registered twice")
        entries.append((since, fn))
        entries.sort(key=lambda e: e[0])
        return fn

    return register


def lookup_converter(op_type: str, opset: int, domain: str = "") -> Converter | None:
    """The converter for ``op_type`` in a model of ``opset`` for ``domain``, or None."""
    entries = _CONVERTERS.get((_norm_domain(domain), op_type), [])
    best = None
    for since, fn in entries:
        if since <= opset:
            best = fn
    return best


def supported_ops(domain: str = "") -> set[str]:
    """Op types of ``domain`` that have at least one converter."""
    d = _norm_domain(domain)
    return {op for dom, op in _CONVERTERS if dom == d}
