"""PyTorch's OpInfo samples through torch.export and kiln (a representative slice).

``kiln.testing.torch_opinfo`` exports every float32 sample of an OpInfo op as a program of
its own, imports and compiles them many per kiln build and compares each result with eager
(rtol 1e-5, atol 1e-5; integers and bools exactly). The default run covers the ops below --
every family the converters have (arithmetic, math, activations, reductions, shapes,
indexing, strided views and scatters, order statistics, convolution, pooling,
normalization, attention, special functions) -- with up to ``SAMPLES`` samples
each, in a fixed order; ``benchmarks/torch_opinfo.py`` runs the whole database and prints
the pass table.
"""

from __future__ import annotations

import numpy as np
import pytest
import torch

from kiln.testing import torch_opinfo

SAMPLES = 3

OPS = [
    "add", "sub", "mul", "div.no_rounding_mode", "div.floor_rounding", "remainder", "pow",
    "maximum", "atan2", "exp", "log1p", "sigmoid", "tanh", "erf", "asin", "rsqrt", "abs",
    "clamp", "where", "eq", "logical_and", "nn.functional.gelu",
    "nn.functional.silu", "nn.functional.hardswish", "nn.functional.elu",
    "nn.functional.softplus", "sum", "mean", "amax", "argmax", "var", "logsumexp", "cumsum",
    "softmax", "log_softmax", "view", "permute", "expand", "squeeze", "unsqueeze", "cat",
    "stack", "flip", "roll", "repeat", "narrow", "select", "split", "chunk", "transpose",
    "nn.functional.pad.constant", "index_select", "gather", "scatter_add", "take_along_dim",
    "masked_fill", "topk", "sort", "tril", "mm", "bmm", "addmm", "matmul",
    "nn.functional.linear", "nn.functional.conv1d", "nn.functional.conv2d",
    "nn.functional.conv_transpose2d", "nn.functional.max_pool2d", "nn.functional.avg_pool2d",
    "nn.functional.adaptive_avg_pool2d", "nn.functional.layer_norm",
    "nn.functional.batch_norm", "nn.functional.group_norm", "nn.functional.embedding",
    "nn.functional.interpolate.nearest", "nn.functional.interpolate.bilinear",
    "nn.functional.scaled_dot_product_attention", "full_like", "arange",
    "diagonal", "unfold", "as_strided_scatter", "median", "cummax", "searchsorted", "lgamma",
    "erfinv", "linalg.det", "linalg.solve_ex", "linalg.lu", "linalg.qr", "linalg.eigh",
    "linalg.svd", "linalg.pinv", "special.bessel_j0", "special.hermite_polynomial_h", "igamma",
]


@pytest.fixture(scope="module")
def results() -> dict[str, list[torch_opinfo.Case]]:
    cases = list(torch_opinfo.cases(OPS, max_samples=SAMPLES))
    torch_opinfo.run(cases, batch=48)
    by_op: dict[str, list[torch_opinfo.Case]] = {op: [] for op in OPS}
    for case in cases:
        by_op[case.op].append(case)
    return by_op


@pytest.mark.parametrize("op", OPS)
def test_opinfo_samples_match_eager(op: str, results) -> None:
    exportable = [c for c in results[op] if c.exportable]
    assert exportable, f"{op}: no exportable sample ({[c.not_exportable for c in results[op]]})"
    failures = [f"#{c.index} [{c.stage}] {c.result}" for c in exportable if c.result != "pass"]
    assert not failures, f"{op}: " + "; ".join(failures)


def test_sign_free_vectors_are_compared_after_aligning_signs() -> None:
    """An eigenvector (or singular vector pair) of the other sign passes; factors that do not
    reconstruct eager's matrix, or a vector that differs by more than its sign, do not."""
    q = np.linalg.qr(np.random.default_rng(0).standard_normal((4, 4)))[0].astype(np.float32)
    w = np.array([-1.0, 0.5, 2.0, 3.0], np.float32)
    eager = (torch.from_numpy(w), torch.from_numpy(q))
    flipped = q * np.array([1, -1, -1, 1], np.float32)
    got, diff = torch_opinfo.align_signs("linalg.eigh", [w, flipped], eager)
    assert diff is None and torch_opinfo.compare(got, eager) is None
    assert torch_opinfo.compare([w, flipped], eager) is not None  # the raw comparison fails
    _, diff = torch_opinfo.align_signs("linalg.eigh", [w, q[:, [1, 0, 2, 3]]], eager)
    assert diff == "the factors do not reconstruct eager's matrix"
    s = np.array([3.0, 2.0, 1.0, 0.5], np.float32)
    u, vh = q, q.T.copy()
    flip = np.array([-1, 1, -1, 1], np.float32)
    eager = tuple(torch.from_numpy(x) for x in (u, s, vh))
    got, diff = torch_opinfo.align_signs("linalg.svd", [u * flip, s, vh * flip[:, None]], eager)
    assert diff is None and torch_opinfo.compare(got, eager) is None
    _, diff = torch_opinfo.align_signs("linalg.svd", [u * flip, s, vh], eager)  # U alone flipped
    assert diff is not None
