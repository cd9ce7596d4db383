"""Tensor element types: the config enum (``TYPE_FP32``), the wire name (``FP32``) and the numpy dtype.

The wire name is the config name without ``TYPE_``, except that ``TYPE_STRING`` travels as ``BYTES``.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from edged.errors import invalid_arg
from edged.proto import model_config_pb2 as mc

WIRE_NAME_BY_CONFIG: dict[int, str] = {
    mc.TYPE_BOOL: "BOOL",
    mc.TYPE_UINT8: "UINT8",
    mc.TYPE_UINT16: "UINT16",
    mc.TYPE_UINT32: "UINT32",
    mc.TYPE_UINT64: "UINT64",
    mc.TYPE_INT8: "INT8",
    mc.TYPE_INT16: "INT16",
    mc.TYPE_INT32: "INT32",
    mc.TYPE_INT64: "INT64",
    mc.TYPE_FP16: "FP16",
    mc.TYPE_FP32: "FP32",
    mc.TYPE_FP64: "FP64",
    mc.TYPE_STRING: "BYTES",
    mc.TYPE_BF16: "BF16",
}
CONFIG_BY_WIRE_NAME: dict[str, int] = {wire: config for config, wire in WIRE_NAME_BY_CONFIG.items()}

# Little-endian on purpose: that is the byte order of every binary tensor on the wire, whatever the host.
NUMPY_DTYPE_BY_WIRE_NAME: dict[str, np.dtype[Any] | None] = {
    "BOOL": np.dtype(np.bool_),
    "UINT8": np.dtype("<u1"),
    "UINT16": np.dtype("<u2"),
    "UINT32": np.dtype("<u4"),
    "UINT64": np.dtype("<u8"),
    "INT8": np.dtype("<i1"),
    "INT16": np.dtype("<i2"),
    "INT32": np.dtype("<i4"),
    "INT64": np.dtype("<i8"),
    "FP16": np.dtype("<f2"),
    "FP32": np.dtype("<f4"),
    "FP64": np.dtype("<f8"),
    "BYTES": np.dtype(np.object_),
    # numpy has no bfloat16.
    "BF16": None,
}

# Bytes per element in the binary form; BYTES elements vary in size.
ELEMENT_SIZE_BY_WIRE_NAME: dict[str, int | None] = {
    "BOOL": 1,
    "UINT8": 1,
    "UINT16": 2,
    "UINT32": 4,
    "UINT64": 8,
    "INT8": 1,
    "INT16": 2,
    "INT32": 4,
    "INT64": 8,
    "FP16": 2,
    "FP32": 4,
    "FP64": 8,
    "BYTES": None,
    "BF16": 2,
}

_WIRE_NAME_BY_KIND_AND_SIZE: dict[tuple[str, int], str] = {
    ("b", 1): "BOOL",
    ("u", 1): "UINT8",
    ("u", 2): "UINT16",
    ("u", 4): "UINT32",
    ("u", 8): "UINT64",
    ("i", 1): "INT8",
    ("i", 2): "INT16",
    ("i", 4): "INT32",
    ("i", 8): "INT64",
    ("f", 2): "FP16",
    ("f", 4): "FP32",
    ("f", 8): "FP64",
}


def wire_name_for_numpy(dtype: np.dtype[Any] | type[Any] | str) -> str:
    """The wire name for a numpy dtype, in any byte order; object, bytes and str arrays are ``BYTES``."""
    dt = np.dtype(dtype)
    if dt.kind in "OSU":
        return "BYTES"
    name = _WIRE_NAME_BY_KIND_AND_SIZE.get((dt.kind, dt.itemsize))
    if name is None:
        raise invalid_arg(f"numpy dtype '{dt}' has no Triton datatype")
    return name
