"""Triton's generate extension: ``POST /v2/models/{model}[/versions/{v}]/generate`` and ``.../generate_stream``.

The answers expected here are those of Triton 2.51 for the same models and bodies (tests/testdata/python_models/
generate_tokens, a decoupled model after Triton's own mock_llm, and generate_echo, which is not decoupled): the JSON
fields, their order, the server-sent events' framing, the statuses and the error texts.
"""

from __future__ import annotations

import http.client
import json
import shutil
import socket
import subprocess
import time
from pathlib import Path
from typing import TYPE_CHECKING, Any, Final

import httpx
import pytest
from server import run_server

if TYPE_CHECKING:
    from server import Server

TIMEOUT_S: Final = 30.0
PYTHON_MODELS: Final = Path(__file__).resolve().parents[1] / "testdata" / "python_models"
EVENTS: Final = "text/event-stream; charset=utf-8"
ONE_RESPONSE: Final = (
    "generate expects model to produce exactly 1 response, use generate stream for model that generates various "
    "number of responses"
)


def _post(server: Server, path: str, body: bytes | str | dict[str, Any], **headers: str) -> tuple[int, str, bytes]:
    """Status, content type and body of one POST."""
    data = body if isinstance(body, (bytes, str)) else json.dumps(body)
    connection = http.client.HTTPConnection("127.0.0.1", server.http_port, timeout=TIMEOUT_S)
    try:
        connection.request("POST", path, data, headers)
        reply = connection.getresponse()
        return reply.status, reply.getheader("content-type", ""), reply.read()
    finally:
        connection.close()


def _events(raw: bytes) -> list[dict[str, Any]]:
    """The events of a whole event-stream body, each of which must be exactly ``data: <JSON>`` and a blank line."""
    assert raw.endswith(b"\n\n") or raw == b"", raw
    out = []
    for block in raw.split(b"\n\n")[:-1]:
        assert block.startswith(b"data: ") and b"\n" not in block, block
        out.append(json.loads(block[len(b"data: ") :]))
    return out


def _read_event(reply: http.client.HTTPResponse) -> dict[str, Any] | None:
    """The next server-sent event of a reply being streamed, as it arrives; None at the end of the stream."""
    data: list[bytes] = []
    while True:
        line = reply.readline()
        if not line:
            assert not data, "the stream ended inside an event"
            return None
        if line == b"\n":
            event: dict[str, Any] = json.loads(b"".join(data))
            return event
        assert line.startswith(b"data: "), line
        data.append(line[len(b"data: ") : -1])


def _wait_for(condition: Any, what: str) -> None:
    deadline = time.monotonic() + TIMEOUT_S
    while not condition():
        assert time.monotonic() < deadline, f"{what} never happened"
        time.sleep(0.05)


def _tokens(*words: str) -> list[dict[str, Any]]:
    return [{"TEXT": word, "model_name": "generate_tokens", "model_version": "1"} for word in words]


# --- a decoupled model, streamed -----------------------------------------------------------------------------


def test_curl_reads_one_event_per_token(python_server: Server) -> None:
    body = json.dumps({"PROMPT": "the quick brown fox", "STREAM": True})
    url = f"http://{python_server.http_url}/v2/models/generate_tokens/generate_stream"
    done = subprocess.run(
        ["curl", "-sS", "-N", "-i", "-X", "POST", url, "--data-binary", body],
        capture_output=True,
        timeout=TIMEOUT_S,
        check=True,
    )
    head, _, raw = done.stdout.partition(b"\r\n\r\n")
    assert head.startswith(b"HTTP/1.1 200 "), head
    assert f"content-type: {EVENTS}".encode() in head.lower()
    assert raw == b"".join(
        b"data: " + json.dumps(e, separators=(",", ":")).encode() + b"\n\n"
        for e in _tokens("the", "quick", "brown", "fox")
    )


def test_an_sse_client_reads_the_events_as_they_come(python_server: Server) -> None:
    """httpx, streaming: every token, one event each, the stream ending after the last."""
    url = f"http://{python_server.http_url}/v2/models/generate_tokens/versions/1/generate_stream"
    with (
        httpx.Client(timeout=TIMEOUT_S) as client,
        client.stream(
            "POST", url, json={"PROMPT": "one two three", "STREAM": True}, headers={"Accept": "text/event-stream"}
        ) as reply,
    ):
        assert reply.status_code == 200
        assert reply.headers["content-type"] == EVENTS
        events = [json.loads(line[len("data: ") :]) for line in reply.iter_lines() if line]
    assert events == _tokens("one", "two", "three")


def test_events_go_out_before_the_model_finishes_and_a_client_that_leaves_cancels(
    python_server: Server, tmp_path: Path
) -> None:
    """The model sends its first token, then waits for its cancellation before the second: the client reads the
    first event meanwhile (so events are not held until the end), closes its connection, and the model sees
    ``is_cancelled()`` and stops."""
    seen = tmp_path / "cancelled"
    body = {
        "PROMPT": "never ending story",
        "STREAM": True,
        "parameters": {"wait_cancel_after": 1, "cancel_file": str(seen)},
    }
    connection = http.client.HTTPConnection("127.0.0.1", python_server.http_port, timeout=TIMEOUT_S)
    connection.request("POST", "/v2/models/generate_tokens/generate_stream", json.dumps(body))
    reply = connection.getresponse()
    assert (reply.status, reply.getheader("content-type")) == (200, EVENTS)
    assert _read_event(reply) == _tokens("never")[0]
    _wait_for(lambda: "generate_tokens waits for its cancellation before response 1" in python_server.log(), "wait")
    connection.sock.shutdown(socket.SHUT_RDWR)
    connection.close()
    _wait_for(seen.exists, "the model's record of its cancellation")
    assert seen.read_text(encoding="utf-8") == "cancelled: True after 1 responses"
    # The daemon serves on.
    assert _post(python_server, "/v2/models/generate_tokens/generate", {"PROMPT": "x", "STREAM": False})[0] == 200


def test_an_error_from_the_model_mid_stream_is_an_event_after_a_200(python_server: Server) -> None:
    status, kind, raw = _post(
        python_server,
        "/v2/models/generate_tokens/generate_stream",
        {"PROMPT": ["hi there"], "STREAM": True, "parameters": {"FAIL_LAST": True}},
    )
    assert (status, kind) == (200, EVENTS)
    assert _events(raw) == [*_tokens("hi", "there"), {"error": "An Error Occurred"}]


def test_an_error_as_the_first_response_sets_the_status(python_server: Server) -> None:
    # Triton answers 400 whatever the error's code.
    for code in ("INTERNAL", "UNAVAILABLE"):
        body = {"PROMPT": "hi", "STREAM": True, "REPETITION": 0, "FAIL_LAST": True, "FAIL_CODE": code}
        status, kind, raw = _post(python_server, "/v2/models/generate_tokens/generate_stream", body)
        assert (status, kind, _events(raw)) == (400, EVENTS, [{"error": "An Error Occurred"}])
        status, kind, raw = _post(python_server, "/v2/models/generate_tokens/generate", body)
        assert (status, kind, json.loads(raw)) == (400, "application/json", {"error": "An Error Occurred"})


def test_no_response_is_an_empty_stream(python_server: Server) -> None:
    status, kind, raw = _post(
        python_server, "/v2/models/generate_tokens/generate_stream", {"PROMPT": "hi", "STREAM": True, "REPETITION": 0}
    )
    assert (status, kind, raw) == (200, EVENTS, b"")


# --- /generate on a decoupled model ------------------------------------------------------------------------


def test_generate_answers_a_decoupled_models_one_response(python_server: Server) -> None:
    for body in ({"PROMPT": "hi", "STREAM": False}, {"PROMPT": "hi", "STREAM": True, "REPETITION": 1}):
        status, kind, raw = _post(python_server, "/v2/models/generate_tokens/generate", body)
        assert (status, kind, json.loads(raw)) == (200, "application/json", _tokens("hi")[0])


@pytest.mark.parametrize("repetition", [0, 2])
def test_generate_refuses_none_or_several_responses_as_triton_does(python_server: Server, repetition: int) -> None:
    body = {"PROMPT": "hi", "STREAM": True, "REPETITION": repetition}
    status, kind, raw = _post(python_server, "/v2/models/generate_tokens/generate", body)
    # Triton's status is the first response's (a success, or the flag-only final one): 200, with an error body.
    assert (status, kind, json.loads(raw)) == (200, "application/json", {"error": ONE_RESPONSE})


# --- a model that is not decoupled -------------------------------------------------------------------------


def test_fields_map_to_inputs_and_parameters_and_outputs_to_fields(python_server: Server) -> None:
    body = {"TEXT_IN": ["a", "b"], "COUNT": [5], "SCALE": [1.5, 2], "FLAG": True, "id": "42", "temp": 0.5, "n": 3}
    body |= {"s": "x", "b": False}
    status, kind, raw = _post(python_server, "/v2/models/generate_echo/generate", body)
    assert (status, kind) == (200, "application/json")
    # Triton's bytes: fields in byte order of their names, a single element as a scalar, every non-input a
    # parameter (the id too).
    params = json.dumps({"b": False, "id": "42", "n": 3, "s": "x", "temp": 0.5}, sort_keys=True)
    expected = {
        "COUNT_OUT": 6,
        "PARAMS": params,
        "SCALE_OUT": [3.0, 4.0],
        "TEXT_OUT": ["A", "B"],
        "id": "42",
        "model_name": "generate_echo",
        "model_version": "1",
    }
    assert raw == json.dumps(expected, separators=(",", ":")).encode()


def test_a_model_that_is_not_decoupled_gives_one_event(python_server: Server) -> None:
    body = {"TEXT_IN": "hello", "COUNT": 1, "SCALE": 1, "parameters": {"p": 1, "q": "r"}}
    status, kind, raw = _post(python_server, "/v2/models/generate_echo/generate_stream", body)
    assert (status, kind) == (200, EVENTS)
    assert _events(raw) == [
        {
            "COUNT_OUT": 2,
            "PARAMS": '{"p": 1, "q": "r"}',
            "SCALE_OUT": 2.0,
            "TEXT_OUT": "HELLO",
            "model_name": "generate_echo",
            "model_version": "1",
        }
    ]
    # Its error is an event too, once the inference began.
    status, kind, raw = _post(python_server, "/v2/models/generate_echo/generate_stream", {"TEXT_IN": "x", "COUNT": -1})
    assert (status, kind, _events(raw)) == (400, EVENTS, [{"error": "COUNT must not be negative"}])


# --- errors found before the model runs: plain JSON on both routes, Triton's words ---------------------------

INVALID_TYPE: Final = "has invalid type. It should be either 'int', 'bool', or 'string'."
MISSING: Final = (
    "[request id: <id_unknown>] expected number of inputs between 2 and 4 but got 1 inputs for model "
    "'generate_echo'. Got input(s) ['TEXT_IN'], but missing required input(s) ['COUNT']. Please provide all "
    "required input(s)."
)
ERRORS: Final[list[tuple[str, str, int, str]]] = [
    ("generate_echo", '{"TEXT_IN": "x"}', 400, MISSING),
    (
        "generate_echo",
        '{"TEXT_IN": 5, "COUNT": 1}',
        500,
        "Unable to parse JSON bytes array: attempt to access JSON non-string as string",
    ),
    (
        "generate_echo",
        '{"TEXT_IN": "x", "COUNT": "1"}',
        500,
        "Unable to parse 'data': attempt to access JSON non-signed-integer as signed-integer",
    ),
    (
        "generate_echo",
        '{"TEXT_IN": "x", "COUNT": 1, "FLAG": 1}',
        500,
        "Unable to parse 'data': attempt to access JSON non-boolean as boolean",
    ),
    (
        "generate_echo",
        '{"TEXT_IN": "x", "COUNT": [1, 2]}',
        400,
        "The schema can not convert input 'COUNT' to tensor with proper shape",
    ),
    (
        "generate_echo",
        '{"TEXT_IN": "x", "COUNT": 1, "COUNT": 2}',
        400,
        "[request id: <id_unknown>] input 'COUNT' already exists in request",
    ),
    (
        "generate_tokens",
        '{"id": "7", "PROMPT": "a", "STREAM": false, "STREAM": true}',
        400,
        "[request id: 7] input 'STREAM' already exists in request",
    ),
    (
        "generate_tokens",
        '{"PROMPT": "x", "STREAM": false, "parameters": {"STREAM": true}}',
        400,
        "Converting keyword: 'parameters': [request id: <id_unknown>] input 'STREAM' already exists in request",
    ),
    (
        "generate_echo",
        '{"TEXT_IN": "x", "COUNT": 1, "parameters": 1}',
        500,
        "Expected JSON object for keyword: 'parameters': attempt to access JSON non-object as object",
    ),
    (
        "generate_echo",
        '{"TEXT_IN": "x", "COUNT": 1, "parameters": {"nested": {"a": 1}}}',
        400,
        f"Converting keyword: 'parameters': parameter 'nested' {INVALID_TYPE}",
    ),
    ("generate_echo", '{"TEXT_IN": "x", "COUNT": 1, "obj": {"a": 1}}', 400, f"parameter 'obj' {INVALID_TYPE}"),
    ("generate_echo", '{"TEXT_IN": "x", "COUNT": 1, "nul": null}', 400, f"parameter 'nul' {INVALID_TYPE}"),
    (
        "generate_echo",
        '{"TEXT_IN": "x", "COUNT": 1, "id": 5}',
        500,
        "Unable to parse 'id': attempt to access JSON non-string as string",
    ),
    (
        "generate_tokens",
        '{"PROMPT": "x", "STREAM": false, "input_ids": [[1, 2], [3, 4]]}',
        500,
        "Unable to parse 'data': Shape does not match true shape of 'data' field",
    ),
    ("generate_echo", "[1, 2]", 500, "attempt to get members for non-object"),
    ("nosuch", '{"TEXT_IN": "x"}', 404, "Request for unknown model: 'nosuch' is not found"),
]


@pytest.mark.parametrize("route", ["generate", "generate_stream"])
@pytest.mark.parametrize(("model", "body", "status", "error"), ERRORS)
def test_errors_before_the_inference_are_json(
    python_server: Server, route: str, model: str, body: str, status: int, error: str
) -> None:
    got = _post(python_server, f"/v2/models/{model}/{route}", body)
    assert (got[0], got[1], json.loads(got[2])) == (status, "application/json", {"error": error})


def test_a_body_that_is_not_json_is_refused(python_server: Server) -> None:
    for route in ("generate", "generate_stream"):
        status, kind, raw = _post(python_server, f"/v2/models/generate_echo/{route}", b"not json")
        assert (status, kind) == (500, "application/json")
        assert json.loads(raw)["error"].startswith("failed to parse the request JSON buffer: ")


def test_method_encoding_and_size_are_checked(python_server: Server) -> None:
    with httpx.Client(base_url=f"http://{python_server.http_url}", timeout=TIMEOUT_S) as client:
        for route in ("generate", "generate_stream"):
            reply = client.get(f"/v2/models/generate_echo/{route}")
            assert (reply.status_code, reply.json()) == (405, {"error": "Method Not Allowed"})
        reply = client.post(
            "/v2/models/generate_echo/generate",
            content=b'{"TEXT_IN": "x", "COUNT": 1}',
            headers={"Content-Encoding": "gzip"},
        )
        assert (reply.status_code, reply.json()) == (
            400,
            {"error": "Unsupported content-encoding, only 'identity' is supported."},
        )
    # A body declared over --http-max-input-size is refused from its headers, as infer's is.
    with socket.create_connection(("127.0.0.1", python_server.http_port), timeout=TIMEOUT_S) as sock:
        sock.sendall(
            b"POST /v2/models/generate_echo/generate_stream HTTP/1.1\r\nHost: x\r\n"
            b"Content-Length: %d\r\n\r\n" % (64 * 1024 * 1024 + 1)
        )
        head = _read_head(sock)
        assert head.startswith(b"HTTP/1.1 413 "), head


def _read_head(sock: socket.socket) -> bytes:
    data = b""
    while b"\r\n\r\n" not in data:
        chunk = sock.recv(4096)
        if not chunk:
            break
        data += chunk
    return data


def test_a_client_that_reads_nothing_is_dropped_and_its_request_cancelled(tmp_path: Path) -> None:
    """A stream whose client reads none of it would hold its request (and what the model sends) for as long as the
    model goes on: once the client has read nothing for --http-body-timeout-secs, the connection goes, and with it
    the request. (The events held unwritten are bounded too: past max_queued_stream_bytes the request is
    cancelled; whichever comes first, the model is told.)"""
    repository = tmp_path / "repository"
    shutil.copytree(PYTHON_MODELS / "generate_tokens", repository / "generate_tokens")
    seen = tmp_path / "cancelled"
    body = json.dumps(
        {"PROMPT": "x" * 10_000, "STREAM": True, "REPETITION": 10_000_000, "cancel_file": str(seen)}
    ).encode()
    with run_server([repository], "--http-body-timeout-secs", "1") as server:
        with socket.socket() as sock:
            # A small receive window, so that the daemon's side fills after little.
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)
            sock.connect(("127.0.0.1", server.http_port))
            sock.sendall(
                b"POST /v2/models/generate_tokens/generate_stream HTTP/1.1\r\nHost: x\r\n"
                b"Content-Length: %d\r\n\r\n%s" % (len(body), body)
            )
            _wait_for(seen.exists, "the model's record of its cancellation")
        assert seen.read_text(encoding="utf-8").startswith("cancelled: True after ")
        # The daemon serves on.
        reply = _post(server, "/v2/models/generate_tokens/generate", {"PROMPT": "x", "STREAM": False})
        assert reply[0] == 200
