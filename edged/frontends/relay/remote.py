"""A frontend worker's end of its connection to the daemon (edged.frontends.relay.host).

``RemoteService`` is what the worker's HTTP and gRPC inference paths call in place of the daemon's service
(edged.core.service.InferencePath): decoded requests go to the daemon, responses come back decoded. ``RelayApp``
is the worker's ASGI app for every other HTTP request: the daemon's own app answers it.
"""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import json
import logging
import time
from typing import TYPE_CHECKING, Any, Final

from edged.core.request.inference import StreamResponse
from edged.core.request.validation import raw_binary_input
from edged.core.service import ModelHandle
from edged.core.tracing import TraceManager
from edged.errors import EdgedError, ErrorCode
from edged.frontends.relay.host import SCOPE_KEYS
from edged.frontends.relay.wire import (
    FrameProtocol,
    Message,
    call_blocking,
    error_from,
    pack_request,
    unpack_response,
)

if TYPE_CHECKING:
    from collections.abc import AsyncIterator

    from edged.core.request.inference import InferInput, InferRequest, InferResponse
    from edged.core.request.validation import ModelSignature

log = logging.getLogger("edged.relay")

# How long a worker trusts a model lookup: a model loaded or unloaded meanwhile is still checked by the daemon,
# which looks every request's model up again; only the order of two errors in one bad request could differ.
LOOKUP_TTL_S: Final = 1.0
# A lookup outside a coroutine waits this long for the daemon.
BLOCKING_TIMEOUT_S: Final = 10.0

_GONE: Final = EdgedError(ErrorCode.UNAVAILABLE, "the server is restarting this worker's connection; try again")


class Relay:
    """The worker's connection to the daemon: numbered calls, their answers routed back by number."""

    def __init__(self, path: str) -> None:
        self.path = path
        self._numbers = itertools.count(1)
        self._waiting: dict[int, asyncio.Future[Any]] = {}
        self._streams: dict[int, asyncio.Queue[Message]] = {}
        self._protocol: FrameProtocol | None = None
        self.closed = asyncio.Event()

    async def connect(self) -> None:
        loop = asyncio.get_running_loop()
        _, protocol = await loop.create_unix_connection(lambda: FrameProtocol(self._received, self._lost), self.path)
        self._protocol = protocol

    def blocking(self, kind: str, *args: Any) -> Any:
        """A call answered before this returns, over a connection of its own; EdgedError when refused, and
        UNAVAILABLE when the daemon cannot be reached."""
        try:
            return call_blocking(self.path, (kind, 0, *args), BLOCKING_TIMEOUT_S)
        except (OSError, EOFError) as exc:
            log.warning("a %s call to the daemon failed: %s", kind, exc)
            raise _GONE from None

    def send(self, message: Message) -> None:
        if self._protocol is None:
            raise _GONE
        self._protocol.send(message)

    def number(self) -> int:
        return next(self._numbers)

    async def call(self, kind: str, payload: Any) -> Any:
        number = self.number()
        future: asyncio.Future[Any] = asyncio.get_running_loop().create_future()
        self._waiting[number] = future
        try:
            self.send((kind, number, payload))
            return await future
        except asyncio.CancelledError:
            with contextlib.suppress(EdgedError):
                self.send(("cancel", number))
            raise
        finally:
            self._waiting.pop(number, None)

    def open_stream(self, number: int) -> asyncio.Queue[Message]:
        queue: asyncio.Queue[Message] = asyncio.Queue()
        self._streams[number] = queue
        return queue

    def close_stream(self, number: int) -> None:
        self._streams.pop(number, None)

    def _received(self, message: Message) -> None:
        kind, number = message[0], message[1]
        future = self._waiting.get(number)
        if future is not None:
            if future.done():
                return
            if kind == "ok":
                future.set_result(message[2])
            else:
                future.set_exception(error_from(message[2]))
            return
        queue = self._streams.get(number)
        if queue is not None:
            queue.put_nowait(message)

    def _lost(self) -> None:
        self._protocol = None
        for future in self._waiting.values():
            if not future.done():
                future.set_exception(_GONE)
        for queue in self._streams.values():
            queue.put_nowait(("error", 0, (_GONE.code.value, _GONE.message)))
        self.closed.set()


class RelayedCounter:
    """One of the daemon's counters as a worker adds to it: ``labels(...).inc()``, as prometheus_client's, each
    increment sent to the daemon (edged.frontends.relay.host, ``count``)."""

    def __init__(self, relay: Relay, name: str) -> None:
        self._relay = relay
        self._name = name

    def labels(self, *values: str) -> _RelayedChild:
        return _RelayedChild(self._relay, self._name, values)


class _RelayedChild:
    __slots__ = ("_name", "_relay", "_values")

    def __init__(self, relay: Relay, name: str, values: tuple[str, ...]) -> None:
        self._relay, self._name, self._values = relay, name, values

    def inc(self, amount: float = 1) -> None:
        with contextlib.suppress(EdgedError):  # the daemon is gone: nobody to count for
            self._relay.send(("count", 0, self._name, self._values, amount))


class RemoteService:
    """The inference path of edged.core.service.InferencePath, served by the daemon over ``relay``."""

    def __init__(self, relay: Relay) -> None:
        self._relay = relay
        # (name, version asked for) -> (trusted until, handle); the signature of each handle's version.
        self._lookups: dict[tuple[str, int], tuple[float, ModelHandle]] = {}
        self._signatures: dict[tuple[str, int], ModelSignature] = {}
        # A worker samples no traces: its requests are traced neither here nor by the daemon.
        self.tracing = TraceManager()

    def find_model(self, name: str, version: int) -> ModelHandle:
        key = (name, version)
        now = time.monotonic()
        found = self._lookups.get(key)
        if found is None or found[0] < now:
            resolved_name, resolved_version, decoupled, signature = self._relay.blocking("lookup", name, version)
            if len(self._lookups) > 4096:
                self._lookups.clear()
                self._signatures.clear()
            # Without the daemon's record: the daemon looks the version up again when the request arrives.
            handle = ModelHandle(resolved_name, resolved_version, decoupled, None)
            found = (now + LOOKUP_TTL_S, handle)
            self._lookups[key] = found
            self._signatures[(resolved_name, resolved_version)] = signature
        return found[1]

    def raw_input(self, model: ModelHandle, raw: bytes | memoryview) -> InferInput:
        return raw_binary_input(self.model_signature(model), raw)

    def model_signature(self, model: ModelHandle) -> ModelSignature:
        signature = self._signatures.get((model.name, model.version))
        if signature is None:
            raise EdgedError(ErrorCode.UNAVAILABLE, f"model '{model.name}' is not ready")
        return signature

    async def infer(self, request: InferRequest, handle: ModelHandle | None = None) -> InferResponse:
        return unpack_response(await self._relay.call("infer", pack_request(request)))

    def refused(self, model: ModelHandle | None) -> None:
        """An error this worker answered itself: the daemon counts it for its metrics history."""
        with contextlib.suppress(EdgedError):  # the daemon is gone: nobody to count for
            if model is None:
                self._relay.send(("refused", 0, None, 0))
            else:
                self._relay.send(("refused", 0, model.name, model.version))

    async def infer_stream(
        self, request: InferRequest, handle: ModelHandle | None = None
    ) -> AsyncIterator[StreamResponse]:
        relay = self._relay
        number = relay.number()
        queue = relay.open_stream(number)
        finished = False
        try:
            relay.send(("stream", number, pack_request(request)))
            while True:
                message = await queue.get()
                if message[0] == "error":
                    finished = True
                    raise error_from(message[2])
                response, error, final = message[2]
                yield StreamResponse(
                    unpack_response(response) if response is not None else None,
                    error_from(error) if error is not None else None,
                    final,
                )
                if final:
                    finished = True
                    return
        finally:
            relay.close_stream(number)
            if not finished:
                with contextlib.suppress(EdgedError):
                    relay.send(("cancel", number))


class RelayApp:
    """The ASGI app of a worker's HTTP endpoint for everything but inference: the daemon's app answers."""

    def __init__(self, relay: Relay) -> None:
        self._relay = relay

    async def __call__(self, scope: dict[str, Any], receive: Any, send: Any) -> None:
        if scope["type"] != "http":
            return
        relay = self._relay
        number = relay.number()
        replies = relay.open_stream(number)
        forwarding: asyncio.Task[None] | None = None
        started = False
        try:
            relay.send(("http", number, {key: scope[key] for key in SCOPE_KEYS if key in scope}))
            forwarding = asyncio.ensure_future(self._forward_body(number, receive))
            while True:
                message = await replies.get()
                if message[0] == "done":
                    break
                if message[0] == "error":
                    raise error_from(message[2])
                started = True
                await send(message[2])
        except EdgedError as exc:
            # The daemon went away (it is stopping, or restarting this worker): a plain 503, as a busy server's.
            log.warning("a relayed HTTP request failed: %s", exc.message)
            if not started:
                body = json.dumps({"error": exc.message}).encode()
                headers = [(b"content-type", b"application/json"), (b"content-length", str(len(body)).encode())]
                await send({"type": "http.response.start", "status": 503, "headers": headers})
                await send({"type": "http.response.body", "body": body})
        finally:
            relay.close_stream(number)
            if forwarding is not None:
                forwarding.cancel()

    async def _forward_body(self, number: int, receive: Any) -> None:
        # The body as it arrives, then the disconnect that follows it (the daemon's app may wait for one).
        while True:
            message = await receive()
            self._relay.send(("body", number, message))
            if message["type"] == "http.disconnect":
                return
