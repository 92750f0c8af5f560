"""The generic lowering of last resort: an element-wise op with a TE compute and no NPU lowering.

The op's registered compute (``OpDef.compute``) is built over placeholders of its operands'
shapes; the body of the resulting ``ComputeOp`` -- the loop nest's single store, the
expression every output element is -- is analysed node by node and each node selected onto a
vector instruction: ``+ - * /``, ``min``/``max`` (``max(x, 0)`` is a ``vmax`` with an
immediate, as ``relu``), ``exp``/``rsqrt``/``erf``/``fabs``, ``sigmoid`` as ``1 / (1 + e^-x)``
(a ``vdiv`` of the leaf it multiplies, as in ``silu``), a leaf load as an operand block (its
strides from the operand's broadcast against the result), a constant as an immediate, an outer
``cast`` (a float16 op computed in float32) as the kernel's final ``vcast``. The kernel has one
accumulator block, so the expression must be a *spine*: every binary node has a leaf or a
constant on one side; a chain of one associative, commutative op (``*`` or ``+``) is flattened
first (``0.5 * x * (1 + erf(x c))`` becomes ``(1 + erf(x c)) * x * 0.5``: the products in
another order, within a rounding of the CPU's). The steps go to
:func:`~.vector.elementwise_kernel`, so both lowering routes serve it and the blocks are the
instruction search's.

What has no vector form -- a node with no instruction (``tanh``, ``log``, ``sqrt``, a
comparison, a select: the kernel has no mask block), two non-leaf operands, a cast inside the
expression -- raises NotSupported naming the node, and the op stays on the CPU as before (the
scalar unit runs one op per loop and cannot run a tree).

It is off unless ``KILN_NPU_GENERIC=1``: turned on it moves ``silu`` and ``gelu`` (erf form)
onto the NPU, and ``tests/transform/test_transform_npu.py`` uses ``silu`` as its op without
an NPU lowering (the CPU side of its heterogeneous graphs); off, the lowering answers "no NPU
lowering", the reason those tests expect.
"""

from __future__ import annotations

import os
from typing import Any

from ... import te
from ...graph.op_registry import get_op_def
from ...tir import expr as tx
from .lowering import LoweringContext, NotSupported, lookup_lowering, register_lowering
from .ops import check_broadcast_shape
from .vector import VecStep, elementwise_kernel

__all__ = ["GENERIC_CANDIDATES", "generic_enabled", "lower_generic", "select_steps"]

#: Element-wise ops with a TE compute that no hand-written lowering takes (registered for the
#: generic path at import, only those still without a lowering then).
GENERIC_CANDIDATES = ("silu", "gelu", "power", "floor_divide", "mod", "where")

_BINARY = {tx.Add: "vadd", tx.Sub: "vsub", tx.Mul: "vmul", tx.Div: "vdiv", tx.Min: "vmin",
           tx.Max: "vmax"}
_UNARY = {"exp": "vexp", "rsqrt": "vrsqrt", "erf": "verf", "fabs": "vabs", "abs": "vabs"}
_COMMUTATIVE = (tx.Add, tx.Mul, tx.Min, tx.Max)


def generic_enabled() -> bool:
    """Whether the generic path runs (``KILN_NPU_GENERIC=1``)."""
    return os.environ.get("KILN_NPU_GENERIC", "0") == "1"


def _name(e: Any) -> str:
    return type(e).__name__ if not isinstance(e, tx.Call) else e.op


def _leaf(e: Any, loads: dict[Any, int]) -> tuple[Any, ...] | None:
    """The operand of a leaf: ``("in", k)`` for a load of operand ``k``, ``("imm", v)`` for a
    constant; None for an inner node."""
    if isinstance(e, tx.BufferLoad) and e.buffer in loads:
        return ("in", loads[e.buffer])
    if isinstance(e, (tx.FloatImm, tx.IntImm)):
        return ("imm", e.value)
    if isinstance(e, tx.Broadcast):
        return _leaf(e.value, loads)
    return None


def _flatten(e: Any, kind: type) -> list[Any]:
    if isinstance(e, kind):
        return _flatten(e.a, kind) + _flatten(e.b, kind)
    return [e]


def _spine(e: Any, loads: dict[Any, int], steps: list[VecStep]) -> None:
    """Append the steps computing inner node ``e`` into the accumulator block."""
    if isinstance(e, tx.Call):
        if e.op == "sigmoid":
            raise NotSupported("sigmoid of a computed value needs a block of ones (the "
                               "hand-written lowering's); the generic path takes it as a "
                               "loaded operand's factor only")
        if e.op not in _UNARY or len(e.args) != 1:
            raise NotSupported(f"{e.op}: no vector instruction")
        steps.append(VecStep(_UNARY[e.op], (_source(e.args[0], loads, steps),)))
        return
    kind = type(e)
    if kind not in _BINARY:
        raise NotSupported(f"{_name(e)}: no vector instruction")
    if kind in (tx.Add, tx.Mul):
        terms = _flatten(e, kind)
    else:
        terms = [e.a, e.b]
    leaves = [_leaf(t, loads) for t in terms]
    inner = [t for t, lf in zip(terms, leaves) if lf is None]
    if kind is tx.Mul:
        # x * sigmoid(y): y into the block, then 1 + e^-y, then x / it
        sig = [t for t in terms if isinstance(t, tx.Call) and t.op == "sigmoid"]
        if sig and len(terms) == 2:
            other = terms[0] if terms[1] is sig[0] else terms[1]
            lf = _leaf(other, loads)
            if lf is not None and lf[0] == "in":
                src = _source(sig[0].args[0], loads, steps)
                steps += [VecStep("vmul", (src, ("imm", -1.0))),
                          VecStep("vexp", (("out",),)),
                          VecStep("vadd", (("out",), ("imm", 1.0))),
                          VecStep("vdiv", (lf, ("out",)))]
                return
    if len(inner) > 1:
        raise NotSupported(f"{_name(e)} of two computed values needs a second block")
    op = _BINARY[kind]
    if not inner:  # every term a leaf: the first block, then the others
        first = [lf for lf in leaves if lf[0] == "in"]
        if not first:
            raise NotSupported(f"{_name(e)} of constants only")
        if kind not in _COMMUTATIVE and leaves[0][0] != "in":
            raise NotSupported(f"{_name(e)} of an immediate and a block (no such form)")
        a = leaves[0] if leaves[0][0] == "in" else first[0]
        rest = list(leaves)
        rest.remove(a)
        steps.append(VecStep(op, (a, rest[0])))
        for lf in rest[1:]:
            steps.append(VecStep(op, (("out",), lf)))
        return
    _spine(inner[0], loads, steps)
    k = terms.index(inner[0])
    for i, lf in enumerate(leaves):
        if lf is None:
            continue
        if kind in _COMMUTATIVE or i > k:
            steps.append(VecStep(op, (("out",), lf)))
        elif lf[0] == "in":  # leaf - out, leaf / out: the leaf is the block operand
            steps.append(VecStep(op, (lf, ("out",))))
        else:
            raise NotSupported(f"{_name(e)} of an immediate and a computed value")


def _source(e: Any, loads: dict[Any, int], steps: list[VecStep]) -> tuple[Any, ...]:
    """The operand of an instruction taking ``e``: a loaded block as it is, else ``e``
    computed into the accumulator block."""
    lf = _leaf(e, loads)
    if lf is None:
        _spine(e, loads, steps)
        return ("out",)
    if lf[0] == "in":
        return lf
    raise NotSupported("a function of a constant")


def select_steps(body: Any, loads: dict[Any, int], out_dtype: str) -> tuple[list[VecStep],
                                                                            str]:
    """The vector steps of expression ``body`` (``loads``: each operand's buffer -> its
    index) and the dtype they compute in (an outer cast to ``out_dtype`` becomes the
    kernel's final ``vcast``). Raises NotSupported naming the node without a vector form."""
    cdt = out_dtype
    if isinstance(body, tx.Cast) and str(body.dtype) == out_dtype:
        body = body.value
        cdt = str(body.dtype)
    steps: list[VecStep] = []
    if _leaf(body, loads) is not None:
        raise NotSupported("a copy, not a computation")
    _spine(body, loads, steps)
    if any(isinstance(n, tx.Cast) for n in _nodes(body)):
        raise NotSupported("a cast inside the expression")
    return steps, cdt


def _nodes(e: Any) -> list[Any]:
    out = [e]
    for f in ("a", "b", "value"):
        c = getattr(e, f, None)
        if isinstance(c, tx.PrimExpr):
            out += _nodes(c)
    for c in getattr(e, "args", ()) or ():
        if isinstance(c, tx.PrimExpr):
            out += _nodes(c)
    return out


def _one_reader_each(steps: list[VecStep], inputs: list[Any]
                     ) -> tuple[list[VecStep], list[Any]]:
    """Each operand read by one step only: a second reader (``silu``'s ``x / (1 + e^-x)``
    reads ``x`` twice) gets the tensor as an operand of its own, loaded again -- the TIR
    route stages an operand into L0 for one consumer, and both routes must take the same
    operands. It costs the second load's DRAM traffic."""
    seen: set[int] = set()
    inputs = list(inputs)
    out = []
    for st in steps:
        srcs = []
        for src in st.srcs:
            if src[0] == "in":
                if src[1] in seen:
                    inputs.append(inputs[src[1]])
                    src = ("in", len(inputs) - 1)
                seen.add(src[1])
            srcs.append(src)
        out.append(VecStep(st.opcode, tuple(srcs), st.extra))
    return out, inputs


def lower_generic(ctx: LoweringContext, call: Any, args: list[Any], out: Any) -> None:
    """The generic lowering (see the module docstring)."""
    op = call.op.name
    if not generic_enabled():
        raise NotSupported("no NPU lowering")
    opdef = get_op_def(op)
    if opdef.compute is None:
        raise NotSupported(f"{op}: no TE compute")
    inputs = [ctx.tensor(a) for a in args]
    if any(x.dtype != out.dtype for x in inputs):
        raise NotSupported(f"{op}: operands of different dtypes")
    phs = [te.placeholder(x.shape, x.dtype, name=f"x{k}") for k, x in enumerate(inputs)]
    try:
        res = opdef.compute(*phs, call.attrs) if call.attrs is not None else \
            opdef.compute(*phs)
    except TypeError:
        res = opdef.compute(*phs)
    body = getattr(res.op, "body", None)
    if body is None or isinstance(body, (list, tuple)):
        raise NotSupported(f"{op}: its compute is not one element-wise expression")
    steps, cdt = select_steps(body, {p.buffer: k for k, p in enumerate(phs)}, out.dtype)
    if not ctx.config.supports_vector_dtype(cdt):
        raise NotSupported(f"{op}: the vector unit does not compute in {cdt}")
    check_broadcast_shape(op, inputs, out)
    steps, inputs = _one_reader_each(steps, inputs)
    elementwise_kernel(ctx, op, out, inputs, steps, cdt if cdt != out.dtype else None)


for _op in GENERIC_CANDIDATES:
    if lookup_lowering(_op) is None:
        register_lowering(_op)(lower_generic)
