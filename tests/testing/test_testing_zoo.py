"""The model zoo (kiln.testing.zoo): its catalogue, export cache and runner, and its CI subset
-- a few dozen real architectures compiled by kiln and checked against onnxruntime.

Models of the subset that fail today because of a known kiln gap are in KNOWN_FAILURES, marked
xfail(strict=True) with the cause: a fix makes their test fail until the mark is removed.
The whole zoo, with timings, is ``python benchmarks/zoo.py``.
"""

from __future__ import annotations

import numpy as np
import pytest

from kiln.testing.zoo import CATALOGUE, FAMILIES, InputSpec, ZooModel
from kiln.testing.zoo.export import (
    OPSET,
    SYMBOLICS,
    cache_key,
    exact_symbolics,
    export_bytes,
    exported,
)
from kiln.testing.zoo.runner import (
    error_node,
    max_error,
    ort_session,
    run_model,
    run_model_torch,
)

pytest.importorskip("onnxruntime")
pytest.importorskip("torch")
pytest.importorskip("transformers")

#: CI models failing today: name -> cause.
KNOWN_FAILURES: dict[str, str] = {}

CI_MODELS = [name for name, model in CATALOGUE.items() if model.ci]


def _case(name: str):
    if name in KNOWN_FAILURES:
        return pytest.param(name, marks=pytest.mark.xfail(strict=True,
                                                          reason=KNOWN_FAILURES[name]))
    return name


@pytest.mark.parametrize("name", [_case(n) for n in CI_MODELS])
def test_zoo_model_matches_onnxruntime(name):
    r = run_model(CATALOGUE[name], timing=False)
    node = f" at {r.node}" if r.node else ""
    assert r.passed, f"{name}: {r.status}{node}: {r.error}"


def test_catalogue_covers_the_families():
    assert len(CATALOGUE) >= 100
    for family in FAMILIES:
        assert any(m.family == family for m in CATALOGUE.values()), family
        assert any(m.family == family for m in CATALOGUE.values() if m.ci), family
    assert 20 <= len(CI_MODELS) <= 50


def _tiny(config):
    import torch

    return torch.nn.Sequential(torch.nn.Conv2d(3, 4, 3), torch.nn.BatchNorm2d(4),
                               torch.nn.ReLU(), torch.nn.Flatten(), torch.nn.Linear(4 * 6 * 6,
                                                                                    config["n"]))


def _broken(config):
    raise RuntimeError("this builder fails")


def _model(build=_tiny, n: int = 5, name: str = "test-tiny") -> ZooModel:
    return ZooModel(name, "vision", "torch", build, {"n": n},
                    (InputSpec("input", (2, 3, 8, 8)),))


def test_export_is_deterministic_and_keyed_on_the_config(tmp_path, monkeypatch):
    monkeypatch.setenv("KILN_CACHE_DIR", str(tmp_path))
    model = _model()
    inputs = model.example_inputs()
    assert export_bytes(model, inputs) == export_bytes(model, inputs)
    assert cache_key(model) == cache_key(_model())
    assert cache_key(model) != cache_key(_model(n=6))
    path, cached_inputs = exported(model)
    assert path.parent == tmp_path / "zoo" and path.name.startswith("test-tiny-")
    stamp = path.stat().st_mtime_ns
    again, again_inputs = exported(model)  # a cache hit: the file is not written again
    assert again == path and again.stat().st_mtime_ns == stamp
    for name in inputs:
        np.testing.assert_array_equal(again_inputs[name], inputs[name])
        np.testing.assert_array_equal(cached_inputs[name], inputs[name])


def test_runner_classifies_failures(tmp_path, monkeypatch):
    monkeypatch.setenv("KILN_CACHE_DIR", str(tmp_path))
    r = run_model(_model(_broken, name="test-broken"), timing=False)
    assert r.status == "export" and "this builder fails" in r.error
    r = run_model(_model(), target="no-such-target", timing=False)
    assert r.status in ("target", "compile") and r.error
    r = run_model(_model(), timing=False)
    assert r.passed and r.max_error <= 1e-4


def test_torch_frontend_runs_the_same_entry():
    """run_model_torch: torch.export of the entry's module, checked against eager."""
    r = run_model_torch(_model(), timing=False)
    assert r.passed and r.reference == "torch" and r.max_error <= 1e-4, r.error
    r = run_model_torch(_model(_broken, name="test-broken"), timing=False)
    assert r.status == "export" and "this builder fails" in r.error


def test_input_specs():
    rng = np.random.default_rng(0)
    mask = InputSpec("m", (2, 8), "mask").make(rng)
    assert mask.dtype == np.int64 and mask[:, :6].all() and not mask[:, 6:].any()
    ids = InputSpec("i", (3, 4), "ids", 7).make(rng)
    assert ids.dtype == np.int64 and ids.min() >= 0 and ids.max() < 7
    with pytest.raises(ValueError, match="unknown input kind"):
        InputSpec("x", (1,), "bogus").make(rng)


def test_error_measure_and_node_names():
    ref = np.array([1.0, -4.0, 2.0], np.float32)
    assert max_error(ref + np.float32(4e-4), ref) == pytest.approx(1e-4, rel=1e-3)
    assert max_error(ref[:2], ref) == float("inf")
    assert max_error(np.array([np.nan, -4, 2], np.float32), ref) == float("inf")
    assert error_node("Gather node '/embed/Gather': bad indices") == "Gather '/embed/Gather'"
    message = "kiln cannot convert:\n  STFT (opset 17): nodes /a, /b\n  DFT (opset 17): nodes #3"
    assert error_node(message) == "STFT: /a, /b"
    assert error_node("no node here") is None


def test_vad_has_an_if_gate():
    """The VAD's silence gate (vision.add_silence_gate): an If whose then-branch gives zeros
    for silent audio (onnxruntime runs both branches here; the CI case runs kiln on speech)."""
    import onnx

    path, inputs = exported(CATALOGUE["stft-vad"])
    ops = [n.op_type for n in onnx.load(str(path)).graph.node]
    assert "If" in ops and "GRU" in ops and "Conv" in ops
    sess = ort_session(str(path), 1)
    speech = sess.run(None, inputs)[0]
    silence = sess.run(None, {"audio": np.zeros_like(inputs["audio"])})[0]
    assert speech.shape == silence.shape and speech.min() > 0 and not silence.any()


def _export_with_exact_symbolics(module, args, opset=OPSET):
    import io

    import torch

    buf = io.BytesIO()
    with torch.no_grad(), exact_symbolics(opset):
        torch.onnx.export(module, args, buf, opset_version=opset, dynamo=False)
    return buf.getvalue()


def test_exact_symbolics_repeat_interleave_and_index_add():
    """The export's own translations (export.exact_symbolics) against torch eager, through
    onnxruntime: an interleaving repeat on a middle and the last axis (torch's translation
    fails on Cohere's and GLM's rotary tables), and index_add with repeated indices on axis 0
    and 1 (torch's scatters, keeping one row per index, and refuses)."""
    import onnx
    import torch

    class Repeat(torch.nn.Module):
        def forward(self, x):
            return torch.cat([x.repeat_interleave(3, dim=1).flatten(1),
                              torch.repeat_interleave(x, 2, dim=-1).flatten(1)], 1)

    class IndexAdd(torch.nn.Module):
        def forward(self, base, rows, cols, index):
            return base.index_add(0, index, rows) + base.index_add(1, index, cols, alpha=0.5)

    x = torch.randn(2, 4, 6)
    base, rows, cols = torch.randn(5, 5), torch.randn(7, 5), torch.randn(5, 7)
    index = torch.tensor([0, 3, 3, 1, 0, 3, 4])
    class Fold(torch.nn.Module):  # the output size read from a tensor's shape, as MobileViTV2
        def forward(self, patches, like):
            return torch.nn.functional.fold(patches, like.shape[-2:], (2, 3), stride=(2, 3))

    fold = (torch.randn(1, 12, 8), torch.zeros(1, 1, 4, 12))
    for module, args, opset in ((Repeat(), (x,), OPSET),
                                (IndexAdd(), (base, rows, cols, index), OPSET),
                                (Fold(), fold, 18)):
        sess = ort_session(_export_with_exact_symbolics(module, args, opset), 1)
        feed = {i.name: a.numpy() for i, a in zip(sess.get_inputs(), args)}
        np.testing.assert_allclose(sess.run(None, feed)[0], module(*args).numpy(), rtol=1e-5,
                                   atol=1e-5)
    ops = [n.op_type for n in onnx.load_from_string(
        _export_with_exact_symbolics(IndexAdd(), (base, rows, cols, index))).graph.node]
    assert "ScatterND" in ops


def test_exact_symbolics_are_restored():
    """Leaving the context hands the ops back to torch's own translations."""
    from torch.onnx._internal.torchscript_exporter.registration import registry

    with exact_symbolics():
        assert registry.get_function_group("aten::index_add").get(OPSET) is SYMBOLICS[1][1]
        # Col2Im is an opset-18 operator: an opset-17 export keeps torch's refusal
        assert registry.get_function_group("aten::col2im").get(OPSET) is not SYMBOLICS[2][1]
    assert registry.get_function_group("aten::index_add").get(OPSET) is not SYMBOLICS[1][1]
