"""The operator registry: one declaration per operator.

It lives in the graph layer because the graph IR needs it: the BlockBuilder infers every op
call's StructInfo through the declaration, and a declaration's Python API builds graph calls.
Operator families (``kiln.op``) declare their operators through ``kiln.op.registry``, which
re-exports this module.

An operator is declared once, with :func:`register_op`, and that declaration holds everything
kiln knows about it:

- ``attrs``: a frozen dataclass of its attributes (or None),
- ``inputs``: names of its tensor inputs (a trailing ``*`` marks a variadic list, e.g.
  ``("tensors*",)`` for concat),
- ``infer``: StructInfo inference ``infer(call) -> StructInfo`` (arguments are normalized:
  every ``call.args[i].struct_info`` is set),
- ``pattern``: the fusion pattern (:class:`OpPattern`),
- ``compute``: the tensor expression ``compute(*te_tensors, attrs=attrs) -> te.Tensor | tuple``
  used by LegalizeOps (or ``legalize(bb, call) -> graph.Expr`` for ops that lower otherwise),
- ``mixed_precision``: :class:`MixedPrecision` policy,
- ``gradient``: the gradient rule, or :data:`NON_DIFFERENTIABLE`.

How the op runs on a target is not part of the declaration: each target family's room
(``kiln/schedule/cpu/`` ...) registers its schedules and layout preferences through
:mod:`kiln.schedule.registry`. The op's own entries land in ``OpDef.schedules[family]`` and
``OpDef.alter_layout[family]`` (``schedule(sch, target)``; ``hook(call, target) ->
kiln.op.layout.LayoutRewrite | None``); most ops get theirs from a family's rules instead
(``kiln.schedule.lookup_schedule`` finds either).

The Python API (``kiln.op.relu(x)``) is generated from the declaration: tensor inputs first,
then attribute fields positionally or by keyword.

Gradient rules (used by ``kiln.transform.Gradient``)::

    gradient(orig_call: graph.Call, output_grad: graph.Expr, bb: BlockBuilder)
        -> list[graph.Expr | None]

``orig_call`` is the forward call (normalized: its arguments are variables or constants with
StructInfo); ``output_grad`` is the adjoint of its result, with the result's StructInfo (for a
tuple-valued op, an explicit ``Tuple`` of per-field adjoints). The rule returns one adjoint per
input of the op (a variadic input gets a ``Tuple`` of per-tensor adjoints), each with that
input's shape and dtype, or None where no gradient flows (a non-float input, an index, or a
derivative that is zero almost everywhere). Adjoints are built from kiln op calls; the pass emits
them, and the rule may ``bb.emit`` intermediates it shares between inputs. ``orig_call`` itself
may be used inside the returned expressions to mean the forward result: the pass substitutes
the forward value (no recomputation). ``NON_DIFFERENTIABLE`` marks an op whose result carries no
gradient; the pass reports it when it blocks a requested gradient.
"""

from __future__ import annotations

import dataclasses
import inspect
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from enum import Enum, IntEnum
from typing import Any

from ..ir.errors import KilnError, StructInfoError
from .expr import Call, Op, Tuple, as_expr


class OpPattern(IntEnum):
    """Fusion pattern, ordered from most to least fusable (TVM's numbering)."""

    ELEMWISE = 0
    BROADCAST = 1
    INJECTIVE = 2
    COMM_REDUCE = 3
    OUT_EWISE_FUSABLE = 4
    TUPLE = 7
    OPAQUE = 8


class MixedPrecision(Enum):
    """How ToMixedPrecision treats an op: compute in low precision, follow inputs, or keep."""

    ALWAYS = "always"
    FOLLOW = "follow"
    NEVER = "never"


class _NonDifferentiable:
    def __repr__(self) -> str:
        return "NON_DIFFERENTIABLE"


NON_DIFFERENTIABLE = _NonDifferentiable()


@dataclass
class OpDef:
    """Everything about one operator (see the module docstring)."""

    name: str
    inputs: tuple[str, ...]
    infer: Callable[[Any], Any]
    pattern: OpPattern
    attrs: type | None = None
    compute: Callable[..., Any] | None = None
    legalize: Callable[..., Any] | None = None
    mixed_precision: MixedPrecision = MixedPrecision.FOLLOW
    gradient: Any = None
    doc: str = ""
    #: per target family, the op's own schedule (filled by ``kiln.schedule.register_schedule``)
    schedules: dict[str, Callable[..., None]] = field(default_factory=dict)
    #: per target family, its layout hook (filled by ``kiln.schedule.register_alter_layout``)
    alter_layout: dict[str, Callable[..., Any]] = field(default_factory=dict)

    @property
    def variadic(self) -> bool:
        return bool(self.inputs) and self.inputs[-1].endswith("*")

    def make_attrs(self, *args: Any, **kwargs: Any) -> Any:
        """Build this op's attrs from positional/keyword values, with a clear error."""
        if self.attrs is None:
            if args or kwargs:
                raise KilnError(f"operator {self.name} takes no attributes")
            return None
        names = [f.name for f in dataclasses.fields(self.attrs)]
        if len(args) > len(names):
            raise KilnError(f"operator {self.name}: too many arguments")
        for n, v in zip(names, args):
            if n in kwargs:
                raise KilnError(f"operator {self.name}: attribute {n!r} given twice")
            kwargs[n] = v
        unknown = set(kwargs) - set(names)
        if unknown:
            raise KilnError(
                f"operator {self.name}: unknown attribute(s) {sorted(unknown)}; it has {names}"
            )
        try:
            return self.attrs(**kwargs)
        except TypeError as err:
            raise KilnError(f"operator {self.name}: {err}") from err

    def __call__(self, *args: Any, **kwargs: Any):
        """The Python API: ``opdef(x, y, axis=1)`` -> graph ``Call``."""
        n_in = len(self.inputs)
        if self.variadic:
            if not args:
                raise KilnError(f"operator {self.name} needs its input list")
            fixed = [as_expr(a) for a in args[: n_in - 1]]
            rest = args[n_in - 1]
            if not isinstance(rest, (list, tuple)):
                raise KilnError(f"operator {self.name}: {self.inputs[-1][:-1]} must be a list")
            tensors = [*fixed, Tuple(tuple(as_expr(a) for a in rest))]
        else:
            if len(args) < n_in:
                missing = self.inputs[len(args):]
                missing = tuple(m for m in missing if m not in kwargs)
                extra = {m: kwargs.pop(m) for m in self.inputs[len(args):] if m in kwargs}
                args = (*args, *[extra[m] for m in self.inputs[len(args):] if m in extra])
                if missing:
                    raise KilnError(f"operator {self.name}: missing input(s) {list(missing)}")
            tensors = [as_expr(a) for a in args[:n_in]]
        attrs = self.make_attrs(*args[n_in:], **kwargs)
        return Call(Op(self.name), tuple(tensors), attrs)


_REGISTRY: dict[str, OpDef] = {}


def register_op(
    name: str,
    *,
    inputs: Sequence[str],
    infer: Callable[[Any], Any],
    pattern: OpPattern,
    attrs: type | None = None,
    compute: Callable[..., Any] | None = None,
    legalize: Callable[..., Any] | None = None,
    mixed_precision: MixedPrecision = MixedPrecision.FOLLOW,
    gradient: Any = None,
    doc: str = "",
) -> OpDef:
    """Declare an operator; returns the OpDef, which is also its Python API (callable)."""
    if name in _REGISTRY:
        raise KilnError(f"operator {name!r} is already registered")
    if compute is None and legalize is None:
        raise KilnError(f"operator {name!r} needs a compute or a legalize function")
    if attrs is not None and not dataclasses.is_dataclass(attrs):
        raise KilnError(f"operator {name!r}: attrs must be a frozen dataclass")
    opdef = OpDef(
        name=name,
        inputs=tuple(inputs),
        infer=infer,
        pattern=OpPattern(pattern),
        attrs=attrs,
        compute=compute,
        legalize=legalize,
        mixed_precision=mixed_precision,
        gradient=gradient,
        doc=doc or (inspect.getdoc(compute) or ""),
    )
    _REGISTRY[name] = opdef
    return opdef


def get_op_def(name: str) -> OpDef:
    try:
        return _REGISTRY[name]
    except KeyError:
        raise KilnError(f"no operator named {name!r} is registered") from None


def list_ops() -> list[str]:
    return sorted(_REGISTRY)


def infer_struct_info(call: Any) -> Any:
    """Run the declared inference for an op call, wrapping failures with the op's name."""
    opdef = get_op_def(call.op.name)
    try:
        return opdef.infer(call)
    except StructInfoError:
        raise
    except KilnError as err:
        raise StructInfoError(f"{opdef.name}: {err}") from err
