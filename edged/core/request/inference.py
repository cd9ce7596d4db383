"""Protocol-neutral inference requests and responses.

Frontends build these from their wire formats and the core hands them to schedulers and backends. Tensor data
is always a numpy array shaped as the request says: numeric types are views over the request bytes where the
wire format allows it, BYTES tensors are object arrays of ``bytes``.
"""

from __future__ import annotations

import asyncio
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from collections.abc import Callable

    import numpy as np

    from edged.core.trace_file import Trace
    from edged.errors import EdgedError

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
    # Where a decoupled model's responses go (set by the core for streaming requests only).
    stream: ResponseStream | None = None
    # Set when the client cancelled or went away; a backend that can stop early registers with on_cancel.
    cancelled: bool = False
    # Set by a backend whose model released the request to run again (Triton's RESCHEDULE release flag): the
    # sequence batcher of an iterative sequence model gives it to a later execution.
    run_again: bool = False
    # Set when the request is traced (edged.core.tracing): what the core and the backends record of it.
    trace: Trace | None = None
    _cancel_callbacks: list[Callable[[], None]] | None = None

    def cancel(self) -> None:
        """Mark the request cancelled and tell whoever registered (on the event loop)."""
        if self.cancelled:
            return
        self.cancelled = True
        callbacks, self._cancel_callbacks = self._cancel_callbacks, None
        for callback in callbacks or ():
            callback()

    def on_cancel(self, callback: Callable[[], None]) -> None:
        if self.cancelled:
            callback()
        elif self._cancel_callbacks is None:
            self._cancel_callbacks = [callback]
        else:
            self._cancel_callbacks.append(callback)


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


@dataclass(slots=True)
class StreamResponse:
    """One response of a decoupled model: data, or an error, and whether it is the request's last.

    The final one may carry neither (``response`` and ``error`` None): Triton's flag-only final response, which
    gRPC forwards as an empty response only when the client asked for it."""

    response: InferResponse | None
    error: EdgedError | None = None
    final: bool = False


class ResponseStream:
    """The responses of one request to a decoupled model, in the order the model sends them.

    Written by the backend and read by the service, both on the event loop; the final response ends it."""

    __slots__ = ("_queue", "finished", "nbytes", "on_put")

    def __init__(self) -> None:
        self._queue: asyncio.Queue[StreamResponse] = asyncio.Queue()
        self.finished = False
        # The bytes of output data queued and not read yet: a reader that makes the model wait for its client
        # (gRPC's response pool) bounds what piles up here by it, told of each new response by ``on_put``.
        self.nbytes = 0
        self.on_put: Callable[[], None] | None = None

    def put(self, item: StreamResponse) -> None:
        if self.finished:
            return  # nothing may follow the final response
        if item.final:
            self.finished = True
        self.nbytes += _queued_size(item)
        self._queue.put_nowait(item)
        if self.on_put is not None:
            self.on_put()

    async def get(self) -> StreamResponse:
        item = await self._queue.get()
        self.nbytes -= _queued_size(item)
        return item


def _queued_size(item: StreamResponse) -> int:
    # What a queued response holds beyond its data (the objects, the queue entry), so that empty ones count too.
    overhead = 512
    if item.response is None:
        return overhead
    return overhead + sum(output.data.nbytes for output in item.response.outputs)
