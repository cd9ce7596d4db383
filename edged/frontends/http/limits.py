"""Bounds on HTTP connections, so that slow or idle clients cannot hold the daemon's file descriptors.

uvicorn bounds nothing of a request in progress: a client that sends part of a header and stops, or trickles a
byte every few seconds, keeps its connection (and a file descriptor) forever, and enough of them starve HTTP, gRPC
and the models' own files alike. ``LimitedHttpProtocol`` is uvicorn's httptools protocol with these bounds added,
for the HTTP and the metrics endpoints:

- at most ``max_connections`` open at once. One more takes the place of another (``_make_room``): the oldest
  connection that has not yet sent a whole request head, else the one idle longest between requests, is closed
  without an answer (none is owed), so that a slow-loris at the limit costs its sender, not the device's clients,
  and a client that finished its requests loses its kept-alive connection before a new one is refused. Only when
  every connection is amid a request (its body being read, or its answer worked out) is the new one answered
  ``503`` and closed at once;
- a request's headers (and, on a new connection, the start of the first request) must arrive within
  ``header_timeout_s``;
- a request's body must keep arriving: at least ``min_body_rate`` bytes per second over every window of
  ``body_timeout_s`` seconds (a window in which the daemon itself stopped reading does not count);
- an idle kept-alive connection closes after ``keepalive_timeout_s`` (uvicorn's own timer);
- a declared ``Content-Length`` over ``max_body_size`` is answered ``413`` as soon as the headers are read, on every
  route, without reading the body;
- a chunked body of more than ``max_chunks`` chunks is answered ``400`` at the chunk past the limit: each chunk costs
  a parser callback and a copy, so a flood of 1-byte chunks is work out of all proportion to its size;
- a request with both ``Transfer-Encoding: chunked`` and ``Content-Length`` is read by its chunks, as Triton reads it
  (RFC 9112 section 6.3: the encoding wins) and as clients send it (a ``requests`` call given the header and a body
  chunked by hand). Such a message is also how a request is smuggled past a proxy that trusts the other header, so
  its connection closes once it is answered: nothing sent behind it on that connection is read as a request.

A timed-out request gets ``408``. Refusals close the connection: the answer goes out, the sending side is shut down
and what the client still sends is read and dropped for a moment (``LINGER_S``), so the client reads the answer
instead of a reset.

Cost on the hot path: a float stored per stage of a request, and a dict lookup per request head; the one timer per
connection is moved only when it fires (at most once per timeout), never re-armed per request. Choosing a connection
to close at the limit takes the first of an ordered dict, or, when every connection has sent a request, one pass over
the connections.
"""

from __future__ import annotations

import json
import logging
import re
import time
from dataclasses import dataclass
from typing import Any, ClassVar, Final, Literal

from prometheus_client import CollectorRegistry, Counter
from uvicorn.protocols.http.httptools_impl import STATUS_LINE, HttpToolsProtocol

from edged.frontends.bodies import Framing, declared_too_large, framing_of
from edged.frontends.tls import asgi_tls_extension

log = logging.getLogger("edged.frontends.http")

# How long a refused connection keeps reading (and dropping) what its client still sends before it is closed.
LINGER_S = 2.0
# Refusals are logged at most this often (with how many there were), so a flood cannot flood the journal too.
REFUSAL_LOG_INTERVAL_S = 10.0

_Stage = Literal["request", "headers", "body"]
# The key of _REFUSALS for a connection closed to make room for a new one: no status, it is closed unanswered.
_EVICTED: Final = "evicted"
# The upload routes' paths, as the parser gives them (a query may follow): the API's, and the console's.
_UPLOAD_PATH = re.compile(rb"(?:/v2/edged)?/models/[^/?]+/upload(?:\?.*)?")
# How the log's summary names each refusal, and the ``reason`` label of its counter.
_REFUSALS: dict[int | str, tuple[str, str]] = {
    503: ("over the connection limit (503)", "connection_limit"),
    408: ("too slow to send a request (408)", "timeout"),
    413: ("declaring a body over the limit (413)", "body_too_large"),
    400: ("sending a body in too many chunks (400)", "too_many_chunks"),
    _EVICTED: ("idle or yet to send a whole request, for a newer connection at the limit", "evicted"),
}


def refusal_counter(registry: CollectorRegistry) -> Counter:
    """``edged_http_refused_connections_total{endpoint, reason}``, in ``registry`` (served on /metrics)."""
    return Counter(
        "edged_http_refused_connections",
        "HTTP connections answered with a refusal and closed, by endpoint and reason (connection_limit, timeout, "
        "body_too_large, too_many_chunks; evicted: closed unanswered, idle or yet to send a whole request, to admit "
        "a new connection at the limit)",
        ["endpoint", "reason"],
        registry=registry,
    )


@dataclass(frozen=True, slots=True)
class ConnectionLimits:
    max_connections: int = 1024
    header_timeout_s: float = 10.0
    body_timeout_s: float = 30.0
    min_body_rate: int = 1024  # bytes per second
    keepalive_timeout_s: float = 30.0
    max_body_size: int = 64 * 1024 * 1024
    max_chunks: int = 65536  # per chunked request body
    # The model upload route streams its body to disk, so it has a limit of its own (--upload-max-bytes).
    max_upload_size: int | None = None


class _Refusals:
    """Counts refusals of one endpoint, and logs each kind at most every REFUSAL_LOG_INTERVAL_S with its count."""

    def __init__(self, endpoint: str, counter: Counter | None) -> None:
        self.endpoint = endpoint
        self.counts: dict[str, int] = {}
        self.logged_at: dict[str, float] = {}
        self._counter = counter

    def add(self, status: int | str, client: Any) -> None:
        why, reason = _REFUSALS[status]
        if self._counter is not None:
            self._counter.labels(self.endpoint, reason).inc()
        self.counts[why] = self.counts.get(why, 0) + 1
        now = time.monotonic()
        if now - self.logged_at.get(why, -REFUSAL_LOG_INTERVAL_S) >= REFUSAL_LOG_INTERVAL_S:
            self.logged_at[why] = now
            count = self.counts.pop(why)
            who = f"{client[0]}:{client[1]}" if client else "a client"
            log.warning("%s endpoint refused and closed: %d %s (the latest from %s)", self.endpoint, count, why, who)


class LimitedHttpProtocol(HttpToolsProtocol):
    """Give uvicorn ``LimitedHttpProtocol.limited(limits, "HTTP")`` as ``Config(http=...)``."""

    limits: ClassVar[ConnectionLimits]
    refusals: ClassVar[_Refusals]
    # The endpoint's connections that have not sent a whole request head yet, oldest first: the first to go when a
    # new connection finds the endpoint at its limit.
    fresh: ClassVar[dict[LimitedHttpProtocol, None]]

    @classmethod
    def limited(
        cls, limits: ConnectionLimits, endpoint: str, refused: Counter | None = None, **extra: Any
    ) -> type[LimitedHttpProtocol]:
        """A subclass bound to ``limits`` (and to ``extra`` class attributes), one per endpoint; ``refused``
        counts its refusals (refusal_counter)."""
        attributes = {"limits": limits, "refusals": _Refusals(endpoint, refused), "fresh": {}, **extra}
        return type(cls.__name__, (cls,), attributes)

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self._stage: _Stage | None = None
        self._deadline: float | None = None
        self._timer: Any = None  # asyncio.TimerHandle
        self._received = 0  # bytes, all told
        self._window_start = 0  # self._received when the current body window began
        self._chunks = 0  # chunk headers of the current request's body
        self._refused = False
        self._extensions: dict[str, Any] | None = None
        # When the last answer was complete with no request behind it; None while a request is read or answered.
        self._idle_since: float | None = None
        # Set by a request framed both ways (see the module's docstring): the connection ends with its answer.
        self._close_after = False
        # While the transport holds more of an answer than its high-water mark: the timer that drops a client that
        # reads none of it for body_timeout_s, and how much was held when it was set.
        self._stall_timer: Any = None  # asyncio.TimerHandle
        self._stall_mark = 0
        self.parser.set_dangerous_leniencies(lenient_chunked_length=True)

    # --- the connection --------------------------------------------------------------------------------------

    def connection_made(self, transport: Any) -> None:
        super().connection_made(transport)
        # A TLS connection's peer is known once, after its handshake; each request's scope carries it.
        tls = asgi_tls_extension(transport)
        self._extensions = {"tls": tls} if tls is not None else None
        if len(self.connections) > self.limits.max_connections and not self._make_room():
            self._refuse(503, f"too many connections (at most {self.limits.max_connections})", linger=False)
            return
        self.fresh[self] = None
        self._expect("request", self.limits.header_timeout_s)

    def shutdown(self) -> None:
        idle = self.cycle is None or self.cycle.response_complete
        super().shutdown()
        if idle and self._extensions is not None:
            # Closing TLS waits for the client's close_notify, up to asyncio's 30 s: an idle kept-alive client owes
            # nothing at shutdown, and must not hold the daemon's exit for that long.
            self.transport.abort()

    def connection_lost(self, exc: Exception | None) -> None:
        self.fresh.pop(self, None)
        self._idle_since = self._deadline = None
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None
        if self._stall_timer is not None:
            self._stall_timer.cancel()
            self._stall_timer = None
        super().connection_lost(exc)

    def data_received(self, data: bytes) -> None:
        self._received += len(data)
        if self._refused:
            return  # answered already: what still comes is dropped unparsed
        super().data_received(data)

    def pause_writing(self) -> None:
        # An answer the client does not read (a generate_stream reply runs as long as its model sends) would hold
        # its request, and what the daemon buffers for it, for ever: once the client has read nothing for
        # body_timeout_s the connection is dropped, as the gRPC endpoint drops a reply nobody reads.
        super().pause_writing()
        self._stall_mark = self.transport.get_write_buffer_size()
        if self._stall_timer is None:
            self._stall_timer = self.loop.call_later(self.limits.body_timeout_s, self._on_stall)

    def resume_writing(self) -> None:
        super().resume_writing()
        if self._stall_timer is not None:
            self._stall_timer.cancel()
            self._stall_timer = None

    def _on_stall(self) -> None:
        self._stall_timer = None
        if self.transport.is_closing():
            return
        held = self.transport.get_write_buffer_size()
        if held < self._stall_mark:  # the client reads, slowly: it has another window
            self._stall_mark = held
            self._stall_timer = self.loop.call_later(self.limits.body_timeout_s, self._on_stall)
            return
        log.debug(
            "HTTP connection of %s closed: its client read nothing of its answer in %g s",
            self.client,
            self.limits.body_timeout_s,
        )
        self.transport.abort()

    # --- parser callbacks ------------------------------------------------------------------------------------

    def on_message_begin(self) -> None:
        if self._refused:
            return
        super().on_message_begin()
        if self._extensions is not None:
            self.scope["extensions"] = self._extensions
        self._expect("headers", self.limits.header_timeout_s)

    def on_headers_complete(self) -> None:
        if self._admit():
            super().on_headers_complete()
            if self._close_after and self.cycle is not None:
                self.cycle.keep_alive = False

    def on_body(self, body: bytes) -> None:
        if not self._refused:
            super().on_body(body)

    def on_chunk_header(self) -> None:
        self._chunks += 1
        # The zero-length chunk that ends a body has a header too: it does not count against the limit. A request
        # queued behind one still unanswered is refused once its turn comes (a refusal now would overtake that
        # answer); until then reading is paused, so what it sends meanwhile is one read's worth at most.
        if self._chunks > self.limits.max_chunks + 1 and not self._refused and not self.pipeline:
            self._refuse(
                400,
                # Triton's words (and, as in Triton, empty chunks are not counted)
                f"Chunked request body exceeds maximum of {self.limits.max_chunks} non-empty chunks. Send fewer or "
                "larger HTTP chunks.",
                linger=True,
            )

    def on_message_complete(self) -> None:
        if self._refused:
            return
        self._request_read()
        super().on_message_complete()

    # --- for subclasses that answer some requests themselves ---------------------------------------------------

    def _declared(self) -> tuple[str | None, Framing]:
        """The request's ``Content-Length`` for the size check (None when it has none, or when ``Transfer-Encoding``
        overrides it, which also marks the connection to close after the answer), and what its body is."""
        length = header_length = None
        encoded = False
        for name, value in self.headers:
            if name == b"content-length":
                length = value
            elif name == b"transfer-encoding":
                encoded = True
            elif name == b"inference-header-content-length":
                header_length = value.decode("latin-1")
        framing: Framing = "upload" if self._is_upload() else framing_of(header_length)
        if length is None:
            return None, framing
        if encoded:
            self._close_after = True
            return None, framing
        return length.decode("latin-1"), framing

    def _admit(self) -> bool:
        """Once a request's headers are read: False when it was refused (and answered) for its declared size;
        otherwise its body's clock starts."""
        self.fresh.pop(self, None)
        self._idle_since = None
        if self._refused:
            return False
        self._chunks = 0
        busy = self.cycle is not None and not self.cycle.response_complete
        # Behind an answer still owed, a refusal would overtake it: the route refuses in order instead.
        declared, framing = self._declared()
        refusal = None if busy else declared_too_large(declared, self._body_limit(), framing)
        if refusal is not None:
            self._refuse(413, str(refusal), linger=True)
            return False
        self._expect("body", self.limits.body_timeout_s)
        return True

    def _body_limit(self) -> int:
        upload = self.limits.max_upload_size
        return upload if upload is not None and self._is_upload() else self.limits.max_body_size

    def _is_upload(self) -> bool:
        return _UPLOAD_PATH.fullmatch(getattr(self, "url", b"")) is not None

    def _request_read(self) -> None:
        """The whole request is in: no clock runs while it is answered (uvicorn's keep-alive timer follows)."""
        self._stage = self._deadline = None

    def on_response_complete(self) -> None:
        queued = bool(self.pipeline)
        super().on_response_complete()
        if not queued and not self._refused and not self.transport.is_closing():
            self._idle_since = self.loop.time()

    # --- the connection limit ----------------------------------------------------------------------------------

    def _make_room(self) -> bool:
        """This new connection finds the endpoint at its limit: close the connection whose loss costs the
        endpoint's clients least, the oldest that has not sent a whole request head yet, else the one idle longest
        between requests (its client owes nothing and is owed nothing, and opens another when it needs one). False
        when every other connection is amid a request: then this one is refused instead."""
        victim = next(iter(self.fresh), None)
        if victim is None:
            since = float("inf")
            for connection in self.connections:
                if (
                    isinstance(connection, LimitedHttpProtocol)
                    and connection._idle_since is not None
                    and connection._idle_since < since
                    and not connection.transport.is_closing()
                ):
                    victim, since = connection, connection._idle_since
        if victim is None:
            return False
        victim._evict()
        return True

    def _evict(self) -> None:
        """Closed, unanswered, for a new connection: counted out of the limit at once, and aborted, so that its
        file descriptor goes now and not after a TLS goodbye the client may never send."""
        self.fresh.pop(self, None)
        self._refused = True
        self._idle_since = self._stage = self._deadline = None
        self.connections.discard(self)
        self.refusals.add(_EVICTED, self.client)
        log.debug("HTTP connection of %s closed to admit a new one at the connection limit", self.client)
        self.transport.abort()

    # --- clocks ----------------------------------------------------------------------------------------------

    def _expect(self, stage: _Stage, seconds: float) -> None:
        self._stage = stage
        self._deadline = self.loop.time() + seconds
        self._window_start = self._received
        if self._timer is None:
            self._timer = self.loop.call_at(self._deadline, self._on_deadline)

    def _on_deadline(self) -> None:
        self._timer = None
        deadline = self._deadline
        if deadline is None or self.transport.is_closing():
            return
        if self.loop.time() < deadline:  # moved on since the timer was set: wait for the new deadline
            self._timer = self.loop.call_at(deadline, self._on_deadline)
            return
        limits = self.limits
        if self._stage == "body":
            arrived = self._received - self._window_start
            if self.flow.read_paused or arrived >= limits.min_body_rate * limits.body_timeout_s:
                self._expect("body", limits.body_timeout_s)
                return
            why = (
                f"request body arrived too slowly: {arrived} bytes in {limits.body_timeout_s:g} s, the minimum "
                f"is {limits.min_body_rate} bytes per second"
            )
        else:
            why = f"request headers not received within {limits.header_timeout_s:g} s"
        self._refuse(408, why, linger=False)

    # --- refusals --------------------------------------------------------------------------------------------

    def _refuse(self, status: int, message: str, *, linger: bool) -> None:
        """Answer ``status`` with ``message`` (Triton's JSON error body) when no other answer is owed first, and
        close the connection."""
        stage = self._stage
        self._refused = True
        self.fresh.pop(self, None)
        self._idle_since = self._stage = self._deadline = None
        self.refusals.add(status, self.client)
        log.debug("HTTP %d to %s: %s", status, self.client, message)
        cycle = self.cycle
        idle = cycle is None or cycle.response_complete
        # While a body is read, the cycle is that request's own, and no answer has begun unless its route answered
        # early; between requests (or behind a pipelined one) the cycle is an earlier request's, not to be cut into.
        reading = stage == "body" and not idle and not getattr(cycle, "response_started", False)
        if reading:
            # The route waiting for the body sees the client gone (its answer is dropped) instead of waiting on.
            cycle.disconnected = True
            cycle.message_event.set()
        if idle or reading:
            body = json.dumps({"error": message}).encode()
            head = [STATUS_LINE[status]]
            for name, value in self.server_state.default_headers:
                head += [name, b": ", value, b"\r\n"]
            head.append(b"content-type: application/json\r\nconnection: close\r\n")
            head.append(b"content-length: %d\r\n\r\n" % len(body))
            self.transport.write(b"".join(head) + body)
        if linger and self.transport.can_write_eof():
            self.transport.write_eof()
            self.loop.call_later(LINGER_S, self.transport.close)
        else:
            self.transport.close()
