"""ATen converters by op family; importing this package registers them all."""

from . import (  # noqa: F401
    elementwise,
    index,
    linalg,
    nn,
    order,
    reduce,
    shape,
    special,
    strided,
)
