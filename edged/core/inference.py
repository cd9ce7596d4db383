"""Protocol-neutral inference requests and responses.

Frontends build these from their wire formats and the core hands them to schedulers and backends. Tensor data
is always a numpy array shaped as the request says: numeric types are views over the request bytes where the
wire format allows it, BYTES tensors are object arrays of ``bytes``.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    import numpy as np

# Request parameter values as KServe v2 allows them (bool, int, float, str).
ParameterValue = bool | int | float | str


@dataclass(slots=True)
class InferInput:
    name: str
    datatype: str  # wire name: "FP32", "BYTES", ...
    shape: tuple[int, ...]
    # The tensor. Frontends may leave it None and set ``raw`` (the binary wire form) instead: validation then
    # checks the byte size against the shape it has just validated and makes ``data`` a view over ``raw``.
    data: np.ndarray[Any, Any] | None
    raw: bytes | memoryview | None = None
    parameters: dict[str, ParameterValue] = field(default_factory=dict)


@dataclass(slots=True)
class RequestedOutput:
    name: str
    # Top-K of the classification extension; 0 returns the tensor itself.
    classification: int = 0
    parameters: dict[str, ParameterValue] = field(default_factory=dict)


@dataclass(slots=True)
class InferRequest:
    model_name: str
    # -1 asks the version policy for the newest READY version.
    model_version: int
    id: str
    inputs: list[InferInput]
    # None returns every output of the model, as KServe v2 says.
    outputs: list[RequestedOutput] | None = None
    parameters: dict[str, ParameterValue] = field(default_factory=dict)
    # Set by validation: the leading batch dimension, or 1 for models without batching (max_batch_size 0).
    batch_size: int = 1
    # time.monotonic_ns() when the core accepted the request; statistics measure from here.
    arrival_ns: int = 0


@dataclass(slots=True)
class InferOutput:
    name: str
    datatype: str
    shape: tuple[int, ...]
    data: np.ndarray[Any, Any]
    # Written into the client's shared memory region: the frontends then send no data for it.
    in_shared_memory: bool = False


@dataclass(slots=True)
class InferResponse:
    model_name: str
    model_version: str
    id: str
    outputs: list[InferOutput]
    parameters: dict[str, ParameterValue] = field(default_factory=dict)
