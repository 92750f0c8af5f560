"""FoldConstant: evaluate at compile time what only depends on constants.

A binding is folded when its value is

- an operator call whose tensor arguments (the fields of a tuple argument too) are all
  Constants, or variables bound to Constants earlier in the function,
- a ``call_tir`` of a module PrimFunc on such arguments, or
- a ``TupleGetItem`` of a tuple of constants (what folding a multi-output op gives),

its result has a static shape, and the operator is pure (no side effects, not random; see
:func:`~kiln.transform.dead_code_elimination.op_is_pure`). The binding keeps its variable and
becomes ``lv = <Constant>`` (a tuple of Constants for multi-output ops); uses still read ``lv``,
so a large constant is stored once whatever the number of its users.

Evaluation uses kiln itself, so a folded value is what kiln's own kernel for that op computes
(no second implementation of every op to keep in sync): the call is put alone in a module whose
parameters are the constants' types, legalized, compiled with
:func:`kiln.codegen.executable.build_executable` (what ``kiln.build`` compiles with; the
native-code cache makes repeated builds cheap) and run. Pure data movement (reshape, squeeze,
expand_dims, transpose, broadcast_to, concat) is done with numpy instead, which is exact for it.
Builds are memoized per pass run by (op, attributes, argument types). A call kiln cannot build
or run (a KilnError) is left as it was. Folds are memoized too, by (op, attributes, argument
Constant objects): equal calls on the same constants -- torch's decompositions transpose a
recurrent weight once per time step -- give one shared Constant, not a copy per call (with
CanonicalizeOps' one transpose per weight, the 64-step LSTM of ``benchmarks/torch_models.py``
went from 139 distinct constants, 539 MB, every step reading its own copy from memory, to 15,
19 MB).

Size cap: folding must not blow up the model. A result is folded only if it has at most
``transform.fold_constant.max_elements`` elements (a PassContext config, default 2**18) or no
more elements than its largest constant input (so transposing or casting a big weight folds,
while broadcasting a scalar to a huge tensor does not).
"""

from __future__ import annotations

import math
from typing import Any

import numpy as np

from .. import progress
from ..codegen.executable import build_executable
from ..graph import expr as gx
from ..graph.block_builder import BlockBuilder
from ..graph.struct_info import TensorStructInfo, TupleStructInfo
from ..ir.errors import KilnError
from ..ir.module import IRModule
from ..target import Target
from ..tir.function import PrimFunc
from .dead_code_elimination import op_is_pure
from .eliminate_common_subexpr import Exact, attrs_equal, attrs_key
from .legalize_ops import LegalizeOps
from .pass_infra import PassContext, module_pass, register_config
from .simplify_expr import RewriteMutator

__all__ = ["FoldConstant", "MAX_ELEMENTS_KEY"]

MAX_ELEMENTS_KEY = "transform.fold_constant.max_elements"
register_config(
    MAX_ELEMENTS_KEY, int, 1 << 18,
    "FoldConstant folds a result only if it has at most this many elements (or no more than "
    "its largest constant input).",
)

#: Ops evaluated with numpy (exact: pure data movement). Output shape comes from StructInfo.
_NUMPY_OPS = ("reshape", "squeeze", "expand_dims", "transpose", "broadcast_to", "concat")


def _static_shapes(sinfo: Any) -> list[tuple[int, ...]] | None:
    """Static shapes of a tensor or tuple-of-tensors StructInfo (None when not all static)."""
    if isinstance(sinfo, TensorStructInfo):
        return [sinfo.static_shape()] if sinfo.is_static else None
    if isinstance(sinfo, TupleStructInfo):
        out: list[tuple[int, ...]] = []
        for f in sinfo.fields:
            s = _static_shapes(f)
            if s is None or not isinstance(f, TensorStructInfo):
                return None
            out += s
        return out
    return None


def _numpy_eval(call: gx.Call, arrays: list[np.ndarray]) -> np.ndarray:
    name = call.op.name
    out_shape = call.struct_info.static_shape()
    if name in ("reshape", "squeeze", "expand_dims"):
        return arrays[0].reshape(out_shape)
    if name == "transpose":
        axes = call.attrs.axes if call.attrs is not None else None
        return np.transpose(arrays[0], axes)
    if name == "broadcast_to":
        return np.broadcast_to(arrays[0], out_shape)
    if name == "concat":
        return np.concatenate(arrays, axis=call.attrs.axis if call.attrs is not None else 0)
    raise KilnError(f"FoldConstant: no numpy evaluation for {name}")


def _call_key(call: gx.Call, operands: tuple) -> Any:
    """A hashable key of ``call``: op, attributes, how the constants fill the arguments (tuple
    fields) and ``operands`` (what is known of the constants); None for ``call_tir`` (PrimFuncs
    are not hashed; call_tir folds are rare)."""
    if gx.is_call_tir(call):
        return None
    structure = tuple(len(a.fields) if isinstance(a, gx.Tuple) else -1 for a in call.args)
    return (call.op.name, Exact(call.attrs, attrs_key, attrs_equal), structure, operands)


class ConstantEvaluator:
    """Builds and runs single-call modules with kiln, memoizing the executables."""

    def __init__(self, target: Any = "c"):
        self.target = target
        self._exes: dict[Any, Any] = {}

    def run(self, call: gx.Call, arrays: list[np.ndarray], prim_funcs: dict[str, PrimFunc]
            ) -> list[np.ndarray]:
        key = self._key(call, arrays)
        exe = self._exes.get(key) if key is not None else None
        if exe is None:
            exe = self._build(call, arrays, prim_funcs)
            if key is not None:
                self._exes[key] = exe
        out = exe(*arrays)
        outs = list(out) if isinstance(out, (list, tuple)) else [out]
        return [np.asarray(o) for o in outs]

    @staticmethod
    def _key(call: gx.Call, arrays: list[np.ndarray]) -> Any:
        return _call_key(call, tuple((a.shape, str(a.dtype)) for a in arrays))

    def _build(self, call: gx.Call, arrays: list[np.ndarray],
               prim_funcs: dict[str, PrimFunc]) -> Any:
        params = [gx.Var(f"a{i}", TensorStructInfo(a.shape, str(a.dtype)))
                  for i, a in enumerate(arrays)]
        it = iter(params)
        if gx.is_call_tir(call):
            gvar = call.args[0]
            new_call = gx.call_tir(gvar, [next(it) for _ in call.args[1].fields],
                                   call.sinfo_args[0])
            bb = BlockBuilder(IRModule({gvar.name: prim_funcs[gvar.name]}))
        else:
            args = []
            for a in call.args:
                if isinstance(a, gx.Tuple):
                    args.append(gx.Tuple(tuple(next(it) for _ in a.fields)))
                else:
                    args.append(next(it))
            new_call = call.replace(args=tuple(args))
            bb = BlockBuilder()
        with bb.function("main", params):
            with bb.dataflow():
                out = bb.emit_output(new_call)
            bb.emit_func_output(out)
        # a private context: no instruments of the caller, legalization only
        with PassContext(opt_level=0, instruments=()), progress.quiet():
            mod = LegalizeOps()(bb.get())
            return build_executable(mod, Target.create(self.target))


class _Folder(RewriteMutator):
    def __init__(self, bb: BlockBuilder, mod: IRModule, max_elements: int,
                 evaluator: ConstantEvaluator):
        super().__init__(bb)
        self.prim_funcs = {n: f for n, f in mod.items() if isinstance(f, PrimFunc)}
        self.max_elements = max_elements
        self.evaluator = evaluator
        # fold key -> (result, the argument Constants: kept alive so that their ids stay unique)
        self.folded: dict[Any, tuple[gx.Expr, list[gx.Constant]]] = {}

    def _const_args(self, call: gx.Call) -> list[gx.Constant] | None:
        out: list[gx.Constant] = []
        args = call.args[1].fields if gx.is_call_tir(call) else call.args
        for a in args:
            fields = a.fields if isinstance(a, gx.Tuple) and not gx.is_call_tir(call) else (a,)
            for f in fields:
                c = self.constant_of(f)
                if c is None:
                    return None
                out.append(c)
        return out or None

    def _tuple_of_constants(self, e: gx.Expr) -> gx.Tuple | None:
        t = e if isinstance(e, gx.Tuple) else self.producer(e)
        if isinstance(t, gx.Tuple) and all(isinstance(f, gx.Constant) for f in t.fields):
            return t
        return None

    def rewrite(self, var: gx.Var, value: gx.Expr) -> gx.Expr | None:
        if isinstance(value, gx.TupleGetItem):
            t = self._tuple_of_constants(value.tuple_value)
            return t.fields[value.index] if t is not None else None
        if not isinstance(value, gx.Call) or not isinstance(value.op, gx.Op):
            return None
        name = value.op.name
        if not op_is_pure(name):
            return None
        if name == "call_tir" and not isinstance(self.prim_funcs.get(value.args[0].name),
                                                 PrimFunc):
            return None
        shapes = _static_shapes(value.struct_info)
        consts = self._const_args(value)
        if shapes is None or consts is None:
            return None
        out_elems = sum(math.prod(s) for s in shapes)
        biggest_in = max(c.data.size for c in consts)
        if out_elems > self.max_elements and out_elems > biggest_in:
            return None
        # the same call on the same Constant objects: the same result
        key = _call_key(value, tuple(id(c) for c in consts))
        hit = self.folded.get(key) if key is not None else None
        if hit is not None:
            return hit[0]
        folded = self._fold(value, consts, shapes)
        if folded is not None and key is not None:
            self.folded[key] = (folded, consts)
        return folded

    def _fold(self, value: gx.Call, consts: list[gx.Constant],
              shapes: list[tuple[int, ...]]) -> gx.Expr | None:
        name = value.op.name
        arrays = [np.asarray(c.data) for c in consts]
        try:
            if name in _NUMPY_OPS and isinstance(value.struct_info, TensorStructInfo):
                results = [_numpy_eval(value, arrays)]
            else:
                results = self.evaluator.run(value, arrays, self.prim_funcs)
        except KilnError:
            return None
        sinfos = (value.struct_info.fields if isinstance(value.struct_info, TupleStructInfo)
                  else (value.struct_info,))
        if len(results) != len(shapes) or any(
            r.shape != s for r, s in zip(results, shapes)
        ):
            return None
        consts_out = [gx.Constant(np.array(r, dtype=si.dtype.to_numpy(), order="C"))
                      for r, si in zip(results, sinfos)]
        if isinstance(value.struct_info, TensorStructInfo):
            return consts_out[0]
        return gx.Tuple(tuple(consts_out))


@module_pass(opt_level=1)
class FoldConstant:
    """Evaluate calls whose arguments are all constants at compile time."""

    def __init__(self, target: Any = "c"):
        self.target = target

    def transform_module(self, mod: IRModule, ctx: PassContext) -> IRModule:
        max_elements = ctx.get_config(MAX_ELEMENTS_KEY)
        evaluator = ConstantEvaluator(self.target)
        bb = BlockBuilder(mod)
        for name, func in mod.items():
            if isinstance(func, gx.Function):
                new = _Folder(bb, mod, max_elements, evaluator).visit(func)
                if new is not func:
                    bb.update_func(name, new)
        return bb.get()
