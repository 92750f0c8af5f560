"""kiln.graph.well_formed: scoping, StructInfo consistency, call_tir/callee agreement, light TIR."""

import numpy as np
import pytest

from kiln import graph as g
from kiln import op, te, tir
from kiln.graph import well_formed
from kiln.ir import IRModule, WellFormedError
from kiln.testing import models
from kiln.transform import LegalizeOps

F32 = "float32"


def _t(shape, dtype=F32):
    return g.TensorStructInfo(shape, dtype)


def _norm(expr):
    return g.BlockBuilder().normalize(expr)


def _func(params, blocks, body):
    return g.Function(tuple(params), g.SeqExpr(tuple(blocks), body))


def _problems(mod):
    return well_formed(mod, check=False)


def _one_problem(mod, *fragments):
    """Exactly one problem is reported, containing every fragment; check=True raises it."""
    problems = _problems(mod)
    assert len(problems) == 1, problems
    for f in fragments:
        assert f in problems[0], (f, problems[0])
    with pytest.raises(WellFormedError, match="not well formed"):
        well_formed(mod)
    return problems[0]


def _double_prim(shape=(4, 8), dtype=F32, out_dtype=None):
    """A PrimFunc B = A * 2 over buffers A (input) and B (output)."""
    a = te.placeholder(shape, dtype, name="A")
    b = te.compute(shape, lambda *i: (a(*i) * 2).astype(out_dtype or dtype), name="B")
    return te.create_prim_func([a, b])


def _call_tir_module(args_sinfo, out_sinfo, prim=None, n_args=None):
    """main(x...) = call_tir(double, args, out_sinfo), built without any agreement check."""
    bb = g.BlockBuilder()
    gv_prim = bb.add_func(prim if prim is not None else _double_prim(), "double")
    params = [g.Var(f"x{i}", s) for i, s in enumerate(args_sinfo)]
    with bb.function("main", params):
        with bb.dataflow():
            args = params if n_args is None else params[:n_args]
            out = bb.emit_output(g.call_tir(gv_prim, args, out_sinfo), "y")
        bb.emit_func_output(out)
    return bb.get()


# ---------------------------------------------------------------------------------------------
# well-formed modules
# ---------------------------------------------------------------------------------------------
@pytest.mark.parametrize("make", [
    lambda: models.mlp(batch=2, sizes=(8, 16, 4)),
    lambda: models.small_cnn(batch=1, channels=4, size=8),
])
def test_reference_models_are_well_formed_before_and_after_legalize(make):
    mod = make().mod
    assert well_formed(mod) is None
    assert _problems(mod) == []
    legal = LegalizeOps()(mod)
    assert any(isinstance(f, tir.PrimFunc) for f in legal.functions.values())
    assert _problems(legal) == []


def test_symbolic_shapes_are_well_formed_after_legalize():
    n = tir.Var("n", "int64")
    bb = g.BlockBuilder()
    x = g.Var("x", _t((n, 8)))
    w = g.Var("w", _t((8, 8)))
    with bb.function("main", [x, w]):
        with bb.dataflow():
            h = bb.emit(op.matmul(x, w))
            h = bb.emit(op.add(h, x))
            out = bb.emit_output(op.sum(h, axis=[1]))
        bb.emit_func_output(out)
    mod = bb.get()
    assert _problems(mod) == []
    assert _problems(LegalizeOps()(mod)) == []


def test_match_cast_defines_symbolic_vars_and_if_branches_scope():
    m = tir.Var("m", "int64")
    bb = g.BlockBuilder()
    x = g.Var("x", g.TensorStructInfo(None, F32, ndim=1))
    c = g.Var("c", g.PrimStructInfo("bool"))
    with bb.function("main", [x, c]):
        y = bb.match_cast(x, _t((m,)), "y")
        t = g.SeqExpr((), bb.normalize(op.relu(y)))
        branch = bb.emit(g.If(c, t, g.SeqExpr((), y)), "z")
        bb.emit(g.ShapeExpr((m, 2)), "shape")  # m is defined by the match_cast
        bb.emit_func_output(branch)
    assert _problems(bb.get()) == []


# ---------------------------------------------------------------------------------------------
# scoping
# ---------------------------------------------------------------------------------------------
def test_use_before_definition():
    x = g.Var("x", _t((4,)))
    a = g.DataflowVar("a", _t((4,)))
    b = g.DataflowVar("b", _t((4,)))
    out = g.Var("out", _t((4,)))
    block = g.DataflowBlock((
        g.VarBinding(b, _norm(op.relu(a))),  # uses a before it is bound
        g.VarBinding(a, _norm(op.relu(x))),
        g.VarBinding(out, _norm(op.relu(b))),
    ))
    mod = IRModule({"main": _func([x], [block], out)})
    _one_problem(mod, "main: binding b", "variable a is used before its definition")


def test_undefined_variable():
    x = g.Var("x", _t((4,)))
    stray = g.Var("stray", _t((4,)))
    out = g.Var("out", _t((4,)))
    block = g.BindingBlock((g.VarBinding(out, _norm(op.add(x, stray))),))
    _one_problem(IRModule({"main": _func([x], [block], out)}),
                 "binding out", "variable stray is used but never defined")


def test_variable_defined_twice():
    x = g.Var("x", _t((4,)))
    a = g.Var("a", _t((4,)))
    block = g.BindingBlock((
        g.VarBinding(a, _norm(op.relu(x))),
        g.VarBinding(a, _norm(op.exp(x))),
    ))
    _one_problem(IRModule({"main": _func([x], [block], a)}), "variable a is defined twice")


def test_variable_defined_in_two_functions():
    x = g.Var("x", _t((4,)))
    a = g.Var("a", _t((4,)))
    f = _func([x], [g.BindingBlock((g.VarBinding(a, _norm(op.relu(x))),))], a)
    problems = _problems(IRModule({"main": f, "copy": f}))
    assert any("variable x is defined twice" in p and "copy" in p for p in problems), problems


def test_dataflow_var_escaping_its_block():
    x = g.Var("x", _t((4,)))
    lv = g.DataflowVar("lv", _t((4,)))
    block = g.DataflowBlock((g.VarBinding(lv, _norm(op.relu(x))),))
    _one_problem(IRModule({"main": _func([x], [block], lv)}),
                 "main: result", "DataflowVar lv is used outside its dataflow block")


def test_dataflow_var_outside_dataflow_block_and_as_parameter():
    x = g.DataflowVar("x", _t((4,)))
    lv = g.DataflowVar("lv", _t((4,)))
    out = g.Var("out", _t((4,)))
    block = g.BindingBlock((g.VarBinding(lv, _norm(op.relu(x))),
                            g.VarBinding(out, _norm(op.relu(lv)))))
    problems = _problems(IRModule({"main": _func([x], [block], out)}))
    assert any("parameter x is a DataflowVar" in p for p in problems), problems
    assert any("DataflowVar lv is bound outside a dataflow block" in p for p in problems)


def test_if_branch_bindings_do_not_leak():
    x = g.Var("x", _t((4,)))
    c = g.Var("c", g.PrimStructInfo("bool"))
    inner = g.Var("inner", _t((4,)))
    branch = g.SeqExpr((g.BindingBlock((g.VarBinding(inner, _norm(op.relu(x))),)),), inner)
    z = g.Var("z", _t((4,)))
    leak = g.Var("leak", _t((4,)))
    block = g.BindingBlock((
        g.VarBinding(z, _norm(g.If(c, branch, g.SeqExpr((), x)))),
        g.VarBinding(leak, _norm(op.add(z, inner))),
    ))
    _one_problem(IRModule({"main": _func([x, c], [block], leak)}),
                 "binding leak", "variable inner is used outside its scope")


def test_undefined_symbolic_variable():
    n = tir.Var("n", "int64")
    x = g.Var("x", _t((4,)))
    y = g.Var("y", _t((n,)))  # n is defined by no parameter or match_cast
    block = g.BindingBlock((g.VarBinding(y, g.Call(g.ExternFunc("f"), (x,), None, (_t((n,)),),
                                                   struct_info=_t((n,)))),))
    problems = _problems(IRModule({"main": _func([x], [block], y)}))
    assert any("symbolic variable n" in p and "binding y" in p for p in problems), problems


# ---------------------------------------------------------------------------------------------
# StructInfo consistency
# ---------------------------------------------------------------------------------------------
def test_stale_op_struct_info_is_caught_by_reinference():
    x = g.Var("x", _t((4, 8)))
    stale = g.Call(g.Op("relu"), (x,), None, (), struct_info=_t((4, 8), "float16"))
    out = g.Var("out", _t((4, 8), "float16"))
    block = g.BindingBlock((g.VarBinding(out, stale),))
    _one_problem(IRModule({"main": _func([x], [block], out)}), "binding out", "call of relu",
                 "float16", "inference gives Tensor((4, 8), float32)")


def test_op_call_that_no_longer_type_checks():
    x = g.Var("x", _t((4, 8)))
    y = g.Var("y", _t((3, 5)))
    bad = g.Call(g.Op("add"), (x, y), op.add(x, x).attrs, (), struct_info=_t((4, 8)))
    out = g.Var("out", _t((4, 8)))
    block = g.BindingBlock((g.VarBinding(out, bad),))
    _one_problem(IRModule({"main": _func([x, y], [block], out)}),
                 "call of add does not type-check")


def test_binding_var_struct_info_must_describe_its_value():
    x = g.Var("x", _t((4, 8)))
    out = g.Var("out", _t((4, 9)))
    block = g.BindingBlock((g.VarBinding(out, _norm(op.relu(x))),))
    _one_problem(IRModule({"main": _func([x], [block], out)}),
                 "binding out", "Tensor((4, 9), float32)", "Tensor((4, 8), float32)")
    # a less specific variable is fine
    loose = g.Var("loose", g.TensorStructInfo(None, F32, ndim=2))
    block = g.BindingBlock((g.VarBinding(loose, _norm(op.relu(x))),))
    assert _problems(IRModule({"main": _func([x], [block], loose)})) == []


def test_return_struct_info_must_describe_the_body():
    x = g.Var("x", _t((4,)))
    f = g.Function((x,), g.SeqExpr((), x), _t((4,), "int32"))
    _one_problem(IRModule({"main": f}), "does not match the declared return StructInfo")


# ---------------------------------------------------------------------------------------------
# call_tir against its callee
# ---------------------------------------------------------------------------------------------
def test_call_tir_that_agrees_is_well_formed():
    assert _problems(_call_tir_module([_t((4, 8))], _t((4, 8)))) == []


def test_call_tir_wrong_number_of_arguments():
    mod = _call_tir_module([_t((4, 8)), _t((4, 8))], _t((4, 8)))
    _one_problem(mod, "binding y", "call_tir double", "passes 2 argument(s) and 1 output(s)",
                 "PrimFunc double has 2 parameter(s) (A: (4, 8) float32, B: (4, 8) float32)")


def test_call_tir_wrong_input_shape():
    mod = _call_tir_module([_t((4, 9))], _t((4, 8)))
    _one_problem(mod, "binding y", "call_tir double", "argument 0 has shape (4, 9)",
                 "buffer 'A' of double has shape (4, 8)")


def test_call_tir_wrong_input_rank_and_dtype():
    problems = _problems(_call_tir_module([_t((32,), "int32")], _t((4, 8))))
    assert any("argument 0 has dtype int32 but buffer 'A' of double has dtype float32" in p
               for p in problems), problems
    assert any("argument 0 is 1-d" in p and "2-d" in p for p in problems), problems


def test_call_tir_wrong_output_dtype_names_binding_callee_and_both_dtypes():
    mod = _call_tir_module([_t((4, 8))], _t((4, 8), "float16"))
    msg = _one_problem(mod, "main: binding y", "call_tir double",
                       "output 0 has dtype float16", "buffer 'B' of double has dtype float32")
    with pytest.raises(WellFormedError, match="binding y.*double.*float16.*float32"):
        well_formed(mod)
    assert msg.startswith("main: binding y:")


def test_call_tir_output_shape_mismatch():
    _one_problem(_call_tir_module([_t((4, 8))], _t((8, 4))), "output 0 has shape (8, 4)",
                 "buffer 'B' of double has shape (4, 8)")


def test_call_tir_unknown_callee_and_non_prim_callee():
    bb = g.BlockBuilder()
    x = g.Var("x", _t((4, 8)))
    with bb.function("main", [x]):
        y = bb.emit(g.call_tir(g.GlobalVar("nowhere"), [x], _t((4, 8))), "y")
        z = bb.emit(g.call_tir(g.GlobalVar("main"), [y], _t((4, 8))), "z")
        bb.emit_func_output(z)
    problems = _problems(bb.get())
    assert any("binding y" in p and "call_tir callee 'nowhere' is not a function of the module"
               in p for p in problems), problems
    assert any("binding z" in p and "'main' is a Function, not a PrimFunc" in p
               for p in problems), problems


def test_call_tir_symbolic_dims_are_bound_consistently():
    n, m = tir.Var("n", "int64"), tir.Var("m", "int64")
    # a PrimFunc over square matrices: both dims of A are the same variable k
    k = tir.Var("k", "int64")
    prim = _double_prim(shape=(k, k))
    good = _call_tir_module([_t((n, n))], _t((n, n)), prim=prim)
    assert _problems(good) == []
    static = _call_tir_module([_t((3, 3))], _t((3, 3)), prim=prim)
    assert _problems(static) == []
    bad = _call_tir_module([_t((n, m))], _t((n, m)), prim=prim)
    problems = _problems(bad)
    assert any("argument 0 has shape (n, m)" in p and "(k, k) = (n, n)" in p
               for p in problems), problems
    out_bad = _call_tir_module([_t((3, 3))], _t((3, 4)), prim=prim)
    _one_problem(out_bad, "output 0 has shape (3, 4)", "(k, k) = (3, 3)")


def test_call_tir_num_outputs_attr_is_checked():
    prim = _double_prim().with_attr("num_outputs", 2)
    _one_problem(_call_tir_module([_t((4, 8))], _t((4, 8)), prim=prim), "num_outputs=2")


def test_legalized_module_broken_by_hand_is_caught():
    """Change the output dtype of one legalized call_tir, as a buggy mixed-precision pass would."""
    mod = LegalizeOps()(models.mlp(batch=2, sizes=(8, 16, 4)).mod)

    class Retype(g.ExprMutator):
        def visit_Call(self, call):
            call = super().visit_Call(call)
            if g.is_call_tir(call) and call.args[0].name == "relu":
                return g.call_tir(call.args[0], call.args[1], _t((2, 16), "float16"))
            return call

    broken = mod.with_function("main", Retype(mod).visit(mod["main"]))
    problems = _problems(broken)
    assert any("call_tir relu: output 0 has dtype float16 but buffer" in p
               and "of relu has dtype float32" in p for p in problems), problems


# ---------------------------------------------------------------------------------------------
# TIR (light checks)
# ---------------------------------------------------------------------------------------------
def _loop(var, extent, body):
    return tir.For(var, 0, extent, tir.ForKind.SERIAL, body)


def _prim(params, body):
    handles = [tir.Var(b.name, "handle") for b in params]
    return tir.PrimFunc(tuple(handles), dict(zip(handles, params)), body)


def test_tir_buffer_not_a_parameter_nor_allocated():
    a = tir.decl_buffer((8,), F32, "A")
    b = tir.decl_buffer((8,), F32, "B")
    stray = tir.decl_buffer((8,), F32, "stray")
    i = tir.Var("i", "int64")
    body = _loop(i, 8, tir.BufferStore(b, tir.BufferLoad(stray, (i,)) + a[i], (i,)))
    _one_problem(IRModule({"f": _prim([a, b], body)}), "f: loads from buffer 'stray'")
    allocated = tir.Allocate(stray, body)
    assert _problems(IRModule({"f": _prim([a, b], allocated)})) == []


def test_tir_loop_var_defined_twice_and_out_of_scope():
    a = tir.decl_buffer((8,), F32, "A")
    i = tir.Var("i", "int64")
    store = tir.BufferStore(a, tir.const(F32, 0), (i,))
    twice = tir.seq(_loop(i, 8, store), _loop(i, 8, store))
    _one_problem(IRModule({"f": _prim([a], twice)}), "loop variable i is defined more than once")
    outside = tir.seq(_loop(i, 8, store), store)
    _one_problem(IRModule({"f": _prim([a], outside)}), "variable i is used out of scope")


@pytest.mark.parametrize("make", [
    lambda x: op.relu(x),
    lambda x: op.nn.softmax(x),
    lambda x: op.sum(x, axis=[1]),
    lambda x: op.dense(x, g.const(np.ones((3, 8), "float32"))),
    lambda x: op.nn.max_pool2d(op.reshape(x, (1, 2, 4, 4)), pool_size=(2, 2)),
])
def test_legalized_prim_funcs_pass_the_tir_checks(make):
    x = g.Var("x", _t((4, 8)))
    bb = g.BlockBuilder()
    with bb.function("main", [x]):
        out = bb.emit(make(x))
        bb.emit_func_output(out)
    legal = LegalizeOps()(bb.get())
    assert _problems(legal) == []


def test_well_formed_rejects_other_objects():
    with pytest.raises(WellFormedError, match="expects an IRModule"):
        well_formed(42)
