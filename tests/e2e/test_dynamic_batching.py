"""The dynamic batcher as Triton's config.pbtxt describes it, seen through the batches a Python model receives:
preferred sizes, the queue delay, priorities, queue policies (timeouts that reject or delay, a bounded queue),
shapes that may or may not share a batch, response ordering, and instances that run batches at once. An ONNX model
behind the batcher answers every request with its own rows. Behaviour only, and none of it depends on how fast the
machine is: a held request keeps an instance busy until the test lets it go (the model logs when it holds), requests
are sent once the daemon's pending count shows the ones before them queued, and a queue timeout is known to have run
out once that long has passed since the request was seen queued."""

from __future__ import annotations

import contextlib
import itertools
import shutil
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any, Final

import gevent  # type: ignore[import-untyped, unused-ignore]
import modelgen
import numpy as np
import pytest
import tritonclient.grpc as grpcclient
import tritonclient.http as httpclient
from conftest import PYTHON_MODELS
from prometheus_client.parser import text_string_to_metric_families
from server import Server, add_sub_inputs, request, run_server
from tritonclient.utils import InferenceServerException

RECORDER: Final = PYTHON_MODELS / "batch_recorder.py"
# The queue timeout of the model "reject".
REJECT_TIMEOUT_S: Final = 0.2
# How long a test waits for what must come (a generous bound, never a measurement).
WAIT_S: Final = 60.0
_holds = itertools.count()
OUTPUTS: Final = """
output [
  { name: "OUT" data_type: TYPE_FP32 dims: [ -1 ] },
  { name: "ITEMS" data_type: TYPE_INT32 dims: [ 1 ] },
  { name: "REQUESTS" data_type: TYPE_INT32 dims: [ 1 ] },
  { name: "SAME_SHAPES" data_type: TYPE_BOOL dims: [ 1 ] },
  { name: "EXECUTION" data_type: TYPE_INT64 dims: [ 1 ] },
  { name: "PID" data_type: TYPE_INT64 dims: [ 1 ] },
  { name: "START" data_type: TYPE_FP64 dims: [ 1 ] },
  { name: "END" data_type: TYPE_FP64 dims: [ 1 ] }
]
"""
# name -> (max_batch_size, instance count, what follows in config.pbtxt)
MODELS: Final[dict[str, tuple[int, int, str]]] = {
    "preferred": (8, 1, "dynamic_batching { preferred_batch_size: [ 4 ] max_queue_delay_microseconds: 30000000 }"),
    "delayed": (8, 1, "dynamic_batching { max_queue_delay_microseconds: 1000000 }"),
    # A delay no test waits out: its batch goes once it is full.
    "delayed_until_full": (3, 1, "dynamic_batching { max_queue_delay_microseconds: 30000000 }"),
    "immediate": (8, 1, "dynamic_batching { }"),
    "priorities": (1, 1, "dynamic_batching { priority_levels: 2 default_priority_level: 2 }"),
    "reject": (
        1,
        1,
        "dynamic_batching { default_queue_policy { timeout_action: REJECT "
        f"default_timeout_microseconds: {int(REJECT_TIMEOUT_S * 1e6)} }} }}",
    ),
    "override": (
        1,
        1,
        "dynamic_batching { default_queue_policy { default_timeout_microseconds: 30000000 "
        "allow_timeout_override: true } }",
    ),
    # A request may shorten the policy's 30 s: the one that is to run out does, the others stay in time.
    "delay_action": (
        1,
        1,
        "dynamic_batching { default_queue_policy { timeout_action: DELAY default_timeout_microseconds: 30000000 "
        "allow_timeout_override: true } }",
    ),
    "bounded": (1, 1, "dynamic_batching { default_queue_policy { max_queue_size: 2 } }"),
    "two_instances": (1, 2, "dynamic_batching { }"),
    "ordered": (1, 2, "dynamic_batching { preserve_ordering: true }"),
    "unordered": (1, 2, "dynamic_batching { }"),
    "shapes": (8, 1, "dynamic_batching { preferred_batch_size: [ 4 ] max_queue_delay_microseconds: 30000000 }"),
}
RAGGED: Final = "ragged"
# Configs Triton refuses, with the reason Triton 2.51 gives for each.
REFUSED: Final[dict[str, tuple[int, str, str]]] = {
    "levels_no_default": (
        8,
        "dynamic_batching { priority_levels: 2 }",
        "default priority level must be in range [1, 2] for levels_no_default",
    ),
    "levels_policy_out_of_range": (
        8,
        "dynamic_batching { priority_levels: 2 default_priority_level: 1 "
        "priority_queue_policy { key: 5 value: { max_queue_size: 1 } } }",
        "priority queue policy must have priority level in range [1, 2] for levels_policy_out_of_range",
    ),
    "ordered_levels": (
        8,
        "dynamic_batching { preserve_ordering: true priority_levels: 2 default_priority_level: 1 }",
        "Only one priority level is allowed when 'preserve_ordering' is true for ordered_levels",
    ),
    "ordered_delay": (
        8,
        "dynamic_batching { preserve_ordering: true "
        "default_queue_policy { timeout_action: DELAY default_timeout_microseconds: 100 } }",
        "Queue policy can not have DELAY as timeout action when 'preserve_ordering' is true for ordered_delay",
    ),
    "preferred_over_max": (
        8,
        "dynamic_batching { preferred_batch_size: [ 16 ] }",
        "dynamic batching preferred size must be <= max batch size for preferred_over_max",
    ),
    "preferred_without_batching": (
        0,
        "dynamic_batching { preferred_batch_size: [ 2 ] }",
        "dynamic batching preferred size must be <= max batch size for preferred_without_batching",
    ),
}


def _write_recorder(repo: Path, name: str, max_batch_size: int, count: int, scheduling: str, ragged: bool) -> None:
    version = repo / name / "1"
    version.mkdir(parents=True)
    shutil.copy(RECORDER, version / "model.py")
    flag = " allow_ragged_batch: true" if ragged else ""
    (repo / name / "config.pbtxt").write_text(
        f'name: "{name}"\nbackend: "python"\nmax_batch_size: {max_batch_size}\n'
        f'input [ {{ name: "IN" data_type: TYPE_FP32 dims: [ -1 ]{flag} }} ]\n{OUTPUTS}'
        f"instance_group [ {{ count: {count} kind: KIND_CPU }} ]\n{scheduling}\n",
        encoding="utf-8",
    )


@pytest.fixture(scope="module")
def batching_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Server]:
    repo = tmp_path_factory.mktemp("batching-repo")
    for name, (max_batch_size, count, scheduling) in MODELS.items():
        _write_recorder(repo, name, max_batch_size, count, scheduling, ragged=False)
    _write_recorder(repo, RAGGED, 8, 1, MODELS["shapes"][2], ragged=True)
    # Accepted by Triton: a model without batching behind the batcher, per-level policies without levels.
    _write_recorder(repo, "unbatched", 0, 1, "dynamic_batching { }", ragged=False)
    _write_recorder(
        repo, "policy_without_levels", 8, 1, "dynamic_batching { priority_queue_policy { key: 1 value: { } } }", False
    )
    for name, (max_batch_size, scheduling, _) in REFUSED.items():
        _write_recorder(repo, name, max_batch_size, 1, scheduling, ragged=False)
    add_sub = repo / "add_sub_batched"
    modelgen.write_add_sub(add_sub, max_batch_size=8)
    config = add_sub / "config.pbtxt"
    config.write_text(
        config.read_text(encoding="utf-8")
        + "dynamic_batching { preferred_batch_size: [ 4 ] max_queue_delay_microseconds: 30000000 }\n",
        encoding="utf-8",
    )
    with run_server([repo]) as running:
        yield running


@pytest.fixture
def client(batching_server: Server) -> Iterator[httpclient.InferenceServerClient]:
    client = httpclient.InferenceServerClient(batching_server.http_url, concurrency=16, network_timeout=60)
    yield client
    client.close()


def _inputs(columns: int = 1, rows: int = 1, value: float = 1.0) -> list[httpclient.InferInput]:
    tensor = httpclient.InferInput("IN", [rows, columns], "FP32")
    tensor.set_data_from_numpy(np.full((rows, columns), value, dtype=np.float32))
    return [tensor]


def _send(
    client: httpclient.InferenceServerClient, model: str, hold: Path | None = None, **kwargs: Any
) -> httpclient.InferAsyncRequest:
    """Sends one request; ``hold``: the model keeps its instance busy until that file exists."""
    inputs = kwargs.pop("inputs", None) or _inputs()
    parameters = {"hold": str(hold)} if hold is not None else None
    return client.async_infer(model, inputs, parameters=parameters, **kwargs)


def _value(result: httpclient.InferResult, name: str) -> Any:
    return result.as_numpy(name)[0, 0].item()


def _wait_until(what: str, condition: Callable[[], bool]) -> None:
    deadline = time.monotonic() + WAIT_S
    while not condition():
        assert time.monotonic() < deadline, f"timed out waiting until {what}"
        # gevent's sleep: the HTTP client's async requests are greenlets, sent only while this one yields.
        gevent.sleep(0.02)


def _wait_for_pending(server: Server, model: str, count: int) -> None:
    """Waits until ``count`` requests for the model are queued (the daemon's pending count says so)."""
    _wait_until(f"{count} requests queue for {model}", lambda: _pending(server, model) == count)


def _holding(server: Server, release: Path, count: int = 1) -> Callable[[], bool]:
    """Whether ``count`` executions hold their instance until ``release`` exists (the model logs each)."""
    return lambda: server.log().count(f"execution holds its instance until {release} exists") >= count


@contextlib.contextmanager
def _held(
    server: Server, client: httpclient.InferenceServerClient, model: str, folder: Path
) -> Iterator[httpclient.InferAsyncRequest]:
    """A request that keeps the model's (single) instance busy until the block ends, given once the model runs it,
    so that whatever the block sends queues behind it."""
    release = folder / f"release-{next(_holds)}"
    call = _send(client, model, hold=release)
    try:
        _wait_until(f"the held request runs on {model}", _holding(server, release))
        yield call
    finally:
        release.touch()


def _outlive(timeout_s: float) -> None:
    """Returns once more than ``timeout_s`` has passed: a request seen queued before the call has then waited past
    a queue timeout that long, on any machine (a lower bound: a slow machine only waits longer)."""
    until = time.monotonic() + timeout_s
    while time.monotonic() <= until:
        gevent.sleep(max(until - time.monotonic(), 0.0) + 0.001)


def _statistics(client: httpclient.InferenceServerClient, model: str) -> dict[str, Any]:
    stats: dict[str, Any] = client.get_inference_statistics(model)["model_stats"][0]
    return stats


def test_concurrent_requests_are_batched_to_the_preferred_size(client: httpclient.InferenceServerClient) -> None:
    # The queue delay (30 s) never runs out here: every batch goes because it reached the preferred size.
    calls = [_send(client, "preferred", inputs=_inputs(value=i)) for i in range(8)]
    results = [call.get_result() for call in calls]
    assert [_value(r, "ITEMS") for r in results] == [4] * 8
    assert [_value(r, "REQUESTS") for r in results] == [4] * 8
    assert [_value(r, "OUT") for r in results] == list(range(8))  # each request gets its own rows back
    stats = _statistics(client, "preferred")
    assert stats["execution_count"] == 2
    assert stats["inference_count"] == 8
    assert [b["batch_size"] for b in stats["batch_stats"]] == [4]


def test_requests_of_several_items_fill_a_batch(client: httpclient.InferenceServerClient) -> None:
    calls = [_send(client, "preferred", inputs=_inputs(rows=2)) for _ in range(2)]
    results = [call.get_result() for call in calls]
    assert [_value(r, "ITEMS") for r in results] == [4, 4]
    assert [_value(r, "REQUESTS") for r in results] == [2, 2]
    assert all(r.as_numpy("OUT").shape == (2, 1) for r in results)


def test_the_queue_delay_bounds_waiting(client: httpclient.InferenceServerClient) -> None:
    # Alone, a request waits out the delay (1 s) and then runs as a batch of one...
    before = _statistics(client, "delayed")["inference_stats"]["queue"]
    result = _send(client, "delayed").get_result(timeout=30)
    assert _value(result, "ITEMS") == 1
    after = _statistics(client, "delayed")["inference_stats"]["queue"]
    assert after["count"] == before["count"] + 1
    assert after["ns"] - before["ns"] >= 1_000_000_000
    # ...and requests that come within the delay share its batch (a delay of 30 s, which the batch of three, full,
    # does not wait out).
    calls = [_send(client, "delayed_until_full") for _ in range(3)]
    assert [_value(call.get_result(), "ITEMS") for call in calls] == [3, 3, 3]


def test_without_a_delay_waiting_requests_join_the_next_batch(
    batching_server: Server, client: httpclient.InferenceServerClient, tmp_path: Path
) -> None:
    with _held(batching_server, client, "immediate", tmp_path) as held:
        calls = [_send(client, "immediate") for _ in range(5)]
        _wait_for_pending(batching_server, "immediate", 5)
    assert _value(held.get_result(), "ITEMS") == 1
    # They queued while the instance was busy, and all went in the next execution.
    assert [_value(call.get_result(), "ITEMS") for call in calls] == [5] * 5


def test_priorities_reorder_the_queue(
    batching_server: Server, client: httpclient.InferenceServerClient, tmp_path: Path
) -> None:
    with _held(batching_server, client, "priorities", tmp_path) as held:
        calls = []
        for priority in (2, 2, 0, 1, 7):  # 0: the default level (2); 7: no such level, the default too
            calls.append(_send(client, "priorities", priority=priority))
            # One after the other: each is queued before the next is sent, so that they arrive in this order.
            _wait_for_pending(batching_server, "priorities", len(calls))
    low0, low1, default, high, beyond = calls
    held.get_result()
    order = {
        "low0": _value(low0.get_result(), "EXECUTION"),
        "low1": _value(low1.get_result(), "EXECUTION"),
        "default": _value(default.get_result(), "EXECUTION"),
        "high": _value(high.get_result(), "EXECUTION"),
        "beyond": _value(beyond.get_result(), "EXECUTION"),
    }
    assert sorted(order, key=order.__getitem__) == ["high", "low0", "low1", "default", "beyond"]


def test_a_request_that_waits_past_its_timeout_is_rejected(
    batching_server: Server, client: httpclient.InferenceServerClient, tmp_path: Path
) -> None:
    failures = _statistics(client, "reject")["inference_stats"]["fail"]["count"]
    with _held(batching_server, client, "reject", tmp_path) as held:
        late = _send(client, "reject", request_id="late-1")
        _wait_for_pending(batching_server, "reject", 1)
        _outlive(REJECT_TIMEOUT_S)  # its timeout runs out while the instance is busy
        # As Triton, it is answered when its timeout passes, while the instance is still busy (the held request
        # goes only when this block ends).
        with pytest.raises(InferenceServerException) as info:
            late.get_result(timeout=WAIT_S)
    assert info.value.status() == "503"
    assert info.value.message() == "Request timeout expired"
    assert _value(held.get_result(), "ITEMS") == 1
    # Nothing else was lost: the model still serves, and the rejection is counted as a failure.
    assert _value(_send(client, "reject").get_result(), "ITEMS") == 1
    assert _statistics(client, "reject")["inference_stats"]["fail"]["count"] == failures + 1


def test_a_request_may_shorten_its_timeout(
    batching_server: Server, client: httpclient.InferenceServerClient, tmp_path: Path
) -> None:
    with _held(batching_server, client, "override", tmp_path) as held:
        short = _send(client, "override", timeout=100_000)  # 0.1 s, under the policy's 30 s
        long = _send(client, "override", timeout=60_000_000)  # may not lengthen it: 30 s, still plenty
        _wait_for_pending(batching_server, "override", 2)
        _outlive(0.1)  # the short timeout runs out while the instance is busy
    with pytest.raises(InferenceServerException, match="Request timeout expired"):
        short.get_result()
    held.get_result()
    assert _value(long.get_result(), "ITEMS") == 1


def test_a_delayed_request_yields_to_those_still_in_time(
    batching_server: Server, client: httpclient.InferenceServerClient, tmp_path: Path
) -> None:
    with _held(batching_server, client, "delay_action", tmp_path) as held:
        expired = _send(client, "delay_action", timeout=200_000)  # its 0.2 s run out while the instance is busy
        _wait_for_pending(batching_server, "delay_action", 1)
        _outlive(0.2)
        timely = _send(client, "delay_action")  # the policy's 30 s: still in time when the instance frees up
        _wait_for_pending(batching_server, "delay_action", 2)
    held.get_result()
    late = _value(expired.get_result(), "EXECUTION")
    assert _value(timely.get_result(), "EXECUTION") < late


def test_a_full_queue_answers_unavailable_and_loses_nothing(
    batching_server: Server, client: httpclient.InferenceServerClient, tmp_path: Path
) -> None:
    failures = _statistics(client, "bounded")["inference_stats"]["fail"]["count"]
    with _held(batching_server, client, "bounded", tmp_path) as held:
        queued = [_send(client, "bounded") for _ in range(2)]
        _wait_for_pending(batching_server, "bounded", 2)
        with pytest.raises(InferenceServerException) as info:
            _send(client, "bounded", request_id="third").get_result()
    assert info.value.status() == "503"
    assert info.value.message() == "[request id: third] Exceeds maximum queue size"
    held.get_result()
    assert [_value(call.get_result(), "ITEMS") for call in queued] == [1, 1]
    # Refused before it was queued, it is not counted (as in Triton); a request that timed out in the queue is.
    assert _statistics(client, "bounded")["inference_stats"]["fail"]["count"] == failures


def test_a_full_queue_over_grpc(batching_server: Server, tmp_path: Path) -> None:
    client = httpclient.InferenceServerClient(batching_server.http_url, concurrency=4)
    grpc = grpcclient.InferenceServerClient(batching_server.grpc_url)
    tensor = grpcclient.InferInput("IN", [1, 1], "FP32")
    tensor.set_data_from_numpy(np.ones((1, 1), dtype=np.float32))
    with _held(batching_server, client, "bounded", tmp_path) as held:
        queued = [_send(client, "bounded") for _ in range(2)]
        _wait_for_pending(batching_server, "bounded", 2)
        with pytest.raises(InferenceServerException) as info:
            grpc.infer("bounded", [tensor])
    assert info.value.status() == "StatusCode.UNAVAILABLE"
    assert info.value.message() == "[request id: <id_unknown>] Exceeds maximum queue size"
    held.get_result()
    for call in queued:
        call.get_result()


def test_two_instances_execute_batches_at_once(
    batching_server: Server, client: httpclient.InferenceServerClient, tmp_path: Path
) -> None:
    release = tmp_path / "release"
    calls = [_send(client, "two_instances", hold=release) for _ in range(2)]
    try:
        # Both run at once: neither ends until both have begun.
        _wait_until("both requests run", _holding(batching_server, release, count=2))
    finally:
        release.touch()
    first, second = (call.get_result() for call in calls)
    assert _value(first, "PID") != _value(second, "PID")
    # Each began before the other ended.
    assert _value(first, "START") < _value(second, "END")
    assert _value(second, "START") < _value(first, "END")


def _answered_while_held(server: Server, model: str, release: Path) -> list[str]:
    """The answers to a slow and a fast request to ``model`` that came while the slow one still ran: the slow one
    runs on one instance when the fast one arrives, the fast one runs on the other and is done (counted a success)
    while the slow one still runs, which ends once ``release`` exists. Which answer the client reads first once both
    are sent is its own threads' business, so the order that matters is against the release."""
    client = grpcclient.InferenceServerClient(server.grpc_url)
    held: list[str] = []
    answered: list[str] = []
    done = threading.Event()

    def send(name: str, parameters: dict[str, Any]) -> None:
        def callback(result: Any, error: Any) -> None:
            answered.append(name if error is None else f"{name}: {error}")
            if not release.exists():
                held.append(name)
            if len(answered) == 2:
                done.set()

        tensor = grpcclient.InferInput("IN", [1, 1], "FP32")
        tensor.set_data_from_numpy(np.ones((1, 1), dtype=np.float32))
        client.async_infer(model, [tensor], callback, parameters=parameters)

    succeeded = _metric(server, "nv_inference_request_success", model)
    send("slow", {"hold": str(release)})
    try:
        _wait_until(f"the slow request runs on {model}", _holding(server, release))
        send("fast", {})
        _wait_until(
            f"the fast request is done on {model}",
            lambda: _metric(server, "nv_inference_request_success", model) == succeeded + 1,
        )
        if model == "unordered":
            _wait_until("the fast answer comes", lambda: answered == ["fast"])
        else:
            # A round trip on the same channel after the fast request is done: an answer sent early is read first.
            assert client.is_server_live()
    finally:
        release.touch()
    assert done.wait(WAIT_S)
    assert sorted(answered) == ["fast", "slow"], answered
    client.close()
    return held


def test_preserve_ordering_releases_responses_in_arrival_order(batching_server: Server, tmp_path: Path) -> None:
    assert _answered_while_held(batching_server, "unordered", tmp_path / "release-unordered") == ["fast"]
    # In order: the fast answer waits for the slow one, which the release ends.
    assert _answered_while_held(batching_server, "ordered", tmp_path / "release-ordered") == []


def test_different_shapes_never_share_a_batch(
    batching_server: Server, client: httpclient.InferenceServerClient
) -> None:
    columns = [2, 2, 3, 3, 3, 3]
    arrived = _arrived(batching_server, "shapes")
    calls = []
    for width in columns:  # in this order: the first request of another shape sends the batch before it
        calls.append(_send(client, "shapes", inputs=_inputs(columns=width)))
        _wait_until(
            f"request {len(calls)} arrives",
            lambda: _arrived(batching_server, "shapes") == arrived + len(calls),
        )
    results = [call.get_result() for call in calls]
    assert all(_value(r, "SAME_SHAPES") for r in results)
    assert [_value(r, "REQUESTS") for r in results] == [2, 2, 4, 4, 4, 4]
    assert [r.as_numpy("OUT").shape for r in results] == [(1, width) for width in columns]


def test_ragged_inputs_share_a_batch(client: httpclient.InferenceServerClient) -> None:
    calls = [_send(client, RAGGED, inputs=_inputs(columns=2 + i % 2)) for i in range(4)]
    results = [call.get_result() for call in calls]
    assert [_value(r, "REQUESTS") for r in results] == [4] * 4
    assert not any(_value(r, "SAME_SHAPES") for r in results)


def test_an_onnx_model_answers_each_request_with_its_own_rows(
    batching_server: Server, client: httpclient.InferenceServerClient
) -> None:
    rng = np.random.default_rng(5)
    pairs = [
        (rng.standard_normal((rows, 16)).astype(np.float32), rng.standard_normal((rows, 16)).astype(np.float32))
        for rows in (1, 3, 2, 2)
    ]
    arrived = _arrived(batching_server, "add_sub_batched")
    calls = []
    for a, b in pairs:  # in this order: 1 + 3 and 2 + 2 items make two batches of the preferred size
        calls.append(client.async_infer("add_sub_batched", add_sub_inputs(a, b)))
        _wait_until(
            f"request {len(calls)} arrives",
            lambda: _arrived(batching_server, "add_sub_batched") == arrived + len(calls),
        )
    for (a, b), call in zip(pairs, calls, strict=True):
        result = call.get_result()
        np.testing.assert_array_equal(result.as_numpy("OUTPUT0"), a + b)
        np.testing.assert_array_equal(result.as_numpy("OUTPUT1"), a - b)
    stats = _statistics(client, "add_sub_batched")
    assert stats["inference_count"] == 8
    assert stats["execution_count"] == 2


def test_configs_triton_refuses_are_unavailable_with_its_reason(client: httpclient.InferenceServerClient) -> None:
    index = {entry["name"]: entry for entry in client.get_model_repository_index()}
    for name, (_, _, reason) in REFUSED.items():
        assert index[name]["state"] == "UNAVAILABLE", name
        assert index[name]["reason"] == f"Invalid argument: {reason}"
    for name in ("unbatched", "policy_without_levels"):
        assert index[name]["state"] == "READY", name


def test_a_model_without_batching_behind_the_batcher(client: httpclient.InferenceServerClient) -> None:
    tensor = httpclient.InferInput("IN", [3], "FP32")
    tensor.set_data_from_numpy(np.arange(3, dtype=np.float32))
    calls = [client.async_infer("unbatched", [tensor]) for _ in range(3)]
    for call in calls:
        np.testing.assert_array_equal(call.get_result().as_numpy("OUT"), np.arange(3, dtype=np.float32))


def _metric(server: Server, name: str, model: str, **labels: str) -> float:
    reply = request(server.metrics_url, "GET", "/metrics")
    for family in text_string_to_metric_families(reply.body.decode()):
        for sample in family.samples:
            if family.name == name and sample.labels.get("model") == model and labels.items() <= sample.labels.items():
                return float(sample.value)
    raise AssertionError(f"no {name} for {model}")


def _pending(server: Server, model: str) -> float:
    """Requests the model's scheduler holds that no instance runs yet."""
    return _metric(server, "nv_inference_pending_request_count", model)


def _arrived(server: Server, model: str) -> float:
    """Requests that reached the model's scheduler and are queued or answered, from one reading of /metrics (a
    request being executed is in neither: while one runs, this is short of what arrived)."""
    reply = request(server.metrics_url, "GET", "/metrics")
    names = ("nv_inference_pending_request_count", "nv_inference_request_success", "nv_inference_request_failure")
    return sum(
        float(sample.value)
        for family in text_string_to_metric_families(reply.body.decode())
        if family.name in names
        for sample in family.samples
        if sample.labels.get("model") == model
    )


def test_metrics_show_the_queue_and_its_rejections(
    batching_server: Server, client: httpclient.InferenceServerClient, tmp_path: Path
) -> None:
    rejected = _metric(batching_server, "nv_inference_request_failure", "reject", reason="REJECTED")
    with _held(batching_server, client, "bounded", tmp_path) as held:
        queued = [_send(client, "bounded") for _ in range(2)]
        _wait_for_pending(batching_server, "bounded", 2)
    held.get_result()
    for call in queued:
        call.get_result()
    assert _metric(batching_server, "nv_inference_pending_request_count", "bounded") == 0
    # A request that timed out in the queue is a failure for the reason REJECTED.
    with _held(batching_server, client, "reject", tmp_path) as held:
        late = _send(client, "reject")
        _wait_for_pending(batching_server, "reject", 1)
        _outlive(REJECT_TIMEOUT_S)
    with pytest.raises(InferenceServerException):
        late.get_result()
    held.get_result()
    assert _metric(batching_server, "nv_inference_request_failure", "reject", reason="REJECTED") == rejected + 1
