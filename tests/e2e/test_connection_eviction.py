"""At the connection limit a new connection takes the place of one that costs the device's clients least
(edged.frontends.http.limits, edged.frontends.grpc.server): the oldest that has not sent a whole request head (on
gRPC, not finished its HTTP/2 handshake), else the one idle longest between requests; only when every connection
is amid a request is the new one refused. A slow-loris flood at the limit then costs its sender, not a real client.

The daemon's timeouts are long here, so that no connection is closed by a clock: each closure seen is the limit's.
Real sockets against the real daemon; how many connections the daemon holds is read from the kernel's socket table.
"""

from __future__ import annotations

import http.client
import socket
import time
from collections.abc import Iterator
from pathlib import Path

import h2.events
import pytest
import tritonclient.grpc as grpcclient
from h2client import Client, message
from server import Server, assert_grpc_still_serving, request, run_server

CAP = 8
EXTRA = 4
# No clock of the daemon's may close a connection during a test: each one is far longer than a test runs.
LONG_S = 600
# How long a read may wait for what the daemon must send (or for it to close): generous, for a loaded machine.
READ_S = 60.0
PARTIAL_HEAD = b"GET /v2/health/live HTTP/1.1\r\nHost: edged\r\nX-Never-Ends: "
HEALTH_CHECK = "/grpc.health.v1.Health/Check"
# Socket states in /proc/net/tcp that hold a descriptor of the daemon's: ESTABLISHED, and CLOSE_WAIT (the client
# closed, the daemon has not yet).
_HELD_STATES = {"01", "08"}


@pytest.fixture(scope="module")
def capped(bundled_repository: Path) -> Iterator[Server]:
    with run_server(
        [bundled_repository],
        f"--http-max-connections={CAP}",
        f"--http-header-timeout-secs={LONG_S}",
        f"--http-body-timeout-secs={LONG_S}",
        "--http-min-body-rate=1",
        f"--http-keepalive-timeout-secs={LONG_S}",
        f"--grpc-max-connections={CAP}",
        f"--grpc-handshake-timeout-secs={LONG_S}",
        f"--grpc-idle-timeout-secs={LONG_S}",
        f"--grpc-body-timeout-secs={LONG_S}",
        "--grpc-min-body-rate=1",
    ) as server:
        yield server


def _held(port: int) -> int:
    """Connections to ``port`` that the daemon holds a socket of, as the kernel counts them."""
    count = 0
    for table in ("/proc/net/tcp", "/proc/net/tcp6"):
        with open(table, encoding="ascii") as lines:
            next(lines)
            for line in lines:
                fields = line.split()
                if int(fields[1].rsplit(":", 1)[1], 16) == port and fields[3] in _HELD_STATES:
                    count += 1
    return count


def _quiet(port: int) -> None:
    """Waits until the daemon holds no connection of an earlier test (closed by the client, maybe not yet seen)."""
    deadline = time.monotonic() + READ_S
    while _held(port):
        assert time.monotonic() < deadline, f"{_held(port)} connections of an earlier test are still held"
        time.sleep(0.05)


def _evicted(server: Server) -> float:
    """HTTP connections closed to make room so far, as /metrics counts them."""
    metrics = request(server.metrics_url, "GET", "/metrics").body.decode()
    name = 'edged_http_refused_connections_total{endpoint="HTTP",reason="evicted"} '
    return sum(float(line.removeprefix(name)) for line in metrics.splitlines() if line.startswith(name))


def _connect(port: int) -> socket.socket:
    return socket.create_connection(("127.0.0.1", port), timeout=READ_S)


def _half_open(port: int) -> socket.socket:
    sock = _connect(port)
    sock.sendall(PARTIAL_HEAD)
    return sock


def _closed_by_daemon(sock: socket.socket) -> bytes:
    """What the daemon sent before it closed ``sock`` (a read timeout fails the test)."""
    data = b""
    try:
        while chunk := sock.recv(65536):
            data += chunk
    except ConnectionResetError:
        pass
    return data


def _finish_and_read(sock: socket.socket) -> int:
    """Ends the half-open request on ``sock`` and returns its answer's status: the connection was still open."""
    sock.sendall(b"1\r\n\r\n")
    response = http.client.HTTPResponse(sock)
    response.begin()
    response.read()
    return response.status


def _kept_alive(port: int) -> http.client.HTTPConnection:
    """A connection that has had one request answered and is kept alive, idle."""
    connection = http.client.HTTPConnection("127.0.0.1", port, timeout=READ_S)
    connection.request("GET", "/v2/health/live")
    reply = connection.getresponse()
    reply.read()
    assert reply.status == 200
    return connection


def _again(connection: http.client.HTTPConnection) -> int:
    """One more request on the same kept-alive connection (never a new one: the socket must be the same)."""
    assert connection.sock is not None
    before = connection.sock.getsockname()
    connection.request("GET", "/v2/health/live")
    reply = connection.getresponse()
    reply.read()
    assert connection.sock is not None and connection.sock.getsockname() == before
    return reply.status


def test_a_slow_loris_flood_at_the_limit_costs_its_sender_not_a_real_client(capped: Server) -> None:
    port = capped.http_port
    _quiet(port)
    evicted_before = _evicted(capped)
    flood = [_half_open(port) for _ in range(CAP + EXTRA)]
    try:
        # The oldest went to make room for the newest, unanswered: nothing is owed to a request never sent whole.
        for sock in flood[:EXTRA]:
            assert _closed_by_daemon(sock) == b""
        assert _held(port) <= CAP
        # A real client is served at once, in the place of the oldest half-open connection left.
        reply = request(capped.http_url, "GET", "/v2/health/live", timeout=READ_S)
        assert reply.status == 200
        assert _closed_by_daemon(flood[EXTRA]) == b""
        assert _held(port) <= CAP
        # The rest were never closed: each one's request, finished now, is answered.
        for sock in flood[EXTRA + 1 :]:
            assert _finish_and_read(sock) == 200
    finally:
        for sock in flood:
            sock.close()
    assert _evicted(capped) - evicted_before == EXTRA + 1
    assert "HTTP endpoint refused and closed: 1 idle or yet to send a whole request, for a newer" in capped.log()


def test_a_kept_alive_connection_outlives_newer_half_open_ones(capped: Server) -> None:
    port = capped.http_port
    _quiet(port)
    kept = _kept_alive(port)  # the oldest connection of all, idle between requests
    flood = [_half_open(port) for _ in range(CAP)]  # one more than the limit, with the kept one
    try:
        # Not the kept one, older as it is: the oldest of those that never sent a whole request.
        assert _closed_by_daemon(flood[0]) == b""
        assert _again(kept) == 200
        assert _held(port) <= CAP
    finally:
        kept.close()
        for sock in flood:
            sock.close()


def test_with_every_connection_idle_the_one_idle_longest_goes(capped: Server) -> None:
    port = capped.http_port
    _quiet(port)
    idle = [_kept_alive(port) for _ in range(CAP)]
    try:
        assert request(capped.http_url, "GET", "/v2/health/live", timeout=READ_S).status == 200
        assert idle[0].sock is not None
        assert _closed_by_daemon(idle[0].sock) == b""
        for connection in idle[1:]:
            assert _again(connection) == 200
    finally:
        for connection in idle:
            connection.close()


def test_with_every_connection_amid_a_request_a_new_one_is_refused(capped: Server) -> None:
    port = capped.http_port
    _quiet(port)
    busy: list[socket.socket] = []
    try:
        for _ in range(CAP):
            sock = _connect(port)
            busy.append(sock)
            # Expect: 100-continue makes the daemon say when it has read the head and waits for the body.
            sock.sendall(
                b"POST /v2/logging HTTP/1.1\r\nHost: edged\r\nContent-Type: application/json\r\n"
                b"Content-Length: 100\r\nExpect: 100-continue\r\n\r\n"
            )
            assert sock.recv(65536).startswith(b"HTTP/1.1 100 Continue")
            sock.sendall(b"{")
        with _connect(port) as extra:
            reply = _closed_by_daemon(extra)
        assert reply.startswith(b"HTTP/1.1 503"), reply
        assert b"too many connections (at most 8)" in reply
        assert _held(port) <= CAP
    finally:
        for sock in busy:
            sock.close()
    assert "HTTP endpoint refused and closed: 1 over the connection limit (503)" in capped.log()


# --- gRPC ----------------------------------------------------------------------------------------------------------


def _settled(port: int) -> Client:
    """An HTTP/2 connection whose handshake is done and whose one call has ended: idle."""
    client = Client(port)
    client.sock.settimeout(READ_S)
    headers, _, trailers = client.answer(client.open(HEALTH_CHECK, message(b"")))
    assert headers.get(":status") == "200" and trailers.get("grpc-status") == "0", (headers, trailers)
    return client


def _pinged(client: Client) -> None:
    """Every frame sent before has been read by the daemon (frames are read in order)."""
    client.h2.ping(b"evicted?")
    client.flush()
    while not any(isinstance(event, h2.events.PingAckReceived) for event in client.events):
        client.receive()
    client.events.clear()


def test_half_open_grpc_connections_make_room_for_a_real_client(capped: Server) -> None:
    port = capped.grpc_port
    _quiet(port)
    flood = [_connect(port) for _ in range(CAP + EXTRA)]  # TCP only: no HTTP/2 preface ever
    try:
        for sock in flood[:EXTRA]:
            _closed_by_daemon(sock)  # the daemon's SETTINGS may come first; then the close
        assert _held(port) <= CAP
        client = grpcclient.InferenceServerClient(capped.grpc_url)
        assert_grpc_still_serving(client)
        client.close()
        assert _held(port) <= CAP
    finally:
        for sock in flood:
            sock.close()


def test_an_idle_grpc_connection_outlives_newer_half_open_ones(capped: Server) -> None:
    port = capped.grpc_port
    _quiet(port)
    kept = _settled(port)
    flood = [_connect(port) for _ in range(CAP)]
    try:
        _closed_by_daemon(flood[0])
        _pinged(kept)
        headers, _, trailers = kept.answer(kept.open(HEALTH_CHECK, message(b"")))
        assert trailers.get("grpc-status") == "0", (headers, trailers)
    finally:
        kept.close()
        for sock in flood:
            sock.close()


def test_with_every_grpc_connection_idle_the_one_idle_longest_is_sent_goaway(capped: Server) -> None:
    port = capped.grpc_port
    _quiet(port)
    idle = [_settled(port) for _ in range(CAP)]
    try:
        newcomer = _settled(port)
        newcomer.close()
        with pytest.raises(ConnectionError):
            while True:
                idle[0].receive()
        assert any(isinstance(event, h2.events.ConnectionTerminated) for event in idle[0].events)
        for client in idle[1:]:
            _pinged(client)
    finally:
        for client in idle:
            client.close()


def test_with_every_grpc_connection_amid_a_call_a_new_one_is_closed(capped: Server) -> None:
    port = capped.grpc_port
    _quiet(port)
    busy: list[Client] = []
    try:
        for _ in range(CAP):
            client = Client(port)
            client.sock.settimeout(READ_S)
            busy.append(client)
            client.open(HEALTH_CHECK, end=False)  # the request never comes
            _pinged(client)
        with _connect(port) as extra:
            assert _closed_by_daemon(extra) == b""
        for client in busy:
            _pinged(client)
    finally:
        for client in busy:
            client.close()
