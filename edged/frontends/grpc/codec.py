"""KServe v2 protobuf messages to and from core objects, with Triton's rules and messages.

Checks run in the order Triton's gRPC frontend runs them (model version, request parameters, then per input
shared memory, typed ``contents`` or ``raw_input_contents``, then requested outputs), so a request with several
faults gets the message a Triton user expects; everything after that (data types, shapes, byte sizes) is the
core's.

Copies: protobuf hands out each ``bytes`` field as a new Python object, so every raw input is copied once out
of the request message (numpy then views that copy), and every numeric output is copied into a ``bytes`` object,
the only type a reply's bytes field takes. Neither copy can be avoided without writing our own wire format.
"""

from __future__ import annotations

import re
from typing import TYPE_CHECKING, Any, Final

import numpy as np

from edged.core.request.inference import InferInput, InferRequest, ParameterValue, RequestedOutput
from edged.core.request.tensors import array_to_binary, serialize_bytes_tensor
from edged.errors import EdgedError, ErrorCode, invalid_arg
from edged.proto import grpc_service_pb2 as pb

if TYPE_CHECKING:
    from edged.core.request.inference import InferResponse

# Request parameters that Triton reserves under the ``triton_`` prefix and a client may send.
ENABLE_EMPTY_FINAL_RESPONSE: Final = "triton_enable_empty_final_response"
FINAL_RESPONSE: Final = "triton_final_response"
_RESERVED_PREFIX: Final = "triton_"
_RESERVED_ALLOWED: Final = (ENABLE_EMPTY_FINAL_RESPONSE,)

# How std::stol reads a version string: leading blanks, a sign, then base-10 digits; anything after is ignored.
_STOL = re.compile(r"[ \t\n\v\f\r]*([+-]?[0-9]+)", re.ASCII)
_INT64_MIN: Final = -(2**63)
_INT64_MAX: Final = 2**63 - 1

# The typed ``contents`` field for each data type, the type Triton names the field after, and the numpy type
# the values are narrowed to. INT8/16 and UINT8/16 travel in 32-bit fields and keep their low bytes, as in
# Triton (little-endian), which is what numpy's narrowing cast does.
_CONTENTS: Final[tuple[str, ...]] = (
    "bool_contents",
    "int_contents",
    "int64_contents",
    "uint_contents",
    "uint64_contents",
    "fp32_contents",
    "fp64_contents",
    "bytes_contents",
)
_FIELD_TYPE: Final[dict[str, str]] = {
    "bool_contents": "BOOL",
    "int_contents": "INT32",
    "int64_contents": "INT64",
    "uint_contents": "UINT32",
    "uint64_contents": "UINT64",
    "fp32_contents": "FP32",
    "fp64_contents": "FP64",
    "bytes_contents": "BYTES",
}
_NARROW: Final[dict[tuple[str, str], str]] = {
    ("int_contents", "INT8"): "INT8",
    ("int_contents", "INT16"): "INT16",
    ("uint_contents", "UINT8"): "UINT8",
    ("uint_contents", "UINT16"): "UINT16",
}
_NUMPY: Final[dict[str, str]] = {
    "BOOL": "?",
    "INT8": "<i1",
    "INT16": "<i2",
    "INT32": "<i4",
    "INT64": "<i8",
    "UINT8": "<u1",
    "UINT16": "<u2",
    "UINT32": "<u4",
    "UINT64": "<u8",
    "FP32": "<f4",
    "FP64": "<f8",
}
# Data types Triton knows; any other name prints as "<invalid>" in its messages.
_KNOWN_TYPES: Final = frozenset((*_NUMPY, "FP16", "BF16", "BYTES"))


def parse_version(text: str) -> int:
    """A model version as Triton's GetModelVersionFromString reads it; empty means 'pick by policy' (-1)."""
    if not text:
        return -1
    match = _STOL.match(text)
    value = int(match.group(1)) if match is not None else None
    if value is None or not _INT64_MIN <= value <= _INT64_MAX:
        raise invalid_arg(
            f"failed to get model version from specified version string '{text}' (details: stol), version should "
            "be an integral value > 0"
        )
    if value < 0:
        raise invalid_arg(f"invalid model version specified '{text}' , version should be an integral value > 0")
    return value


# --- parameters -----------------------------------------------------------------------------------------


def parameter_value(parameter: Any) -> ParameterValue | None:
    """The value an InferParameter holds (uint64 as int), or None when none is set."""
    kind = parameter.WhichOneof("parameter_choice")
    if kind is None:
        return None
    value: ParameterValue = getattr(parameter, kind)
    return value


def set_parameter(target: Any, key: str, value: ParameterValue) -> None:
    """Writes ``value`` into the InferParameter map ``target`` under ``key``, choosing the field by type."""
    parameter = target[key]
    if isinstance(value, bool):
        parameter.bool_param = value
    elif isinstance(value, int):
        parameter.int64_param = value
    elif isinstance(value, float):
        parameter.double_param = value
    else:
        parameter.string_param = value


def _kind(parameter: Any) -> str | None:
    kind: str | None = parameter.WhichOneof("parameter_choice")
    return kind


def _request_parameters(request: Any) -> dict[str, ParameterValue]:
    """The request's parameters checked as SetInferenceRequestMetadata checks them."""
    out: dict[str, ParameterValue] = {}
    parameters = request.parameters
    if not len(parameters):
        return out  # the common case; iterating an empty map still costs a generic Mapping.items() view
    for key, parameter in parameters.items():
        kind = _kind(parameter)
        if key == "sequence_id":
            if kind not in ("int64_param", "string_param"):
                raise invalid_arg(
                    "invalid value type for 'sequence_id' parameter, expected int64_param or string_param."
                )
        elif key in ("sequence_start", "sequence_end"):
            if kind != "bool_param":
                raise invalid_arg(f"invalid value type for '{key}' parameter, expected bool_param.")
        elif key == "priority":
            if kind == "int64_param":
                if parameter.int64_param < 0:
                    raise invalid_arg("invalid value for 'priority', expected value >= 0.")
            elif kind != "uint64_param":
                raise invalid_arg("invalid value type for 'priority' parameter, expected int64_param or uint64_param.")
        elif key == "timeout":
            if kind != "int64_param":
                raise invalid_arg("invalid value type for 'timeout' parameter, expected int64_param.")
        elif key.startswith(_RESERVED_PREFIX):
            if key not in _RESERVED_ALLOWED:
                raise invalid_arg(
                    "parameter keys starting with 'triton_' are reserved for Triton usage. Only the following keys "
                    "starting with 'triton_' are allowed: " + " ".join(_RESERVED_ALLOWED)
                )
            if kind != "bool_param":
                raise invalid_arg(f"invalid value type for '{key}' parameter, expected bool_param.")
            # A setting of the stream reply, not a model parameter: it only changes what a decoupled model's
            # stream sends (an empty final response), so it is checked here and not passed on.
            continue
        elif kind not in ("int64_param", "bool_param", "string_param", "double_param"):
            # Triton's text predates double parameters, which it accepts too.
            raise invalid_arg(
                f"invalid value type for '{key}' parameter, expected int64_param, bool_param, or string_param."
            )
        value = parameter_value(parameter)
        if value is not None:
            out[key] = value
    return out


def _shared_memory_parameters(tensor: Any) -> dict[str, ParameterValue] | None:
    """The tensor's shared-memory parameters, checked as Triton's ParseSharedMemoryParams checks them; None when
    the tensor does not use shared memory."""
    params = tensor.parameters
    name = tensor.name
    region = params.get("shared_memory_region")
    if region is not None and _kind(region) != "string_param":
        raise invalid_arg(
            f"invalid value type for 'shared_memory_region' parameter for tensor '{name}', expected string_param."
        )
    out: dict[str, ParameterValue] = {}
    for key in ("shared_memory_offset", "shared_memory_byte_size"):
        parameter = params.get(key)
        if parameter is None:
            continue
        if region is None:
            raise invalid_arg(
                f"'{key}' can not be specified without 'shared_memory_region' parameter for tensor '{name}'"
            )
        if _kind(parameter) != "int64_param":
            raise invalid_arg(f"invalid value type for '{key}' parameter for tensor '{name}', expected int64_param.")
        out[key] = int(parameter.int64_param)
    if region is None:
        return None
    if "shared_memory_byte_size" not in out:
        raise invalid_arg(
            f"'shared_memory_byte_size' must be specified along with 'shared_memory_region' parameter for tensor "
            f"'{name}'"
        )
    out.setdefault("shared_memory_offset", 0)
    out["shared_memory_region"] = str(region.string_param)
    return out


def _other_parameters(tensor: Any, skip: tuple[str, ...]) -> dict[str, ParameterValue]:
    out: dict[str, ParameterValue] = {}
    for key, parameter in tensor.parameters.items():
        if key in skip:
            continue
        value = parameter_value(parameter)
        if value is not None:
            out[key] = value
    return out


_SHM_KEYS: Final = ("shared_memory_region", "shared_memory_offset", "shared_memory_byte_size")


# --- requests -------------------------------------------------------------------------------------------


def decode_infer_request(request: Any, version: int) -> InferRequest:
    """The core request for a ModelInferRequest whose model and version were already looked up."""
    model = request.model_name
    parameters = _request_parameters(request)
    raw_contents = request.raw_input_contents
    raw_count = len(raw_contents)
    raw_index = 0
    inputs: list[InferInput] = []
    for tensor in request.inputs:
        name = tensor.name
        datatype = tensor.datatype
        shape = tuple(tensor.shape)
        has_parameters = len(tensor.parameters) > 0
        shared_memory = _shared_memory_parameters(tensor) if has_parameters else None
        has_contents = tensor.HasField("contents")
        if shared_memory is not None:
            if has_contents:
                raise invalid_arg(
                    f"unexpected 'content' provided when using shared memory for input tensor '{name}' for model "
                    f"'{model}'"
                )
            shared_memory.update(_other_parameters(tensor, _SHM_KEYS))
            # No bytes on the wire: the core reads them from the registered region.
            inputs.append(InferInput(name, datatype, shape, None, None, shared_memory))
            continue
        if has_contents:
            if raw_count:
                raise invalid_arg(
                    f"contents field must not be specified when using raw_input_contents for '{name}' for model "
                    f"'{model}'"
                )
            raw: bytes | memoryview = _typed_contents(tensor, model)
        elif raw_index < raw_count:
            raw = raw_contents[raw_index]
            raw_index += 1
        else:
            raise invalid_arg(f"unable to find data for input tensor '{name}' for model '{model}' in request.")
        # The core checks the byte count against the shape once it has checked the shape, as Triton does.
        inputs.append(
            InferInput(name, datatype, shape, None, raw, _other_parameters(tensor, ()) if has_parameters else {})
        )
    requested = request.outputs
    outputs = [_requested_output(output) for output in requested] if len(requested) else None
    return InferRequest(model, version, request.id, inputs, outputs, parameters)


def _typed_contents(tensor: Any, model: str) -> bytes | memoryview:
    """The binary form of an input sent in typed ``contents`` fields, checked as Triton's InferGRPCToInput does:
    one field only, the field matching the input's data type."""
    contents = tensor.contents
    datatype = tensor.datatype
    declared = datatype if datatype in _KNOWN_TYPES else "<invalid>"
    found: bytes | memoryview | None = None
    for field in _CONTENTS:
        values = getattr(contents, field)
        if not len(values):
            continue
        if found is not None:
            raise invalid_arg(
                f"unexpected explicit tensor data for input tensor '{tensor.name}' for model '{model}', binary data "
                "was already supplied."
            )
        field_type = _NARROW.get((field, datatype), _FIELD_TYPE[field])
        if field_type != declared:
            raise invalid_arg(
                f"unexpected explicit tensor data for input tensor '{tensor.name}' for model '{model}' of type "
                f"'{field_type}', expected datatype '{declared}'"
            )
        if field == "bytes_contents":
            found = serialize_bytes_tensor(np.array(list(values), dtype=np.object_))
        else:
            # From Python ints/floats to the element type: one pass, one buffer.
            found = np.array(values, dtype=_wide(field)).astype(_NUMPY[field_type]).data.cast("B")
    return found if found is not None else b""


def _wide(field: str) -> str:
    # The field's own width first, so narrowing to INT8/16 keeps the low bytes instead of failing on range.
    return {"int_contents": "<i4", "uint_contents": "<u4"}.get(field, _NUMPY[_FIELD_TYPE[field]])


def _requested_output(output: Any) -> RequestedOutput:
    if not len(output.parameters):
        return RequestedOutput(output.name, 0, {})
    # Triton's order: shared-memory parameters, classification, then the two together.
    shared_memory = _shared_memory_parameters(output)
    classification = 0
    parameter = output.parameters.get("classification")
    if parameter is not None:
        if _kind(parameter) != "int64_param":
            raise invalid_arg("invalid value type for 'classification' parameter, expected int64_param")
        if parameter.int64_param <= 0:
            raise invalid_arg("invalid value for 'classification' parameter, expected >= 0")
        classification = int(parameter.int64_param)
    if shared_memory is not None and classification:
        raise invalid_arg("output can't set both 'shared_memory_region' and 'classification'")
    parameters = _other_parameters(output, ("classification", *_SHM_KEYS))
    if shared_memory is not None:
        parameters.update(shared_memory)
    return RequestedOutput(output.name, classification, parameters)


# --- responses ------------------------------------------------------------------------------------------


def encode_infer_response(response: InferResponse, message: Any) -> None:
    """Fills the ModelInferResponse ``message``: one ``raw_output_contents`` entry per output, in order, as the
    clients index them (an empty one for outputs written to shared memory)."""
    message.model_name = response.model_name
    message.model_version = response.model_version
    if response.id:
        message.id = response.id
    if response.parameters:
        for key, value in response.parameters.items():
            set_parameter(message.parameters, key, value)
    raw = message.raw_output_contents
    add_output = message.outputs.add
    for output in response.outputs:
        add_output(name=output.name, datatype=output.datatype, shape=output.shape)
        if output.in_shared_memory:
            # The bytes are in the client's region already; the reply only names the output.
            raw.append(b"")
            continue
        blob = array_to_binary(output.data, output.datatype)
        raw.append(blob if isinstance(blob, bytes) else blob.tobytes())


def encode_stream_error(request: Any, error: EdgedError) -> Any:
    """The stream reply for a request that failed: the error travels in the message, with the request's id only
    (as Triton answers errors found before the model runs), and the stream goes on."""
    reply = pb.ModelStreamInferResponse(error_message=error.message)
    reply.infer_response.id = request.id
    return reply


# --- metadata, statistics, repository -------------------------------------------------------------------


def internal_error() -> EdgedError:
    # What a client sees of a fault in the server itself; the details go to the log only.
    return EdgedError(ErrorCode.INTERNAL, "internal error")
