"""Operator fusion: kernels per run and latency at opt level 0 (no fusion) and 3, side by side.

    python benchmarks/fusion.py                 # every model
    python benchmarks/fusion.py resnet          # models whose name contains "resnet"

For each model (the ResNet-style CNN and the MLP from ``kiln.testing.models``) the same graph is
built at opt level 0 and at opt level 3; the table shows the kernel calls per inference, the
median latency, the speedup of opt 3, and the largest difference between the two outputs.
"""

from __future__ import annotations

import sys

import numpy as np

import kiln
from kiln.testing import models
from kiln.testing.timing import median_seconds
from kiln.transform import PassContext

LEVELS = (0, 3)


def model_list() -> list[models.Model]:
    return [
        models.resnet_block_cnn(batch=1, channels=32, size=32),
        models.resnet_block_cnn(batch=8, channels=64, size=28),
        models.mlp(batch=1),
        models.mlp(batch=64),
    ]


def label(model: models.Model) -> str:
    shape = "x".join(str(d) for d in model.inputs[0].shape)
    return f"{model.name} {shape}"


def main(argv: list[str]) -> int:
    pattern = argv[1] if len(argv) > 1 else ""
    head = f"{'model':34s}" + "".join(f"{'opt' + str(lv) + ' kernels':>13s}"
                                      f"{'opt' + str(lv) + ' ms':>11s}" for lv in LEVELS)
    print(head + f"{'speedup':>9s}{'max |diff|':>12s}")
    for model in model_list():
        name = label(model)
        if pattern not in name:
            continue
        row, outs, times = f"{name:34s}", [], []
        for level in LEVELS:
            with PassContext(opt_level=level):
                exe = kiln.build(model.mod, target="c")
            outs.append(exe(*model.inputs))
            seconds = median_seconds(lambda exe=exe, args=model.inputs: exe(*args))
            times.append(seconds)
            row += f"{exe.num_kernels:13d}{seconds * 1e3:11.3f}"
        diff = float(np.max(np.abs(outs[0] - outs[-1])))
        print(row + f"{times[0] / times[-1]:8.2f}x{diff:12.2e}", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
