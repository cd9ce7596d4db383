"""The gRPC endpoint's HTTP/2 against one hostile client (SECURITY.md classes 18-23): header blocks that cost more to
decode than to send, SETTINGS that touch every stream, control frames for a client that never reads, request bodies
that never end, large distinct header blocks on many connections, deadlines that have passed, malformed requests,
and floods of resets and empty frames.

While an attack runs, ``Watch`` asks ``GET /v2/health/live`` over and over and reads the daemon's resident memory:
the loop is shared by HTTP and gRPC, so a stall shows there. Each test asserts how the daemon ended the attack
(the GOAWAY or RST_STREAM code, or the gRPC status), a bound on the longest wait for the health check and on memory
growth where the attack was about those, and that gRPC serves afterwards. The bounds are far from what each attack
cost before the endpoint bounded it (seconds of stall, hundreds of MiB), so they hold on a slow machine too.
"""

from __future__ import annotations

import contextlib
import socket
import struct
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Final

import h2.events
import h2.settings
import h2floods as fl
import hpack
import pytest
import tritonclient.grpc as grpcclient
from h2client import Client, Watch, grpc_headers, message
from server import Server, assert_grpc_still_serving, run_server
from tritonclient.grpc import service_pb2

MIB: Final = 1 << 20
# The longest a health check may wait while an attack runs; each attack cost the loop seconds before.
STALL_BOUND_S: Final = 0.5
MAX_MESSAGE: Final = 8 * MIB
MAX_BUFFERED: Final = 32 * MIB
PER_CONNECTION: Final = MAX_MESSAGE + 5  # a quarter of MAX_BUFFERED is less than one message
SLOW_BODY_S: Final = 1.0
ENDPOINT_STREAMS: Final = 4096
STREAMS_PER_CONNECTION: Final = 256
GRPC_RESOURCE_EXHAUSTED: Final = "8"
GRPC_DEADLINE_EXCEEDED: Final = "4"
REFUSED_STREAM: Final = 0x7
STREAM_INFER: Final = "/inference.GRPCInferenceService/ModelStreamInfer"


@pytest.fixture(scope="module")
def attacked(small_repository: Path) -> Iterator[Server]:
    """Small request budgets, so that a test can exceed them with a few connections."""
    with run_server(
        [small_repository],
        "--frontend-workers=0",
        f"--grpc-max-message-size={MAX_MESSAGE}",
        f"--grpc-max-buffered-bytes={MAX_BUFFERED}",
    ) as running:
        yield running


@pytest.fixture(scope="module")
def impatient(small_repository: Path) -> Iterator[Server]:
    """A short window for request bodies and replies, and a short idle timeout."""
    with run_server(
        [small_repository],
        "--frontend-workers=0",
        f"--grpc-body-timeout-secs={SLOW_BODY_S}",
        "--grpc-idle-timeout-secs=1",
    ) as running:
        yield running


@pytest.fixture
def grpc_of(attacked: Server) -> Iterator[grpcclient.InferenceServerClient]:
    client = grpcclient.InferenceServerClient(attacked.grpc_url)
    yield client
    client.close()


def _watch(server: Server) -> Watch:
    return Watch(server.process.pid, server.http_port)


def _assert_calm(watch: Watch, growth: int | None = None) -> None:
    assert watch.samples > 0
    assert not watch.failures, watch.failures
    assert watch.longest_wait_s < STALL_BOUND_S, f"the health check waited {watch.longest_wait_s:.2f} s"
    if growth is not None:
        assert watch.growth < growth, f"the daemon grew by {watch.growth / MIB:.0f} MiB"


# --- class 18: header-block cost ------------------------------------------------------------------------------


def test_a_header_block_past_the_bound_is_refused_from_its_frame_header(attacked: Server) -> None:
    # Only the frame's header and the start of its 1 MiB payload: the daemon must not wait for the rest.
    code = fl.flood(attacked.grpc_port, fl.size_update_headers()[:4096])
    assert code == fl.ENHANCE_YOUR_CALM


def test_a_megabyte_of_table_size_updates_does_not_stall_the_loop(
    attacked: Server, grpc_of: grpcclient.InferenceServerClient
) -> None:
    frames = fl.size_update_headers(1) * 10  # the finding: ten such frames held the health check for 12.5 s
    with _watch(attacked) as watch, contextlib.closing(fl.connect(attacked.grpc_port)) as sock:
        fl.send_all(sock, frames)
        fl.read_until_closed(sock)
    _assert_calm(watch)
    assert_grpc_still_serving(grpc_of)


@pytest.mark.parametrize(("updates", "code"), [(3, fl.COMPRESSION_ERROR), (60_000, fl.COMPRESSION_ERROR)])
def test_more_than_two_table_size_updates_are_refused(attacked: Server, updates: int, code: int) -> None:
    block = b"\x20" * updates + fl.block(fl.request_fields())
    assert fl.flood(attacked.grpc_port, fl.frame(fl.HEADERS, fl.END_HEADERS | fl.END_STREAM, 1, block)) == code


def test_two_table_size_updates_are_a_request(attacked: Server) -> None:
    # RFC 7541 4.2: the smallest size, then the final one (4096), at the start of the block.
    updates = b"\x20" + b"\x3f\xe1\x1f"
    with contextlib.closing(fl.connect(attacked.grpc_port)) as sock:
        block = updates + fl.block(fl.request_fields())
        sock.sendall(fl.frame(fl.HEADERS, fl.END_HEADERS, 1, block) + fl.frame(fl.DATA, fl.END_STREAM, 1, message(b"")))
        assert _trailers(sock, 1)[b"grpc-status"] == b"0"


def test_a_settings_frame_of_many_entries_is_refused_whole(attacked: Server) -> None:
    with _watch(attacked) as watch:
        assert fl.flood(attacked.grpc_port, fl.settings_entries(174_000)) == fl.ENHANCE_YOUR_CALM
        assert fl.flood(attacked.grpc_port, fl.settings_entries(33)) == fl.ENHANCE_YOUR_CALM
    _assert_calm(watch)
    # 32 entries are a client's right: acknowledged, and calls go on.
    with contextlib.closing(fl.connect(attacked.grpc_port)) as sock:
        block = fl.block(fl.request_fields())
        sock.sendall(
            fl.settings_entries(32)
            + fl.frame(fl.HEADERS, fl.END_HEADERS, 1, block)
            + fl.frame(fl.DATA, fl.END_STREAM, 1, message(b""))
        )
        assert _trailers(sock, 1)[b"grpc-status"] == b"0"


# --- class 19: control-frame floods ---------------------------------------------------------------------------


def test_a_ping_flood_from_a_client_that_reads_nothing_ends_and_memory_stays_flat(
    attacked: Server, grpc_of: grpcclient.InferenceServerClient
) -> None:
    pings = fl.pings(3_000_000)  # 51 MB; the daemon grew by 790 MiB for 136 MB of them
    with _watch(attacked) as watch:
        code = fl.flood(attacked.grpc_port, pings, receive_buffer=4096)
    assert code == fl.ENHANCE_YOUR_CALM
    _assert_calm(watch, growth=48 * MIB)
    assert_grpc_still_serving(grpc_of)


@pytest.mark.parametrize(
    "attack",
    [
        pytest.param(lambda: fl.empty_settings(5_000), id="settings"),
        pytest.param(lambda: fl.rapid_resets(1_500), id="rapid reset"),
        pytest.param(lambda: fl.empty_continuations(200_000), id="empty continuations"),
        pytest.param(lambda: fl.empty_data(20_000), id="empty data"),
        pytest.param(lambda: fl.frame(0x42, 0, 0) * 20_000, id="unknown frames"),
    ],
)
def test_a_flood_is_answered_enhance_your_calm(
    attacked: Server, grpc_of: grpcclient.InferenceServerClient, attack: Callable[[], bytes]
) -> None:
    payload = attack()
    with _watch(attacked) as watch:
        assert fl.flood(attacked.grpc_port, payload) == fl.ENHANCE_YOUR_CALM
    _assert_calm(watch)
    assert_grpc_still_serving(grpc_of)


# --- class 20: held request bodies ----------------------------------------------------------------------------


def _unfinished(client: Client, size: int) -> int:
    """A ModelInfer call with ``size`` bytes of a larger message sent and no end."""
    return client.open(fl.INFER, message(bytes(MAX_MESSAGE - 16))[:size], end=False)


def test_request_bytes_are_bounded_per_connection_and_for_the_endpoint(
    attacked: Server, grpc_of: grpcclient.InferenceServerClient
) -> None:
    clients = [Client(attacked.grpc_port) for _ in range(5)]
    try:
        with _watch(attacked) as watch:
            # One connection: 7 MiB held, 2 MiB more is past its share.
            held = _unfinished(clients[0], 7 * MIB)
            over = _unfinished(clients[0], 2 * MIB)
            _, _, trailers = clients[0].answer(over)
            assert trailers["grpc-status"] == GRPC_RESOURCE_EXHAUSTED, trailers
            assert "try again" in trailers["grpc-message"]
            # The endpoint: 4 x 7 MiB held, then 5 MiB more on a fifth connection is past 32 MiB.
            for client in clients[1:4]:
                _unfinished(client, 7 * MIB)
            _, _, trailers = clients[4].answer(_unfinished(clients[4], 5 * MIB))
            assert trailers["grpc-status"] == GRPC_RESOURCE_EXHAUSTED, trailers
        _assert_calm(watch, growth=MAX_BUFFERED + 32 * MIB)
        # The call within the budget is still held, unanswered.
        ended = (h2.events.ResponseReceived, h2.events.StreamEnded, h2.events.StreamReset)
        assert not [event for event in clients[0].events if isinstance(event, ended) and event.stream_id == held]
        # Once the connections holding them close, their bytes are free again (as soon as the daemon sees them go).
        for client in clients[:4]:
            client.close()
        deadline = time.monotonic() + 30
        status = GRPC_RESOURCE_EXHAUSTED
        while status == GRPC_RESOURCE_EXHAUSTED and time.monotonic() < deadline:
            stream = _unfinished(clients[4], 7 * MIB)
            clients[4].h2.send_data(stream, b"", end_stream=True)
            clients[4].flush()
            status = clients[4].answer(stream)[2]["grpc-status"]
        assert status == "13", status  # INTERNAL: the message was cut short, but all of it was read
    finally:
        for client in clients:
            client.close()
    assert_grpc_still_serving(grpc_of)


def test_a_request_that_stops_arriving_is_refused_and_its_connection_idles_out(impatient: Server) -> None:
    client = Client(impatient.grpc_port)
    try:
        stream = _unfinished(client, 64 << 10)
        _, _, trailers = client.answer(stream)
        assert trailers["grpc-status"] == GRPC_DEADLINE_EXCEEDED, trailers
        assert "arrived too slowly" in trailers["grpc-message"]
        # Its only stream gone, the connection is idle: GOAWAY (no error) after the idle timeout.
        client.sock.settimeout(30)
        while not any(isinstance(event, h2.events.ConnectionTerminated) for event in client.events):
            client.receive()
    finally:
        client.close()


def test_a_stream_stalled_inside_a_message_ends_with_trailers_after_its_replies(impatient: Server) -> None:
    # A streaming call waits for its client between messages for as long as it likes, but not inside one.
    client = Client(impatient.grpc_port)
    try:
        request = service_pb2.ModelInferRequest(model_name="add_sub")
        for name in ("INPUT0", "INPUT1"):
            request.inputs.add(name=name, datatype="FP32", shape=[1, 16])
            request.raw_input_contents.append(bytes(64))
        stream = client.open(STREAM_INFER, message(request.SerializeToString()), end=False)
        while not any(isinstance(event, h2.events.DataReceived) for event in client.events):
            client.receive()
        client.send(stream, message(bytes(100))[:10], end=False)
        # The strict client would refuse a second response head: the status must come as trailers.
        headers, body, trailers = client.answer(stream)
        assert headers[":status"] == "200" and body
        assert trailers["grpc-status"] == GRPC_DEADLINE_EXCEEDED, trailers
        assert "arrived too slowly" in trailers["grpc-message"]
    finally:
        client.close()


def test_a_reply_whose_client_opens_no_window_is_reset(impatient: Server) -> None:
    client = Client(impatient.grpc_port, {h2.settings.SettingCodes.INITIAL_WINDOW_SIZE: 0})
    try:
        stream = client.open(fl.LIVE, message(b""))
        assert client.reset_code(stream) == 0x8  # CANCEL
    finally:
        client.close()


# --- class 21: per-connection caches --------------------------------------------------------------------------


def test_distinct_large_header_blocks_on_many_connections_are_not_kept(
    attacked: Server, grpc_of: grpcclient.InferenceServerClient
) -> None:
    pad = b"a" * 60_000
    # 30 connections x 64 distinct 60 KB blocks: up to 64 remembered per connection, this held 230 MiB.
    requests = [
        b"".join(
            fl.frame(fl.HEADERS, fl.END_HEADERS | fl.END_STREAM, 1 + 2 * i, fl.block(_get(b"%02d%02d" % (c, i) + pad)))
            for i in range(64)
        )
        for c in range(30)
    ]
    sockets = []
    try:
        with _watch(attacked) as watch:
            for payload in requests:
                sock = fl.connect(attacked.grpc_port)
                sockets.append(sock)
                sock.sendall(payload)
            for sock in sockets:
                _trailers(sock, 127)  # every request answered (405), the connections open and idle
        _assert_calm(watch, growth=48 * MIB)
    finally:
        for sock in sockets:
            sock.close()
    assert_grpc_still_serving(grpc_of)


def _get(pad: bytes) -> list[tuple[bytes, bytes]]:
    return [(b":method", b"GET"), *fl.request_fields()[1:], (b"x-pad", pad)]


def test_streams_past_the_endpoint_bound_are_refused(
    attacked: Server, grpc_of: grpcclient.InferenceServerClient
) -> None:
    block = fl.block(fl.request_fields(fl.INFER))
    opened = b"".join(fl.frame(fl.HEADERS, fl.END_HEADERS, 1 + 2 * i, block) for i in range(STREAMS_PER_CONNECTION))
    sockets = []
    try:
        for _ in range(ENDPOINT_STREAMS // STREAMS_PER_CONNECTION):
            sock = fl.connect(attacked.grpc_port)
            sockets.append(sock)
            sock.sendall(opened)
            _all_read(sock)
        extra = fl.connect(attacked.grpc_port)
        sockets.append(extra)
        extra.sendall(fl.frame(fl.HEADERS, fl.END_HEADERS, 1, block))
        assert _reset(extra, 1) == REFUSED_STREAM
    finally:
        for sock in sockets:
            sock.close()
    assert_grpc_still_serving(grpc_of)


# --- class 22: expired deadlines ------------------------------------------------------------------------------


@pytest.mark.parametrize("timeout", ["1n", "0S"])
def test_an_expired_deadline_is_answered_at_once_and_frees_its_stream(attacked: Server, timeout: str) -> None:
    client = Client(attacked.grpc_port)
    try:
        headers = [*grpc_headers(fl.LIVE, attacked.grpc_port), ("grpc-timeout", timeout)]
        # More calls than a connection may have open: each must be answered and its stream freed.
        for _ in range(STREAMS_PER_CONNECTION + 44):
            _, _, trailers = client.answer(client.open(fl.LIVE, message(b""), headers))
            assert trailers["grpc-status"] == GRPC_DEADLINE_EXCEEDED, trailers
        assert client.answer(client.open(fl.LIVE, message(b"")))[2]["grpc-status"] == "0"
    finally:
        client.close()


# --- class 23: malformed requests -----------------------------------------------------------------------------

_FIELDS: Final = fl.request_fields()
MALFORMED: Final = {
    "an upper-case name": [*_FIELDS, (b"X-Upper", b"v")],
    "a name with a space": [*_FIELDS, (b"x-key ", b"v")],
    "a duplicated :path": [*_FIELDS[:3], (b":path", b"/other"), *_FIELDS[3:]],
    "a pseudo-header after a regular field": [*_FIELDS[:3], *_FIELDS[4:], _FIELDS[3]],
    "an unknown pseudo-header": [(b":evil", b"1"), *_FIELDS],
    "a connection-specific field": [*_FIELDS, (b"connection", b"keep-alive")],
    "transfer-encoding": [*_FIELDS, (b"transfer-encoding", b"chunked")],
    "te other than trailers": [*_FIELDS[:5], (b"te", b"gzip")],
    "NUL in a value": [*_FIELDS, (b"x-value", b"a\0b")],
    "CR in a value": [*_FIELDS, (b"x-value", b"a\rb")],
    "LF in a value": [*_FIELDS, (b"x-value", b"a\nb")],
    "a value with a leading space": [*_FIELDS, (b"x-value", b" a")],
    "no :path": [field for field in _FIELDS if field[0] != b":path"],
    "an empty :path": [(name, b"" if name == b":path" else value) for name, value in _FIELDS],
    "content-length larger than the body": [*_FIELDS, (b"content-length", b"100")],
    "content-length smaller than the body": [*_FIELDS, (b"content-length", b"2")],
    "content-length that is not a number": [*_FIELDS, (b"content-length", b"5, 5")],
}


@pytest.mark.parametrize("case", list(MALFORMED))
def test_a_malformed_request_is_a_stream_error_and_the_connection_goes_on(attacked: Server, case: str) -> None:
    with contextlib.closing(fl.connect(attacked.grpc_port)) as sock:
        sock.sendall(
            fl.frame(fl.HEADERS, fl.END_HEADERS, 1, fl.block(MALFORMED[case]))
            + fl.frame(fl.DATA, fl.END_STREAM, 1, message(b""))
            + fl.frame(fl.HEADERS, fl.END_HEADERS, 3, fl.block(_FIELDS))
            + fl.frame(fl.DATA, fl.END_STREAM, 3, message(b""))
        )
        frames = _until_ended(sock, 3)
        resets = [payload for kind, _, stream, payload in frames if kind == fl.RST_STREAM and stream == 1]
        assert resets and struct.unpack(">L", resets[0])[0] == fl.PROTOCOL_ERROR
        assert not [kind for kind, _, stream, _ in frames if stream == 1 and kind != fl.RST_STREAM]
        assert _fields(frames, 3)[b"grpc-status"] == b"0"


def test_trailers_from_the_client_are_checked_too(attacked: Server) -> None:
    with contextlib.closing(fl.connect(attacked.grpc_port)) as sock:
        sock.sendall(
            fl.frame(fl.HEADERS, fl.END_HEADERS, 1, fl.block(_FIELDS))
            + fl.frame(fl.DATA, 0, 1, message(b""))
            + fl.frame(fl.HEADERS, fl.END_HEADERS | fl.END_STREAM, 1, fl.block([(b":path", b"/other")]))
        )
        assert _reset(sock, 1) == fl.PROTOCOL_ERROR


# --- raw frames -----------------------------------------------------------------------------------------------


def _until_ended(sock: socket.socket, stream: int) -> list[tuple[int, int, int, bytes]]:
    """The daemon's frames until ``stream`` ends (END_STREAM or RST_STREAM)."""
    sock.settimeout(30)
    received = b""
    while True:
        data = sock.recv(1 << 16)
        assert data, f"the connection closed before stream {stream} ended"
        received += data
        frames = fl.frames_of(received)
        for kind, flags, number, _ in frames:
            if number == stream and (kind == fl.RST_STREAM or (kind == fl.HEADERS and flags & fl.END_STREAM)):
                return frames


def _fields(frames: list[tuple[int, int, int, bytes]], stream: int) -> dict[bytes, bytes]:
    decoder = hpack.Decoder()
    fields: dict[bytes, bytes] = {}
    for kind, _, number, payload in frames:
        if kind == fl.HEADERS:
            decoded = dict(decoder.decode(payload, raw=True))
            if number == stream:
                fields.update(decoded)
    return fields


def _trailers(sock: socket.socket, stream: int) -> dict[bytes, bytes]:
    return _fields(_until_ended(sock, stream), stream)


def _reset(sock: socket.socket, stream: int) -> int:
    for kind, _, number, payload in _until_ended(sock, stream):
        if kind == fl.RST_STREAM and number == stream:
            return int(struct.unpack(">L", payload)[0])
    raise AssertionError(f"stream {stream} ended without a reset")


def _all_read(sock: socket.socket) -> None:
    """Waits for the daemon's acknowledgement of a PING sent now: every frame before it has been read."""
    sock.sendall(fl.frame(fl.PING, 0, 0, b"frames!!"))
    sock.settimeout(30)
    received = b""
    while not any(kind == fl.PING and flags & 0x1 for kind, flags, _, _ in fl.frames_of(received)):
        data = sock.recv(1 << 16)
        assert data, "the connection closed"
        received += data
