"""BlockBuilder: builds graph functions in A-normal form, inferring StructInfo as it goes.

```python
bb = BlockBuilder()
x = Var("x", TensorStructInfo((n, 64), "float32"))
with bb.function("main", [x]):
    with bb.dataflow():
        lv = bb.emit(op.relu(op.add(x, x)))   # the inner add is emitted first (A-normal form)
        gv = bb.emit_output(lv)
    bb.emit_func_output(gv)
mod = bb.get()
```

Normalization (:meth:`BlockBuilder.normalize`) fills every expression's ``struct_info``: an
operator call through its declaration in ``kiln.op`` (``kiln.graph.op_registry.infer_struct_info``),
``call_tir`` from its ``out_sinfo``, a call of a graph function from the callee's signature
(binding its symbolic dimensions). :meth:`emit` also puts the value in A-normal form: nested
non-leaf arguments are emitted as their own bindings first.

Passes drive the builder through the scope API (``begin_scope``, ``begin_dataflow_block``,
``begin_binding_block``, ``emit_normalized``, ``end_block``, ``end_scope``), which is what
:class:`kiln.graph.functor.ExprMutator` uses.
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from typing import Any

from .. import tir
from ..ir.errors import InternalError, KilnError, StructInfoError, error_context
from ..ir.module import IRModule
from ..ir.node import structural_equal, structural_hash
from ..ir.span import Span
from .expr import (
    Binding,
    BindingBlock,
    Call,
    DataflowBlock,
    DataflowVar,
    Expr,
    ExternFunc,
    Function,
    GlobalVar,
    If,
    MatchCast,
    Op,
    SeqExpr,
    Tuple,
    TupleGetItem,
    Var,
    VarBinding,
    as_expr,
    is_leaf,
)
from .op_registry import get_op_def, infer_struct_info
from .printer import format_prim
from .struct_info import (
    FuncStructInfo,
    ObjectStructInfo,
    PrimStructInfo,
    ShapeStructInfo,
    StructInfo,
    TensorStructInfo,
    TupleStructInfo,
    dims_differ,
    struct_info_lca,
)


class _Block:
    def __init__(self, dataflow: bool):
        self.dataflow = dataflow
        self.bindings: list[Binding] = []

    def build(self) -> BindingBlock:
        cls = DataflowBlock if self.dataflow else BindingBlock
        return cls(tuple(self.bindings))


class _Scope:
    """One sequence of blocks being built (a function body or a branch)."""

    def __init__(self, names: set[str]):
        self.names = names
        self.blocks: list[BindingBlock] = []
        self.block: _Block | None = None

    def flush(self) -> None:
        if self.block is not None:
            if self.block.bindings:
                self.blocks.append(self.block.build())
            self.block = None


class _FunctionFrame:
    def __init__(self, name: str, params: list[Var] | None, attrs: dict | None):
        self.name = name
        self.params = params
        self.attrs = dict(attrs or {})
        self.scope: _Scope | None = None
        self.result: Function | None = None


def _callee_label(call: Call) -> str:
    op = call.op
    if isinstance(op, Op | GlobalVar):
        return op.name
    if isinstance(op, ExternFunc):
        return op.symbol
    if isinstance(op, Var):
        return op.name
    return type(op).__name__


class BlockBuilder:
    """Builds graph functions and the IRModule that holds them (see the module docstring)."""

    def __init__(self, mod: IRModule | None = None):
        self._mod = mod.copy() if mod is not None else IRModule()
        self._scopes: list[_Scope] = []
        self._frames: list[_FunctionFrame] = []
        self._bound: dict[Var, Expr] = {}
        #: The span given to calls bound without one (see :meth:`span`).
        self._span: Span | None = None
        # structural hash -> names, per function class; built on first add_func of that class
        # (hashing a graph function hashes its constants, so never do it needlessly)
        self._hash_index: dict[type, dict[int, list[str]]] = {}

    # -----------------------------------------------------------------------------------------
    # module-level functions
    # -----------------------------------------------------------------------------------------
    def _index_of(self, kind: type) -> dict[int, list[str]]:
        index = self._hash_index.get(kind)
        if index is None:
            index = self._hash_index[kind] = {}
            for name, func in self._mod.items():
                if type(func) is kind:
                    index.setdefault(structural_hash(func), []).append(name)
        return index

    def _index(self, name: str, func: Any) -> None:
        index = self._hash_index.get(type(func))
        if index is not None:
            index.setdefault(structural_hash(func), []).append(name)

    def get_unique_name(self, name_hint: str) -> str:
        """A function name not yet used in the module (``name``, ``name1``, ``name2``...)."""
        taken = set(self._mod) | {f.name for f in self._frames}
        if name_hint not in taken:
            return name_hint
        k = 1
        while f"{name_hint}{k}" in taken:
            k += 1
        return f"{name_hint}{k}"

    def add_func(self, func: Any, name_hint: str) -> GlobalVar:
        """Add a function (PrimFunc or graph Function) under a unique name; a function
        structurally equal to one already in the module is not added again (its GlobalVar is
        returned)."""
        index = self._index_of(type(func))
        key = structural_hash(func)
        for name in index.get(key, ()):
            if name in self._mod and structural_equal(self._mod[name], func):
                return GlobalVar(name)
        name = self.get_unique_name(name_hint)
        self._mod[name] = func
        index.setdefault(key, []).append(name)
        return GlobalVar(name)

    def update_func(self, gvar: GlobalVar | str, func: Any) -> None:
        """Replace the function named by ``gvar`` (or add it under exactly that name)."""
        name = gvar if isinstance(gvar, str) else gvar.name
        self._mod[name] = func
        self._index(name, func)

    def get(self) -> IRModule:
        """The module built so far (a copy: later building does not change it)."""
        if self._frames:
            raise KilnError(
                f"BlockBuilder.get() inside function {self._frames[-1].name!r}: finish it first"
            )
        return self._mod.copy()

    def lookup_binding(self, var: Var) -> Expr | None:
        """The value a variable emitted by this builder is bound to (None if unknown)."""
        return self._bound.get(var)

    # -----------------------------------------------------------------------------------------
    # functions and blocks (user API)
    # -----------------------------------------------------------------------------------------
    @contextmanager
    def function(
        self, name: str, params: Sequence[Var] | None = None, attrs: dict[str, Any] | None = None
    ) -> Iterator[None]:
        """Build graph function ``name``; the body must end with :meth:`emit_func_output`.

        ``params`` may instead be given to :meth:`emit_func_output`. The function is added to
        the module when the ``with`` block ends.
        """
        if self._frames:
            raise KilnError(f"bb.function({name!r}) inside function {self._frames[-1].name!r}")
        if name in self._mod:
            raise KilnError(f"the module already has a function named {name!r}")
        frame = _FunctionFrame(name, self._check_params(name, params), attrs)
        depth = len(self._scopes)
        self._frames.append(frame)
        frame.scope = self._push_scope(frame.params or ())
        try:
            yield
            if frame.result is None:
                raise KilnError(f"function {name}: bb.emit_func_output(...) was not called")
            self._mod[name] = frame.result
            self._index(name, frame.result)
        finally:
            del self._scopes[depth:]
            self._frames.remove(frame)

    @staticmethod
    def _check_params(name: str, params: Sequence[Var] | None) -> list[Var] | None:
        if params is None:
            return None
        if isinstance(params, Var):
            params = [params]
        out = list(params)
        for p in out:
            if not isinstance(p, Var) or isinstance(p, DataflowVar):
                raise KilnError(f"function {name}: parameters must be Vars, got {p!r}")
            if p.struct_info is None:
                raise StructInfoError(f"function {name}: parameter {p.name} has no struct_info")
        return out

    @contextmanager
    def dataflow(self) -> Iterator[None]:
        """A dataflow block: values emitted inside are DataflowVars unless emitted with
        :meth:`emit_output`."""
        scope = self._require_scope("dataflow()")
        if scope.block is not None and scope.block.dataflow:
            raise KilnError("dataflow blocks cannot be nested")
        scope.flush()
        block = _Block(dataflow=True)
        scope.block = block
        try:
            yield
        except BaseException:
            scope.block = None
            raise
        if scope.block is not block:
            raise InternalError("the dataflow block was closed by someone else")
        scope.flush()

    def emit(self, expr: Any, name_hint: str = "") -> Var:
        """Bind ``expr`` (normalized, in A-normal form) to a new variable and return it."""
        scope = self._require_scope("emit")
        value = self._normalize(as_expr(expr), anf=True)
        dataflow = scope.block is not None and scope.block.dataflow
        return self._emit_value(value, name_hint, dataflow)

    def emit_output(self, expr: Any, name_hint: str = "") -> Var:
        """In a dataflow block: emit a value visible after the block (a Var, not DataflowVar)."""
        scope = self._require_scope("emit_output")
        if scope.block is None or not scope.block.dataflow:
            raise KilnError("emit_output is only allowed inside a dataflow block")
        value = self._normalize(as_expr(expr), anf=True)
        return self._emit_value(value, name_hint, dataflow=False)

    def match_cast(self, value: Any, struct_info: StructInfo, name_hint: str = "") -> Var:
        """Bind ``value`` to a new variable whose StructInfo is ``struct_info`` (checked at run
        time); symbolic variables first seen in ``struct_info`` are defined by this binding."""
        scope = self._require_scope("match_cast")
        if not isinstance(struct_info, StructInfo):
            raise StructInfoError(f"match_cast needs a StructInfo, got {struct_info!r}")
        value = self._normalize(as_expr(value), anf=True)
        check_match_cast(value.struct_info, struct_info)
        dataflow = scope.block is not None and scope.block.dataflow
        cls = DataflowVar if dataflow else Var
        var = cls(self._unique_var_name(name_hint or ("lv" if dataflow else "gv")), struct_info)
        self._append(MatchCast(var, value, struct_info))
        return var

    def emit_func_output(self, output: Any, params: Sequence[Var] | None = None) -> None:
        """End the current function with result ``output`` (a list/tuple becomes a Tuple)."""
        if not self._frames:
            raise KilnError("emit_func_output outside of bb.function(...)")
        frame = self._frames[-1]
        if frame.result is not None:
            raise KilnError(f"function {frame.name}: emit_func_output called twice")
        scope = frame.scope
        if not self._scopes or self._scopes[-1] is not scope:
            raise KilnError(f"function {frame.name}: emit_func_output inside a nested scope")
        if scope.block is not None and scope.block.dataflow:
            raise KilnError(
                f"function {frame.name}: emit_func_output inside a dataflow block; "
                "emit the result with emit_output and call emit_func_output after the block"
            )
        if params is not None:
            if frame.params is not None:
                raise KilnError(f"function {frame.name}: parameters given twice")
            frame.params = self._check_params(frame.name, params)
            scope.names.update(p.name for p in frame.params or ())
        if frame.params is None:
            raise KilnError(f"function {frame.name}: no parameters given (pass params=[...])")
        if isinstance(output, (list, tuple)):
            output = Tuple(tuple(as_expr(o) for o in output))
        body = self._normalize(as_expr(output), anf=True)
        if not is_leaf(body):
            body = self._emit_value(body, "gv", dataflow=False)
        leaked = [v.name for v in (body.fields if isinstance(body, Tuple) else (body,))
                  if isinstance(v, DataflowVar)]
        if leaked:
            raise KilnError(
                f"function {frame.name}: output uses DataflowVar(s) {leaked} outside their "
                "dataflow block; emit them with bb.emit_output"
            )
        scope.flush()
        self._scopes.pop()
        frame.result = Function(tuple(frame.params), SeqExpr(tuple(scope.blocks), body),
                                None, frame.attrs)

    @contextmanager
    def span(self, span: Span | None) -> Iterator[None]:
        """Calls bound inside this context without a span of their own get ``span`` (the model
        node a frontend is converting, the call a pass is rewriting); ``None`` keeps the
        enclosing context's span. An error escaping the context names the span's model nodes
        (``kiln.ir.errors.error_context``: a KilnError gets them as a prefix, anything else
        becomes an InternalError naming them)."""
        saved = self._span
        if span is not None:
            self._span = span
        try:
            if span is None:
                yield
            else:
                # errors escaping the node's conversion or rewrite name its model nodes
                with error_context(str(span)):
                    yield
        finally:
            self._span = saved

    @property
    def current_span(self) -> Span | None:
        return self._span

    def current_block_is_dataflow(self) -> bool:
        return bool(self._scopes) and self._scopes[-1].block is not None and (
            self._scopes[-1].block.dataflow
        )

    # -----------------------------------------------------------------------------------------
    # scope API (for passes and mutators)
    # -----------------------------------------------------------------------------------------
    def begin_scope(self, params: Sequence[Var] = ()) -> None:
        """Start a nested sequence of blocks (a function body or a branch)."""
        self._push_scope(params)

    def end_scope(self) -> list[BindingBlock]:
        """Finish the innermost scope; returns blocks that were closed implicitly in it."""
        if not self._scopes:
            raise KilnError("end_scope without begin_scope")
        scope = self._scopes[-1]
        if self._frames and self._frames[-1].scope is scope:
            raise KilnError("end_scope would close a bb.function; use emit_func_output")
        scope.flush()
        self._scopes.pop()
        return scope.blocks

    def begin_dataflow_block(self) -> None:
        self._begin_block(dataflow=True)

    def begin_binding_block(self) -> None:
        self._begin_block(dataflow=False)

    def _begin_block(self, dataflow: bool) -> None:
        scope = self._require_scope("begin block")
        scope.flush()
        scope.block = _Block(dataflow)

    def end_block(self) -> BindingBlock:
        """Close the current block and return it (possibly empty); it is not kept by the scope."""
        scope = self._require_scope("end_block")
        if scope.block is None:
            raise KilnError("end_block without an open block")
        block = scope.block.build()
        scope.block = None
        return block

    def emit_normalized(self, binding: Binding) -> Binding:
        """Append an already-normalized binding to the current block as is."""
        if not isinstance(binding, Binding):
            raise KilnError(f"emit_normalized needs a VarBinding or MatchCast, got {binding!r}")
        if binding.var.struct_info is None:
            raise StructInfoError(f"variable {binding.var.name} has no struct_info")
        scope = self._require_scope("emit_normalized")
        if isinstance(binding.var, DataflowVar) and (scope.block is None or
                                                      not scope.block.dataflow):
            raise KilnError(f"DataflowVar {binding.var.name} bound outside a dataflow block")
        scope.names.add(binding.var.name)
        return self._append(binding)

    # -----------------------------------------------------------------------------------------
    # internals
    # -----------------------------------------------------------------------------------------
    def _push_scope(self, params: Sequence[Var]) -> _Scope:
        names = self._scopes[-1].names if self._scopes else set()
        names.update(p.name for p in params)
        scope = _Scope(names)
        self._scopes.append(scope)
        return scope

    def _require_scope(self, what: str) -> _Scope:
        if not self._scopes:
            raise KilnError(f"{what} needs an open function (with bb.function(...)) or scope")
        return self._scopes[-1]

    def _unique_var_name(self, hint: str) -> str:
        names = self._require_scope("naming").names
        name = hint
        k = 1
        while name in names:
            name = f"{hint}{k}"
            k += 1
        names.add(name)
        return name

    def _append(self, binding: Binding) -> Binding:
        scope = self._require_scope("emit")
        if scope.block is None:
            scope.block = _Block(dataflow=False)
        value = binding.value
        if self._span is not None and isinstance(value, Call) and value.span is None:
            binding = binding.replace(value=value.with_span(self._span))
        scope.block.bindings.append(binding)
        self._bound[binding.var] = binding.value
        return binding

    def _emit_value(self, value: Expr, name_hint: str, dataflow: bool) -> Var:
        if value.struct_info is None:
            raise InternalError(f"emitting a value without struct_info: {type(value).__name__}")
        cls = DataflowVar if dataflow else Var
        var = cls(self._unique_var_name(name_hint or ("lv" if dataflow else "gv")),
                  value.struct_info)
        self._append(VarBinding(var, value))
        return var

    # -----------------------------------------------------------------------------------------
    # normalization
    # -----------------------------------------------------------------------------------------
    def normalize(self, expr: Any, anf: bool = False) -> Expr:
        """Fill ``struct_info`` throughout ``expr`` (inferring op calls) and return it.

        Nothing is emitted unless ``anf=True``: then nested non-leaf arguments are emitted into
        the current block first, as :meth:`emit` does. Nodes whose children are unchanged keep
        their identity (their struct_info is filled in place, once).
        """
        return self._normalize(as_expr(expr), anf)

    def _normalize(self, expr: Expr, anf: bool) -> Expr:
        method = getattr(self, "_norm_" + type(expr).__name__, None)
        if method is None:
            raise InternalError(f"cannot normalize a {type(expr).__name__}")
        return method(expr, anf)

    def _arg(self, expr: Expr, anf: bool) -> Expr:
        expr = self._normalize(as_expr(expr), anf)
        if anf and not is_leaf(expr):
            dataflow = self.current_block_is_dataflow()
            return self._emit_value(expr, "", dataflow)
        return expr

    def _norm_Var(self, v: Var, anf: bool) -> Expr:
        if v.struct_info is None:
            raise StructInfoError(f"variable {v.name} has no struct_info")
        return v

    _norm_DataflowVar = _norm_Var

    def _norm_leaf(self, e: Expr, anf: bool) -> Expr:
        return e

    _norm_Constant = _norm_ShapeExpr = _norm_PrimValue = _norm_StringImm = _norm_leaf
    _norm_GlobalVar = _norm_Op = _norm_ExternFunc = _norm_leaf

    def _norm_Tuple(self, t: Tuple, anf: bool) -> Expr:
        fields = tuple(self._arg(f, anf) for f in t.fields)
        unchanged = all(a is b for a, b in zip(fields, t.fields))
        if unchanged and t.struct_info is not None:
            return t
        sinfo = TupleStructInfo(tuple(f.struct_info or ObjectStructInfo() for f in fields))
        if unchanged:
            t._fill_struct_info(sinfo)
            return t
        return Tuple(fields, struct_info=sinfo)

    def _norm_TupleGetItem(self, e: TupleGetItem, anf: bool) -> Expr:
        tv = self._arg(e.tuple_value, anf)
        ts = tv.struct_info
        if not isinstance(ts, TupleStructInfo):
            raise StructInfoError(f"TupleGetItem [{e.index}]: the value is not a tuple ({ts})")
        if not 0 <= e.index < len(ts.fields):
            raise StructInfoError(
                f"TupleGetItem: index {e.index} out of range for a tuple of {len(ts.fields)}"
            )
        if tv is e.tuple_value:
            e._fill_struct_info(ts.fields[e.index])
            return e
        return TupleGetItem(tv, e.index, struct_info=ts.fields[e.index])

    def _norm_Call(self, call: Call, anf: bool) -> Expr:
        op = call.op
        if not isinstance(op, Op | GlobalVar | ExternFunc):
            op = self._arg(op, anf)
        args = tuple(self._arg(a, anf) for a in call.args)
        unchanged = op is call.op and all(a is b for a, b in zip(args, call.args))
        if isinstance(op, Op) and op.name == "call_tir":
            _check_call_tir(args, call.sinfo_args)
        if unchanged and call.struct_info is not None:
            return call
        new = call if unchanged else call.replace(op=op, args=args)
        attrs = _default_attrs(new)
        if attrs is not None:
            new = new.replace(attrs=attrs)
        if new.struct_info is None:
            new._fill_struct_info(self._infer_call(new))
        return new

    def _norm_If(self, e: If, anf: bool) -> Expr:
        cond = self._arg(e.cond, anf)
        cs = cond.struct_info
        if not isinstance(cs, PrimStructInfo | TensorStructInfo | ObjectStructInfo):
            raise StructInfoError(f"If condition must be a scalar or a 0-d tensor, got {cs}")
        tb = self._normalize_branch(e.true_branch, anf)
        fb = self._normalize_branch(e.false_branch, anf)
        sinfo = struct_info_lca(tb.struct_info, fb.struct_info)
        if cond is e.cond and tb is e.true_branch and fb is e.false_branch:
            e._fill_struct_info(sinfo)
            return e
        return If(cond, tb, fb, struct_info=sinfo)

    def _normalize_branch(self, expr: Expr, anf: bool) -> SeqExpr:
        if isinstance(expr, SeqExpr):
            return self._norm_SeqExpr(expr, anf)
        if not anf:
            return SeqExpr((), self._normalize(expr, False))
        self.begin_scope()
        self.begin_binding_block()
        body = self._normalize(as_expr(expr), anf=True)
        if not is_leaf(body):
            body = self._emit_value(body, "", dataflow=False)
        block = self.end_block()
        self.end_scope()
        return SeqExpr((block,) if block.bindings else (), body)

    def _norm_SeqExpr(self, seq: SeqExpr, anf: bool) -> Expr:
        blocks = tuple(self._norm_block(b) for b in seq.blocks)
        body = self._normalize(seq.body, False)
        if body is seq.body and all(a is b for a, b in zip(blocks, seq.blocks)):
            seq._fill_struct_info(body.struct_info)
            return seq
        return SeqExpr(blocks, body)

    def _norm_block(self, block: BindingBlock) -> BindingBlock:
        bindings = []
        for b in block.bindings:
            value = self._normalize(b.value, False)
            if b.var.struct_info is None:
                raise StructInfoError(f"variable {b.var.name} has no struct_info")
            bindings.append(b if value is b.value else b.replace(value=value))
        if all(a is b for a, b in zip(bindings, block.bindings)):
            return block
        return block.replace(bindings=tuple(bindings))

    def _norm_Function(self, f: Function, anf: bool) -> Expr:
        if isinstance(f.body, SeqExpr) or not anf:
            body = self._normalize(f.body, False)
        else:
            self.begin_scope(f.params)
            self.begin_binding_block()
            body = self._normalize(f.body, anf=True)
            if not is_leaf(body):
                body = self._emit_value(body, "gv", dataflow=False)
            block = self.end_block()
            self.end_scope()
            body = SeqExpr((block,) if block.bindings else (), body)
        if body is f.body and f.struct_info is not None:
            return f
        return Function(f.params, body, f.ret_struct_info, f.attrs)

    # -----------------------------------------------------------------------------------------
    # inference of calls
    # -----------------------------------------------------------------------------------------
    def _infer_call(self, call: Call) -> StructInfo:
        label = _callee_label(call)
        for i, a in enumerate(call.args):
            # a GlobalVar argument names a function (a control-flow call's branches)
            if a.struct_info is None and not isinstance(a, GlobalVar):
                raise StructInfoError(f"{label}: argument {i} has no struct_info")
        op = call.op
        if isinstance(op, Op):
            if op.name == "call_tir":
                return call.sinfo_args[0]
            return infer_op_call(call)
        if call.sinfo_args:
            return call.sinfo_args[0]
        if isinstance(op, GlobalVar):
            func = self._mod.functions.get(op.name)
            if isinstance(func, Function) and func.struct_info is not None:
                return call_sinfo(op.name, func.struct_info, call)
            what = "a PrimFunc" if func is not None else "not in the module"
            raise StructInfoError(
                f"call of {op.name} ({what}): give its result StructInfo in sinfo_args"
            )
        if isinstance(op, ExternFunc):
            raise StructInfoError(f"call of extern {op.symbol}: give its result in sinfo_args")
        fs = op.struct_info
        if isinstance(fs, FuncStructInfo):
            return call_sinfo(label, fs, call)
        raise StructInfoError(f"{label} is not callable (its StructInfo is {fs})")


def _default_attrs(call: Call) -> Any:
    """Default attributes for an op call built without attrs (None if nothing to do)."""
    if not isinstance(call.op, Op) or call.op.name == "call_tir" or call.attrs is not None:
        return None
    try:
        opdef = get_op_def(call.op.name)
    except KilnError as err:
        raise StructInfoError(str(err)) from err
    if opdef.attrs is None:
        return None
    try:
        return opdef.attrs()
    except TypeError as err:
        raise StructInfoError(f"{opdef.name}: call has no attrs and they have no defaults ({err})"
                              ) from err


def infer_op_call(call: Call) -> StructInfo:
    try:
        opdef = get_op_def(call.op.name)
    except KilnError as err:
        raise StructInfoError(str(err)) from err
    n_in = len(opdef.inputs)
    if len(call.args) != n_in:
        raise StructInfoError(
            f"{opdef.name}: expected {n_in} input(s) {list(opdef.inputs)}, got {len(call.args)}"
        )
    if opdef.variadic:
        last = call.args[-1]
        if not isinstance(last.struct_info, TupleStructInfo):
            raise StructInfoError(
                f"{opdef.name}: input {opdef.inputs[-1][:-1]!r} must be a tuple of tensors, "
                f"got {last.struct_info}"
            )
    try:
        sinfo = infer_struct_info(call)
    except KilnError:
        raise
    except Exception as err:
        raise InternalError(
            f"StructInfo inference of {opdef.name} crashed: {type(err).__name__}: {err}"
        ) from err
    if not isinstance(sinfo, StructInfo):
        raise InternalError(f"StructInfo inference of {opdef.name} returned {sinfo!r}")
    return sinfo


def _check_call_tir(args: tuple[Expr, ...], sinfo_args: tuple[StructInfo, ...]) -> None:
    ok = (
        len(args) == 2
        and isinstance(args[0], GlobalVar)
        and (isinstance(args[1], Tuple) or isinstance(args[1].struct_info, TupleStructInfo))
    )
    if not ok:
        raise StructInfoError("call_tir expects (GlobalVar, Tuple of arguments)")
    if len(sinfo_args) != 1:
        raise StructInfoError(
            f"call_tir {args[0].name}: needs exactly one sinfo_arg (the output StructInfo)"
        )


# ---------------------------------------------------------------------------------------------
# calls of graph functions: match the arguments, bind symbolic dims, derive the result
# ---------------------------------------------------------------------------------------------
def call_sinfo(name: str, fs: FuncStructInfo, call: Call) -> StructInfo:
    if fs.params is None:
        return fs.ret
    if len(fs.params) != len(call.args):
        raise StructInfoError(
            f"call of {name}: expected {len(fs.params)} argument(s), got {len(call.args)}"
        )
    bind: dict[tir.Var, tir.PrimExpr] = {}
    for i, (p, a) in enumerate(zip(fs.params, call.args)):
        _match(p, a.struct_info, bind, f"call of {name}: argument {i}")
    return tir.substitute(fs.ret, bind) if bind else fs.ret


def _match_dims(pdims, adims, bind: dict, what: str) -> None:
    if pdims is None or adims is None:
        return
    if len(pdims) != len(adims):
        raise StructInfoError(f"{what}: expected {len(pdims)} dims, got {len(adims)}")
    for j, (pd, ad) in enumerate(zip(pdims, adims)):
        if isinstance(pd, tir.Var) and pd not in bind:
            bind[pd] = ad
            continue
        expected = tir.substitute(pd, bind) if bind else pd
        if dims_differ(expected, ad):
            raise StructInfoError(
                f"{what}: dimension {j} must be {_fmt(expected)}, got {_fmt(ad)}"
            )


def _match(param: StructInfo, arg: StructInfo, bind: dict, what: str) -> None:
    if isinstance(param, ObjectStructInfo) or isinstance(arg, ObjectStructInfo):
        return
    if type(param) is not type(arg):
        raise StructInfoError(f"{what}: expected {param}, got {arg}")
    if isinstance(param, TensorStructInfo):
        if param.dtype != arg.dtype:
            raise StructInfoError(f"{what}: expected dtype {param.dtype}, got {arg.dtype}")
        if param.ndim >= 0 and arg.ndim >= 0 and param.ndim != arg.ndim:
            raise StructInfoError(f"{what}: expected a {param.ndim}-d tensor, got {arg.ndim}-d")
        _match_dims(param.shape, arg.shape, bind, what)
    elif isinstance(param, ShapeStructInfo):
        if param.ndim >= 0 and arg.ndim >= 0 and param.ndim != arg.ndim:
            raise StructInfoError(f"{what}: expected a shape of {param.ndim} dims, got {arg.ndim}")
        _match_dims(param.values, arg.values, bind, what)
    elif isinstance(param, PrimStructInfo):
        if param.dtype != arg.dtype:
            raise StructInfoError(f"{what}: expected {param.dtype}, got {arg.dtype}")
        if param.value is not None and arg.value is not None:
            _match_dims((param.value,), (arg.value,), bind, what)
    elif isinstance(param, TupleStructInfo):
        if len(param.fields) != len(arg.fields):
            raise StructInfoError(
                f"{what}: expected a tuple of {len(param.fields)}, got {len(arg.fields)}"
            )
        for k, (p, a) in enumerate(zip(param.fields, arg.fields)):
            _match(p, a, bind, f"{what}[{k}]")


def check_match_cast(value: StructInfo | None, target: StructInfo, what: str = "match_cast"
                     ) -> None:
    """Reject a match_cast that can never succeed (different kind, dtype, rank or constant)."""
    if value is None:
        raise StructInfoError(f"{what}: the value has no struct_info")
    _match(target, value, {}, what)


def _fmt(e: Any) -> str:
    return format_prim(e)

