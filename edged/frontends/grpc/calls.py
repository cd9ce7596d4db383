"""gRPC calls on the HTTP/2 streams of edged.frontends.grpc.http2: the wire format of the gRPC protocol (length-
prefixed messages, ``grpc-encoding``, ``grpc-timeout``, status trailers) and the servicer methods it calls.

A servicer method is called as grpc.aio calls it, ``method(request, context)`` for a unary RPC and
``method(request_iterator, context)`` returning an async iterator for a bidirectional stream (``method(request,
context)`` for one where only the server streams, as ``grpc.health.v1.Health/Watch``), with a ``Call`` as
the context: the part of grpc.aio's ``ServicerContext`` the servicers use (``abort``, ``invocation_metadata``,
``peer``, ``time_remaining``, ``auth_context``). So the servicers run unchanged on either server.

Status codes and texts follow grpc's own servers where a client can see them: an unknown method is UNIMPLEMENTED
"Method not found!", a message over the size limit RESOURCE_EXHAUSTED, an expired ``grpc-timeout``
DEADLINE_EXCEEDED "Deadline Exceeded" (at once for one that has already passed), an exception a servicer lets
escape UNKNOWN. What grpc's servers do not bound, edged.frontends.grpc.http2 does, and a call it refuses answers
RESOURCE_EXHAUSTED (the endpoint holds its most request bytes) or DEADLINE_EXCEEDED (the request arrives slower than
the minimum rate).
"""

from __future__ import annotations

import asyncio
import base64
import logging
import zlib
from collections.abc import AsyncIterator, Callable, Iterable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Final, NoReturn
from urllib.parse import quote

from edged.frontends.grpc.frames import header_block
from edged.frontends.grpc.status import StatusCode
from edged.frontends.grpc.streams import Refusal
from edged.frontends.tls import peer_identity_transport

if TYPE_CHECKING:
    from edged.frontends.grpc.streams import Stream

log = logging.getLogger(__name__)

_OK_HEADERS: Final = header_block([(b":status", b"200"), (b"content-type", b"application/grpc")])
_OK_TRAILERS: Final = header_block([(b"grpc-status", b"0")])
# Request headers that are the protocol's, not the caller's metadata.
_NOT_METADATA: Final = frozenset(
    {b"te", b"content-type", b"grpc-timeout", b"grpc-encoding", b"grpc-accept-encoding", b"user-agent"}
)
_TIMEOUT_UNITS: Final = {b"H": 3600.0, b"M": 60.0, b"S": 1.0, b"m": 1e-3, b"u": 1e-6, b"n": 1e-9}
_INFLATE_WBITS: Final = {b"gzip": 16 + zlib.MAX_WBITS, b"deflate": zlib.MAX_WBITS}
# Complete messages a stream holds that its servicer has not taken: past this the stream's window is no longer
# given back, and HTTP/2 flow control makes the client wait.
_QUEUED_MESSAGES: Final = 4
_REFUSAL_STATUS: Final = {
    Refusal.BUFFERS: StatusCode.RESOURCE_EXHAUSTED,
    Refusal.SLOW_BODY: StatusCode.DEADLINE_EXCEEDED,
}


@dataclass(frozen=True, slots=True)
class Method:
    """One RPC: how its request is parsed, what serves it, and whether the client streams (then the server does
    too) or only the server does."""

    parse: Callable[[bytes | memoryview], Any]
    serve: Callable[..., Any]
    streaming: bool
    server_streaming: bool = False


def methods(services: Iterable[tuple[Any, Any]]) -> dict[bytes, Method]:
    """The RPCs of each (servicer, service descriptor), by HTTP/2 path: those the servicer has a method for (any
    other is answered UNIMPLEMENTED, as grpc answers one). These services have unary, bidirectional and server
    streaming RPCs, no client streaming one."""
    from google.protobuf import message_factory

    table: dict[bytes, Method] = {}
    for servicer, descriptor in services:
        for rpc in descriptor.methods:
            serve = getattr(servicer, rpc.name, None)
            if serve is None or (rpc.client_streaming and not rpc.server_streaming):
                continue
            parse = message_factory.GetMessageClass(rpc.input_type).FromString
            path = f"/{descriptor.full_name}/{rpc.name}".encode()
            table[path] = Method(parse, serve, rpc.client_streaming, rpc.server_streaming and not rpc.client_streaming)
    return table


class Aborted(Exception):
    """``Call.abort``: the call ends with this status."""

    def __init__(self, code: StatusCode, details: str) -> None:
        super().__init__(details)
        self.code = code
        self.details = details


class Limits:
    """What every call on the endpoint shares: the message size bound and the calls in flight (for stopping)."""

    def __init__(self, max_message_size: int) -> None:
        self.max_message_size = max_message_size
        self.tasks: set[asyncio.Task[None]] = set()
        # Kept: asking asyncio for the running loop costs a system call (getpid) each time.
        self.loop = asyncio.get_running_loop()


class Call:
    """One RPC on one stream, and its ServicerContext."""

    __slots__ = (
        "_body",
        "_deadline",
        "_deferred",
        "_expired",
        "_headers",
        "_inflate",
        "_limits",
        "_messages",
        "_method",
        "_peer",
        "_started",
        "_stream",
        "_task",
        "_timer",
    )

    def __init__(
        self,
        stream: Stream,
        method: Method,
        headers: list[tuple[bytes, bytes]],
        peer: str,
        limits: Limits,
        timeout: float | None,
        inflate: int | None,
    ) -> None:
        self._stream = stream
        self._method = method
        self._headers = headers
        self._peer = peer
        self._limits = limits
        self._inflate = inflate
        self._body = bytearray()
        self._messages: asyncio.Queue[Any] | None = None
        self._deferred = 0
        self._task: asyncio.Task[None] | None = None
        self._expired = False
        self._started = False  # a streaming call's reply headers are sent
        loop = limits.loop
        self._deadline = loop.time() + timeout if timeout is not None else None
        self._timer = loop.call_at(self._deadline, self._expire) if self._deadline is not None else None
        # A unary call can do nothing before its request ends; a streaming one waits only inside a message.
        stream.whole_body = not method.streaming
        if method.streaming:
            self._messages = asyncio.Queue()
            self._start(self._run_stream(lambda: method.serve(self._requests(), self)))

    # --- the stream's events (edged.frontends.grpc.http2.StreamHandler) ----------------------------------

    def data(self, chunk: bytes) -> None:
        """``chunk`` counts against the endpoint's budget of request bytes (``Stream.buffered``) until it is parsed
        into a message: released here for a streaming call, once the request is parsed for a unary one."""
        body = self._body
        body += chunk
        if self._messages is None:
            self._stream.acknowledge(len(chunk))
            if len(body) >= 5:
                size = max(int.from_bytes(body[1:5], "big"), len(body) - 5)
                if size > self._limits.max_message_size:
                    self._refuse_size(size)
            return
        queued_before = self._messages.qsize()
        try:
            while len(body) >= 5:
                size = int.from_bytes(body[1:5], "big")
                if size > self._limits.max_message_size:
                    self._refuse_size(size)
                    return
                if len(body) < 5 + size:
                    break
                message = self._decode(bytes(body[: 5 + size]))
                del body[: 5 + size]
                self._stream.release(5 + size)
                self._messages.put_nowait(message)
        except Aborted as exc:
            self._finish(exc.code, exc.details)
            if self._task is not None:
                self._task.cancel()
            return
        if queued_before + self._messages.qsize() > _QUEUED_MESSAGES:
            self._deferred += len(chunk)
        else:
            self._stream.acknowledge(len(chunk))

    def end(self) -> None:
        if self._messages is not None:
            if self._body:
                self._finish(StatusCode.INTERNAL, "the request stream ended inside a message")
                if self._task is not None:
                    self._task.cancel()
            else:
                self._messages.put_nowait(None)
            return
        # Parsed in place: protobuf copies what it keeps, so the body is not copied first (a tensor may be MiBs).
        body = memoryview(self._body)
        if len(body) < 5 or int.from_bytes(body[1:5], "big") != len(body) - 5:
            # grpc's text for a unary request without exactly one message.
            self._finish(StatusCode.INTERNAL, "Failed to read the request: not exactly one message")
            return
        try:
            request = self._decode(body)
        except Aborted as exc:
            self._finish(exc.code, exc.details)
            return
        finally:
            body.release()
            self._stream.release(len(self._body))
            self._body = bytearray()
        if self._method.server_streaming:
            self._start(self._run_stream(lambda: self._method.serve(request, self)))
        else:
            self._start(self._run_unary(request))

    def reset(self) -> None:
        if self._timer is not None:
            self._timer.cancel()
        if self._task is not None:
            self._task.cancel()
        elif self._messages is not None:
            self._messages.put_nowait(None)

    def refuse(self, why: Refusal, message: str) -> None:
        self._finish(_REFUSAL_STATUS[why], message)
        if self._task is not None:
            self._task.cancel()

    # --- ServicerContext ----------------------------------------------------------------------------------

    async def abort(self, code: StatusCode, details: str = "") -> NoReturn:
        raise Aborted(code, details)

    def invocation_metadata(self) -> tuple[tuple[str, str | bytes], ...]:
        pairs: list[tuple[str, str | bytes]] = []
        for name, value in self._headers:
            if name[:1] == b":" or name in _NOT_METADATA:
                continue
            key = name.decode("ascii", "replace")
            if key.endswith("-bin"):
                try:
                    pairs.append((key, base64.b64decode(value + b"=" * (-len(value) % 4))))
                except ValueError:
                    continue
            else:
                pairs.append((key, value.decode("latin-1")))
        return tuple(pairs)

    def peer(self) -> str:
        return self._peer

    def time_remaining(self) -> float | None:
        if self._deadline is None:
            return None
        return max(0.0, self._deadline - self._limits.loop.time())

    def auth_context(self) -> dict[str, list[bytes]]:
        name = peer_identity_transport(self._stream.connection.transport)
        return {"x509_common_name": [name.encode()]} if name is not None else {}

    # --- running the servicer -----------------------------------------------------------------------------

    def _start(self, coroutine: Any) -> None:
        task = self._task = self._limits.loop.create_task(coroutine)
        tasks = self._limits.tasks
        tasks.add(task)
        task.add_done_callback(tasks.discard)

    def _expired_task_done(self, task: asyncio.Task[None]) -> None:
        if self._stream.open_local:
            # Cancelled before it first ran (its deadline passed at once): it never got to answer, and its stream
            # would stay open for good.
            self._finish(StatusCode.DEADLINE_EXCEEDED, "Deadline Exceeded")

    def _decode(self, framed: bytes | memoryview) -> Any:
        payload = framed[5:]
        if framed[0]:
            if self._inflate is None:
                raise Aborted(StatusCode.INTERNAL, "a compressed message without grpc-encoding")
            limit = self._limits.max_message_size
            inflater = zlib.decompressobj(self._inflate)
            try:
                payload = inflater.decompress(payload, limit + 1)
            except zlib.error:
                raise Aborted(StatusCode.INTERNAL, "the message cannot be decompressed") from None
            if len(payload) > limit:
                raise Aborted(
                    StatusCode.RESOURCE_EXHAUSTED,
                    f"Received message larger than max (more than {limit} bytes once decompressed)",
                )
        try:
            return self._method.parse(payload)
        except Exception:  # protobuf's DecodeError, or an error of the message's own checks
            raise Aborted(StatusCode.INTERNAL, "Exception deserializing request!") from None

    async def _run_unary(self, request: Any) -> None:
        try:
            reply = await self._method.serve(request, self)
            message = self._encode(reply)
        except asyncio.CancelledError:
            self._cancelled()
            return
        except Aborted as exc:
            self._finish(exc.code, exc.details)
            return
        except Exception as exc:
            self._failed(exc)
            return
        if self._timer is not None:
            self._timer.cancel()
        stream = self._stream
        if not stream.reply(_OK_HEADERS, message, _OK_TRAILERS):
            stream.send_headers(_OK_HEADERS)
            await stream.send_data(message)
            stream.send_headers(_OK_TRAILERS, end_stream=True)

    async def _run_stream(self, replies: Callable[[], AsyncIterator[Any]]) -> None:
        stream = self._stream
        try:
            async for reply in replies():
                message = self._encode(reply)
                if not self._started:
                    stream.send_headers(_OK_HEADERS)
                    self._started = True
                await stream.send_data(message)
        except asyncio.CancelledError:
            self._cancelled()
            return
        except Aborted as exc:
            self._finish(exc.code, exc.details)
            return
        except Exception as exc:
            self._failed(exc)
            return
        if self._timer is not None:
            self._timer.cancel()
        if not self._started:
            stream.send_headers(_OK_HEADERS)
        stream.send_headers(_OK_TRAILERS, end_stream=True)

    async def _requests(self) -> AsyncIterator[Any]:
        messages = self._messages
        assert messages is not None
        while True:
            message = await messages.get()
            if message is None:
                return
            if self._deferred and messages.qsize() <= _QUEUED_MESSAGES:
                self._stream.acknowledge(self._deferred)
                self._deferred = 0
            yield message

    def _encode(self, reply: Any) -> bytes:
        # A relayed RPC's reply is the daemon's bytes, passed on as they are.
        data: bytes = reply if isinstance(reply, bytes) else reply.SerializeToString()
        limit = self._limits.max_message_size
        if len(data) > limit:
            raise Aborted(StatusCode.RESOURCE_EXHAUSTED, f"Sent message larger than max ({len(data)} vs. {limit})")
        return b"\0" + len(data).to_bytes(4, "big") + data

    def _cancelled(self) -> None:
        if self._expired:
            self._finish(StatusCode.DEADLINE_EXCEEDED, "Deadline Exceeded")
        # Otherwise the client reset the stream or went away: there is no one to answer.

    def _failed(self, exc: Exception) -> None:
        log.error("unhandled error in gRPC call", exc_info=exc)
        self._finish(StatusCode.UNKNOWN, f"Unexpected {type(exc).__name__}")

    def _expire(self) -> None:
        self._timer = None
        self._expired = True
        if self._task is not None:
            self._task.cancel()
            self._task.add_done_callback(self._expired_task_done)
        else:
            self._finish(StatusCode.DEADLINE_EXCEEDED, "Deadline Exceeded")

    def _refuse_size(self, size: int) -> None:
        limit = self._limits.max_message_size
        self._finish(StatusCode.RESOURCE_EXHAUSTED, f"Received message larger than max ({size} vs. {limit})")
        if self._task is not None:
            self._task.cancel()

    def _finish(self, code: StatusCode, details: str) -> None:
        """Ends the call with a status: as trailers once a streaming call's replies have begun."""
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None
        finish(self._stream, code, details, self._started)


def finish(stream: Stream, code: StatusCode, details: str, started: bool = False) -> None:
    """Ends the call with a status: as trailers after the reply's headers, or as a trailers-only reply."""
    trailers = [(b"grpc-status", str(code.value[0]).encode())]
    if details:
        trailers.append((b"grpc-message", quote(details, safe=" !\"#$&'()*+,-./:;<=>?@[\\]^_`{|}~").encode()))
    if not started:
        trailers = [(b":status", b"200"), (b"content-type", b"application/grpc"), *trailers]
    stream.send_headers(header_block(trailers), end_stream=True)


def timeout_of(value: bytes) -> float | None:
    """``grpc-timeout``: at most 8 digits and a unit; None when it is not one."""
    if not 2 <= len(value) <= 9 or not value[:-1].isdigit():
        return None
    unit = _TIMEOUT_UNITS.get(value[-1:])
    return int(value[:-1]) * unit if unit is not None else None


def inflater_of(encoding: bytes | None) -> int | None:
    """zlib's window bits for ``grpc-encoding`` (None for identity); KeyError for an encoding not supported."""
    if encoding is None or encoding == b"identity":
        return None
    return _INFLATE_WBITS[encoding]
