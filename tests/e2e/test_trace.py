"""Triton's trace extension through the real daemon and clients: the settings over HTTP and gRPC (global and per
model, cleared with nulls), the errors Triton 2.51 answers for bad settings, and the JSON trace file: a request's
timestamps over either protocol, rate and count, child traces of ensemble steps and BLS calls, TENSORS, and the
file written at shutdown."""

from __future__ import annotations

import json
import shutil
import textwrap
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any, Final

import numpy as np
import pytest
import requests
import tritonclient.grpc as grpcclient
import tritonclient.http as httpclient
from conftest import PYTHON_MODELS
from server import Server, run_server
from tritonclient.utils import InferenceServerException

ENSEMBLE: Final = """
name: "doubler"
platform: "ensemble"
max_batch_size: 8
input [ { name: "X" data_type: TYPE_FP32 dims: [ 16 ] } ]
output [ { name: "Y" data_type: TYPE_FP32 dims: [ 16 ] } ]
ensemble_scheduling { step [
  { model_name: "add_sub_python" model_version: -1
    input_map { key: "INPUT0" value: "X" } input_map { key: "INPUT1" value: "X" }
    output_map { key: "OUTPUT0" value: "Y" } }
] }
"""
# A BLS model that passes its request's trace on, as Triton's documentation says to.
BLS_TRACED: Final = """
import triton_python_backend_utils as pb_utils


class TritonPythonModel:
    def execute(self, requests):
        responses = []
        for request in requests:
            call = pb_utils.InferenceRequest(
                model_name="add_sub_python",
                requested_output_names=["OUTPUT0"],
                inputs=[pb_utils.get_input_tensor_by_name(request, "INPUT0"),
                        pb_utils.get_input_tensor_by_name(request, "INPUT1")],
                trace=request.trace(),
            )
            response = call.exec()
            if response.has_error():
                raise pb_utils.TritonModelException(response.error().message())
            responses.append(pb_utils.InferenceResponse([pb_utils.get_output_tensor_by_name(response, "OUTPUT0")]))
        return responses
"""
BLS_CONFIG: Final = """
name: "bls_traced"
backend: "python"
max_batch_size: 0
input [
  { name: "INPUT0" data_type: TYPE_FP32 dims: [ 1, 16 ] },
  { name: "INPUT1" data_type: TYPE_FP32 dims: [ 1, 16 ] }
]
output [ { name: "OUTPUT0" data_type: TYPE_FP32 dims: [ 1, 16 ] } ]
"""
# What Triton records of a request over HTTP to a model that computes, in order.
HTTP_NAMES: Final = [
    "HTTP_RECV_START",
    "HTTP_RECV_END",
    "REQUEST_START",
    "QUEUE_START",
    "COMPUTE_START",
    "COMPUTE_INPUT_END",
    "COMPUTE_OUTPUT_START",
    "COMPUTE_END",
    "INFER_RESPONSE_COMPLETE",
    "REQUEST_END",
    "HTTP_SEND_START",
    "HTTP_SEND_END",
]
WAIT_S: Final = 30.0


def _repository(root: Path) -> Path:
    repo = root / "repo"
    shutil.copytree(PYTHON_MODELS / "add_sub_python", repo / "add_sub_python")
    (repo / "doubler" / "1").mkdir(parents=True)
    (repo / "doubler" / "config.pbtxt").write_text(textwrap.dedent(ENSEMBLE), encoding="utf-8")
    (repo / "bls_traced" / "1").mkdir(parents=True)
    (repo / "bls_traced" / "config.pbtxt").write_text(BLS_CONFIG, encoding="utf-8")
    (repo / "bls_traced" / "1" / "model.py").write_text(BLS_TRACED, encoding="utf-8")
    return repo


@pytest.fixture(scope="module")
def trace_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tmp_path_factory.mktemp("trace")


@pytest.fixture(scope="module")
def traced(trace_dir: Path) -> Iterator[Server]:
    repo = _repository(trace_dir)
    config = [f"triton,file={trace_dir / 'trace.json'}", "level=TIMESTAMPS", "rate=1", "log_frequency=1"]
    with run_server([repo], *(arg for entry in config for arg in ("--trace-config", entry))) as server:
        yield server


@pytest.fixture
def http(traced: Server) -> Iterator[httpclient.InferenceServerClient]:
    client = httpclient.InferenceServerClient(traced.http_url)
    # Every test starts from the settings the daemon started with, no model with its own.
    for model in ("add_sub_python", "doubler", "bls_traced"):
        client.update_trace_settings(
            model, {"trace_level": None, "trace_rate": None, "trace_count": None, "log_frequency": None}
        )
    client.update_trace_settings(
        settings={"trace_level": ["TIMESTAMPS"], "trace_rate": "1", "trace_count": "-1", "log_frequency": "1"}
    )
    yield client
    client.close()


@pytest.fixture
def grpc(traced: Server) -> Iterator[grpcclient.InferenceServerClient]:
    client = grpcclient.InferenceServerClient(f"127.0.0.1:{traced.grpc_port}")
    yield client
    client.close()


def _inputs(module: Any, shape: tuple[int, ...] = (1, 16)) -> list[Any]:
    data = np.arange(16, dtype=np.float32).reshape(shape)
    inputs = []
    for name in ("INPUT0", "INPUT1"):
        tensor = module.InferInput(name, list(shape), "FP32")
        tensor.set_data_from_numpy(data)
        inputs.append(tensor)
    return inputs


def _files(trace_dir: Path) -> set[Path]:
    return set(trace_dir.glob("trace.json.*"))


def _new_traces(trace_dir: Path, before: set[Path], count: int) -> list[dict[str, Any]]:
    """The objects of the ``count`` indexed files written since ``before``, waiting for them to appear."""
    deadline = time.monotonic() + WAIT_S
    while len(_files(trace_dir) - before) < count:
        assert time.monotonic() < deadline, f"{count} new trace files did not appear"
        time.sleep(0.05)
    objects: list[dict[str, Any]] = []
    for path in sorted(_files(trace_dir) - before, key=lambda p: int(p.suffix[1:])):
        objects += json.loads(path.read_text(encoding="utf-8"))
    return objects


def _by_id(objects: list[dict[str, Any]]) -> dict[int, tuple[dict[str, Any], list[tuple[str, int]]]]:
    """Each trace id: its model object and its timestamps in the order written."""
    traces: dict[int, tuple[dict[str, Any], list[tuple[str, int]]]] = {}
    for item in objects:
        model, stamps = traces.setdefault(item["id"], ({}, []))
        if "model_name" in item:
            model.update(item)
        for stamp in item.get("timestamps", []):
            stamps.append((stamp["name"], stamp["ns"]))
    return traces


def _assert_ordered(stamps: list[tuple[str, int]], names: list[str]) -> None:
    assert [name for name, _ in stamps] == names
    times = [ns for _, ns in stamps]
    assert times == sorted(times), stamps


# --- settings --------------------------------------------------------------------------------------------


def test_trace_is_an_extension(traced: Server) -> None:
    extensions = requests.get(f"http://{traced.http_url}/v2", timeout=10).json()["extensions"]
    assert extensions.index("trace") == extensions.index("statistics") + 1


def test_startup_settings_and_round_trips(
    http: httpclient.InferenceServerClient, grpc: grpcclient.InferenceServerClient, trace_dir: Path
) -> None:
    expected = {
        "trace_level": ["TIMESTAMPS"],
        "trace_rate": "1",
        "trace_count": "-1",
        "log_frequency": "1",
        "trace_file": str(trace_dir / "trace.json"),
        "trace_mode": "triton",
    }
    assert http.get_trace_settings() == expected
    assert http.get_trace_settings("add_sub_python") == expected
    # gRPC: each value a list of texts.
    grpc_settings = grpc.get_trace_settings(as_json=True)["settings"]
    assert {key: value["value"] for key, value in grpc_settings.items()} == {
        key: value if isinstance(value, list) else [value] for key, value in expected.items()
    }
    # A model's own rate; the rest still follows the global setting, which changes under it.
    updated = grpc.update_trace_settings("add_sub_python", {"trace_rate": "3"}, as_json=True)["settings"]
    assert updated["trace_rate"]["value"] == ["3"]
    http.update_trace_settings(settings={"trace_count": "7"})
    model = http.get_trace_settings("add_sub_python")
    assert (model["trace_rate"], model["trace_count"]) == ("3", "7")
    assert http.get_trace_settings()["trace_rate"] == "1"
    # Cleared (null over HTTP, no values over gRPC): the model follows the global setting again.
    assert http.update_trace_settings("add_sub_python", {"trace_rate": None})["trace_rate"] == "1"
    grpc.update_trace_settings("add_sub_python", {"log_frequency": "4"})
    cleared = grpc.update_trace_settings("add_sub_python", {"log_frequency": None}, as_json=True)["settings"]
    assert cleared["log_frequency"]["value"] == ["1"]
    # Clearing a global field goes back to what the daemon started with.
    http.update_trace_settings(settings={"trace_rate": "9"})
    assert http.update_trace_settings(settings={"trace_rate": None, "trace_count": None})["trace_rate"] == "1"
    # Triton reads numbers as std::stoi: digits first, the rest ignored; -1 wraps for the unsigned rate.
    assert http.update_trace_settings(settings={"trace_rate": "12abc"})["trace_rate"] == "12"
    assert http.update_trace_settings(settings={"trace_rate": "-1"})["trace_rate"] == "4294967295"


HTTP_ERRORS: Final = [
    ({"trace_rate": "abc"}, 400, "Unable to parse 'trace_rate', got: abc"),
    (
        {"trace_rate": "99999999999"},
        400,
        "Unable to parse 'trace_rate', value is out of range [ 0, 4294967295 ], got: 99999999999",
    ),
    ({"trace_rate": "0"}, 400, "Attempting to set invalid trace setting :sample rate must be non-zero"),
    ({"trace_rate": 5}, 500, "attempt to access JSON non-string as string"),
    ({"trace_count": "-2"}, 400, "Unable to parse 'trace_count'. Expecting value >= -1, got:-2"),
    ({"trace_count": "x"}, 400, "Unable to parse 'trace_count', got: x"),
    (
        {"trace_count": "99999999999"},
        400,
        "Unable to parse 'trace_count', value is out of range [ -1, 2147483647 ], got: 99999999999",
    ),
    ({"trace_count": "0"}, 400, "Attempting to set invalid trace setting :"),
    ({"log_frequency": "y"}, 400, "Unable to parse 'log_frequency', got: y"),
    ({"trace_level": ["OFF", "TIMESTAMPS"]}, 400, "Expect only one trace level 'OFF' is specified"),
    ({"trace_level": "TIMESTAMPS"}, 500, "attempt to access JSON non-array as array"),
    ({"trace_level": [1]}, 500, "attempt to access JSON non-string as string"),
    ({"trace_file": "/tmp/elsewhere.json"}, 501, "trace file location can not be updated through network protocol"),
]


@pytest.mark.parametrize(("body", "status", "error"), HTTP_ERRORS)
def test_bad_settings_over_http(
    http: httpclient.InferenceServerClient, traced: Server, body: dict[str, Any], status: int, error: str
) -> None:
    before = http.get_trace_settings()
    reply = requests.post(f"http://{traced.http_url}/v2/trace/setting", data=json.dumps(body), timeout=10)
    assert (reply.status_code, reply.json()) == (status, {"error": error})
    assert http.get_trace_settings() == before


def test_bad_settings_over_grpc(grpc: grpcclient.InferenceServerClient, http: httpclient.InferenceServerClient) -> None:
    cases = [
        ({"trace_rate": "abc"}, "StatusCode.INVALID_ARGUMENT", "Unable to parse 'trace_rate', got: abc"),
        ({"trace_rate": ["1", "2"]}, "StatusCode.INVALID_ARGUMENT", "expect only 1 value for 'trace_rate'"),
        (
            {"trace_count": "-5"},
            "StatusCode.INVALID_ARGUMENT",
            "Unable to parse 'trace_count'. Expecting value >= -1, got: -5",
        ),
        (
            {"trace_file": "x"},
            "StatusCode.UNIMPLEMENTED",
            "trace file location can not be updated through network protocol",
        ),
        (
            {"trace_level": ["OFF", "TENSORS"]},
            "StatusCode.INVALID_ARGUMENT",
            "Expect only one trace level 'OFF' is specified",
        ),
        (
            {"log_frequency": "99999999999"},
            "StatusCode.INVALID_ARGUMENT",
            "Unable to parse 'log_frequency', value is out of range [ 0, 4294967295 ], got: 99999999999",
        ),
    ]
    for settings, status, message in cases:
        with pytest.raises(InferenceServerException) as raised:
            grpc.update_trace_settings(settings=settings)
        assert (raised.value.status(), raised.value.message()) == (status, message), settings
    with pytest.raises(InferenceServerException) as raised:
        grpc.get_trace_settings("nowhere")
    assert raised.value.message() == "Request for unknown model : nowhere"
    with pytest.raises(InferenceServerException, match="Request for unknown model : nowhere"):
        http.update_trace_settings("nowhere", {"trace_rate": "2"})


def test_tracing_off_without_a_file(python_client: httpclient.InferenceServerClient) -> None:
    """A daemon started without --trace-config: Triton's defaults, and no level may be set without a file."""
    assert python_client.get_trace_settings() == {
        "trace_level": ["OFF"],
        "trace_rate": "1000",
        "trace_count": "-1",
        "log_frequency": "0",
        "trace_file": "",
        "trace_mode": "triton",
    }
    with pytest.raises(InferenceServerException, match="trace file name is not given"):
        python_client.update_trace_settings(settings={"trace_level": ["TIMESTAMPS"]})


# --- the trace file --------------------------------------------------------------------------------------


def test_http_request_timestamps(http: httpclient.InferenceServerClient, trace_dir: Path) -> None:
    before = _files(trace_dir)
    http.infer("add_sub_python", _inputs(httpclient), request_id="traced-1")
    traces = _by_id(_new_traces(trace_dir, before, 1))
    assert len(traces) == 1
    (model, stamps), *_ = traces.values()
    assert model == {"id": model["id"], "model_name": "add_sub_python", "model_version": 1, "request_id": "traced-1"}
    _assert_ordered(stamps, HTTP_NAMES)


def test_grpc_request_timestamps(
    http: httpclient.InferenceServerClient, grpc: grpcclient.InferenceServerClient, trace_dir: Path
) -> None:
    before = _files(trace_dir)
    grpc.infer("add_sub_python", _inputs(grpcclient))
    (model, stamps), *_ = _by_id(_new_traces(trace_dir, before, 1)).values()
    assert "request_id" not in model and model["model_name"] == "add_sub_python"
    names = ["GRPC_WAITREAD_START", "GRPC_WAITREAD_END", *HTTP_NAMES[2:-2], "GRPC_SEND_START", "GRPC_SEND_END"]
    _assert_ordered(stamps, names)


def test_rate_and_count(http: httpclient.InferenceServerClient, trace_dir: Path) -> None:
    http.update_trace_settings(settings={"trace_rate": "2", "trace_count": "2"})
    before = _files(trace_dir)
    for _ in range(7):
        http.infer("add_sub_python", _inputs(httpclient))
    # Requests 2 and 4 are traced; then the count is spent, and Triton reports what is left.
    traces = _by_id(_new_traces(trace_dir, before, 2))
    assert len(traces) == 2
    assert http.get_trace_settings()["trace_count"] == "0"
    assert len(_files(trace_dir) - before) == 2


def test_ensemble_steps_are_child_traces(http: httpclient.InferenceServerClient, trace_dir: Path) -> None:
    before = _files(trace_dir)
    data = httpclient.InferInput("X", [1, 16], "FP32")
    data.set_data_from_numpy(np.ones((1, 16), dtype=np.float32))
    http.infer("doubler", [data])
    traces = _by_id(_new_traces(trace_dir, before, 1))
    parents = [(tid, stamps) for tid, (model, stamps) in traces.items() if model["model_name"] == "doubler"]
    children = [(model, stamps) for model, stamps in traces.values() if model["model_name"] == "add_sub_python"]
    assert len(parents) == 1 and len(children) == 1
    parent_id, parent_stamps = parents[0]
    # The ensemble computes nothing itself; its step does, inside the ensemble's request.
    _assert_ordered(parent_stamps, [n for n in HTTP_NAMES if not n.startswith("COMPUTE")])
    child, child_stamps = children[0]
    assert child["parent_id"] == parent_id
    _assert_ordered(child_stamps, [n for n in HTTP_NAMES[2:-2] if n != "INFER_RESPONSE_COMPLETE"])
    assert dict(parent_stamps)["REQUEST_START"] <= child_stamps[0][1]
    assert child_stamps[-1][1] <= dict(parent_stamps)["REQUEST_END"]


def test_bls_call_is_a_child_trace(http: httpclient.InferenceServerClient, trace_dir: Path) -> None:
    before = _files(trace_dir)
    http.infer("bls_traced", _inputs(httpclient))
    traces = _by_id(_new_traces(trace_dir, before, 1))
    ids = {model["model_name"]: tid for tid, (model, _) in traces.items()}
    assert set(ids) == {"bls_traced", "add_sub_python"}
    child, stamps = traces[ids["add_sub_python"]]
    assert child["parent_id"] == ids["bls_traced"]
    _assert_ordered(stamps, [n for n in HTTP_NAMES[2:-2] if n != "INFER_RESPONSE_COMPLETE"])


def test_model_setting_overrides_the_global_one(http: httpclient.InferenceServerClient, trace_dir: Path) -> None:
    http.update_trace_settings(settings={"trace_level": ["OFF"]})
    http.update_trace_settings("add_sub_python", {"trace_level": ["TIMESTAMPS"]})
    before = _files(trace_dir)
    data = httpclient.InferInput("X", [1, 16], "FP32")
    data.set_data_from_numpy(np.ones((1, 16), dtype=np.float32))
    http.infer("doubler", [data])  # follows the global setting: not traced
    http.infer("add_sub_python", _inputs(httpclient))
    traces = _by_id(_new_traces(trace_dir, before, 1))
    assert [model["model_name"] for model, _ in traces.values()] == ["add_sub_python"]
    # Cleared, the model follows the global setting again: off.
    assert http.update_trace_settings("add_sub_python", {"trace_level": None})["trace_level"] == ["OFF"]
    http.infer("add_sub_python", _inputs(httpclient))
    http.update_trace_settings(settings={"trace_level": ["TIMESTAMPS"]})
    http.infer("doubler", [data])
    traces = _by_id(_new_traces(trace_dir, before, 2))
    assert sorted(model["model_name"] for model, _ in traces.values()) == [
        "add_sub_python",
        "add_sub_python",
        "doubler",
    ]


def test_tensors_level(http: httpclient.InferenceServerClient, trace_dir: Path) -> None:
    http.update_trace_settings("add_sub_python", {"trace_level": ["TENSORS"]})
    before = _files(trace_dir)
    http.infer("add_sub_python", _inputs(httpclient))
    objects = _new_traces(trace_dir, before, 1)
    # TENSORS alone: no timestamps, as in Triton; the inputs as queued and the outputs as the backend gave them.
    assert [(o["activity"], o["tensor"]["name"]) for o in objects] == [
        ("TENSOR_QUEUE_INPUT", "INPUT0"),
        ("TENSOR_QUEUE_INPUT", "INPUT1"),
        ("TENSOR_BACKEND_OUTPUT", "OUTPUT0"),
        ("TENSOR_BACKEND_OUTPUT", "OUTPUT1"),
    ]
    assert objects[2]["tensor"] == {
        "name": "OUTPUT0",
        "data": ",".join(str(2 * i) for i in range(16)),
        "shape": "1,16",
        "dtype": "FP32",
    }


def test_log_frequency_zero_writes_the_file_at_shutdown(tmp_path: Path) -> None:
    repo = _repository(tmp_path)
    trace_file = tmp_path / "all.json"
    args = ["--trace-config", f"triton,file={trace_file}", "--trace-config", "level=TIMESTAMPS"]
    with run_server([repo], *args, "--trace-config", "rate=2") as server:
        client = httpclient.InferenceServerClient(server.http_url)
        for _ in range(6):
            client.infer("add_sub_python", _inputs(httpclient))
        client.close()
    traces = _by_id(json.loads(trace_file.read_text(encoding="utf-8")))
    assert len(traces) == 3
    for _, stamps in traces.values():
        _assert_ordered(stamps, HTTP_NAMES)
    assert not list(tmp_path.glob("all.json.*"))
