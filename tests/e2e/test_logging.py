"""Logging: Triton's logging extension over HTTP and gRPC (with the answers Triton 2.51 gives), its effect on what
the daemon writes, and the journald output under systemd."""

from __future__ import annotations

import array
import contextlib
import logging
import os
import re
import shutil
import socket
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import grpc
import numpy as np
import pytest
import tritonclient.grpc as grpcclient
import tritonclient.http as httpclient
from server import REPO_ROOT, Server, free_ports, post_json, request, run_server
from tritonclient.grpc import service_pb2, service_pb2_grpc
from tritonclient.utils import InferenceServerException

from edged import logs

DEFAULTS: dict[str, Any] = {
    "log_file": "",
    "log_info": True,
    "log_warning": True,
    "log_error": True,
    "log_verbose_level": 0,
    "log_format": "default",
}
REFUSED_LOG_FILE = "log file location can not be updated through network protocol"

# A Python model that writes one line at each of Triton's log levels per request, naming the request's number.
CHATTY_CONFIG = """name: "chatty"
backend: "python"
max_batch_size: 0
input [ { name: "INPUT0" data_type: TYPE_INT32 dims: [ 1 ] } ]
output [ { name: "OUTPUT0" data_type: TYPE_INT32 dims: [ 1 ] } ]
"""
CHATTY_MODEL = """import triton_python_backend_utils as pb_utils


class TritonPythonModel:
    def execute(self, requests):
        responses = []
        for request in requests:
            value = pb_utils.get_input_tensor_by_name(request, "INPUT0").as_numpy()
            n = int(value[0])
            pb_utils.Logger.log_info(f"chatty-info-{n}")
            pb_utils.Logger.log_warn(f"chatty-warning-{n}")
            pb_utils.Logger.log_error(f"chatty-error-{n}")
            pb_utils.Logger.log_verbose(f"chatty-verbose-{n}")
            responses.append(pb_utils.InferenceResponse([pb_utils.Tensor("OUTPUT0", value)]))
        return responses
"""


@pytest.fixture(scope="module")
def chatty_repository(tmp_path_factory: pytest.TempPathFactory) -> Path:
    repository = tmp_path_factory.mktemp("logging-repository")
    (repository / "chatty" / "1").mkdir(parents=True)
    (repository / "chatty" / "config.pbtxt").write_text(CHATTY_CONFIG, encoding="utf-8")
    (repository / "chatty" / "1" / "model.py").write_text(CHATTY_MODEL, encoding="utf-8")
    return repository


@pytest.fixture(scope="module")
def daemon(chatty_repository: Path) -> Iterator[Server]:
    with run_server([chatty_repository]) as server:
        yield server


@pytest.fixture
def server(daemon: Server) -> Iterator[Server]:
    """The shared daemon, with the default settings back after each test."""
    yield daemon
    reply = post_json(daemon.http_url, "/v2/logging", {k: v for k, v in DEFAULTS.items() if k != "log_file"})
    assert reply.status == 200, reply


def _settings(server: Server) -> Any:
    reply = request(server.http_url, "GET", "/v2/logging")
    assert reply.status == 200, reply
    assert reply.header("content-type") == "application/json"
    return reply.json()


def _chat(server: Server, n: int) -> None:
    """One request to the chatty model, then the daemon's log holds whatever of its four lines the settings let
    through (the info line is written before the reply, as every stub line reaches the daemon before it)."""
    client = httpclient.InferenceServerClient(server.http_url)
    try:
        tensor = httpclient.InferInput("INPUT0", [1], "INT32")
        tensor.set_data_from_numpy(np.array([n], dtype=np.int32))
        result = client.infer("chatty", [tensor])
        assert result.as_numpy("OUTPUT0").tolist() == [n]
    finally:
        client.close()


def _lines(server: Server, n: int, *, wait_for: str | None = None) -> dict[str, str]:
    """The chatty model's lines for request ``n`` in the daemon's log, by level; waits briefly for ``wait_for``."""
    deadline = time.monotonic() + 5
    while True:
        found = {}
        for line in server.log().splitlines():
            match = re.search(rf"chatty-(info|warning|error|verbose)-{n}$", line)
            if match:
                found[match.group(1)] = line
        if wait_for is None or wait_for in found or time.monotonic() > deadline:
            return found
        time.sleep(0.05)


# --- HTTP ------------------------------------------------------------------------------------------------


def test_server_metadata_lists_logging(server: Server) -> None:
    client = httpclient.InferenceServerClient(server.http_url)
    try:
        assert "logging" in client.get_server_metadata()["extensions"]
    finally:
        client.close()


def test_http_get_returns_triton_shape(server: Server) -> None:
    settings = _settings(server)
    assert settings == DEFAULTS
    # Triton's key order, and its types: the level is an integer, not a string.
    assert list(settings) == list(DEFAULTS)
    client = httpclient.InferenceServerClient(server.http_url)
    try:
        assert client.get_log_settings() == DEFAULTS
    finally:
        client.close()


def test_http_update_each_setting(server: Server) -> None:
    client = httpclient.InferenceServerClient(server.http_url)
    try:
        expected = dict(DEFAULTS)
        for key, value in (
            ("log_info", False),
            ("log_warning", False),
            ("log_error", False),
            ("log_verbose_level", 2),
            ("log_format", "ISO8601"),
        ):
            expected[key] = value
            assert client.update_log_settings({key: value}) == expected
            assert _settings(server) == expected
    finally:
        client.close()


def test_http_ignores_nulls_and_unknown_keys(server: Server) -> None:
    for body in ('{"log_info": null, "log_verbose_level": null}', '{"log_infos": false}'):
        reply = request(server.http_url, "POST", "/v2/logging", body)
        assert reply.status == 200, (body, reply)
        assert reply.json() == DEFAULTS, body


@pytest.mark.parametrize(
    ("body", "kind"), [("[1,2,3]", "an array"), ("null", "null"), ('"text"', "a string"), ("5", "a number")]
)
def test_http_refuses_a_body_that_is_not_an_object(server: Server, body: str, kind: str) -> None:
    # Triton 2.51 answers 200 and ignores such a body; edged tells the client its request did nothing.
    reply = request(server.http_url, "POST", "/v2/logging", body)
    assert reply.status == 400, reply
    assert reply.error() == f"the logging settings request body must be a JSON object, got {kind}"
    assert _settings(server) == DEFAULTS


@pytest.mark.parametrize(
    ("body", "status", "message"),
    [
        ({"log_info": "yes"}, 500, "attempt to access JSON non-boolean as boolean"),
        ({"log_warning": 1}, 500, "attempt to access JSON non-boolean as boolean"),
        ({"log_error": "false"}, 500, "attempt to access JSON non-boolean as boolean"),
        ({"log_verbose_level": -1}, 500, "attempt to access JSON non-unsigned-integer as unsigned-integer"),
        ({"log_verbose_level": "2"}, 500, "attempt to access JSON non-unsigned-integer as unsigned-integer"),
        ({"log_verbose_level": True}, 500, "attempt to access JSON non-unsigned-integer as unsigned-integer"),
        ({"log_verbose_level": 1.5}, 500, "attempt to access JSON non-unsigned-integer as unsigned-integer"),
        ({"log_format": 3}, 500, "attempt to access JSON non-string as string"),
        ({"log_format": "xml"}, 503, "invalid argument for --log_format, got: xml"),
        ({"log_format": "iso8601"}, 503, "invalid argument for --log_format, got: iso8601"),
    ],
)
def test_http_bad_values_get_tritons_errors(server: Server, body: dict[str, Any], status: int, message: str) -> None:
    reply = post_json(server.http_url, "/v2/logging", body)
    assert reply.status == status, reply
    assert reply.error() == message
    assert _settings(server) == DEFAULTS


def test_http_body_that_is_not_json(server: Server) -> None:
    empty = request(server.http_url, "POST", "/v2/logging", "")
    assert empty.status == 500
    assert empty.error() == "failed to parse the request JSON buffer: The document is empty. at 0"
    broken = request(server.http_url, "POST", "/v2/logging", "not json")
    assert broken.status == 500
    assert broken.error().startswith("failed to parse the request JSON buffer")


def test_http_failing_setting_keeps_the_ones_before_it(server: Server) -> None:
    # Triton checks and applies log_info, log_warning, log_error, log_verbose_level, log_format in that order.
    reply = post_json(server.http_url, "/v2/logging", {"log_format": "xml", "log_warning": False})
    assert reply.status == 503
    assert _settings(server) == {**DEFAULTS, "log_warning": False}
    reply = post_json(server.http_url, "/v2/logging", {"log_error": False, "log_info": "no"})
    assert reply.status == 500
    assert _settings(server) == {**DEFAULTS, "log_warning": False}


@pytest.mark.parametrize("value", ["/tmp/edged-elsewhere.log", "", 5])
def test_http_log_file_is_refused(server: Server, value: Any) -> None:
    reply = post_json(server.http_url, "/v2/logging", {"log_info": False, "log_file": value})
    assert reply.status == 501, reply
    assert reply.error() == REFUSED_LOG_FILE
    # Nothing in a refused request is applied, and no file was created.
    assert _settings(server) == DEFAULTS
    assert not Path("/tmp/edged-elsewhere.log").exists()
    client = httpclient.InferenceServerClient(server.http_url)
    try:
        with pytest.raises(InferenceServerException) as caught:
            client.update_log_settings({"log_file": "/tmp/edged-elsewhere.log"})
        assert caught.value.status() == "501"
        assert caught.value.message() == REFUSED_LOG_FILE
    finally:
        client.close()


def test_http_other_methods_are_not_allowed(server: Server) -> None:
    assert request(server.http_url, "PUT", "/v2/logging", "{}").status == 405


# --- gRPC ------------------------------------------------------------------------------------------------


def _grpc_settings(client: grpcclient.InferenceServerClient) -> dict[str, Any]:
    reply = client.get_log_settings()
    return {key: getattr(value, value.WhichOneof("parameter_choice")) for key, value in reply.settings.items()}


def test_grpc_get_and_update(server: Server) -> None:
    client = grpcclient.InferenceServerClient(server.grpc_url)
    try:
        assert _grpc_settings(client) == DEFAULTS
        as_json = client.get_log_settings(as_json=True)
        assert as_json["settings"]["log_verbose_level"] == {"uint32_param": 0}
        assert as_json["settings"]["log_file"] == {"string_param": ""}
        assert as_json["settings"]["log_info"] == {"bool_param": True}
        reply = client.update_log_settings({"log_info": False, "log_verbose_level": 3, "log_format": "ISO8601"})
        updated = {k: getattr(v, v.WhichOneof("parameter_choice")) for k, v in reply.settings.items()}
        assert updated == {**DEFAULTS, "log_info": False, "log_verbose_level": 3, "log_format": "ISO8601"}
        # One daemon, one set of settings: HTTP sees what gRPC set.
        assert _settings(server) == updated
        # Unknown keys are ignored, as Triton does.
        client.update_log_settings({"log_infos": True})
        assert _grpc_settings(client) == updated
    finally:
        client.close()


def _raw_log_settings(server: Server, **settings: dict[str, Any]) -> grpc.RpcError | Any:
    request_message = service_pb2.LogSettingsRequest()
    for name, value in settings.items():
        entry = request_message.settings[name]
        for field, data in value.items():
            setattr(entry, field, data)
    with grpc.insecure_channel(server.grpc_url) as channel:
        stub = service_pb2_grpc.GRPCInferenceServiceStub(channel)
        try:
            return stub.LogSettings(request_message)
        except grpc.RpcError as error:
            return error


@pytest.mark.parametrize(
    ("settings", "message"),
    [
        ({"log_info": {"string_param": "true"}}, "expect boolean for 'log_info'"),
        ({"log_warning": {"uint32_param": 1}}, "expect boolean for 'log_warning'"),
        ({"log_error": {}}, "expect boolean for 'log_error'"),
        ({"log_verbose_level": {"bool_param": True}}, "expect int32 for 'log_verbose_level'"),
        ({"log_verbose_level": {"string_param": "2"}}, "expect int32 for 'log_verbose_level'"),
        ({"log_format": {"bool_param": True}}, "expect string for 'log_format'"),
        ({"log_format": {"string_param": "xml"}}, "invalid argument for log_format, got: xml"),
    ],
)
def test_grpc_bad_values_get_tritons_errors(server: Server, settings: dict[str, Any], message: str) -> None:
    error = _raw_log_settings(server, **settings)
    assert isinstance(error, grpc.RpcError)
    assert error.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert error.details() == message
    assert _settings(server) == DEFAULTS


@pytest.mark.parametrize("value", [{"string_param": "/tmp/edged-elsewhere.log"}, {"string_param": ""}, {}])
def test_grpc_log_file_is_refused(server: Server, value: dict[str, Any]) -> None:
    error = _raw_log_settings(server, log_file=value, log_info={"bool_param": False})
    assert isinstance(error, grpc.RpcError)
    assert error.code() == grpc.StatusCode.UNIMPLEMENTED
    assert error.details() == REFUSED_LOG_FILE
    assert _settings(server) == DEFAULTS
    client = grpcclient.InferenceServerClient(server.grpc_url)
    try:
        with pytest.raises(InferenceServerException) as caught:
            client.update_log_settings({"log_file": "/tmp/edged-elsewhere.log"})
        assert caught.value.status() == str(grpc.StatusCode.UNIMPLEMENTED)
        assert caught.value.message() == REFUSED_LOG_FILE
    finally:
        client.close()


# --- what the settings change in the log ------------------------------------------------------------------


def test_level_toggles_silence_their_lines(server: Server) -> None:
    _chat(server, 1)
    assert set(_lines(server, 1, wait_for="error")) == {"info", "warning", "error"}
    for n, key in ((2, "log_info"), (3, "log_warning"), (4, "log_error")):
        assert post_json(server.http_url, "/v2/logging", {key: False}).status == 200
        _chat(server, n)
        # The model logs info, warning, error in that order: the last line let through marks that all arrived.
        seen = _lines(server, n, wait_for="error" if key != "log_error" else "warning")
        assert set(seen) == {"info", "warning", "error"} - {key.removeprefix("log_")}, (key, seen)
        assert post_json(server.http_url, "/v2/logging", {key: True}).status == 200
    _chat(server, 5)
    assert set(_lines(server, 5, wait_for="error")) == {"info", "warning", "error"}


def test_verbose_level_opens_debug_lines(server: Server) -> None:
    _chat(server, 11)
    assert "verbose" not in _lines(server, 11, wait_for="error")
    client = grpcclient.InferenceServerClient(server.grpc_url)
    try:
        client.update_log_settings({"log_verbose_level": 1})
    finally:
        client.close()
    _chat(server, 12)
    line = _lines(server, 12, wait_for="verbose").get("verbose", "")
    # Verbose lines are I lines, as Triton's are.
    assert re.match(r"I\d{4} .* edged\.backends\.python\] ", line), server.log()[-2000:]


def test_iso8601_format_changes_the_timestamp(server: Server) -> None:
    assert post_json(server.http_url, "/v2/logging", {"log_format": "ISO8601"}).status == 200
    _chat(server, 21)
    line = _lines(server, 21, wait_for="error")["error"]
    assert re.match(r"\d{4}-\d\d-\d\dT\d\d:\d\d:\d\dZ E edged\.backends\.python\] ", line), line
    assert post_json(server.http_url, "/v2/logging", {"log_format": "default"}).status == 200
    _chat(server, 22)
    line = _lines(server, 22, wait_for="error")["error"]
    # Triton's default layout (glog's): level letter, month and day, time to the microsecond, process id.
    assert re.match(rf"E\d{{4}} \d\d:\d\d:\d\d\.\d{{6}} {server.process.pid} edged\.backends\.python\] ", line), line


# --- journald ---------------------------------------------------------------------------------------------


@pytest.fixture
def isolated_logging() -> Iterator[None]:
    """edged's handler and levels, set up by a test in this process, are taken away again afterwards."""
    root = logging.getLogger()
    handlers, level = list(root.handlers), root.level
    try:
        yield
    finally:
        logs.reset()
        root.handlers[:] = handlers
        root.setLevel(level)


@pytest.fixture
def journal(tmp_path: Path, isolated_logging: None) -> Iterator[socket.socket]:
    """A datagram socket standing in for journald's."""
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
    sock.bind(str(tmp_path / "socket"))
    sock.settimeout(5)
    try:
        yield sock
    finally:
        sock.close()


def decode_native(data: bytes) -> dict[str, str]:
    """journald's native protocol, read back."""
    entry: dict[str, str] = {}
    while data:
        line, sep, rest = data.partition(b"\n")
        assert sep, f"unterminated field: {data!r}"
        if b"=" in line:
            key, _, value = line.partition(b"=")
            entry[key.decode()] = value.decode()
            data = rest
        else:
            size = int.from_bytes(rest[:8], "little")
            entry[line.decode()] = rest[8 : 8 + size].decode()
            assert rest[8 + size : 9 + size] == b"\n"
            data = rest[9 + size :]
    return entry


def _receive(sock: socket.socket) -> dict[str, str]:
    data, fds, _, _ = sock.recvmsg(1 << 20, socket.CMSG_SPACE(4))
    for level, kind, payload in fds:
        if (level, kind) == (socket.SOL_SOCKET, socket.SCM_RIGHTS):
            fd = array.array("i", payload[:4])[0]
            with os.fdopen(fd, "rb") as memfd:
                memfd.seek(0)
                data = memfd.read()
    return decode_native(data)


def _journal_stream(path: Path) -> dict[str, str]:
    status = path.stat()
    return {"JOURNAL_STREAM": f"{status.st_dev}:{status.st_ino}"}


def test_journal_is_used_only_when_journal_stream_names_stderr(journal: socket.socket, tmp_path: Path) -> None:
    path = str(journal.getsockname())
    with open(tmp_path / "stderr", "w+") as stderr, open(tmp_path / "other", "w") as other:
        assert logs.under_journal(stderr, _journal_stream(tmp_path / "stderr"))
        assert not logs.under_journal(stderr, _journal_stream(tmp_path / "other"))
        assert not logs.under_journal(stderr, {})
        assert not logs.under_journal(stderr, {"JOURNAL_STREAM": "garbage"})
        assert logs.under_journal(other, _journal_stream(tmp_path / "other"))
        # Not a journal stream: text on the stream, nothing on the socket.
        logs.configure(stream=stderr, environ={}, journal_socket=path)
        logging.getLogger("edged.test").info("plain line")
        stderr.seek(0)
        assert re.search(r"^I\d{4} \S+ \d+ edged\.test\] plain line$", stderr.read(), re.MULTILINE)
        journal.settimeout(0.2)
        with pytest.raises(TimeoutError):
            journal.recv(65536)


def test_journal_entries_carry_model_version_and_request_id(journal: socket.socket, tmp_path: Path) -> None:
    path = str(journal.getsockname())
    with open(tmp_path / "stderr", "w+") as stderr:
        logs.configure(stream=stderr, environ=_journal_stream(tmp_path / "stderr"), journal_socket=path)
        log = logging.getLogger("edged.test")
        log.info("model %s loaded", "add_sub", extra=logs.fields(model="add_sub", version=3))
        entry = _receive(journal)
        assert entry["MESSAGE"] == "model add_sub loaded"
        assert entry["PRIORITY"] == "6"
        assert entry["MODEL"] == "add_sub"
        assert entry["VERSION"] == "3"
        assert "REQUEST_ID" not in entry
        assert entry["SYSLOG_IDENTIFIER"] == "edged"
        assert entry["LOGGER"] == "edged.test"
        assert entry["CODE_FILE"] == __file__
        with logs.context(model="digits", version=1, request_id="req-7"):
            log.warning("slow request")
            # The record's own fields win over the context's.
            log.error("failed\nsecond line", extra=logs.fields(version=2))
        log.info("outside")
        warning, error, outside = _receive(journal), _receive(journal), _receive(journal)
        assert (warning["MODEL"], warning["VERSION"], warning["REQUEST_ID"]) == ("digits", "1", "req-7")
        assert warning["PRIORITY"] == "4"
        assert (error["MODEL"], error["VERSION"], error["REQUEST_ID"]) == ("digits", "2", "req-7")
        assert error["PRIORITY"] == "3"
        assert error["MESSAGE"] == "failed\nsecond line"
        assert not {"MODEL", "VERSION", "REQUEST_ID"} & set(outside)
        stderr.seek(0)
        assert stderr.read() == "", "a journal entry was also written as text"


def test_journal_entries_follow_the_settings(journal: socket.socket, tmp_path: Path) -> None:
    path = str(journal.getsockname())
    with open(tmp_path / "stderr", "w+") as stderr:
        logs.configure(stream=stderr, environ=_journal_stream(tmp_path / "stderr"), journal_socket=path)
        log = logging.getLogger("edged.test")
        log.debug("hidden debug")
        logs.update(log_verbose_level=1)
        log.debug("shown debug")
        logs.toggle("log_info", False)
        log.info("hidden info")
        log.error("shown error")
        try:
            raise ValueError("boom")
        except ValueError:
            log.exception("with a traceback")
        big = "x" * 300_000  # past a datagram's size: sent in a sealed memfd
        log.warning(big)
        debug, error, exception, large = (_receive(journal) for _ in range(4))
        assert (debug["MESSAGE"], debug["PRIORITY"]) == ("shown debug", "7")
        assert error["MESSAGE"] == "shown error"
        assert exception["MESSAGE"].startswith("with a traceback\nTraceback (most recent call last):")
        assert exception["MESSAGE"].endswith("ValueError: boom")
        assert large["MESSAGE"] == big


def test_unreachable_journal_falls_back_to_text(tmp_path: Path, isolated_logging: None) -> None:
    with open(tmp_path / "stderr", "w+") as stderr:
        environ = _journal_stream(tmp_path / "stderr")
        logs.configure(stream=stderr, environ=environ, journal_socket=str(tmp_path / "no-socket"))
        logging.getLogger("edged.test").info("still logged", extra=logs.fields(model="m"))
        stderr.seek(0)
        text = stderr.read()
    assert "journald's socket" in text and "cannot be reached" in text
    assert "edged.test] still logged" in text


def test_journal_that_fails_later_loses_no_line(journal: socket.socket, tmp_path: Path) -> None:
    path = str(journal.getsockname())
    with open(tmp_path / "stderr", "w+") as stderr:
        logs.configure(stream=stderr, environ=_journal_stream(tmp_path / "stderr"), journal_socket=path)
        journal.close()  # journald went away: sending now fails
        logging.getLogger("edged.test").warning("kept anyway")
        logging.getLogger("edged.test").warning("kept as well")
        stderr.seek(0)
        text = stderr.read()
        assert re.search(r"^W\d{4} .* edged\.test\] kept anyway$", text, re.MULTILINE), text
        assert re.search(r"^W\d{4} .* edged\.test\] kept as well$", text, re.MULTILINE), text
        assert text.count("journald did not take a log entry") == 1, text


def test_log_file_that_cannot_be_opened(tmp_path: Path, isolated_logging: None) -> None:
    with pytest.raises(logs.LogFileError, match="cannot open log file"):
        logs.configure(log_file=str(tmp_path / "missing" / "edged.log"))


def test_log_file_gets_text_and_is_reported(tmp_path: Path, isolated_logging: None) -> None:
    path = tmp_path / "edged.log"
    settings = logs.configure(log_file=str(path), log_format="ISO8601")
    assert settings.log_file == str(path)
    assert logs.current().log_format == "ISO8601"
    logging.getLogger("edged.test").warning("to the file")
    assert re.search(r"^\S+Z W edged\.test\] to the file$", path.read_text(), re.MULTILINE)


def _can_fake_the_journal_socket() -> bool:
    if not shutil.which("unshare") or not Path("/run/systemd").is_dir():
        return False
    probe = subprocess.run(
        ["unshare", "--mount", "sh", "-c", "mount -t tmpfs none /run/systemd"], capture_output=True, check=False
    )
    return probe.returncode == 0


@pytest.mark.skipif(not _can_fake_the_journal_socket(), reason="needs a private mount namespace (root, unshare)")
def test_daemon_under_systemd_writes_to_the_journal(chatty_repository: Path) -> None:
    """The real daemon, its stderr a 'journal stream', and /run/systemd/journal/socket in a private mount namespace
    bound to a socket this test reads: the daemon's lines arrive as journal entries, whichever sender it uses."""
    with tempfile.TemporaryDirectory(prefix="edged-journal-") as scratch:
        folder = Path(scratch) / "journal"
        folder.mkdir()
        sock = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
        sock.bind(str(folder / "socket"))
        sock.settimeout(1)
        stderr_path = Path(scratch) / "stderr"
        http_port, grpc_port, metrics_port = free_ports(3)
        script = (
            "mount -t tmpfs none /run/systemd && mkdir /run/systemd/journal && "
            f"mount --bind {folder} /run/systemd/journal && "
            'export JOURNAL_STREAM=$(stat -L -c %d:%i /dev/stderr) && exec "$@"'
        )
        args = [
            *("unshare", "--mount", "sh", "-c", script, "sh", sys.executable, "-m", "edged", "serve"),
            *("--model-repository", str(chatty_repository), "--http-address", "127.0.0.1"),
            *("--http-port", str(http_port), "--grpc-port", str(grpc_port), "--metrics-port", str(metrics_port)),
            *("--allow-console", "false"),
            *("--state-dir", str(Path(scratch) / "state")),
        ]
        with stderr_path.open("wb") as stderr:
            process = subprocess.Popen(args, stdout=stderr, stderr=stderr, stdin=subprocess.DEVNULL, cwd=REPO_ROOT)
        entries: list[dict[str, str]] = []
        try:
            deadline = time.monotonic() + 60
            while not any("edged ready" in e.get("MESSAGE", "") for e in entries):
                assert process.poll() is None, stderr_path.read_text()
                assert time.monotonic() < deadline, (entries, stderr_path.read_text())
                with contextlib.suppress(TimeoutError):
                    entries.append(_receive(sock))
            reply = post_json(f"127.0.0.1:{http_port}", "/v2/logging", {"log_verbose_level": 1})
            assert reply.status == 200, reply
            changed = _receive(sock)
            assert changed["MESSAGE"] == "log settings changed over HTTP by loopback: log_verbose_level=1"
            assert changed["PRIORITY"] == "6"
            assert changed["SYSLOG_IDENTIFIER"] == "edged"
        finally:
            process.terminate()
            process.wait(30)
            sock.close()
        assert process.returncode == 0, stderr_path.read_text()
        # Everything went to the journal; stderr holds nothing but what a library may print itself.
        assert "edged ready" not in stderr_path.read_text()


def test_tritons_log_flags_set_the_start(chatty_repository: Path, tmp_path: Path) -> None:
    """--log-file, --log-format, --log-warning (and their fellows) as Triton's: the file gets the lines, in the
    layout asked for, of the levels let through, and the logging extension reports them."""
    path = tmp_path / "edged.log"
    flags = [f"--log-file={path}", "--log-format=ISO8601", "--log-warning=false", f"--state-dir={tmp_path / 'state'}"]
    with run_server([chatty_repository], *flags) as started:
        assert _settings(started) | {"log_verbose_level": 0} == DEFAULTS | {
            "log_file": str(path),
            "log_warning": False,
            "log_format": "ISO8601",
        }
        _chat(started, 31)
        deadline = time.monotonic() + 30
        while "chatty-error-31" not in path.read_text(encoding="utf-8"):
            assert time.monotonic() < deadline, "the error line never reached the log file"
            time.sleep(0.05)
    text = path.read_text(encoding="utf-8")
    assert re.search(r"^\S+Z E edged\.backends\.python\] .*chatty-error-31$", text, re.MULTILINE), text
    assert re.search(r"^\S+Z I edged\.backends\.python\] .*chatty-info-31$", text, re.MULTILINE), text
    assert "chatty-warning-31" not in text
    assert not re.search(r"^\S+Z W ", text, re.MULTILINE), text
