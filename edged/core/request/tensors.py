"""Tensor data on the wire: the binary form (HTTP blobs, gRPC raw contents, shared memory) and the JSON form.

Binary numeric tensors become numpy views over the request bytes (no copy). BYTES tensors are length-prefixed
elements (uint32 little-endian length, then the bytes) and become object arrays of ``bytes``.
"""

from __future__ import annotations

import math
import struct
from typing import Any

import numpy as np

from edged.core.request.datatypes import ELEMENT_SIZE_BY_WIRE_NAME, NUMPY_DTYPE_BY_WIRE_NAME
from edged.errors import EdgedError, ErrorCode, invalid_arg

_LENGTH = struct.Struct("<I")
# No tensor a request carries can have more elements than this (2**40, a terabyte of bytes); larger shapes are
# refused before numpy is asked to represent them.
MAX_ELEMENTS = 2**40
# Deeper nesting of a JSON `data` array than this is refused: no tensor has that many dimensions, and walking
# it costs the server while proving nothing.
MAX_JSON_DEPTH = 100


def element_count(shape: tuple[int, ...] | list[int]) -> int:
    return math.prod(shape)


_INT64_MAX = 2**63 - 1


def oversized(name: str, datatype: str, shape: tuple[int, ...] | list[int]) -> str | None:
    """Why a tensor of ``shape`` cannot be held (None when it can): Triton's words where its element count or byte
    size would overflow 64 bits, edged's past ``MAX_ELEMENTS``. Counted without zeros: a zero-sized tensor must
    still have dimensions numpy can represent."""
    count = math.prod(d for d in shape if d)
    if count <= MAX_ELEMENTS:
        return None
    shown = "[" + ",".join(str(d) for d in shape) + "]"
    if 0 in shape:  # holds nothing, so nothing overflows: only numpy's dimensions are at stake
        return f"input '{name}' has shape {shown}, more than {MAX_ELEMENTS} elements"
    if count > _INT64_MAX:
        return (
            f"invalid shape for input '{name}': shape {shown} causes total element count to exceed maximum size of "
            f"{_INT64_MAX}"
        )
    size = element_size(datatype) or 1
    if count * size > _INT64_MAX:
        return (
            f"byte size overflow for input '{name}': element count ({count}) * data type size ({size}) exceeds "
            f"maximum allowed size ({_INT64_MAX})"
        )
    return f"input '{name}' has shape {shown}, more than {MAX_ELEMENTS} elements"


def binary_dtype(datatype: str) -> np.dtype[Any] | None:
    if datatype == "BF16":
        # numpy has no bfloat16: the bits travel as uint16 and backends that know BF16 reinterpret them.
        return np.dtype("<u2")
    return NUMPY_DTYPE_BY_WIRE_NAME.get(datatype)


def element_size(datatype: str) -> int | None:
    return ELEMENT_SIZE_BY_WIRE_NAME.get(datatype)


def deserialize_bytes_tensor(buffer: bytes | memoryview, name: str, limit: int | None = None) -> list[bytes]:
    """Split a length-prefixed BYTES buffer; stops after ``limit + 1`` elements (the caller reports too many)."""
    view = memoryview(buffer)
    end = len(view)
    out: list[bytes] = []
    offset = 0
    while offset < end:
        if offset + 4 > end:
            raise invalid_arg(
                f"incomplete string length indicator for inference input '{name}', expecting 4 bytes but only "
                f"{end - offset} bytes available"
            )
        (length,) = _LENGTH.unpack_from(view, offset)
        offset += 4
        if length > end - offset:
            raise invalid_arg(
                f"incomplete string data for inference input '{name}', expecting string of length {length} but "
                f"only {end - offset} bytes available"
            )
        out.append(bytes(view[offset : offset + length]))
        offset += length
        if limit is not None and len(out) > limit:
            break
    return out


def serialize_bytes_tensor(array: np.ndarray[Any, Any]) -> bytes:
    parts: list[bytes] = []
    for item in array.ravel(order="C"):
        data = item.encode("utf-8") if isinstance(item, str) else item if isinstance(item, bytes) else bytes(item)
        parts.append(_LENGTH.pack(len(data)))
        parts.append(data)
    return b"".join(parts)


def bytes_array(elements: list[bytes], shape: tuple[int, ...]) -> np.ndarray[Any, Any]:
    array = np.empty(len(elements), dtype=np.object_)
    array[:] = elements
    return array.reshape(shape)


def _internal(message: str) -> EdgedError:
    # Triton reports JSON structure errors with its INTERNAL code (HTTP 500); clients see the same status here.
    return EdgedError(ErrorCode.INTERNAL, message)


def array_from_json(name: str, datatype: str, shape: tuple[int, ...], data: Any) -> np.ndarray[Any, Any]:
    """The tensor ``name`` from a JSON ``data`` field (flat or nested row-major arrays)."""
    if datatype in ("FP16", "BF16"):
        raise invalid_arg(
            f"receiving {datatype} data via JSON is not supported. Please use the binary data format for input {name}"
        )
    if datatype != "BYTES" and datatype not in NUMPY_DTYPE_BY_WIRE_NAME:
        raise invalid_arg(f"invalid datatype for input {name}")
    if not isinstance(data, list):
        raise _internal("Unable to parse 'data': attempt to access JSON non-array as array")
    refusal = oversized(name, datatype, shape)
    if refusal is not None:
        raise invalid_arg(refusal)
    count = element_count(shape)
    flat = _flatten(data)
    if len(flat) != count:
        raise _internal("Unable to parse 'data': Shape does not match true shape of 'data' field")
    if datatype == "BYTES":
        if not all(isinstance(item, str) for item in flat):
            raise _internal("Unable to parse JSON bytes array: attempt to access JSON non-string as string")
        return bytes_array([item.encode("utf-8") for item in flat], shape)
    dtype = NUMPY_DTYPE_BY_WIRE_NAME[datatype]
    assert dtype is not None
    kind = dtype.kind
    if kind == "b":
        if not all(isinstance(item, bool) for item in flat):
            raise _internal("Unable to parse 'data': attempt to access JSON non-boolean as boolean")
    elif kind in "iu":
        if not all(isinstance(item, int) and not isinstance(item, bool) for item in flat):
            signed = "signed" if kind == "i" else "unsigned"
            raise _internal(f"Unable to parse 'data': attempt to access JSON non-{signed}-integer as {signed}-integer")
        info = np.iinfo(dtype)
        if flat and (min(flat) < info.min or max(flat) > info.max):
            raise invalid_arg(f"unable to parse 'data' for input '{name}': a value is out of range for {datatype}")
    elif not all(isinstance(item, (int, float)) and not isinstance(item, bool) for item in flat):
        raise _internal("Unable to parse 'data': attempt to access JSON non-number as double")
    try:
        return np.array(flat, dtype=dtype).reshape(shape)
    except (OverflowError, ValueError):
        raise invalid_arg(
            f"unable to parse 'data' for input '{name}': a value is out of range for {datatype}"
        ) from None


def _flatten(data: list[Any]) -> list[Any]:
    # Fast path: the flat arrays that clients send are returned as they are.
    if not any(isinstance(item, list) for item in data):
        return data
    out: list[Any] = []
    stack: list[Any] = [iter(data)]
    while stack:
        for item in stack[-1]:
            if isinstance(item, list):
                if len(stack) >= MAX_JSON_DEPTH:
                    raise invalid_arg(f"JSON nesting depth exceeds maximum allowed limit ({MAX_JSON_DEPTH})")
                stack.append(iter(item))
                break
            out.append(item)
        else:
            stack.pop()
    return out


def array_to_binary(array: np.ndarray[Any, Any], datatype: str) -> bytes | memoryview:
    """The binary wire form; numeric arrays are returned as a view when already contiguous."""
    if datatype == "BYTES":
        return serialize_bytes_tensor(array)
    if array.size == 0:
        return b""
    contiguous = np.ascontiguousarray(array)
    if contiguous.dtype.byteorder == ">":
        contiguous = contiguous.astype(contiguous.dtype.newbyteorder("<"))
    return memoryview(contiguous.data).cast("B")


def array_to_json(array: np.ndarray[Any, Any], datatype: str, name: str = "") -> list[Any]:
    if datatype in ("FP16", "BF16"):
        raise invalid_arg(
            f"sending {datatype} data via JSON is not supported. Please use the binary data format for output"
        )
    if datatype == "BYTES":
        return _texts(array, name)
    flat: list[Any] = array.ravel(order="C").tolist()
    return flat


def _texts(array: np.ndarray[Any, Any], name: str) -> list[str]:
    """A BYTES tensor's elements as JSON strings. An element that is not UTF-8 fails the reply: replacing its bad
    bytes would hand the client different data than the model produced, and JSON has no form for raw bytes."""
    texts: list[str] = []
    for index, item in enumerate(array.ravel(order="C")):
        if not isinstance(item, bytes):
            texts.append(str(item))
            continue
        try:
            texts.append(item.decode("utf-8"))
        except UnicodeDecodeError as error:
            raise invalid_arg(
                f"output '{name}' element {index} is not UTF-8 ({error.reason} at byte {error.start}), which JSON "
                "cannot carry: request the output with binary_data=true to receive its bytes"
            ) from None
    return texts
