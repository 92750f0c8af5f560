"""Operators. Each is declared once (see ``kiln.op.registry``); the declaration is its Python API.

``kiln.op.add(x, y)``, ``kiln.op.matmul(a, b)``, ``kiln.op.nn.conv2d(x, w, ...)``,
``kiln.op.nn.relu(x)`` (also ``kiln.op.relu``). Families: elementwise, reduce, shape, linalg, nn.
"""

from . import grad, nn  # noqa: F401 - kiln.op.grad (gradient helpers), the op.nn namespace
from .attention import *  # noqa: F403
from .decompose import *  # noqa: F403
from .detection import *  # noqa: F403
from .dynamic import *  # noqa: F403
from .elementwise import *  # noqa: F403
from .fast_math import *  # noqa: F403
from .host import *  # noqa: F403
from .image import *  # noqa: F403
from .index import *  # noqa: F403
from .layout import *  # noqa: F403
from .linalg import *  # noqa: F403
from .loss import *  # noqa: F403
from .matmul_packed import *  # noqa: F403
from .matrix import *  # noqa: F403
from .nn import *  # noqa: F403
from .quantize import *  # noqa: F403
from .random import *  # noqa: F403
from .reduce import *  # noqa: F403
from .registry import (  # noqa: F401 - re-exported API
    NON_DIFFERENTIABLE,
    MixedPrecision,
    OpDef,
    OpPattern,
    get_op_def,
    list_ops,
    register_op,
)
from .scan import *  # noqa: F403
from .sequence import *  # noqa: F403
from .shape import *  # noqa: F403
from .signal import *  # noqa: F403
from .slicing import *  # noqa: F403
from .special import *  # noqa: F403
from .strings import *  # noqa: F403
from .text import *  # noqa: F403
from .tree import *  # noqa: F403
