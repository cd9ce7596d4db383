"""A client that gives up stops the work done for it: an onnxruntime execution is terminated, not finished, and a
Python-backend model sees ``request.is_cancelled()``, whether the client cancels a gRPC call or closes its HTTP
connection before the answer."""

from __future__ import annotations

import http.client
import json
import queue
import re
import time
from collections.abc import Iterator
from functools import partial
from pathlib import Path
from typing import Any

import httpx
import numpy as np
import onnx
import pytest
import tritonclient.grpc as grpcclient
import tritonclient.http as httpclient
from onnx import TensorProto, helper
from server import Server, run_server
from tritonclient.utils import InferenceServerException

# Loop iterations that no machine finishes: a run of the spinning model ends only when it is terminated.
FOREVER = 10**15
TIMEOUT_S = 30.0


def _write_spinning_model(model_dir: Path) -> None:
    """A model whose one Loop runs TRIPS times: a request with FOREVER trips holds the instance until onnxruntime
    terminates the run, one with a single trip answers at once."""
    body = helper.make_graph(
        [helper.make_node("Identity", ["cond_in"], ["cond_out"]), helper.make_node("Mul", ["x_in", "one"], ["x_out"])],
        "spin",
        [
            helper.make_tensor_value_info("iteration", TensorProto.INT64, []),
            helper.make_tensor_value_info("cond_in", TensorProto.BOOL, []),
            helper.make_tensor_value_info("x_in", TensorProto.FLOAT, None),
        ],
        [
            helper.make_tensor_value_info("cond_out", TensorProto.BOOL, []),
            helper.make_tensor_value_info("x_out", TensorProto.FLOAT, None),
        ],
        [helper.make_tensor("one", TensorProto.FLOAT, [], [1.0])],
    )
    always = helper.make_tensor("always", TensorProto.BOOL, [], [True])
    graph = helper.make_graph(
        [
            helper.make_node("Constant", [], ["cond"], value=always),
            helper.make_node("Loop", ["TRIPS", "cond", "INPUT0"], ["OUTPUT0"], body=body),
        ],
        "spinning",
        [
            helper.make_tensor_value_info("TRIPS", TensorProto.INT64, [1]),
            helper.make_tensor_value_info("INPUT0", TensorProto.FLOAT, [4]),
        ],
        [helper.make_tensor_value_info("OUTPUT0", TensorProto.FLOAT, [4])],
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 8
    (model_dir / "1").mkdir(parents=True)
    onnx.save(model, str(model_dir / "1" / "model.onnx"))
    (model_dir / "config.pbtxt").write_text(
        'platform: "onnxruntime_onnx"\nmax_batch_size: 0\ninstance_group [ { kind: KIND_CPU count: 1 } ]\n',
        encoding="utf-8",
    )


@pytest.fixture(scope="module")
def spinning_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Server]:
    repo = tmp_path_factory.mktemp("spinning-repository")
    _write_spinning_model(repo / "spin")
    with run_server([repo]) as running:
        yield running


def _spin_inputs(trips: int) -> list[grpcclient.InferInput]:
    count = grpcclient.InferInput("TRIPS", [1], "INT64")
    count.set_data_from_numpy(np.array([trips], dtype=np.int64))
    tensor = grpcclient.InferInput("INPUT0", [4], "FP32")
    tensor.set_data_from_numpy(np.ones(4, dtype=np.float32))
    return [count, tensor]


def _stats(client: grpcclient.InferenceServerClient) -> dict[str, Any]:
    stats: dict[str, Any] = client.get_inference_statistics("spin", as_json=True)["model_stats"][0]
    return stats


def _pending(server: Server) -> int:
    for line in httpx.get(f"http://{server.metrics_url}/metrics", timeout=TIMEOUT_S).text.splitlines():
        if line.startswith('nv_inference_pending_request_count{model="spin"'):
            return int(float(line.rsplit(" ", 1)[1]))
    return 0


def test_a_cancelled_request_terminates_its_execution(spinning_server: Server) -> None:
    client = grpcclient.InferenceServerClient(spinning_server.grpc_url)
    answers: queue.Queue[Any] = queue.Queue()
    # Two endless requests for one instance: once one waits (pending), the other is surely executing, and
    # neither can finish on its own, so only the cancellation ends them, on any machine.
    calls = [
        client.async_infer("spin", _spin_inputs(FOREVER), partial(lambda q, result, error: q.put(error), answers))
        for _ in range(2)
    ]
    try:
        deadline = time.monotonic() + TIMEOUT_S
        while _pending(spinning_server) != 1:
            assert time.monotonic() < deadline, "the two requests never reached the model"
            time.sleep(0.05)
    finally:
        for call in calls:
            call.cancel()
    for _ in calls:
        error = answers.get(timeout=TIMEOUT_S)
        assert isinstance(error, InferenceServerException) and "CANCELLED" in str(error.status())
    deadline = time.monotonic() + TIMEOUT_S
    while int(_stats(client)["inference_stats"]["fail"].get("count", 0)) < 2:
        assert time.monotonic() < deadline, "the executions never ended"
        time.sleep(0.05)
    stats = _stats(client)
    # Finished, an execution would count as a success; terminated, it fails. The request that waited may have
    # started before its cancellation arrived (then it was terminated too) or not (then it never executed).
    assert int(stats["inference_stats"]["success"].get("count", 0)) == 0
    assert int(stats["inference_stats"]["fail"]["count"]) == 2
    assert 1 <= int(stats.get("execution_count", 0)) <= 2
    # The instance is free again and serves the next request in full.
    result = client.infer("spin", _spin_inputs(1), client_timeout=TIMEOUT_S)
    output = result.as_numpy("OUTPUT0")
    assert output is not None and output.tolist() == [1.0] * 4
    client.close()


def _hang_up_on(server: Server, model: str, body: bytes, headers: dict[str, str], running: str) -> None:
    """Sends one infer request, then, once the daemon's log shows ``running`` (the model has it), closes the
    connection without reading the answer."""
    log_before = len(server.log())
    host, _, port = server.http_url.rpartition(":")
    conn = http.client.HTTPConnection(host, int(port), timeout=TIMEOUT_S)
    try:
        conn.request("POST", f"/v2/models/{model}/infer", body, headers)
        deadline = time.monotonic() + TIMEOUT_S
        while running not in server.log()[log_before:]:
            assert time.monotonic() < deadline, "the request never reached the model"
            time.sleep(0.05)
    finally:
        conn.close()


def test_an_http_client_that_hangs_up_cancels_its_request(python_server: Server) -> None:
    log_before = len(python_server.log())
    body = {"id": "h1", "inputs": [{"name": "MODE", "shape": [1], "datatype": "BYTES", "data": ["wait_cancel"]}]}
    headers = {"Content-Type": "application/json"}
    _hang_up_on(
        python_server, "misbehave", json.dumps(body).encode(), headers, "request 'h1' waits for its cancellation"
    )
    deadline = time.monotonic() + TIMEOUT_S
    while "request 'h1' cancelled:" not in python_server.log()[log_before:]:
        assert time.monotonic() < deadline, "the model never reported whether it saw the cancellation"
        time.sleep(0.05)
    log = python_server.log()[log_before:]
    # Without the cancellation the model would wait out its deadline and log False.
    assert "request 'h1' cancelled: True" in log
    # A client going away is no error of the daemon's, and the daemon goes on serving.
    assert not re.search(r"^E\d{4} ", log, re.MULTILINE) and "Exception in ASGI application" not in log
    client = httpclient.InferenceServerClient(python_server.http_url, network_timeout=TIMEOUT_S)
    mode = httpclient.InferInput("MODE", [1], "BYTES")
    mode.set_data_from_numpy(np.array([b"ok"], dtype=np.object_))
    result = client.infer("misbehave", [mode])
    assert result.as_numpy("OUT") is not None
    client.close()
