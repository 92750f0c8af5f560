"""Pass declarations, Sequential gating, required passes, PassContext and its config registry."""

import importlib
import inspect
import json
import pkgutil
import subprocess
import sys
import threading

import pytest

import kiln.transform as T
from kiln import graph as g
from kiln import op
from kiln.ir import InternalError, IRModule, KilnError, assert_structural_equal
from kiln.tir import PrimFunc
from kiln.transform import (
    LegalizeOps,
    Pass,
    PassContext,
    PassInfo,
    PassInstrument,
    Sequential,
    function_pass,
    list_passes,
    module_pass,
    prim_func_pass,
    register_config,
)


def _relu_module() -> IRModule:
    bb = g.BlockBuilder()
    x = g.Var("x", g.TensorStructInfo((4, 8), "float32"))
    with bb.function("main", [x]):
        with bb.dataflow():
            lv = bb.emit(op.relu(x))
            gv = bb.emit_output(op.add(lv, x))
        bb.emit_func_output(gv)
    return bb.get()


def _sigmoid_module() -> IRModule:
    bb = g.BlockBuilder()
    x = g.Var("x", g.TensorStructInfo((4, 8), "float32"))
    with bb.function("main", [x]):
        with bb.dataflow():
            lv = bb.emit(op.sigmoid(x))
            gv = bb.emit_output(op.add(lv, x))
        bb.emit_func_output(gv)
    return bb.get()


class _ReluToSigmoid(g.ExprMutator):
    def visit_Call(self, call):
        call = super().visit_Call(call)
        if isinstance(call.op, g.Op) and call.op.name == "relu":
            return self.builder.normalize(op.sigmoid(call.args[0]))
        return call


# A log of pass runs shared by the logging passes below.
LOG: list[str] = []


@pytest.fixture(autouse=True)
def _clear_log():
    LOG.clear()
    yield


def _logging_pass(name: str, opt_level: int, required=()):
    def fn(mod, ctx):
        LOG.append(name)
        return mod

    fn.__name__ = name
    fn.__doc__ = f"Log {name}."
    return module_pass(fn, opt_level=opt_level, required=required)


P0 = _logging_pass("InfraTestP0", 0)
P1 = _logging_pass("InfraTestP1", 1)
P3 = _logging_pass("InfraTestP3", 3)
NEEDS_P3 = _logging_pass("InfraTestNeedsP3", 1, required=("InfraTestP3",))
NEEDS_NEEDS = _logging_pass("InfraTestNeedsNeeds", 0, required=("InfraTestNeedsP3",))


# ---------------------------------------------------------------------------------------------
# declaring passes
# ---------------------------------------------------------------------------------------------
def test_module_pass_class_becomes_a_pass_subclass_with_info_and_options():
    @module_pass(opt_level=2)
    class InfraTestSwap:
        """Replace relu by sigmoid.

        More text that is not the summary.
        """

        def __init__(self, only: str = "main"):
            self.only = only

        def transform_module(self, mod, ctx):
            assert isinstance(ctx, PassContext)
            return mod.with_function(self.only, _ReluToSigmoid(mod).visit(mod[self.only]))

    p = InfraTestSwap(only="main")
    assert isinstance(p, Pass) and issubclass(InfraTestSwap, Pass)
    assert p.info == PassInfo("InfraTestSwap", 2, ())
    assert p.only == "main" and p.name == "InfraTestSwap"
    assert InfraTestSwap.__doc__.startswith("Replace relu")
    entry = [e for e in list_passes() if e[0] == "InfraTestSwap"]
    assert entry == [("InfraTestSwap", 2, "Replace relu by sigmoid.")]

    mod = _relu_module()
    before = mod.script()
    out = p(mod)
    assert out is not mod
    assert mod.script() == before  # the input is untouched
    assert_structural_equal(out["main"], _sigmoid_module()["main"])


def test_name_and_required_arguments():
    @module_pass(opt_level=1, name="InfraTestRenamed", required=("InfraTestP0",))
    class Whatever:
        def transform_module(self, mod, ctx):
            return mod

    assert Whatever().info == PassInfo("InfraTestRenamed", 1, ("InfraTestP0",))
    assert Whatever.__name__ == "Whatever"


def test_function_pass_runs_on_graph_functions_only_and_keeps_unchanged_ones():
    seen = []

    @function_pass(opt_level=1)
    def infra_test_fn_pass(func, mod, ctx):
        seen.append(type(func).__name__)
        return _ReluToSigmoid(mod).visit(func)

    mod = LegalizeOps()(_relu_module())  # has PrimFuncs and one graph function
    mod = mod.with_function("other", _relu_module()["main"])
    out = infra_test_fn_pass(mod)
    assert seen == ["Function", "Function"]
    assert out["main"] is mod["main"]  # already legalized: nothing to change, same object
    assert_structural_equal(out["other"], _sigmoid_module()["main"])
    assert all(out[n] is mod[n] for n in mod if isinstance(mod[n], PrimFunc))


def test_prim_func_pass_runs_on_prim_funcs_only():
    @prim_func_pass(opt_level=0)
    class InfraTestTagPrims:
        """Tag every PrimFunc."""

        def transform_function(self, func, mod, ctx):
            return func.with_attr("infra_test_tag", True)

    mod = LegalizeOps()(_relu_module())
    out = InfraTestTagPrims()(mod)
    prims = [n for n in out if isinstance(out[n], PrimFunc)]
    assert sorted(prims) == ["add", "relu"]
    assert all(out[n].attrs["infra_test_tag"] for n in prims)
    assert out["main"] is mod["main"]
    assert not any("infra_test_tag" in mod[n].attrs for n in prims)


def test_per_function_pass_must_return_the_same_kind():
    @function_pass(opt_level=0)
    def infra_test_bad_return(func, mod, ctx):
        return None

    with pytest.raises(InternalError, match="infra_test_bad_return.*graph Function 'main'"):
        infra_test_bad_return(_relu_module())


def test_class_without_transform_method_is_rejected():
    with pytest.raises(KilnError, match="must define transform_module"):
        @module_pass(opt_level=0)
        class InfraTestNoMethod:
            pass


def test_a_kiln_pass_name_cannot_be_reused():
    with pytest.raises(KilnError, match="LegalizeOps.*already declared"):
        @module_pass(opt_level=0, name="LegalizeOps")
        def impostor(mod, ctx):
            return mod


def test_directly_called_pass_always_runs_whatever_the_opt_level():
    with PassContext(opt_level=0):
        P3(_relu_module())
    assert LOG == ["InfraTestP3"]


def test_pass_that_edits_its_input_in_place_is_caught():
    @module_pass(opt_level=0)
    def infra_test_mutator(mod, ctx):
        mod["main"] = _sigmoid_module()["main"]
        return mod

    with pytest.raises(InternalError, match="infra_test_mutator modified its input"):
        infra_test_mutator(_relu_module())

    @module_pass(opt_level=0)
    def infra_test_attr_mutator(mod, ctx):
        mod.attrs["infra_test"] = 1
        return mod.copy()

    with pytest.raises(InternalError, match="infra_test_attr_mutator modified the attrs"):
        infra_test_attr_mutator(_relu_module())


def test_pass_must_return_a_module_and_take_one():
    @module_pass(opt_level=0)
    def infra_test_returns_none(mod, ctx):
        return None

    with pytest.raises(InternalError, match="returned NoneType"):
        infra_test_returns_none(_relu_module())
    with pytest.raises(KilnError, match="expects an IRModule"):
        P0(_relu_module()["main"])


# ---------------------------------------------------------------------------------------------
# Sequential and PassContext gating
# ---------------------------------------------------------------------------------------------
def test_opt_level_gates_passes_in_sequential():
    seq = Sequential([P0, P1, P3])
    for level, expected in [(0, ["P0"]), (1, ["P0", "P1"]), (2, ["P0", "P1"]),
                            (3, ["P0", "P1", "P3"])]:
        LOG.clear()
        with PassContext(opt_level=level):
            seq(_relu_module())
        assert LOG == [f"InfraTest{n}" for n in expected], level


def test_default_context_is_opt_level_2():
    Sequential([P0, P1, P3])(_relu_module())
    assert LOG == ["InfraTestP0", "InfraTestP1"]


def test_disabled_pass_is_removed():
    with PassContext(opt_level=3, disabled_pass=["InfraTestP1"]):
        Sequential([P0, P1, P3])(_relu_module())
    assert LOG == ["InfraTestP0", "InfraTestP3"]


def test_required_pass_runs_above_the_opt_level_and_wins_over_disabled():
    with PassContext(opt_level=0, required_pass=["InfraTestP3"]):
        Sequential([P0, P1, P3])(_relu_module())
    assert LOG == ["InfraTestP0", "InfraTestP3"]
    LOG.clear()
    with PassContext(opt_level=0, required_pass=["InfraTestP1"], disabled_pass=["InfraTestP1"]):
        Sequential([P1])(_relu_module())
    assert LOG == ["InfraTestP1"]


def test_required_passes_run_first_recursively_whatever_their_opt_level():
    with PassContext(opt_level=1):
        Sequential([P0, NEEDS_NEEDS])(_relu_module())
    assert LOG == ["InfraTestP0", "InfraTestP3", "InfraTestNeedsP3", "InfraTestNeedsNeeds"]


def test_required_pass_cycle_and_unknown_requirement_are_errors():
    a = _logging_pass("InfraTestCycleA", 0, required=("InfraTestCycleB",))
    _logging_pass("InfraTestCycleB", 0, required=("InfraTestCycleA",))
    with pytest.raises(KilnError, match="cycle: InfraTestCycleA -> InfraTestCycleB -> Infra"):
        Sequential([a])(_relu_module())
    lost = _logging_pass("InfraTestLost", 0, required=("InfraTestNoSuchPass",))
    with pytest.raises(KilnError, match="InfraTestLost requires 'InfraTestNoSuchPass'"):
        Sequential([lost])(_relu_module())


def test_nested_sequential_is_gated_by_its_own_opt_level():
    inner = Sequential([P0], name="InfraTestInner", opt_level=3)
    with PassContext(opt_level=2):
        Sequential([inner, P1])(_relu_module())
    assert LOG == ["InfraTestP1"]
    LOG.clear()
    with PassContext(opt_level=3):
        Sequential([inner, P1])(_relu_module())
    assert LOG == ["InfraTestP0", "InfraTestP1"]


def test_sequential_rejects_non_passes():
    with pytest.raises(KilnError, match="item 0 is the pass class LegalizeOps.*LegalizeOps()"):
        Sequential([LegalizeOps])
    with pytest.raises(KilnError, match="item 1 is not a Pass"):
        Sequential([P0, "FoldConstant"])


def test_sequential_returns_a_new_module_and_runs_real_passes():
    mod = _relu_module()
    out = Sequential([LegalizeOps()])(mod)
    assert out is not mod and "relu" in out and "relu" not in mod


def test_pass_names_in_context_are_checked():
    with pytest.raises(KilnError, match="no pass named 'LegalizeOp' .*did you mean 'LegalizeOps'"):
        PassContext(disabled_pass=["LegalizeOp"])
    with pytest.raises(KilnError, match="required_pass"):
        PassContext(required_pass=["NoSuchPassAtAll"])
    with pytest.raises(KilnError, match="opt_level"):
        PassContext(opt_level=-1)


# ---------------------------------------------------------------------------------------------
# config registry
# ---------------------------------------------------------------------------------------------
register_config("InfraTest.max_depth", int, 4, "How deep to go.")
register_config("InfraTest.scale", float, 1.0, "A factor.")
register_config("InfraTest.enabled", bool, False, "Switch.")


def test_config_values_are_validated_and_defaults_apply():
    with PassContext(config={"InfraTest.max_depth": 7, "InfraTest.scale": 2}) as ctx:
        assert ctx.config["InfraTest.max_depth"] == 7
        assert ctx.get_config("InfraTest.scale") == 2.0
        assert isinstance(ctx.get_config("InfraTest.scale"), float)  # an int is a fine float
        assert ctx.get_config("InfraTest.enabled") is False  # registered default
        assert PassContext.current() is ctx
    assert "InfraTest.max_depth" in [o.key for o in T.list_configs()]


def test_unknown_config_key_is_an_error():
    with pytest.raises(KilnError, match="unknown key 'InfraTest.max_dept'.*InfraTest.max_depth"):
        PassContext(config={"InfraTest.max_dept": 3})
    with pytest.raises(KilnError, match="unknown key"):
        PassContext().get_config("InfraTest.nothing")


@pytest.mark.parametrize("key,value", [
    ("InfraTest.max_depth", "7"), ("InfraTest.max_depth", 2.5), ("InfraTest.max_depth", True),
    ("InfraTest.enabled", 1), ("InfraTest.scale", "x"),
])
def test_config_value_of_the_wrong_type_is_an_error(key, value):
    with pytest.raises(KilnError, match=f"{key}' expects"):
        PassContext(config={key: value})


def test_conflicting_config_registration_is_an_error():
    register_config("InfraTest.max_depth", int, 4, "same again is fine")
    with pytest.raises(KilnError, match="already registered"):
        register_config("InfraTest.max_depth", float, 4.0, "")
    with pytest.raises(KilnError, match="expects int"):
        register_config("InfraTest.bad_default", int, "four", "")


def test_passes_read_config_through_ctx():
    got = []

    @module_pass(opt_level=0)
    def infra_test_reads_config(mod, ctx):
        got.append(ctx.get_config("InfraTest.max_depth"))
        return mod

    infra_test_reads_config(_relu_module())
    with PassContext(config={"InfraTest.max_depth": 9}):
        infra_test_reads_config(_relu_module())
    assert got == [4, 9]


# ---------------------------------------------------------------------------------------------
# current context: nesting, threads, instruments
# ---------------------------------------------------------------------------------------------
def test_current_context_nests_and_restores():
    outer = PassContext.current()
    with PassContext(opt_level=3) as a:
        assert PassContext.current() is a
        with PassContext(opt_level=1) as b:
            assert PassContext.current() is b
        assert PassContext.current() is a
    assert PassContext.current() is outer


def test_current_context_is_thread_local():
    seen = {}

    def worker():
        seen["ctx"] = PassContext.current()

    with PassContext(opt_level=4) as mine:
        t = threading.Thread(target=worker)
        t.start()
        t.join()
        assert PassContext.current() is mine
    assert seen["ctx"] is not mine
    assert seen["ctx"].opt_level == 2 and seen["ctx"].instruments == ()


class _Recorder(PassInstrument):
    def __init__(self, veto=()):
        self.events = []
        self.veto = set(veto)

    def enter_pass_ctx(self):
        self.events.append("enter")

    def exit_pass_ctx(self):
        self.events.append("exit")

    def should_run(self, mod, info):
        return info.name not in self.veto

    def run_before_pass(self, mod, info):
        self.events.append(f"before {info.name}")

    def run_after_pass(self, mod, info):
        self.events.append(f"after {info.name}")


def test_instruments_see_every_pass_and_nested_contexts_inherit_them():
    rec = _Recorder()
    with PassContext(instruments=[rec]):
        with PassContext(opt_level=3) as inner:  # inherits rec, does not re-enter it
            assert inner.instruments == (rec,)
            Sequential([P0, NEEDS_P3])(_relu_module())
        with PassContext(instruments=()):  # explicitly none
            P0(_relu_module())
    assert rec.events == [
        "enter",
        "before InfraTestP0", "after InfraTestP0",
        "before InfraTestP3", "after InfraTestP3",
        "before InfraTestNeedsP3", "after InfraTestNeedsP3",
        "exit",
    ]


def test_instrument_can_veto_a_pass():
    rec = _Recorder(veto=["InfraTestP1"])
    with PassContext(instruments=[rec]):
        out = Sequential([P0, P1])(_relu_module())
    assert LOG == ["InfraTestP0"]
    assert isinstance(out, IRModule)


def test_a_context_cannot_be_entered_twice():
    ctx = PassContext()
    with ctx:
        with pytest.raises(KilnError, match="already active"):
            with ctx:
                pass


# ---------------------------------------------------------------------------------------------
# the registry lists every declared pass
# ---------------------------------------------------------------------------------------------
def _passes_listed_after_importing_kiln_transform() -> dict[str, tuple[int, str]]:
    """list_passes() in a fresh interpreter that only imports kiln.transform (this process may
    have imported pass modules directly, which would hide one missing from the package)."""
    code = ("import json, kiln.transform as T; "
            "print(json.dumps([list(e) for e in T.list_passes()]))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                         check=True)
    return {name: (level, summary) for name, level, summary in json.loads(out.stdout)}


def test_list_passes_lists_legalize_ops_and_every_kiln_pass():
    names = _passes_listed_after_importing_kiln_transform()
    assert names["LegalizeOps"] == (0, "Lower every op call in every graph function to "
                                       "``call_tir``.")
    declared = []
    for info in pkgutil.walk_packages(T.__path__, prefix="kiln.transform."):  # npu/ too
        if info.name == "kiln.transform.pass_infra":  # the base classes, not passes
            continue
        module = importlib.import_module(info.name)
        for _, obj in inspect.getmembers(module):
            own = getattr(obj, "__module__", None) == module.__name__
            if isinstance(obj, type) and issubclass(obj, Pass) and own:
                if "info" in vars(obj):  # a declared pass (not a base class)
                    declared.append((module.__name__, obj.info))
            elif isinstance(obj, Pass) and type(obj).__module__ == module.__name__:
                declared.append((module.__name__, obj.info))
    assert any(i.name == "LegalizeOps" for _, i in declared)
    for module_name, info in declared:
        assert info.name in names, (
            f"{info.name} ({module_name}) is not listed: import it in kiln/transform/__init__.py"
        )
        assert names[info.name][0] == info.opt_level
        assert names[info.name][1], f"{info.name} has no docstring summary"
    assert {n for n, _ in names.items()} == {i.name for _, i in declared}
