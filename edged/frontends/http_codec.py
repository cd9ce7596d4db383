"""The KServe v2 HTTP infer body, with Triton's binary tensor extension, to and from core objects.

A request body is a JSON header, optionally followed by binary blobs (one per input that sets
``parameters.binary_data_size``, in input order); ``Inference-Header-Content-Length`` says where the JSON ends.
Binary inputs become numpy views over the body: the bytes are not copied on the way in.
"""

from __future__ import annotations

from typing import Any

import msgspec

from edged.core.inference import InferInput, InferRequest, InferResponse, ParameterValue, RequestedOutput
from edged.core.tensors import array_from_binary, array_from_json, array_to_binary, array_to_json
from edged.errors import invalid_arg, unsupported

_decoder = msgspec.json.Decoder()
_encoder = msgspec.json.Encoder()

# Request parameters that Triton reserves; every other ``triton_`` name is refused.
_RESERVED_TRITON_PREFIX = "triton_"


def parse_header_length(value: str | None, body_length: int) -> int | None:
    """The JSON part's length from Inference-Header-Content-Length; None means the whole body is JSON."""
    if value is None:
        return None
    try:
        length = int(value)
    except ValueError:
        raise invalid_arg(f"Unable to parse inference header size, got: {value}") from None
    if length < 0 or length > body_length:
        raise invalid_arg(f"inference header size should be in range (0, {body_length}), got: {value}")
    return length


def decode_json(data: bytes | memoryview) -> Any:
    try:
        return _decoder.decode(data)
    except RecursionError:
        raise invalid_arg("failed to parse the request JSON buffer: JSON nesting is too deep") from None
    except msgspec.DecodeError as exc:
        raise invalid_arg(f"failed to parse the request JSON buffer: {exc}") from None


def decode_infer_request(
    model_name: str, model_version: int, body: bytes, header_length: int | None
) -> tuple[InferRequest, bool]:
    """The request, and whether every output should be binary unless an output says otherwise."""
    view = memoryview(body)
    header = decode_json(view if header_length is None else view[:header_length])
    if not isinstance(header, dict):
        raise invalid_arg("failed to parse the request JSON buffer: the request must be a JSON object")
    binary_offset = len(body) if header_length is None else header_length

    request_id = header.get("id", "")
    if not isinstance(request_id, str):
        raise invalid_arg("the request 'id' must be a string")
    parameters, binary_output = _request_parameters(header.get("parameters"))

    raw_inputs = header.get("inputs")
    if not isinstance(raw_inputs, list):
        raise invalid_arg("the request must specify 'inputs' as an array")
    inputs: list[InferInput] = []
    for raw in raw_inputs:
        tensor, binary_offset = _decode_input(raw, view, binary_offset, header_length is not None)
        inputs.append(tensor)
    if binary_offset != len(body):
        raise invalid_arg("unexpected additional input data")

    outputs: list[RequestedOutput] | None = None
    raw_outputs = header.get("outputs")
    if raw_outputs is not None:
        if not isinstance(raw_outputs, list):
            raise invalid_arg("the request 'outputs' must be an array")
        outputs = [_decode_output(raw) for raw in raw_outputs]
    request = InferRequest(model_name, model_version, request_id, inputs, outputs, parameters)
    return request, binary_output


def _request_parameters(raw: Any) -> tuple[dict[str, ParameterValue], bool]:
    if raw is None:
        return {}, False
    if not isinstance(raw, dict):
        raise invalid_arg("the request 'parameters' must be a JSON object")
    parameters: dict[str, ParameterValue] = {}
    binary_output = False
    for key, value in raw.items():
        if key.startswith(_RESERVED_TRITON_PREFIX):
            raise invalid_arg(f"parameter keys starting with 'triton_' are reserved for Triton usage: {key}")
        if key == "binary_data_output":
            if not isinstance(value, bool):
                raise invalid_arg("parameter 'binary_data_output' must be a boolean")
            binary_output = value
            continue
        if not isinstance(value, (bool, int, float, str)):
            raise invalid_arg(f"parameter '{key}' must be a boolean, a number or a string")
        parameters[key] = value
    return parameters, binary_output


def _decode_input(raw: Any, body: memoryview, offset: int, has_binary: bool) -> tuple[InferInput, int]:
    if not isinstance(raw, dict):
        raise invalid_arg("each entry of 'inputs' must be a JSON object")
    name = raw.get("name")
    if not isinstance(name, str):
        raise invalid_arg("input must specify 'name' as a string")
    datatype = raw.get("datatype")
    if not isinstance(datatype, str):
        raise invalid_arg(f"input '{name}' must specify 'datatype' as a string")
    raw_shape = raw.get("shape")
    if not isinstance(raw_shape, list) or not all(
        isinstance(d, int) and not isinstance(d, bool) and d >= 0 for d in raw_shape
    ):
        raise invalid_arg(f"input '{name}' must specify 'shape' as an array of non-negative integers")
    shape = tuple(raw_shape)
    params = raw.get("parameters") or {}
    if not isinstance(params, dict):
        raise invalid_arg(f"input '{name}' 'parameters' must be a JSON object")
    binary_size = params.get("binary_data_size")
    has_data = "data" in raw
    has_shm = "shared_memory_region" in params
    if has_data + (binary_size is not None) + has_shm != 1:
        raise invalid_arg(
            f"Input '{name}' must set only one of the following fields: 'data', 'binary_data_size' in "
            "'parameters', 'shared_memory_region' in 'parameters'"
        )
    if has_shm:
        raise unsupported("shared memory support is disabled")
    if binary_size is not None:
        if not isinstance(binary_size, int) or isinstance(binary_size, bool) or binary_size < 0:
            raise invalid_arg(f"input '{name}' 'binary_data_size' must be a non-negative integer")
        if not has_binary:
            raise invalid_arg(
                f"must specify valid 'Infer-Header-Content-Length' in request header and 'binary_data_size' "
                f"when passing inputs in binary data format, input '{name}'"
            )
        end = offset + binary_size
        if end > len(body):
            raise invalid_arg(
                f"unexpected size for input '{name}', expecting {binary_size} bytes but only "
                f"{len(body) - offset} bytes remain in the request body"
            )
        data = array_from_binary(name, datatype, shape, body[offset:end])
        offset = end
    else:
        data = array_from_json(name, datatype, shape, raw["data"])
    tensor_params = {k: v for k, v in params.items() if k != "binary_data_size" and _is_scalar(v)}
    return InferInput(name, datatype, shape, data, tensor_params), offset


def _decode_output(raw: Any) -> RequestedOutput:
    if not isinstance(raw, dict) or not isinstance(raw.get("name"), str):
        raise invalid_arg("each entry of 'outputs' must be a JSON object with a 'name'")
    params = raw.get("parameters") or {}
    if not isinstance(params, dict):
        raise invalid_arg(f"output '{raw['name']}' 'parameters' must be a JSON object")
    if "shared_memory_region" in params:
        raise unsupported("shared memory support is disabled")
    classification = params.get("classification", 0)
    if not isinstance(classification, int) or isinstance(classification, bool) or classification < 0:
        raise invalid_arg(f"output '{raw['name']}' 'classification' must be a non-negative integer")
    binary = params.get("binary_data")
    if binary is not None and not isinstance(binary, bool):
        raise invalid_arg(f"output '{raw['name']}' 'binary_data' must be a boolean")
    kept = {k: v for k, v in params.items() if _is_scalar(v)}
    return RequestedOutput(raw["name"], classification, kept)


def _is_scalar(value: Any) -> bool:
    return isinstance(value, (bool, int, float, str))


def raw_binary_request(
    model_name: str, model_version: int, input_name: str, datatype: str, shape: tuple[int, ...], body: bytes
) -> InferRequest:
    """A request whose body is the single input's bytes (Inference-Header-Content-Length: 0)."""
    data = array_from_binary(input_name, datatype, shape, memoryview(body))
    return InferRequest(model_name, model_version, "", [InferInput(input_name, datatype, shape, data)])


def encode_infer_response(
    response: InferResponse, requested: list[RequestedOutput] | None, binary_default: bool
) -> tuple[bytes, int | None]:
    """The reply body, and the JSON header's length when binary blobs follow it (None for pure JSON)."""
    wants_binary: dict[str, bool] = {}
    if requested is not None:
        for wanted in requested:
            flag = wanted.parameters.get("binary_data")
            wants_binary[wanted.name] = flag if isinstance(flag, bool) else binary_default
    outputs: list[dict[str, Any]] = []
    blobs: list[bytes | memoryview] = []
    for output in response.outputs:
        entry: dict[str, Any] = {
            "name": output.name,
            "datatype": output.datatype,
            "shape": list(output.shape),
        }
        if wants_binary.get(output.name, binary_default):
            blob = array_to_binary(output.data, output.datatype)
            entry["parameters"] = {"binary_data_size": len(blob)}
            if len(blob):
                blobs.append(blob)
        else:
            entry["data"] = array_to_json(output.data, output.datatype)
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
