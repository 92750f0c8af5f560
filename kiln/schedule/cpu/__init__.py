"""CPU schedules (target family ``"c"``), registered into the op registry on import: the
generic rules (:mod:`.rules`) and, beside them, the ops that need their own."""

from . import (  # noqa: F401
    convolution,
    detection,
    image,
    index,
    linalg,
    matmul_packed,
    pooling,
    random,
    rows,
    rules,
    scan,
    text,
    tree,
)
