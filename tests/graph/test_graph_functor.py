"""ExprVisitor / ExprMutator / post_order_visit / free_vars."""

from dataclasses import dataclass

import pytest

from kiln import tir
from kiln.graph import (
    BlockBuilder,
    Call,
    DataflowVar,
    ExprMutator,
    ExprVisitor,
    Function,
    GlobalVar,
    If,
    Op,
    PrimStructInfo,
    SeqExpr,
    TensorStructInfo,
    Var,
    VarBinding,
    bound_vars,
    call_tir,
    free_vars,
    is_call_tir,
    post_order_visit,
)
from kiln.graph.shape_utils import tensor_sinfo
from kiln.ir import KilnError, assert_structural_equal, structural_equal
from kiln.op.registry import OpPattern, get_op_def, list_ops, register_op


def _not_lowerable(bb, call):
    raise KilnError(f"{call.op.name} is a test-only operator")


def _op(name, infer, inputs=("x",), attrs=None):
    if name not in list_ops():
        register_op(name, inputs=inputs, infer=infer, pattern=OpPattern.ELEMWISE, attrs=attrs,
                    legalize=_not_lowerable)
    return get_op_def(name)


@dataclass(frozen=True)
class CastAttrs:
    dtype: str


def _unary(call):
    return tensor_sinfo(call, 0)


def _binary(call):
    return tensor_sinfo(call, 0)


def _cast(call):
    return tensor_sinfo(call, 0).with_dtype(call.attrs.dtype)


RELU = _op("test_graph_fn.relu", _unary)
EXP = _op("test_graph_fn.exp", _unary)
MUL = _op("test_graph_fn.mul", _binary, ("lhs", "rhs"))
CAST = _op("test_graph_fn.cast", _cast, ("x",), CastAttrs)


def _t(*shape, dtype="float32"):
    return TensorStructInfo(shape, dtype)


def _chain(first=RELU, last=RELU, n=None):
    """main(x) = last(first(exp(x)) * first(exp(x)))."""
    x = Var("x", _t(n if n is not None else 4, 2))
    bb = BlockBuilder()
    with bb.function("main", [x]):
        with bb.dataflow():
            a = bb.emit(EXP(x))
            b = bb.emit(first(a))
            c = bb.emit(MUL(b, b))
            gv = bb.emit_output(last(c))
        bb.emit_func_output(gv)
    return bb.get()["main"]


class _CountCalls(ExprVisitor):
    def __init__(self):
        self.ops = []
        self.defs = []

    def visit_Call(self, c):
        self.ops.append(c.op.name)
        super().visit_Call(c)

    def visit_var_def(self, v):
        self.defs.append(v.name)


def test_visitor_sees_calls_and_definitions():
    f = _chain()
    v = _CountCalls()
    v.visit(f)
    names = [o.split(".")[1] for o in v.ops]
    assert names == ["exp", "relu", "mul", "relu"]
    assert v.defs == ["x", "lv", "lv1", "lv2", "gv"]


def test_post_order_visit_children_first_and_once():
    f = _chain()
    seen = []
    post_order_visit(f, lambda n: seen.append(type(n).__name__))
    assert seen[-1] == "Function"
    first_call = seen.index("Call")
    assert "Var" in seen[:first_call]  # the argument before the call
    assert seen.count("VarBinding") == 4


def test_free_and_bound_vars():
    f = _chain()
    assert free_vars(f) == []
    assert [v.name for v in bound_vars(f)] == ["x", "lv", "lv1", "lv2", "gv"]
    x = f.params[0]
    assert free_vars(f.body) == [x]


def test_identity_mutator_returns_the_same_function():
    f = _chain()
    assert ExprMutator().visit(f) is f


class _ReluToCast(ExprMutator):
    def visit_Call(self, c):
        c = super().visit_Call(c)
        if isinstance(c.op, Op) and c.op.name == "test_graph_fn.relu" and c.args[0].name == "lv":
            return CAST(c.args[0], "float16")
        return c


def test_mutator_rebuilds_only_what_changed_and_reinfers():
    f = _chain()
    g = _ReluToCast().visit(f)
    assert g is not f
    old, new = f.body.blocks[0].bindings, g.body.blocks[0].bindings
    assert new[0] is old[0]  # untouched binding kept as is
    assert new[1].var is not old[1].var and new[1].var.struct_info.dtype == "float16"
    assert isinstance(new[1].var, DataflowVar)
    # downstream uses were remapped and re-inferred
    assert new[2].value.args[0] is new[1].var
    assert new[2].var.struct_info.dtype == "float16"
    assert g.ret_struct_info.dtype == "float16"
    cast16 = _chain(first=lambda a: CAST(a, "float16"))
    assert_structural_equal(g, cast16)


def test_mutator_keeps_var_when_struct_info_unchanged():
    f = _chain()

    class _ReluToExp(ExprMutator):
        def visit_Call(self, c):
            c = super().visit_Call(c)
            if c.op.name == "test_graph_fn.relu":
                return EXP(*c.args)
            return c

    g = _ReluToExp().visit(f)
    old, new = f.body.blocks[0].bindings, g.body.blocks[0].bindings
    assert new[1].var is old[1].var and new[1].value is not old[1].value
    assert new[2] is old[2]
    assert g.ret_struct_info is f.ret_struct_info
    assert not structural_equal(f, g)
    assert_structural_equal(g, _chain(first=EXP, last=EXP))
    assert not structural_equal(g, _chain(first=EXP))


def test_mutator_symbolic_shapes_and_call_tir():
    n = tir.Var("n", "int64")
    f = _chain(n=n)

    class _ToCallTir(ExprMutator):
        def visit_Call(self, c):
            c = super().visit_Call(c)
            if c.op.name == "test_graph_fn.mul":
                return call_tir(GlobalVar("fused_mul"), list(c.args), c.struct_info)
            return c

    g = _ToCallTir().visit(f)
    b = g.body.blocks[0].bindings[2]
    assert is_call_tir(b.value) and b.var is f.body.blocks[0].bindings[2].var
    assert b.var.struct_info.shape[0] is n


def test_var_def_hook_renames_definitions():
    f = _chain()

    class _Rename(ExprMutator):
        def visit_var_def(self, v):
            return v.replace(name=v.name + "_r")

    g = _Rename().visit(f)
    assert [v.name for v in bound_vars(g)] == ["x_r", "lv_r", "lv1_r", "lv2_r", "gv_r"]
    assert g.body.body is g.body.blocks[0].bindings[-1].var
    assert g.body.blocks[0].bindings[0].value.args[0] is g.params[0]
    assert_structural_equal(f, g)


def test_mutator_on_if_branches():
    c = Var("c", PrimStructInfo("bool"))
    x = Var("x", _t(3))
    bb = BlockBuilder()
    with bb.function("main", [c, x]):
        r = bb.emit(If(c, RELU(x), EXP(x)))
        bb.emit_func_output(r)
    f = bb.get()["main"]

    class _ExpToCast(ExprMutator):
        def visit_Call(self, call):
            call = super().visit_Call(call)
            if call.op.name == "test_graph_fn.exp":
                return CAST(call.args[0], "int8")
            return call

    g = _ExpToCast().visit(f)
    value = g.body.blocks[0].bindings[0].value
    assert isinstance(value, If)
    assert value.true_branch is f.body.blocks[0].bindings[0].value.true_branch
    assert value.false_branch.struct_info.dtype == "int8"
    # branches disagree on dtype now: the join is Object
    assert type(g.ret_struct_info).__name__ == "ObjectStructInfo"


def test_mutator_on_unnormalized_function_body():
    x = Var("x", _t(3))
    # a body that is a bare nested call (not A-normal form): the mutator's builder normalizes it
    f = Function([x], SeqExpr([], x))
    nested = Function([x], RELU(EXP(x)))
    assert nested.ret_struct_info is None
    g = ExprMutator().visit(nested)
    assert g.ret_struct_info is not None and structural_equal(g.ret_struct_info, _t(3))
    assert isinstance(g.body, SeqExpr) and len(g.body.blocks[0].bindings) == 2
    assert isinstance(g.body.body, Var)
    assert ExprMutator().visit(f) is f


def test_visitor_errors_on_unknown_nodes():
    with pytest.raises(KilnError):
        ExprVisitor().visit(42)
    with pytest.raises(KilnError):
        ExprMutator().visit(VarBinding(Var("a", _t(1)), Var("b", _t(1))))
    assert isinstance(Call(Op("x"), ()), Call)


def test_mutator_can_share_a_pass_builder():
    f = _chain()
    bb = BlockBuilder()

    class _Outline(ExprMutator):
        def visit_Call(self, c):
            c = super().visit_Call(c)
            if c.op.name == "test_graph_fn.mul":
                gv = self.builder.add_func(Function([], SeqExpr([], c.args[0])), "kernel")
                return call_tir(gv, list(c.args), c.struct_info)
            return c

    m = _Outline(bb)
    assert m.builder is bb
    g = m.visit(f)
    assert "kernel" in bb.get()
    assert is_call_tir(g.body.blocks[0].bindings[2].value)
