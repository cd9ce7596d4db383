"""A client that gives up stops the work done for it: an onnxruntime execution is terminated, not finished, and a
Python-backend model sees ``request.is_cancelled()``, whether the client cancels a gRPC call or closes its HTTP
connection before the answer."""

from __future__ import annotations

import http.client
import json
import time
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import onnx
import pytest
import tritonclient.grpc as grpcclient
import tritonclient.http as httpclient
from onnx import TensorProto, helper, numpy_helper
from server import Server, run_server
from tritonclient.utils import InferenceServerException

# Enough matrix products that one execution takes seconds on a small machine.
PRODUCTS = 60
WIDTH = 1024
ROWS = 512
# How long an HTTP client waits before it hangs up: its request must have reached the model by then, or the request
# is cancelled before the model runs and the model has nothing to see.
HANG_UP_AFTER_S = 0.5
TIMEOUT_S = 30.0


def _write_slow_model(model_dir: Path) -> None:
    weight = numpy_helper.from_array(np.eye(WIDTH, dtype=np.float32), "weight")
    nodes = [
        helper.make_node(
            "MatMul", ["INPUT0" if i == 0 else f"t{i}", "weight"], [f"t{i + 1}" if i + 1 < PRODUCTS else "OUTPUT0"]
        )
        for i in range(PRODUCTS)
    ]
    graph = helper.make_graph(
        nodes,
        "slow",
        [helper.make_tensor_value_info("INPUT0", TensorProto.FLOAT, [ROWS, WIDTH])],
        [helper.make_tensor_value_info("OUTPUT0", TensorProto.FLOAT, [ROWS, WIDTH])],
        [weight],
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 8
    (model_dir / "1").mkdir(parents=True)
    onnx.save(model, str(model_dir / "1" / "model.onnx"))
    (model_dir / "config.pbtxt").write_text(
        'platform: "onnxruntime_onnx"\n'
        "max_batch_size: 0\n"
        "instance_group [ { kind: KIND_CPU count: 1 } ]\n"
        # Graph optimizations would fold the identity products away.
        "optimization { graph { level: 2 } }\n",
        encoding="utf-8",
    )


@pytest.fixture(scope="module")
def slow_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Server]:
    repo = tmp_path_factory.mktemp("slow-repository")
    _write_slow_model(repo / "slow")
    with run_server([repo]) as running:
        yield running


def _counts(client: grpcclient.InferenceServerClient) -> tuple[int, int, int]:
    stats = client.get_inference_statistics("slow", as_json=True)["model_stats"][0]
    inference = stats["inference_stats"]
    return (
        int(stats.get("execution_count", 0)),
        int(inference["success"].get("count", 0)),
        int(inference["fail"].get("count", 0)),
    )


def test_a_cancelled_request_terminates_its_execution(slow_server: Server) -> None:
    client = grpcclient.InferenceServerClient(slow_server.grpc_url)
    tensor = grpcclient.InferInput("INPUT0", [ROWS, WIDTH], "FP32")
    tensor.set_data_from_numpy(np.ones((ROWS, WIDTH), dtype=np.float32))
    with pytest.raises(InferenceServerException) as caught:
        # The deadline passes long before the products are done; gRPC then cancels the call on the server.
        client.infer("slow", [tensor], client_timeout=0.3)
    assert "Deadline" in str(caught.value)
    deadline = time.monotonic() + 120
    while _counts(client)[0] == 0:
        assert time.monotonic() < deadline, "the execution never ended"
        time.sleep(0.05)
    executions, successes, failures = _counts(client)
    # Finished, it would count as a success; terminated, it fails.
    assert (executions, successes, failures) == (1, 0, 1)
    # The instance is free again and serves the next request in full.
    result = client.infer("slow", [tensor])
    output = result.as_numpy("OUTPUT0")
    assert output is not None and output.shape == (ROWS, WIDTH)
    client.close()


def _hang_up_on(server: Server, model: str, body: bytes, headers: dict[str, str]) -> None:
    """Sends one infer request, then closes the connection without reading the answer."""
    host, _, port = server.http_url.rpartition(":")
    conn = http.client.HTTPConnection(host, int(port), timeout=TIMEOUT_S)
    try:
        conn.request("POST", f"/v2/models/{model}/infer", body, headers)
        time.sleep(HANG_UP_AFTER_S)
    finally:
        conn.close()


def test_an_http_client_that_hangs_up_cancels_its_request(python_server: Server) -> None:
    log_before = len(python_server.log())
    body = {"id": "h1", "inputs": [{"name": "MODE", "shape": [1], "datatype": "BYTES", "data": ["wait_cancel"]}]}
    _hang_up_on(python_server, "misbehave", json.dumps(body).encode(), {"Content-Type": "application/json"})
    deadline = time.monotonic() + TIMEOUT_S
    while "request 'h1' cancelled:" not in python_server.log()[log_before:]:
        assert time.monotonic() < deadline, "the model never reported whether it saw the cancellation"
        time.sleep(0.05)
    log = python_server.log()[log_before:]
    # Without the cancellation the model would wait out its 10 s and log False.
    assert "request 'h1' cancelled: True" in log
    # A client going away is no error of the daemon's, and the daemon goes on serving.
    assert " ERROR " not in log and "Exception in ASGI application" not in log
    client = httpclient.InferenceServerClient(python_server.http_url, network_timeout=TIMEOUT_S)
    mode = httpclient.InferInput("MODE", [1], "BYTES")
    mode.set_data_from_numpy(np.array([b"ok"], dtype=np.object_))
    result = client.infer("misbehave", [mode])
    assert result.as_numpy("OUT") is not None
    client.close()
