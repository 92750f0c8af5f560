"""Finite-difference checks of every operator's gradient rule, generated from the registry.

Every registered operator whose declaration has a gradient rule must have sample cases in
``SAMPLES`` below (the test fails for a differentiable operator without one, so a new operator is
checked automatically once it declares a gradient). For each case the test builds, in float64,

    loss(inputs) = sum_k sum(op(inputs)[k] * R_k)        (R_k fixed random weights)

(over the float results ``k``: an integer result such as topk's indices carries no gradient),

runs ``kiln.transform.Gradient`` on it, compiles the forward function and its adjoint with
``kiln.build`` (all cases in one library), and compares the adjoint's gradients with central
finite differences of the compiled forward function (eps = 1e-6, one element at a time).
Non-float inputs (indices, masks) are constants of the case.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import numpy as np
import pytest

import kiln
from kiln import graph as g
from kiln.ir import IRModule
from kiln.ir.errors import KilnError
from kiln.op.registry import get_op_def, list_ops
from kiln.transform import Gradient, PassContext

EPS = 1e-6
RTOL = 1e-5
ATOL = 1e-6


# ---------------------------------------------------------------------------------------------
# sample specification
# ---------------------------------------------------------------------------------------------
@dataclass
class F:
    """A float64 input (a parameter differentiated by the check): uniform in [lo, hi), or
    the given ``values``."""

    shape: tuple[int, ...] = ()
    lo: float = -2.0
    hi: float = 2.0
    values: Any = None

    def make(self, rng: np.random.Generator) -> np.ndarray:
        if self.values is not None:
            return np.asarray(self.values, dtype=np.float64)
        return rng.uniform(self.lo, self.hi, size=self.shape)


@dataclass
class C:
    """A constant input of the case (indices, conditions)."""

    value: Any


@dataclass
class L:
    """A variadic list input (e.g. concat's tensors)."""

    items: list[Any]


@dataclass
class Case:
    inputs: list[Any]
    attrs: dict[str, Any] = field(default_factory=dict)


def case(*inputs: Any, **attrs: Any) -> Case:
    return Case(list(inputs), attrs)


def f(*shape: int, lo: float = -2.0, hi: float = 2.0) -> F:
    return F(tuple(shape), lo, hi)


POS = {"lo": 0.5, "hi": 2.0}
B = np.array([[True, False, True], [False, True, True]])
IDX = np.array([[0, 3], [3, -1]], dtype=np.int64)  # a repeat, and a negative index
CONV = {"strides": 2, "padding": 1}
POOL = {"pool_size": 3, "strides": 2, "padding": 1}

# op name -> sample cases (float64). Keep inputs small: finite differences are per element.
SAMPLES: dict[str, list[Case]] = {
    # ---- element-wise binary (broadcasting) ----
    "add": [case(f(2, 3), f(3)), case(f(2, 1), f(1, 3))],
    "subtract": [case(f(2, 3), f(2, 1))],
    "multiply": [case(f(2, 3), f(3)), case(f(3), f(2, 3))],
    "divide": [case(f(2, 3), f(3, **POS))],
    "floor_divide": [case(f(2, 3), f(3, **POS))],
    "mod": [case(f(2, 3), f(1, 3, **POS))],
    "maximum": [case(f(2, 3), f(3))],
    "minimum": [case(f(2, 3), f(2, 1))],
    "power": [case(f(2, 3, **POS), f(3, lo=-1.5, hi=1.5))],
    "where": [case(C(B), f(2, 3), f(3)), case(C(B[0]), f(2, 1), f(2, 3))],
    # ---- element-wise unary ----
    "negative": [case(f(2, 3))],
    "abs": [case(f(2, 3))],
    "exp": [case(f(2, 3))],
    "log": [case(f(2, 3, **POS))],
    "sqrt": [case(f(2, 3, **POS))],
    "rsqrt": [case(f(2, 3, **POS))],
    "tanh": [case(f(2, 3))],
    "sigmoid": [case(f(2, 3))],
    "erf": [case(f(2, 3))],
    "sin": [case(f(2, 3))],
    "cos": [case(f(2, 3))],
    "floor": [case(f(2, 3))],
    "ceil": [case(f(2, 3))],
    "round": [case(f(2, 3))],
    "relu": [case(f(2, 3))],
    "gelu": [case(f(2, 3)), case(f(2, 3), approximate="tanh")],
    "silu": [case(f(2, 3))],
    "clip": [case(f(2, 4), min=-1.0, max=0.5), case(f(5), min=0.0)],
    "cast": [case(f(2, 3), dtype="float64")],
    # ---- reductions ----
    "sum": [case(f(2, 3, 4), axis=1), case(f(2, 3), axis=None, keepdims=True),
            case(f(2, 3, 4), axis=(0, 2))],
    "mean": [case(f(2, 3, 4), axis=(1, 2)), case(f(4, 2), axis=0, keepdims=True)],
    "prod": [case(f(2, 3, 4, lo=0.5, hi=1.5), axis=(0, 2)),
             case(F(values=[[0.5, 0.0, 2.0], [1.5, -1.0, 0.0]]), axis=1)],
    "max": [case(f(2, 3, 4), axis=1), case(f(3, 4), axis=None)],
    "min": [case(f(2, 3, 4), axis=(0, 2), keepdims=True)],
    "reduce_to": [case(f(2, 3, 4), shape=(1, 3, 1)), case(f(2, 3), shape=(2, 1), kind="max"),
                  case(f(2, 3), shape=(1, 3), kind="min"),
                  case(f(2, 3, 2), shape=(2, 1, 1), kind="logsumexp"),
                  case(f(2, 3, lo=0.5, hi=1.5), shape=(2, 1), kind="prod"),
                  # no zero, one zero and two zeros in a reduced line
                  case(F(values=[[0.5, 0.0, 2.0], [1.5, -1.0, 0.7], [0.0, 0.0, 1.2]]),
                       shape=(3, 1), kind="prod")],
    # ---- shape ----
    "reshape": [case(f(2, 3, 2), shape=(3, -1))],
    "transpose": [case(f(2, 3, 4), axes=(1, 2, 0))],
    "layout_transform": [
        case(f(1, 4, 2, 3), src_layout="NCHW", dst_layout="NCHW2c"),
        case(f(1, 2, 3, 2), src_layout="NHWC", dst_layout="NCHW"),
    ],
    "concat": [case(L([f(2, 3), f(1, 3)]), axis=0), case(L([f(2, 1), f(2, 2), f(2, 1)]), axis=1)],
    "split": [case(f(4, 3), indices_or_sections=2), case(f(2, 5), indices_or_sections=(1, 3),
                                                          axis=1)],
    "squeeze": [case(f(2, 1, 3), axis=1)],
    "expand_dims": [case(f(2, 3), axis=(0, 2))],
    "broadcast_to": [case(f(3, 1), shape=(2, 3, 4))],
    "strided_slice": [case(f(5, 4), begin=(1, -1), end=(None, 0), strides=(2, -2)),
                      case(f(4, 6), begin=(1,), end=(5,), strides=(2,), axes=(1,))],
    "take": [case(f(4, 3), C(IDX), axis=0), case(f(2, 5), C(np.array([7, -2, 1])), axis=1,
                                                   mode="wrap"),
             case(f(2, 3), C(np.array([5, 0, 5])), axis=None, mode="clip")],
    "pad": [case(f(2, 3), pad_width=((1, 0), (2, 1)), pad_value=0.5),
            case(f(2, 3), pad_width=((1, 1), (2, 1)), mode="edge"),
            case(f(3, 4), pad_width=((2, 1), (0, 3)), mode="reflect")],
    # ---- indexing (ONNX gathers/scatters; a repeat under "none": the last write wins) ----
    "gather_elements": [case(f(3, 4), C(np.array([[0, 2, 2, -1], [1, 0, 3, 3]])), axis=1),
                        case(f(3, 2), C(np.array([[2, 0], [2, -3]], dtype=np.int32)), axis=0)],
    "gather_nd": [case(f(3, 4), C(np.array([[0, 1], [2, -1], [0, 1]]))),
                  case(f(3, 4), C(np.array([[2], [0], [2]]))),
                  case(f(2, 3, 2), C(np.array([[[1], [1]], [[0], [2]]])), batch_dims=1)],
    "scatter_elements": [
        case(f(3, 4), C(np.array([[1, 0], [2, -1]])), f(2, 2), axis=1),
        case(f(3, 2), C(np.array([[2, 0], [2, 0]])), f(2, 2), axis=0, reduction="add"),
        case(f(2, 4), C(np.array([[3, 1, -1], [0, 0, 2]], dtype=np.int32)), f(2, 3), axis=1),
    ],
    "scatter_nd": [case(f(3, 4), C(np.array([[0, 1], [2, -1]])), f(2)),
                   case(f(3, 4), C(np.array([[2], [0], [2]])), f(3, 4), reduction="add"),
                   case(f(3, 4), C(np.array([[-1], [0]])), f(2, 4)),
                   case(f(3, 2), C(np.array([[0, 1], [2, 0], [0, 1], [-3, -1]])), f(4))],
    # ---- selection (distinct values: the selection is locally constant) ----
    "topk": [case(f(3, 5), k=2), case(f(4, 3), k=3, axis=0, largest=False)],
    # ---- linear algebra ----
    "matmul": [case(f(3, 4), f(4, 2)), case(f(2, 1, 3, 4), f(3, 4, 2)), case(f(4), f(2, 4, 3)),
               case(f(2, 3, 4), f(4)), case(f(4), f(4))],
    "dense": [case(f(3, 4), f(2, 4)), case(f(2, 3, 4), f(5, 4)), case(f(4), f(3, 4))],
    # ---- nn ----
    "nn.conv2d": [
        case(f(1, 2, 5, 5), f(3, 2, 3, 3), **CONV),
        case(f(2, 4, 4, 5), f(4, 2, 2, 2), groups=2, dilation=(1, 2), padding=(1, 0, 0, 1)),
        case(f(1, 5, 4, 2), f(3, 2, 2, 2), data_layout="NHWC", kernel_layout="HWIO"),
    ],
    "nn.conv2d_nchwc": [case(f(1, 2, 4, 4, 2), f(2, 2, 3, 3, 2, 2), padding=1),
                        case(f(1, 4, 5, 4, 2), f(2, 2, 3, 3, 2, 2), groups=2, strides=2)],
    "nn.depthwise_conv2d_nchwc": [case(f(1, 2, 5, 4, 2), f(2, 1, 3, 3, 2), padding=(1, 0, 1, 1),
                                       strides=2)],
    "nn.max_pool2d": [case(f(1, 2, 5, 5), **POOL),
                      case(f(1, 4, 4, 2), pool_size=2, ceil_mode=True, strides=3, layout="NHWC")],
    "nn.avg_pool2d": [case(f(1, 2, 5, 5), **POOL),
                      case(f(1, 2, 5, 5), **POOL, count_include_pad=True),
                      case(f(1, 1, 4, 5), pool_size=2, strides=2, ceil_mode=True)],
    "nn.adaptive_avg_pool2d": [case(f(1, 2, 5, 7), output_size=(2, 3))],
    "nn.adaptive_max_pool2d": [case(f(1, 2, 5, 7), output_size=(2, 3))],
    "nn.softmax": [case(f(2, 5), axis=-1), case(f(3, 2, 2), axis=0)],
    "nn.log_softmax": [case(f(2, 5), axis=1)],
    "nn.layer_norm": [case(f(2, 5), f(5), f(5)),
                      case(f(2, 3, 4), f(3), f(3), axes=(1,), epsilon=0.1)],
    "nn.batch_norm": [case(f(2, 3, 2, 2), f(3), f(3), f(3), f(3, **POS)),
                      case(f(3, 2), f(2), f(2), f(2), f(2, **POS), axis=-1)],
    "nn.dropout": [case(f(2, 3), rate=0.25)],
    # ---- scans ----
    "cumsum": [case(f(2, 4), axis=1), case(f(2, 3), axis=None, exclusive=True, reverse=True)],
    "cumprod": [case(f(2, 4), axis=1, exclusive=True),
                case(F(values=[[0.5, 0.0, 2.0, 1.5], [1.2, -1.0, 0.0, 0.0]]), axis=1),
                # zeros first in scan order, flattened, exclusive and reversed at once
                case(F(values=[[1.5, 0.0, 2.0], [0.0, -0.5, 0.0]]), axis=None, exclusive=True,
                     reverse=True)],
    # ---- gradient operators (their own adjoints: second derivatives) ----
    "collapse_sum_like": [case(f(2, 3, 4), f(3, 1))],
    "collapse_sum_to": [case(f(2, 3, 4), shape=(1, 4))],
    "take_backward": [case(f(2, 2, 3), f(5, 3), C(IDX), axis=0)],
    "strided_slice_backward": [case(f(2, 2), f(5, 4), begin=(1, -1), end=(None, 0),
                                    strides=(2, -2))],
    "pad_backward": [case(f(4, 6), f(2, 3), pad_width=((1, 1), (2, 1)), mode="reflect")],
    "nn.conv2d_backward_data": [case(f(1, 3, 3, 3), f(3, 2, 3, 3), f(1, 2, 5, 5), **CONV)],
    "nn.conv2d_backward_weight": [case(f(1, 3, 3, 3), f(1, 2, 5, 5), f(3, 2, 3, 3), **CONV)],
    "nn.avg_pool2d_backward": [case(f(1, 2, 3, 3), f(1, 2, 5, 5), **POOL)],
    "nn.adaptive_avg_pool2d_backward": [case(f(1, 2, 2, 3), f(1, 2, 5, 7), output_size=(2, 3))],
}


def differentiable_ops() -> list[str]:
    return [n for n in list_ops() if callable(get_op_def(n).gradient)]


CASES = [(name, k) for name in differentiable_ops() if name in SAMPLES
         for k in range(len(SAMPLES[name]))]


# ---------------------------------------------------------------------------------------------
# building and running
# ---------------------------------------------------------------------------------------------
def _func_name(name: str, k: int) -> str:
    return "c_" + name.replace(".", "_") + f"_{k}"


@dataclass
class Built:
    func: str
    inputs: list[np.ndarray]


def _build_case(name: str, k: int, rng: np.random.Generator) -> tuple[IRModule, Built]:
    spec = SAMPLES[name][k]
    opdef = get_op_def(name)
    params: list[g.Var] = []
    arrays: list[np.ndarray] = []

    def arg(item: Any) -> Any:
        if isinstance(item, L):
            return [arg(i) for i in item.items]
        if isinstance(item, C):
            return g.const(np.asarray(item.value))
        value = item.make(rng)
        v = g.Var(f"x{len(params)}", g.TensorStructInfo(value.shape, "float64"))
        params.append(v)
        arrays.append(value)
        return v

    args = [arg(i) for i in spec.inputs]
    fname = _func_name(name, k)
    bb = g.BlockBuilder()
    with bb.function(fname, params, {"global_symbol": fname}):
        with bb.dataflow():
            out = bb.emit(opdef(*args, **spec.attrs))
            sinfo = out.struct_info
            fields = ([g.TupleGetItem(out, i) for i in range(len(sinfo.fields))]
                      if isinstance(sinfo, g.TupleStructInfo) else [out])
            total = None
            for fld in fields:
                fs = bb.normalize(fld).struct_info
                if str(fs.dtype) != "float64":  # e.g. topk's indices: no gradient flows
                    continue
                weights = rng.uniform(0.5, 1.5, size=fs.static_shape()) * rng.choice([-1, 1])
                term = kiln.op.sum(kiln.op.multiply(fld, g.const(weights)))
                total = term if total is None else kiln.op.add(total, term)
            loss = bb.emit_output(total)
        bb.emit_func_output(loss)
    mod = Gradient(fname)(bb.get())
    return mod, Built(fname, arrays)


#: Cases compiled together (one library per group: compiling everything at once is slower,
#: one build per case pays the compiler start-up each time); groups run in parallel under xdist.
GROUP_SIZE = 12
GROUPS = [CASES[i:i + GROUP_SIZE] for i in range(0, len(CASES), GROUP_SIZE)]


def _compile(group: list[tuple[str, int]]) -> tuple[Any, dict[tuple[str, int], Built]]:
    rng = np.random.default_rng(1234)
    funcs: dict[str, Any] = {}
    built = {}
    for name, k in group:
        mod, b = _build_case(name, k, rng)
        funcs.update(mod.items())
        built[(name, k)] = b
    # opt level 0 (LegalizeOps and lowering): the rules' math is what is checked here; the
    # adjoints of whole models go through the full pipeline in test_transform_gradient.py.
    with PassContext(opt_level=0):
        exe = kiln.build(IRModule(funcs))
    return exe, built


def _finite_differences(run: Any, inputs: list[np.ndarray]) -> list[np.ndarray]:
    grads = []
    for i, x in enumerate(inputs):
        gi = np.zeros_like(x)
        flat = gi.reshape(-1)
        for j in range(x.size):
            vals = []
            for sign in (1.0, -1.0):
                xs = [a.copy() for a in inputs]
                xs[i].reshape(-1)[j] += sign * EPS
                vals.append(float(run(*xs)))
            flat[j] = (vals[0] - vals[1]) / (2 * EPS)
        grads.append(gi)
    return grads


# ---------------------------------------------------------------------------------------------
# tests
# ---------------------------------------------------------------------------------------------
def test_every_differentiable_op_has_a_sample():
    missing = [n for n in differentiable_ops() if n not in SAMPLES]
    assert not missing, (
        f"operators with a gradient rule but no finite-difference sample: {missing}; add "
        "cases to SAMPLES in tests/op/test_op_gradients.py"
    )
    stale = [n for n in SAMPLES if n not in differentiable_ops()]
    assert not stale, f"SAMPLES has cases for operators without a gradient rule: {stale}"


def _group_id(group: list[tuple[str, int]]) -> str:
    names = sorted({n for n, _ in group})
    return f"{names[0]}..{names[-1]}"


@pytest.mark.parametrize("group", GROUPS, ids=[_group_id(gr) for gr in GROUPS])
def test_gradients_match_finite_differences(group):
    exe, built = _compile(group)
    failures = []
    for name, k in group:
        b = built[(name, k)]
        loss, grads = exe[b.func + "_adjoint"](*b.inputs)
        np.testing.assert_allclose(float(loss), float(exe[b.func](*b.inputs)), rtol=1e-12)
        numeric = _finite_differences(exe[b.func], b.inputs)
        assert len(grads) == len(numeric)
        for i, (got, want) in enumerate(zip(grads, numeric)):
            if not np.allclose(got, want, rtol=RTOL, atol=ATOL):
                err = np.max(np.abs(got - want))
                failures.append(f"{name} case {k} ({SAMPLES[name][k].attrs}): gradient of "
                                f"input {i} is off by up to {err:.3g}\n  got {got.ravel()}"
                                f"\n  want {want.ravel()}")
    assert not failures, "\n".join(failures)


@pytest.mark.parametrize("name", ["scatter_elements", "scatter_nd"])
def test_scatter_gradient_rejects_mul_max_min(name):
    """Only reductions none and add have a rule; the others fail naming the op and reduction."""
    x = g.Var("x", g.TensorStructInfo((3, 2), "float64"))
    u = g.Var("u", g.TensorStructInfo((1, 2), "float64"))
    idx = g.const(np.array([[1, 0]] if name == "scatter_elements" else [[2]]))
    bb = g.BlockBuilder()
    with bb.function("f", [x, u], {"global_symbol": "f"}):
        with bb.dataflow():
            out = bb.emit(get_op_def(name)(x, idx, u, reduction="mul"))
            loss = bb.emit_output(kiln.op.sum(out))
        bb.emit_func_output(loss)
    with pytest.raises(KilnError, match=f"{name}: no gradient for reduction 'mul'"):
        Gradient("f")(bb.get())


def test_reduce_to_gradient_with_run_time_axes():
    """reduce_to's rule when which axes are reduced is bound only at run time (symbolic result
    dims, as the ONNX importer makes them): finite differences for several bindings."""
    from kiln import tir

    funcs: dict[str, Any] = {}
    kinds = ("sum", "max", "prod", "logsumexp")
    for kind in kinds:
        a, b = tir.Var("a", "int64"), tir.Var("b", "int64")
        x = g.Var("x", g.TensorStructInfo((3, 4), "float64"))
        s = g.Var("s", g.TensorStructInfo((a, b), "int8"))  # binds a, b from its shape
        bb = g.BlockBuilder()
        with bb.function(f"f_{kind}", [x, s], {"global_symbol": f"f_{kind}"}):
            with bb.dataflow():
                r = bb.emit(kiln.op.reduce_to(x, shape=(a, b), kind=kind))
                loss = bb.emit_output(kiln.op.sum(kiln.op.multiply(r, kiln.op.exp(r))))
            bb.emit_func_output(loss)
        funcs.update(Gradient(f"f_{kind}")(bb.get()).items())
    exe = kiln.build(IRModule(funcs))
    v = np.random.default_rng(5).uniform(0.5, 1.5, (3, 4))
    v[1, 2] = 0.0
    for kind in kinds:
        for shape in ((1, 4), (3, 1), (1, 1), (3, 4)):
            sv = np.zeros(shape, "int8")
            _, grads = exe[f"f_{kind}_adjoint"](v, sv)
            forward = exe[f"f_{kind}"]
            numeric = _finite_differences(lambda xv, fw=forward, sv=sv: fw(xv, sv), [v])[0]
            np.testing.assert_allclose(np.asarray(grads[0]), numeric, rtol=RTOL, atol=ATOL,
                                       err_msg=f"{kind} to {shape}")
