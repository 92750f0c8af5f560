"""The graph printer: TVMScript-like text, deterministic names, attrs, constants, call_tir."""

from dataclasses import dataclass

import numpy as np

from kiln import tir
from kiln.graph import (
    BlockBuilder,
    Call,
    ExternFunc,
    GlobalVar,
    If,
    PrimStructInfo,
    PrimValue,
    SeqExpr,
    ShapeExpr,
    StringImm,
    TensorStructInfo,
    Tuple,
    TupleGetItem,
    Var,
    VarBinding,
    call_tir,
    const,
)
from kiln.graph.printer import format_prim
from kiln.graph.shape_utils import tensor_sinfo
from kiln.ir import IRModule, KilnError
from kiln.op.registry import OpPattern, get_op_def, list_ops, register_op


def _not_lowerable(bb, call):
    raise KilnError(f"{call.op.name} is a test-only operator")


@dataclass(frozen=True)
class ScaleAttrs:
    factor: float = 1.0
    axes: tuple = ()
    mode: str = "linear"


def _op(name, infer, inputs, attrs=None):
    if name not in list_ops():
        register_op(name, inputs=inputs, infer=infer, pattern=OpPattern.ELEMWISE, attrs=attrs,
                    legalize=_not_lowerable)
    return get_op_def(name)


def _first(call):
    return tensor_sinfo(call, 0)


def _matmul(call):
    a, b = tensor_sinfo(call, 0), tensor_sinfo(call, 1)
    return TensorStructInfo((a.shape[0], b.shape[1]), a.dtype)


RELU = _op("nn.test_graph_pr_relu", _first, ("x",))
MATMUL = _op("test_graph_pr.matmul", _matmul, ("a", "b"))
SCALE = _op("test_graph_pr.scale", _first, ("x",), ScaleAttrs)


def _t(*shape, dtype="float32"):
    return TensorStructInfo(shape, dtype)


def test_function_text():
    x = Var("x", _t(5, 64))
    bb = BlockBuilder()
    with bb.function("main", [x]):
        with bb.dataflow():
            lv = bb.emit(MATMUL(x, const(np.zeros((64, 10), np.float32))))
            gv = bb.emit_output(RELU(lv))
        bb.emit_func_output(gv)
    text = bb.get().script()
    assert text == "\n".join([
        'def main(x: Tensor((5, 64), "float32")) -> Tensor((5, 10), "float32"):',
        '    # meta[Constant][0]: Tensor((64, 10), "float32")',
        "    with dataflow():",
        '        lv: Tensor((5, 10), "float32") = test_graph_pr.matmul(x, meta[Constant][0])',
        '        gv: Tensor((5, 10), "float32") = nn.test_graph_pr_relu(lv)',
        "        output(gv)",
        "    return gv",
    ])
    assert str(bb.get()["main"]).startswith("def func(x:")


def test_attrs_call_tir_symbolic_and_scalars():
    n = tir.Var("n", "int64")
    x = Var("x", _t(n, 4))
    bb = BlockBuilder()
    with bb.function("main", [x], attrs={"num_inputs": 1}):
        a = bb.emit(SCALE(x, 0.5, (0, -1), "nearest"))
        b = bb.emit(call_tir(GlobalVar("fused_add"), [a, const(2.0)], _t(n, 4)))
        c = bb.emit(call_tir(GlobalVar("split"), [b], [_t(n, 2), _t(n, 2)]))
        bb.emit_func_output(TupleGetItem(c, 1))
    lines = bb.get().script().splitlines()
    assert lines == [
        'def main(x: Tensor((n, 4), "float32")) -> Tensor((n, 2), "float32"):',
        '    func_attr({"num_inputs": 1})',
        '    gv: Tensor((n, 4), "float32") = test_graph_pr.scale(x, factor=0.5, axes=(0, -1), '
        'mode="nearest")',
        '    gv1: Tensor((n, 4), "float32") = call_tir(fused_add, (gv, const(2.0, "float32")), '
        'out_sinfo=Tensor((n, 4), "float32"))',
        '    gv2: Tuple(Tensor((n, 2), "float32"), Tensor((n, 2), "float32")) = call_tir(split, '
        '(gv1,), out_sinfo=Tuple(Tensor((n, 2), "float32"), Tensor((n, 2), "float32")))',
        '    gv3: Tensor((n, 2), "float32") = gv2[1]',
        "    return gv3",
    ]


def test_names_are_made_unique_and_identifiers():
    n1, n2 = tir.Var("n", "int64"), tir.Var("n", "int64")
    a, b = Var("input.1", _t(n1)), Var("input.1", _t(n2))
    bb = BlockBuilder()
    with bb.function("main", [a, b]):
        bb.emit_func_output(Tuple([a, b]))
    head = bb.get().script().splitlines()[0]
    assert head.startswith(
        'def main(input_1: Tensor((n,), "float32"), input_1_1: Tensor((n_1,), "float32"))'
    )
    # printing twice gives the same text
    assert bb.get().script() == bb.get().script()


def test_if_match_cast_and_other_exprs():
    c = Var("c", PrimStructInfo("bool"))
    x = Var("x", TensorStructInfo(None, "float32", 1))
    k = tir.Var("k", "int64")
    bb = BlockBuilder()
    with bb.function("f", [c, x]):
        y = bb.match_cast(x, _t(k))
        r = bb.emit(If(c, RELU(y), y), "r")
        bb.emit_func_output(r)
    assert bb.get().script().splitlines()[1:] == [
        '    gv: Tensor((k,), "float32") = match_cast(x, Tensor((k,), "float32"))',
        "    if c:",
        '        gv1: Tensor((k,), "float32") = nn.test_graph_pr_relu(gv)',
        '        r: Tensor((k,), "float32") = gv1',
        "    else:",
        '        r: Tensor((k,), "float32") = gv',
        "    return r",
    ]
    assert str(ShapeExpr((k, 2))) == "shape((k, 2))"
    assert str(PrimValue(k * 2 + 1)) == "prim_value(k * 2 + 1)"
    assert str(StringImm('a"b')) == '"a\\"b"'
    assert str(Tuple([])) == "()"
    ext = Call(ExternFunc("my_kernel"), (x,), sinfo_args=(_t(3),))
    assert str(ext) == 'call_extern("my_kernel", x, sinfo_args=(Tensor((3,), "float32"),))'
    assert str(const(np.int64(3))) == 'const(3, "int64")'
    assert str(x) == 'x: Tensor(dtype="float32", ndim=1)'
    text = 'x: Tensor(dtype="float32", ndim=1) = const(True, "bool")'
    assert str(VarBinding(x, const(True))) == text
    assert str(SeqExpr([], x)) == "return x"


def test_format_prim():
    n, m = tir.Var("n", "int64"), tir.Var("m", "int64")
    assert format_prim((n + m) * 2) == "(n + m) * 2"
    assert format_prim(n - (m - 1)) == "n - (m - 1)"
    assert format_prim(tir.min(n, m) // 4) == "min(n, m) // 4"
    assert format_prim(tir.IntImm("int8", 3)) == "int8(3)"


def test_module_with_several_functions():
    x = Var("x", _t(2))
    bb = BlockBuilder()
    with bb.function("helper", [x]):
        bb.emit_func_output(RELU(x))
    y = Var("y", _t(2))
    with bb.function("main", [y]):
        bb.emit_func_output(Call(GlobalVar("helper"), (y,)))
    mod = bb.get()
    text = mod.script()
    assert isinstance(mod, IRModule)
    assert text.count("def ") == 2
    assert '    gv: Tensor((2,), "float32") = helper(y)' in text.splitlines()
