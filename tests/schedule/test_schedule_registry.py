"""kiln.schedule.registry: how target families register schedules and how the build finds them.

Registrations are global, so each test works on a throw-away operator and on fresh rule and
hook tables (monkeypatched), leaving the CPU room's registrations as they are.
"""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from kiln.graph.shape_utils import tensor_sinfo
from kiln.ir.errors import KilnError
from kiln.op.registry import OpPattern, get_op_def, list_ops, register_op
from kiln.schedule import registry
from kiln.schedule.cpu.generic import schedule_injective
from kiln.schedule.cpu.scan import schedule_scan
from kiln.target import Target

OP = "test_schedule_registry.op"
ROOT = Path(__file__).resolve().parents[2]


def _not_lowerable(bb, call):
    raise KilnError("a test-only operator")


@pytest.fixture
def opdef(monkeypatch):
    """A throw-away ELEMWISE op with empty per-op tables, and empty rule and hook tables."""
    if OP not in list_ops():
        register_op(OP, inputs=("x",), infer=lambda call: tensor_sinfo(call, 0),
                    pattern=OpPattern.ELEMWISE, legalize=_not_lowerable)
    d = get_op_def(OP)
    monkeypatch.setattr(d, "schedules", {})
    monkeypatch.setattr(d, "alter_layout", {})
    monkeypatch.setattr(registry, "_RULES", {f: [] for f in registry.FAMILIES})
    monkeypatch.setattr(registry, "_NO_SCHEDULE", {})
    monkeypatch.setattr(registry, "_FALLBACK", {})
    monkeypatch.setattr(registry, "_EPILOGUE", {})
    return d


def _sched(sch, target):
    """A stand-in schedule."""


def _other(sch, target):
    """Another stand-in schedule."""


def test_target_kinds_map_to_families():
    assert registry.target_family("c") == "c"
    assert registry.target_family(Target("c")) == "c"
    assert registry.target_family("cpu") == "c"  # an alias of the C target
    assert registry.target_family("cuda") == registry.target_family("opencl") == "gpu"
    assert registry.target_family("gpu") == "gpu" and registry.target_family("npu") == "npu"
    assert registry.FAMILIES == {"c": "cpu", "gpu": "gpu", "npu": "npu"}
    with pytest.raises(KilnError, match="unknown target"):
        registry.register_rule(OpPattern.ELEMWISE, "tpu")(_sched)


def test_an_op_s_own_schedule_wins_over_rules(opdef):
    registry.register_rule(OpPattern.ELEMWISE, "c", name="elementwise")(_other)
    assert registry.lookup_schedule(OP, "c") is _other
    assert registry.schedule_source(OP, "c") == "rule elementwise"
    assert registry.register_schedule(OP, "c")(_sched) is _sched  # a decorator
    assert opdef.schedules == {"c": _sched}  # stored in the op's declaration
    assert registry.lookup_schedule(OP, Target("c")) is _sched
    assert registry.schedule_source(OP, "c") == "own"
    with pytest.raises(KilnError, match="already has a 'c' schedule"):
        registry.register_schedule(OP, "c")(_other)
    with pytest.raises(KilnError, match="no operator named"):
        registry.register_schedule("test_schedule_registry.missing", "c")(_sched)


def test_a_gpu_kind_registers_for_its_family(opdef):
    registry.register_schedule([OP], ["cuda"])(_sched)
    assert opdef.schedules == {"gpu": _sched}
    assert registry.lookup_schedule(OP, "opencl") is _sched
    assert registry.lookup_schedule(OP, "c") is None and registry.schedule_source(OP, "c") is None


def test_rules_match_by_pattern_or_predicate_in_order(opdef):
    registry.register_rule({OpPattern.COMM_REDUCE, OpPattern.OPAQUE}, "gpu")(_other)
    assert registry.lookup_schedule(OP, "gpu") is None  # ELEMWISE matches neither
    registry.register_rule(lambda d: d.name == OP, "gpu", name="this op")(_sched)
    registry.register_rule(OpPattern.ELEMWISE, "gpu")(_other)
    assert registry.lookup_schedule(OP, "gpu") is _sched  # the first rule that matches
    assert registry.schedule_source(OP, "gpu") == "rule this op"
    assert [r.name for r in registry.rules("gpu")][0] == "pattern COMM_REDUCE/OPAQUE: _other"
    assert registry.rules("c") == []


def test_no_schedule_is_a_registration_with_its_reason(opdef):
    registry.register_rule(OpPattern.ELEMWISE, "npu")(_other)
    registry.register_no_schedule(OP, "npu", "runs on the host")
    assert registry.lookup_schedule(OP, "npu") is None  # the reason beats the rule
    assert registry.no_schedule_reason(OP, "npu") == "runs on the host"
    assert registry.schedule_source(OP, "npu") == "none: runs on the host"
    with pytest.raises(KilnError, match="no 'npu' schedule"):
        registry.register_schedule(OP, "npu")(_sched)
    with pytest.raises(KilnError, match="needs the reason"):
        registry.register_no_schedule(OP, "c", "")


def test_layout_hooks_fallbacks_and_epilogues(opdef):
    def hook(call, target):
        return None

    registry.register_alter_layout(OP, "c")(hook)
    assert opdef.alter_layout == {"c": hook} and registry.lookup_alter_layout(OP, "c") is hook
    assert registry.lookup_alter_layout(OP, "gpu") is None
    with pytest.raises(KilnError, match="alter_layout"):
        registry.register_alter_layout(OP, "c")(hook)
    registry.register_fallback("gpu")(_sched)
    registry.register_epilogue("gpu")(_other)
    assert registry.lookup_fallback("cuda") is _sched and registry.lookup_epilogue("cuda") is _other
    assert registry.lookup_fallback("c") is None
    with pytest.raises(KilnError, match="fallback"):
        registry.register_fallback("gpu")(_other)
    with pytest.raises(KilnError, match="epilogue"):
        registry.register_epilogue("opencl")(_sched)


def test_the_cpu_room_is_registered():
    assert registry.lookup_schedule("add", "c") is schedule_injective  # the injective rule
    assert registry.lookup_schedule("cumsum", "c") is schedule_scan  # its own
    assert registry.lookup_alter_layout("nn.conv2d", "c") is not None
    assert registry.no_schedule_reason("image_decode", "c")
    assert registry.lookup_fallback("c") is not None and registry.lookup_epilogue("c") is not None


@pytest.mark.parametrize("first", ["kiln.schedule.registry", "kiln.op.nn", "kiln.build",
                                   "kiln.transform"])
def test_every_entry_point_sees_the_cpu_schedules(first):
    """Whatever a program imports first, the CPU room is registered before a lookup can run
    (no reliance on import order)."""
    code = (f"import {first}\n"
            "from kiln.schedule.registry import lookup_alter_layout, lookup_schedule\n"
            "assert lookup_schedule('nn.conv2d', 'c') is not None\n"
            "assert lookup_alter_layout('dense', 'c') is not None\n")
    subprocess.run([sys.executable, "-c", code], check=True, cwd=ROOT)
