"""Stateful sequences through the real daemon and tritonclient: control inputs as Triton gives them, state per
correlation id across interleaved sequences (HTTP and a gRPC stream), START/END and idle release with Triton's
errors, sequences pinned to their instance (direct) or batched together (oldest)."""

from __future__ import annotations

import json
import queue
import shutil
import textwrap
import time
import uuid
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any, Final

import gevent  # type: ignore[import-untyped, unused-ignore]
import numpy as np
import pytest
import tritonclient.grpc as grpcclient
import tritonclient.http as httpclient
from conftest import PYTHON_MODELS
from server import Server, post_json, request, run_server
from tritonclient.utils import InferenceServerException

ACCUMULATOR: Final = """
import json
import os
import time

import numpy as np
import triton_python_backend_utils as pb_utils


class TritonPythonModel:
    def initialize(self, args):
        self.totals = {}
        self.folder = args["model_repository"]

    def execute(self, requests):
        responses = []
        for request in requests:
            x = pb_utils.get_input_tensor_by_name(request, "INPUT").as_numpy()
            start = pb_utils.get_input_tensor_by_name(request, "START").as_numpy()
            end = pb_utils.get_input_tensor_by_name(request, "END").as_numpy()
            ready = pb_utils.get_input_tensor_by_name(request, "READY").as_numpy()
            corrid = pb_utils.get_input_tensor_by_name(request, "CORRID").as_numpy()
            key = corrid.reshape(-1)[0]
            key = key.decode() if isinstance(key, bytes) else int(key)
            if start.reshape(-1)[0]:
                self.totals[key] = 0
            self.totals[key] = self.totals.get(key, 0) + int(x.reshape(-1)[0])
            if int(x.reshape(-1)[0]) == 99:
                # Keeps the instance busy until the test lets it go (a file in the model's folder), so that
                # other requests queue behind it however slow the machine; the deadline only ends a failed test.
                release = os.path.join(self.folder, f"release-{key}")
                pb_utils.Logger.log_info(f"sequence {key} holds its instance until {release} exists")
                deadline = time.monotonic() + 120
                while not os.path.exists(release) and time.monotonic() < deadline:
                    time.sleep(0.01)
            info = {
                "start": start.tolist(), "end": end.tolist(), "ready": ready.tolist(),
                "corrid": corrid.tolist() if corrid.dtype != object else [[corrid.reshape(-1)[0].decode()]],
                "dtypes": [str(start.dtype), str(end.dtype), str(ready.dtype), str(corrid.dtype)],
                "shapes": [list(start.shape), list(corrid.shape)], "n": len(requests), "pid": os.getpid(),
                "rows": [
                    [bool(pb_utils.get_input_tensor_by_name(r, "READY").as_numpy().reshape(-1)[0]),
                     int(pb_utils.get_input_tensor_by_name(r, "CORRID").as_numpy().reshape(-1)[0]),
                     int(pb_utils.get_input_tensor_by_name(r, "INPUT").as_numpy().reshape(-1)[0])]
                    for r in requests
                ] if corrid.dtype != object else [],
            }
            out = pb_utils.Tensor("OUTPUT", np.array([[self.totals[key]]], dtype=np.int32))
            responses.append(pb_utils.InferenceResponse([out], parameters={"info": json.dumps(info)}))
        return responses
"""
CONFIG: Final = """
max_batch_size: 4
input [ { name: "INPUT" data_type: TYPE_INT32 dims: [ 1 ] } ]
output [ { name: "OUTPUT" data_type: TYPE_INT32 dims: [ 1 ] } ]
sequence_batching {
  %(strategy)s
  max_sequence_idle_microseconds: %(idle)d
  control_input [
    { name: "START" control [ { kind: CONTROL_SEQUENCE_START int32_false_true: [ 0, 1 ] } ] },
    { name: "END" control [ { kind: CONTROL_SEQUENCE_END fp32_false_true: [ 0, 1 ] } ] },
    { name: "READY" control [ { kind: CONTROL_SEQUENCE_READY bool_false_true: [ false, true ] } ] },
    { name: "CORRID" control [ { kind: CONTROL_SEQUENCE_CORRID data_type: %(corrid)s } ] }
  ]
}
instance_group [ { count: %(count)d kind: KIND_CPU } ]
"""
# Idle times and a queue delay that no test waits out (a minute: a bound, not a measurement); acc_idle's is short.
LONG_US: Final = 60_000_000
MODELS: Final[dict[str, dict[str, Any]]] = {
    "acc": {"strategy": "", "idle": LONG_US, "corrid": "TYPE_UINT64", "count": 2},
    "acc_strings": {"strategy": "", "idle": LONG_US, "corrid": "TYPE_STRING", "count": 1},
    "acc_idle": {"strategy": "", "idle": 300_000, "corrid": "TYPE_UINT64", "count": 1},
    "acc_slots": {"strategy": "", "idle": LONG_US, "corrid": "TYPE_UINT64", "count": 1},
    "acc_delay": {
        "strategy": "oldest { max_candidate_sequences: 4 preferred_batch_size: [ 3 ] "
        f"max_queue_delay_microseconds: {LONG_US} }}",
        "idle": LONG_US,
        "corrid": "TYPE_UINT64",
        "count": 1,
    },
    "acc_direct_delay": {
        "strategy": f"direct {{ max_queue_delay_microseconds: {LONG_US} minimum_slot_utilization: 0.5 }}",
        "idle": LONG_US,
        "corrid": "TYPE_UINT64",
        "count": 1,
    },
    "acc_oldest": {
        "strategy": "oldest { max_candidate_sequences: 4 }",
        "idle": LONG_US,
        "corrid": "TYPE_UINT64",
        "count": 1,
    },
}
WAIT_S: Final = 60.0


ONNX_CONFIG: Final = """name: "acc_onnx"
platform: "onnxruntime_onnx"
max_batch_size: 4
input [ { name: "INPUT" data_type: TYPE_INT32 dims: [ 1 ] } ]
output [ { name: "OUTPUT" data_type: TYPE_INT32 dims: [ 1 ] } ]
sequence_batching {
  state [ { input_name: "STATE_IN" output_name: "STATE_OUT" data_type: TYPE_INT32 dims: [ 1 ]
            initial_state: { data_type: TYPE_INT32 dims: [ 1 ] zero_data: true name: "zeros" } } ]
}
"""


def _write_onnx_accumulator(model_dir: Path, name: str = "acc_onnx", initial: bytes | None = None) -> None:
    """OUTPUT = STATE_OUT = INPUT + STATE_IN: the running total lives in the implicit state, not in the graph."""
    import onnx
    from onnx import TensorProto, helper

    shape: list[int | str] = ["batch", 1]
    graph = helper.make_graph(
        [
            helper.make_node("Add", ["INPUT", "STATE_IN"], ["OUTPUT"]),
            helper.make_node("Identity", ["OUTPUT"], ["STATE_OUT"]),
        ],
        "accumulator",
        [
            helper.make_tensor_value_info("INPUT", TensorProto.INT32, shape),
            helper.make_tensor_value_info("STATE_IN", TensorProto.INT32, shape),
        ],
        [
            helper.make_tensor_value_info("OUTPUT", TensorProto.INT32, shape),
            helper.make_tensor_value_info("STATE_OUT", TensorProto.INT32, shape),
        ],
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 8
    (model_dir / "1").mkdir(parents=True)
    onnx.save(model, str(model_dir / "1" / "model.onnx"))
    config = ONNX_CONFIG.replace('"acc_onnx"', f'"{name}"')
    if initial is not None:
        # Triton's layout: the state's first value, row-major, in the model folder's initial_state/.
        (model_dir / "initial_state").mkdir()
        (model_dir / "initial_state" / "start.bin").write_bytes(initial)
        config = config.replace("zero_data: true", 'data_file: "start.bin"')
    (model_dir / "config.pbtxt").write_text(config, encoding="utf-8")


@pytest.fixture(scope="module")
def sequence_repository(tmp_path_factory: pytest.TempPathFactory) -> Path:
    repo = tmp_path_factory.mktemp("sequences")
    _write_onnx_accumulator(repo / "acc_onnx")
    _write_onnx_accumulator(repo / "acc_from_1000", "acc_from_1000", np.array([1000], dtype=np.int32).tobytes())
    _write_onnx_accumulator(repo / "acc_bad_initial", "acc_bad_initial", b"\x01\x02")
    for name, values in MODELS.items():
        (repo / name / "1").mkdir(parents=True)
        (repo / name / "1" / "model.py").write_text(ACCUMULATOR, encoding="utf-8")
        (repo / name / "config.pbtxt").write_text(
            f'name: "{name}"\nbackend: "python"\n' + textwrap.dedent(CONFIG % values), encoding="utf-8"
        )
    shutil.copytree(PYTHON_MODELS / "simple_sequence", repo / "simple_sequence")
    config = repo / "simple_sequence" / "config.pbtxt"
    idle = "max_sequence_idle_microseconds: 5000000"
    assert idle in config.read_text(encoding="utf-8")
    config.write_text(
        config.read_text(encoding="utf-8").replace(idle, f"max_sequence_idle_microseconds: {LONG_US}"),
        encoding="utf-8",
    )
    return repo


@pytest.fixture(scope="module")
def sequence_server(sequence_repository: Path) -> Iterator[Server]:
    with run_server([sequence_repository]) as server:
        yield server


def _wait_until(what: str, condition: Callable[[], bool]) -> None:
    deadline = time.monotonic() + WAIT_S
    while not condition():
        assert time.monotonic() < deadline, f"timed out waiting until {what}"
        # gevent's sleep: the HTTP client's async requests are greenlets, sent only while this one yields.
        gevent.sleep(0.02)


def _pending(server: Server, model: str) -> int:
    """Requests the model's sequence batcher holds that no instance runs yet."""
    reply = request(server.metrics_url, "GET", "/metrics")
    for line in reply.body.decode().splitlines():
        if line.startswith(f'nv_inference_pending_request_count{{model="{model}"'):
            return int(float(line.rsplit(" ", 1)[1]))
    raise AssertionError(f"no pending request count for {model}")


def _holding(server: Server, sequence: int) -> Callable[[], bool]:
    """Whether the accumulator holds its instance for ``sequence`` (it was sent 99, and logs it)."""
    return lambda: f"sequence {sequence} holds its instance until " in server.log()


def _inputs(value: int) -> list[httpclient.InferInput]:
    tensor = httpclient.InferInput("INPUT", [1, 1], "INT32")
    tensor.set_data_from_numpy(np.array([[value]], dtype=np.int32))
    return [tensor]


def _send(
    client: httpclient.InferenceServerClient, model: str, sequence: int | str, value: int, **flags: bool
) -> tuple[int, dict[str, Any]]:
    result = client.infer(model, _inputs(value), sequence_id=sequence, **flags)
    info = json.loads(result.get_response()["parameters"]["info"])
    return int(result.as_numpy("OUTPUT")[0, 0]), info


def test_control_inputs_are_what_triton_gives(sequence_server: Server) -> None:
    client = httpclient.InferenceServerClient(sequence_server.http_url)
    total, info = _send(client, "acc", 7, 5, sequence_start=True)
    assert total == 5
    # As Triton 2.51 fills them for this config (checked against it).
    assert info["start"] == [[1]] and info["end"] == [[0.0]] and info["ready"] == [[True]]
    assert info["corrid"] == [[7]]
    assert info["dtypes"] == ["int32", "float32", "bool", "uint64"]
    assert info["shapes"] == [[1, 1], [1, 1]]
    total, info = _send(client, "acc", 7, 6, sequence_end=True)
    assert total == 11
    assert info["start"] == [[0]] and info["end"] == [[1.0]]


def test_interleaved_sequences_keep_their_own_state(sequence_server: Server) -> None:
    client = httpclient.InferenceServerClient(sequence_server.http_url)
    assert _send(client, "acc", 101, 1, sequence_start=True)[0] == 1
    assert _send(client, "acc", 102, 10, sequence_start=True)[0] == 10
    assert _send(client, "acc", 101, 2)[0] == 3
    assert _send(client, "acc", 102, 20)[0] == 30
    first_pid = _send(client, "acc", 101, 3)[1]["pid"]
    assert _send(client, "acc", 102, 30, sequence_end=True)[0] == 60
    # Direct strategy: a sequence stays on the instance it started on.
    total, info = _send(client, "acc", 101, 4, sequence_end=True)
    assert total == 10 and info["pid"] == first_pid


def test_string_correlation_ids(sequence_server: Server) -> None:
    client = httpclient.InferenceServerClient(sequence_server.http_url)
    assert _send(client, "acc_strings", "device-a", 1, sequence_start=True)[0] == 1
    total, info = _send(client, "acc_strings", "device-a", 2, sequence_end=True)
    assert total == 3 and info["corrid"] == [["device-a"]]


def test_sequences_over_a_grpc_stream(sequence_server: Server) -> None:
    client = grpcclient.InferenceServerClient(sequence_server.grpc_url)
    results: list[tuple[str, int]] = []

    def callback(result: Any, error: Any) -> None:
        assert error is None, error
        results.append((result.get_response().id, int(result.as_numpy("OUTPUT")[0, 0])))

    client.start_stream(callback=callback)
    plan = [
        (201, 1, True, False),
        (202, 100, True, False),
        (201, 2, False, False),
        (202, 200, False, True),
        (201, 3, False, True),
    ]
    for n, (sequence, value, start, end) in enumerate(plan):
        tensor = grpcclient.InferInput("INPUT", [1, 1], "INT32")
        tensor.set_data_from_numpy(np.array([[value]], dtype=np.int32))
        client.async_stream_infer(
            "acc", [tensor], request_id=str(n), sequence_id=sequence, sequence_start=start, sequence_end=end
        )
    deadline = time.monotonic() + 30
    while len(results) < len(plan) and time.monotonic() < deadline:
        time.sleep(0.01)
    client.stop_stream()
    assert dict(results) == {"0": 1, "1": 100, "2": 3, "3": 300, "4": 6}


def test_triton_errors_for_sequences(sequence_server: Server) -> None:
    client = httpclient.InferenceServerClient(sequence_server.http_url)
    with pytest.raises(InferenceServerException) as info:
        client.infer("acc", _inputs(1))
    assert (info.value.status(), info.value.message()) == (
        "400",
        "inference request to model 'acc' must specify a non-zero or non-empty correlation ID",
    )
    with pytest.raises(InferenceServerException) as info:
        client.infer("acc", _inputs(1), sequence_id=404)
    assert info.value.message() == (
        "inference request for sequence 404 to model 'acc' must specify the START flag on the first request of "
        "the sequence"
    )
    # After its END a sequence is over.
    _send(client, "acc", 300, 1, sequence_start=True, sequence_end=True)
    with pytest.raises(InferenceServerException, match="must specify the START flag"):
        client.infer("acc", _inputs(1), sequence_id=300)
    tensor = httpclient.InferInput("INPUT", [2, 1], "INT32")
    tensor.set_data_from_numpy(np.array([[1], [2]], dtype=np.int32))
    with pytest.raises(InferenceServerException) as info:
        client.infer("acc", [tensor], sequence_id=301, sequence_start=True)
    assert info.value.message() == (
        "inference request to model 'acc' must specify batch-size 1 due to requirements of sequence batcher"
    )


def test_an_idle_sequence_is_released(sequence_server: Server, sequence_repository: Path) -> None:
    client = httpclient.InferenceServerClient(sequence_server.http_url, concurrency=2)
    # In time: the second request comes while the first one runs, so the sequence cannot idle between them, on any
    # machine (a sequence with a request queued or running never idles out).
    first = client.async_infer("acc_idle", _inputs(99), sequence_id=400, sequence_start=True)
    try:
        _wait_until("the first request runs", _holding(sequence_server, 400))
        second = client.async_infer("acc_idle", _inputs(1), sequence_id=400)
        _wait_until("the second request queues", lambda: _pending(sequence_server, "acc_idle") == 1)
    finally:
        (sequence_repository / "acc_idle" / "release-400").touch()
    assert int(first.get_result().as_numpy("OUTPUT")[0, 0]) == 99
    assert int(second.get_result().as_numpy("OUTPUT")[0, 0]) == 100
    # Then nothing comes for over its 0.3 s idle time: the daemon releases it, and says so.
    _wait_until(
        "the idle sequence is released",
        lambda: "sequence 400 of model 'acc_idle' was idle too long and is released" in sequence_server.log(),
    )
    with pytest.raises(InferenceServerException, match="must specify the START flag"):
        client.infer("acc_idle", _inputs(1), sequence_id=400)


def test_the_oldest_strategy_batches_sequences_together(sequence_server: Server, sequence_repository: Path) -> None:
    client = httpclient.InferenceServerClient(sequence_server.http_url, concurrency=8)
    busy = client.async_infer("acc_oldest", _inputs(99), sequence_id=500, sequence_start=True)
    try:
        # The instance is busy (until the test lets it go): the next sequences queue, all three of them.
        _wait_until("sequence 500 holds the instance", _holding(sequence_server, 500))
        calls = [
            client.async_infer("acc_oldest", _inputs(n), sequence_id=510 + n, sequence_start=True) for n in range(1, 4)
        ]
        _wait_until("the three sequences queue", lambda: _pending(sequence_server, "acc_oldest") == 3)
    finally:
        (sequence_repository / "acc_oldest" / "release-500").touch()
    busy.get_result()
    results = [call.get_result() for call in calls]
    sizes = [json.loads(result.get_response()["parameters"]["info"])["n"] for result in results]
    # Once the instance is free, the three run in one batch.
    assert sizes == [3, 3, 3], sizes
    assert [int(result.as_numpy("OUTPUT")[0, 0]) for result in results] == [1, 2, 3]


def test_the_direct_strategy_waits_for_its_minimum_slot_utilization(sequence_server: Server) -> None:
    # As Triton's direct strategy: with a queue delay and a minimum slot utilization (half of 4 slots), a lone
    # sequence's request waits (up to the delay, a minute here) until a second sequence has one ready too.
    client = httpclient.InferenceServerClient(sequence_server.http_url, concurrency=8)
    first = client.async_infer("acc_direct_delay", _inputs(5), sequence_id=601, sequence_start=True)
    _wait_until("the first request waits", lambda: _pending(sequence_server, "acc_direct_delay") == 1)
    second = client.async_infer("acc_direct_delay", _inputs(7), sequence_id=602, sequence_start=True)
    rows = [json.loads(call.get_result().get_response()["parameters"]["info"])["rows"] for call in (first, second)]
    assert rows == [[[True, 601, 5], [True, 602, 7]]] * 2


def test_http_sequence_flags_must_be_booleans(sequence_server: Server) -> None:
    body = {
        "inputs": [{"name": "INPUT", "shape": [1, 1], "datatype": "INT32", "data": [1]}],
        "parameters": {"sequence_id": 9, "sequence_start": 1},
    }
    reply = post_json(sequence_server.http_url, "/v2/models/acc/infer", body)
    assert reply.status == 500
    assert json.loads(reply.body) == {
        "error": "Unable to parse 'sequence_start': attempt to access JSON non-boolean as boolean"
    }


def test_implicit_state_of_an_onnx_model(sequence_server: Server) -> None:
    client = httpclient.InferenceServerClient(sequence_server.http_url)

    def send(sequence: int, value: int, **flags: bool) -> int:
        result = client.infer("acc_onnx", _inputs(value), sequence_id=sequence, **flags)
        assert result.as_numpy("STATE_OUT") is None  # the state stays with the sequence
        return int(result.as_numpy("OUTPUT")[0, 0])

    assert send(601, 5, sequence_start=True) == 5  # the state starts at zero
    assert send(602, 100, sequence_start=True) == 100
    assert send(601, 6) == 11
    assert send(602, 1) == 101
    assert send(601, 1, sequence_end=True) == 12
    assert send(601, 7, sequence_start=True) == 7  # a new sequence starts from zero again


def test_the_oldest_strategy_waits_for_a_preferred_batch(sequence_server: Server) -> None:
    client = httpclient.InferenceServerClient(sequence_server.http_url, concurrency=8)
    # Three sequences start together: the batcher waits (up to a minute) until the preferred 3 are there.
    calls = [client.async_infer("acc_delay", _inputs(n), sequence_id=700 + n, sequence_start=True) for n in (1, 2, 3)]
    results = [call.get_result() for call in calls]
    sizes = [json.loads(result.get_response()["parameters"]["info"])["n"] for result in results]
    assert sizes == [3, 3, 3]


def test_an_initial_state_from_a_file(sequence_server: Server) -> None:
    client = httpclient.InferenceServerClient(sequence_server.http_url)
    result = client.infer("acc_from_1000", _inputs(5), sequence_id=801, sequence_start=True)
    assert int(result.as_numpy("OUTPUT")[0, 0]) == 1005
    # A file of the wrong size: the model is unavailable, and says why.
    index = {e["name"]: e for e in client.get_model_repository_index()}
    assert index["acc_bad_initial"]["state"] == "UNAVAILABLE"
    assert index["acc_bad_initial"]["reason"] == (
        "Invalid argument: initial state file 'start.bin' of state 'STATE_IN' in model 'acc_bad_initial' holds 2 "
        "bytes, expected 4"
    )


# What tritonclient's sequence examples send to Triton's simple_sequence model, and the answers they check.
EXAMPLE_VALUES: Final = [11, 7, 5, 3, 2, 0, 1]


def _example_sequences() -> list[tuple[int | str, list[int], list[int]]]:
    """(correlation id, values sent, answers expected) of the examples' three sequences: two numeric ids and a
    UUID string."""
    negated = [-v for v in EXAMPLE_VALUES]
    return [
        (1000, [0, *EXAMPLE_VALUES], [1, *EXAMPLE_VALUES]),
        (1001, [100, *negated], [101, *negated]),
        (str(uuid.uuid4()), [20, *negated], [21, *negated]),
    ]


@pytest.mark.parametrize("protocol", ["http", "grpc"])
def test_tritonclient_sequence_examples_sync(sequence_server: Server, protocol: str) -> None:
    module: Any = httpclient if protocol == "http" else grpcclient
    client = module.InferenceServerClient(sequence_server.http_url if protocol == "http" else sequence_server.grpc_url)
    for sequence, values, expected in _example_sequences():
        answers = []
        for n, value in enumerate(values):
            tensor = module.InferInput("INPUT", [1, 1], "INT32")
            tensor.set_data_from_numpy(np.full([1, 1], value, dtype=np.int32))
            result = client.infer(
                "simple_sequence",
                [tensor],
                outputs=[module.InferRequestedOutput("OUTPUT")],
                sequence_id=sequence,
                sequence_start=n == 0,
                sequence_end=n == len(values) - 1,
            )
            answers.append(int(result.as_numpy("OUTPUT")[0][0]))
        assert answers == expected, sequence


def test_tritonclient_sequence_example_stream(sequence_server: Server) -> None:
    # The three sequences go out on one stream one after the other, the answers come back as they come.
    results: queue.SimpleQueue[Any] = queue.SimpleQueue()
    client = grpcclient.InferenceServerClient(sequence_server.grpc_url)
    client.start_stream(callback=lambda result, error: results.put(error or result))
    sequences = _example_sequences()
    for sequence, values, _ in sequences:
        for n, value in enumerate(values):
            tensor = grpcclient.InferInput("INPUT", [1, 1], "INT32")
            tensor.set_data_from_numpy(np.full([1, 1], value, dtype=np.int32))
            client.async_stream_infer(
                "simple_sequence",
                [tensor],
                request_id=f"{sequence}_{n + 1}",
                sequence_id=sequence,
                sequence_start=n == 0,
                sequence_end=n == len(values) - 1,
            )
    answers: dict[str, list[int]] = {str(sequence): [] for sequence, _, _ in sequences}
    try:
        for _ in range(sum(len(values) for _, values, _ in sequences)):
            item = results.get(timeout=30)
            assert not isinstance(item, InferenceServerException), item
            answers[item.get_response().id.rsplit("_", 1)[0]].append(int(item.as_numpy("OUTPUT")[0][0]))
    finally:
        client.stop_stream()
    assert answers == {str(sequence): expected for sequence, _, expected in sequences}


def test_direct_slots_below_a_ready_one_get_null_requests(sequence_server: Server) -> None:
    # As Triton 2.51 does (checked): row i of a batch is slot i, and an idle slot below the highest one with a
    # request holds a null request (READY false, CORRID 0, zeros) whose answer goes nowhere.
    client = httpclient.InferenceServerClient(sequence_server.http_url)
    assert _send(client, "acc_slots", 3001, 1, sequence_start=True)[1]["rows"] == [[True, 3001, 1]]
    assert _send(client, "acc_slots", 3002, 10, sequence_start=True)[1]["rows"] == [[False, 0, 0], [True, 3002, 10]]
    total, info = _send(client, "acc_slots", 3003, 100, sequence_start=True)
    assert total == 100 and info["rows"] == [[False, 0, 0], [False, 0, 0], [True, 3003, 100]]
    total, info = _send(client, "acc_slots", 3002, 20)
    assert total == 30 and info["rows"] == [[False, 0, 0], [True, 3002, 20]]
    # Slot 0's sequence ends; the next sequence takes the lowest free slot.
    total, info = _send(client, "acc_slots", 3001, 2, sequence_end=True)
    assert total == 3 and info["rows"] == [[True, 3001, 2]]
    total, info = _send(client, "acc_slots", 3004, 1000, sequence_start=True)
    assert total == 1000 and info["rows"] == [[True, 3004, 1000]]
    total, info = _send(client, "acc_slots", 3003, 1)
    assert total == 101 and info["rows"] == [[False, 0, 0], [False, 0, 0], [True, 3003, 1]]


def _cancelled_count(server: Server, model: str) -> int:
    reply = request(server.metrics_url, "GET", "/metrics")
    prefix = f'nv_inference_request_failure{{model="{model}",reason="CANCELED",version="1"}}'
    for line in reply.body.decode().splitlines():
        if line.startswith(prefix):
            return int(float(line.rsplit(" ", 1)[1]))
    return 0


def test_cancelling_a_queued_request_cancels_its_sequence(sequence_server: Server, sequence_repository: Path) -> None:
    """As Triton (qa/L0_request_cancellation): the sequence's queued requests are answered CANCELLED without
    running, the request it was running finishes, and the sequence is over."""
    client = grpcclient.InferenceServerClient(sequence_server.grpc_url)
    http = httpclient.InferenceServerClient(sequence_server.http_url, concurrency=2)
    before = _cancelled_count(sequence_server, "acc_slots")
    answers: list[tuple[Any, Any]] = []

    def tensor(value: int) -> list[grpcclient.InferInput]:
        made = grpcclient.InferInput("INPUT", [1, 1], "INT32")
        made.set_data_from_numpy(np.array([[value]], dtype=np.int32))
        return [made]

    first = http.async_infer("acc_slots", _inputs(99), sequence_id=600, sequence_start=True)
    try:
        _wait_until("sequence 600 holds the instance", _holding(sequence_server, 600))
        queued = [
            client.async_infer("acc_slots", tensor(n), lambda result, error: answers.append((result, error)),
                               sequence_id=600)
            for n in (1, 2)
        ]  # fmt: skip
        _wait_until("two requests queue", lambda: _pending(sequence_server, "acc_slots") == 2)
        queued[0].cancel()
        _wait_until("both are cancelled", lambda: _cancelled_count(sequence_server, "acc_slots") == before + 2)
        assert _pending(sequence_server, "acc_slots") == 0
    finally:
        (sequence_repository / "acc_slots" / "release-600").touch()
    assert int(first.get_result().as_numpy("OUTPUT")[0, 0]) == 99
    _wait_until("the second queued request is answered", lambda: len(answers) >= 1)
    assert all(result is None and "CANCELLED" in str(error.status()) for result, error in answers), answers
    with pytest.raises(InferenceServerException, match="must specify the START flag"):
        http.infer("acc_slots", _inputs(1), sequence_id=600)
