"""HTTP/2 (RFC 9113) for the gRPC endpoint, on the event loop: one ``Http2Connection`` protocol per connection.

Why not grpc.aio: its server spends 300-400 µs of CPU per unary call on this class of device, in grpc's own
threads and their hand-offs to the event loop, which is two to three times what Triton's C++ server spends on the
whole call. HTTP/2 as gRPC uses it is small: a request is a HEADERS frame and DATA, a reply HEADERS, DATA and
trailers. This module does the framing, flow control and stream life cycle; header blocks are coded with
``hpack`` (the HPACK library of the python-hyper project); the gRPC layer (edged.frontends.grpc.calls) sees
streams.

What a peer can do to the daemon is bounded here: the header block size and the header list size, streams open at
once (more are refused with REFUSED_STREAM), the receive windows, and every frame's length and shape (a malformed
one ends the connection with GOAWAY and the RFC's error code). Replies respect the client's flow control windows
and frame size, and wait for the transport to drain.

Header blocks the server sends never use the HPACK dynamic table (literals without indexing and the static
table), so they are constant bytes for the common replies. Decoded request blocks are remembered while the
decoder's table is unchanged: a client's calls repeat byte-identical blocks once its own table is warm, and the
HPACK decoder in Python is a large part of a small call's cost.
"""

from __future__ import annotations

import asyncio
import logging
import struct
from collections.abc import Callable
from typing import Any, Final, cast

import hpack

from edged.frontends.grpc.frames import (
    COMPRESSION_ERROR,
    CONNECTION_WINDOW,
    CONTINUATION,
    DATA,
    DEFAULT_MAX_FRAME,
    DEFAULT_WINDOW,
    ENHANCE_YOUR_CALM,
    FLAG_ACK,
    FLAG_END_HEADERS,
    FLAG_END_STREAM,
    FLAG_PADDED,
    FLAG_PRIORITY,
    FLOW_CONTROL_ERROR,
    FRAME_SIZE_ERROR,
    GOAWAY,
    HEADER_TABLE,
    HEADERS,
    MAX_FRAME,
    MAX_HEADER_LIST,
    MAX_STREAMS,
    MAX_WINDOW,
    NO_ERROR,
    PING,
    PREFACE,
    PRIORITY,
    PROTOCOL_ERROR,
    PUSH_PROMISE,
    REFUSED_STREAM,
    RST_STREAM,
    SETTINGS,
    SETTINGS_INITIAL_WINDOW_SIZE,
    SETTINGS_MAX_CONCURRENT_STREAMS,
    SETTINGS_MAX_FRAME_SIZE,
    SETTINGS_MAX_HEADER_LIST_SIZE,
    STREAM_CLOSED,
    STREAM_WINDOW,
    WINDOW_UPDATE,
    ProtocolError,
    frame,
    unpad,
)
from edged.frontends.grpc.streams import Stream, StreamHandler

log = logging.getLogger(__name__)

# Decoded header blocks remembered per connection (see the module's docstring).
_CACHED_BLOCKS: Final = 64


class Http2Connection(asyncio.Protocol):
    """The server side of one HTTP/2 connection. ``on_stream(stream, headers)`` is called for each new request
    with its decoded headers and returns what receives its DATA; it may answer at once instead (and return None).
    ``on_close`` is called once, when the connection is gone."""

    def __init__(
        self,
        on_stream: Callable[[Stream, list[tuple[bytes, bytes]]], StreamHandler | None],
        on_open: Callable[[Http2Connection], bool],
        on_close: Callable[[Http2Connection], None],
        handshake_timeout_s: float,
        idle_timeout_s: float,
    ) -> None:
        self._on_stream = on_stream
        self._on_open = on_open
        self._on_close = on_close
        self._handshake_timeout_s = handshake_timeout_s
        self._idle_timeout_s = idle_timeout_s
        self.transport: asyncio.Transport | None = None
        self.streams: dict[int, Stream] = {}
        self.waiting: set[Stream] = set()
        self.send_window = DEFAULT_WINDOW
        self.peer_max_frame = DEFAULT_MAX_FRAME
        self.writing_paused = False
        self.closed = False
        self._drained: asyncio.Future[None] | None = None
        self._peer_stream_window = DEFAULT_WINDOW
        self._recv_window = CONNECTION_WINDOW
        self._unacknowledged = 0
        # Bytes of a frame not complete yet, kept as they came and joined once the frame is whole: joining on every
        # read would copy a large frame once per read (a 600 KB tensor arrives in many).
        self._held: list[bytes] = []
        self._held_size = 0
        self._wanted = len(PREFACE)  # bytes held before parsing can go on
        self._preface = False
        self._settled = False  # the client's first SETTINGS came
        self._last_stream = 0
        self._going_away = False
        self._headers: tuple[int, int, bytearray] | None = None  # a header block awaiting CONTINUATION
        self._decoder = hpack.Decoder(max_header_list_size=MAX_HEADER_LIST)
        self._decoder.max_allowed_table_size = HEADER_TABLE
        self._blocks: dict[bytes, list[tuple[bytes, bytes]]] = {}
        self._table_state: tuple[int, int, int, int] = self._decoder_state()
        self._timer: asyncio.TimerHandle | None = None
        self._idle_since = 0.0
        self._loop = asyncio.get_running_loop()

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
        self._arm(self._handshake_timeout_s)

    def connection_lost(self, exc: Exception | None) -> None:
        self.closed = True
        if self._timer is not None:
            self._timer.cancel()
        streams = list(self.streams.values())
        self.streams.clear()
        for stream in streams:
            stream.open_local = stream.open_remote = False
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

    def resume_writing(self) -> None:
        self.writing_paused = False
        if self._drained is not None and not self._drained.done():
            self._drained.set_result(None)
        self._drained = None

    async def drained(self) -> None:
        if self._drained is None:
            self._drained = self._loop.create_future()
        await self._drained

    def write(self, data: bytes) -> None:
        if not self.closed and self.transport is not None:
            self.transport.write(data)

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
            self.write(frame(RST_STREAM, 0, stream.id, NO_ERROR.to_bytes(4, "big")))
        self._forget(stream)

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

    def _close(self) -> None:
        if self.transport is not None and not self.closed:
            self.closed = True
            self.transport.close()

    def _forget(self, stream: Stream) -> None:
        if self.streams.pop(stream.id, None) is not None and not self.streams:
            if self._going_away:
                self._close()
            else:
                # The idle timer is not moved per call: when it fires, it looks at when the last call ended.
                self._idle_since = self._loop.time()
                if self._timer is None:
                    self._arm(self._idle_timeout_s)

    def _arm(self, seconds: float) -> None:
        if self._timer is not None:
            self._timer.cancel()
        self._timer = self._loop.call_later(seconds, self._expire) if seconds > 0 else None

    def _expire(self) -> None:
        self._timer = None
        if not self._settled:
            log.debug("gRPC connection closed: no HTTP/2 handshake within %s s", self._handshake_timeout_s)
            self.abort()
        elif not self.streams:  # with calls open it is armed again when the last one ends
            remaining = self._idle_since + self._idle_timeout_s - self._loop.time()
            if remaining > 0:
                self._arm(remaining)
            else:
                self.go_away(NO_ERROR, "idle")

    # --- reading ------------------------------------------------------------------------------------------

    def data_received(self, data: bytes) -> None:
        if self.closed:
            return
        if self._held:
            self._held.append(data)
            self._held_size += len(data)
            if self._held_size < self._wanted:
                return
            data = b"".join(self._held)
            self._held.clear()
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
            while end - position >= 9:
                size = (data[position] << 16) | (data[position + 1] << 8) | data[position + 2]
                if size > MAX_FRAME:
                    raise ProtocolError(FRAME_SIZE_ERROR, "frame larger than SETTINGS_MAX_FRAME_SIZE")
                if end - position < 9 + size:
                    wanted = 9 + size
                    break
                kind = data[position + 3]
                flags = data[position + 4]
                stream_id = int.from_bytes(data[position + 5 : position + 9], "big") & 0x7FFFFFFF
                payload = data[position + 9 : position + 9 + size]
                position += 9 + size
                self._frame(kind, flags, stream_id, payload)
                if self.closed:
                    return
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

    def _frame(self, kind: int, flags: int, stream_id: int, payload: bytes) -> None:
        if self._headers is not None and kind != CONTINUATION:
            raise ProtocolError(PROTOCOL_ERROR, "a header block was interrupted")
        if not self._settled and kind != SETTINGS:
            raise ProtocolError(PROTOCOL_ERROR, "the connection must begin with SETTINGS")
        if kind == DATA:
            self._data(flags, stream_id, payload)
        elif kind == HEADERS:
            self._headers_frame(flags, stream_id, payload)
        elif kind == CONTINUATION:
            self._continuation(flags, stream_id, payload)
        elif kind == SETTINGS:
            self._settings(flags, stream_id, payload)
        elif kind == WINDOW_UPDATE:
            self._window_update(stream_id, payload)
        elif kind == PING:
            if stream_id != 0:
                raise ProtocolError(PROTOCOL_ERROR, "PING on a stream")
            if len(payload) != 8:
                raise ProtocolError(FRAME_SIZE_ERROR, "PING of the wrong length")
            if not flags & FLAG_ACK:
                self.write(frame(PING, FLAG_ACK, 0, payload))
        elif kind == RST_STREAM:
            self._rst_stream(stream_id, payload)
        elif kind == PRIORITY:
            if stream_id == 0:
                raise ProtocolError(PROTOCOL_ERROR, "PRIORITY on the connection")
            if len(payload) != 5:
                raise ProtocolError(FRAME_SIZE_ERROR, "PRIORITY of the wrong length")
        elif kind == GOAWAY:
            if stream_id != 0:
                raise ProtocolError(PROTOCOL_ERROR, "GOAWAY on a stream")
            self.go_away()
        elif kind == PUSH_PROMISE:
            raise ProtocolError(PROTOCOL_ERROR, "a client cannot push")
        # Frames of unknown types are ignored (RFC 9113 4.1).

    def _settings(self, flags: int, stream_id: int, payload: bytes) -> None:
        if stream_id != 0:
            raise ProtocolError(PROTOCOL_ERROR, "SETTINGS on a stream")
        if flags & FLAG_ACK:
            if payload:
                raise ProtocolError(FRAME_SIZE_ERROR, "SETTINGS acknowledgement with a payload")
            return
        if len(payload) % 6:
            raise ProtocolError(FRAME_SIZE_ERROR, "SETTINGS of the wrong length")
        for offset in range(0, len(payload), 6):
            key, value = struct.unpack_from(">HL", payload, offset)
            if key == SETTINGS_INITIAL_WINDOW_SIZE:
                if value > MAX_WINDOW:
                    raise ProtocolError(FLOW_CONTROL_ERROR, "SETTINGS_INITIAL_WINDOW_SIZE too large")
                delta = value - self._peer_stream_window
                self._peer_stream_window = value
                for stream in self.streams.values():
                    stream.send_window += delta
                    if stream.send_window > MAX_WINDOW:
                        raise ProtocolError(FLOW_CONTROL_ERROR, "a stream's window grew too large")
                if delta > 0:
                    self._open_windows()
            elif key == SETTINGS_MAX_FRAME_SIZE:
                if not DEFAULT_MAX_FRAME <= value <= 0xFFFFFF:
                    raise ProtocolError(PROTOCOL_ERROR, "SETTINGS_MAX_FRAME_SIZE out of range")
                self.peer_max_frame = value
        self.write(frame(SETTINGS, FLAG_ACK, 0))
        if not self._settled:
            self._settled = True
            self._idle_since = self._loop.time()
            self._arm(self._idle_timeout_s)

    def _window_update(self, stream_id: int, payload: bytes) -> None:
        if len(payload) != 4:
            raise ProtocolError(FRAME_SIZE_ERROR, "WINDOW_UPDATE of the wrong length")
        increment = int.from_bytes(payload, "big") & 0x7FFFFFFF
        if stream_id == 0:
            if increment == 0:
                raise ProtocolError(PROTOCOL_ERROR, "WINDOW_UPDATE of zero")
            self.send_window += increment
            if self.send_window > MAX_WINDOW:
                raise ProtocolError(FLOW_CONTROL_ERROR, "the connection's window grew too large")
            self._open_windows()
            return
        stream = self.streams.get(stream_id)
        if stream is None:
            if stream_id > self._last_stream:
                raise ProtocolError(PROTOCOL_ERROR, "WINDOW_UPDATE on an idle stream")
            return
        if increment == 0:
            stream.reset(PROTOCOL_ERROR)
            return
        stream.send_window += increment
        if stream.send_window > MAX_WINDOW:
            stream.reset(FLOW_CONTROL_ERROR)
            return
        if stream.window_opened is not None:
            stream.window_opened.set()

    def _open_windows(self) -> None:
        for stream in self.waiting:
            if stream.window_opened is not None:
                stream.window_opened.set()

    def _rst_stream(self, stream_id: int, payload: bytes) -> None:
        if len(payload) != 4:
            raise ProtocolError(FRAME_SIZE_ERROR, "RST_STREAM of the wrong length")
        if stream_id == 0 or stream_id > self._last_stream:
            raise ProtocolError(PROTOCOL_ERROR, "RST_STREAM on an idle stream")
        stream = self.streams.get(stream_id)
        if stream is None:
            return
        stream.open_local = stream.open_remote = False
        self._forget(stream)
        if stream.handler is not None:
            stream.handler.reset()
        if stream.window_opened is not None:
            stream.window_opened.set()

    def _data(self, flags: int, stream_id: int, payload: bytes) -> None:
        if stream_id == 0:
            raise ProtocolError(PROTOCOL_ERROR, "DATA on the connection")
        size = len(payload)
        self._recv_window -= size
        if self._recv_window < 0:
            raise ProtocolError(FLOW_CONTROL_ERROR, "DATA past the connection's window")
        # The connection's window is given back at once: what a stream may hold is bounded by its own window.
        self._unacknowledged += size
        if self._unacknowledged >= CONNECTION_WINDOW // 2:
            self._recv_window += self._unacknowledged
            self.write(frame(WINDOW_UPDATE, 0, 0, self._unacknowledged.to_bytes(4, "big")))
            self._unacknowledged = 0
        stream = self.streams.get(stream_id)
        if stream is None or not stream.open_remote:
            if stream_id > self._last_stream:
                raise ProtocolError(PROTOCOL_ERROR, "DATA on an idle stream")
            return  # a stream the server has ended: what was in flight is dropped
        stream.recv_window -= size
        if stream.recv_window < 0:
            stream.reset(FLOW_CONTROL_ERROR)
            if stream.handler is not None:
                stream.handler.reset()
            return
        if flags & FLAG_PADDED:
            payload = unpad(payload)
        if stream.handler is not None:
            if payload:
                stream.handler.data(payload)
            elif size:
                stream.acknowledge(size)  # padding only
            if flags & FLAG_END_STREAM:
                stream.open_remote = False
                stream.handler.end()
        elif flags & FLAG_END_STREAM:
            stream.open_remote = False

    def _headers_frame(self, flags: int, stream_id: int, payload: bytes) -> None:
        if stream_id == 0 or not stream_id & 1:
            raise ProtocolError(PROTOCOL_ERROR, "HEADERS on a stream a client cannot open")
        if flags & FLAG_PADDED:
            payload = unpad(payload)
        if flags & FLAG_PRIORITY:
            if len(payload) < 5:
                raise ProtocolError(FRAME_SIZE_ERROR, "HEADERS too short for its priority")
            payload = payload[5:]
        if flags & FLAG_END_HEADERS:
            self._header_block(stream_id, flags, payload)
        else:
            self._headers = (stream_id, flags, bytearray(payload))

    def _continuation(self, flags: int, stream_id: int, payload: bytes) -> None:
        pending = self._headers
        if pending is None or pending[0] != stream_id:
            raise ProtocolError(PROTOCOL_ERROR, "CONTINUATION without its HEADERS")
        block = pending[2]
        block += payload
        if len(block) > MAX_HEADER_LIST:
            raise ProtocolError(ENHANCE_YOUR_CALM, "header block too large")
        if flags & FLAG_END_HEADERS:
            self._headers = None
            self._header_block(stream_id, pending[1], bytes(block))

    def _header_block(self, stream_id: int, flags: int, block: bytes) -> None:
        headers = self._decode(block)
        stream = self.streams.get(stream_id)
        if stream is not None:
            # Trailers from the client: gRPC sends none, but they are allowed; they must end the stream.
            if not flags & FLAG_END_STREAM:
                raise ProtocolError(PROTOCOL_ERROR, "trailers that do not end the stream")
            if stream.open_remote:
                stream.open_remote = False
                if stream.handler is not None:
                    stream.handler.end()
            return
        if stream_id <= self._last_stream:
            raise ProtocolError(STREAM_CLOSED, "HEADERS on a closed stream")
        self._last_stream = stream_id
        if self._going_away:
            return  # past GOAWAY: the client knows from its last stream id that this one was not taken
        stream = Stream(self, stream_id, self._peer_stream_window)
        if len(self.streams) >= MAX_STREAMS:
            self.write(frame(RST_STREAM, 0, stream_id, REFUSED_STREAM.to_bytes(4, "big")))
            return
        self.streams[stream_id] = stream
        if flags & FLAG_END_STREAM:
            stream.open_remote = False
        stream.handler = self._on_stream(stream, headers)
        if stream.handler is not None and flags & FLAG_END_STREAM:
            stream.handler.end()

    def _decode(self, block: bytes) -> list[tuple[bytes, bytes]]:
        cached = self._blocks.get(block)
        if cached is not None:
            return cached
        try:
            headers = cast("list[tuple[bytes, bytes]]", self._decoder.decode(block, raw=True))
        except hpack.OversizedHeaderListError:
            raise ProtocolError(ENHANCE_YOUR_CALM, "header list too large") from None
        except hpack.HPACKError as exc:
            raise ProtocolError(COMPRESSION_ERROR, f"bad header block: {exc}") from None
        state = self._decoder_state()
        if state != self._table_state:
            # The block changed the table: decoding it again would change it again, and every block remembered
            # may now mean something else.
            self._table_state = state
            self._blocks.clear()
        else:
            if len(self._blocks) >= _CACHED_BLOCKS:
                self._blocks.clear()
            self._blocks[block] = headers
        return headers

    def _decoder_state(self) -> tuple[int, int, int, int]:
        table: Any = self._decoder.header_table
        entries = table.dynamic_entries
        # An entry added makes a new tuple at the front, even when the table is full and its length stays.
        return len(entries), id(entries[0]) if entries else 0, table.maxsize, table._current_size
