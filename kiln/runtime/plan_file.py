"""Plans in an executable file: their JSON and their constants in one blob.

The CPU and the GPU executables save plans the same way: each plan's JSON (slot dtypes as
indices into the file's dtype table) carries a ``"constants"`` table of ``{slot, offset,
nbytes, shape}`` into one constants section (string constants, numpy object arrays, as
``{slot, strings, shape}``: their text in the JSON); loading copies each constant into an aligned
array. Errors of a malformed table (KeyError, IndexError, TypeError, ValueError) are left to
the caller, which names the file.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import numpy as np

from ..ir.dtype import DataType
from . import memory_plan
from .plan import Plan


def plans_to_json(plans: Mapping[str, Plan], dtypes: dict[DataType, int]
                  ) -> tuple[dict[str, Any], bytes]:
    """Each plan's JSON, by name, and the constants blob; every slot's dtype is registered in
    ``dtypes`` (dtype -> index, in order of first use)."""
    blob = bytearray()
    out = {}
    for name, plan in plans.items():
        for spec in plan.slots:
            dtypes.setdefault(spec.dtype, len(dtypes))
        pj = plan.to_json(dtypes)
        table = []
        for slot, arr in plan.constants.items():
            if plan.slots[slot].dtype.is_string:
                table.append({"slot": slot, "strings": [str(v) for v in arr.reshape(-1)],
                              "shape": list(arr.shape)})
                continue
            data = np.ascontiguousarray(arr).tobytes()
            table.append({"slot": slot, "offset": len(blob), "nbytes": len(data),
                          "shape": list(arr.shape)})
            blob += data
        pj["constants"] = table
        out[name] = pj
    return out, bytes(blob)


def plans_from_json(data: Mapping[str, Any], dtypes: list[DataType], blob: Any
                    ) -> dict[str, Plan]:
    """The plans saved by :func:`plans_to_json` (``blob``: the constants section)."""
    plans = {}
    for name, pj in data.items():
        constants = {}
        for c in pj["constants"]:
            if "strings" in c:
                strings = np.empty(len(c["strings"]), object)
                strings[:] = [str(v) for v in c["strings"]]
                constants[c["slot"]] = strings.reshape(c["shape"])
                continue
            dt = dtypes[pj["slots"][c["slot"]]["dtype"]].to_numpy()
            raw = blob[c["offset"]:c["offset"] + c["nbytes"]]
            const = memory_plan.aligned_empty(c["shape"], dt)
            const[...] = np.frombuffer(raw, dtype=dt).reshape(c["shape"])
            constants[c["slot"]] = const
        plans[name] = Plan.from_json(pj, dtypes, constants)
    return plans
