"""One HTTP/2 stream of edged.frontends.grpc.http2 as the gRPC layer sees it: what receives the request
(``StreamHandler``), and the reply written within the client's flow control windows (``Stream``)."""

from __future__ import annotations

import asyncio
import enum
from typing import TYPE_CHECKING, Protocol

from edged.frontends.grpc.bounds import STREAM_WINDOW
from edged.frontends.grpc.frames import (
    CANCEL,
    DATA,
    FLAG_END_HEADERS,
    FLAG_END_STREAM,
    HEADERS,
    RST_STREAM,
    WINDOW_UPDATE,
    frame,
)

if TYPE_CHECKING:
    from edged.frontends.grpc.http2 import Http2Connection


class Refusal(enum.Enum):
    """Why the connection ends a stream's request before its handler has it all."""

    BUFFERS = "buffers"  # the connection or the endpoint holds its most request bytes
    SLOW_BODY = "slow body"  # the request arrives slower than the minimum rate


class StreamHandler(Protocol):
    """What a stream's request reaches: the gRPC call on it."""

    def data(self, chunk: bytes) -> None: ...

    def end(self) -> None: ...

    def reset(self) -> None: ...

    def refuse(self, why: Refusal, message: str) -> None:
        """The request will not be read to its end: answer with an error and end the stream."""
        ...


class Stream:
    """One request and its reply. ``open_local``: the server may still send; ``open_remote``: the client may.

    ``buffered``: bytes of DATA the handler holds and has not parsed yet (released with ``release``), counted
    against the connection's and the endpoint's budgets. ``whole_body``: the handler can do nothing before the
    request ends (a unary call), so a stream that is still open for the client is waiting for its body; otherwise
    it waits only while it holds part of a message."""

    __slots__ = (
        "buffered",
        "connection",
        "content_length",
        "handler",
        "id",
        "judged",
        "open_local",
        "open_remote",
        "received",
        "recv_window",
        "send_window",
        "taken",
        "total",
        "waiting_since",
        "whole_body",
        "window_opened",
    )

    def __init__(self, connection: Http2Connection, stream_id: int, send_window: int) -> None:
        self.connection = connection
        self.id = stream_id
        self.send_window = send_window
        self.recv_window = STREAM_WINDOW
        self.open_local = True
        self.open_remote = True
        self.handler: StreamHandler | None = None
        self.window_opened: asyncio.Event | None = None
        self.taken = 0  # bytes the handler has taken and the client has not been given back yet
        self.buffered = 0
        self.whole_body = True
        self.content_length: int | None = None
        self.total = 0  # DATA bytes received, checked against content-length
        self.received = 0  # DATA bytes received since the connection last looked (its minimum rate)
        self.judged = False  # waiting for its request when the connection last looked
        self.waiting_since = 0.0  # when it began waiting for the client's window

    def acknowledge(self, size: int) -> None:
        """The handler has taken ``size`` bytes of DATA: the client may send that many more on this stream. Given
        back once half the window is taken, not per frame: a small call then costs no WINDOW_UPDATE (a write of its
        own, and a frame for the client to read) at all."""
        if size > 0 and self.open_remote:
            taken = self.taken + size
            if taken < STREAM_WINDOW // 2:
                self.taken = taken
                return
            self.taken = 0
            self.recv_window += taken
            self.connection.control(frame(WINDOW_UPDATE, 0, self.id, taken.to_bytes(4, "big")))

    def release(self, size: int) -> None:
        """The handler no longer holds ``size`` of the bytes it was given."""
        size = min(size, self.buffered)
        if size > 0:
            self.buffered -= size
            self.connection.release(size)

    def reply(self, headers: bytes, body: bytes, trailers: bytes) -> bool:
        """Headers, one DATA frame and the trailers in one write, when the windows allow; False when they do not
        (then ``send_data`` waits for them)."""
        connection = self.connection
        size = len(body)
        if (
            not self.open_local
            or size > self.send_window
            or size > connection.send_window
            or size > connection.peer_max_frame
            or connection.writing_paused
            or connection.closed
        ):
            return False
        self.send_window -= size
        connection.send_window -= size
        connection.write(
            frame(HEADERS, FLAG_END_HEADERS, self.id, headers)
            + frame(DATA, 0, self.id, body)
            + frame(HEADERS, FLAG_END_HEADERS | FLAG_END_STREAM, self.id, trailers)
        )
        connection.close_local(self)
        return True

    def send_headers(self, block: bytes, *, end_stream: bool = False) -> None:
        if not self.open_local or self.connection.closed:
            return
        self.connection.write_headers(self.id, block, end_stream)
        if end_stream:
            self.connection.close_local(self)

    async def send_data(self, data: bytes) -> None:
        """Writes ``data`` within the client's windows and frame size, waiting for them and for the transport;
        returns early, without error, once the stream or the connection is gone (the connection resets a stream
        whose client opens no window for a while, and drops a client that reads nothing)."""
        connection = self.connection
        view = memoryview(data)
        while view:
            if not self.open_local or connection.closed:
                return
            if connection.writing_paused:
                await connection.drained()
                continue
            size = min(len(view), self.send_window, connection.send_window, connection.peer_max_frame)
            if size <= 0:
                await self._window()
                continue
            self.send_window -= size
            connection.send_window -= size
            connection.write(frame(DATA, 0, self.id, bytes(view[:size])))
            view = view[size:]

    async def _window(self) -> None:
        event = self.window_opened = asyncio.Event()
        connection = self.connection
        self.waiting_since = connection.now()
        connection.waiting.add(self)
        try:
            await event.wait()
        finally:
            connection.waiting.discard(self)
            self.window_opened = None

    def reset(self, code: int = CANCEL) -> None:
        """Ends the stream from the server's side (RST_STREAM)."""
        connection = self.connection
        if self.open_local or self.open_remote:
            self.open_remote = False
            if not connection.closed:
                connection.control(frame(RST_STREAM, 0, self.id, code.to_bytes(4, "big")))
            connection.close_local(self)
        if self.window_opened is not None:
            self.window_opened.set()
