"""Frontend worker processes (--frontend-workers): they share the HTTP and gRPC ports with the daemon, answer
inference on their own cores with the daemon's one copy of each model, and pass every other request to the
daemon. Each test drives a connection that the kernel gave to a worker (found from /proc), and expects exactly
what the daemon answers itself."""

from __future__ import annotations

import contextlib
import http.client
import json
import os
import queue
import shutil
import signal
import socket
import subprocess
import sys
import time
import uuid
from collections.abc import Callable, Iterator
from functools import partial
from pathlib import Path
from typing import Any, Final, TypeVar

import h2.config
import h2.connection
import h2.events
import modelgen  # type: ignore[import-not-found, unused-ignore]
import numpy as np
import pytest
import tritonclient.grpc as grpcclient
import tritonclient.http as httpclient
import tritonclient.utils.shared_memory as shm
from server import (
    ADD_SUB_INPUT0,
    ADD_SUB_INPUT1,
    REPO_ROOT,
    TRACEBACK_MARKER,
    Server,
    add_sub_inputs,
    api_token,
    bearer,
    free_ports,
    grpc_add_sub_inputs,
    run_server,
)
from tritonclient.grpc import service_pb2
from tritonclient.utils import InferenceServerException

WORKERS: Final = 2
TESTDATA: Final = Path(__file__).resolve().parents[1] / "testdata"
# Connections opened until one lands on a worker: the kernel picks one of three sockets for each.
TRIES: Final = 60

_Client = TypeVar("_Client")


@pytest.fixture(scope="module")
def worker_repository(tmp_path_factory: pytest.TempPathFactory) -> Path:
    repo = tmp_path_factory.mktemp("workers-repository")
    modelgen.write_add_sub(repo / "add_sub", max_batch_size=8, dims=16, dtype="FP32")
    for model in ("repeat_decoupled", "misbehave"):
        shutil.copytree(TESTDATA / "python_models" / model, repo / model)
    return repo


@pytest.fixture(scope="module")
def workers_server(worker_repository: Path) -> Iterator[Server]:
    with run_server(
        [worker_repository],
        f"--frontend-workers={WORKERS}",
        "--model-control-mode=explicit",
        "--load-model=*",
        "--allow-console=false",
        "--allow-client-shm=true",
    ) as running:
        yield running


def _children(pid: int) -> list[int]:
    text = Path(f"/proc/{pid}/task/{pid}/children").read_text()
    return [int(child) for child in text.split()]


def _cmdline(pid: int) -> str:
    try:
        return Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ").decode()
    except OSError:
        return ""


def worker_pids(server: Server) -> list[int]:
    return [pid for pid in _children(server.process.pid) if "edged.daemon.worker" in _cmdline(pid)]


def _tcp_table() -> list[tuple[int, int, int]]:
    """(local port, remote port, inode) of every established TCP connection of this network namespace."""
    rows = []
    for table in ("/proc/net/tcp", "/proc/net/tcp6"):
        with contextlib.suppress(FileNotFoundError), open(table) as lines:
            next(lines)
            for line in lines:
                fields = line.split()
                if fields[3] != "01":  # ESTABLISHED
                    continue
                local, remote = (int(address.rsplit(":", 1)[1], 16) for address in fields[1:3])
                rows.append((local, remote, int(fields[9])))
    return rows


def _socket_inodes(pid: int | str) -> set[int]:
    inodes = set()
    with contextlib.suppress(OSError):
        for fd in os.listdir(f"/proc/{pid}/fd"):
            with contextlib.suppress(OSError):
                target = os.readlink(f"/proc/{pid}/fd/{fd}")
                if target.startswith("socket:["):
                    inodes.add(int(target[8:-1]))
    return inodes


def serving_pids(server: Server, port: int) -> set[int]:
    """The daemon processes at the other end of this test process's connections to ``port``."""
    table = _tcp_table()
    mine = _socket_inodes("self")
    client_ports = {local for local, remote, inode in table if remote == port and inode in mine}
    server_inodes = {inode for local, remote, inode in table if local == port and remote in client_ports}
    candidates = [server.process.pid, *_children(server.process.pid)]
    return {pid for pid in candidates if _socket_inodes(pid) & server_inodes}


def on_a_worker(
    server: Server, port: int, connect: Callable[[], _Client], close: Callable[[_Client], None]
) -> tuple[_Client, int]:
    """A client whose connection a worker serves (each is connected with one call by ``connect``)."""
    workers = set(worker_pids(server))
    assert len(workers) == WORKERS
    for _ in range(TRIES):
        client = connect()
        pids = serving_pids(server, port)
        assert len(pids) == 1, pids
        (pid,) = pids
        if pid in workers:
            return client, pid
        close(client)
    pytest.fail(f"none of {TRIES} connections went to a frontend worker")


@pytest.fixture
def http_worker(workers_server: Server) -> Iterator[httpclient.InferenceServerClient]:
    def connect() -> httpclient.InferenceServerClient:
        client = httpclient.InferenceServerClient(workers_server.http_url, network_timeout=30.0)
        assert client.is_server_live()
        return client

    client, _ = on_a_worker(workers_server, workers_server.http_port, connect, lambda c: c.close())
    yield client
    client.close()


def _grpc_connect(server: Server) -> grpcclient.InferenceServerClient:
    # A subchannel of its own: grpc otherwise shares one connection among the clients of a process.
    client = grpcclient.InferenceServerClient(server.grpc_url, channel_args=[("grpc.use_local_subchannel_pool", 1)])
    assert client.is_server_live()
    return client


@pytest.fixture
def grpc_worker(workers_server: Server) -> Iterator[grpcclient.InferenceServerClient]:
    client, _ = on_a_worker(
        workers_server, workers_server.grpc_port, partial(_grpc_connect, workers_server), lambda c: c.close()
    )
    yield client
    client.close()


def _raw_on_a_worker(server: Server) -> http.client.HTTPConnection:
    def connect() -> http.client.HTTPConnection:
        connection = http.client.HTTPConnection("127.0.0.1", server.http_port, timeout=30)
        connection.request("GET", "/v2/health/live")
        assert connection.getresponse().read() == b""
        return connection

    connection, _ = on_a_worker(server, server.http_port, connect, lambda c: c.close())
    return connection


def _error(call: Callable[[], Any]) -> InferenceServerException:
    with pytest.raises(InferenceServerException) as caught:
        call()
    return caught.value


# ------------------------------------------------------------------------------------------------------------
# start-up


def test_workers_serve_beside_the_daemon(workers_server: Server) -> None:
    assert f"{WORKERS} frontend workers serve HTTP and gRPC beside the daemon" in workers_server.log()
    assert len(worker_pids(workers_server)) == WORKERS


# ------------------------------------------------------------------------------------------------------------
# HTTP


def test_http_inference_on_a_worker(http_worker: httpclient.InferenceServerClient) -> None:
    for binary in (True, False):
        result = http_worker.infer("add_sub", add_sub_inputs(binary=binary))
        np.testing.assert_array_equal(result.as_numpy("OUTPUT0"), ADD_SUB_INPUT0 + ADD_SUB_INPUT1)
        np.testing.assert_array_equal(result.as_numpy("OUTPUT1"), ADD_SUB_INPUT0 - ADD_SUB_INPUT1)
    # One output, asked for by name, as JSON.
    only = http_worker.infer("add_sub", add_sub_inputs(), outputs=[httpclient.InferRequestedOutput("OUTPUT1", False)])
    assert only.get_response()["outputs"][0]["name"] == "OUTPUT1"
    assert only.as_numpy("OUTPUT0") is None


def test_http_errors_on_a_worker_are_the_daemons(
    http_worker: httpclient.InferenceServerClient, workers_server: Server
) -> None:
    direct = httpclient.InferenceServerClient(workers_server.http_url)
    try:
        for call in (
            lambda c: c.infer("nope", add_sub_inputs()),
            lambda c: c.infer("add_sub", add_sub_inputs(ADD_SUB_INPUT0.reshape(2, 8), ADD_SUB_INPUT1.reshape(2, 8))),
            lambda c: c.infer("add_sub", add_sub_inputs(), model_version="7"),
            lambda c: c.infer("repeat_decoupled", add_sub_inputs()),
            lambda c: c.get_model_metadata("nope"),
        ):
            worker_error, daemon_error = _error(partial(call, http_worker)), _error(partial(call, direct))
            assert (worker_error.status(), worker_error.message()) == (daemon_error.status(), daemon_error.message())
    finally:
        direct.close()


def test_http_management_through_a_worker(http_worker: httpclient.InferenceServerClient) -> None:
    assert http_worker.is_server_ready()
    assert http_worker.is_model_ready("add_sub")
    assert http_worker.get_model_metadata("add_sub")["inputs"][0]["name"] == "INPUT0"
    assert http_worker.get_model_config("add_sub")["max_batch_size"] == 8
    before = http_worker.get_inference_statistics("add_sub")["model_stats"][0]["inference_count"]
    http_worker.infer("add_sub", add_sub_inputs())
    after = http_worker.get_inference_statistics("add_sub")["model_stats"][0]["inference_count"]
    assert after == before + 1
    # A change of the repository, asked through the worker, is the daemon's: the worker's next request sees it.
    http_worker.unload_model("add_sub")
    try:
        assert not http_worker.is_model_ready("add_sub")
        error = _error(lambda: http_worker.infer("add_sub", add_sub_inputs()))
        assert error.status() in ("400", "404", "503")
        assert "add_sub" in error.message()
    finally:
        http_worker.load_model("add_sub")
    assert http_worker.is_model_ready("add_sub")
    http_worker.infer("add_sub", add_sub_inputs())
    index = {entry["name"]: entry["state"] for entry in http_worker.get_model_repository_index()}
    assert index["add_sub"] == "READY"


def test_http_relayed_request_keeps_its_client_and_body(workers_server: Server) -> None:
    connection = _raw_on_a_worker(workers_server)
    try:
        # A body the daemon's app reads, and an answer with a status and headers of its own. A config override needs
        # a credential (from loopback too): the daemon's app reads it from the relayed request.
        body = json.dumps({"parameters": {"config": "{not json"}}).encode()
        headers = {"Content-Type": "application/json", **bearer(api_token(workers_server))}
        connection.request("POST", "/v2/repository/models/nope/load", body, headers)
        reply = connection.getresponse()
        text = reply.read()
        assert reply.status == 400, text
        assert reply.getheader("content-type") == "application/json"
        assert json.loads(text)["error"].startswith(
            "failed to load 'nope': the 'config' override is not a model config"
        )
        # A path that is no route: the daemon's 404, not the worker's.
        connection.request("GET", "/v2/models/add_sub/nothing")
        reply = connection.getresponse()
        assert reply.status == 404
        reply.read()
        # The binary infer path of the worker, on the same connection afterwards.
        connection.request(
            "POST",
            "/v2/models/add_sub/infer",
            json.dumps(
                {
                    "inputs": [
                        {
                            "name": "INPUT0",
                            "shape": [1, 16],
                            "datatype": "FP32",
                            "data": ADD_SUB_INPUT0.ravel().tolist(),
                        },
                        {
                            "name": "INPUT1",
                            "shape": [1, 16],
                            "datatype": "FP32",
                            "data": ADD_SUB_INPUT1.ravel().tolist(),
                        },
                    ]
                }
            ),
        )
        reply = connection.getresponse()
        outputs = {output["name"]: output["data"] for output in json.loads(reply.read())["outputs"]}
        assert outputs["OUTPUT0"] == (ADD_SUB_INPUT0 + ADD_SUB_INPUT1).ravel().tolist()
    finally:
        connection.close()


def test_http_shared_memory_through_a_worker(http_worker: httpclient.InferenceServerClient) -> None:
    tag = uuid.uuid4().hex[:8]
    in_key, out_key = f"/edged_workers_in_{tag}", f"/edged_workers_out_{tag}"
    inputs = shm.create_shared_memory_region("w-in", in_key, 128)
    outputs = shm.create_shared_memory_region("w-out", out_key, 128)
    try:
        shm.set_shared_memory_region(inputs, [ADD_SUB_INPUT0, ADD_SUB_INPUT1])
        http_worker.register_system_shared_memory("w-in", in_key, 128)
        http_worker.register_system_shared_memory("w-out", out_key, 128)
        tensors = add_sub_inputs()
        tensors[0].set_shared_memory("w-in", 64)
        tensors[1].set_shared_memory("w-in", 64, offset=64)
        wanted = [httpclient.InferRequestedOutput("OUTPUT0"), httpclient.InferRequestedOutput("OUTPUT1")]
        wanted[0].set_shared_memory("w-out", 64)
        wanted[1].set_shared_memory("w-out", 64, offset=64)
        http_worker.infer("add_sub", tensors, outputs=wanted)
        written = shm.get_contents_as_numpy(outputs, np.float32, [2, 16])
        np.testing.assert_array_equal(written[0], (ADD_SUB_INPUT0 + ADD_SUB_INPUT1)[0])
        np.testing.assert_array_equal(written[1], (ADD_SUB_INPUT0 - ADD_SUB_INPUT1)[0])
    finally:
        http_worker.unregister_system_shared_memory()
        shm.destroy_shared_memory_region(inputs)
        shm.destroy_shared_memory_region(outputs)


# ------------------------------------------------------------------------------------------------------------
# gRPC


def test_grpc_inference_on_a_worker(grpc_worker: grpcclient.InferenceServerClient) -> None:
    result = grpc_worker.infer("add_sub", grpc_add_sub_inputs())
    np.testing.assert_array_equal(result.as_numpy("OUTPUT0"), ADD_SUB_INPUT0 + ADD_SUB_INPUT1)
    np.testing.assert_array_equal(result.as_numpy("OUTPUT1"), ADD_SUB_INPUT0 - ADD_SUB_INPUT1)


def test_grpc_errors_and_metadata_through_a_worker(
    grpc_worker: grpcclient.InferenceServerClient, workers_server: Server
) -> None:
    direct = grpcclient.InferenceServerClient(workers_server.grpc_url)
    try:
        for call in (
            lambda c: c.infer("nope", grpc_add_sub_inputs()),
            lambda c: c.infer("repeat_decoupled", grpc_add_sub_inputs()),
            lambda c: c.get_model_metadata("nope"),
            lambda c: c.get_model_config("add_sub", model_version="x"),
        ):
            worker_error, daemon_error = _error(partial(call, grpc_worker)), _error(partial(call, direct))
            assert (worker_error.status(), worker_error.message()) == (daemon_error.status(), daemon_error.message())
    finally:
        direct.close()
    assert grpc_worker.is_server_ready()
    assert grpc_worker.get_model_metadata("add_sub").inputs[0].name == "INPUT0"
    assert grpc_worker.get_model_config("add_sub").config.max_batch_size == 8
    assert grpc_worker.get_inference_statistics("add_sub").model_stats[0].name == "add_sub"


class _RawGrpc:
    """One HTTP/2 connection through h2, told to send header fields as given: metadata that grpc's own client
    refuses to send, though HTTP/2 carries it."""

    def __init__(self, port: int) -> None:
        self.port = port
        self.sock = socket.create_connection(("127.0.0.1", port), timeout=30)
        config = h2.config.H2Configuration(
            client_side=True, validate_outbound_headers=False, normalize_outbound_headers=False
        )
        self.h2 = h2.connection.H2Connection(config)
        self.h2.initiate_connection()
        self._flush()

    def _flush(self) -> None:
        if data := self.h2.data_to_send():
            self.sock.sendall(data)

    def call(
        self, method: str, request: bytes, metadata: list[tuple[bytes, bytes]] | None = None
    ) -> tuple[dict[bytes, bytes], bytes]:
        """One unary RPC of GRPCInferenceService: the reply's header fields and trailers together, and its body."""
        stream = self.h2.get_next_available_stream_id()
        headers = [
            (b":method", b"POST"),
            (b":scheme", b"http"),
            (b":path", f"/inference.GRPCInferenceService/{method}".encode()),
            (b":authority", f"127.0.0.1:{self.port}".encode()),
            (b"content-type", b"application/grpc"),
            (b"te", b"trailers"),
            *(metadata or []),
        ]
        self.h2.send_headers(stream, headers)
        self.h2.send_data(stream, b"\0" + len(request).to_bytes(4, "big") + request, end_stream=True)
        self._flush()
        fields: dict[bytes, bytes] = {}
        body = bytearray()
        while True:
            data = self.sock.recv(1 << 16)
            if not data:
                raise ConnectionError("the daemon closed the connection")
            for event in self.h2.receive_data(data):
                if getattr(event, "stream_id", None) != stream:
                    continue
                if isinstance(event, h2.events.ResponseReceived | h2.events.TrailersReceived):
                    fields.update((bytes(name), bytes(value)) for name, value in event.headers)
                elif isinstance(event, h2.events.DataReceived):
                    body += event.data
                    self.h2.acknowledge_received_data(event.flow_controlled_length, stream)
                elif isinstance(event, h2.events.StreamReset):
                    raise AssertionError(f"stream {stream} reset with code {event.error_code}")
                elif isinstance(event, h2.events.StreamEnded):
                    self._flush()
                    return fields, bytes(body)
            self._flush()

    def close(self) -> None:
        self.sock.close()


def _raw_grpc_connect(server: Server) -> _RawGrpc:
    client = _RawGrpc(server.grpc_port)
    # A whole call: the connection is accepted, by the daemon or a worker, once it is answered.
    fields, _ = client.call("ServerLive", b"")
    assert fields.get(b"grpc-status") == b"0", fields
    return client


def test_metadata_grpc_cannot_send_is_not_relayed_by_a_worker(workers_server: Server) -> None:
    # Keys HTTP/2 (RFC 9113 §8.2.1) carries but grpc does not (only a-z 0-9 - _ .), and values of keys not ending in
    # -bin with bytes outside printable ASCII: grpc's client refuses to send them, so the worker that relays the
    # call to the daemon leaves them out rather than failing the call with UNKNOWN and a traceback.
    odd = [
        (b"x!key", b"v"),
        (b"a^b", b"v"),
        (b"key~", b"v"),
        (b"x-latin", b"caf\xe9"),
        (b"x-delete", b"a\x7fb"),
        (b"x-fine", b"kept"),
    ]
    before = len(workers_server.log())
    client, _ = on_a_worker(
        workers_server, workers_server.grpc_port, partial(_raw_grpc_connect, workers_server), _RawGrpc.close
    )
    try:
        fields, body = client.call("ServerLive", b"", odd)
        assert fields.get(b"grpc-status") == b"0", fields
        assert service_pb2.ServerLiveResponse.FromString(body[5:]).live
        request = service_pb2.ModelReadyRequest(name="add_sub").SerializeToString()
        fields, body = client.call("ModelReady", request, odd)
        assert fields.get(b"grpc-status") == b"0", fields
        assert service_pb2.ModelReadyResponse.FromString(body[5:]).ready
        # The same connection serves on.
        fields, _ = client.call("ServerReady", b"")
        assert fields.get(b"grpc-status") == b"0", fields
    finally:
        client.close()
    grpc_client, _ = on_a_worker(
        workers_server, workers_server.grpc_port, partial(_grpc_connect, workers_server), lambda c: c.close()
    )
    try:
        assert grpc_client.is_model_ready("add_sub")
        result = grpc_client.infer("add_sub", grpc_add_sub_inputs())
        np.testing.assert_array_equal(result.as_numpy("OUTPUT0"), ADD_SUB_INPUT0 + ADD_SUB_INPUT1)
    finally:
        grpc_client.close()
    log = workers_server.log()[before:]
    assert TRACEBACK_MARKER not in log, log
    assert "ExecuteBatchError" not in log, log


def test_grpc_stream_of_a_decoupled_model_on_a_worker(grpc_worker: grpcclient.InferenceServerClient) -> None:
    results: queue.Queue[Any] = queue.Queue()
    grpc_worker.start_stream(callback=partial(lambda q, result, error: q.put(error or result), results))
    try:
        values = [3, 1, 4, 1, 5]
        tensor = grpcclient.InferInput("IN", [len(values)], "INT32")
        tensor.set_data_from_numpy(np.array(values, dtype=np.int32))
        grpc_worker.async_stream_infer("repeat_decoupled", [tensor], request_id="r1")
        got = [results.get(timeout=30) for _ in values]
        assert [int(r.as_numpy("OUT")[0]) for r in got] == values
        assert [int(r.as_numpy("IDX")[0]) for r in got] == list(range(len(values)))
        # A model that is not decoupled answers once on the same stream.
        grpc_worker.async_stream_infer("add_sub", grpc_add_sub_inputs())
        single = results.get(timeout=30)
        np.testing.assert_array_equal(single.as_numpy("OUTPUT0"), ADD_SUB_INPUT0 + ADD_SUB_INPUT1)
    finally:
        grpc_worker.stop_stream()


def test_a_client_that_hangs_up_on_a_worker_cancels_its_request(workers_server: Server) -> None:
    before = len(workers_server.log())
    connection = _raw_on_a_worker(workers_server)
    body = {"id": "w1", "inputs": [{"name": "MODE", "shape": [1], "datatype": "BYTES", "data": ["wait_cancel"]}]}
    try:
        connection.request("POST", "/v2/models/misbehave/infer", json.dumps(body), {"Content-Type": "application/json"})
        # Hang up only once the model runs: a request cancelled before it is seen by no model.
        deadline = time.monotonic() + 30
        while "request 'w1' waits for its cancellation" not in workers_server.log()[before:]:
            assert time.monotonic() < deadline, "the request never reached the model"
            time.sleep(0.05)
    finally:
        connection.close()
    deadline = time.monotonic() + 30
    while "request 'w1' cancelled:" not in workers_server.log()[before:]:
        assert time.monotonic() < deadline, "the model never reported whether it saw the cancellation"
        time.sleep(0.05)
    # Without the cancellation passed on by the worker, the model would wait out its deadline and log False.
    assert "request 'w1' cancelled: True" in workers_server.log()[before:]


# ------------------------------------------------------------------------------------------------------------
# access


def test_guarded_inference_on_a_worker_checks_the_daemons_tokens(small_repository: Path, tmp_path: Path) -> None:
    state = tmp_path / "state"
    made = subprocess.run(
        [
            sys.executable,
            "-m",
            "edged",
            "token",
            "--state-dir",
            str(state),
            "create",
            "--name",
            "cam",
            "--role",
            "viewer",
        ],
        capture_output=True,
        text=True,
        timeout=60,
        cwd=REPO_ROOT,
        check=True,
    )
    token = made.stdout.strip()
    with run_server(
        [small_repository],
        f"--frontend-workers={WORKERS}",
        "--guarded-apis=inference",
        "--trust-loopback=false",
        "--allow-console=false",
        f"--state-dir={state}",
    ) as server:
        http_client, _ = on_a_worker(server, server.http_port, partial(_http_health, server), lambda c: c.close())
        try:
            refused = _error(partial(http_client.infer, "add_sub", add_sub_inputs()))
            assert refused.status() == "401"
            allowed = http_client.infer("add_sub", add_sub_inputs(), headers={"Authorization": f"Bearer {token}"})
            np.testing.assert_array_equal(allowed.as_numpy("OUTPUT0"), ADD_SUB_INPUT0 + ADD_SUB_INPUT1)
            bad = _error(partial(http_client.infer, "add_sub", add_sub_inputs(), headers={"Authorization": "Bearer x"}))
            assert bad.status() == "401"
        finally:
            http_client.close()
        grpc_client, _ = on_a_worker(server, server.grpc_port, partial(_grpc_connect, server), lambda c: c.close())
        try:
            refused = _error(partial(grpc_client.infer, "add_sub", grpc_add_sub_inputs()))
            assert refused.status() == "StatusCode.UNAUTHENTICATED"
            allowed = grpc_client.infer("add_sub", grpc_add_sub_inputs(), headers={"authorization": f"Bearer {token}"})
            np.testing.assert_array_equal(allowed.as_numpy("OUTPUT0"), ADD_SUB_INPUT0 + ADD_SUB_INPUT1)
        finally:
            grpc_client.close()
        # Refusals are logged where they happen, with the client's address, and counted on the daemon's /metrics.
        assert "refused http request (inference) from 127.0.0.1" in server.log()
        wanted = {
            'edged_access_refused_total{api="inference",endpoint="http",reason="unauthenticated"} 2.0',
            'edged_access_refused_total{api="inference",endpoint="grpc",reason="unauthenticated"} 1.0',
        }
        deadline = time.monotonic() + 10
        while not wanted <= set(_metrics(server).splitlines()):
            assert time.monotonic() < deadline, _metrics(server)
            time.sleep(0.1)


def _metrics(server: Server) -> str:
    connection = http.client.HTTPConnection("127.0.0.1", server.metrics_port, timeout=10)
    try:
        connection.request("GET", "/metrics")
        return connection.getresponse().read().decode()
    finally:
        connection.close()


def _http_health(server: Server) -> httpclient.InferenceServerClient:
    client = httpclient.InferenceServerClient(server.http_url, network_timeout=30.0)
    assert client.is_server_live()
    return client


# ------------------------------------------------------------------------------------------------------------
# faults and life cycle


def test_a_worker_that_dies_is_started_again(workers_server: Server) -> None:
    victim = worker_pids(workers_server)[0]
    os.kill(victim, signal.SIGKILL)
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline:
        pids = worker_pids(workers_server)
        if len(pids) == WORKERS and victim not in pids and "starting it again" in workers_server.log():
            break
        time.sleep(0.2)
    else:
        pytest.fail(f"the worker was not started again:\n{workers_server.log()}")
    # Serving all along: whatever socket a new connection lands on answers.
    for _ in range(10):
        client = _grpc_connect(workers_server)
        try:
            client.infer("add_sub", grpc_add_sub_inputs())
        finally:
            client.close()


def test_stopping_the_daemon_stops_its_workers(small_repository: Path) -> None:
    with run_server([small_repository], "--frontend-workers=1", "--allow-console=false") as server:
        (worker,) = worker_pids(server)
        directory = Path(_cmdline(worker).split()[3])
        assert directory.is_dir()
        assert oct(directory.stat().st_mode & 0o777) == "0o700"
    assert not Path(f"/proc/{worker}").exists() or "edged.daemon.worker" not in _cmdline(worker)
    assert not directory.exists()


def _serve(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "edged", "serve", *args],
        capture_output=True,
        text=True,
        timeout=60,
        cwd=REPO_ROOT,
        check=False,
    )


def test_workers_refuse_tls(small_repository: Path, tmp_path: Path) -> None:
    http_port, grpc_port, metrics_port = free_ports(3)
    done = _serve(
        f"--model-repository={small_repository}",
        f"--state-dir={tmp_path}",
        f"--http-port={http_port}",
        f"--grpc-port={grpc_port}",
        f"--metrics-port={metrics_port}",
        "--frontend-workers=2",
        "--http-use-ssl=true",
        f"--http-server-cert={tmp_path / 'cert.pem'}",
        f"--http-server-key={tmp_path / 'key.pem'}",
    )
    assert done.returncode == 1
    assert "--frontend-workers serve plain HTTP and gRPC only" in done.stderr + done.stdout


def test_a_shared_port_still_refuses_a_second_daemon(workers_server: Server, tmp_path: Path) -> None:
    grpc_port, metrics_port = free_ports(2)
    done = _serve(
        f"--model-repository={tmp_path}",
        f"--state-dir={tmp_path / 'state'}",
        f"--http-port={workers_server.http_port}",
        "--http-address=127.0.0.1",
        f"--grpc-port={grpc_port}",
        f"--metrics-port={metrics_port}",
        "--frontend-workers=1",
        "--allow-console=false",
    )
    assert done.returncode == 1
    assert (
        f"failed to start HTTP service: Unavailable - Socket '127.0.0.1:{workers_server.http_port}' already in use"
        in done.stderr + done.stdout
    )
