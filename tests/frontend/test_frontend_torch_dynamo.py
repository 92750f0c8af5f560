"""torch.compile(model, backend="kiln"): graph breaks, dynamic shapes (recompilation stops at
kiln's symbolic dims), zero-copy tensors, and the backend's registration (after ``import
kiln`` and through the ``torch_dynamo_backends`` entry point without it)."""

from __future__ import annotations

import subprocess
import sys
import textwrap

import numpy as np
import torch

import kiln  # noqa: F401 - registers the backend
from kiln.frontend.torch import dynamo
from kiln.frontend.torch.tensors import to_kiln, to_torch


class CountBuilds:
    """Counts the kiln executables the backend builds."""

    def __init__(self, monkeypatch) -> None:
        self.count = 0
        build = dynamo.build

        def counting(*args, **kwargs):
            self.count += 1
            return build(*args, **kwargs)

        monkeypatch.setattr(dynamo, "build", counting)


def _mlp() -> torch.nn.Module:
    torch.manual_seed(0)
    return torch.nn.Sequential(torch.nn.Linear(16, 32), torch.nn.GELU(),
                               torch.nn.LayerNorm(32), torch.nn.Linear(32, 4)).eval()


def test_compile_matches_eager_and_stops_recompiling(monkeypatch) -> None:
    torch._dynamo.reset()
    builds = CountBuilds(monkeypatch)
    model = _mlp()
    compiled = torch.compile(model, backend="kiln")
    with torch.no_grad():
        for n in (2, 3, 5, 17, 64):
            x = torch.randn(n, 16)
            out = compiled(x)
            assert isinstance(out, torch.Tensor) and out.shape == (n, 4)
            torch.testing.assert_close(out, model(x), rtol=1e-5, atol=1e-5)
    # the first size compiles static, the second recompiles with a symbolic batch: then one
    # executable serves every size
    assert builds.count == 2


def test_graph_breaks_run_between_kiln_graphs(monkeypatch) -> None:
    torch._dynamo.reset()
    builds = CountBuilds(monkeypatch)
    lin1, lin2 = torch.nn.Linear(8, 8).eval(), torch.nn.Linear(8, 3).eval()

    def f(x):
        y = torch.relu(lin1(x))
        if float(y.sum()) > 0:  # data-dependent Python control flow: a graph break
            y = y * 2
        return lin2(y).softmax(-1)

    compiled = torch.compile(f, backend="kiln")
    with torch.no_grad():
        x = torch.randn(4, 8)
        torch.testing.assert_close(compiled(x), f(x), rtol=1e-5, atol=1e-6)
    assert builds.count >= 2


def test_parameters_frozen_or_kept_as_inputs() -> None:
    torch._dynamo.reset()
    model = _mlp()
    x = torch.randn(3, 16)
    with torch.no_grad():
        ref = model(x)
        frozen = torch.compile(model, backend="kiln")(x)
        torch._dynamo.reset()
        live = torch.compile(model, backend="kiln", options={"freeze_params": False})
        torch.testing.assert_close(live(x), ref, rtol=1e-5, atol=1e-5)
        model[0].weight.mul_(2)  # seen by the run-time-parameter version only
        torch.testing.assert_close(live(x), model(x), rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(frozen, ref, rtol=1e-5, atol=1e-5)


def test_tensors_cross_without_copies() -> None:
    t = torch.randn(3, 4)
    a = to_kiln(t)
    assert a.ctypes.data == t.data_ptr()
    b = np.arange(6, dtype=np.float32).reshape(2, 3)
    assert to_torch(b).data_ptr() == b.ctypes.data
    h = torch.randn(5).bfloat16()
    assert to_kiln(h).ctypes.data == h.data_ptr()
    back = to_torch(to_kiln(h))
    assert back.dtype == torch.bfloat16 and torch.equal(back, h)


def test_registered_after_import_kiln() -> None:
    from torch._dynamo.backends.registry import lookup_backend

    assert lookup_backend("kiln") is dynamo.kiln_backend


def test_entry_point_finds_backend_without_import_kiln(tmp_path) -> None:
    """torch.compile(backend="kiln") in a process that never imports kiln: torch finds the
    backend through the ``torch_dynamo_backends`` entry point of kiln's package metadata (a
    dist-info made here with the entry point pyproject.toml declares, so the test does not
    depend on how kiln was installed)."""
    import tomllib

    root = __file__.rsplit("/tests/", 1)[0]
    with open(f"{root}/pyproject.toml", "rb") as f:
        eps = tomllib.load(f)["project"]["entry-points"]["torch_dynamo_backends"]
    info = tmp_path / "kiln_ep-0.0.dist-info"
    info.mkdir()
    (info / "METADATA").write_text("Metadata-Version: 2.1\nName: kiln-ep\nVersion: 0.0\n")
    (info / "entry_points.txt").write_text(
        "[torch_dynamo_backends]\n" + "".join(f"{k} = {v}\n" for k, v in eps.items()))
    code = textwrap.dedent(f"""
        import sys
        sys.path[:0] = [{str(tmp_path)!r}, {root!r}]
        import torch
        f = torch.compile(lambda x: torch.tanh(x) * 2, backend="kiln")
        x = torch.randn(5)
        torch.testing.assert_close(f(x), torch.tanh(x) * 2)
        print("kiln.frontend.torch.dynamo" in sys.modules)
    """)
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                         cwd=str(tmp_path))
    assert out.returncode == 0, out.stderr[-2000:]
    assert out.stdout.strip().endswith("True")
