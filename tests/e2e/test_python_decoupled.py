"""Decoupled Python models: zero, one or many responses per request through the response sender, streamed over
gRPC ModelStreamInfer in order with ``triton_final_response``; the unary endpoints refuse them as Triton does;
and a client that cancels is seen by the model as ``request.is_cancelled()``."""

from __future__ import annotations

import queue
import time
from collections.abc import Iterator
from functools import partial
from typing import Any, Final

import numpy as np
import pytest
import tritonclient.grpc as grpcclient
import tritonclient.http as httpclient
from server import Server, post_json
from tritonclient.utils import InferenceServerException

TIMEOUT_S: Final = 10.0


def _repeat_inputs(values: list[int], delays_ms: list[int] | None = None) -> list[grpcclient.InferInput]:
    tensor = grpcclient.InferInput("IN", [len(values)], "INT32")
    tensor.set_data_from_numpy(np.array(values, dtype=np.int32))
    inputs = [tensor]
    if delays_ms is not None:
        delay = grpcclient.InferInput("DELAY", [len(delays_ms)], "UINT32")
        delay.set_data_from_numpy(np.array(delays_ms, dtype=np.uint32))
        inputs.append(delay)
    return inputs


@pytest.fixture
def stream(python_server: Server) -> Iterator[tuple[grpcclient.InferenceServerClient, queue.Queue[Any]]]:
    client = grpcclient.InferenceServerClient(python_server.grpc_url)
    results: queue.Queue[Any] = queue.Queue()
    client.start_stream(callback=partial(lambda q, result, error: q.put(error or result), results))
    yield client, results
    client.stop_stream()
    client.close()


def _final(result: Any) -> bool:
    return bool(result.get_response().parameters["triton_final_response"].bool_param)


def _collect(results: queue.Queue[Any], until_finals: int = 1) -> list[Any]:
    out: list[Any] = []
    finals = 0
    while finals < until_finals:
        item = results.get(timeout=TIMEOUT_S)
        assert not isinstance(item, InferenceServerException), item.message()
        out.append(item)
        finals += _final(item)
    return out


def test_repeat_streams_n_responses_in_order_then_an_empty_final(
    stream: tuple[grpcclient.InferenceServerClient, queue.Queue[Any]],
) -> None:
    client, results = stream
    client.async_stream_infer(
        "repeat_decoupled", _repeat_inputs([4, 8, 15, 16, 23]), request_id="r1", enable_empty_final_response=True
    )
    replies = _collect(results)
    assert len(replies) == 6
    assert [int(r.as_numpy("OUT")[0]) for r in replies[:5]] == [4, 8, 15, 16, 23]
    assert [int(r.as_numpy("IDX")[0]) for r in replies[:5]] == [0, 1, 2, 3, 4]
    assert [_final(r) for r in replies] == [False] * 5 + [True]
    assert all(r.get_response().id == "r1" for r in replies)
    empty = replies[-1].get_response()
    assert not empty.outputs and empty.model_name == "repeat_decoupled" and empty.model_version == "1"


def test_without_the_empty_final_only_the_data_responses_come(
    stream: tuple[grpcclient.InferenceServerClient, queue.Queue[Any]],
) -> None:
    client, results = stream
    client.async_stream_infer("repeat_decoupled", _repeat_inputs([1, 2, 3]), request_id="plain")
    replies = [results.get(timeout=TIMEOUT_S) for _ in range(3)]
    assert [int(r.as_numpy("OUT")[0]) for r in replies] == [1, 2, 3]
    assert not any(_final(r) for r in replies)
    # Nothing more comes for it: a stream's replies leave in the order of its requests, each request's all before
    # the next one's, so the replies to a request sent after it come after anything it still had.
    client.async_stream_infer(
        "repeat_decoupled", _repeat_inputs([7]), request_id="after", enable_empty_final_response=True
    )
    assert [reply.get_response().id for reply in _collect(results)] == ["after", "after"]
    assert results.empty()


def test_zero_responses_give_only_the_empty_final(
    stream: tuple[grpcclient.InferenceServerClient, queue.Queue[Any]],
) -> None:
    client, results = stream
    client.async_stream_infer(
        "repeat_decoupled", _repeat_inputs([]), request_id="none", enable_empty_final_response=True
    )
    (reply,) = _collect(results)
    assert _final(reply) and not reply.get_response().outputs


def test_many_requests_on_one_stream_each_in_order(
    stream: tuple[grpcclient.InferenceServerClient, queue.Queue[Any]],
) -> None:
    client, results = stream
    for n in range(4):
        client.async_stream_infer(
            "repeat_decoupled",
            _repeat_inputs(list(range(n * 10, n * 10 + 3)), [5, 0, 5]),
            request_id=f"q{n}",
            enable_empty_final_response=True,
        )
    replies = _collect(results, until_finals=4)
    by_request: dict[str, list[int]] = {}
    for reply in replies:
        if reply.get_response().outputs:
            by_request.setdefault(reply.get_response().id, []).append(int(reply.as_numpy("OUT")[0]))
    assert by_request == {f"q{n}": [n * 10, n * 10 + 1, n * 10 + 2] for n in range(4)}


def test_a_non_decoupled_python_model_on_a_stream_gives_one_final_response(
    stream: tuple[grpcclient.InferenceServerClient, queue.Queue[Any]],
) -> None:
    client, results = stream
    tensor = grpcclient.InferInput("MODE", [1], "BYTES")
    tensor.set_data_from_numpy(np.array([b"ok"], dtype=np.object_))
    client.async_stream_infer("misbehave", [tensor], enable_empty_final_response=True)
    (reply,) = _collect(results)
    assert _final(reply) and reply.as_numpy("OUT").shape == (1,)


def test_unary_grpc_refuses_a_decoupled_model(python_grpc_client: grpcclient.InferenceServerClient) -> None:
    with pytest.raises(InferenceServerException) as info:
        python_grpc_client.infer("repeat_decoupled", _repeat_inputs([1]))
    assert info.value.status() == "StatusCode.UNIMPLEMENTED"
    assert info.value.message() == "ModelInfer RPC doesn't support models with decoupled transaction policy"


def test_http_refuses_a_decoupled_model(python_server: Server, python_client: httpclient.InferenceServerClient) -> None:
    tensor = httpclient.InferInput("IN", [1], "INT32")
    tensor.set_data_from_numpy(np.array([1], dtype=np.int32))
    with pytest.raises(InferenceServerException) as info:
        python_client.infer("repeat_decoupled", [tensor])
    assert info.value.status() == "501"
    assert info.value.message() == "HTTP end point doesn't support models with decoupled transaction policy"
    reply = post_json(
        python_server.http_url,
        "/v2/models/repeat_decoupled/infer",
        {"inputs": [{"name": "IN", "datatype": "INT32", "shape": [1], "data": [1]}]},
    )
    assert reply.status == 501


def _wait_for_log(server: Server, text: str) -> None:
    deadline = time.monotonic() + TIMEOUT_S
    while text not in server.log():
        assert time.monotonic() < deadline, f"'{text}' never appeared in the daemon's log"
        time.sleep(0.05)


def test_a_cancelled_stream_request_is_seen_by_the_model(python_server: Server) -> None:
    client = grpcclient.InferenceServerClient(python_server.grpc_url)
    results: queue.Queue[Any] = queue.Queue()
    client.start_stream(callback=partial(lambda q, result, error: q.put(error or result), results))
    # The model waits for the cancellation before its second response, so that it sees it there on any machine.
    client.async_stream_infer(
        "repeat_decoupled", _repeat_inputs([1, 2, 3, 4]), request_id="gone", parameters={"wait_cancel_after": 1}
    )
    first = results.get(timeout=TIMEOUT_S)
    assert int(first.as_numpy("OUT")[0]) == 1
    client.stop_stream(cancel_requests=True)
    client.close()
    _wait_for_log(python_server, "request 'gone' was cancelled after 1 responses")


def test_a_cancelled_unary_request_is_seen_by_the_model(python_server: Server) -> None:
    client = grpcclient.InferenceServerClient(python_server.grpc_url)
    tensor = grpcclient.InferInput("MODE", [1], "BYTES")
    tensor.set_data_from_numpy(np.array([b"wait_cancel"], dtype=np.object_))
    done: queue.Queue[Any] = queue.Queue()
    call = client.async_infer(
        "misbehave", [tensor], partial(lambda q, result, error: q.put(error or result), done), request_id="c1"
    )
    _wait_for_log(python_server, "request 'c1' waits for its cancellation")
    call.cancel()
    error = done.get(timeout=TIMEOUT_S)
    assert isinstance(error, InferenceServerException) and "CANCELLED" in str(error.status())
    _wait_for_log(python_server, "request 'c1' cancelled: True")
    client.close()


def test_a_slow_request_does_not_hold_back_the_responses_of_the_next(python_server: Server) -> None:
    """As Triton writes a stream: a decoupled model's responses go out as they come, whichever request they answer.
    The first request answers once, then waits (for its cancellation, which only the end of the test brings); the
    second one's responses must arrive meanwhile, not after the first request ends."""
    client = grpcclient.InferenceServerClient(python_server.grpc_url)
    results: queue.Queue[Any] = queue.Queue()
    client.start_stream(callback=partial(lambda q, result, error: q.put(error or result), results))
    client.async_stream_infer(
        "repeat_decoupled", _repeat_inputs([1, 2]), request_id="slow", parameters={"wait_cancel_after": 1}
    )
    first = results.get(timeout=TIMEOUT_S)
    assert (first.get_response().id, int(first.as_numpy("OUT")[0])) == ("slow", 1)
    _wait_for_log(python_server, "request 'slow' waits for its cancellation")
    client.async_stream_infer(
        "repeat_decoupled", _repeat_inputs([7, 8]), request_id="quick", enable_empty_final_response=True
    )
    replies = _collect(results)
    assert [
        (r.get_response().id, [int(v) for v in r.as_numpy("OUT")] if r.get_response().outputs else []) for r in replies
    ] == [
        ("quick", [7]),
        ("quick", [8]),
        ("quick", []),
    ]
    client.stop_stream(cancel_requests=True)
    client.close()
    _wait_for_log(python_server, "request 'slow' was cancelled after 1 responses")
