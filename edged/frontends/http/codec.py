"""The KServe v2 HTTP infer body, with Triton's binary tensor extension, to and from core objects.

A request body is a JSON header, optionally followed by binary blobs (one per input that sets
``parameters.binary_data_size``, in input order); ``Inference-Header-Content-Length`` says where the JSON ends.
Binary inputs become numpy views over the body: the bytes are not copied on the way in.
"""

from __future__ import annotations

import re
from typing import Any, Final

import msgspec

from edged.core.request.inference import InferInput, InferRequest, InferResponse, ParameterValue, RequestedOutput
from edged.core.request.tensors import array_from_json, array_to_binary, array_to_json
from edged.errors import EdgedError, ErrorCode, invalid_arg

_decoder = msgspec.json.Decoder()
_encoder = msgspec.json.Encoder()

# Request parameters that Triton reserves; every other ``triton_`` name is refused.
_RESERVED_TRITON_PREFIX = "triton_"
# Deepest nesting of JSON arrays and objects accepted (Triton's limit); --http-max-json-depth sets it for infer.
DEFAULT_MAX_JSON_DEPTH: Final = 100
# Bodies up to this size are copied to count their brackets (see _nested_deeper); larger ones are walked.
_COUNTED_MAX = 64 * 1024
_CONTAINERS: Final = (list, dict)


def parse_header_length(value: str | None, body_length: int) -> int | None:
    """The JSON part's length from Inference-Header-Content-Length; None means the whole body is JSON.

    A value that is not a number reads as 0 (a raw binary request), as Triton's atoi-based parser reads it.
    """
    if value is None:
        return None
    text = value.strip()
    digits = text[1:] if text[:1] in "+-" else text
    length = int(text) if digits.isascii() and digits.isdigit() and len(digits) <= 20 else 0
    if length < 0 or length > body_length:
        raise invalid_arg(f"inference header size should be in range (0, {body_length}), got: {value}")
    return length


def _internal(message: str) -> EdgedError:
    # Triton answers JSON structure errors with its INTERNAL code (HTTP 500); tritonclient users see the same.
    return EdgedError(ErrorCode.INTERNAL, message)


def _too_deep(max_depth: int) -> EdgedError:
    return invalid_arg(f"JSON nesting depth exceeds maximum allowed limit ({max_depth})")


def decode_json(data: bytes | memoryview, max_depth: int = DEFAULT_MAX_JSON_DEPTH) -> Any:
    try:
        document = _decoder.decode(data)
    except RecursionError:
        raise _too_deep(max_depth) from None
    except msgspec.DecodeError as exc:
        raise _internal(f"failed to parse the request JSON buffer: {exc}") from None
    except UnicodeDecodeError as exc:
        # msgspec raises this, not DecodeError, for a string holding bytes that are not UTF-8.
        raise _internal(
            f"failed to parse the request JSON buffer: a string is not valid UTF-8 ({exc.reason})"
        ) from None
    return _within_depth(data, document, max_depth)


def _within_depth(data: bytes | memoryview, document: Any, max_depth: int) -> Any:
    """``document``, once it is known to nest no deeper than ``max_depth``. The parser's own bound is the
    interpreter's recursion limit, which lets a document ten times deeper than Triton's limit through, and what
    walks it later (numpy's conversion of nested lists, for one) would recurse as deep again."""
    if _nested_deeper(data, document, max_depth):
        raise _too_deep(max_depth)
    return document


def _nested_deeper(data: bytes | memoryview, document: Any, max_depth: int) -> bool:
    text = data if isinstance(data, bytes) else data.tobytes() if len(data) <= _COUNTED_MAX else None
    if text is not None and text.count(b"[") + text.count(b"{") <= max_depth:
        return False  # too few brackets to nest that deep: most bodies end here
    level = [document] if isinstance(document, _CONTAINERS) else []
    depth = 0
    while level:
        depth += 1
        if depth > max_depth:
            return True
        deeper: list[Any] = []
        for node in level:
            children = node.values() if isinstance(node, dict) else node
            # A tensor's rows of numbers hold no containers: one pass in C finds that, without a loop per number.
            kinds = set(map(type, children))
            if list in kinds or dict in kinds:
                deeper.extend(child for child in children if isinstance(child, _CONTAINERS))
        level = deeper
    return False


_TRAILING = re.compile(r"trailing characters \(byte (\d+)\)")


def _decode_leading_json(body: memoryview, max_depth: int) -> Any:
    """The JSON document at the start of a body sent without Inference-Header-Content-Length.

    Anything after it is still part of "the JSON" as far as binary inputs are concerned (so they find no bytes
    left and say so), but the document itself parses, as Triton's parser stops at its end.
    """
    try:
        return _within_depth(body, _decoder.decode(body), max_depth)
    except msgspec.DecodeError as exc:
        match = _TRAILING.search(str(exc))
        if match is None:
            return decode_json(body, max_depth)
        # msgspec counts bytes from 1: the document ends just before the byte it names.
        return decode_json(body[: int(match.group(1)) - 1], max_depth)
    except RecursionError:
        raise _too_deep(max_depth) from None
    except UnicodeDecodeError:
        return decode_json(body, max_depth)  # says which string is not UTF-8


def _member(obj: dict[str, Any], key: str, kind: type | tuple[type, ...], what: str) -> Any:
    if key not in obj:
        raise _internal(f"Unable to parse '{key}': attempt to access non-existing object member '{key}'")
    value = obj[key]
    if not isinstance(value, kind) or (isinstance(value, bool) and kind is not bool):
        raise _internal(f"Unable to parse '{key}': attempt to access JSON {what}")
    return value


def _optional_bool(obj: dict[str, Any], key: str) -> bool | None:
    value = obj.get(key)
    if value is not None and not isinstance(value, bool):
        raise _internal(f"Unable to parse '{key}': attempt to access JSON non-boolean as boolean")
    return value


def _unsigned(obj: dict[str, Any], key: str) -> int | None:
    value = obj.get(key)
    if value is None:
        return None
    if not isinstance(value, int) or isinstance(value, bool) or value < 0:
        raise _internal(f"Unable to parse '{key}': attempt to access JSON non-unsigned-integer as unsigned-integer")
    return value


def decode_infer_request(
    model_name: str,
    model_version: int,
    body: bytes,
    header_length: int | None,
    max_json_depth: int = DEFAULT_MAX_JSON_DEPTH,
) -> tuple[InferRequest, bool]:
    """The request, and whether every output should be binary unless an output says otherwise."""
    view = memoryview(body)
    if header_length is None:
        header = _decode_leading_json(view, max_json_depth)
    else:
        header = decode_json(view[:header_length], max_json_depth)
    if not isinstance(header, dict):
        raise _internal("Unable to parse 'inputs': attempt to access non-existing object member 'inputs'")
    offset = len(body) if header_length is None else header_length

    request_id = header.get("id", "")
    if not isinstance(request_id, str):
        raise _internal("Unable to parse 'id': attempt to access JSON non-string as string")
    raw_params = header.get("parameters")
    parameters, binary_output = _request_parameters(raw_params if raw_params is not None else {})

    raw_inputs = _member(header, "inputs", list, "non-array as array")
    inputs: list[InferInput] = []
    for raw in raw_inputs:
        if not isinstance(raw, dict):
            raise _internal("Unable to parse 'inputs': attempt to access JSON non-object as object")
        tensor, offset = _decode_input(model_name, raw, view, offset)
        inputs.append(tensor)
    if offset != len(body):
        raise invalid_arg(f"unexpected additional input data for model '{model_name}'")

    outputs: list[RequestedOutput] | None = None
    if "outputs" in header:
        raw_outputs = _member(header, "outputs", list, "non-array as array")
        # An empty list asks for nothing in particular: every output, as when the member is absent.
        outputs = [_decode_output(raw) for raw in raw_outputs] or None
    request = InferRequest(model_name, model_version, request_id, inputs, outputs, parameters)
    return request, binary_output


def _request_parameters(raw: Any) -> tuple[dict[str, ParameterValue], bool]:
    if not isinstance(raw, dict):
        raise _internal("Unable to parse 'parameters': attempt to access JSON non-object as object")
    parameters: dict[str, ParameterValue] = {}
    for key, value in raw.items():
        if key.startswith(_RESERVED_TRITON_PREFIX):
            raise invalid_arg(
                "parameter keys starting with 'triton_' are reserved for Triton usage and should not be specified."
            )
        if not isinstance(value, (bool, int, float, str)):
            raise invalid_arg(f"parameter '{key}' has invalid type. It should be either 'int', 'bool', or 'string'.")
        parameters[key] = value
    binary_output = _optional_bool(raw, "binary_data_output")
    parameters.pop("binary_data_output", None)
    # The sequence batcher's flags, checked as Triton checks them.
    _optional_bool(raw, "sequence_start")
    _optional_bool(raw, "sequence_end")
    return parameters, bool(binary_output)


def _decode_input(model: str, raw: dict[str, Any], body: memoryview, offset: int) -> tuple[InferInput, int]:
    name = _member(raw, "name", str, "non-string as string")
    datatype = _member(raw, "datatype", str, "non-string as string")
    raw_shape = _member(raw, "shape", list, "non-array as array")
    for dim in raw_shape:
        if not isinstance(dim, int) or isinstance(dim, bool) or dim < 0:
            raise _internal("Unable to parse 'shape': attempt to access JSON non-unsigned-integer as unsigned-integer")
    shape = tuple(raw_shape)
    params = raw.get("parameters") or {}
    if not isinstance(params, dict):
        raise _internal("Unable to parse 'parameters': attempt to access JSON non-object as object")
    sources = [
        key
        for key, present in (
            ("data", "data" in raw),
            ("binary_data_size", "binary_data_size" in params),
            ("shared_memory_region", "shared_memory_region" in params),
        )
        if present
    ]
    if len(sources) != 1:
        detail = " no field is set" if not sources else " set " + " ".join(f"'{k}'" for k in sources)
        raise invalid_arg(
            "Input must set only one of the following fields: 'data', 'binary_data_size' in 'parameters', "
            f"'shared_memory_region' in 'parameters'. But{detail}"
        )
    kept = {k: v for k, v in params.items() if k != "binary_data_size" and isinstance(v, (bool, int, float, str))}
    if sources[0] == "shared_memory_region":
        # The core reads the tensor from the registered region (edged.core.shared_memory).
        _member(params, "shared_memory_region", str, "non-string as string")
        if _unsigned(params, "shared_memory_byte_size") is None:
            raise _internal(
                "Unable to parse 'shared_memory_byte_size': attempt to access non-existing object member "
                "'shared_memory_byte_size'"
            )
        _unsigned(params, "shared_memory_offset")
        return InferInput(name, datatype, shape, None, None, kept), offset
    if sources[0] == "data":
        return InferInput(
            name, datatype, shape, array_from_json(name, datatype, shape, raw["data"]), None, kept
        ), offset
    size = _unsigned(params, "binary_data_size")
    assert size is not None
    end = offset + size
    if end > len(body):
        raise invalid_arg(
            f"unexpected size for input '{name}', expecting {end - len(body)} additional bytes for model '{model}'"
        )
    return InferInput(name, datatype, shape, None, body[offset:end], kept), end


def _decode_output(raw: Any) -> RequestedOutput:
    if not isinstance(raw, dict):
        raise _internal("Unable to parse 'outputs': attempt to access JSON non-object as object")
    name = _member(raw, "name", str, "non-string as string")
    params = raw.get("parameters") or {}
    if not isinstance(params, dict):
        raise _internal("Unable to parse 'parameters': attempt to access JSON non-object as object")
    classification = _unsigned(params, "classification") or 0
    binary = _optional_bool(params, "binary_data")
    if "shared_memory_region" in params:
        if classification:
            raise invalid_arg("Output can't set both 'shared_memory_region' and 'classification'")
        if binary:
            raise invalid_arg("Output can't set both 'shared_memory_region' and 'binary_data'")
        _member(params, "shared_memory_region", str, "non-string as string")
        _unsigned(params, "shared_memory_byte_size")
        _unsigned(params, "shared_memory_offset")
    kept = {k: v for k, v in params.items() if isinstance(v, (bool, int, float, str))}
    return RequestedOutput(name, classification, kept)


def encode_infer_response(
    response: InferResponse, requested: list[RequestedOutput] | None, binary_default: bool
) -> tuple[bytes, int | None]:
    """The reply body, and the JSON header's length when binary blobs follow it (None for pure JSON)."""
    wants_binary: dict[str, bool] = {}
    if requested is not None:
        for wanted in requested:
            flag = wanted.parameters.get("binary_data")
            # binary_data_output only covers the outputs a request does not name: a named output is JSON unless
            # it asks for binary itself, as Triton reads it.
            wants_binary[wanted.name] = flag if isinstance(flag, bool) else False
    outputs: list[dict[str, Any]] = []
    blobs: list[bytes | memoryview] = []
    for output in response.outputs:
        entry: dict[str, Any] = {
            "name": output.name,
            "datatype": output.datatype,
            "shape": list(output.shape),
        }
        if output.in_shared_memory:
            pass  # the client reads it from its region; the reply only names it
        elif wants_binary.get(output.name, binary_default):
            blob = array_to_binary(output.data, output.datatype)
            entry["parameters"] = {"binary_data_size": len(blob)}
            if len(blob):
                blobs.append(blob)
        else:
            entry["data"] = array_to_json(output.data, output.datatype, output.name)
        outputs.append(entry)
    header: dict[str, Any] = {}
    if response.id:
        header["id"] = response.id
    header["model_name"] = response.model_name
    header["model_version"] = response.model_version
    if response.parameters:
        header["parameters"] = response.parameters
    header["outputs"] = outputs
    encoded = _encoder.encode(header)
    if not blobs:
        return encoded, None
    return b"".join([encoded, *blobs]), len(encoded)


def error_body(message: str) -> bytes:
    return _encoder.encode({"error": message})


def encode(value: Any) -> bytes:
    return _encoder.encode(value)


def url_version(text: str | None) -> int:
    """A version from a URL path (digits only, as the routes match): -1 when absent, Triton's error past int64."""
    if not text:
        return -1
    value = int(text)
    if value >= 2**63:
        raise invalid_arg(
            f"failed to get model version from specified version string '{text}' (details: stol), version should be "
            "an integral value > 0"
        )
    return value
