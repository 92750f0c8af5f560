"""docs/adding_an_operator.md stays true: its code excerpts match the real source, what its
snippets import exists, and its runnable snippets run.

Conventions of the guide's ``python`` code blocks:

- a block whose first line is ``# <path>`` (a repository file) is an *excerpt* of that file:
  split at lines that are just ``...``, every piece must appear verbatim in the file;
- any other ``python`` block is *runnable*: it is executed on its own (a fresh namespace) and
  must not raise (its ``assert``\\ s are part of the check); when it prints and the next block
  is a ``text`` block, that block must be exactly what it printed.

Blocks of other languages (``text``) are not checked.
"""

from __future__ import annotations

import ast
import importlib
import os
import re

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
GUIDE = os.path.join(ROOT, "docs", "adding_an_operator.md")
FENCE = re.compile(r"^```(\w*)\n(.*?)^```\s*$", re.S | re.M)
EXCERPT = re.compile(r"^# ([\w./]+\.py)\s*$")


def _blocks() -> list[tuple[int, str, str]]:
    """(line number, language, code) of every fenced block of the guide."""
    with open(GUIDE, encoding="utf-8") as f:
        text = f.read()
    return [(text.count("\n", 0, m.start()) + 1, m.group(1), m.group(2))
            for m in FENCE.finditer(text)]


def _python_blocks() -> list[tuple[int, str]]:
    return [(line, code) for line, lang, code in _blocks() if lang == "python"]


def _excerpts() -> list[tuple[int, str, str]]:
    out = []
    for line, code in _python_blocks():
        first, _, rest = code.partition("\n")
        m = EXCERPT.match(first)
        if m:
            out.append((line, m.group(1), rest))
    return out


def _runnable() -> list[tuple[int, str, str | None]]:
    """(line, code, the text block right after it or None) of the runnable blocks."""
    blocks = _blocks()
    out = []
    for i, (line, lang, code) in enumerate(blocks):
        if lang != "python" or EXCERPT.match(code.partition("\n")[0]):
            continue
        after = blocks[i + 1] if i + 1 < len(blocks) else None
        out.append((line, code, after[2] if after and after[1] == "text" else None))
    return out


def _module_of(path: str) -> str:
    """``kiln/op/scan.py`` -> ``kiln.op.scan`` (the package relative imports resolve in)."""
    mod = path[:-3].replace("/", ".")
    return mod[: -len(".__init__")] if mod.endswith(".__init__") else mod


def _import_lines(code: str) -> list[str]:
    """Top-level-looking import statements of a snippet (excerpts need not parse as a whole)."""
    return [ln.strip() for ln in code.splitlines()
            if re.match(r"\s*(from\s+\S+\s+import\s|import\s)", ln) and "(" not in ln]


def _check_imports(code: str, package: str | None) -> None:
    for stmt in _import_lines(code):
        node = ast.parse(stmt).body[0]
        if isinstance(node, ast.Import):
            for alias in node.names:
                importlib.import_module(alias.name)
            continue
        assert isinstance(node, ast.ImportFrom)
        name = "." * node.level + (node.module or "")
        if node.level:
            assert package, f"relative import {stmt!r} outside an excerpt"
            module = importlib.import_module(name, _package_of(package))
        else:
            module = importlib.import_module(name)
        for alias in node.names:
            if alias.name == "*":
                continue
            if not hasattr(module, alias.name):  # a submodule, e.g. "from kiln import op"
                importlib.import_module(f"{module.__name__}.{alias.name}")


def _is_package(module: str) -> bool:
    return hasattr(importlib.import_module(module), "__path__")


def _package_of(module: str) -> str:
    """The package a module's relative imports are resolved against."""
    return module if _is_package(module) else module.rpartition(".")[0]


# ---------------------------------------------------------------------------------------------
def test_guide_has_the_expected_parts():
    blocks = _blocks()
    assert len(_excerpts()) >= 6 and len(_runnable()) >= 4, "the guide lost its code"
    with open(GUIDE, encoding="utf-8") as f:
        text = f.read()
    for heading in ("The attributes", "StructInfo inference", "CPU schedule", "The gradient",
                    "Python API", "ONNX: the converter", "Tests"):
        assert heading in text, heading
    assert all(lang in ("python", "text") for _, lang, _ in blocks)


@pytest.mark.parametrize("line, path, code", _excerpts(), ids=lambda v: str(v)[:40])
def test_excerpt_matches_source(line, path, code):
    with open(os.path.join(ROOT, path), encoding="utf-8") as f:
        source = f.read()
    pieces = re.split(r"^\.\.\.\s*$\n?", code, flags=re.M)
    for piece in pieces:
        piece = piece.strip("\n")
        if piece:
            assert piece in source, (
                f"docs/adding_an_operator.md line {line}: this excerpt is no longer in {path}:\n"
                f"{piece}"
            )
    _check_imports(code, _module_of(path))


@pytest.mark.parametrize("line, code, shown", _runnable(), ids=lambda v: str(v)[:40])
def test_runnable_snippet_runs(line, code, shown, capsys):
    _check_imports(code, None)
    namespace: dict = {"__name__": f"adding_an_operator_line_{line}"}
    exec(compile(code, f"docs/adding_an_operator.md:{line}", "exec"), namespace)  # noqa: S102
    printed = capsys.readouterr().out
    if printed and shown is not None:
        assert printed.strip() == shown.strip(), (
            f"docs/adding_an_operator.md line {line}: the text after this snippet is not what "
            f"it prints:\n{printed}"
        )


def test_excerpt_check_catches_drift():
    """The checker itself: an excerpt that differs from the file by one character fails."""
    (line, path, code), *_ = _excerpts()
    with open(os.path.join(ROOT, path), encoding="utf-8") as f:
        source = f.read()
    piece = next(p for p in re.split(r"^\.\.\.\s*$\n?", code, flags=re.M) if p.strip())
    piece = piece.strip("\n")
    assert piece in source
    assert piece.replace(":", ";", 1) not in source
