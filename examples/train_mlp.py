"""Train a small MLP classifier with ``kiln.training`` on a synthetic two-moons data set.

The data (two interleaving half circles with Gaussian noise) is generated here with numpy and a
fixed seed; the model is built with kiln's graph builder; ``kiln.training.Trainer`` compiles
forward, backward and the optimizer update into one executable. The script prints the loss of
every epoch and the held-out accuracy, and exits with status 1 if the accuracy stays below the
target within the epoch budget.

Run: ``python examples/train_mlp.py [--epochs 30] [--optimizer adam|sgd] [--target 0.95]``.
"""

from __future__ import annotations

import argparse
import sys
import time
from collections.abc import Sequence
from functools import partial

import numpy as np

from kiln import graph as g
from kiln import op, training
from kiln.ir.module import IRModule
from kiln.target import Target

SIZES = (2, 32, 32, 2)


def make_moons(n: int, noise: float, rng: np.random.Generator) -> tuple[np.ndarray, np.ndarray]:
    """``n`` points of two interleaving half circles (classes 0 and 1), standardized."""
    half = n // 2
    t0 = rng.uniform(0, np.pi, half)
    t1 = rng.uniform(0, np.pi, n - half)
    upper = np.stack([np.cos(t0), np.sin(t0)], axis=1)
    lower = np.stack([1 - np.cos(t1), 0.5 - np.sin(t1)], axis=1)
    x = np.concatenate([upper, lower]) + rng.normal(0, noise, (n, 2))
    y = np.concatenate([np.zeros(half, np.int64), np.ones(n - half, np.int64)])
    x = (x - x.mean(axis=0)) / x.std(axis=0)
    order = rng.permutation(n)
    return x[order].astype(np.float32), y[order]


def build_mlp(batch: int, sizes: Sequence[int] = SIZES) -> IRModule:
    """``main(x, w0, b0, w1, b1, ...)``: dense -> bias -> relu layers, logits at the end."""
    x = g.Var("x", g.TensorStructInfo((batch, sizes[0]), "float32"))
    weights = []
    for i, (fan_in, fan_out) in enumerate(zip(sizes[:-1], sizes[1:])):
        weights.append((g.Var(f"w{i}", g.TensorStructInfo((fan_out, fan_in), "float32")),
                        g.Var(f"b{i}", g.TensorStructInfo((fan_out,), "float32"))))
    bb = g.BlockBuilder()
    with bb.function("main", [x, *[v for pair in weights for v in pair]]):
        with bb.dataflow():
            h = x
            for i, (w, b) in enumerate(weights):
                h = bb.emit(op.add(op.dense(h, w), b))
                if i < len(weights) - 1:
                    h = bb.emit(op.nn.relu(h))
            out = bb.emit_output(h)
        bb.emit_func_output(out)
    return bb.get()


def init_params(sizes: Sequence[int], rng: np.random.Generator) -> dict[str, np.ndarray]:
    """He-initialized weights, zero biases."""
    params = {}
    for i, (fan_in, fan_out) in enumerate(zip(sizes[:-1], sizes[1:])):
        params[f"w{i}"] = (rng.standard_normal((fan_out, fan_in)) * np.sqrt(2 / fan_in)).astype(
            np.float32)
        params[f"b{i}"] = np.zeros(fan_out, np.float32)
    return params


def main(argv: Sequence[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--epochs", type=int, default=15, help="epoch budget")
    ap.add_argument("--optimizer", choices=("adam", "sgd"), default="adam")
    ap.add_argument("--target", type=float, default=0.95, help="held-out accuracy to reach")
    ap.add_argument("--samples", type=int, default=2000, help="data set size (3/4 train)")
    ap.add_argument("--batch", type=int, default=50)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--threads", type=int, default=1,
                    help="threads per kernel (0: all cores); a model this small gains nothing "
                    "from parallel kernels, whose start-up costs more than its work")
    args = ap.parse_args(argv)

    rng = np.random.default_rng(args.seed)
    x, y = make_moons(args.samples, noise=0.15, rng=rng)
    n_train = args.samples * 3 // 4
    x_train, y_train, x_test, y_test = x[:n_train], y[:n_train], x[n_train:], y[n_train:]

    optimizer = (training.Adam(lr=0.01) if args.optimizer == "adam"
                 else training.SGD(lr=0.1, momentum=0.9, weight_decay=1e-4))
    t0 = time.perf_counter()
    trainer = training.Trainer(partial(build_mlp, sizes=SIZES), training.SoftmaxCrossEntropy(),
                               optimizer, init_params(SIZES, rng), batch_size=args.batch,
                               target=Target("c", num_threads=args.threads))
    print(f"compiled train step and predict in {time.perf_counter() - t0:.2f} s "
          f"({trainer.executable.num_kernels} kernels per step)")

    accuracy = 0.0
    t0 = time.perf_counter()
    for epoch in range(1, args.epochs + 1):
        order = rng.permutation(n_train)
        losses = []
        for start in range(0, n_train - args.batch + 1, args.batch):
            idx = order[start:start + args.batch]
            losses.append(trainer.step(x_train[idx], y_train[idx]))
        accuracy = float(np.mean(trainer.predict(x_test).argmax(axis=1) == y_test))
        print(f"epoch {epoch:3d}  loss {np.mean(losses):.4f}  held-out accuracy {accuracy:.3f}")
    print(f"trained {trainer.steps} steps in {time.perf_counter() - t0:.2f} s; final held-out "
          f"accuracy {accuracy:.3f} (target {args.target:.3f})")
    if accuracy < args.target:
        print("FAILED: target accuracy not reached", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
