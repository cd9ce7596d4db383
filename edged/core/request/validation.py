"""Checking an inference request against the model it is for, before it is scheduled.

This is on every request's path: the model's tensors are compiled once at load into a ``ModelSignature`` of
plain dicts and tuples, so a check is a few lookups and comparisons. The checks run in Triton's order (requested
outputs, input count, input names, batch dimension, then per input data type, shape and byte size) so a request
with several faults gets the message a Triton user expects.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import numpy as np

from edged.core.request.datatypes import WIRE_NAME_BY_CONFIG
from edged.core.request.tensors import (
    binary_dtype,
    bytes_array,
    deserialize_bytes_tensor,
    element_count,
    element_size,
    oversized,
)
from edged.errors import EdgedError, ErrorCode

if TYPE_CHECKING:
    from edged.core.request.inference import InferInput, InferRequest
    from edged.proto.model_config_pb2 import ModelConfig

_BATCH_NOTE = (
    " NOTE: Setting a non-zero max_batch_size in the model config requires a batch dimension to be prepended to "
    "each input shape. If you want to specify the full shape including the batch dim in your input dims config, "
    "try setting max_batch_size to zero. See the model configuration docs for more info on max_batch_size."
)


@dataclass(frozen=True, slots=True)
class TensorSpec:
    name: str
    datatype: str
    dims: tuple[int, ...]
    optional: bool = False


@dataclass(frozen=True, slots=True)
class ModelSignature:
    model_name: str
    max_batch_size: int
    inputs: dict[str, TensorSpec]
    outputs: dict[str, TensorSpec]
    required_inputs: tuple[str, ...]

    @classmethod
    def from_config(cls, config: ModelConfig) -> ModelSignature:
        inputs = {
            t.name: TensorSpec(t.name, WIRE_NAME_BY_CONFIG[t.data_type], tuple(t.dims), t.optional)
            for t in config.input
        }
        outputs = {t.name: TensorSpec(t.name, WIRE_NAME_BY_CONFIG[t.data_type], tuple(t.dims)) for t in config.output}
        required = tuple(name for name, spec in inputs.items() if not spec.optional)
        return cls(config.name, config.max_batch_size, inputs, outputs, required)


def request_prefix(request: InferRequest) -> str:
    return f"[request id: {request.id or '<id_unknown>'}] "


def format_shape(shape: tuple[int, ...]) -> str:
    return "[" + ",".join(str(d) for d in shape) + "]"


def _invalid(message: str) -> EdgedError:
    return EdgedError(ErrorCode.INVALID_ARG, message)


def validate_request(signature: ModelSignature, request: InferRequest) -> None:
    """Raise INVALID_ARG naming what is wrong; on success every input has ``data`` and ``batch_size`` is set.

    Every request passes here, so the common case is kept to plain comparisons: messages (and the request-id
    prefix they start with) are only built for a request that fails."""
    model = signature.model_name
    inputs = request.inputs
    seen: set[str] = set()
    for tensor in inputs:
        if tensor.name in seen:
            raise _invalid(f"{request_prefix(request)}input '{tensor.name}' already exists in request")
        seen.add(tensor.name)
        _check_shape(tensor, model, request)
    if request.outputs is not None:
        asked: set[str] = set()
        for output in request.outputs:
            if output.name in asked:
                raise _invalid(f"{request_prefix(request)}output '{output.name}' already exists in request")
            asked.add(output.name)
            if output.name not in signature.outputs:
                raise _invalid(f"unexpected inference output '{output.name}' for model '{model}'")
    count = len(inputs)
    if count > len(signature.inputs) or count < len(signature.required_inputs):
        raise _invalid(_input_count_message(signature, request, request_prefix(request)))
    specs: list[TensorSpec] = []
    for tensor in inputs:
        spec = signature.inputs.get(tensor.name)
        if spec is None:
            raise _invalid(f"unexpected inference input '{tensor.name}' for model '{model}'")
        specs.append(spec)
    if not seen.issuperset(signature.required_inputs):
        raise _invalid(_input_count_message(signature, request, request_prefix(request)))

    batching = signature.max_batch_size > 0
    if batching:
        batch_size = -1
        for tensor in inputs:
            if not tensor.shape:
                raise _invalid(
                    f"{request_prefix(request)}input '{tensor.name}' has no shape but model requires batch dimension "
                    f"for '{model}'"
                )
            if batch_size < 0:
                batch_size = tensor.shape[0]
            elif tensor.shape[0] != batch_size:
                raise _invalid(
                    f"{request_prefix(request)}input '{tensor.name}' batch size does not match other inputs for "
                    f"'{model}'"
                )
        if batch_size > signature.max_batch_size:
            raise _invalid(
                f"{request_prefix(request)}inference request batch-size must be <= {signature.max_batch_size} for "
                f"'{model}'"
            )
        request.batch_size = max(batch_size, 0)

    for tensor, spec in zip(inputs, specs, strict=True):
        if tensor.datatype != spec.datatype:
            raise _invalid(
                f"{request_prefix(request)}inference input '{tensor.name}' data-type is '{tensor.datatype}', but "
                f"model '{model}' expects '{spec.datatype}'"
            )
        shape = tensor.shape[1:] if batching else tensor.shape
        if shape != spec.dims and not _dims_match(shape, spec.dims):
            expected = ((-1,) if batching else ()) + spec.dims
            raise _invalid(
                f"{request_prefix(request)}unexpected shape for input '{tensor.name}' for model '{model}'. Expected "
                f"{format_shape(expected)}, got {format_shape(tensor.shape)}.{_BATCH_NOTE if batching else ' '}"
            )
        if tensor.data is None:
            tensor.data = _from_raw(tensor, model, request)
        elif tensor.data.size != element_count(tensor.shape):
            raise _invalid(
                f"{request_prefix(request)}unexpected number of elements for input '{tensor.name}' for model "
                f"'{model}'. Expected {element_count(tensor.shape)}, got {tensor.data.size}"
            )


def _check_shape(tensor: InferInput, model: str, request: InferRequest) -> None:
    """Every dimension given and sane: gRPC shapes are int64, so a client can send -1 or 2**62."""
    shape = tensor.shape
    if not shape:
        return
    if min(shape) < 0:
        raise _invalid(
            f"{request_prefix(request)}All input dimensions should be specified for input '{tensor.name}' for model "
            f"'{model}', got {format_shape(shape)}"
        )
    refusal = oversized(tensor.name, tensor.datatype, shape)
    if refusal is not None:
        raise _invalid(f"{request_prefix(request)}{refusal}")


def _input_count_message(signature: ModelSignature, request: InferRequest, prefix: str) -> str:
    given = {t.name for t in request.inputs}
    got = "[" + ",".join(f"'{t.name}'" for t in request.inputs) + "]"
    missing = [n for n in signature.required_inputs if n not in given]
    # Triton prints a lone "]" when nothing is missing (too many inputs); kept so messages match.
    missing_text = "[" + ",".join(f"'{n}'" for n in missing) + "]" if missing else "]"
    total, required = len(signature.inputs), len(signature.required_inputs)
    expected = f"{total} inputs" if total == required else f"number of inputs between {required} and {total}"
    return (
        f"{prefix}expected {expected} but got {len(request.inputs)} inputs for model "
        f"'{signature.model_name}'. Got input(s) {got}, but missing required input(s) {missing_text}. Please "
        "provide all required input(s)."
    )


def _from_raw(tensor: InferInput, model: str, request: InferRequest) -> np.ndarray[Any, Any]:
    raw = tensor.raw if tensor.raw is not None else b""
    count = element_count(tensor.shape)
    if tensor.datatype == "BYTES":
        elements = deserialize_bytes_tensor(raw, tensor.name, count)
        if len(elements) > count:
            raise _invalid(
                f"{request_prefix(request)}unexpected number of string elements {len(elements)} for inference input "
                f"'{tensor.name}' for model '{model}', expecting {count}"
            )
        if len(elements) < count:
            raise _invalid(
                f"{request_prefix(request)}expected {count} string elements for inference input '{tensor.name}' for "
                f"model '{model}', got {len(elements)}"
            )
        return bytes_array(elements, tensor.shape)
    size = element_size(tensor.datatype)
    dtype = binary_dtype(tensor.datatype)
    if size is None or dtype is None:
        raise _invalid(f"invalid datatype for input {tensor.name}")
    expected = count * size
    if len(raw) != expected:
        raise _invalid(
            f"{request_prefix(request)}input byte size mismatch for input '{tensor.name}' for model '{model}'. "
            f"Expected {expected}, got {len(raw)}"
        )
    return np.frombuffer(raw, dtype=dtype).reshape(tensor.shape)


def _dims_match(shape: tuple[int, ...], dims: tuple[int, ...]) -> bool:
    if len(shape) != len(dims):
        return False
    return all(d in (-1, s) for s, d in zip(shape, dims, strict=True))


def raw_binary_input(signature: ModelSignature, raw: bytes | memoryview) -> InferInput:
    """The single input of a "raw binary" request (a body with no JSON header), its shape deduced from the
    model's one input and the byte count, as Triton deduces it."""
    from edged.core.request.inference import InferInput

    prefix = "[request id: <id_unknown>] "
    if len(signature.inputs) != 1:
        raise _invalid(
            f"{prefix}Raw request must only have 1 input (found 1) to be deduced but got {len(signature.inputs)} "
            f"inputs in '{signature.model_name}' model configuration"
        )
    spec = next(iter(signature.inputs.values()))
    batch = (1,) if signature.max_batch_size > 0 else ()
    if spec.datatype == "BYTES":
        if spec.dims != (1,):
            raise _invalid(f"{prefix}For BYTE datatype raw input '{spec.name}', the model must have input shape [1]")
        # The body is the one element itself, without the length that precedes each element of a BYTES tensor.
        element = np.empty((*batch, 1), dtype=np.object_)
        element.flat[0] = bytes(raw)
        return InferInput(spec.name, spec.datatype, (*batch, 1), element)
    variable = [i for i, d in enumerate(spec.dims) if d == -1]
    if len(variable) > 1:
        raise _invalid(
            f"{prefix}The shape of the raw input '{spec.name}' can not be deduced because there are more than one "
            "variable-sized dimension"
        )
    dims = list(spec.dims)
    if variable:
        size = element_size(spec.datatype) or 1
        known = element_count([d for d in dims if d != -1]) * size
        dims[variable[0]] = len(raw) // known if known else 0
    return InferInput(spec.name, spec.datatype, (*batch, *dims), None, raw)
