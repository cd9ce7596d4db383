"""The gRPC endpoint's HTTP/2, driven by a strict HTTP/2 client (the ``h2`` library, which checks every frame the
daemon sends against RFC 9113) and by hand-made frames a broken or hostile client would send: flow control and
frame sizes the client chose, the stream limit, streams opened and reset in a flood, PING, and malformed frames
that must end only their own connection with the RFC's error code while the daemon keeps serving."""

from __future__ import annotations

import socket
import struct
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Final

import h2.events
import h2.settings
import hpack
import numpy as np
import pytest
import tritonclient.grpc as grpcclient
from h2client import Client, grpc_headers, message
from server import Server, assert_grpc_still_serving, run_server
from tritonclient.grpc import service_pb2

INFER: Final = "/inference.GRPCInferenceService/ModelInfer"
LIVE: Final = "/inference.GRPCInferenceService/ServerLive"
PREFACE: Final = b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n"
# RFC 9113 error codes and frame types
PROTOCOL_ERROR: Final = 0x1
FLOW_CONTROL_ERROR: Final = 0x3
FRAME_SIZE_ERROR: Final = 0x6
REFUSED_STREAM: Final = 0x7
COMPRESSION_ERROR: Final = 0x9
ENHANCE_YOUR_CALM: Final = 0xB
SERVER_MAX_STREAMS: Final = 256
IDLE_S: Final = 1.0


_message = message
_headers = grpc_headers


@pytest.fixture
def h2_client(server: Server) -> Iterator[Client]:
    client = Client(server.grpc_port)
    yield client
    client.close()


def test_a_unary_call_from_a_strict_http2_client(h2_client: Client) -> None:
    stream = h2_client.open(LIVE, _message(service_pb2.ServerLiveRequest().SerializeToString()))
    headers, body, trailers = h2_client.answer(stream)
    assert headers[":status"] == "200"
    assert headers["content-type"] == "application/grpc"
    assert trailers["grpc-status"] == "0"
    assert service_pb2.ServerLiveResponse.FromString(body[5:]).live
    settings = h2_client.h2.remote_settings
    assert settings[h2.settings.SettingCodes.MAX_CONCURRENT_STREAMS] == SERVER_MAX_STREAMS


def test_unknown_method_wrong_verb_and_wrong_content_type(h2_client: Client) -> None:
    stream = h2_client.open("/inference.GRPCInferenceService/Nope", _message(b""))
    _, _, trailers = h2_client.answer(stream)
    assert trailers["grpc-status"] == "12"  # UNIMPLEMENTED
    assert trailers["grpc-message"] == "Method not found!"
    get = [(":method", "GET") if name == ":method" else (name, value) for name, value in _headers(LIVE, 0)]
    headers, _, _ = h2_client.answer(h2_client.open(LIVE, None, get))
    assert headers[":status"] == "405"
    plain = [(name, "text/plain" if name == "content-type" else value) for name, value in _headers(LIVE, 0)]
    headers, _, _ = h2_client.answer(h2_client.open(LIVE, _message(b""), plain))
    assert headers[":status"] == "415"


def test_a_malformed_message_is_internal_and_the_connection_goes_on(h2_client: Client) -> None:
    stream = h2_client.open(INFER, _message(b"\xff\xff\xff"))
    _, _, trailers = h2_client.answer(stream)
    assert trailers["grpc-status"] == "13"  # INTERNAL
    stream = h2_client.open(INFER, b"\0\0\0\0\x10abc")  # a length prefix past the end
    _, _, trailers = h2_client.answer(stream)
    assert trailers["grpc-status"] == "13"
    stream = h2_client.open(LIVE, _message(b""))
    assert h2_client.answer(stream)[2]["grpc-status"] == "0"


def test_a_large_reply_keeps_to_the_clients_window_and_frame_size(server: Server) -> None:
    # A 16 KiB frame size and a 1 KiB stream window: h2 raises if the daemon sends past either.
    client = Client(server.grpc_port, {h2.settings.SettingCodes.INITIAL_WINDOW_SIZE: 1024})
    try:
        values = np.arange(8 * 40_000, dtype=np.float32).reshape(8, 40_000)
        request = service_pb2.ModelInferRequest(model_name="identity_fp32")
        request.inputs.add(name="INPUT0", datatype="FP32", shape=list(values.shape))
        request.raw_input_contents.append(values.tobytes())
        _, body, trailers = client.answer(client.open(INFER, _message(request.SerializeToString())))
        assert trailers["grpc-status"] == "0", trailers
        reply = service_pb2.ModelInferResponse.FromString(body[5:])
        np.testing.assert_array_equal(np.frombuffer(reply.raw_output_contents[0], np.float32), values.ravel())
        assert 0 < client.max_data_frame <= 16384
    finally:
        client.close()


def test_ping_is_answered(h2_client: Client) -> None:
    h2_client.h2.ping(b"edged-01")
    h2_client.flush()
    while not any(isinstance(event, h2.events.PingAckReceived) for event in h2_client.events):
        h2_client.receive()
    (ack,) = [event for event in h2_client.events if isinstance(event, h2.events.PingAckReceived)]
    assert ack.ping_data == b"edged-01"


def test_streams_past_the_limit_are_refused_and_reset_ones_are_freed(h2_client: Client) -> None:
    opened = [h2_client.open(INFER, end=False) for _ in range(SERVER_MAX_STREAMS)]
    # h2 itself keeps to the daemon's limit: the next stream is written by hand.
    extra = opened[-1] + 2
    encoder = hpack.Encoder()
    block = encoder.encode(_headers(INFER, h2_client.port))
    h2_client.sock.sendall(_frame(0x1, 0x4, extra, block))
    # Nothing was read from the socket yet: the daemon's frames are parsed from its first byte.
    received = b""
    reset = None
    while reset is None:
        data = h2_client.sock.recv(1 << 16)
        assert data, "the connection closed"
        received += data
        reset = _find_rst(received, extra)
    assert reset == REFUSED_STREAM


def test_a_flood_of_opened_and_reset_streams_leaves_none_open(h2_client: Client) -> None:
    # More streams than the limit, each reset at once: had any stayed open, the call after them would be refused.
    for _ in range(3 * SERVER_MAX_STREAMS):  # within the rate of resets (1,000 at once)
        stream = h2_client.open(INFER, end=False)
        h2_client.h2.reset_stream(stream)
    h2_client.flush()
    stream = h2_client.open(LIVE, _message(b""))
    assert h2_client.answer(stream)[2]["grpc-status"] == "0"


def _frame(kind: int, flags: int, stream: int, payload: bytes) -> bytes:
    return len(payload).to_bytes(3, "big") + bytes((kind, flags)) + stream.to_bytes(4, "big") + payload


def _find_rst(data: bytes, stream: int) -> int | None:
    position = 0
    while position + 9 <= len(data):
        size = int.from_bytes(data[position : position + 3], "big")
        kind, sid = data[position + 3], int.from_bytes(data[position + 5 : position + 9], "big")
        if kind == 0x3 and sid == stream:
            return int.from_bytes(data[position + 9 : position + 13], "big")
        position += 9 + size
    return None


def _goaway_code(sock: socket.socket) -> int | None:
    """The error code of the GOAWAY the daemon sends before it closes; None if it closes without one."""
    received = b""
    sock.settimeout(20)
    while True:
        try:
            data = sock.recv(1 << 16)
        except ConnectionResetError:
            data = b""
        if not data:
            break
        received += data
    position = 0
    while position + 9 <= len(received):
        size = int.from_bytes(received[position : position + 3], "big")
        if received[position + 3] == 0x7:
            return int(struct.unpack(">LL", received[position + 9 : position + 17])[1])
        position += 9 + size
    return None


_SETTINGS: Final = _frame(0x4, 0, 0, b"")
_GRPC_BLOCK: Final = hpack.Encoder().encode(_headers(LIVE, 1))

MALFORMED: Final = {
    "a frame past the announced size": (b"\x10\x00\x01" + _frame(0x0, 0, 1, b"")[3:], FRAME_SIZE_ERROR),
    "data on the connection": (_frame(0x0, 0, 0, b"x"), PROTOCOL_ERROR),
    "data on an idle stream": (_frame(0x0, 0, 7, b"x"), PROTOCOL_ERROR),
    "a header block that is not HPACK": (_frame(0x1, 0x5, 1, b"\xff\xff\xff\xff\xff"), COMPRESSION_ERROR),
    "headers on an even stream": (_frame(0x1, 0x5, 2, _GRPC_BLOCK), PROTOCOL_ERROR),
    "a ping of the wrong length": (_frame(0x6, 0, 0, b"1234"), FRAME_SIZE_ERROR),
    "a window update of zero": (_frame(0x8, 0, 0, bytes(4)), PROTOCOL_ERROR),
    "a window past 2^31-1": (_frame(0x8, 0, 0, (2**31 - 1).to_bytes(4, "big")), FLOW_CONTROL_ERROR),
    "settings of the wrong length": (_frame(0x4, 0, 0, b"12345"), FRAME_SIZE_ERROR),
    "a push from the client": (_frame(0x5, 0x4, 1, bytes(4)), PROTOCOL_ERROR),
    "continuation without headers": (_frame(0x9, 0x4, 1, _GRPC_BLOCK), PROTOCOL_ERROR),
    "a header block past 64 KiB": (
        _frame(0x1, 0x0, 1, _GRPC_BLOCK) + b"".join(_frame(0x9, 0, 1, bytes(16384)) for _ in range(5)),
        ENHANCE_YOUR_CALM,
    ),
    "a padding longer than its frame": (_frame(0x1, 0x5 | 0x8, 1, b"\xff" + _GRPC_BLOCK), PROTOCOL_ERROR),
}


@pytest.mark.parametrize("case", list(MALFORMED))
def test_a_malformed_frame_ends_only_its_connection(
    server: Server, grpc_client: grpcclient.InferenceServerClient, case: str
) -> None:
    frames, code = MALFORMED[case]
    sock = socket.create_connection(("127.0.0.1", server.grpc_port), timeout=20)
    try:
        sock.sendall(PREFACE + _SETTINGS + frames)
        assert _goaway_code(sock) == code
    finally:
        sock.close()
    assert_grpc_still_serving(grpc_client)


def test_a_connection_that_is_not_http2_is_closed(
    server: Server, grpc_client: grpcclient.InferenceServerClient
) -> None:
    sock = socket.create_connection(("127.0.0.1", server.grpc_port), timeout=20)
    try:
        sock.sendall(b"GET / HTTP/1.1\r\nHost: x\r\n\r\n")
        assert _goaway_code(sock) == PROTOCOL_ERROR
    finally:
        sock.close()
    assert_grpc_still_serving(grpc_client)


@pytest.mark.parametrize("algorithm", ["gzip", "deflate"])
def test_compressed_requests(grpc_client: grpcclient.InferenceServerClient, algorithm: str) -> None:
    values = np.ones((1, 16), dtype=np.float32)
    inputs = [grpcclient.InferInput(name, [1, 16], "FP32") for name in ("INPUT0", "INPUT1")]
    for tensor in inputs:
        tensor.set_data_from_numpy(values)
    result = grpc_client.infer("add_sub", inputs, compression_algorithm=algorithm)
    np.testing.assert_array_equal(result.as_numpy("OUTPUT0"), values * 2)


@pytest.fixture(scope="module")
def idle_server(small_repository: Path) -> Iterator[Server]:
    with run_server([small_repository], f"--grpc-idle-timeout-secs={IDLE_S}") as running:
        yield running


def _goaway_within(client: Client, seconds: float) -> h2.events.ConnectionTerminated | None:
    client.sock.settimeout(seconds)
    try:
        while True:
            for event in client.receive():
                if isinstance(event, h2.events.ConnectionTerminated):
                    return event
    except (TimeoutError, ConnectionError):
        return None


def test_a_connection_in_use_stays_and_an_idle_one_gets_goaway(idle_server: Server) -> None:
    client = Client(idle_server.grpc_port)
    try:
        # Calls spaced closer than the idle timeout, for longer than it: the connection stays.
        deadline = time.monotonic() + 2.5 * IDLE_S
        while time.monotonic() < deadline:
            assert client.answer(client.open(LIVE, _message(b"")))[2]["grpc-status"] == "0"
            time.sleep(IDLE_S / 4)
        # Then nothing: GOAWAY (no error) after the timeout, and the connection closes.
        started = time.monotonic()
        goaway = _goaway_within(client, 10 * IDLE_S)
        assert goaway is not None and goaway.error_code == 0
        assert time.monotonic() - started >= 0.5 * IDLE_S
    finally:
        client.close()
