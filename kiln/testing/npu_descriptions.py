"""Hardware descriptions edited for a test: a shipped NPU description with some of its TOML
text rewritten (a faster DRAM channel, L0 buffers without bank groups...), saved where the
test can load it -- so a test states the one property it needs instead of a whole file."""

from __future__ import annotations

import re
from pathlib import Path

from ..target.npu import load_config
from ..target.npu.config import NPUConfig


def edited_description(folder: str | Path, name: str, *edits: tuple[str, str],
                       base: str = "default") -> tuple[str, NPUConfig]:
    """``(path, config)`` of description ``base`` renamed ``name`` with each ``(pattern,
    replacement)`` of ``edits`` applied to its TOML text (``re.sub``, multiline and dot-all),
    written to ``folder/<name>.toml``."""
    with open(load_config(base).path, encoding="utf-8") as f:
        text = f.read()
    text = re.sub(r"(?m)^name\s*=.*$", f'name = "{name}"', text)
    for pattern, replacement in edits:
        text = re.sub(pattern, replacement, text, flags=re.MULTILINE | re.DOTALL)
    path = Path(folder) / f"{name}.toml"
    path.write_text(text, encoding="utf-8")
    return str(path), load_config(str(path))
