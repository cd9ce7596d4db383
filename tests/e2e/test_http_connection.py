"""HTTP/1.1 connection behaviour of the infer endpoint over raw sockets: pipelined requests answered in order (infer
requests mixed with other endpoints), Connection: close, Expect: 100-continue, HTTP/1.0, a query string, and a
connection that stays usable after a refused body. Inference requests are answered by the connection protocol
itself and the rest by the ASGI app, so these are the cases where the two meet."""

from __future__ import annotations

import json
import socket
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import numpy as np
import tritonclient.http as httpclient
from conftest import SMALL_MAX_INPUT_SIZE

if TYPE_CHECKING:
    from server import Server

INFER_PATH = "/v2/models/add_sub/infer"


@dataclass
class Answer:
    status: int
    headers: dict[str, str]
    body: bytes

    def json(self) -> Any:
        return json.loads(self.body)


def _infer_body(value: float) -> bytes:
    data = [value] * 16
    document = {
        "inputs": [
            {"name": "INPUT0", "shape": [1, 16], "datatype": "FP32", "data": data},
            {"name": "INPUT1", "shape": [1, 16], "datatype": "FP32", "data": data},
        ]
    }
    return json.dumps(document).encode()


def _post(path: str, body: bytes, *extra: str, version: str = "HTTP/1.1") -> bytes:
    head = [f"POST {path} {version}", "Host: edged", f"Content-Length: {len(body)}", *extra]
    return ("\r\n".join(head) + "\r\n\r\n").encode() + body


def _get(path: str) -> bytes:
    return f"GET {path} HTTP/1.1\r\nHost: edged\r\n\r\n".encode()


class _Connection:
    def __init__(self, server: Server) -> None:
        self.sock = socket.create_connection(("127.0.0.1", server.http_port), timeout=30)
        self.reader = self.sock.makefile("rb")

    def send(self, data: bytes) -> None:
        self.sock.sendall(data)

    def answer(self) -> Answer:
        status_line = self.reader.readline().decode("latin-1")
        assert status_line.startswith("HTTP/1."), repr(status_line)
        headers: dict[str, str] = {}
        while (line := self.reader.readline().decode("latin-1").rstrip("\r\n")) != "":
            name, _, value = line.partition(":")
            headers[name.strip().lower()] = value.strip()
        length = int(headers.get("content-length", "0"))
        return Answer(int(status_line.split()[1]), headers, self.reader.read(length))

    def closed_by_server(self) -> bool:
        return self.reader.read(1) == b""

    def close(self) -> None:
        self.reader.close()
        self.sock.close()


def _output0(answer: Answer) -> list[float]:
    assert answer.status == 200, answer
    outputs = {o["name"]: o["data"] for o in answer.json()["outputs"]}
    return [float(v) for v in outputs["OUTPUT0"]]


def test_pipelined_requests_are_answered_in_order(bundled_server: Server) -> None:
    connection = _Connection(bundled_server)
    try:
        # Sent at once: inferences and other endpoints interleaved, answered in the order they were asked.
        connection.send(
            _post(INFER_PATH, _infer_body(1))
            + _get("/v2/health/ready")
            + _post(INFER_PATH, _infer_body(2))
            + _post(INFER_PATH, _infer_body(3))
            + _get("/v2/models/add_sub")
            + _post(INFER_PATH, _infer_body(4))
        )
        assert _output0(connection.answer()) == [2.0] * 16
        assert connection.answer().status == 200
        assert _output0(connection.answer()) == [4.0] * 16
        assert _output0(connection.answer()) == [6.0] * 16
        assert connection.answer().json()["name"] == "add_sub"
        assert _output0(connection.answer()) == [8.0] * 16
    finally:
        connection.close()


def test_many_inferences_on_one_kept_alive_connection(bundled_server: Server) -> None:
    connection = _Connection(bundled_server)
    try:
        for value in np.arange(20, dtype=np.float32):
            connection.send(_post(INFER_PATH, _infer_body(float(value))))
            answer = connection.answer()
            assert _output0(answer) == [2.0 * float(value)] * 16
            assert answer.headers["content-type"] == "application/json"
            assert "connection" not in answer.headers
    finally:
        connection.close()


def test_connection_close_is_honoured(bundled_server: Server) -> None:
    connection = _Connection(bundled_server)
    try:
        connection.send(_post(INFER_PATH, _infer_body(5), "Connection: close"))
        answer = connection.answer()
        assert _output0(answer) == [10.0] * 16
        assert answer.headers["connection"] == "close"
        assert connection.closed_by_server()
    finally:
        connection.close()


def test_expect_100_continue(bundled_server: Server) -> None:
    connection = _Connection(bundled_server)
    try:
        body = _infer_body(6)
        connection.send(
            _post(INFER_PATH, b"", "Expect: 100-continue").replace(
                b"Content-Length: 0", b"Content-Length: %d" % len(body)
            )
        )
        assert connection.reader.readline().startswith(b"HTTP/1.1 100")
        assert connection.reader.readline() == b"\r\n"
        connection.send(body)
        assert _output0(connection.answer()) == [12.0] * 16
    finally:
        connection.close()


def test_http_1_0_and_a_query_string(bundled_server: Server) -> None:
    connection = _Connection(bundled_server)
    try:
        connection.send(_post(INFER_PATH, _infer_body(7), version="HTTP/1.0"))
        assert _output0(connection.answer()) == [14.0] * 16
        assert connection.closed_by_server()
    finally:
        connection.close()
    connection = _Connection(bundled_server)
    try:
        connection.send(_post(INFER_PATH + "?trace=1", _infer_body(8)))
        assert _output0(connection.answer()) == [16.0] * 16
        connection.send(_post("/v2/models/add%5Fsub/infer", _infer_body(9)))
        assert _output0(connection.answer()) == [18.0] * 16
    finally:
        connection.close()


def test_a_declared_body_over_the_limit_is_refused_at_once(bundled_server: Server) -> None:
    # Only the headers are sent: the answer must not wait for a body that would be refused anyway.
    connection = _Connection(bundled_server)
    try:
        declared = SMALL_MAX_INPUT_SIZE + 1
        head = b"POST %s HTTP/1.1\r\nHost: edged\r\nContent-Length: %d\r\n\r\n" % (INFER_PATH.encode(), declared)
        connection.send(head)
        answer = connection.answer()
        assert answer.status == 413
        assert answer.headers["connection"] == "close"
        # Triton's words (its clients and tests look for them), for each way an inference body is framed.
        assert answer.json() == {
            "error": f"request JSON size of {declared} bytes exceeds the maximum allowed input size of "
            f"{SMALL_MAX_INPUT_SIZE} bytes. Use --http-max-input-size to increase the limit."
        }
        # What the client still sends is read and dropped, so it sees the answer, then the close.
        connection.send(b"x" * declared)
        assert connection.closed_by_server()
    finally:
        connection.close()
    framed = {
        "0": f"Raw input has a byte_size ({declared} bytes) that exceeds the maximum allowed value of "
        f"{SMALL_MAX_INPUT_SIZE} bytes. Use --http-max-input-size to increase the limit.",
        "40": f"request size of {declared} bytes exceeds the maximum allowed input size of {SMALL_MAX_INPUT_SIZE} "
        "bytes. Use --http-max-input-size to increase the limit.",
    }
    for header_length, expected in framed.items():
        connection = _Connection(bundled_server)
        try:
            connection.send(
                b"POST %s HTTP/1.1\r\nHost: edged\r\nInference-Header-Content-Length: %s\r\nContent-Length: %d\r\n\r\n"
                % (INFER_PATH.encode(), header_length.encode(), declared)
            )
            answer = connection.answer()
            assert (answer.status, answer.json()) == (413, {"error": expected})
        finally:
            connection.close()
    # Every route, before its handler would read the body.
    for path in ("/v2/logging", "/v2/repository/models/add_sub/load", "/v2/repository/index", "/v2/nowhere"):
        connection = _Connection(bundled_server)
        try:
            connection.send(b"POST %s HTTP/1.1\r\nHost: edged\r\nContent-Length: 99999999\r\n\r\n" % path.encode())
            assert connection.answer().status == 413, path
        finally:
            connection.close()


def test_the_connection_stays_usable_after_a_refused_chunked_body(bundled_server: Server) -> None:
    connection = _Connection(bundled_server)
    try:
        large = b"x" * (SMALL_MAX_INPUT_SIZE + 1)
        # Chunked, so the size is known only as it arrives: the body is read and dropped, the connection stays.
        chunked = b"POST %s HTTP/1.1\r\nHost: edged\r\nTransfer-Encoding: chunked\r\n\r\n" % INFER_PATH.encode()
        chunked += b"%x\r\n%s\r\n0\r\n\r\n" % (len(large), large)
        connection.send(chunked)
        answer = connection.answer()
        assert answer.status == 413
        assert answer.json() == {
            "error": f"request JSON size exceeds the maximum allowed input size of {SMALL_MAX_INPUT_SIZE} bytes. "
            "Use --http-max-input-size to increase the limit."
        }
        # An unknown model is answered before its body is looked at.
        connection.send(_post("/v2/models/no_such_model/infer", b"x" * 100))
        answer = connection.answer()
        assert answer.status == 404 and "no_such_model" in answer.json()["error"]
        connection.send(_post(INFER_PATH, _infer_body(10)))
        assert _output0(connection.answer()) == [20.0] * 16
    finally:
        connection.close()


def test_large_binary_request_and_reply(client: httpclient.InferenceServerClient) -> None:
    # 2 MiB each way: the reply's body is written after its head rather than joined to it.
    data = np.arange(512 * 1024, dtype=np.float32).reshape(1, -1)
    tensor = httpclient.InferInput("INPUT0", list(data.shape), "FP32")
    tensor.set_data_from_numpy(data, binary_data=True)
    result = client.infer(
        "identity_fp32", [tensor], outputs=[httpclient.InferRequestedOutput("OUTPUT0", binary_data=True)]
    )
    np.testing.assert_array_equal(result.as_numpy("OUTPUT0"), data)
