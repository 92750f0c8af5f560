"""Pass instruments: timing, IR dumps/printing, and the well-formed checker."""

import io
import time

import pytest

from kiln import graph as g
from kiln import op
from kiln.ir import InternalError, IRModule, WellFormedError
from kiln.transform import (
    DumpIR,
    LegalizeOps,
    PassContext,
    PassTimingInstrument,
    PrintIRInstrument,
    Sequential,
    WellFormedInstrument,
    module_pass,
)


def _module() -> IRModule:
    bb = g.BlockBuilder()
    x = g.Var("x", g.TensorStructInfo((4, 8), "float32"))
    with bb.function("main", [x]):
        with bb.dataflow():
            lv = bb.emit(op.relu(x))
            gv = bb.emit_output(op.add(lv, x))
        bb.emit_func_output(gv)
    return bb.get()


@module_pass(opt_level=0)
def instr_test_sleep(mod, ctx):
    """Sleep 20 ms."""
    time.sleep(0.02)
    return mod


@module_pass(opt_level=0)
def instr_test_outer(mod, ctx):
    """Run LegalizeOps from inside a pass."""
    return LegalizeOps()(mod)


@module_pass(opt_level=3)
def instr_test_gated(mod, ctx):
    """Only at opt level 3."""
    return mod


# ---------------------------------------------------------------------------------------------
# timing
# ---------------------------------------------------------------------------------------------
def test_timing_reports_every_pass_run():
    timing = PassTimingInstrument()
    with PassContext(instruments=[timing]):
        Sequential([instr_test_sleep, LegalizeOps(), instr_test_gated, instr_test_sleep])(
            _module())
    names = [r.name for r in timing.records]
    assert sorted(names) == sorted(["instr_test_sleep", "LegalizeOps", "instr_test_sleep"])
    assert [r.name for r in sorted(timing.records, key=lambda r: r.index)] == [
        "instr_test_sleep", "LegalizeOps", "instr_test_sleep"]
    assert set(timing.timings) == {"instr_test_sleep", "LegalizeOps"}
    assert timing.timings["instr_test_sleep"] >= 40.0  # two runs of >= 20 ms, summed
    report = timing.report()
    lines = report.splitlines()
    assert lines[0].startswith("pass timings: 3 runs")
    assert len(lines) == 4  # header + one line per run
    assert [ln.split()[-1] for ln in lines[1:]] == [
        "instr_test_sleep", "LegalizeOps", "instr_test_sleep"]
    assert all(" ms " in ln and "%" in ln for ln in lines[1:])
    by_time = timing.report(sort="time").splitlines()[1:]
    ms = [float(ln.split()[0]) for ln in by_time]
    assert ms == sorted(ms, reverse=True)
    with pytest.raises(ValueError, match="sort"):
        timing.report(sort="name")


def test_timing_nests_passes_run_inside_passes():
    timing = PassTimingInstrument()
    with PassContext(instruments=[timing]):
        instr_test_outer(_module())
    runs = sorted(timing.records, key=lambda r: r.index)
    assert [(r.name, r.depth) for r in runs] == [("instr_test_outer", 0), ("LegalizeOps", 1)]
    assert runs[0].ms >= runs[1].ms
    lines = timing.report().splitlines()
    assert lines[1].endswith("%  instr_test_outer")
    assert lines[2].endswith("%    LegalizeOps")  # indented one level
    timing.reset()
    assert timing.records == [] and timing.timings == {}


def test_timing_survives_a_failing_pass():
    @module_pass(opt_level=0)
    def instr_test_fails(mod, ctx):
        raise RuntimeError("boom")

    timing = PassTimingInstrument()
    with PassContext(instruments=[timing]):
        # a bug in a pass is an InternalError naming it, the original chained
        with pytest.raises(InternalError, match="pass instr_test_fails: internal error") as info:
            instr_test_fails(_module())
        assert isinstance(info.value.__cause__, RuntimeError)
        instr_test_sleep(_module())
    assert [r.name for r in timing.records] == ["instr_test_sleep"]


# ---------------------------------------------------------------------------------------------
# IR dumps
# ---------------------------------------------------------------------------------------------
def test_dump_ir_writes_numbered_before_and_after_files(tmp_path):
    dump = DumpIR(tmp_path / "dump", before=["LegalizeOps"], after=True)
    with PassContext(instruments=[dump]):
        Sequential([instr_test_sleep, LegalizeOps(), instr_test_sleep])(_module())
    files = sorted(p.name for p in (tmp_path / "dump").iterdir())
    assert files == [
        "001_after_instr_test_sleep.txt",
        "002_after_LegalizeOps.txt",
        "002_before_LegalizeOps.txt",
        "003_after_instr_test_sleep.txt",
    ]
    before = (tmp_path / "dump" / "002_before_LegalizeOps.txt").read_text()
    after = (tmp_path / "dump" / "002_after_LegalizeOps.txt").read_text()
    assert before.startswith("# IR before pass LegalizeOps (run 2")
    assert "relu(x)" in before and "call_tir" not in before
    assert after.startswith("# IR after pass LegalizeOps (run 2")
    assert "call_tir(relu" in after and "def relu(" in after
    assert [p.name for p in dump.files][:1] == ["001_after_instr_test_sleep.txt"]


def test_dump_ir_only_selected_passes(tmp_path):
    dump = DumpIR(tmp_path, before=(), after=["LegalizeOps"])
    with PassContext(instruments=[dump]):
        Sequential([instr_test_sleep, LegalizeOps()])(_module())
    assert sorted(p.name for p in tmp_path.iterdir()) == ["002_after_LegalizeOps.txt"]


def test_print_ir_to_a_stream():
    out = io.StringIO()
    with PassContext(instruments=[PrintIRInstrument(before=True, after=False, file=out)]):
        LegalizeOps()(_module())
    text = out.getvalue()
    assert text.startswith("# IR before pass LegalizeOps (run 1, opt_level 0)")
    assert "def main(" in text and "call_tir" not in text


# ---------------------------------------------------------------------------------------------
# well-formed checker
# ---------------------------------------------------------------------------------------------
def _retyped(mod: IRModule) -> IRModule:
    """The legalized module with relu's call_tir claiming a float16 output."""

    class Retype(g.ExprMutator):
        def visit_Call(self, call):
            call = super().visit_Call(call)
            if g.is_call_tir(call) and call.args[0].name == "relu":
                return g.call_tir(call.args[0], call.args[1],
                                  g.TensorStructInfo((4, 8), "float16"))
            return call

    return mod.with_function("main", Retype(mod).visit(mod["main"]))


@module_pass(opt_level=0)
def instr_test_breaker(mod, ctx):
    """Break the IR on purpose (a call_tir whose output dtype disagrees with its callee)."""
    return _retyped(mod)


def test_tests_run_under_the_well_formed_instrument():
    assert any(isinstance(i, WellFormedInstrument) for i in PassContext.current().instruments)


def test_well_formed_instrument_names_the_pass_that_broke_the_ir():
    legal = LegalizeOps()(_module())
    with PassContext(instruments=[WellFormedInstrument()]):
        with pytest.raises(WellFormedError) as err:
            Sequential([instr_test_sleep, instr_test_breaker, instr_test_sleep])(legal)
    msg = str(err.value)
    assert msg.startswith("pass instr_test_breaker produced ill-formed IR")
    assert "call_tir relu: output 0 has dtype float16" in msg and "float32" in msg


def test_well_formed_instrument_does_not_blame_a_pass_for_its_input():
    broken = _retyped(LegalizeOps()(_module()))
    with PassContext(instruments=[WellFormedInstrument()]):
        with pytest.raises(WellFormedError, match="the input of pass instr_test_sleep is not"):
            instr_test_sleep(broken)
    with PassContext(instruments=[WellFormedInstrument(check_input=False)]):
        with pytest.raises(WellFormedError, match="pass instr_test_sleep produced ill-formed"):
            instr_test_sleep(broken)


@module_pass(opt_level=0)
def instr_test_narrower(mod, ctx):
    """Well-formed output whose main returns (4,) instead of (4, 8): callers would break."""
    bb = g.BlockBuilder()
    x = g.Var("x", g.TensorStructInfo((4, 8), "float32"))
    with bb.function("main", [x]):
        with bb.dataflow():
            gv = bb.emit_output(op.sum(x, axis=1))
        bb.emit_func_output(gv)
    return bb.get()


def test_well_formed_instrument_catches_a_changed_result_type():
    with PassContext(instruments=[WellFormedInstrument()]):
        with pytest.raises(WellFormedError) as err:
            instr_test_narrower(_module())
    msg = str(err.value)
    assert msg.startswith("pass instr_test_narrower changed the result type")
    assert "main:" in msg and "(4, 8)" in msg


def test_without_the_instrument_broken_ir_passes_through():
    with PassContext(instruments=()):
        out = instr_test_breaker(LegalizeOps()(_module()))
    assert isinstance(out, IRModule)
