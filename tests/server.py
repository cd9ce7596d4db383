"""Runs the real edged daemon for tests, and talks raw HTTP to it where tritonclient cannot go.

``run_server`` starts ``python -m edged serve`` as a child process on free ports of 127.0.0.1, waits until it
answers, and on exit stops it and fails the test if it crashed, exited with an error or logged a traceback:
a crash must never pass silently, even when every request happened to get an answer.
"""

from __future__ import annotations

import contextlib
import http.client
import json
import os
import secrets
import signal
import socket
import ssl
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import tritonclient.grpc as grpcclient
import tritonclient.http as httpclient

# Generous, as every wait here: with both cores busy a daemon loading several frameworks takes half a minute to
# start, and one that imported TensorFlow and PyTorch some seconds to exit after it stopped serving.
STARTUP_TIMEOUT_S = 180.0
STOP_TIMEOUT_S = 60.0
TRACEBACK_MARKER = "Traceback (most recent call last)"
# Logged once every endpoint listens and the models are loaded; /v2/health/live may answer a moment before.
READY_MARKER = "edged ready"
REPO_ROOT = Path(__file__).resolve().parents[1]


@dataclass
class Server:
    """A running daemon: where it listens and what it has logged so far."""

    process: subprocess.Popen[bytes]
    http_port: int
    metrics_port: int
    grpc_port: int
    log_file: Path
    console_port: int = 0
    args: list[str] = field(default_factory=list)
    # Set by a test that kills the daemon on purpose: its exit status is then no failure.
    killed: bool = False

    @property
    def http_url(self) -> str:
        return f"127.0.0.1:{self.http_port}"

    @property
    def metrics_url(self) -> str:
        return f"127.0.0.1:{self.metrics_port}"

    @property
    def grpc_url(self) -> str:
        return f"127.0.0.1:{self.grpc_port}"

    @property
    def console_url(self) -> str:
        """The web console's base URL (no trailing slash), over TLS when the daemon serves it so."""
        tls = any(a == "--console-use-ssl=true" for a in self.args) or any(
            a == "--console-use-ssl" and b == "true" for a, b in zip(self.args, self.args[1:], strict=False)
        )
        scheme = "https" if tls else "http"
        return f"{scheme}://127.0.0.1:{self.console_port}"

    def log(self) -> str:
        """Everything the daemon has written to stdout and stderr so far."""
        return self.log_file.read_text(encoding="utf-8", errors="replace")


def free_ports(count: int) -> list[int]:
    """Ports nobody listens on right now; all sockets stay open until every port is chosen, so they differ."""
    sockets: list[socket.socket] = []
    try:
        for _ in range(count):
            sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
            sock.bind(("127.0.0.1", 0))
            sockets.append(sock)
        return [int(sock.getsockname()[1]) for sock in sockets]
    finally:
        for sock in sockets:
            sock.close()


def _is_live(port: int, tls: ssl.SSLContext | None = None) -> bool:
    conn = (
        http.client.HTTPSConnection("127.0.0.1", port, timeout=2, context=tls)
        if tls is not None
        else http.client.HTTPConnection("127.0.0.1", port, timeout=2)
    )
    try:
        conn.request("GET", "/v2/health/live")
        # 401/403: the endpoint answers, and the daemon guards its health API (--guarded-apis, restricted APIs).
        return conn.getresponse().status in (200, 401, 403)
    except OSError:
        return False
    finally:
        conn.close()


def _stop(process: subprocess.Popen[bytes]) -> None:
    if process.poll() is not None:
        return
    process.send_signal(signal.SIGTERM)
    try:
        process.wait(STOP_TIMEOUT_S)
    except subprocess.TimeoutExpired:
        process.kill()
        process.wait(STOP_TIMEOUT_S)
        pytest.fail(f"edged did not stop within {STOP_TIMEOUT_S:.0f} s of SIGTERM and was killed")


@contextlib.contextmanager
def run_server(
    repositories: Sequence[Path | str],
    *extra_args: str,
    tls: ssl.SSLContext | None = None,
    environment: Mapping[str, str | None] | None = None,
) -> Iterator[Server]:
    """Starts ``edged serve`` on the repositories and yields it once ``GET /v2/health/live`` answers 200 and the
    daemon has logged that it is ready; ``tls``: the client context to ask with, when HTTP is served over TLS;
    ``environment``: variables set for the daemon (None: removed)."""
    http_port, metrics_port, grpc_port, console_port = free_ports(4)
    args = [sys.executable, "-m", "edged", "serve"]
    for repository in repositories:
        args += ["--model-repository", str(repository)]
    args += [
        "--http-address",
        "127.0.0.1",
        "--http-port",
        str(http_port),
        "--metrics-port",
        str(metrics_port),
        "--grpc-port",
        str(grpc_port),
        # Every daemon has its console on a port of its own (8080 otherwise, shared by all).
        "--console-port",
        str(console_port),
        *extra_args,
    ]
    env = dict(os.environ, PYTHONUNBUFFERED="1")
    for name, value in (environment or {}).items():
        if value is None:
            env.pop(name, None)
        else:
            env[name] = value
    with tempfile.TemporaryDirectory(prefix="edged-test-") as scratch:
        if not any(arg.startswith("--state-dir") for arg in extra_args):
            # Each daemon keeps its state database with its log, never in the user's state directory.
            args += ["--state-dir", str(Path(scratch) / "state")]
        log_file = Path(scratch) / "edged.log"
        with log_file.open("wb") as log_handle:
            process = subprocess.Popen(
                args, stdout=log_handle, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL, cwd=REPO_ROOT, env=env
            )
        # A daemon told to write its log to a file (--log-file) is read there: its stderr holds nothing else.
        given = [arg.split("=", 1)[1] for arg in extra_args if arg.startswith("--log-file=")]
        read_from = Path(given[-1]) if given else log_file
        read_from.touch()  # read before the daemon opens it
        server = Server(process, http_port, metrics_port, grpc_port, read_from, console_port, args)
        try:
            deadline = time.monotonic() + STARTUP_TIMEOUT_S
            while READY_MARKER not in server.log() or not _is_live(http_port, tls):
                if process.poll() is not None:
                    pytest.fail(f"edged exited with status {process.returncode} while starting:\n{server.log()}")
                if time.monotonic() > deadline:
                    pytest.fail(
                        f"edged did not answer /v2/health/live within {STARTUP_TIMEOUT_S:.0f} s:\n{server.log()}"
                    )
                time.sleep(0.05)
            yield server
        finally:
            _stop(process)
        log = server.log()
        if process.returncode != 0 and not server.killed:
            pytest.fail(f"edged exited with status {process.returncode}:\n{log}")
        if TRACEBACK_MARKER in log:
            pytest.fail(f"edged logged a Python traceback:\n{log}")


# ------------------------------------------------------------------------------------------------------------
# raw HTTP


@dataclass(frozen=True)
class Reply:
    status: int
    headers: dict[str, str]
    body: bytes

    def header(self, name: str) -> str | None:
        return self.headers.get(name.lower())

    def json(self) -> Any:
        return json.loads(self.body)

    def error(self) -> str:
        """The ``error`` member of a JSON error body; fails the test if the body is not one."""
        try:
            payload = self.json()
        except ValueError:
            pytest.fail(f"error body is not JSON: status {self.status}, body {self.body!r}")
        assert isinstance(payload, dict) and isinstance(payload.get("error"), str), f"not an error body: {payload!r}"
        message = str(payload["error"])
        assert TRACEBACK_MARKER not in message, f"error body carries a stack trace: {message}"
        return message


def request(
    url: str,
    method: str,
    path: str,
    body: bytes | str | None = None,
    headers: Mapping[str, str] | None = None,
    *,
    timeout: float = 30.0,
) -> Reply:
    """Sends one request exactly as given (no implicit Accept-Encoding) and reads the whole reply."""
    host, _, port = url.rpartition(":")
    conn = http.client.HTTPConnection(host, int(port), timeout=timeout)
    data = body.encode() if isinstance(body, str) else body
    try:
        conn.putrequest(method, path, skip_accept_encoding=True)
        sent = {k.lower() for k in (headers or {})}
        if data is not None and "content-length" not in sent and "transfer-encoding" not in sent:
            conn.putheader("Content-Length", str(len(data)))
        for key, value in (headers or {}).items():
            conn.putheader(key, value)
        conn.endheaders()
        if data:
            conn.send(data)
        response = conn.getresponse()
        payload = response.read()
        return Reply(response.status, {k.lower(): v for k, v in response.getheaders()}, payload)
    finally:
        conn.close()


def post_json(url: str, path: str, document: Any, headers: Mapping[str, str] | None = None) -> Reply:
    return request(
        url,
        "POST",
        path,
        json.dumps(document, separators=(",", ":")),
        {"Content-Type": "application/json", **(headers or {})},
    )


# ------------------------------------------------------------------------------------------------------------
# credentials


# The tokens api_token made, by the daemon's log file (one per daemon) and role.
_TOKENS: dict[tuple[Path, str], str] = {}


def state_dir_of(server: Server) -> Path:
    """The daemon's state directory, however its flag was spelt."""
    for flag, value in zip(server.args, [*server.args[1:], ""], strict=True):
        if flag.startswith("--state-dir="):
            return Path(flag.split("=", 1)[1])
        if flag == "--state-dir":
            return Path(value)
    raise AssertionError("the daemon runs without a state directory: it keeps no API tokens")


def api_token(server: Server, role: str = "operator") -> str:
    """An API token of ``role`` for the running daemon, written into its state database as `edged token create`
    writes it (one per daemon and role). Loopback is no credential for token management, uploads and loads with
    overrides: tests on 127.0.0.1 send this."""
    from edged.core.access import Role, new_token
    from edged.state.store import StateStore

    key = (server.log_file, role)
    if key not in _TOKENS:
        # A name of its own: a daemon restarted on the same state directory holds the earlier one's tokens too.
        made = new_token(f"test-{role}-{secrets.token_hex(4)}", Role(role), None)
        with StateStore.open(state_dir_of(server)) as store:
            store.add_token(made.record)
        _TOKENS[key] = made.secret
    return _TOKENS[key]


def bearer(token: str) -> dict[str, str]:
    """The header (HTTP) or metadata (gRPC, tritonclient's headers=) that presents ``token``."""
    return {"authorization": f"Bearer {token}"}  # lower case: gRPC metadata allows nothing else


# ------------------------------------------------------------------------------------------------------------
# the request every error test ends with


ADD_SUB_INPUT0 = np.arange(16, dtype=np.float32).reshape(1, 16)
ADD_SUB_INPUT1 = np.ones((1, 16), dtype=np.float32)


def add_sub_inputs(
    input0: np.ndarray[Any, Any] = ADD_SUB_INPUT0,
    input1: np.ndarray[Any, Any] = ADD_SUB_INPUT1,
    *,
    binary: bool = True,
) -> list[httpclient.InferInput]:
    inputs = []
    for name, array in (("INPUT0", input0), ("INPUT1", input1)):
        tensor = httpclient.InferInput(name, list(array.shape), "FP32")
        tensor.set_data_from_numpy(array, binary_data=binary)
        inputs.append(tensor)
    return inputs


def assert_still_serving(client: httpclient.InferenceServerClient) -> None:
    """The daemon is alive and still computes add_sub correctly after whatever the test sent it."""
    assert client.is_server_live()
    result = client.infer("add_sub", add_sub_inputs())
    np.testing.assert_array_equal(result.as_numpy("OUTPUT0"), ADD_SUB_INPUT0 + ADD_SUB_INPUT1)
    np.testing.assert_array_equal(result.as_numpy("OUTPUT1"), ADD_SUB_INPUT0 - ADD_SUB_INPUT1)


# ------------------------------------------------------------------------------------------------------------
# gRPC


def grpc_add_sub_inputs(
    input0: np.ndarray[Any, Any] = ADD_SUB_INPUT0, input1: np.ndarray[Any, Any] = ADD_SUB_INPUT1
) -> list[grpcclient.InferInput]:
    inputs = []
    for name, array in (("INPUT0", input0), ("INPUT1", input1)):
        tensor = grpcclient.InferInput(name, list(array.shape), "FP32")
        tensor.set_data_from_numpy(array)
        inputs.append(tensor)
    return inputs


def assert_grpc_still_serving(client: grpcclient.InferenceServerClient) -> None:
    """The daemon is alive and still computes add_sub correctly over gRPC after whatever the test sent it."""
    assert client.is_server_live()
    result = client.infer("add_sub", grpc_add_sub_inputs())
    np.testing.assert_array_equal(result.as_numpy("OUTPUT0"), ADD_SUB_INPUT0 + ADD_SUB_INPUT1)
    np.testing.assert_array_equal(result.as_numpy("OUTPUT1"), ADD_SUB_INPUT0 - ADD_SUB_INPUT1)
