"""Registry audit: every registered operator is complete.

Each operator must declare StructInfo inference, a fusion pattern, a compute (or a legalize
hook), and either a gradient rule or an explicit ``NON_DIFFERENTIABLE`` mark; every target family
in ``AUDITED_FAMILIES`` must give it a schedule (its own or a rule's, ``kiln/schedule/<room>/``)
or say why it has none (``kiln.schedule.register_no_schedule``);
and it must have a numeric test: its registry name (as a string literal) or its Python API
(``op.<name>`` / ``nn.<name>``) appears in a test module under ``tests/op/`` other than this
audit and the generated gradient checks (which cover every differentiable op by construction,
and so prove nothing about the forward numerics).
"""

from __future__ import annotations

import inspect
import re
from functools import cache
from pathlib import Path

import pytest

import kiln.op
from kiln.op import nn as op_nn
from kiln.op.registry import NON_DIFFERENTIABLE, OpDef, OpPattern, get_op_def, list_ops
from kiln.schedule import FAMILIES, schedule_source

TESTS = Path(__file__).resolve().parent
NOT_NUMERIC = {"test_op_registry_audit.py", "test_op_gradients.py"}
#: Target families whose schedules are audited (a family joins once its room schedules every op).
AUDITED_FAMILIES = ("c",)


@cache
def _test_sources() -> dict[str, str]:
    return {p.name: p.read_text() for p in sorted(TESTS.glob("test_*.py"))
            if p.name not in NOT_NUMERIC}


def _python_names(opdef: OpDef) -> set[str]:
    """The names under which an op's Python API is exported (kiln.op and kiln.op.nn)."""
    names = set()
    for module in (kiln.op, op_nn):
        for attr, value in vars(module).items():
            if value is opdef:
                names.add(attr)
    return names


def _numeric_tests(name: str) -> list[str]:
    opdef = get_op_def(name)
    patterns = [re.compile(r"""["']""" + re.escape(name) + r"""["']""")]
    for py in _python_names(opdef):
        patterns.append(re.compile(r"\b(?:op|nn)\." + re.escape(py) + r"\b"))
    return [f for f, src in _test_sources().items() if any(p.search(src) for p in patterns)]


def _kiln_ops() -> list[str]:
    """Operators declared by kiln itself (tests register throw-away ops of their own, and which
    of those a worker has imported depends on collection order)."""
    return [n for n in list_ops() if getattr(get_op_def(n).infer, "__module__", "").startswith(
        "kiln.")]


@pytest.mark.parametrize("name", _kiln_ops())
def test_operator_declaration_is_complete(name):
    opdef = get_op_def(name)
    problems = []
    if not callable(opdef.infer):
        problems.append("no StructInfo inference (infer=)")
    if not isinstance(opdef.pattern, OpPattern):
        problems.append("no fusion pattern (pattern=)")
    if not callable(opdef.compute) and not callable(opdef.legalize):
        problems.append("no compute (compute=) or legalize hook (legalize=)")
    for family in AUDITED_FAMILIES:
        if schedule_source(name, family) is None:
            problems.append(f"no {family!r} schedule and no reason why not (kiln/schedule/"
                            f"{FAMILIES[family]}/: register_schedule, a rule, or "
                            "register_no_schedule)")
    if opdef.gradient is not NON_DIFFERENTIABLE and not callable(opdef.gradient):
        problems.append("no gradient rule (gradient=...) and no gradient=NON_DIFFERENTIABLE mark")
    elif callable(opdef.gradient):
        params = list(inspect.signature(opdef.gradient).parameters)
        if len(params) != 3:
            problems.append(f"gradient rule takes {params}; expected (orig_call, output_grad, bb)")
    if not _numeric_tests(name):
        problems.append("no numeric test: neither its name nor its Python API appears in a "
                        "test module under tests/op/")
    assert not problems, f"operator {name}: " + "; ".join(problems)


def test_the_audit_sees_rules_own_schedules_and_reasons():
    """Where the audited schedules come from: a rule, the op's own entry, or a reason."""
    assert schedule_source("add", "c").startswith("rule ")
    assert schedule_source("nn.conv2d", "c") == "own"
    assert schedule_source("image_decode", "c").startswith("none: ")


def test_the_audit_finds_python_apis_and_names():
    """The numeric-test scan itself: names and APIs are found, unknown ones are not."""
    assert "test_op_elementwise.py" in _numeric_tests("add")
    assert _python_names(get_op_def("nn.conv2d")) >= {"conv2d"}
    assert _numeric_tests("nn.conv2d")
    assert "test_op_grad.py" in _numeric_tests("take_backward")
