"""The generate extension's JSON, to and from core objects, as Triton 2.51's HTTP frontend converts it.

A request is one JSON object whose top-level members map by name: a member named as one of the model's inputs is
that input, every other member a request parameter; the members of a ``parameters`` object map the same way. An
input's value is a JSON scalar or array, converted to the input's datatype and given the input's shape with its
variable dimensions filled in (the innermost takes the elements left over, the others 1). A response is one JSON
object of ``id`` (when the request had one), ``model_name``, ``model_version``, the response's parameters and each
output by name (a single element as a scalar, more as a flat array), its members in the byte order of their names.
Triton's texts and codes are kept for every error, as its generate clients match them.
"""

from __future__ import annotations

import json
from typing import TYPE_CHECKING, Any, Final

from edged.core.request.inference import InferInput, InferRequest, InferResponse, ParameterValue
from edged.core.request.tensors import array_from_json, array_to_json
from edged.core.request.validation import request_prefix
from edged.errors import EdgedError, ErrorCode, invalid_arg
from edged.frontends.http.codec import decode_json, encode

if TYPE_CHECKING:
    from edged.core.request.validation import ModelSignature

# The member whose object holds more members to map (Triton's one nested mapping schema).
PARAMETERS: Final = "parameters"
_INT64: Final = (-(2**63), 2**63 - 1)


class _Members(list[tuple[str, Any]]):
    """A JSON object as its members in document order, duplicates kept: Triton refuses an input given twice."""


def _internal(message: str) -> EdgedError:
    # Triton answers JSON structure errors with its INTERNAL code (HTTP 500).
    return EdgedError(ErrorCode.INTERNAL, message)


def _prefixed(exc: EdgedError, prefix: str) -> EdgedError:
    return EdgedError(exc.code, prefix + exc.message)


def decode_generate_request(
    model_name: str, version: int, body: bytes, signature: ModelSignature, max_depth: int
) -> InferRequest:
    """The inference request a generate body asks for; raises Triton's error for the first member it cannot map,
    in document order. The request is not validated against the model here (the caller does, as for infer)."""
    # msgspec first: its errors (and the depth bound) are those of every other JSON body edged reads.
    document = decode_json(body, max_depth)
    if not isinstance(document, dict):
        raise _internal("attempt to get members for non-object")
    try:
        members: _Members = json.loads(body, object_pairs_hook=_Members)
    except RecursionError:
        raise invalid_arg(f"JSON nesting depth exceeds maximum allowed limit ({max_depth})") from None
    request = InferRequest(model_name, version, "", [])
    for name, value in members:
        if name == "id":
            if not isinstance(value, str):
                raise _internal("Unable to parse 'id': attempt to access JSON non-string as string")
            request.id = value
            break
    for name, value in members:
        if name == PARAMETERS:
            if name in signature.inputs:
                raise invalid_arg(f"Keyword '{name}' for nested schema also given as input tensor name")
            if not isinstance(value, _Members):
                raise _internal(
                    f"Expected JSON object for keyword: '{name}': attempt to access JSON non-object as object"
                )
            try:
                for inner, inner_value in value:
                    _map_member(request, signature, inner, inner_value)
            except EdgedError as exc:
                raise _prefixed(exc, f"Converting keyword: '{name}': ") from None
        else:
            _map_member(request, signature, name, value)
    return request


def _map_member(request: InferRequest, signature: ModelSignature, name: str, value: Any) -> None:
    spec = signature.inputs.get(name)
    if spec is None:
        request.parameters[name] = _parameter(name, value)
        return
    if any(tensor.name == name for tensor in request.inputs):
        raise invalid_arg(f"{request_prefix(request)}input '{name}' already exists in request")
    # Triton's input metadata: a batching model's inputs start with the batch dimension, -1.
    dims = (-1, *spec.dims) if signature.max_batch_size > 0 else spec.dims
    # Triton shapes the tensor by the top-level element count, then reads nested arrays row-major: data nested
    # deeper than the shape says is refused by the reader, as there.
    data = _flat(value) if _is_array(value) else [_plain(value)]
    shape = _shape(name, dims, len(value) if _is_array(value) else 1)
    request.inputs.append(InferInput(name, spec.datatype, shape, array_from_json(name, spec.datatype, shape, data)))


def _shape(name: str, dims: tuple[int, ...], count: int) -> tuple[int, ...]:
    """Triton's two passes: the fixed dimensions divide the element count, then the innermost variable dimension
    takes what is left and every other one is 1."""
    left = count
    for dim in reversed(dims):
        if dim != -1:
            if dim == 0 or left % dim:
                raise invalid_arg(f"The schema can not convert input '{name}' to tensor with proper shape")
            left //= dim
    shape = list(dims)
    for index in range(len(shape) - 1, -1, -1):
        if shape[index] == -1:
            shape[index] = left
            left = 1
    if left != 1:
        raise invalid_arg(f"The schema can not convert input '{name}' to tensor with proper shape")
    return tuple(shape)


def _flat(values: list[Any]) -> list[Any]:
    out: list[Any] = []
    stack = [iter(values)]
    while stack:
        for item in stack[-1]:
            if _is_array(item):
                stack.append(iter(item))
                break
            out.append(_plain(item))
        else:
            stack.pop()
    return out


def _is_array(value: Any) -> bool:
    return isinstance(value, list) and not isinstance(value, _Members)


def _plain(value: Any) -> Any:
    # An object inside a tensor's data is refused by the tensor's reader, as a dict is.
    return dict(value) if isinstance(value, _Members) else value


def _parameter(name: str, value: Any) -> ParameterValue:
    if isinstance(value, (str, bool)):
        return value
    if isinstance(value, int):
        # Triton keeps a JSON integer as int64 and reads any other number as a double.
        return value if _INT64[0] <= value <= _INT64[1] else float(value)
    if isinstance(value, float):
        return value
    raise invalid_arg(f"parameter '{name}' has invalid type. It should be either 'int', 'bool', or 'string'.")


def encode_generate_response(response: InferResponse) -> bytes:
    """One response as the generate extension's JSON object."""
    fields: dict[str, Any] = {}
    if response.id:
        fields["id"] = response.id
    fields["model_name"] = response.model_name
    fields["model_version"] = str(response.model_version)
    # Triton fills one map in this order without replacing a name already there: a parameter or an output named
    # like a field before it is left out.
    for name, value in response.parameters.items():
        fields.setdefault(name, value)
    for output in response.outputs:
        if output.name in fields:
            continue
        values = array_to_json(output.data, output.datatype, output.name)
        fields[output.name] = values[0] if len(values) == 1 else values
    return encode({name: fields[name] for name in sorted(fields)})
