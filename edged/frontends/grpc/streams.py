"""One HTTP/2 stream of edged.frontends.grpc.http2 as the gRPC layer sees it: what receives the request
(``StreamHandler``), and the reply written within the client's flow control windows (``Stream``)."""

from __future__ import annotations

import asyncio
from typing import TYPE_CHECKING, Protocol

from edged.frontends.grpc.frames import (
    CANCEL,
    DATA,
    FLAG_END_HEADERS,
    FLAG_END_STREAM,
    HEADERS,
    RST_STREAM,
    STREAM_WINDOW,
    WINDOW_UPDATE,
    frame,
)

if TYPE_CHECKING:
    from edged.frontends.grpc.http2 import Http2Connection


class StreamHandler(Protocol):
    """What a stream's request reaches: the gRPC call on it."""

    def data(self, chunk: bytes) -> None: ...

    def end(self) -> None: ...

    def reset(self) -> None: ...


class Stream:
    """One request and its reply. ``open_remote``: the client may still send; ``open_local``: the server may."""

    __slots__ = (
        "connection",
        "handler",
        "id",
        "open_local",
        "open_remote",
        "recv_window",
        "send_window",
        "taken",
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
            self.connection.write(frame(WINDOW_UPDATE, 0, self.id, taken.to_bytes(4, "big")))

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
        returns early, without error, once the stream or the connection is gone."""
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
        self.connection.waiting.add(self)
        try:
            await event.wait()
        finally:
            self.connection.waiting.discard(self)
            self.window_opened = None

    def reset(self, code: int = CANCEL) -> None:
        """Ends the stream from the server's side (RST_STREAM)."""
        connection = self.connection
        if self.open_local or self.open_remote:
            self.open_remote = False
            if not connection.closed:
                connection.write(frame(RST_STREAM, 0, self.id, code.to_bytes(4, "big")))
            connection.close_local(self)
