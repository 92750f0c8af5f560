"""CPU schedules (target family ``"c"``), registered into the op registry on import: the
generic rules (:mod:`.rules`) and, beside them, the ops that need their own."""

from . import detection, image, index, random, rules, scan, text, tree  # noqa: F401
