"""A strict HTTP/2 client for the gRPC endpoint (the ``h2`` library, which checks every frame the daemon sends
against RFC 9113), and ``Watch``, which samples the daemon from outside while a hostile client works on it: how
long ``GET /v2/health/live`` waits (the event loop's stalls) and the daemon's resident memory."""

from __future__ import annotations

import http.client
import socket
import threading
import time
from pathlib import Path
from typing import Any

import h2.config
import h2.connection
import h2.events


def message(body: bytes) -> bytes:
    return b"\0" + len(body).to_bytes(4, "big") + body


def grpc_headers(path: str, port: int) -> list[tuple[str, str]]:
    return [
        (":method", "POST"),
        (":scheme", "http"),
        (":path", path),
        (":authority", f"127.0.0.1:{port}"),
        ("content-type", "application/grpc"),
        ("te", "trailers"),
    ]


class Client:
    """One HTTP/2 connection, as a gRPC client makes it, through h2."""

    def __init__(self, port: int, settings: dict[int, int] | None = None) -> None:
        self.port = port
        self.sock = socket.create_connection(("127.0.0.1", port), timeout=20)
        self.h2 = h2.connection.H2Connection(h2.config.H2Configuration(client_side=True))
        self.h2.initiate_connection()
        if settings:
            self.h2.update_settings(settings)
        self.flush()
        self.events: list[Any] = []
        self.max_data_frame = 0

    def flush(self) -> None:
        data = self.h2.data_to_send()
        if data:
            self.sock.sendall(data)

    def open(
        self, path: str, body: bytes | None = None, headers: list[tuple[str, str]] | None = None, *, end: bool = True
    ) -> int:
        stream = self.h2.get_next_available_stream_id()
        self.h2.send_headers(stream, headers or grpc_headers(path, self.port), end_stream=body is None and end)
        if body is not None:
            self.send(stream, body, end=end)
        self.flush()
        return stream

    def send(self, stream: int, body: bytes, *, end: bool = True) -> None:
        """The body within the daemon's windows and frame size, as a client must send it."""
        view = memoryview(body)
        while True:
            size = min(len(view), self.h2.local_flow_control_window(stream), self.h2.max_outbound_frame_size)
            if size == 0 and view:
                self.flush()
                self.receive()
                continue
            self.h2.send_data(stream, bytes(view[:size]), end_stream=end and size == len(view))
            view = view[size:]
            if not view:
                self.flush()
                return

    def receive(self) -> list[Any]:
        data = self.sock.recv(1 << 20)
        if not data:
            raise ConnectionError("closed")
        events = self.h2.receive_data(data)
        for event in events:
            if isinstance(event, h2.events.DataReceived):
                self.max_data_frame = max(self.max_data_frame, len(event.data))
                self.h2.acknowledge_received_data(event.flow_controlled_length, event.stream_id)
        self.flush()
        self.events += events
        return events

    def answer(self, stream: int) -> tuple[dict[str, str], bytes, dict[str, str]]:
        """The reply's headers, body and trailers (for a trailers-only reply: its headers as both)."""
        headers: dict[str, str] = {}
        trailers: dict[str, str] = {}
        body = bytearray()
        done = False
        seen = 0
        while not done:
            while seen < len(self.events) and not done:  # a reset after the stream ended is its server's business
                event = self.events[seen]
                seen += 1
                if getattr(event, "stream_id", None) != stream:
                    continue
                if isinstance(event, h2.events.ResponseReceived):
                    headers = _text(event.headers)
                elif isinstance(event, h2.events.TrailersReceived):
                    trailers = _text(event.headers)
                elif isinstance(event, h2.events.DataReceived):
                    body += event.data
                elif isinstance(event, h2.events.StreamReset):
                    raise AssertionError(f"stream {stream} reset with code {event.error_code}")
                elif isinstance(event, h2.events.StreamEnded):
                    done = True
            if not done:
                self.receive()
        return headers, bytes(body), trailers or headers

    def reset_code(self, stream: int) -> int:
        """The code of the RST_STREAM that ends ``stream`` (AssertionError if it ends otherwise)."""
        seen = 0
        while True:
            while seen < len(self.events):
                event = self.events[seen]
                seen += 1
                if getattr(event, "stream_id", None) != stream:
                    continue
                if isinstance(event, h2.events.StreamReset):
                    return int(event.error_code)
                if isinstance(event, h2.events.StreamEnded):
                    raise AssertionError(f"stream {stream} ended without a reset")
            self.receive()

    def close(self) -> None:
        self.sock.close()


def _text(headers: Any) -> dict[str, str]:
    return {
        (k.decode() if isinstance(k, bytes) else k): (v.decode() if isinstance(v, bytes) else v) for k, v in headers
    }


def resident_bytes(pid: int) -> int:
    """The process's resident memory (VmRSS)."""
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) * 1024
    raise AssertionError(f"no VmRSS for process {pid}")


class Watch:
    """While it is entered, a thread asks ``GET /v2/health/live`` over one kept-alive connection, one request after
    another, and reads the daemon's resident memory after each: ``longest_wait_s`` is the longest answer (the event
    loop is shared by HTTP and gRPC, so a stall shows there), ``growth`` the most memory above what it was at the
    start."""

    def __init__(self, pid: int, http_port: int) -> None:
        self._pid = pid
        self._port = http_port
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)
        self.baseline = resident_bytes(pid)
        self.peak = self.baseline
        self.longest_wait_s = 0.0
        self.samples = 0
        self.failures: list[str] = []

    @property
    def growth(self) -> int:
        return self.peak - self.baseline

    def __enter__(self) -> Watch:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join(60)

    def _run(self) -> None:
        conn = http.client.HTTPConnection("127.0.0.1", self._port, timeout=60)
        try:
            while not self._stop.is_set():
                started = time.monotonic()
                try:
                    conn.request("GET", "/v2/health/live")
                    status = conn.getresponse()
                    status.read()
                    if status.status != 200:
                        self.failures.append(f"live answered {status.status}")
                except OSError as exc:
                    self.failures.append(f"live failed: {exc!r}")
                    conn.close()
                    conn = http.client.HTTPConnection("127.0.0.1", self._port, timeout=60)
                self.longest_wait_s = max(self.longest_wait_s, time.monotonic() - started)
                self.peak = max(self.peak, resident_bytes(self._pid))
                self.samples += 1
        finally:
            conn.close()
