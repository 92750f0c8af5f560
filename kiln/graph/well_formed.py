"""``well_formed(mod)``: the invariants every pass must keep, checked in one place.

Graph functions (``kiln.graph``):

- scoping: every variable is defined before it is used, in scope (a DataflowVar only inside its
  dataflow block, a variable bound in an ``If`` branch only in that branch), and no variable is
  defined twice anywhere in the module; DataflowVars are bound only in dataflow blocks and never
  as function parameters; symbolic shape variables come from the parameters or a ``match_cast``;
- StructInfo: every expression is normalized; every op call's StructInfo is what the op's
  inference gives today (so a pass that rewired arguments without re-inferring is caught); a
  bound variable's StructInfo describes its value; a function's return StructInfo describes its
  body;
- ``call_tir``: the callee is a PrimFunc of the module; arguments + outputs = its parameters;
  each argument/output agrees with its buffer in dtype, rank and shape (the callee's symbolic
  dims bound consistently). Messages name the binding, the callee, the buffer and both sides.

TIR PrimFuncs are checked lightly: buffers used are parameters or allocated (``alloc_buffers``,
``Allocate``) in an enclosing scope; variables are defined before use; loop, block-iteration and
let variables are each defined once.

This module sits in ``kiln.ir`` (the bottom layer) but checks graph and TIR IR, so those layers
are imported lazily inside the functions.
"""

from __future__ import annotations

from typing import Any

from .. import tir
from ..ir.errors import KilnError, WellFormedError
from ..ir.module import IRModule
from ..ir.node import Node, node_field_names
from ..runtime import control_flow
from ..tir import Var as TirVar
from ..tir.function import PrimFunc
from ..tir.functor import collect_vars, substitute
from . import expr as gx
from . import struct_info as si
from .block_builder import call_sinfo, infer_op_call
from .expr import DataflowBlock, DataflowVar, Function, MatchCast, SeqExpr, Var
from .functor import bound_vars
from .printer import format_shape
from .struct_info import PrimStructInfo, TensorStructInfo, TupleStructInfo, dims_equal

__all__ = ["well_formed"]


def well_formed(obj: Any, check: bool = True) -> list[str] | None:
    """Check an IRModule (or a lone graph Function / PrimFunc) for well-formedness.

    With ``check=True`` (default) raise :class:`WellFormedError` listing every problem and
    return None; with ``check=False`` return the list of problems (empty when well formed).
    A lone graph Function is checked without module context (callees are not looked up).
    """
    problems: list[str] = []
    if isinstance(obj, IRModule):
        defs: dict[Any, str] = {}
        for name, func in obj.items():
            if isinstance(func, Function):
                _GraphChecker(obj, name, problems, defs).check_function(func)
            elif isinstance(func, PrimFunc):
                _TirChecker(name, problems).check(func)
            else:
                problems.append(f"{name}: not a graph Function or PrimFunc "
                                f"({type(func).__name__})")
    elif isinstance(obj, Function):
        _GraphChecker(None, "<function>", problems, {}).check_function(obj)
    elif isinstance(obj, PrimFunc):
        _TirChecker("<prim_func>", problems).check(obj)
    else:
        raise WellFormedError(
            f"well_formed expects an IRModule, Function or PrimFunc, got {type(obj).__name__}"
        )
    if not check:
        return problems
    if problems:
        count = f"{len(problems)} problem{'s' if len(problems) > 1 else ''}"
        raise WellFormedError(f"IR is not well formed ({count}):\n  " + "\n  ".join(problems))
    return None


# ---------------------------------------------------------------------------------------------
# StructInfo comparison
# ---------------------------------------------------------------------------------------------
def _dims_same(a: Any, b: Any) -> bool:
    return dims_equal(a, b)


def _shape_text(shape: Any) -> str:
    return format_shape(shape)


def _sinfo_text(sinfo: Any) -> str:
    if isinstance(sinfo, TensorStructInfo):
        if sinfo.shape is None:
            rank = f"ndim={sinfo.ndim}" if sinfo.ndim >= 0 else "?"
            return f"Tensor({rank}, {sinfo.dtype})"
        return f"Tensor({_shape_text(sinfo.shape)}, {sinfo.dtype})"
    return str(sinfo)


def _covers(general: Any, specific: Any, exact: bool = False) -> bool:
    """True when every value described by ``specific`` is described by ``general`` (with
    ``exact``: they describe the same values)."""
    if isinstance(general, si.ObjectStructInfo):
        return not exact or isinstance(specific, si.ObjectStructInfo)
    if type(general) is not type(specific):
        return False
    if isinstance(general, si.TensorStructInfo):
        if general.dtype != specific.dtype:
            return False
        return _dims_cover(general.shape, general.ndim, specific.shape, specific.ndim, exact)
    if isinstance(general, si.ShapeStructInfo):
        return _dims_cover(general.values, general.ndim, specific.values, specific.ndim, exact)
    if isinstance(general, si.PrimStructInfo):
        if general.dtype != specific.dtype:
            return False
        if general.value is None:
            return not exact or specific.value is None
        return specific.value is not None and _dims_same(general.value, specific.value)
    if isinstance(general, si.TupleStructInfo):
        return len(general.fields) == len(specific.fields) and all(
            _covers(g, s, exact) for g, s in zip(general.fields, specific.fields)
        )
    if isinstance(general, si.SequenceStructInfo):
        if not _covers(general.elem, specific.elem, exact):
            return False
        if general.length is None:
            return not exact or specific.length is None
        return specific.length is not None and _dims_same(general.length, specific.length)
    if isinstance(general, si.OptionalStructInfo):
        return _covers(general.elem, specific.elem, exact)
    if isinstance(general, si.FuncStructInfo):
        if not _covers(general.ret, specific.ret, exact):
            return False
        if general.params is None or specific.params is None:
            return not exact or general.params is specific.params
        return len(general.params) == len(specific.params) and all(
            _covers(s, g, exact) for g, s in zip(general.params, specific.params)
        )
    return True


def _dims_cover(gdims: Any, gndim: int, sdims: Any, sndim: int, exact: bool) -> bool:
    if gndim >= 0 and gndim != sndim:
        return False
    if exact and gndim != sndim:
        return False
    if gdims is None:
        return not exact or sdims is None
    if sdims is None or len(gdims) != len(sdims):
        return False
    return all(_dims_same(a, b) for a, b in zip(gdims, sdims))


# ---------------------------------------------------------------------------------------------
# graph functions
# ---------------------------------------------------------------------------------------------
class _GraphChecker:
    """Walks one graph function keeping the set of visible variables."""

    def __init__(self, mod: IRModule | None, fname: str, problems: list[str],
                 defs: dict[Any, str]):
        self.mod = mod
        self.fname = fname
        self.problems = problems
        self.defs = defs  # every variable defined in the module so far -> where
        self.visible: set[Any] = set()
        self.closed_dataflow: set[Any] = set()  # DataflowVars whose block has ended
        self.sym: set[Any] = set()  # symbolic tir vars defined (params, match_cast)
        self.all_bound: set[Any] = set()
        self.where = fname

    def report(self, msg: str) -> None:
        self.problems.append(f"{self.where}: {msg}")

    # -- definitions and uses ----------------------------------------------------------------
    def define(self, var: Any, how: str) -> None:
        if not isinstance(var, Var):
            self.report(f"{how} must be a Var, got {type(var).__name__}")
            return
        place = f"{self.fname} ({how})"
        if var in self.defs:
            self.report(f"variable {var.name} is defined twice: as {self.defs[var]} and as {place}")
        else:
            self.defs[var] = place
        if var.struct_info is None:
            self.report(f"variable {var.name} has no struct_info")
        self.visible.add(var)

    def use(self, var: Any) -> None:
        if var in self.visible:
            return
        if isinstance(var, DataflowVar) and var in self.closed_dataflow:
            self.report(f"DataflowVar {var.name} is used outside its dataflow block")
        elif var in self.defs:
            self.report(f"variable {var.name} is used outside its scope "
                        f"(defined in {self.defs[var]})")
        elif var in self.all_bound:
            self.report(f"variable {var.name} is used before its definition")
        else:
            self.report(f"variable {var.name} is used but never defined")

    def define_sym(self, sinfo: Any) -> None:
        if sinfo is not None:
            self.sym.update(collect_vars(sinfo))

    def check_sym(self, node: Any, what: str) -> None:
        if node is None:
            return
        for v in collect_vars(node):
            if v not in self.sym:
                self.report(f"{what} uses symbolic variable {v.name} that no parameter or "
                            "match_cast defines")

    # -- functions, sequences, blocks --------------------------------------------------------
    def check_function(self, func: Any) -> None:
        outer = self.where
        self.where = f"{self.fname}: parameters"
        self.all_bound = set(bound_vars(func)) | self.all_bound
        for p in func.params:
            if isinstance(p, DataflowVar):
                self.report(f"parameter {p.name} is a DataflowVar")
            self.define(p, "a parameter")
            self.define_sym(p.struct_info)
        self.where = f"{self.fname}: function result"
        self.check_seq_or_expr(func.body)
        body_sinfo = func.body.struct_info
        ret = func.ret_struct_info
        if ret is None:
            self.report("function has no ret_struct_info")
        elif body_sinfo is not None and not _covers(ret, body_sinfo):
            self.report(f"the body's StructInfo {_sinfo_text(body_sinfo)} does not match the "
                        f"declared return StructInfo {_sinfo_text(ret)}")
        self.where = outer

    def check_seq_or_expr(self, e: Any) -> None:
        if isinstance(e, SeqExpr):
            self.check_seq(e)
        else:
            self.expr(e)

    def check_seq(self, seq: Any) -> None:
        """A SeqExpr's bindings are visible in it only (If branches, function bodies)."""
        before = set(self.visible)
        for block in seq.blocks:
            self.check_block(block)
        self.where = f"{self.fname}: result"
        self.expr(seq.body)
        if seq.struct_info is None:
            self.report("SeqExpr has no struct_info (not normalized)")
        self.visible = before

    def check_block(self, block: Any) -> None:
        dataflow = isinstance(block, DataflowBlock)
        local: list[Any] = []
        for b in block.bindings:
            var = b.var
            self.where = f"{self.fname}: binding {getattr(var, 'name', '?')}"
            if isinstance(var, DataflowVar) and not dataflow:
                self.report(f"DataflowVar {var.name} is bound outside a dataflow block")
            self.expr(b.value)
            value_sinfo = b.value.struct_info
            if isinstance(b, MatchCast):
                self.define_sym(b.struct_info)
                if var.struct_info is not None and not _covers(b.struct_info, var.struct_info,
                                                                exact=True):
                    self.report(f"match_cast variable has StructInfo {_sinfo_text(var.struct_info)}"
                                f" but casts to {_sinfo_text(b.struct_info)}")
            elif var.struct_info is not None and value_sinfo is not None:
                if not _covers(var.struct_info, value_sinfo):
                    self.report(f"variable has StructInfo {_sinfo_text(var.struct_info)} but its "
                                f"value has {_sinfo_text(value_sinfo)}")
            self.check_sym(var.struct_info, f"the StructInfo of {var.name}")
            self.define(var, "a binding")
            if isinstance(var, DataflowVar):
                local.append(var)
        for var in local:
            self.visible.discard(var)
            self.closed_dataflow.add(var)

    # -- expressions -------------------------------------------------------------------------
    def expr(self, e: Any) -> None:
        if isinstance(e, gx.Var):
            self.use(e)
            return
        if isinstance(e, gx.Constant | gx.StringImm | gx.Op | gx.ExternFunc):
            return
        if isinstance(e, gx.GlobalVar):
            if self.mod is not None and e.name not in self.mod:
                self.report(f"refers to {e.name!r}, which is not a function of the module")
            return
        if isinstance(e, gx.ShapeExpr):
            self.check_sym(e.values, "shape value")
            return
        if isinstance(e, gx.PrimValue):
            self.check_sym(e.value, "scalar value")
            return
        if isinstance(e, gx.Function):
            saved = (self.visible, self.where)
            self.visible = set(self.visible)  # a nested function sees (captures) outer vars
            self.check_function(e)
            self.visible, self.where = saved
            return
        if isinstance(e, gx.SeqExpr):
            self.check_seq(e)
            return
        if e.struct_info is None:
            self.report(f"{type(e).__name__} has no struct_info (not normalized)")
        if isinstance(e, gx.Tuple):
            for f in e.fields:
                self.expr(f)
        elif isinstance(e, gx.TupleGetItem):
            self.expr(e.tuple_value)
            self.check_tuple_get_item(e)
        elif isinstance(e, gx.If):
            self.expr(e.cond)
            where = self.where
            self.check_seq_or_expr(e.true_branch)
            self.where = where
            self.check_seq_or_expr(e.false_branch)
            self.where = where
        elif isinstance(e, gx.Call):
            if not isinstance(e.op, gx.Op | gx.GlobalVar | gx.ExternFunc):
                self.expr(e.op)
            for a in e.args:
                self.expr(a)
            self.check_call(e)
        else:
            self.report(f"unexpected expression {type(e).__name__}")

    def check_tuple_get_item(self, e: Any) -> None:
        ts = e.tuple_value.struct_info
        if ts is None:
            return
        if not isinstance(ts, TupleStructInfo):
            self.report(f"TupleGetItem [{e.index}] of a non-tuple ({_sinfo_text(ts)})")
        elif not 0 <= e.index < len(ts.fields):
            self.report(f"TupleGetItem index {e.index} out of range for a tuple of "
                        f"{len(ts.fields)}")
        elif e.struct_info is not None and not _covers(ts.fields[e.index], e.struct_info,
                                                       exact=True):
            self.report(f"TupleGetItem [{e.index}] has StructInfo {_sinfo_text(e.struct_info)} "
                        f"but the tuple field is {_sinfo_text(ts.fields[e.index])}")

    def check_call(self, call: Any) -> None:
        leaves = gx.GlobalVar | gx.Op | gx.ExternFunc  # no StructInfo of their own
        if any(a.struct_info is None and not isinstance(a, leaves) for a in call.args):
            return  # already reported
        op = call.op
        for s in call.sinfo_args:
            self.check_sym(s, "a call's sinfo_args")
        if isinstance(op, gx.Op):
            if op.name == "call_tir":
                self.check_call_tir(call)
            else:
                self.check_op_call(call)
        elif isinstance(op, gx.GlobalVar) and self.mod is not None and op.name in self.mod:
            callee = self.mod[op.name]
            if isinstance(callee, gx.Function) and not call.sinfo_args:
                self.check_graph_call(call, op.name, callee)
        elif isinstance(op, gx.ExternFunc) and op.symbol.startswith(control_flow.PREFIX):
            self.check_control_call(call)

    def check_control_call(self, call: Any) -> None:
        """A control-flow call (``kiln.runtime.control_flow``) names graph functions of the
        module: ``if`` two branches taking the same parameters, ``loop``/``scan`` one body."""
        kind = call.op.symbol[len(control_flow.PREFIX):]
        funcs = [a for a in call.args if isinstance(a, gx.GlobalVar)]
        want = 2 if kind == "if" else 1
        if kind not in control_flow.KINDS or len(funcs) != want:
            self.report(f"control-flow call {call.op.symbol} with {len(funcs)} function(s)")
            return
        if self.mod is None:
            return
        callees = []
        for f in funcs:
            callee = self.mod[f.name] if f.name in self.mod else None
            if not isinstance(callee, gx.Function):
                self.report(f"{call.op.symbol} runs {f.name}, which is not a graph function "
                            "of the module")
                return
            callees.append(callee)
        if kind == "if" and len(callees[0].params) != len(callees[1].params):
            self.report(f"{call.op.symbol}: the branches {funcs[0].name} and {funcs[1].name} "
                        "take different parameters")

    def check_op_call(self, call: Any) -> None:
        try:
            inferred = infer_op_call(call)
        except KilnError as err:
            self.report(f"call of {call.op.name} does not type-check: {err}")
            return
        if call.struct_info is not None and not _covers(inferred, call.struct_info, exact=True):
            self.report(f"call of {call.op.name} has StructInfo {_sinfo_text(call.struct_info)} "
                        f"but inference gives {_sinfo_text(inferred)}")

    def check_graph_call(self, call: Any, name: str, callee: Any) -> None:
        if callee.struct_info is None:
            return
        try:
            inferred = call_sinfo(name, callee.struct_info, call)
        except KilnError as err:
            self.report(str(err))
            return
        if call.struct_info is not None and not _covers(inferred, call.struct_info):
            self.report(f"call of {name} has StructInfo {_sinfo_text(call.struct_info)} but "
                        f"{name} returns {_sinfo_text(inferred)}")

    # -- call_tir ----------------------------------------------------------------------------
    def check_call_tir(self, call: Any) -> None:
        args = call.args
        if len(args) != 2 or not isinstance(args[0], gx.GlobalVar):
            self.report("call_tir must be call_tir(GlobalVar, Tuple of arguments)")
            return
        name = args[0].name
        if len(call.sinfo_args) != 1:
            self.report(f"call_tir {name}: needs exactly one output StructInfo, got "
                        f"{len(call.sinfo_args)}")
            return
        if self.mod is None:
            return
        if name not in self.mod:
            self.report(f"call_tir callee {name!r} is not a function of the module")
            return
        callee = self.mod[name]
        if not isinstance(callee, PrimFunc):
            self.report(f"call_tir callee {name!r} is a {type(callee).__name__}, not a PrimFunc")
            return
        packed = args[1]
        if isinstance(packed, gx.Tuple):
            inputs = [f.struct_info for f in packed.fields]
        elif isinstance(packed.struct_info, TupleStructInfo):
            inputs = list(packed.struct_info.fields)
        else:
            self.report(f"call_tir {name}: arguments must be a tuple")
            return
        out = call.sinfo_args[0]
        outputs = list(out.fields) if isinstance(out, TupleStructInfo) else [out]
        for j, o in enumerate(outputs):
            if not isinstance(o, TensorStructInfo):
                self.report(f"call_tir {name}: output {j} must be a tensor, got {_sinfo_text(o)}")
                return
        params = callee.params
        if len(inputs) + len(outputs) != len(params):
            names = ", ".join(_param_label(callee, p) for p in params)
            self.report(
                f"call_tir {name}: passes {len(inputs)} argument(s) and {len(outputs)} output(s) "
                f"but PrimFunc {name} has {len(params)} parameter(s) ({names})"
            )
            return
        declared = callee.attrs.get("num_outputs")
        if isinstance(declared, int) and declared != len(outputs):
            self.report(f"call_tir {name}: declares {len(outputs)} output(s) but PrimFunc {name} "
                        f"has num_outputs={declared}")
        pairs = [(f"argument {i}", s, p) for i, (s, p) in enumerate(zip(inputs, params))]
        # the graph variables passed, so that a dtype mismatch names both sides
        arg_vars = {f"argument {i}": f.name for i, f in enumerate(packed.fields)
                    if isinstance(f, gx.Var)} if isinstance(packed, gx.Tuple) else {}
        pairs += [(f"output {j}", s, p)
                  for j, (s, p) in enumerate(zip(outputs, params[len(inputs):]))]
        self.match_params(name, callee, pairs, arg_vars)

    def match_params(self, name: str, callee: Any, pairs: list[tuple[str, Any, Any]],
                     arg_vars: dict[str, str] | None = None) -> None:
        """Compare each argument/output with its parameter; callee symbolic dims are bound on
        first appearance and must agree everywhere else."""
        bind: dict[Any, Any] = {}
        shaped: list[tuple[str, Any, Any]] = []
        for label, sinfo, param in pairs:
            buf = callee.buffer_map.get(param)
            if buf is None:  # a scalar parameter
                if not isinstance(sinfo, PrimStructInfo):
                    self.report(f"call_tir {name}: {label} is {_sinfo_text(sinfo)} but parameter "
                                f"{param.name} of {name} is a scalar {param.dtype}")
                elif sinfo.dtype != param.dtype:
                    self.report(f"call_tir {name}: {label} has dtype {sinfo.dtype} but scalar "
                                f"parameter {param.name} of {name} has dtype {param.dtype}")
                elif sinfo.value is not None:
                    bind[param] = sinfo.value
                continue
            if not isinstance(sinfo, TensorStructInfo):
                self.report(f"call_tir {name}: {label} is {_sinfo_text(sinfo)} but buffer "
                            f"{buf.name!r} of {name} expects a tensor")
                continue
            if sinfo.dtype != buf.dtype:
                var = (arg_vars or {}).get(label)
                self.report(f"call_tir {name}: {label} has dtype {sinfo.dtype} but buffer "
                            f"{buf.name!r} of {name} has dtype {buf.dtype}"
                            + (f" ({label} is {var})" if var else ""))
            ndim = len(sinfo.shape) if sinfo.shape is not None else sinfo.ndim
            if ndim >= 0 and ndim != len(buf.shape):
                self.report(f"call_tir {name}: {label} is {ndim}-d {_sinfo_text(sinfo)} but "
                            f"buffer {buf.name!r} of {name} is {len(buf.shape)}-d "
                            f"{_shape_text(buf.shape)}")
                continue
            if sinfo.shape is None:
                continue
            for bd, ad in zip(buf.shape, sinfo.shape):
                if isinstance(bd, TirVar) and bd not in bind:
                    bind[bd] = ad
            shaped.append((label, sinfo, buf))
        for label, sinfo, buf in shaped:
            want = tuple(substitute(d, bind) for d in buf.shape)
            if not all(_dims_same(w, a) for w, a in zip(want, sinfo.shape)):
                shown = _shape_text(buf.shape)
                bound = _shape_text(want)
                if bound != shown:
                    shown = f"{shown} = {bound}"
                self.report(f"call_tir {name}: {label} has shape {_shape_text(sinfo.shape)} but "
                            f"buffer {buf.name!r} of {name} has shape {shown}")


def _param_label(func: Any, param: Any) -> str:
    buf = func.buffer_map.get(param)
    if buf is None:
        return f"{param.name}: {param.dtype}"
    return f"{buf.name}: {_shape_text(buf.shape)} {buf.dtype}"


# ---------------------------------------------------------------------------------------------
# TIR PrimFuncs (light)
# ---------------------------------------------------------------------------------------------
class _TirChecker:
    """Scopes of TIR variables and buffers in one PrimFunc."""

    def __init__(self, fname: str, problems: list[str]):
        self.fname = fname
        self.problems = problems
        self.vars: set[Any] = set()  # in scope
        self.defined: set[Any] = set()  # ever bound by a loop / block / let
        self.buffers: set[Any] = set()  # in scope
        self.data_vars: set[Any] = set()  # data pointers of buffers in scope
        self.reported: set[tuple[str, int]] = set()

    def report(self, msg: str, key: Any = None) -> None:
        k = (msg, 0) if key is None else (type(key).__name__, id(key))
        if k in self.reported:
            return
        self.reported.add(k)
        self.problems.append(f"{self.fname}: {msg}")

    def check(self, func: Any) -> None:
        seen: set[Any] = set()
        for p in func.params:
            if p in seen:
                self.report(f"parameter {p.name} appears twice")
            seen.add(p)
            buf = func.buffer_map.get(p)
            if buf is None:
                self.vars.add(p)
            else:
                self.add_buffer(buf)
        for key in func.buffer_map:
            if key not in seen:
                self.report(f"buffer_map has an entry for {key.name}, which is not a parameter")
        # symbolic dimensions are defined by the parameter buffers' shapes (bound at entry)
        for buf in func.buffers:
            self.vars.update(collect_vars((buf.shape, buf.strides, buf.elem_offset)))
        self.stmt(func.body)

    def add_buffer(self, buf: Any) -> None:
        self.buffers.add(buf)
        if buf.data is not None:
            self.data_vars.add(buf.data)

    def bind(self, var: Any, what: str) -> None:
        if var in self.defined:
            self.report(f"{what} {var.name} is defined more than once", key=var)
        self.defined.add(var)
        self.vars.add(var)

    def use_buffer(self, buf: Any, how: str) -> None:
        if buf in self.buffers or buf.data in self.data_vars:
            return
        self.report(f"{how} buffer {buf.name!r}, which is neither a parameter nor allocated "
                    "in an enclosing block or Allocate", key=buf)

    # -- statements --------------------------------------------------------------------------
    def stmt(self, s: Any) -> None:
        if s is None:
            return
        if isinstance(s, tir.For):
            self.expr(s.min)
            self.expr(s.extent)
            self.scoped(lambda: (self.bind(s.loop_var, "loop variable"), self.stmt(s.body)))
        elif isinstance(s, tir.LetStmt):
            self.expr(s.value)
            self.scoped(lambda: (self.bind(s.var, "let variable"), self.stmt(s.body)))
        elif isinstance(s, tir.BlockRealize):
            for v in s.iter_values:
                self.expr(v)
            self.expr(s.predicate)
            if len(s.iter_values) != len(s.block.iter_vars):
                self.report(f"block {s.block.name_hint!r} has {len(s.block.iter_vars)} iter vars "
                            f"but is realized with {len(s.iter_values)} values")
            self.stmt(s.block)
        elif isinstance(s, tir.Block):
            self.scoped(lambda: self.block(s))
        elif isinstance(s, tir.Allocate):
            self.scoped(lambda: (self.add_buffer(s.buffer), self.stmt(s.body)))
        elif isinstance(s, tir.BufferStore):
            self.use_buffer(s.buffer, "stores to")
            self.expr(s.value)
            for i in s.indices:
                self.expr(i)
        elif isinstance(s, tir.SeqStmt):
            for x in s.seq:
                self.stmt(x)
        elif isinstance(s, tir.IfThenElse):
            self.expr(s.condition)
            self.stmt(s.then_case)
            self.stmt(s.else_case)
        elif isinstance(s, tir.AssertStmt):
            self.expr(s.condition)
            self.stmt(s.body)
        elif isinstance(s, tir.Evaluate):
            self.expr(s.value)
        else:
            self.report(f"unexpected statement {type(s).__name__}")

    def block(self, b: Any) -> None:
        for iv in b.iter_vars:
            self.expr(iv.dom.min)
            self.expr(iv.dom.extent)
        for iv in b.iter_vars:
            self.bind(iv.var, f"iteration variable (block {b.name_hint!r})")
        for buf in b.alloc_buffers:
            self.add_buffer(buf)
        for region in (*b.reads, *b.writes):
            self.use_buffer(region.buffer, f"block {b.name_hint!r} accesses")
            for r in region.region:
                self.expr(r.min)
                self.expr(r.extent)
        self.stmt(b.init)
        self.stmt(b.body)

    def scoped(self, fn: Any) -> None:
        saved = (set(self.vars), set(self.buffers), set(self.data_vars))
        fn()
        self.vars, self.buffers, self.data_vars = saved

    # -- expressions -------------------------------------------------------------------------
    def expr(self, e: Any) -> None:
        if e is None or not isinstance(e, Node):
            return
        if isinstance(e, tir.Var):
            if e not in self.vars and e not in self.data_vars:
                self.report(f"variable {e.name} is used out of scope or never defined", key=e)
            return
        if isinstance(e, tir.BufferLoad):
            self.use_buffer(e.buffer, "loads from")
            for i in e.indices:
                self.expr(i)
            return
        if isinstance(e, tir.Let):
            self.expr(e.value)
            self.scoped(lambda: (self.bind(e.var, "let variable"), self.expr(e.body)))
            return
        if isinstance(e, tir.Reduce):
            def inner() -> None:
                for iv in e.axis:
                    self.vars.add(iv.var)
                self.expr(e.source)
                self.expr(e.condition)
            self.scoped(inner)
            return
        if isinstance(e, tir.CommReducer):
            return  # closed over its own lhs/rhs variables
        for name in node_field_names(e):
            child = getattr(e, name)
            if isinstance(child, tuple | list):
                for c in child:
                    self.expr(c)
            else:
                self.expr(child)
