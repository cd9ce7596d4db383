"""Tensor data on the wire: the binary form (HTTP blobs, gRPC raw contents, shared memory) and the JSON form.

Binary numeric tensors become numpy views over the request bytes (no copy). BYTES tensors are length-prefixed
elements (uint32 little-endian length, then the bytes) and become object arrays of ``bytes``.
"""

from __future__ import annotations

import math
import struct
from typing import Any

import numpy as np

from edged.core.datatypes import ELEMENT_SIZE_BY_WIRE_NAME, NUMPY_DTYPE_BY_WIRE_NAME
from edged.errors import EdgedError, ErrorCode, invalid_arg

_LENGTH = struct.Struct("<I")

# JSON numbers are accepted for a datatype when numpy infers one of these kinds from them; anything else (a
# string where a number is expected, a float for an integer tensor) is refused rather than silently cast.
_JSON_KINDS: dict[str, str] = {"b": "b", "u": "iu", "i": "iu", "f": "iuf"}


def element_count(shape: tuple[int, ...] | list[int]) -> int:
    return math.prod(shape)


def numpy_dtype(datatype: str) -> np.dtype[Any]:
    dtype = NUMPY_DTYPE_BY_WIRE_NAME.get(datatype)
    if dtype is None:
        raise invalid_arg(f"invalid datatype '{datatype}'")
    return dtype


def deserialize_bytes_tensor(buffer: bytes | memoryview, count: int | None = None) -> list[bytes]:
    """Split a length-prefixed BYTES buffer into its elements; checks every length against the buffer."""
    view = memoryview(buffer)
    end = len(view)
    out: list[bytes] = []
    offset = 0
    while offset < end:
        if offset + 4 > end:
            raise invalid_arg("incomplete length prefix in BYTES tensor data")
        (length,) = _LENGTH.unpack_from(view, offset)
        offset += 4
        if length > end - offset:
            raise invalid_arg(
                f"BYTES element of {length} bytes runs past the end of the tensor data ({end - offset} left)"
            )
        out.append(bytes(view[offset : offset + length]))
        offset += length
        if count is not None and len(out) > count:
            break
    return out


def serialize_bytes_tensor(array: np.ndarray[Any, Any]) -> bytes:
    parts: list[bytes] = []
    for item in array.ravel(order="C"):
        data = item.encode("utf-8") if isinstance(item, str) else item if isinstance(item, bytes) else bytes(item)
        parts.append(_LENGTH.pack(len(data)))
        parts.append(data)
    return b"".join(parts)


def array_from_binary(
    name: str, datatype: str, shape: tuple[int, ...], buffer: bytes | memoryview
) -> np.ndarray[Any, Any]:
    """The tensor ``name`` from its binary form; the byte size must be exactly what the shape needs."""
    count = element_count(shape)
    if datatype == "BYTES":
        elements = deserialize_bytes_tensor(buffer, count)
        if len(elements) != count:
            raise invalid_arg(
                f"unexpected number of string elements {len(elements)} for inference input '{name}', "
                f"expecting {count}"
            )
        array = np.empty(count, dtype=np.object_)
        array[:] = elements
        return array.reshape(shape)
    size = ELEMENT_SIZE_BY_WIRE_NAME.get(datatype)
    if size is None:
        raise invalid_arg(f"invalid datatype '{datatype}' for inference input '{name}'")
    expected = count * size
    if len(buffer) != expected:
        raise invalid_arg(
            f"unexpected total byte size {len(buffer)} for inference input '{name}', expecting {expected}"
        )
    return np.frombuffer(buffer, dtype=_binary_dtype(datatype)).reshape(shape)


def _binary_dtype(datatype: str) -> np.dtype[Any]:
    if datatype == "BF16":
        # numpy has no bfloat16: the bits travel as uint16 and backends that know BF16 reinterpret them.
        return np.dtype("<u2")
    return numpy_dtype(datatype)


def array_from_json(name: str, datatype: str, shape: tuple[int, ...], data: Any) -> np.ndarray[Any, Any]:
    """The tensor ``name`` from a JSON ``data`` field (flat or nested row-major arrays)."""
    if datatype in ("FP16", "BF16"):
        raise invalid_arg(
            f"receiving {datatype} data via JSON is not supported. Please use the binary data format for input "
            f"'{name}'"
        )
    count = element_count(shape)
    if not isinstance(data, list):
        data = [data]
    if datatype == "BYTES":
        flat = _flatten(data)
        if len(flat) != count:
            raise _shape_mismatch(name, count, len(flat))
        array = np.empty(count, dtype=np.object_)
        for i, item in enumerate(flat):
            if not isinstance(item, str):
                raise invalid_arg(f"unable to parse 'data' for input '{name}': expected a string")
            array[i] = item.encode("utf-8")
        return array.reshape(shape)
    dtype = numpy_dtype(datatype)
    try:
        parsed = np.asarray(data)
    except ValueError:
        # Ragged nesting: flatten it as Triton does and count what is there.
        parsed = np.asarray(_flatten(data))
    if parsed.size != count:
        raise _shape_mismatch(name, count, int(parsed.size))
    if parsed.size and parsed.dtype.kind not in _JSON_KINDS[dtype.kind]:
        raise invalid_arg(
            f"unable to parse 'data' for input '{name}': expected {datatype} values, got {parsed.dtype.kind!r}"
            " values"
        )
    if dtype.kind in "iu" and parsed.size:
        info = np.iinfo(dtype)
        if int(parsed.min()) < info.min or int(parsed.max()) > info.max:
            raise invalid_arg(f"unable to parse 'data' for input '{name}': value out of range for {datatype}")
    return parsed.astype(dtype, copy=False).reshape(shape)


def _shape_mismatch(name: str, expected: int, got: int) -> EdgedError:
    return EdgedError(
        ErrorCode.INVALID_ARG,
        f"unable to parse 'data' for input '{name}': shape does not match the {got} element(s) given, "
        f"expecting {expected}",
    )


def _flatten(data: list[Any]) -> list[Any]:
    out: list[Any] = []
    stack: list[Any] = [iter(data)]
    while stack:
        for item in stack[-1]:
            if isinstance(item, list):
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
    contiguous = np.ascontiguousarray(array)
    if contiguous.dtype.byteorder == ">":
        contiguous = contiguous.astype(contiguous.dtype.newbyteorder("<"))
    return memoryview(contiguous.data).cast("B")


def array_to_json(array: np.ndarray[Any, Any], datatype: str) -> list[Any]:
    if datatype in ("FP16", "BF16"):
        raise invalid_arg(
            f"sending {datatype} data via JSON is not supported. Please use the binary data format for output"
        )
    if datatype == "BYTES":
        return [
            item.decode("utf-8", errors="replace") if isinstance(item, bytes) else str(item)
            for item in array.ravel(order="C")
        ]
    flat: list[Any] = array.ravel(order="C").tolist()
    return flat
