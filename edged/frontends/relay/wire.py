"""The framing between a frontend worker and the daemon: a 4-byte length, then a pickled tuple whose first item
says what it is and whose second is the call's number on that connection.

Pickle, because both ends are the same edged on the same machine and a request's numpy arrays go through it
without a conversion of their own; it is safe here because the socket lives in a directory only the daemon's user
can enter (edged.daemon.workers), so nothing but the daemon's own workers can write to it.
"""

from __future__ import annotations

import asyncio
import pickle
import socket
import struct
from collections.abc import Callable
from typing import Any, Final, cast

import numpy as np

from edged.core.request.inference import InferInput, InferOutput, InferRequest, InferResponse, RequestedOutput
from edged.errors import EdgedError, ErrorCode

_HEADER: Final = struct.Struct("<I")
# A frame larger than this is a bug on the other side, not a request: the connection is dropped.
MAX_FRAME: Final = 2**31 - 1

Message = tuple[Any, ...]


def encode(message: Message) -> bytes:
    payload = pickle.dumps(message, protocol=pickle.HIGHEST_PROTOCOL)
    return _HEADER.pack(len(payload)) + payload


def error_state(error: EdgedError) -> tuple[str, str]:
    """An EdgedError as it crosses (its pickled form would lose the code)."""
    return (error.code.value, error.message)


def error_from(state: tuple[str, str]) -> EdgedError:
    return EdgedError(ErrorCode(state[0]), state[1])


class FrameProtocol(asyncio.Protocol):
    """Reads frames off a stream and hands each decoded message to ``on_message``; ``send`` writes one."""

    def __init__(self, on_message: Callable[[Message], None], on_lost: Callable[[], None]) -> None:
        self._on_message = on_message
        self._on_lost = on_lost
        self._buffer = bytearray()
        self.transport: asyncio.Transport | None = None
        # Frames written together once the loop is done with what it is running: one write for many under load.
        self._out: list[bytes] = []
        self._loop: asyncio.AbstractEventLoop | None = None

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        # uvloop's transports are not asyncio.Transport subclasses, but are stream transports all the same.
        self.transport = cast("asyncio.Transport", transport)
        # Kept: asyncio.get_running_loop() costs a getpid() system call each time, twice per request here.
        self._loop = asyncio.get_running_loop()

    def data_received(self, data: bytes) -> None:
        buffer = self._buffer
        buffer += data
        start = 0
        end = len(buffer)
        while end - start >= 4:
            (size,) = _HEADER.unpack_from(buffer, start)
            if end - start - 4 < size:
                break
            message = pickle.loads(buffer[start + 4 : start + 4 + size])
            start += 4 + size
            self._on_message(message)
        if start:
            del buffer[:start]

    def connection_lost(self, exc: Exception | None) -> None:
        self.transport = None
        self._on_lost()

    def send(self, message: Message) -> None:
        if self.transport is None or self.transport.is_closing() or self._loop is None:
            return
        if not self._out:
            self._loop.call_soon(self._flush)
        self._out.append(encode(message))

    def _flush(self) -> None:
        out, self._out = self._out, []
        if self.transport is not None and not self.transport.is_closing():
            self.transport.write(out[0] if len(out) == 1 else b"".join(out))


def call_blocking(path: str, message: Message, timeout_s: float) -> Any:
    """One call over a connection of its own, waiting for the answer (an ``error`` is raised as EdgedError): for
    the few lookups a frontend makes outside a coroutine (a model's signature, an API token), never for an
    inference."""
    with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as sock:
        sock.settimeout(timeout_s)
        sock.connect(path)
        sock.sendall(encode(message))
        header = _recv_exactly(sock, 4)
        (size,) = _HEADER.unpack(header)
        reply: Message = pickle.loads(_recv_exactly(sock, size))
    if reply[0] != "ok":
        raise error_from(reply[2])
    return reply[2]


def _recv_exactly(sock: socket.socket, size: int) -> bytes:
    chunks = bytearray()
    while len(chunks) < size:
        chunk = sock.recv(size - len(chunks))
        if not chunk:
            raise ConnectionError("the daemon closed the connection")
        chunks += chunk
    return bytes(chunks)


# --- requests and responses as they cross -----------------------------------------------------------------------
# As plain tuples: a slotted dataclass pickles through Python-level state functions, which cost the daemon more per
# request than the model's run; a numeric tensor crosses as its bytes, a BYTES one as its object array.


def _pack_tensor(data: np.ndarray[Any, Any] | None) -> Any:
    if data is None or data.dtype.hasobject:
        return data
    return (data.dtype.str, data.tobytes())


def _unpack_tensor(packed: Any, shape: tuple[int, ...]) -> np.ndarray[Any, Any] | None:
    if packed is None or isinstance(packed, np.ndarray):
        return packed
    dtype, raw = packed
    return np.frombuffer(raw, dtype=dtype).reshape(shape)


def pack_request(request: InferRequest) -> tuple[Any, ...]:
    inputs = [
        (
            tensor.name,
            tensor.datatype,
            tensor.shape,
            _pack_tensor(tensor.data),
            bytes(tensor.raw) if tensor.data is None and tensor.raw is not None else None,
            tensor.parameters,
        )
        for tensor in request.inputs
    ]
    outputs = (
        None
        if request.outputs is None
        else [(wanted.name, wanted.classification, wanted.parameters) for wanted in request.outputs]
    )
    return (request.model_name, request.model_version, request.id, inputs, outputs, request.parameters)


def unpack_request(packed: tuple[Any, ...]) -> InferRequest:
    name, version, request_id, inputs, outputs, parameters = packed
    return InferRequest(
        name,
        version,
        request_id,
        [
            InferInput(tensor_name, datatype, shape, _unpack_tensor(data, shape), raw, tensor_parameters)
            for tensor_name, datatype, shape, data, raw, tensor_parameters in inputs
        ],
        None if outputs is None else [RequestedOutput(*wanted) for wanted in outputs],
        parameters,
    )


def pack_response(response: InferResponse) -> tuple[Any, ...]:
    outputs = [
        (tensor.name, tensor.datatype, tensor.shape, _pack_tensor(tensor.data), tensor.in_shared_memory)
        for tensor in response.outputs
    ]
    return (response.model_name, response.model_version, response.id, outputs, response.parameters)


def unpack_response(packed: tuple[Any, ...]) -> InferResponse:
    name, version, response_id, outputs, parameters = packed
    return InferResponse(
        name,
        version,
        response_id,
        [
            InferOutput(tensor_name, datatype, shape, _unpack_tensor(data, shape), in_shared_memory)  # type: ignore[arg-type]
            for tensor_name, datatype, shape, data, in_shared_memory in outputs
        ],
        parameters,
    )
