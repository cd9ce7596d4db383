"""What each frame a client sends does to its HTTP/2 connection (RFC 9113 section 6), for
edged.frontends.grpc.http2: settings, flow control, resets, DATA and header blocks, each within the bounds of
edged.frontends.grpc.bounds. ``InboundFrames`` is a part of ``Http2Connection``, which owns the state it names and
the life cycle, writing and reading of the connection."""

from __future__ import annotations

import asyncio
import logging
import struct
from collections.abc import Callable
from typing import TYPE_CHECKING, cast

from edged.frontends.grpc.bounds import (
    CONNECTION_WINDOW,
    ENDPOINT_STREAMS,
    MAX_CONTINUATIONS,
    MAX_SETTINGS_ENTRIES,
    MAX_STREAMS,
    Budget,
    ConnectionTimes,
    Rate,
)
from edged.frontends.grpc.frames import (
    CONTINUATION,
    DATA,
    DEFAULT_MAX_FRAME,
    ENHANCE_YOUR_CALM,
    FLAG_ACK,
    FLAG_END_HEADERS,
    FLAG_END_STREAM,
    FLAG_PADDED,
    FLAG_PRIORITY,
    FLOW_CONTROL_ERROR,
    FRAME_SIZE_ERROR,
    GOAWAY,
    HEADERS,
    MAX_WINDOW,
    NO_ERROR,
    PING,
    PRIORITY,
    PROTOCOL_ERROR,
    PUSH_PROMISE,
    REFUSED_STREAM,
    RST_STREAM,
    SETTINGS,
    SETTINGS_ENABLE_PUSH,
    SETTINGS_INITIAL_WINDOW_SIZE,
    SETTINGS_MAX_FRAME_SIZE,
    STREAM_CLOSED,
    WINDOW_UPDATE,
    ProtocolError,
    frame,
    unpad,
)
from edged.frontends.grpc.streams import Refusal, Stream, StreamHandler

if TYPE_CHECKING:
    from edged.frontends.grpc.blocks import BlockDecoder
    from edged.frontends.grpc.http2 import Http2Connection

log = logging.getLogger(__name__)


class InboundFrames:
    """The frame handlers of ``Http2Connection`` (the connection's state, declared here for the type checker, is
    made and owned there)."""

    streams: dict[int, Stream]
    waiting: set[Stream]
    send_window: int
    peer_max_frame: int
    buffered: int
    _on_stream: Callable[[Stream, list[tuple[bytes, bytes]]], StreamHandler | None]
    _times: ConnectionTimes
    _budget: Budget
    _loop: asyncio.AbstractEventLoop
    _peer_stream_window: int
    _recv_window: int
    _unacknowledged: int
    _settled: bool
    _last_stream: int
    _going_away: bool
    _headers: tuple[int, int, bytearray] | None
    _continuations: int
    _blocks: BlockDecoder
    _tick: asyncio.TimerHandle | None
    _idle_since: float
    _resets: Rate
    _settings_rate: Rate
    _idle_frames: Rate

    if TYPE_CHECKING:

        def control(self, data: bytes) -> None: ...

        def go_away(self, code: int = NO_ERROR, message: str = "") -> None: ...

        def _forget(self, stream: Stream) -> None: ...

        def _arm(self, seconds: float) -> None: ...

        def _ticking(self) -> None: ...

    def _calm(self, rate: Rate, what: str, count: float = 1.0) -> None:
        if not rate.take(self._loop.time(), count):
            raise ProtocolError(ENHANCE_YOUR_CALM, f"too many {what}")

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
                self.control(frame(PING, FLAG_ACK, 0, payload))
        elif kind == RST_STREAM:
            self._rst_stream(stream_id, payload)
        elif kind == PRIORITY:
            if stream_id == 0:
                raise ProtocolError(PROTOCOL_ERROR, "PRIORITY on the connection")
            if len(payload) != 5:
                raise ProtocolError(FRAME_SIZE_ERROR, "PRIORITY of the wrong length")
            self._calm(self._idle_frames, "frames that do nothing")
        elif kind == GOAWAY:
            if stream_id != 0:
                raise ProtocolError(PROTOCOL_ERROR, "GOAWAY on a stream")
            self.go_away()
        elif kind == PUSH_PROMISE:
            raise ProtocolError(PROTOCOL_ERROR, "a client cannot push")
        else:  # frames of unknown types are ignored (RFC 9113 4.1), within the rate of frames that do nothing
            self._calm(self._idle_frames, "frames that do nothing")

    def _settings(self, flags: int, stream_id: int, payload: bytes) -> None:
        if stream_id != 0:
            raise ProtocolError(PROTOCOL_ERROR, "SETTINGS on a stream")
        if flags & FLAG_ACK:
            if payload:
                raise ProtocolError(FRAME_SIZE_ERROR, "SETTINGS acknowledgement with a payload")
            return
        if len(payload) % 6:
            raise ProtocolError(FRAME_SIZE_ERROR, "SETTINGS of the wrong length")
        entries = len(payload) // 6
        if entries > MAX_SETTINGS_ENTRIES:
            raise ProtocolError(ENHANCE_YOUR_CALM, f"more than {MAX_SETTINGS_ENTRIES} entries in one SETTINGS")
        self._calm(self._settings_rate, "SETTINGS", 1 + entries)
        window: int | None = None
        for offset in range(0, len(payload), 6):
            key, value = struct.unpack_from(">HL", payload, offset)
            if key == SETTINGS_INITIAL_WINDOW_SIZE:
                if value > MAX_WINDOW:
                    raise ProtocolError(FLOW_CONTROL_ERROR, "SETTINGS_INITIAL_WINDOW_SIZE too large")
                window = value
            elif key == SETTINGS_MAX_FRAME_SIZE:
                if not DEFAULT_MAX_FRAME <= value <= 0xFFFFFF:
                    raise ProtocolError(PROTOCOL_ERROR, "SETTINGS_MAX_FRAME_SIZE out of range")
                self.peer_max_frame = value
            elif key == SETTINGS_ENABLE_PUSH and value > 1:
                raise ProtocolError(PROTOCOL_ERROR, "SETTINGS_ENABLE_PUSH other than 0 or 1")
        if window is not None:
            # Only the last value has an effect: the streams are walked once per frame, not once per entry.
            delta = window - self._peer_stream_window
            self._peer_stream_window = window
            if delta:
                for stream in self.streams.values():
                    stream.send_window += delta
                    if stream.send_window > MAX_WINDOW:
                        raise ProtocolError(FLOW_CONTROL_ERROR, "a stream's window grew too large")
                if delta > 0:
                    self._open_windows()
        self.control(frame(SETTINGS, FLAG_ACK, 0))
        if not self._settled:
            self._settled = True
            self._idle_since = self._loop.time()
            self._arm(self._times.idle_timeout_s)

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
            self._stream_error(stream, PROTOCOL_ERROR)
            return
        stream.send_window += increment
        if stream.send_window > MAX_WINDOW:
            self._stream_error(stream, FLOW_CONTROL_ERROR)
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
        # Opening a call and resetting it at once costs the daemon the call's start for a few bytes (CVE-2023-44487).
        self._calm(self._resets, "streams reset")
        stream.open_local = stream.open_remote = False
        self._forget(stream)
        if stream.handler is not None:
            stream.handler.reset()
        if stream.window_opened is not None:
            stream.window_opened.set()

    def _stream_error(self, stream: Stream, code: int) -> None:
        """RST_STREAM with ``code``: the stream's request was malformed; the connection goes on, within the rate of
        resets."""
        self._calm(self._resets, "streams reset")
        handler = stream.handler
        stream.reset(code)
        if handler is not None:
            handler.reset()

    def _data(self, flags: int, stream_id: int, payload: bytes) -> None:
        if stream_id == 0:
            raise ProtocolError(PROTOCOL_ERROR, "DATA on the connection")
        size = len(payload)
        self._recv_window -= size
        if self._recv_window < 0:
            raise ProtocolError(FLOW_CONTROL_ERROR, "DATA past the connection's window")
        # The connection's window is given back at once: what a stream may hold is bounded by its own window, what
        # the connection and the endpoint hold by the budget.
        self._unacknowledged += size
        if self._unacknowledged >= CONNECTION_WINDOW // 2:
            self._recv_window += self._unacknowledged
            self.control(frame(WINDOW_UPDATE, 0, 0, self._unacknowledged.to_bytes(4, "big")))
            self._unacknowledged = 0
        end_stream = flags & FLAG_END_STREAM
        if not size and not end_stream:
            self._calm(self._idle_frames, "frames that do nothing")
        stream = self.streams.get(stream_id)
        if stream is None or not stream.open_remote:
            if stream_id > self._last_stream:
                raise ProtocolError(PROTOCOL_ERROR, "DATA on an idle stream")
            return  # a stream the server has ended: what was in flight is dropped
        stream.recv_window -= size
        if stream.recv_window < 0:
            self._stream_error(stream, FLOW_CONTROL_ERROR)
            return
        if flags & FLAG_PADDED:
            payload = unpad(payload)
        body = len(payload)
        stream.received += size
        stream.total += body
        length = stream.content_length
        if length is not None and (stream.total > length or (end_stream and stream.total != length)):
            self._stream_error(stream, PROTOCOL_ERROR)  # RFC 9113 8.1.1: DATA that disagrees with content-length
            return
        handler = stream.handler
        if handler is not None:
            if payload:
                budget = self._budget
                if self.buffered + body > budget.per_connection or budget.buffered + body > budget.total:
                    handler.refuse(
                        Refusal.BUFFERS,
                        f"the server holds its most bytes of requests not yet read whole ({budget.per_connection} "
                        f"per connection, {budget.total} in all); try again",
                    )
                    return
                stream.buffered += body
                self.buffered += body
                budget.buffered += body
                handler.data(payload)
            elif size:
                stream.acknowledge(size)  # padding only
            if end_stream and stream.open_remote:
                stream.open_remote = False
                handler.end()
        elif end_stream:
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
            if not payload:
                self._calm(self._idle_frames, "frames that do nothing")
            self._headers = (stream_id, flags, bytearray(payload))
            self._continuations = 0

    def _continuation(self, flags: int, stream_id: int, payload: bytes) -> None:
        pending = self._headers
        if pending is None or pending[0] != stream_id:
            raise ProtocolError(PROTOCOL_ERROR, "CONTINUATION without its HEADERS")
        self._continuations += 1
        if self._continuations > MAX_CONTINUATIONS:
            raise ProtocolError(ENHANCE_YOUR_CALM, f"a header block in more than {MAX_CONTINUATIONS} CONTINUATIONs")
        if not payload and not flags & FLAG_END_HEADERS:
            self._calm(self._idle_frames, "frames that do nothing")
        block = pending[2]
        block += payload
        if flags & FLAG_END_HEADERS:
            self._headers = None
            self._header_block(stream_id, pending[1], bytes(block))

    def _header_block(self, stream_id: int, flags: int, block: bytes) -> None:
        stream = self.streams.get(stream_id)
        if stream is not None:
            # Trailers from the client: gRPC sends none, but they are allowed; they must end the stream.
            malformed = self._blocks.trailers(block)
            if not flags & FLAG_END_STREAM:
                raise ProtocolError(PROTOCOL_ERROR, "trailers that do not end the stream")
            if malformed is not None or stream.content_length not in (None, stream.total):
                log.debug("gRPC stream %d reset: malformed trailers: %s", stream_id, malformed)
                self._stream_error(stream, PROTOCOL_ERROR)
                return
            if stream.open_remote:
                stream.open_remote = False
                if stream.handler is not None:
                    stream.handler.end()
            return
        decoded = self._blocks.request(block)
        if stream_id <= self._last_stream:
            raise ProtocolError(STREAM_CLOSED, "HEADERS on a closed stream")
        self._last_stream = stream_id
        if self._going_away:
            return  # past GOAWAY: the client knows from its last stream id that this one was not taken
        if decoded.malformed is not None:
            log.debug("gRPC stream %d reset: malformed request: %s", stream_id, decoded.malformed)
            self._calm(self._resets, "streams reset")
            self.control(frame(RST_STREAM, 0, stream_id, PROTOCOL_ERROR.to_bytes(4, "big")))
            return
        if len(self.streams) >= MAX_STREAMS or self._budget.streams >= ENDPOINT_STREAMS:
            self._calm(self._resets, "streams reset")
            self.control(frame(RST_STREAM, 0, stream_id, REFUSED_STREAM.to_bytes(4, "big")))
            return
        stream = Stream(cast("Http2Connection", self), stream_id, self._peer_stream_window)
        stream.content_length = decoded.content_length
        self.streams[stream_id] = stream
        self._budget.streams += 1
        if self._tick is None:
            self._ticking()
        end_stream = flags & FLAG_END_STREAM
        if end_stream:
            stream.open_remote = False
            if decoded.content_length:
                self._stream_error(stream, PROTOCOL_ERROR)
                return
        handler = stream.handler = self._on_stream(stream, decoded.headers)
        if handler is not None and end_stream and stream.open_local:
            handler.end()
