"""Slow, idle and excess connections are bounded (edged.frontends.http.limits, the gRPC server's options): a client
that sends part of a request and stops, trickles it, idles, or opens connection after connection cannot hold the
daemon's file descriptors, and exhausting one endpoint leaves the other serving. Real sockets against the real
daemon, with short timeouts so that each case takes a second or two."""

from __future__ import annotations

import contextlib
import json
import socket
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
import tritonclient.grpc as grpcclient
import tritonclient.http as httpclient
from server import Server, assert_grpc_still_serving, assert_still_serving, request, run_server

HEADER_TIMEOUT_S = 1.0
BODY_WINDOW_S = 1.0
MIN_BODY_RATE = 1000  # bytes per second
KEEPALIVE_S = 1.0
MAX_CONNECTIONS = 16
# Longest a timed-out connection may take to be closed: its timeout plus one timer's lateness on a busy machine.
SLACK_S = 3.0
GRPC_HANDSHAKE_S = 2.0


@pytest.fixture(scope="module")
def limited(bundled_repository: Path) -> Iterator[Server]:
    with run_server(
        [bundled_repository],
        f"--http-header-timeout-secs={HEADER_TIMEOUT_S}",
        f"--http-body-timeout-secs={BODY_WINDOW_S}",
        f"--http-min-body-rate={MIN_BODY_RATE}",
        f"--http-keepalive-timeout-secs={KEEPALIVE_S}",
        f"--http-max-connections={MAX_CONNECTIONS}",
        f"--grpc-max-connections={MAX_CONNECTIONS}",
        f"--grpc-handshake-timeout-secs={GRPC_HANDSHAKE_S}",
    ) as server:
        yield server


def _connect(port: int) -> socket.socket:
    return socket.create_connection(("127.0.0.1", port), timeout=HEADER_TIMEOUT_S + SLACK_S + 5)


def _read_until_closed(sock: socket.socket) -> bytes:
    """Everything the server sends until it closes the connection (fails the test on a read timeout)."""
    data = b""
    while chunk := sock.recv(65536):
        data += chunk
    return data


def _status_and_error(reply: bytes) -> tuple[int, str]:
    head, _, body = reply.partition(b"\r\n\r\n")
    status = int(head.split(b" ", 2)[1])
    return status, str(json.loads(body)["error"])


def test_a_connection_that_sends_nothing_is_closed(limited: Server) -> None:
    started = time.monotonic()
    with _connect(limited.http_port) as sock:
        status, error = _status_and_error(_read_until_closed(sock))
    assert status == 408 and "request headers not received within 1 s" in error
    assert HEADER_TIMEOUT_S * 0.9 <= time.monotonic() - started < HEADER_TIMEOUT_S + SLACK_S
    assert "too slow to send a request (408)" in limited.log()  # counted and logged, at most every 10 s


def test_headers_that_trickle_are_cut_off(limited: Server) -> None:
    started = time.monotonic()
    with _connect(limited.http_port) as sock:
        sock.sendall(b"POST /v2/models/add_sub/infer HTTP/1.1\r\n")
        closed = False
        for _ in range(40):  # a byte every 0.1 s: progress, but the headers never end
            try:
                sock.sendall(b"X")
            except OSError:
                closed = True
                break
            time.sleep(0.1)
            if time.monotonic() - started > HEADER_TIMEOUT_S + 0.5:
                break
        reply = b"" if closed else _read_until_closed(sock)
    assert time.monotonic() - started < HEADER_TIMEOUT_S + SLACK_S
    if reply:
        assert _status_and_error(reply)[0] == 408


def test_a_body_that_trickles_is_cut_off(limited: Server) -> None:
    started = time.monotonic()
    with _connect(limited.http_port) as sock:
        sock.sendall(b"POST /v2/logging HTTP/1.1\r\nHost: edged\r\nContent-Length: 5000\r\n\r\n{")
        for _ in range(10):
            time.sleep(0.2)
            try:
                sock.sendall(b" ")  # 5 bytes a second, far under the minimum rate
            except OSError:
                break
        status, error = _status_and_error(_read_until_closed(sock))
    assert status == 408 and "request body arrived too slowly" in error
    assert time.monotonic() - started < BODY_WINDOW_S + SLACK_S


def test_a_slow_body_at_the_minimum_rate_is_served(limited: Server) -> None:
    # Three windows long, each bringing twice the minimum: a slow link, not an attack.
    body = b"{" + b" " * (3 * 2 * MIN_BODY_RATE - 2) + b"}"
    with _connect(limited.http_port) as sock:
        sock.sendall(b"POST /v2/logging HTTP/1.1\r\nHost: edged\r\nContent-Length: %d\r\n\r\n" % len(body))
        step = MIN_BODY_RATE // 2
        for start in range(0, len(body), step):
            sock.sendall(body[start : start + step])
            time.sleep(0.25)
        reply = sock.recv(65536)
    assert reply.startswith(b"HTTP/1.1 200"), reply


def test_an_idle_kept_alive_connection_is_closed(limited: Server) -> None:
    with _connect(limited.http_port) as sock:
        sock.sendall(b"GET /v2/health/live HTTP/1.1\r\nHost: edged\r\n\r\n")
        assert sock.recv(65536).startswith(b"HTTP/1.1 200")
        started = time.monotonic()
        assert _read_until_closed(sock) == b""
    assert KEEPALIVE_S * 0.9 <= time.monotonic() - started < KEEPALIVE_S + SLACK_S


def test_connections_past_the_limit_make_room_and_grpc_keeps_serving(limited: Server) -> None:
    # A limit's worth of connections that send nothing does not lock real clients out: a new connection takes the
    # place of the oldest one yet to send a request (test_connection_eviction has the policy's every case, and the
    # 503 once every connection is amid a request).
    held = [_connect(limited.http_port) for _ in range(MAX_CONNECTIONS)]
    try:
        client = httpclient.InferenceServerClient(limited.http_url)
        assert_still_serving(client)
        client.close()
        grpc = grpcclient.InferenceServerClient(limited.grpc_url)
        assert_grpc_still_serving(grpc)
        grpc.close()
    finally:
        for sock in held:
            sock.close()
    # Refusals are counted for Prometheus, beside Triton's families.
    metrics = request(limited.metrics_url, "GET", "/metrics").body.decode()
    assert "# TYPE edged_http_refused_connections_total counter" in metrics
    assert "nv_inference_count" in metrics and "_created" not in metrics


def test_half_open_grpc_connections_time_out_and_http_keeps_serving(limited: Server) -> None:
    # Connections that never speak HTTP/2 count against the gRPC limit until their handshake times out; past the
    # limit each new one takes the place of the oldest of them.
    held = [_connect(limited.grpc_port) for _ in range(MAX_CONNECTIONS + 4)]
    try:
        client = httpclient.InferenceServerClient(limited.http_url)
        assert_still_serving(client)
        client.close()
        started = time.monotonic()
        for sock in held[:4]:  # the first ones made room for the last: closed already, long before any timeout
            sock.settimeout(SLACK_S + 1)
            with contextlib.suppress(ConnectionResetError):
                _read_until_closed(sock)  # after the daemon's SETTINGS, sent to every connection at once
        assert time.monotonic() - started < GRPC_HANDSHAKE_S
        for sock in held:
            sock.settimeout(SLACK_S + 1)
            with contextlib.suppress(ConnectionResetError):
                _read_until_closed(sock)  # a GOAWAY ("handshake timeout") may come before the close
        assert time.monotonic() - started < GRPC_HANDSHAKE_S + SLACK_S
    finally:
        for sock in held:
            sock.close()
    grpc = grpcclient.InferenceServerClient(limited.grpc_url)
    assert_grpc_still_serving(grpc)
    grpc.close()
