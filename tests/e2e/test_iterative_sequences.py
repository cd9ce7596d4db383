"""Iterative sequences (``sequence_batching { iterative_sequence: true }``) through the real daemon and tritonclient:
a Python model releases its requests with RESCHEDULE until each is done, decoupled (a response per iteration over a
gRPC stream) and not (one answer over HTTP and gRPC), requests at different iterations batched together, Triton's
sequence errors, cancellation, and the error a model gets for RESCHEDULE without iterative sequences."""

from __future__ import annotations

import queue
import textwrap
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any, Final

import numpy as np
import pytest
import tritonclient.grpc as grpcclient
import tritonclient.http as httpclient
from server import Server, request, run_server
from tritonclient.utils import InferenceServerException

# Counts down from IN, one step per execution; remembers where each correlation id is. Decoupled, it sends every
# step; otherwise it answers None until the last step. IN of 100 or more makes each execution take 20 ms. While a
# file "hold" is in the model's folder, a sequence's first execution logs that it holds the instance and waits until
# the file is gone, so that a test can queue requests behind it on any machine.
COUNTDOWN: Final = """
import json
import os
import time

import numpy as np
import triton_python_backend_utils as pb_utils


class TritonPythonModel:
    def initialize(self, args):
        self.config = json.loads(args["model_config"])
        self.decoupled = pb_utils.using_decoupled_model_transaction_policy(self.config)
        self.left = {}
        self.hold = os.path.join(args["model_repository"], "hold")

    def execute(self, requests):
        answers = []
        for request in requests:
            key = request.correlation_id()
            start = int(pb_utils.get_input_tensor_by_name(request, "IN").as_numpy().reshape(-1)[0])
            if start >= 100:
                time.sleep(0.02)
            if key not in self.left:
                self.left[key] = start
                if os.path.exists(self.hold):
                    pb_utils.Logger.log_info(f"sequence {key} holds the instance")
                    deadline = time.monotonic() + 120  # only ends a test that failed
                    while os.path.exists(self.hold) and time.monotonic() < deadline:
                        time.sleep(0.01)
            self.left[key] -= 1
            left = self.left[key]
            cancelled = request.is_cancelled()
            outputs = [
                pb_utils.Tensor("LEFT", np.array([[left]], np.int32)),
                pb_utils.Tensor("CORRID", np.array([[key]], np.uint64)),
                pb_utils.Tensor("FLAGS", np.array([[request.flags()]], np.uint32)),
                # Requests of sequences in this execution (the direct strategy's null requests have id 0).
                pb_utils.Tensor("BATCH", np.array([[sum(1 for r in requests if r.correlation_id())]], np.int32)),
            ]
            response = pb_utils.InferenceResponse(outputs)
            done = left <= 0 or cancelled
            if done:
                del self.left[key]
            else:
                request.set_release_flags(pb_utils.TRITONSERVER_REQUEST_RELEASE_RESCHEDULE)
            if self.decoupled:
                sender = request.get_response_sender()
                sender.send(response, flags=pb_utils.TRITONSERVER_RESPONSE_COMPLETE_FINAL if done else 0)
            else:
                # answer_every_time: the mistake of returning a response for a request released to run again.
                wrong = json.loads(request.parameters()).get("answer_every_time", False)
                answers.append(response if done or wrong else None)
        return None if self.decoupled else answers
"""
CONFIG: Final = """
name: "%(name)s"
backend: "python"
max_batch_size: 4
model_transaction_policy { decoupled: %(decoupled)s }
input [ { name: "IN" data_type: TYPE_INT32 dims: [ 1 ] } ]
output [
  { name: "LEFT" data_type: TYPE_INT32 dims: [ 1 ] },
  { name: "CORRID" data_type: TYPE_UINT64 dims: [ 1 ] },
  { name: "FLAGS" data_type: TYPE_UINT32 dims: [ 1 ] },
  { name: "BATCH" data_type: TYPE_INT32 dims: [ 1 ] }
]
%(scheduling)s
instance_group [ { count: 1 kind: KIND_CPU } ]
"""
MODELS: Final[dict[str, dict[str, str]]] = {
    "countdown": {"decoupled": "true", "scheduling": "sequence_batching { iterative_sequence: true }"},
    "countdown_oldest": {
        "decoupled": "true",
        "scheduling": "sequence_batching { iterative_sequence: true oldest { max_candidate_sequences: 4 } }",
    },
    "countdown_plain": {"decoupled": "false", "scheduling": "sequence_batching { iterative_sequence: true }"},
    "countdown_dynamic": {"decoupled": "false", "scheduling": "dynamic_batching { }"},
    "countdown_sequence": {"decoupled": "true", "scheduling": "sequence_batching { direct { } }"},
}


@pytest.fixture(scope="module")
def iterative_repository(tmp_path_factory: pytest.TempPathFactory) -> Path:
    repo: Path = tmp_path_factory.mktemp("iterative")
    for name, values in MODELS.items():
        (repo / name / "1").mkdir(parents=True)
        (repo / name / "1" / "model.py").write_text(COUNTDOWN, encoding="utf-8")
        (repo / name / "config.pbtxt").write_text(textwrap.dedent(CONFIG % {"name": name, **values}), encoding="utf-8")
    return repo


@pytest.fixture(scope="module")
def iterative_server(iterative_repository: Path) -> Iterator[Server]:
    with run_server([iterative_repository]) as server:
        yield server


def _wait_until(what: str, condition: Callable[[], bool], timeout: float = 60.0) -> None:
    deadline = time.monotonic() + timeout
    while not condition():
        assert time.monotonic() < deadline, f"timed out waiting until {what}"
        time.sleep(0.02)


def _pending(server: Server, model: str) -> int:
    """Requests the model's sequence batcher holds that no instance runs yet."""
    metrics = request(server.metrics_url, "GET", "/metrics").body.decode()
    for line in metrics.splitlines():
        if line.startswith(f'nv_inference_pending_request_count{{model="{model}"'):
            return int(float(line.rsplit(" ", 1)[1]))
    raise AssertionError(f"no pending request count for {model}")


def _tensor(module: Any, value: int) -> Any:
    tensor = module.InferInput("IN", [1, 1], "INT32")
    tensor.set_data_from_numpy(np.array([[value]], dtype=np.int32))
    return tensor


def _row(result: Any) -> dict[str, int]:
    return {name: int(result.as_numpy(name)[0, 0]) for name in ("LEFT", "CORRID", "FLAGS", "BATCH")}


def _stream(
    url: str,
    model: str,
    requests: list[tuple[str, int, dict[str, Any]]],
    until_s: float = 30.0,
    between: Callable[[int], None] | None = None,
) -> dict[str, list[Any]]:
    """Sends the requests on one gRPC stream; every response (a row, then True when it was the final one) or
    error message by request id, until each request has its final response or an error. ``between(n)`` runs once
    the first n requests are sent."""
    answers: queue.SimpleQueue[tuple[Any, Any]] = queue.SimpleQueue()
    client = grpcclient.InferenceServerClient(url)
    client.start_stream(callback=lambda result, error: answers.put((result, error)))
    for n, (request_id, value, extra) in enumerate(requests, 1):
        client.async_stream_infer(model, [_tensor(grpcclient, value)], request_id=request_id, **extra)
        if between is not None:
            between(n)
    got: dict[str, list[Any]] = {request_id: [] for request_id, _, _ in requests}
    open_ids = set(got)
    deadline = time.monotonic() + until_s
    try:
        while open_ids and time.monotonic() < deadline:
            try:
                result, error = answers.get(timeout=0.2)
            except queue.Empty:
                continue
            if error is not None:
                # The error names no request; it ends the one request of this test that can fail.
                got.setdefault("error", []).append(error.message())
                open_ids.pop()
                continue
            response = result.get_response()
            final = response.parameters["triton_final_response"].bool_param
            got[response.id].append((_row(result), final))
            if final:
                open_ids.discard(response.id)
    finally:
        client.stop_stream()
    assert not open_ids, f"no final response for {open_ids}: {got}"
    return got


def test_a_decoupled_model_answers_every_iteration(iterative_server: Server) -> None:
    got = _stream(iterative_server.grpc_url, "countdown", [("a", 3, {}), ("b", 2, {})])
    for request_id, steps in (("a", 3), ("b", 2)):
        rows = got[request_id]
        assert [row["LEFT"] for row, _ in rows] == list(range(steps - 1, -1, -1))
        assert [final for _, final in rows] == [False] * (steps - 1) + [True]
        # Each request is a sequence of its own: an id the daemon gave it, START only on its first execution.
        assert len({row["CORRID"] for row, _ in rows}) == 1 and rows[0][0]["CORRID"] != 0
        assert [row["FLAGS"] for row, _ in rows] == [1] + [0] * (steps - 1)
    assert got["a"][0][0]["CORRID"] != got["b"][0][0]["CORRID"]


@pytest.mark.parametrize("model", ["countdown", "countdown_oldest"])
def test_requests_at_different_iterations_run_in_one_batch(
    iterative_server: Server, iterative_repository: Path, model: str
) -> None:
    # Four requests of 31 steps. The first one holds the instance in its first execution until the three others
    # are queued; from then on they run in one batch, the first one an iteration ahead of the others.
    hold = iterative_repository / model / "hold"
    log_before = len(iterative_server.log())

    def between(sent: int) -> None:
        if sent == 1:
            _wait_until(
                "the first request holds the instance",
                lambda: "holds the instance" in iterative_server.log()[log_before:],
            )
        elif sent == 4:
            _wait_until("the three others queue", lambda: _pending(iterative_server, model) == 3)
            hold.unlink()

    requests: list[tuple[str, int, dict[str, Any]]] = [(str(n), 31, {}) for n in range(4)]
    hold.touch()
    try:
        got = _stream(iterative_server.grpc_url, model, requests, until_s=60.0, between=between)
    finally:
        hold.unlink(missing_ok=True)
    for request_id, _, _ in requests:
        assert [row["LEFT"] for row, _ in got[request_id]] == list(range(30, -1, -1))
    # The first one's second execution is the others' first: one batch of the four.
    assert got["0"][1][0]["BATCH"] == 4
    assert [got[request_id][0][0]["BATCH"] for request_id in ("1", "2", "3")] == [4, 4, 4]


@pytest.mark.parametrize("protocol", ["http", "grpc"])
def test_a_model_that_is_not_decoupled_answers_once_at_the_end(iterative_server: Server, protocol: str) -> None:
    module: Any = httpclient if protocol == "http" else grpcclient
    url = iterative_server.http_url if protocol == "http" else iterative_server.grpc_url
    client = module.InferenceServerClient(url)
    statistics = grpcclient.InferenceServerClient(iterative_server.grpc_url)
    before = statistics.get_inference_statistics("countdown_plain", as_json=True)["model_stats"][0]
    result = client.infer("countdown_plain", [_tensor(module, 4)])
    assert _row(result)["LEFT"] == 0 and _row(result)["FLAGS"] == 0 and _row(result)["CORRID"] != 0
    after = statistics.get_inference_statistics("countdown_plain", as_json=True)["model_stats"][0]
    # Four executions for one request that succeeded once.
    assert int(after["execution_count"]) - int(before.get("execution_count", 0)) == 4
    success = after["inference_stats"]["success"]
    assert int(success["count"]) - int(before["inference_stats"]["success"].get("count", 0)) == 1


def test_a_response_returned_for_a_request_run_again_is_an_error(iterative_server: Server) -> None:
    # Triton's rule (and its words): a request released to run again must be answered None this time; a response
    # is refused, and the request is not run again.
    client = httpclient.InferenceServerClient(iterative_server.http_url)
    with pytest.raises(InferenceServerException) as refused:
        client.infer("countdown_plain", [_tensor(httpclient, 3)], parameters={"answer_every_time": True})
    assert (
        "Expected a None object in the execute function return list for reschduled request, found type"
        in refused.value.message()
    )
    assert client.infer("countdown_plain", [_tensor(httpclient, 2)]).as_numpy("LEFT")[0, 0] == 0


def test_sequence_ids_and_flags_given_by_the_client(iterative_server: Server) -> None:
    got = _stream(
        iterative_server.grpc_url,
        "countdown",
        [("c", 2, {"sequence_id": 500, "sequence_start": True})],
    )
    assert [(row["LEFT"], row["CORRID"], row["FLAGS"]) for row, _ in got["c"]] == [(1, 500, 1), (0, 500, 0)]
    # END with the first request ends the sequence once the request is done, not after its first execution.
    got = _stream(
        iterative_server.grpc_url,
        "countdown",
        [("e", 2, {"sequence_id": 602, "sequence_start": True, "sequence_end": True})],
    )
    assert [(row["LEFT"], row["FLAGS"]) for row, _ in got["e"]] == [(1, 3), (0, 0)]
    client = httpclient.InferenceServerClient(iterative_server.http_url)
    with pytest.raises(InferenceServerException) as info:
        client.infer("countdown_plain", [_tensor(httpclient, 2)], sequence_id=501)
    assert (info.value.status(), info.value.message()) == (
        "400",
        "inference request for sequence 501 to model 'countdown_plain' must specify the START flag on the first "
        "request of the sequence",
    )
    # Once its request is done, the sequence is over.
    client.infer("countdown_plain", [_tensor(httpclient, 2)], sequence_id=502, sequence_start=True)
    with pytest.raises(InferenceServerException, match="must specify the START flag"):
        client.infer("countdown_plain", [_tensor(httpclient, 2)], sequence_id=502)


def test_a_cancelled_request_is_not_run_again(iterative_server: Server) -> None:
    client = grpcclient.InferenceServerClient(iterative_server.grpc_url)
    responses: queue.SimpleQueue[Any] = queue.SimpleQueue()
    client.start_stream(callback=lambda result, error: responses.put(result))

    def statistics() -> dict[str, Any]:
        stats: dict[str, Any] = client.get_inference_statistics("countdown", as_json=True)["model_stats"][0]
        return stats

    def ended() -> int:
        inference = statistics()["inference_stats"]
        return int(inference["success"].get("count", 0)) + int(inference["fail"].get("count", 0))

    before = ended()
    client.async_stream_infer("countdown", [_tensor(grpcclient, 100_000)], request_id="long")
    responses.get(timeout=30)  # it is iterating
    client.stop_stream(cancel_requests=True)
    # Its sequence ends (the model sees the cancellation, or the daemon does not run it again)...
    _wait_until("the cancelled request ends", lambda: ended() == before + 1)
    settled = int(statistics()["execution_count"])
    # ...and it is run no more: the next request runs alone, and only its own two executions are counted.
    got = _stream(iterative_server.grpc_url, "countdown", [("after", 2, {})])
    assert [row["LEFT"] for row, _ in got["after"]] == [1, 0]
    assert [row["BATCH"] for row, _ in got["after"]] == [1, 1], "the cancelled request kept being run"
    assert int(statistics()["execution_count"]) == settled + 2, "the cancelled request kept being run"


@pytest.mark.parametrize("model", ["countdown_dynamic", "countdown_sequence"])
def test_reschedule_needs_iterative_sequences(iterative_server: Server, model: str) -> None:
    expected = (
        f"Failed to process the request(s) for model instance '{model}_0_0', message: Request is released with "
        "TRITONSERVER_REQUEST_RELEASE_RESCHEDULE, which needs 'sequence_batching { iterative_sequence: true }' in "
        f"the configuration of model '{model}'"
    )
    sequence = {"sequence_id": 900, "sequence_start": True} if model == "countdown_sequence" else {}
    if model == "countdown_dynamic":
        client = httpclient.InferenceServerClient(iterative_server.http_url)
        with pytest.raises(InferenceServerException) as info:
            client.infer(model, [_tensor(httpclient, 2)])
        assert (info.value.status(), info.value.message()) == ("500", expected)
        # A request the model does not reschedule is answered as usual.
        assert _row(client.infer(model, [_tensor(httpclient, 1)]))["LEFT"] == 0
    else:
        got = _stream(iterative_server.grpc_url, model, [("x", 2, sequence)])
        assert got["error"] == [expected]
        assert [row["LEFT"] for row, _ in got["x"]] == [1]
        # The model goes on serving.
        got = _stream(iterative_server.grpc_url, model, [("y", 1, {"sequence_id": 901, "sequence_start": True})])
        assert [row["LEFT"] for row, _ in got["y"]] == [0]
