"""Test-wide fixtures.

Every test runs inside a PassContext whose WellFormedInstrument checks ``kiln.graph.well_formed``
around every pass the test runs (directly, in a Sequential, or inside ``kiln.build``), so a pass
that breaks the IR fails the test that ran it with an error naming the pass. Nested contexts a
test makes inherit the instrument unless they pass their own ``instruments``.
"""

import pytest

from kiln.transform import PassContext, WellFormedInstrument


@pytest.fixture(autouse=True)
def _check_every_pass_keeps_ir_well_formed():
    with PassContext(instruments=[WellFormedInstrument()]):
        yield
