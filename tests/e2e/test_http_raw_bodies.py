"""Request bodies Triton takes and clients send, against the real daemon: a "raw binary" body (no JSON header,
``Inference-Header-Content-Length: 0``) for a numeric input and for the one element of a BYTES input, and a body
chunked by the client itself while its HTTP library also declares a ``Content-Length``."""

from __future__ import annotations

import json
import socket
import struct
from collections.abc import Iterator
from pathlib import Path
from typing import Final

import modelgen  # type: ignore[import-not-found, unused-ignore]
import numpy as np
import pytest
from server import Server, request, run_server

RAW: Final = {"Inference-Header-Content-Length": "0"}


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Server]:
    repository: Path = tmp_path_factory.mktemp("raw-bodies")
    modelgen.write_identity(repository / "floats", "FP32", max_batch_size=0, dims=[-1])
    modelgen.write_identity(repository / "one_string", "BYTES", max_batch_size=0, dims=[1])
    modelgen.write_identity(repository / "one_string_batched", "BYTES", max_batch_size=8, dims=[1])
    modelgen.write_identity(repository / "strings", "BYTES", max_batch_size=0, dims=[-1])
    with run_server([repository]) as running:
        yield running


def _output(body: bytes, header_length: str | None) -> tuple[dict[str, object], bytes]:
    assert header_length is not None
    size = int(header_length)
    return json.loads(body[:size]), body[size:]


def test_a_raw_numeric_body_is_the_models_one_input(server: Server) -> None:
    data = np.arange(8, dtype=np.float32).tobytes()
    reply = request(server.http_url, "POST", "/v2/models/floats/infer", data, RAW)
    assert reply.status == 200, reply
    header, blob = _output(reply.body, reply.header("inference-header-content-length"))
    assert header["outputs"] == [
        {"name": "OUTPUT0", "datatype": "FP32", "shape": [8], "parameters": {"binary_data_size": 32}}
    ]
    assert blob == data


@pytest.mark.parametrize("model", ["one_string", "one_string_batched"])
def test_a_raw_body_is_the_one_element_of_a_bytes_input(server: Server, model: str) -> None:
    """The body is the element itself, without the length each element of a BYTES tensor carries elsewhere; the
    reply's element has its length, as every BYTES output does."""
    reply = request(server.http_url, "POST", f"/v2/models/{model}/infer", b"427", RAW)
    assert reply.status == 200, reply
    header, blob = _output(reply.body, reply.header("inference-header-content-length"))
    shape = [1] if model == "one_string" else [1, 1]
    assert header["outputs"] == [
        {"name": "OUTPUT0", "datatype": "BYTES", "shape": shape, "parameters": {"binary_data_size": 7}}
    ]
    assert blob == struct.pack("<I", 3) + b"427"


def test_a_raw_body_for_a_bytes_input_of_more_elements_is_refused(server: Server) -> None:
    reply = request(server.http_url, "POST", "/v2/models/strings/infer", b"427", RAW)
    assert reply.status == 400, reply
    assert reply.error() == (
        "[request id: <id_unknown>] For BYTE datatype raw input 'INPUT0', the model must have input shape [1]"
    )


def _exchange(server: Server, wire: bytes) -> bytes:
    """Sends ``wire`` on one connection and reads until the daemon closes it (or 30 s pass)."""
    with socket.create_connection(("127.0.0.1", server.http_port), timeout=30) as connection:
        connection.sendall(wire)
        received = b""
        while chunk := connection.recv(65536):
            received += chunk
    return received


def test_a_body_chunked_by_the_client_is_read_by_its_chunks_and_ends_the_connection(server: Server) -> None:
    """``requests.post(url, data=chunked_bytes, headers={"Transfer-Encoding": "chunked"})`` also sends the body's
    Content-Length: the chunks are what counts (RFC 9112, and Triton). A message framed both ways is also how a
    request is smuggled past a proxy that reads the other header, so nothing behind it on that connection is read
    as a request: the connection closes with the answer."""
    data = np.arange(8, dtype=np.float32).tobytes()
    chunked = f"{len(data):X}\r\n".encode() + data + b"\r\n0\r\n\r\n"
    head = (
        b"POST /v2/models/floats/infer HTTP/1.1\r\nHost: edged\r\nInference-Header-Content-Length: 0\r\n"
        b"Transfer-Encoding: chunked\r\nContent-Length: %d\r\n\r\n" % len(chunked)
    )
    behind = b"GET /v2/health/live HTTP/1.1\r\nHost: edged\r\n\r\n"
    received = _exchange(server, head + chunked + behind)
    assert received.startswith(b"HTTP/1.1 200 OK\r\n"), received[:200]
    assert received.endswith(data), received[-64:]
    assert received.count(b"HTTP/1.1 ") == 1, received
    assert b"\r\nconnection: close\r\n" in received.lower()


def test_a_chunked_body_alone_keeps_the_connection(server: Server) -> None:
    data = np.arange(8, dtype=np.float32).tobytes()
    chunked = f"{len(data):X}\r\n".encode() + data + b"\r\n0\r\n\r\n"
    head = (
        b"POST /v2/models/floats/infer HTTP/1.1\r\nHost: edged\r\nInference-Header-Content-Length: 0\r\n"
        b"Transfer-Encoding: chunked\r\n\r\n"
    )
    behind = b"GET /v2/health/live HTTP/1.1\r\nHost: edged\r\nConnection: close\r\n\r\n"
    received = _exchange(server, head + chunked + behind)
    assert received.count(b"HTTP/1.1 200 OK\r\n") == 2, received
