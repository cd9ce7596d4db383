"""What one client can make the gRPC endpoint hold or do, stated once: every bound of edged.frontends.grpc.http2 and
calls is a name here (the README's "Connection limits" lists them with the flags that set some of them).

An HTTP/2 server faces frames that cost the server more than they cost the client: a header block the decoder
walks byte by byte, SETTINGS that touch every stream, control frames the server must answer to a client that never
reads, streams opened and reset at once, frames that carry nothing. Each has a bound below, in bytes, count or rate,
and past it the connection ends with GOAWAY ENHANCE_YOUR_CALM, as nghttp2, Go's net/http2 and Envoy end theirs; the
defaults are nghttp2's where it has one. Request bodies, the one thing a client can make the endpoint hold in
quantity, have a per-connection and an endpoint-wide byte budget (``Budget``) and a minimum rate.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Final

# --- announced to every client in SETTINGS (RFC 9113 6.5.2) --------------------------------------------------
# Frames up to 1 MiB keep large tensors to few frames; the windows let a client send a few MiB before the first
# acknowledgement, so one round trip does not bound a large request.
MAX_FRAME: Final = 1 << 20
STREAM_WINDOW: Final = 4 << 20
CONNECTION_WINDOW: Final = 16 << 20
# Calls open at once on one connection; more are refused with REFUSED_STREAM.
MAX_STREAMS: Final = 256
# The most bytes of decoded header names and values a request may have (each counted with RFC 7541's 32 more).
MAX_HEADER_LIST: Final = 64 << 10
HEADER_TABLE: Final = 4096

# --- checked, not announced ------------------------------------------------------------------------------------
# A header block (HEADERS and its CONTINUATIONs) is checked against this from each frame's header, before its
# payload is read or decoded; with the two table size updates RFC 7541 4.2 allows at the start of a block, every
# other instruction in it counts toward MAX_HEADER_LIST, so decoding one costs a bounded amount of time.
MAX_HEADER_BLOCK: Final = 64 << 10
MAX_TABLE_SIZE_UPDATES: Final = 2
MAX_CONTINUATIONS: Final = 32
# Entries in one SETTINGS frame (nghttp2's default); SETTINGS frames and their entries also draw on SETTINGS_RATE.
MAX_SETTINGS_ENTRIES: Final = 32
# Token buckets per connection: (burst, refilled per second).
SETTINGS_RATE: Final = (1000.0, 100.0)  # a SETTINGS frame costs 1 + its entries
RESET_RATE: Final = (1000.0, 33.0)  # streams the client resets while open, or that are refused (nghttp2's)
IDLE_FRAME_RATE: Final = (1000.0, 100.0)  # frames that do nothing: empty DATA or CONTINUATION, PRIORITY, unknown
# Control frames (PING and SETTINGS acknowledgements, RST_STREAM, WINDOW_UPDATE) written while the client reads
# nothing; past this the connection ends (nghttp2's 1,000). Reading also stops while writing is paused, so a client
# that does not read stops being read from.
MAX_QUEUED_CONTROL: Final = 1000
# Decoded header blocks remembered per connection, by the bytes of the block and of its header list.
DECODED_CACHE_BYTES: Final = 16 << 10
# Streams open at once on the whole endpoint (each holds a call, and a streaming call, a health Watch among them, a
# task): more are refused with REFUSED_STREAM, however many connections they come over.
ENDPOINT_STREAMS: Final = 4096
# Event-loop time one connection's reading may take before it lets every other connection run.
READ_SLICE_S: Final = 0.01
# A closing connection whose client does not read the last frames is dropped after this long.
LINGER_S: Final = 5.0


@dataclass(frozen=True, slots=True)
class ConnectionTimes:
    """The endpoint's time bounds for each connection (flags of ``edged serve``)."""

    handshake_timeout_s: float
    idle_timeout_s: float
    # A stream waiting for its request must receive at least ``min_body_rate`` bytes per second (and at least one
    # byte) over each window this long; a reply waiting for the client to read or to open its window gives up after
    # one such window too.
    body_timeout_s: float = 30.0
    min_body_rate: int = 1024


class Budget:
    """Request bytes held by the endpoint, received and not yet parsed into a message, and its open streams: each
    connection may hold ``per_connection`` bytes, the endpoint ``total``; a call past either is refused with
    RESOURCE_EXHAUSTED."""

    __slots__ = ("buffered", "per_connection", "streams", "total")

    def __init__(self, total: int, max_message_size: int) -> None:
        self.total = total
        # A quarter of the endpoint's, so that one connection cannot take it all, but never less than one message.
        self.per_connection = min(total, max(total // 4, max_message_size + 5))
        self.buffered = 0
        self.streams = 0


class Rate:
    """A token bucket of ``burst`` tokens refilled at ``per_second``."""

    __slots__ = ("_at", "_per_second", "_size", "_tokens")

    def __init__(self, bucket: tuple[float, float], now: float) -> None:
        self._size, self._per_second = bucket
        self._tokens = self._size
        self._at = now

    def take(self, now: float, count: float = 1.0) -> bool:
        tokens = min(self._size, self._tokens + (now - self._at) * self._per_second)
        self._at = now
        if tokens < count:
            self._tokens = tokens
            return False
        self._tokens = tokens - count
        return True
