"""The classification extension: an output replaced by its top-K entries as "value:index[:label]" strings."""

from __future__ import annotations

import math
from typing import Any, Final

import numpy as np

from edged.errors import invalid_arg

# The most elements one output may have to be classified (sorted): Triton's bound.
MAX_CLASSIFIED_ELEMENTS: Final = 1_000_000
_CLASSIFIABLE = frozenset({"UINT8", "UINT16", "UINT32", "UINT64", "INT8", "INT16", "INT32", "INT64", "FP32", "FP64"})


def classify(
    datatype: str, array: np.ndarray[Any, Any], k: int, labels: list[str] | None, batching: bool
) -> np.ndarray[Any, Any]:
    """Top-``k`` classes of each batch item (or of the whole tensor without batching), as a BYTES array."""
    if datatype not in _CLASSIFIABLE:
        raise invalid_arg(f"class result not available for output due to unsupported type '{datatype}'")
    if array.size > MAX_CLASSIFIED_ELEMENTS:  # Triton's bound on the sort a client can ask for
        raise invalid_arg("classification output tensor too large")
    if batching and array.ndim > 0:
        rows = array.reshape(array.shape[0], math.prod(array.shape[1:]))
    else:
        rows = array.reshape(1, array.size)
    count = min(k, rows.shape[1])
    result = np.empty((rows.shape[0], count), dtype=np.object_)
    for r, row in enumerate(rows):
        # A stable sort keeps the lower index first among equal values, as a reader expects.
        top = np.argsort(-row.astype(np.float64), kind="stable")[:count]
        for c, index in enumerate(top):
            text = f"{_format_value(row[index])}:{index}"
            if labels is not None and index < len(labels):
                text += f":{labels[index]}"
            result[r, c] = text.encode("utf-8")
    return result if batching else result.reshape(count)


def _format_value(value: Any) -> str:
    if isinstance(value, np.floating):
        return f"{float(value):f}"
    return str(value)
