"""Errors a client is answered count where an operator looks, against the real daemon with real clients.

Triton's own counters, ``nv_*`` and the statistics extension, count what Triton 2.51 counts. Measured against the
real Triton 2.51 (CPU build, Python backend; ``add_sub_python`` and ``misbehave`` of tests/testdata/python_models),
one request over HTTP and one over gRPC per case, with tritonclient, before and after:

- an input missing, a wrong datatype, a wrong shape, an unknown extra input: answered 400 / INVALID_ARGUMENT, and
  counted nowhere: ``nv_inference_request_failure`` (every reason: REJECTED, CANCELED, BACKEND, OTHER),
  ``nv_inference_request_success``, ``nv_inference_count`` and ``nv_inference_exec_count`` unchanged; in
  ``/v2/models/NAME/stats`` ``inference_stats.fail``/``success``, ``inference_count``, ``execution_count`` and
  ``last_inference`` unchanged;
- an unknown model or an unknown version: 404 / NOT_FOUND, counted nowhere (no ``nv_*`` line for the name);
- a body that is not JSON: 500, counted nowhere;
- a model that raises in ``execute``: 500 / INTERNAL, ``nv_inference_request_failure{reason="BACKEND"}`` +1 and
  ``nv_inference_exec_count`` +1 a request, ``inference_stats.fail`` +1 and ``execution_count`` +1;
  ``nv_inference_count`` and ``success`` unchanged;
- a model that answers with an error response (``InferenceResponse(error=...)``, misbehave's ``error_response``):
  the response's code (404 / NOT_FOUND here), counted as a success: ``nv_inference_request_success``,
  ``nv_inference_count`` and ``nv_inference_exec_count`` +1 a request, ``inference_stats.success`` +1.

What the operator watches counts every one of them: ``/v2/edged/metrics/history`` (each model's ``error_rate``,
which counts them as requests too, and the device-wide ``unknown_model_error_rate`` for no served model), and from
it the console's overview error figure and the Errors column of its models page. Requests a frontend worker
process answers are counted by the daemon alike.
"""

from __future__ import annotations

import contextlib
import http.client
import re
import shutil
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import TYPE_CHECKING, Any, Final, TypeVar

import numpy as np
import pytest
import tritonclient.grpc as grpcclient
import tritonclient.http as httpclient
from console_session import browser_login, console_server, http_login
from prometheus_client.parser import text_string_to_metric_families
from server import Server, request, run_server
from tritonclient.utils import InferenceServerException

if TYPE_CHECKING:
    from playwright.sync_api import Page

pytest_plugins = ("console_fixtures",)

TESTDATA: Final = Path(__file__).resolve().parents[1] / "testdata" / "python_models"
MODEL: Final = "add_sub_python"
RAISES: Final = "misbehave"
# Bad requests of each kind a test sends over each protocol.
N: Final = 6
WAIT_S: Final = 90.0
WORKERS: Final = 2
_Client = TypeVar("_Client")
# The Errors chart of the metrics page draws, above zero, the model's rejected requests (its bad inputs) and
# those for no served model.
ERRORS_CHARTED: Final = (
    "() => { const c = window.edgedCharts && window.edgedCharts.errors; if (!c) return false;"
    f" return [c.labels.indexOf('{MODEL} rejected'), c.labels.indexOf('no such model')]"
    ".every((i) => i >= 0 && c.plot.data[i + 1].some((v) => v > 0)); }"
)


@pytest.fixture(scope="module")
def repository(tmp_path_factory: pytest.TempPathFactory) -> Path:
    repo = tmp_path_factory.mktemp("client-errors")
    for model in (MODEL, RAISES):
        shutil.copytree(TESTDATA / model, repo / model)
    return repo


@pytest.fixture(scope="module")
def daemon(repository: Path, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Server]:
    with console_server([repository], tmp_path_factory.mktemp("client-errors-state")) as running:
        yield running


# --- requests ------------------------------------------------------------------------------------------------


def _input0(module: Any) -> Any:
    tensor = module.InferInput("INPUT0", [1, 16], "FP32")
    tensor.set_data_from_numpy(np.zeros((1, 16), dtype=np.float32))
    return tensor


def _missing_input(client: httpclient.InferenceServerClient | grpcclient.InferenceServerClient) -> None:
    """INPUT1 left out: answered 400 / INVALID_ARGUMENT, as Triton answers it."""
    module: Any = httpclient if isinstance(client, httpclient.InferenceServerClient) else grpcclient
    with pytest.raises(InferenceServerException) as caught:
        client.infer(MODEL, [_input0(module)])
    assert caught.value.status() in ("400", "StatusCode.INVALID_ARGUMENT"), caught.value
    assert "missing required input" in (caught.value.message() or ""), caught.value


def _unknown_model(client: httpclient.InferenceServerClient | grpcclient.InferenceServerClient) -> None:
    module: Any = httpclient if isinstance(client, httpclient.InferenceServerClient) else grpcclient
    with pytest.raises(InferenceServerException) as caught:
        client.infer("no_such_model", [_input0(module)])
    assert caught.value.status() in ("404", "StatusCode.NOT_FOUND"), caught.value


def _misbehave(
    client: httpclient.InferenceServerClient | grpcclient.InferenceServerClient, mode: bytes, statuses: tuple[str, str]
) -> None:
    """A request to misbehave in ``mode``, answered with one of ``statuses`` (HTTP's, gRPC's)."""
    module: Any = httpclient if isinstance(client, httpclient.InferenceServerClient) else grpcclient
    tensor = module.InferInput("MODE", [1], "BYTES")
    tensor.set_data_from_numpy(np.array([mode], dtype=np.object_))
    with pytest.raises(InferenceServerException) as caught:
        client.infer(RAISES, [tensor])
    assert caught.value.status() in statuses, caught.value


def _raises(client: httpclient.InferenceServerClient | grpcclient.InferenceServerClient) -> None:
    _misbehave(client, b"raise", ("500", "StatusCode.INTERNAL"))


def _answers_an_error(client: httpclient.InferenceServerClient | grpcclient.InferenceServerClient) -> None:
    _misbehave(client, b"error_response", ("404", "StatusCode.NOT_FOUND"))


def _not_json(connection: http.client.HTTPConnection) -> None:
    """A body the HTTP frontend cannot decode: its own error, not the core's."""
    connection.request(
        "POST", f"/v2/models/{MODEL}/infer", body=b'{"inputs": [', headers={"Content-Type": "application/json"}
    )
    reply = connection.getresponse()
    reply.read()
    assert reply.status >= 400, reply.status


# --- what is counted -----------------------------------------------------------------------------------------


def _nv(server: Server, model: str) -> dict[str, float]:
    """The model's nv_inference_* counters (failures by reason), as /metrics has them."""
    reply = request(server.metrics_url, "GET", "/metrics")
    assert reply.status == 200
    out: dict[str, float] = {}
    for family in text_string_to_metric_families(reply.body.decode()):
        for sample in family.samples:
            name = sample.name.removesuffix("_total")
            if name.startswith("nv_inference_") and sample.labels.get("model") == model:
                reason = sample.labels.get("reason")
                out[f"{name}:{reason}" if reason else name] = float(sample.value)
    return out


def _stats(server: Server, model: str) -> dict[str, int]:
    reply = request(server.http_url, "GET", f"/v2/models/{model}/stats")
    assert reply.status == 200, reply.body
    (stats,) = reply.json()["model_stats"]
    inference = stats["inference_stats"]
    return {
        "success": inference["success"]["count"],
        "fail": inference["fail"]["count"],
        "inference_count": stats["inference_count"],
        "execution_count": stats["execution_count"],
        "last_inference": stats["last_inference"],
    }


def _history(server: Server, since: float) -> dict[str, Any]:
    reply = request(server.http_url, "GET", f"/v2/edged/metrics/history?since={since!r}")
    assert reply.status == 200, reply.body
    document: dict[str, Any] = reply.json()
    return document


def _quiet_point(server: Server) -> float:
    """The time of a history point taken after now: whatever completed before is counted at or before it."""
    after = time.time()
    deadline = time.monotonic() + WAIT_S
    while time.monotonic() < deadline:
        last = _history(server, after)["last"]
        if last is not None and last > after:
            return float(last)
        time.sleep(0.1)
    pytest.fail(f"the metrics history took no point in {WAIT_S:.0f} s")


def _counted(document: dict[str, Any], since: float, series: list[float | None]) -> int:
    """How many events a rate series holds: each point's rate over the time since the point before it."""
    times: list[float] = [since, *document["time"]]
    total = sum((rate or 0.0) * (times[i + 1] - times[i]) for i, rate in enumerate(series))
    return round(total)


def _wait_for_counts(server: Server, since: float, expected: dict[str, int]) -> dict[str, int]:
    """Polls the history after ``since`` until it holds at least the ``expected`` counts ("MODEL requests",
    "MODEL errors", "unknown errors"); the counts it held then."""
    deadline = time.monotonic() + WAIT_S
    while True:
        document = _history(server, since)
        counts = {"unknown errors": _counted(document, since, document["unknown_model_error_rate"])}
        for name, series in document["models"].items():
            counts[f"{name} requests"] = _counted(document, since, series["request_rate"])
            counts[f"{name} errors"] = _counted(document, since, series["error_rate"])
        if all(counts.get(key, 0) >= value for key, value in expected.items()) or time.monotonic() > deadline:
            return counts
        time.sleep(0.2)


# --- in the daemon ---------------------------------------------------------------------------------------------


def test_bad_requests_count_as_triton_counts_them_and_show_in_the_history(daemon: Server) -> None:
    since = _quiet_point(daemon)
    nv_before, stats_before = _nv(daemon, MODEL), _stats(daemon, MODEL)
    raises_before, raises_stats_before = _nv(daemon, RAISES), _stats(daemon, RAISES)
    with (
        httpclient.InferenceServerClient(daemon.http_url) as http_client,
        grpcclient.InferenceServerClient(daemon.grpc_url) as grpc_client,
    ):
        for _ in range(N):
            _missing_input(http_client)
            _missing_input(grpc_client)
        _unknown_model(http_client)
        _unknown_model(grpc_client)
        _raises(http_client)
        _raises(grpc_client)
    connection = http.client.HTTPConnection("127.0.0.1", daemon.http_port, timeout=30)
    try:
        _not_json(connection)
    finally:
        connection.close()

    # Triton's counters: the refused requests nowhere, the model that raised as BACKEND failures.
    assert _nv(daemon, MODEL) == nv_before
    assert _stats(daemon, MODEL) == stats_before
    assert _nv(daemon, "no_such_model") == {}
    raised = _nv(daemon, RAISES)
    assert raised["nv_inference_request_failure:BACKEND"] - raises_before["nv_inference_request_failure:BACKEND"] == 2
    assert raised["nv_inference_exec_count"] - raises_before["nv_inference_exec_count"] == 2
    assert raised["nv_inference_count"] == raises_before["nv_inference_count"]
    assert raised["nv_inference_request_success"] == raises_before["nv_inference_request_success"]
    for reason in ("REJECTED", "CANCELED", "OTHER"):
        key = f"nv_inference_request_failure:{reason}"
        assert raised[key] == raises_before[key]
    raised_stats = _stats(daemon, RAISES)
    assert raised_stats["fail"] - raises_stats_before["fail"] == 2
    assert raised_stats["execution_count"] - raises_stats_before["execution_count"] == 2
    assert raised_stats["success"] == raises_stats_before["success"]
    assert raised_stats["inference_count"] == raises_stats_before["inference_count"]

    # An error the model answers with is a success to Triton: its execution ended and the model answered.
    answered_before, answered_stats_before = _nv(daemon, RAISES), _stats(daemon, RAISES)
    with (
        httpclient.InferenceServerClient(daemon.http_url) as http_client,
        grpcclient.InferenceServerClient(daemon.grpc_url) as grpc_client,
    ):
        _answers_an_error(http_client)
        _answers_an_error(grpc_client)
    answered = _nv(daemon, RAISES)
    for key in ("nv_inference_request_success", "nv_inference_count", "nv_inference_exec_count"):
        assert answered[key] - answered_before[key] == 2, key
    for reason in ("REJECTED", "CANCELED", "BACKEND", "OTHER"):
        key = f"nv_inference_request_failure:{reason}"
        assert answered[key] == answered_before[key]
    answered_stats = _stats(daemon, RAISES)
    assert answered_stats["success"] - answered_stats_before["success"] == 2
    assert answered_stats["fail"] == answered_stats_before["fail"]

    # The history: every error a client saw, as a request of its model and an error; unknown models device-wide.
    refused = 2 * N + 1
    expected = {f"{MODEL} requests": refused, f"{MODEL} errors": refused, f"{RAISES} errors": 4, "unknown errors": 2}
    counts = _wait_for_counts(daemon, since, expected)
    assert {key: counts.get(key) for key in expected} == expected, counts
    assert counts[f"{RAISES} requests"] == 4, counts


@contextlib.contextmanager
def _bad_requests(server: Server, *, unknown: bool = False) -> Iterator[list[int]]:
    """A thread sending requests with an input missing (and, with ``unknown``, for no such model) until the block
    ends; yields [requests answered]."""
    stop = threading.Event()
    sent = [0]
    failures: list[BaseException] = []

    def send() -> None:
        try:
            with httpclient.InferenceServerClient(server.http_url) as client:
                while not stop.is_set():
                    _missing_input(client)
                    if unknown:
                        _unknown_model(client)
                    sent[0] += 1
                    stop.wait(0.02)
        except BaseException as error:
            failures.append(error)

    thread = threading.Thread(target=send, name="bad-requests", daemon=True)
    thread.start()
    try:
        yield sent
    finally:
        stop.set()
        thread.join(30)
    assert not failures, failures


def _models_row(table: str, model: str) -> list[str]:
    """The figures of the model's row in the console's models table: requests, p50, p99, errors."""
    for row in re.findall(r"<tr>(.*?)</tr>", table, re.S):
        if f">{model}</a></th>" in row:
            return [cell.strip() for cell in re.findall(r'<td class="num">(.*?)</td>', row, re.S)]
    pytest.fail(f"no row of {model} in the models table:\n{table}")


def _errors_shown(text: str) -> str | None:
    found = re.search(r'<span class="state state-unavailable">([^<]*) errors</span>', text)
    return found.group(1) if found else None


def test_the_console_shows_the_errors(daemon: Server) -> None:
    session = http_login(daemon.console_port, "vera")
    with _bad_requests(daemon) as sent:
        deadline = time.monotonic() + WAIT_S
        while True:
            status, _, overview = session.request("GET", "/overview/live")
            assert status == 200
            status, _, table = session.request("GET", "/models?part=table")
            assert status == 200
            shown, row = _errors_shown(overview), _models_row(table, MODEL)
            if (shown is not None and row[3] != "0/s") or time.monotonic() > deadline:
                break
            time.sleep(0.2)
    assert sent[0] > 0
    assert shown is not None and shown != "0/s", overview
    assert "no errors" not in overview
    # Every request the model had was an error: the rates the row shows are the same figure.
    requests, _p50, _p99, errors = row
    assert errors != "0/s" and errors == requests, row


def test_the_errors_chart_shows_them(daemon: Server, page: Page) -> None:
    browser_login(page, daemon.console_url, "vera")
    page.goto(f"{daemon.console_url}/metrics")
    with _bad_requests(daemon, unknown=True) as sent:
        page.wait_for_function(ERRORS_CHARTED, timeout=WAIT_S * 1000)
    assert sent[0] > 0
    labels = page.evaluate("() => window.edgedCharts.errors.labels")
    assert labels == [f"{MODEL} rejected", f"{MODEL} failed", f"{RAISES} rejected", f"{RAISES} failed", "no such model"]


# --- in a frontend worker ---------------------------------------------------------------------------------------


def _children(pid: int) -> list[int]:
    return [int(child) for child in Path(f"/proc/{pid}/task/{pid}/children").read_text().split()]


def _worker_pids(server: Server) -> set[int]:
    pids = set()
    for pid in _children(server.process.pid):
        with contextlib.suppress(OSError):
            if b"edged.daemon.worker" in Path(f"/proc/{pid}/cmdline").read_bytes():
                pids.add(pid)
    return pids


def _socket_inodes(pid: int | str) -> set[int]:
    inodes = set()
    with contextlib.suppress(OSError):
        for fd in Path(f"/proc/{pid}/fd").iterdir():
            with contextlib.suppress(OSError):
                target = fd.readlink().as_posix()
                if target.startswith("socket:["):
                    inodes.add(int(target[8:-1]))
    return inodes


def _serving_pids(server: Server, port: int) -> set[int]:
    """The daemon processes at the other end of this test process's connections to ``port``."""
    rows = []
    for table in ("/proc/net/tcp", "/proc/net/tcp6"):
        with contextlib.suppress(FileNotFoundError), open(table) as lines:
            next(lines)
            for line in lines:
                fields = line.split()
                if fields[3] == "01":  # ESTABLISHED
                    local, remote = (int(address.rsplit(":", 1)[1], 16) for address in fields[1:3])
                    rows.append((local, remote, int(fields[9])))
    mine = _socket_inodes("self")
    client_ports = {local for local, remote, inode in rows if remote == port and inode in mine}
    server_inodes = {inode for local, remote, inode in rows if local == port and remote in client_ports}
    return {pid for pid in [server.process.pid, *_children(server.process.pid)] if _socket_inodes(pid) & server_inodes}


def _on_a_worker(
    server: Server, port: int, connect: Callable[[], _Client], close: Callable[[_Client], None]
) -> _Client:
    """A client whose one connection a worker serves (the kernel gives each connection to one of the processes)."""
    workers = _worker_pids(server)
    assert len(workers) == WORKERS, workers
    for _ in range(60):
        client = connect()
        if _serving_pids(server, port) & workers:
            return client
        close(client)
    pytest.fail("none of 60 connections went to a frontend worker")


def test_errors_a_worker_answers_are_counted_by_the_daemon(repository: Path) -> None:
    with run_server([repository], f"--frontend-workers={WORKERS}", "--allow-console=false") as server:

        def connect_http() -> httpclient.InferenceServerClient:
            client = httpclient.InferenceServerClient(server.http_url)
            assert client.is_server_live()
            return client

        def connect_grpc() -> grpcclient.InferenceServerClient:
            # A subchannel of its own: grpc otherwise shares one connection among the clients of a process.
            client = grpcclient.InferenceServerClient(
                server.grpc_url, channel_args=[("grpc.use_local_subchannel_pool", 1)]
            )
            assert client.is_server_live()
            return client

        def connect_raw() -> http.client.HTTPConnection:
            connection = http.client.HTTPConnection("127.0.0.1", server.http_port, timeout=30)
            connection.request("GET", "/v2/health/live")
            connection.getresponse().read()
            return connection

        since = _quiet_point(server)
        nv_before, stats_before = _nv(server, MODEL), _stats(server, MODEL)
        http_client = _on_a_worker(server, server.http_port, connect_http, lambda c: c.close())
        grpc_client = _on_a_worker(server, server.grpc_port, connect_grpc, lambda c: c.close())
        raw = _on_a_worker(server, server.http_port, connect_raw, lambda c: c.close())
        try:
            for _ in range(N):
                _missing_input(http_client)  # refused by the daemon's service, which the worker relays to
                _missing_input(grpc_client)
            _unknown_model(http_client)  # refused by the worker itself: the daemon is told
            _unknown_model(grpc_client)
            _not_json(raw)
        finally:
            http_client.close()
            grpc_client.close()
            raw.close()

        assert _nv(server, MODEL) == nv_before
        assert _stats(server, MODEL) == stats_before
        refused = 2 * N + 1
        expected = {f"{MODEL} requests": refused, f"{MODEL} errors": refused, "unknown errors": 2}
        counts = _wait_for_counts(server, since, expected)
        assert {key: counts.get(key) for key in expected} == expected, counts
