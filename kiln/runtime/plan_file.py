"""Plans in an executable file: their JSON and their constants in one blob.

The CPU and the GPU executables save plans the same way: each plan's JSON (slot dtypes as
indices into the file's dtype table) carries a ``"constants"`` table of ``{slot, offset,
nbytes, shape}`` into one constants section (string constants, numpy object arrays, as
``{slot, strings, shape}``: their text in the JSON), and a ``"state"`` table (``{input, offset,
nbytes, shape}``: the executable's state, :attr:`Plan.state`, as it is when saved) into the
same section. Errors of a malformed table (KeyError, IndexError, TypeError, ValueError) are
left to the caller, which names the file.

A writer that knows where the section will sit in the file (``base``: its file offset) places
every constant at a file offset that is a multiple of ``memory_plan.ALIGN``; a reader that holds
the whole file at an aligned address (``kiln.load``: one aligned read, or a mapping of the file)
then uses each constant in place (``share``) instead of copying it into an aligned array: a
transformer's 300 MB of weights are neither copied again nor faulted into fresh memory (that
copy was most of loading such a model: 1.4 s of page faults on this kind of machine). The
offsets are explicit in the table, so files written either way read the same everywhere; a
constant that is not aligned (a file written without ``base``) is copied as before.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import numpy as np

from ..ir.dtype import DataType
from . import memory_plan
from .plan import Plan


def plans_to_json(plans: Mapping[str, Plan], dtypes: dict[DataType, int],
                  base: int | None = None) -> tuple[dict[str, Any], bytes]:
    """Each plan's JSON, by name, and the constants blob; every slot's dtype is registered in
    ``dtypes`` (dtype -> index, in order of first use). ``base``: the file offset the blob will
    be written at; each constant then starts at a multiple of ``memory_plan.ALIGN`` in the
    file (None: packed without padding)."""
    blob = bytearray()
    out = {}
    written: dict[int, tuple[int, int]] = {}  # id(constant) -> (offset, nbytes): each once
    for name, plan in plans.items():
        for spec in plan.slots:
            dtypes.setdefault(spec.dtype, len(dtypes))
        pj = plan.to_json(dtypes)
        text = {s for s in plan.constants if plan.slots[s].dtype.is_string}
        pj["constants"] = _table(plan.constants, "slot", blob, base, text, written)
        pj["state"] = _table(plan.state, "input", blob, base)
        out[name] = pj
    return out, bytes(blob)


def plans_from_json(data: Mapping[str, Any], dtypes: list[DataType], blob: Any,
                    share: bool = False) -> dict[str, Plan]:
    """The plans saved by :func:`plans_to_json` (``blob``: the constants section). ``share``:
    constants whose bytes sit at an aligned address are views of ``blob`` (which they keep
    alive), not copies; the caller must not change ``blob`` afterwards. The state is always
    copied (calls update it in place)."""
    plans = {}
    loaded: dict[tuple[Any, ...], np.ndarray] = {}  # one array per stored constant
    for name, pj in data.items():
        constants = {}
        for c in pj["constants"]:
            dtype = dtypes[pj["slots"][c["slot"]]["dtype"]]
            key = (c.get("offset"), c.get("nbytes"), str(dtype), tuple(c["shape"]))
            if "strings" in c or key not in loaded:
                loaded[key] = _array(c, dtype, blob, share)
            constants[c["slot"]] = loaded[key]
        slot_of = pj["input_slots"]
        state = {c["input"]: _array(c, dtypes[pj["slots"][slot_of[c["input"]]]["dtype"]], blob)
                 for c in pj.get("state", ())}
        plans[name] = Plan.from_json(pj, dtypes, constants, state)
    return plans


def _table(arrays: Mapping[int, np.ndarray], key: str, blob: bytearray, base: int | None,
           text: set[int] = frozenset(), written: dict[int, tuple[int, int]] | None = None
           ) -> list[dict[str, Any]]:
    """The table of ``arrays`` (by ``key``), their bytes appended to ``blob`` (each at an
    aligned file offset when ``base`` is given); the arrays of the keys in ``text`` are string
    tensors, saved as their text. ``written`` (constants: id of an array -> its offset and
    size) stores an array that several slots hold once: an unrolled recurrence's steps share
    one weight (an LSTM of 64 steps: 540 MB of copies in the file and in memory after loading,
    each step's product streaming its own copy from DRAM: 3.7x the time of the built one)."""
    table = []
    for k, arr in arrays.items():
        if k in text:
            table.append({key: k, "strings": [str(v) for v in arr.reshape(-1)],
                          "shape": list(arr.shape)})
            continue
        if written is not None and id(arr) in written:
            offset, nbytes = written[id(arr)]
            table.append({key: k, "offset": offset, "nbytes": nbytes, "shape": list(arr.shape)})
            continue
        if base is not None:
            blob += bytes(-(base + len(blob)) % memory_plan.ALIGN)
        data = np.ascontiguousarray(arr).tobytes()
        table.append({key: k, "offset": len(blob), "nbytes": len(data), "shape": list(arr.shape)})
        if written is not None:
            written[id(arr)] = (len(blob), len(data))
        blob += data
    return table


def _array(entry: Mapping[str, Any], dtype: DataType, blob: Any, share: bool = False
           ) -> np.ndarray:
    """The array a table entry describes: with ``share`` the bytes in ``blob`` themselves when
    they are aligned, else an aligned copy (a string tensor: an object array of ``str``)."""
    if "strings" in entry:
        strings = np.empty(len(entry["strings"]), object)
        strings[:] = [str(v) for v in entry["strings"]]
        return strings.reshape(entry["shape"])
    dt = dtype.to_numpy()
    raw = blob[entry["offset"]:entry["offset"] + entry["nbytes"]]
    view = np.frombuffer(raw, dtype=dt).reshape(entry["shape"])
    if share and view.__array_interface__["data"][0] % memory_plan.ALIGN == 0:
        return view
    arr = memory_plan.aligned_empty(entry["shape"], dt)
    arr[...] = view
    return arr
