"""Ragged batches, as Triton's framework backends (ONNX Runtime, TensorRT, PyTorch) form them.

An input marked ``allow_ragged_batch`` lets requests of different shapes share a batch: the backend hands the model
the requests' tensors of that input flattened and concatenated into one 1-D tensor. The model learns where each
request's part starts from the config's ``batch_input`` tensors, which the backend computes from the batch:

- ``BATCH_ELEMENT_COUNT``: each request's element count of the source input, shape ``[requests]``;
- ``BATCH_ACCUMULATED_ELEMENT_COUNT``: the running total of those counts, shape ``[requests]``;
- ``BATCH_ACCUMULATED_ELEMENT_COUNT_WITH_ZERO``: the same with a leading 0, shape ``[requests + 1]``;
- ``BATCH_MAX_ELEMENT_COUNT_AS_SHAPE``: a tensor whose shape is ``[the largest count]`` (its content means nothing);
- ``BATCH_ITEM_SHAPE``: each batch item's shape of the source input (its batch dimension left out), shape
  ``[items, rank - 1]``; ``BATCH_ITEM_SHAPE_FLATTEN``: the same as one row.

A count covers the request's whole tensor, its batch dimension included, as Triton counts it. An output named by a
``batch_output`` of kind ``BATCH_SCATTER_WITH_INPUT_SHAPE`` comes back from the model concatenated the same way, and
each request gets its part in the shape of its own source input.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import numpy as np

from edged.errors import EdgedError, ErrorCode
from edged.proto.model_config_pb2 import BatchInput

if TYPE_CHECKING:
    from collections.abc import Sequence

    from edged.core.request.inference import InferRequest
    from edged.proto.model_config_pb2 import ModelConfig

_FP32 = 11  # DataType TYPE_FP32; a batch input is TYPE_FP32 or TYPE_INT32 (the config checks say so)


def ragged_inputs(config: ModelConfig) -> frozenset[str]:
    """The inputs fed to the model flattened and concatenated (a model that batches; without batching a request is
    the whole batch and keeps its shape)."""
    if config.max_batch_size <= 0:
        return frozenset()
    return frozenset(tensor.name for tensor in config.input if tensor.allow_ragged_batch)


def scattered_outputs(config: ModelConfig) -> dict[str, str]:
    """Output name -> the source input whose shapes split it back into the requests' outputs."""
    return {name: spec.source_input[0] for spec in config.batch_output for name in spec.target_name}


def concatenate(arrays: Sequence[np.ndarray[Any, Any] | None]) -> np.ndarray[Any, Any]:
    """The requests' tensors of a ragged input, as the model takes them: one flat tensor."""
    flat = []
    for array in arrays:
        assert array is not None  # validation decodes every input before scheduling
        flat.append(array.reshape(-1))
    return np.concatenate(flat)


def batch_inputs(config: ModelConfig, requests: Sequence[InferRequest]) -> dict[str, np.ndarray[Any, Any]]:
    """Every ``batch_input`` tensor of the config, by target name, for this batch of requests."""
    tensors: dict[str, np.ndarray[Any, Any]] = {}
    for spec in config.batch_input:
        array = _batch_input(spec, requests)
        for name in spec.target_name:
            tensors[name] = array
    return tensors


def _batch_input(spec: BatchInput, requests: Sequence[InferRequest]) -> np.ndarray[Any, Any]:
    dtype = np.float32 if spec.data_type == _FP32 else np.int32
    shapes = [_source_shape(request, spec.source_input[0]) for request in requests]
    counts = np.array([int(np.prod(shape)) for shape in shapes], dtype=np.int64)
    kind = spec.kind
    if kind == BatchInput.BATCH_ELEMENT_COUNT:
        return counts.astype(dtype)
    if kind == BatchInput.BATCH_ACCUMULATED_ELEMENT_COUNT:
        return np.cumsum(counts).astype(dtype)
    if kind == BatchInput.BATCH_ACCUMULATED_ELEMENT_COUNT_WITH_ZERO:
        return np.concatenate([[0], np.cumsum(counts)]).astype(dtype)
    if kind == BatchInput.BATCH_MAX_ELEMENT_COUNT_AS_SHAPE:
        return np.zeros(int(counts.max()) if len(counts) else 0, dtype=dtype)
    rows = [shape[1:] for shape in shapes for _ in range(shape[0] if shape else 1)]
    items = np.array(rows, dtype=dtype).reshape(len(rows), max((len(row) for row in rows), default=0))
    return items.reshape(-1) if kind == BatchInput.BATCH_ITEM_SHAPE_FLATTEN else items


def scatter(array: np.ndarray[Any, Any], requests: Sequence[InferRequest], source: str) -> list[np.ndarray[Any, Any]]:
    """A batch output split back into each request's part, in the shape of that request's source input."""
    flat = array.reshape(-1)
    parts: list[np.ndarray[Any, Any]] = []
    start = 0
    for request in requests:
        shape = _source_shape(request, source)
        end = start + int(np.prod(shape))
        if end > flat.size:
            raise EdgedError(
                ErrorCode.INTERNAL,
                f"the model's output holds {flat.size} elements, fewer than the batch's '{source}' inputs ({end})",
            )
        parts.append(flat[start:end].reshape(shape))
        start = end
    return parts


def _source_shape(request: InferRequest, name: str) -> tuple[int, ...]:
    for tensor in request.inputs:
        if tensor.name == name:
            return tuple(tensor.shape)
    raise EdgedError(ErrorCode.INVALID_ARG, f"batch input or output source '{name}' is missing from the request")
