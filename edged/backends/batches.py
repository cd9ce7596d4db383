"""What the framework backends (fil, pytorch, openvino, tensorflow) share: a batch of requests made into one
input per tensor, the outputs split back into one response per request, and a model that is just its instances.

Requests of one batch have the same inputs and non-batch shapes (the dynamic batcher groups them so); their order of
inputs may differ, so inputs are found by name.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING, Any, Generic, TypeVar

import numpy as np

from edged.core.request.datatypes import wire_name_for_numpy
from edged.core.request.inference import InferOutput, InferResponse

if TYPE_CHECKING:
    from edged.core.backend_api import BackendInstance
    from edged.core.request.inference import InferRequest
    from edged.errors import EdgedError

Instance = TypeVar("Instance", bound="BackendInstance")


def stacked(requests: Sequence[InferRequest], name: str) -> np.ndarray[Any, Any]:
    """Input ``name`` of every request, concatenated along dimension 0 (one request's as it is)."""
    parts: list[Any] = [next(tensor.data for tensor in request.inputs if tensor.name == name) for request in requests]
    return np.concatenate(parts) if len(parts) > 1 else parts[0]


def split(
    requests: Sequence[InferRequest], arrays: dict[str, np.ndarray[Any, Any]], batching: bool
) -> list[InferResponse | EdgedError]:
    """One response per request: its rows of each output (the whole output for a lone request, or a model without
    batching), typed by the array's own dtype."""
    responses: list[InferResponse | EdgedError] = []
    start = 0
    for request in requests:
        end = start + request.batch_size
        outputs = []
        for name, array in arrays.items():
            part = array[start:end] if batching and len(requests) > 1 else array
            outputs.append(InferOutput(name, wire_name_for_numpy(part.dtype), tuple(part.shape), part))
        responses.append(InferResponse(request.model_name, str(request.model_version), request.id, outputs))
        start = end
    return responses


class InstancesModel(Generic[Instance]):
    """A loaded model version that is its instances (edged.core.backend_api.BackendModel)."""

    def __init__(self, instances: list[Instance]) -> None:
        self._instances = instances

    @property
    def instances(self) -> Sequence[Instance]:
        return self._instances

    def unload(self) -> None:
        self._instances = []
