"""HTTP/2 (RFC 9113) for the gRPC endpoint, on the event loop: one ``Http2Connection`` protocol per connection.

Why not grpc.aio: its server spends 300-400 µs of CPU per unary call on this class of device, in grpc's own
threads and their hand-offs to the event loop, which is two to three times what Triton's C++ server spends on the
whole call. HTTP/2 as gRPC uses it is small: a request is a HEADERS frame and DATA, a reply HEADERS, DATA and
trailers. This module holds the connection: its life cycle, writing, and reading frames off the socket; what each
frame does to it (settings, flow control, resets, DATA, header blocks) is edged.frontends.grpc.inbound, part of the
same class; header blocks are decoded and checked by edged.frontends.grpc.blocks; the gRPC layer
(edged.frontends.grpc.calls) sees streams.

What a peer can do to the daemon is bounded (edged.frontends.grpc.bounds states each bound): every frame's length
and shape (a malformed one ends the connection with GOAWAY and the RFC's error code, a malformed request only its
stream with RST_STREAM PROTOCOL_ERROR), the header block from each frame's header before it is read, streams open
at once on the connection and on the endpoint (more are refused with REFUSED_STREAM), request bytes held per
connection and per endpoint, the rates of resets, SETTINGS and frames that do nothing (past them GOAWAY
ENHANCE_YOUR_CALM), and time: a request must keep arriving, a reply must be read, a connection must do something.

The loop is shared by every connection and by HTTP: one read is parsed for at most ``READ_SLICE_S`` before the
others get their turn, and a connection whose client does not read what it is sent is not read from either
(reading stops while the transport's writing is paused), so its control-frame answers cannot pile up. Frames
written while a read is parsed are joined into one write.

Header blocks the server sends never use the HPACK dynamic table (literals without indexing and the static
table), so they are constant bytes for the common replies.
"""

from __future__ import annotations

import asyncio
import logging
import struct
from collections.abc import Callable
from typing import Final, cast

from edged.frontends.grpc.blocks import BlockDecoder
from edged.frontends.grpc.bounds import (
    CONNECTION_WINDOW,
    IDLE_FRAME_RATE,
    LINGER_S,
    MAX_FRAME,
    MAX_HEADER_BLOCK,
    MAX_HEADER_LIST,
    MAX_QUEUED_CONTROL,
    MAX_STREAMS,
    READ_SLICE_S,
    RESET_RATE,
    SETTINGS_RATE,
    STREAM_WINDOW,
    Budget,
    ConnectionTimes,
    Rate,
)
from edged.frontends.grpc.frames import (
    CONTINUATION,
    DEFAULT_MAX_FRAME,
    DEFAULT_WINDOW,
    ENHANCE_YOUR_CALM,
    FLAG_END_HEADERS,
    FLAG_END_STREAM,
    FRAME_SIZE_ERROR,
    GOAWAY,
    HEADERS,
    NO_ERROR,
    PREFACE,
    PROTOCOL_ERROR,
    RST_STREAM,
    SETTINGS,
    SETTINGS_INITIAL_WINDOW_SIZE,
    SETTINGS_MAX_CONCURRENT_STREAMS,
    SETTINGS_MAX_FRAME_SIZE,
    SETTINGS_MAX_HEADER_LIST_SIZE,
    WINDOW_UPDATE,
    ProtocolError,
    frame,
)
from edged.frontends.grpc.inbound import InboundFrames
from edged.frontends.grpc.streams import Refusal, Stream, StreamHandler

log = logging.getLogger(__name__)

# Frames written while a read is parsed are joined, and written once they reach this many bytes (or the read ends).
_FLUSH_BYTES: Final = 16 << 10


class Http2Connection(InboundFrames, asyncio.Protocol):
    """The server side of one HTTP/2 connection. ``on_stream(stream, headers)`` is called for each new request
    with its decoded headers and returns what receives its DATA; it may answer at once instead (and return None).
    ``on_close`` is called once, when the connection is gone. ``budget`` is the endpoint's, shared by its
    connections."""

    def __init__(
        self,
        on_stream: Callable[[Stream, list[tuple[bytes, bytes]]], StreamHandler | None],
        on_open: Callable[[Http2Connection], bool],
        on_close: Callable[[Http2Connection], None],
        times: ConnectionTimes,
        budget: Budget,
    ) -> None:
        self._on_stream = on_stream
        self._on_open = on_open
        self._on_close = on_close
        self._times = times
        self._budget = budget
        self.transport: asyncio.Transport | None = None
        self.streams: dict[int, Stream] = {}
        self.waiting: set[Stream] = set()
        self.send_window = DEFAULT_WINDOW
        self.peer_max_frame = DEFAULT_MAX_FRAME
        self.writing_paused = False
        self.closed = False
        self.buffered = 0  # request bytes the connection's handlers hold (Budget)
        self._drained: asyncio.Future[None] | None = None
        self._peer_stream_window = DEFAULT_WINDOW
        self._recv_window = CONNECTION_WINDOW
        self._unacknowledged = 0
        # Bytes of a frame not complete yet (or not parsed yet, while reading is stalled), kept as they came and
        # joined once the frame is whole: joining on every read would copy a large frame once per read (a 600 KB
        # tensor arrives in many).
        self._held: list[bytes] = []
        self._held_size = 0
        self._wanted = len(PREFACE)  # bytes held before parsing can go on
        self._stalled = False  # reading stopped: the client does not read, or this read had its share of the loop
        self._stalled_since_tick = False
        self._out: list[bytes] | None = None  # frames joined into one write while a read is parsed
        self._out_size = 0
        self._queued_control = 0  # control frames written since the transport last had nothing buffered
        self._preface = False
        self._settled = False  # the client's first SETTINGS came
        self._last_stream = 0
        self._going_away = False
        self._headers: tuple[int, int, bytearray] | None = None  # a header block awaiting CONTINUATION
        self._continuations = 0
        self._blocks = BlockDecoder()
        self._timer: asyncio.TimerHandle | None = None
        self._tick: asyncio.TimerHandle | None = None
        self._idle_since = 0.0
        self._paused_since = 0.0
        self._loop = asyncio.get_running_loop()
        now = self._loop.time()
        self._resets = Rate(RESET_RATE, now)
        self._settings_rate = Rate(SETTINGS_RATE, now)
        self._idle_frames = Rate(IDLE_FRAME_RATE, now)

    def now(self) -> float:
        return self._loop.time()

    # --- life cycle ---------------------------------------------------------------------------------------

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        transport = cast("asyncio.Transport", transport)  # uvloop's transports are not asyncio's classes
        self.transport = transport
        if not self._on_open(self):
            self.closed = True
            transport.abort()
            return
        settings = struct.pack(
            ">HLHLHLHL",
            SETTINGS_MAX_CONCURRENT_STREAMS,
            MAX_STREAMS,
            SETTINGS_INITIAL_WINDOW_SIZE,
            STREAM_WINDOW,
            SETTINGS_MAX_FRAME_SIZE,
            MAX_FRAME,
            SETTINGS_MAX_HEADER_LIST_SIZE,
            MAX_HEADER_LIST,
        )
        transport.write(
            frame(SETTINGS, 0, 0, settings)
            + frame(WINDOW_UPDATE, 0, 0, (CONNECTION_WINDOW - DEFAULT_WINDOW).to_bytes(4, "big"))
        )
        self._arm(self._times.handshake_timeout_s)

    def connection_lost(self, exc: Exception | None) -> None:
        self.closed = True
        if self._timer is not None:
            self._timer.cancel()
        if self._tick is not None:
            self._tick.cancel()
            self._tick = None
        self._held.clear()
        streams = list(self.streams.values())
        for stream in streams:
            stream.open_local = stream.open_remote = False
            self._forget(stream)
            if stream.handler is not None:
                stream.handler.reset()
        for stream in list(self.waiting):
            if stream.window_opened is not None:
                stream.window_opened.set()
        if self._drained is not None and not self._drained.done():
            self._drained.set_result(None)
        self._on_close(self)

    def pause_writing(self) -> None:
        self.writing_paused = True
        self._paused_since = self._loop.time()
        self._ticking()

    def resume_writing(self) -> None:
        self.writing_paused = False
        self._queued_control = 0
        if self._drained is not None and not self._drained.done():
            self._drained.set_result(None)
        self._drained = None
        if self._stalled:
            self._unstall()

    async def drained(self) -> None:
        if self._drained is None:
            self._drained = self._loop.create_future()
        await self._drained

    def write(self, data: bytes) -> None:
        if self.closed or self.transport is None:
            return
        out = self._out
        if out is None:
            self.transport.write(data)
            return
        out.append(data)
        self._out_size += len(data)

    def control(self, data: bytes) -> None:
        """Writes a control frame (an acknowledgement, RST_STREAM, WINDOW_UPDATE): those a client that does not
        read would make the daemon queue are counted (``MAX_QUEUED_CONTROL``)."""
        self._queued_control += 1
        self.write(data)
        if self._out is None:
            self._check_queue()

    def write_headers(self, stream_id: int, block: bytes, end_stream: bool) -> None:
        end = FLAG_END_STREAM if end_stream else 0
        if len(block) <= self.peer_max_frame:
            self.write(frame(HEADERS, FLAG_END_HEADERS | end, stream_id, block))
            return
        size = self.peer_max_frame
        chunks = [block[i : i + size] for i in range(0, len(block), size)]
        frames = [frame(HEADERS, end, stream_id, chunks[0])]
        frames += [frame(CONTINUATION, 0, stream_id, chunk) for chunk in chunks[1:-1]]
        frames.append(frame(CONTINUATION, FLAG_END_HEADERS, stream_id, chunks[-1]))
        self.write(b"".join(frames))

    def close_local(self, stream: Stream) -> None:
        """The server has ended its side: a stream the client still sends on is reset (gRPC's server ends a call
        this way when it answers before reading the whole request)."""
        if not stream.open_local:
            return
        stream.open_local = False
        if stream.open_remote:
            stream.open_remote = False
            self.control(frame(RST_STREAM, 0, stream.id, NO_ERROR.to_bytes(4, "big")))
        self._forget(stream)

    def release(self, size: int) -> None:
        """A stream's handler no longer holds ``size`` request bytes (``Stream.release``)."""
        self.buffered -= size
        self._budget.buffered -= size

    def go_away(self, code: int = NO_ERROR, message: str = "") -> None:
        """No new streams: the client is told which were taken, and the connection closes once they are done
        (at once for an error)."""
        if self.closed:
            return
        if not self._going_away:
            self._going_away = True
            self.write(frame(GOAWAY, 0, 0, struct.pack(">LL", self._last_stream, code) + message.encode()[:256]))
        if code != NO_ERROR or not self.streams:
            self._close()

    def abort(self) -> None:
        if self.transport is not None and not self.closed:
            self.transport.abort()

    # --- the endpoint's connection limit (edged.frontends.grpc.server) ---------------------------------------------

    @property
    def settled(self) -> bool:
        """The client's side of the HTTP/2 handshake (its preface and first SETTINGS) has arrived."""
        return self._settled

    def idle_since(self) -> float | None:
        """When this connection's last call ended (or its handshake did) while it has none open and may open
        more; None otherwise."""
        if self.closed or self._going_away or not self._settled or self.streams:
            return None
        return self._idle_since

    def evict(self) -> None:
        """Closed at once to admit a new connection at the endpoint's limit; it has no call open. A settled client
        is told GOAWAY first, so that it reconnects knowing no call was lost; the transport is aborted, not closed,
        so that its file descriptor goes now rather than after a linger."""
        if self.closed or self.transport is None:
            return
        if self._settled and not self._going_away:
            self._going_away = True
            self._flush()
            goaway = struct.pack(">LL", self._last_stream, NO_ERROR) + b"connection limit"
            self.transport.write(frame(GOAWAY, 0, 0, goaway))
        self.transport.abort()

    def _close(self) -> None:
        transport = self.transport
        if transport is None or self.closed:
            return
        self._flush()
        self.closed = True
        if transport.can_write_eof():
            # The client reads the GOAWAY rather than a reset: its side stays open, what it still sends is read and
            # dropped (data_received) until it closes too, for at most LINGER_S.
            transport.write_eof()
            if self._stalled:
                transport.resume_reading()
        else:
            transport.close()
        # A client that reads nothing, or does not close, is dropped.
        self._loop.call_later(LINGER_S, transport.abort)

    def _forget(self, stream: Stream) -> None:
        if self.streams.pop(stream.id, None) is None:
            return
        self._budget.streams -= 1
        if stream.buffered:
            self.release(stream.buffered)
            stream.buffered = 0
        if not self.streams and not self.closed:
            if self._going_away:
                self._close()
            else:
                # The idle timer is not moved per call: when it fires, it looks at when the last call ended.
                self._idle_since = self._loop.time()
                if self._timer is None:
                    self._arm(self._times.idle_timeout_s)

    def _arm(self, seconds: float) -> None:
        if self._timer is not None:
            self._timer.cancel()
        self._timer = self._loop.call_later(seconds, self._expire) if seconds > 0 else None

    def _expire(self) -> None:
        self._timer = None
        if not self._settled:
            log.debug("gRPC connection closed: no HTTP/2 handshake within %s s", self._times.handshake_timeout_s)
            self.abort()
        elif not self.streams:  # with calls open it is armed again when the last one ends
            remaining = self._idle_since + self._times.idle_timeout_s - self._loop.time()
            if remaining > 0:
                self._arm(remaining)
            else:
                self.go_away(NO_ERROR, "idle")

    # --- progress: requests must arrive, replies must be read ---------------------------------------------

    def _ticking(self) -> None:
        if self._tick is None and not self.closed:
            self._tick = self._loop.call_later(self._times.body_timeout_s, self._on_tick)

    def _on_tick(self) -> None:
        """Every ``body_timeout_s`` while the connection has streams or cannot write: a stream waiting for its
        request that brought less than the minimum rate in the last window is refused; one whose client opened no
        window for it in a window is reset; a client that read nothing for a window is dropped."""
        self._tick = None
        if self.closed:
            return
        times = self._times
        now = self._loop.time()
        if self.writing_paused and now - self._paused_since >= times.body_timeout_s:
            log.debug("gRPC connection dropped: its client read nothing for %g s", times.body_timeout_s)
            self.abort()
            return
        # A window in which the daemon itself stopped reading (the client did not read) does not count.
        judge = not self._stalled_since_tick and not self._stalled
        self._stalled_since_tick = False
        least = max(1, int(times.min_body_rate * times.body_timeout_s))
        for stream in list(self.streams.values()):
            waiting = stream.open_remote and (stream.whole_body or stream.buffered > 0)
            if judge and waiting and stream.judged and stream.received < least and stream.handler is not None:
                stream.handler.refuse(
                    Refusal.SLOW_BODY,
                    f"the request arrived too slowly: {stream.received} bytes in {times.body_timeout_s:g} s, the "
                    f"minimum is {times.min_body_rate} bytes per second",
                )
            stream.judged = waiting
            stream.received = 0
        for stream in list(self.waiting):
            if now - stream.waiting_since >= times.body_timeout_s:
                log.debug("gRPC stream %d reset: its client opened no window for %g s", stream.id, times.body_timeout_s)
                stream.reset()
        if self.streams or self.writing_paused:
            self._ticking()

    # --- reading ------------------------------------------------------------------------------------------

    def data_received(self, data: bytes) -> None:
        if self.closed:
            return
        if self._held:
            self._held.append(data)
            self._held_size += len(data)
            if self._stalled or self._held_size < self._wanted:
                return
            data = b"".join(self._held)
            self._held.clear()
        elif self._stalled:
            self._hold(data, 0)
            return
        self._read(data)

    def _read(self, data: bytes) -> None:
        self._out = []
        try:
            self._frames(data)
        finally:  # whatever escapes, later writes must not be left in the list
            self._flush()

    def _frames(self, data: bytes) -> None:
        try:
            if not self._preface:
                if len(data) < len(PREFACE):
                    if not PREFACE.startswith(data):
                        raise ProtocolError(PROTOCOL_ERROR, "not an HTTP/2 connection preface")
                    self._hold(data, len(PREFACE))
                    return
                if not data.startswith(PREFACE):
                    raise ProtocolError(PROTOCOL_ERROR, "not an HTTP/2 connection preface")
                self._preface = True
                data = data[len(PREFACE) :]
            position = 0
            end = len(data)
            wanted = 9
            loop = self._loop
            until = loop.time() + READ_SLICE_S
            while end - position >= 9:
                size = (data[position] << 16) | (data[position + 1] << 8) | data[position + 2]
                if size > MAX_FRAME:
                    raise ProtocolError(FRAME_SIZE_ERROR, "frame larger than SETTINGS_MAX_FRAME_SIZE")
                kind = data[position + 3]
                if kind in (HEADERS, CONTINUATION):
                    # From the frame's header, before its payload is waited for, read or decoded.
                    pending = self._headers
                    if (len(pending[2]) if pending is not None else 0) + size > MAX_HEADER_BLOCK:
                        raise ProtocolError(ENHANCE_YOUR_CALM, "header block too large")
                if end - position < 9 + size:
                    wanted = 9 + size
                    break
                flags = data[position + 4]
                stream_id = int.from_bytes(data[position + 5 : position + 9], "big") & 0x7FFFFFFF
                payload = data[position + 9 : position + 9 + size]
                position += 9 + size
                self._frame(kind, flags, stream_id, payload)
                if self.closed:
                    return
                if self._out_size >= _FLUSH_BYTES:
                    self._flush()
                    if self.closed:
                        return
                if position < end and (self.writing_paused or loop.time() >= until):
                    self._stall()
                    wanted = 0
                    break
            if position < end:
                self._hold(data[position:], wanted)
        except ProtocolError as exc:
            log.debug("gRPC connection closed: %s", exc)
            self._held.clear()
            self.go_away(exc.code, str(exc))

    def _hold(self, rest: bytes, wanted: int) -> None:
        self._held.append(rest)
        self._held_size = len(rest)
        self._wanted = wanted

    def _flush(self) -> None:
        out = self._out
        self._out = None
        if not out:
            return
        if not self.closed and self.transport is not None:
            self._out_size = 0
            self.transport.write(out[0] if len(out) == 1 else b"".join(out))
            self._check_queue()
        self._out_size = 0

    def _check_queue(self) -> None:
        transport = self.transport
        if transport is None or self.closed:
            return
        if not transport.get_write_buffer_size():
            self._queued_control = 0
        elif self._queued_control > MAX_QUEUED_CONTROL:
            log.debug(
                "gRPC connection closed: over %d control frames queued for a client not reading", MAX_QUEUED_CONTROL
            )
            self._queued_control = 0
            self.go_away(ENHANCE_YOUR_CALM, "too many control frames queued")

    def _stall(self) -> None:
        """Stops reading: while the client does not read what it is sent (until ``resume_writing``), or until the
        loop has run everything else once."""
        self._stalled = self._stalled_since_tick = True
        if self.transport is not None:
            self.transport.pause_reading()
        if not self.writing_paused:
            self._loop.call_soon(self._continue)

    def _continue(self) -> None:
        if not self.writing_paused and self._stalled:
            self._unstall()

    def _unstall(self) -> None:
        self._stalled = False
        if self.closed or self.transport is None:
            return
        self.transport.resume_reading()
        if self._held:
            data = b"".join(self._held)
            self._held.clear()
            self._held_size = 0
            self._read(data)
