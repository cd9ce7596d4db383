"""Checking an inference request against the model it is for, before it is scheduled.

This is on every request's path: the model's tensors are compiled once at load into a ``ModelSignature`` of
plain dicts and tuples, so a check is a few lookups and comparisons.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

from edged.core.datatypes import WIRE_NAME_BY_CONFIG
from edged.errors import EdgedError, ErrorCode

if TYPE_CHECKING:
    from edged.core.inference import InferRequest
    from edged.proto.model_config_pb2 import ModelConfig


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
        outputs = {
            t.name: TensorSpec(t.name, WIRE_NAME_BY_CONFIG[t.data_type], tuple(t.dims)) for t in config.output
        }
        required = tuple(name for name, spec in inputs.items() if not spec.optional)
        return cls(config.name, config.max_batch_size, inputs, outputs, required)


def _request_prefix(request: InferRequest) -> str:
    return f"[request id: {request.id or '<id_unknown>'}] "


def _format_shape(shape: tuple[int, ...]) -> str:
    return "[" + ",".join(str(d) for d in shape) + "]"


def validate_request(signature: ModelSignature, request: InferRequest) -> None:
    """Raise INVALID_ARG naming what is wrong; on success set ``request.batch_size``."""
    model = signature.model_name
    batching = signature.max_batch_size > 0
    batch_size = 0
    seen: set[str] = set()
    for tensor in request.inputs:
        spec = signature.inputs.get(tensor.name)
        if spec is None:
            allowed = ", ".join(signature.inputs)
            raise EdgedError(
                ErrorCode.INVALID_ARG,
                f"{_request_prefix(request)}unexpected inference input '{tensor.name}' for model '{model}'. "
                f"Allowed inputs are: {allowed}",
            )
        if tensor.name in seen:
            raise EdgedError(
                ErrorCode.INVALID_ARG,
                f"{_request_prefix(request)}input '{tensor.name}' already exists in request",
            )
        seen.add(tensor.name)
        if tensor.datatype != spec.datatype:
            raise EdgedError(
                ErrorCode.INVALID_ARG,
                f"{_request_prefix(request)}inference input '{tensor.name}' data-type is '{tensor.datatype}', "
                f"but model '{model}' expects '{spec.datatype}'",
            )
        shape = tensor.shape
        if batching:
            if not shape:
                raise EdgedError(
                    ErrorCode.INVALID_ARG,
                    f"{_request_prefix(request)}inference input '{tensor.name}' has no shape, but model "
                    f"'{model}' supports batching and expects [batch size] + {_format_shape(spec.dims)}",
                )
            if batch_size == 0:
                batch_size = shape[0]
            elif shape[0] != batch_size:
                raise EdgedError(
                    ErrorCode.INVALID_ARG,
                    f"{_request_prefix(request)}input '{tensor.name}' batch size does not match other inputs "
                    f"for '{model}'",
                )
            shape = shape[1:]
        if not _dims_match(shape, spec.dims):
            expected = ((-1,) if batching else ()) + spec.dims
            raise EdgedError(
                ErrorCode.INVALID_ARG,
                f"{_request_prefix(request)}unexpected shape for input '{tensor.name}' for model '{model}'. "
                f"Expected {_format_shape(expected)}, got {_format_shape(tensor.shape)}",
            )
    if len(seen) < len(signature.required_inputs):
        missing = [name for name in signature.required_inputs if name not in seen]
        if missing:
            given = ", ".join(f"'{n}'" for n in seen)
            wanted = ", ".join(f"'{n}'" for n in missing)
            raise EdgedError(
                ErrorCode.INVALID_ARG,
                f"{_request_prefix(request)}expected {len(signature.required_inputs)} inputs but got "
                f"{len(seen)} inputs for model '{model}'. Got input(s) [{given}], but missing required input(s) "
                f"[{wanted}]. Please provide all required input(s).",
            )
    if batching:
        if batch_size < 1 or batch_size > signature.max_batch_size:
            raise EdgedError(
                ErrorCode.INVALID_ARG,
                f"{_request_prefix(request)}inference request batch-size must be <= "
                f"{signature.max_batch_size} for '{model}'",
            )
        request.batch_size = batch_size
    if request.outputs is not None:
        for output in request.outputs:
            if output.name not in signature.outputs:
                raise EdgedError(
                    ErrorCode.INVALID_ARG,
                    f"{_request_prefix(request)}unexpected inference output '{output.name}' for model '{model}'",
                )


def _dims_match(shape: tuple[int, ...], dims: tuple[int, ...]) -> bool:
    if len(shape) != len(dims):
        return False
    return all(d in (-1, s) for s, d in zip(shape, dims, strict=True))
