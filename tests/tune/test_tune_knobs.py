"""Knobs of the default CPU schedules (kiln.schedule.knobs): recorded in the trace with their
domains, the default a point of the space, replays deterministic, other points correct."""

import numpy as np
import pytest

from kiln import graph as g
from kiln import op
from kiln.build import lower_graph
from kiln.codegen import c as codegen_c
from kiln.ir.errors import ScheduleError
from kiln.ir.node import structural_equal
from kiln.schedule.apply import schedule_with_trace
from kiln.schedule.knobs import knob
from kiln.target import Target
from kiln.testing import models
from kiln.tir.function import PrimFunc
from kiln.tir.schedule import Schedule
from kiln.tune.tasks import extract_tasks, knob_domains

TARGET = Target.create("c")


def _kernels():
    """Every kernel of three models with different schedules: GEMM (dense, packed), NCHWc
    convolutions, pooling, layout transforms, injective and reduction epilogues."""
    out = []
    for model in (models.mlp(batch=4, sizes=(64, 128, 10)), models.small_cnn(),
                  models.resnet_block_cnn()):
        mod = lower_graph(model.mod, TARGET)
        out += [(f"{model.name}:{n}", f) for n, f in mod.items() if isinstance(f, PrimFunc)]
    return out


KERNELS = _kernels()


def test_every_model_kernel_has_knobs_with_their_domains_in_the_trace():
    with_knobs = 0
    for name, func in KERNELS:
        _, sch = schedule_with_trace(func, TARGET)
        if sch is None:
            continue
        domains = knob_domains(sch)
        for knob_name, value in sch.knob_decisions().items():
            assert value in domains[knob_name], (name, knob_name)
        with_knobs += bool(domains)
        text = str(sch.trace)
        assert all(f'sch.knob(name="{k}"' in text for k in domains), name
    assert with_knobs == len([1 for _, f in KERNELS if schedule_with_trace(f, TARGET)[1]])


@pytest.mark.parametrize("name,func", KERNELS, ids=[n for n, _ in KERNELS])
def test_default_knobs_and_trace_replay_to_identical_code(name, func):
    plain, sch = schedule_with_trace(func, TARGET)
    if sch is None:
        pytest.skip(f"{name}: its op has no CPU schedule (nothing to tune)")
    # the default's knob values, given explicitly, are the default schedule
    again, sch2 = schedule_with_trace(func, TARGET, sch.knob_decisions())
    assert structural_equal(plain, again)
    assert str(sch.trace) == str(sch2.trace)
    # the trace replays onto a fresh schedule of the same function to the same function
    replayed = sch.trace.apply_to_schedule(Schedule(func))
    assert structural_equal(replayed.func.with_attr("scheduled", True), plain)
    assert replayed.knob_decisions() == sch.knob_decisions()


def _non_default(task):
    """The task's knobs with the first knob that has a choice set to another value."""
    name, domain = next(iter(task.tunable.items()))
    other = next(v for v in domain if v != task.default[name])
    return {**task.default, name: other}


def test_other_knob_values_give_other_code_that_computes_the_same():
    model = models.resnet_block_cnn()
    tasks = extract_tasks(model.mod, TARGET)
    assert tasks
    rng = np.random.default_rng(0)
    for task in tasks[:4]:
        knobs = _non_default(task)
        base, _ = schedule_with_trace(task.func, TARGET)
        tuned, sch = schedule_with_trace(task.func, TARGET, knobs)
        assert not structural_equal(base, tuned), task.name
        assert {k: sch.knob_decisions()[k] for k in knobs if k in sch.knob_decisions()} \
            == {k: v for k, v in knobs.items() if k in sch.knob_decisions()}
        mod = codegen_c.build({"base": base, "tuned": tuned}, TARGET)
        args = [rng.standard_normal([d.value for d in b.shape]).astype(str(b.dtype))
                for b in task.func.buffers]
        n_out = int(task.func.attrs.get("num_outputs", 1))
        outs = []
        for fn in ("base", "tuned"):
            arrays = [a.copy() for a in args]
            for a in arrays[-n_out:]:
                a.fill(np.nan)
            mod[fn](*arrays)
            outs.append(arrays[-n_out:])
        for a, b in zip(*outs):
            np.testing.assert_allclose(a, b, rtol=1e-4, atol=1e-5, err_msg=task.name)


def test_knob_outside_a_schedule_is_its_default_and_values_are_checked():
    assert knob("tile", (1, 2, 4), 2) == 2
    func = KERNELS[0][1]
    sch = Schedule(func)
    sch.knob_values = {"tile": 4}
    assert sch.knob("tile", (1, 2, 4), 2) == 4
    assert sch.knob("tile", (1, 2, 4), 2) == 4  # one decision per name, asked twice
    assert len([i for i in sch.trace if i.kind == "knob"]) == 1
    sch.knob_values = {"bad": 3}
    with pytest.raises(ScheduleError, match="'bad': value 3 is not in its domain"):
        sch.knob("bad", (1, 2), 1)
    with pytest.raises(ScheduleError, match="default 5 is not in its domain"):
        sch.knob("worse", (1, 2), 5)


def test_row_reduction_chains_are_a_knob_and_every_value_computes_softmax():
    bb = g.BlockBuilder()
    x = g.Var("x", g.TensorStructInfo((6, 256), "float32"))
    with bb.function("main", [x]):
        with bb.dataflow():
            out = bb.emit_output(op.nn.softmax(x, axis=-1))
        bb.emit_func_output(out)
    [task] = extract_tasks(bb.get(), TARGET)
    chains = [k for k in task.space if k.endswith(".row_chains")]
    assert chains and all(task.space[k] == (1, 2, 4) for k in chains)
    data = np.random.default_rng(1).standard_normal((6, 256)).astype("float32")
    want = np.exp(data - data.max(-1, keepdims=True))
    want /= want.sum(-1, keepdims=True)
    codes = set()
    for value in (1, 2, 4):
        func, sch = schedule_with_trace(task.func, TARGET, {k: value for k in chains})
        assert all(sch.knob_decisions()[k] == value for k in chains)
        codes.add(str(func))
        out = np.full((6, 256), np.nan, "float32")
        codegen_c.build({"f": func}, TARGET)["f"](data, out)
        np.testing.assert_allclose(out, want, rtol=1e-5, atol=1e-7)
    assert len(codes) == 3
