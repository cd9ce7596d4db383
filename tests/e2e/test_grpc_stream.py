"""ModelStreamInfer: ordered replies with their request ids, many requests in flight on one stream, errors that
travel in ``error_message`` without closing the stream (or close it, when the client asks for gRPC errors), and
clients that cancel requests or walk away from a stream."""

from __future__ import annotations

import asyncio
import queue
import signal
import time
from collections.abc import AsyncIterator, Iterator
from pathlib import Path
from typing import Any, Final

import grpc
import grpc.aio
import numpy as np
import pytest
import tritonclient.grpc as grpcclient
import tritonclient.grpc.aio as grpcclient_aio
from server import (
    ADD_SUB_INPUT0,
    ADD_SUB_INPUT1,
    Server,
    assert_grpc_still_serving,
    grpc_add_sub_inputs,
    run_server,
)
from tritonclient.grpc import service_pb2, service_pb2_grpc
from tritonclient.utils import InferenceServerException

TIMEOUT_S: Final = 10.0
Outcome = tuple[Any, Any]


@pytest.fixture(autouse=True)
def _still_serving_afterwards(grpc_client: grpcclient.InferenceServerClient) -> Iterator[None]:
    yield
    assert_grpc_still_serving(grpc_client)


@pytest.fixture
def stream_client(server: Server) -> Iterator[tuple[grpcclient.InferenceServerClient, queue.Queue[Outcome]]]:
    """A client with an open stream; its callback puts (result, error) pairs on the queue."""
    client = grpcclient.InferenceServerClient(server.grpc_url)
    outcomes: queue.Queue[Outcome] = queue.Queue()
    client.start_stream(callback=lambda result, error: outcomes.put((result, error)))
    yield client, outcomes
    client.stop_stream()
    client.close()


def _scaled_inputs(i: int) -> list[grpcclient.InferInput]:
    return grpc_add_sub_inputs(ADD_SUB_INPUT0 * i)


def _wrong_dtype_inputs() -> list[grpcclient.InferInput]:
    inputs = grpc_add_sub_inputs()
    inputs[1] = grpcclient.InferInput("INPUT1", [1, 16], "INT32")
    inputs[1].set_data_from_numpy(np.ones((1, 16), dtype=np.int32))
    return inputs


def _check_sum(result: Any, i: int) -> None:
    np.testing.assert_array_equal(result.as_numpy("OUTPUT0"), ADD_SUB_INPUT0 * i + ADD_SUB_INPUT1)


def test_replies_come_in_request_order_with_their_ids(
    stream_client: tuple[grpcclient.InferenceServerClient, queue.Queue[Outcome]],
) -> None:
    client, outcomes = stream_client
    count = 100
    for i in range(count):
        client.async_stream_infer("add_sub", _scaled_inputs(i), request_id=f"r{i}")
    for i in range(count):
        result, error = outcomes.get(timeout=TIMEOUT_S)
        assert error is None
        response = result.get_response()
        assert response.id == f"r{i}"
        assert response.model_name == "add_sub"
        assert response.model_version == "1"
        # Every stream reply says whether it is the request's last; a non-decoupled model sends exactly one.
        assert response.parameters["triton_final_response"].bool_param is True
        assert len(response.raw_output_contents) == 2
        _check_sum(result, i)


def test_a_failing_request_does_not_close_the_stream(
    stream_client: tuple[grpcclient.InferenceServerClient, queue.Queue[Outcome]],
) -> None:
    client, outcomes = stream_client
    client.async_stream_infer("add_sub", _scaled_inputs(1), request_id="good-1")
    client.async_stream_infer("add_sub", _wrong_dtype_inputs(), request_id="bad")
    client.async_stream_infer("nonexistent", _scaled_inputs(1), request_id="unknown")
    client.async_stream_infer("add_sub", _scaled_inputs(2), request_id="good-2")
    client.async_stream_infer("add_sub", _scaled_inputs(3), request_id="good-3")
    got = [outcomes.get(timeout=TIMEOUT_S) for _ in range(5)]
    assert [e is None for _, e in got] == [True, False, False, True, True]
    assert got[1][1].message() == (
        "[request id: bad] inference input 'INPUT1' data-type is 'INT32', but model 'add_sub' expects 'FP32'"
    )
    assert got[2][1].message() == "Request for unknown model: 'nonexistent' is not found"
    for (result, _), (i, request_id) in zip(
        (got[0], got[3], got[4]), ((1, "good-1"), (2, "good-2"), (3, "good-3")), strict=True
    ):
        assert result.get_response().id == request_id
        _check_sum(result, i)


def test_empty_final_response_flag_is_accepted(
    stream_client: tuple[grpcclient.InferenceServerClient, queue.Queue[Outcome]],
) -> None:
    client, outcomes = stream_client
    client.async_stream_infer("add_sub", _scaled_inputs(1), request_id="e", enable_empty_final_response=True)
    result, error = outcomes.get(timeout=TIMEOUT_S)
    assert error is None
    assert result.get_response().parameters["triton_final_response"].bool_param is True
    _check_sum(result, 1)
    # Exactly one reply for a model that is not decoupled, even when an empty final one may be sent.
    with pytest.raises(queue.Empty):
        outcomes.get(timeout=0.2)


def test_grpc_error_mode_ends_the_stream_with_a_status(server: Server) -> None:
    client = grpcclient.InferenceServerClient(server.grpc_url)
    outcomes: queue.Queue[Outcome] = queue.Queue()
    client.start_stream(
        callback=lambda result, error: outcomes.put((result, error)), headers={"triton_grpc_error": "true"}
    )
    try:
        client.async_stream_infer("add_sub", _scaled_inputs(1), request_id="first")
        client.async_stream_infer("add_sub", _wrong_dtype_inputs(), request_id="bad")
        result, error = outcomes.get(timeout=TIMEOUT_S)
        assert error is None
        assert result.get_response().id == "first"
        result, error = outcomes.get(timeout=TIMEOUT_S)
        assert result is None
        assert error.status() == "StatusCode.INVALID_ARGUMENT"
        assert error.message() == (
            "[request id: bad] inference input 'INPUT1' data-type is 'INT32', but model 'add_sub' expects 'FP32'"
        )
    finally:
        client.stop_stream(cancel_requests=True)
        client.close()


# ------------------------------------------------------------------------------------------------------------
# the raw stream, as other clients use it


def _raw_request(request_id: str, model: str = "add_sub") -> Any:
    request = service_pb2.ModelInferRequest(model_name=model, id=request_id)
    for name, array in (("INPUT0", ADD_SUB_INPUT0), ("INPUT1", ADD_SUB_INPUT1)):
        request.inputs.add(name=name, datatype="FP32", shape=[1, 16])
        request.raw_input_contents.append(array.tobytes())
    return request


def test_error_reply_names_the_request(server: Server) -> None:
    async def run() -> list[Any]:
        async with grpc.aio.insecure_channel(server.grpc_url) as channel:
            stub = service_pb2_grpc.GRPCInferenceServiceStub(channel)
            bad = _raw_request("bad")
            bad.model_version = "7"
            call = stub.ModelStreamInfer(iter([_raw_request("a"), bad, _raw_request("b")]))
            return [reply async for reply in call]

    replies = asyncio.run(run())
    assert [r.infer_response.id for r in replies] == ["a", "bad", "b"]
    assert [r.error_message for r in replies] == ["", "Request for unknown model: 'add_sub' version 7 is not found", ""]
    # As Triton answers an error found before the model runs: the request's id and nothing else.
    failed = replies[1].infer_response
    assert failed == service_pb2.ModelInferResponse(id="bad")


def test_stream_without_requests_ends_cleanly(server: Server) -> None:
    async def run() -> list[Any]:
        async with grpc.aio.insecure_channel(server.grpc_url) as channel:
            call = service_pb2_grpc.GRPCInferenceServiceStub(channel).ModelStreamInfer(iter([]))
            return [reply async for reply in call]

    assert asyncio.run(run()) == []


def test_asyncio_client_stream(server: Server) -> None:
    async def requests() -> AsyncIterator[dict[str, Any]]:
        for i in range(20):
            inputs = []
            for name, array in (("INPUT0", ADD_SUB_INPUT0 * i), ("INPUT1", ADD_SUB_INPUT1)):
                tensor = grpcclient_aio.InferInput(name, [1, 16], "FP32")
                tensor.set_data_from_numpy(array)
                inputs.append(tensor)
            yield {"model_name": "add_sub", "inputs": inputs, "request_id": str(i)}

    async def run() -> list[Outcome]:
        client = grpcclient_aio.InferenceServerClient(server.grpc_url)
        try:
            return [outcome async for outcome in client.stream_infer(requests())]
        finally:
            await client.close()

    outcomes = asyncio.run(run())
    assert [result.get_response().id for result, _ in outcomes] == [str(i) for i in range(20)]
    for i, (result, error) in enumerate(outcomes):
        assert error is None
        _check_sum(result, i)


# ------------------------------------------------------------------------------------------------------------
# cancellation


def test_closing_a_stream_mid_way(server: Server, grpc_client: grpcclient.InferenceServerClient) -> None:
    client = grpcclient.InferenceServerClient(server.grpc_url)
    outcomes: queue.Queue[Outcome] = queue.Queue()
    client.start_stream(callback=lambda result, error: outcomes.put((result, error)))
    big = np.ones((8, 16), dtype=np.float32)
    for i in range(300):
        client.async_stream_infer("add_sub", grpc_add_sub_inputs(big, big), request_id=str(i))
    client.stop_stream(cancel_requests=True)
    client.close()
    # The daemon dropped that stream's work and goes on serving other clients.
    assert_grpc_still_serving(grpc_client)


def test_walking_away_from_an_asyncio_stream(server: Server) -> None:
    async def requests() -> AsyncIterator[dict[str, Any]]:
        for i in range(1000):
            yield {"model_name": "add_sub", "inputs": _aio_inputs(), "request_id": str(i)}

    async def run() -> int:
        client = grpcclient_aio.InferenceServerClient(server.grpc_url)
        seen = 0
        try:
            replies = client.stream_infer(requests())
            async for _ in replies:
                seen += 1
                if seen == 5:
                    replies.cancel()
                    break
        finally:
            await client.close()
        return seen

    assert asyncio.run(run()) == 5


def _aio_inputs() -> list[grpcclient_aio.InferInput]:
    inputs = []
    for name, array in (("INPUT0", ADD_SUB_INPUT0), ("INPUT1", ADD_SUB_INPUT1)):
        tensor = grpcclient_aio.InferInput(name, [1, 16], "FP32")
        tensor.set_data_from_numpy(array)
        inputs.append(tensor)
    return inputs


def test_cancelling_an_async_request(grpc_client: grpcclient.InferenceServerClient) -> None:
    outcomes: queue.Queue[Outcome] = queue.Queue()
    big = np.ones((8, 16), dtype=np.float32)
    calls = [
        grpc_client.async_infer(
            "add_sub", grpc_add_sub_inputs(big, big), callback=lambda result, error: outcomes.put((result, error))
        )
        for _ in range(50)
    ]
    for call in calls:
        call.cancel()
    deadline = time.monotonic() + TIMEOUT_S
    finished = 0
    while finished < len(calls) and time.monotonic() < deadline:
        result, error = outcomes.get(timeout=TIMEOUT_S)
        finished += 1
        # A request either finished before the cancel reached it or was cancelled; nothing else.
        if error is not None:
            assert error.status() == "StatusCode.CANCELLED"
        else:
            np.testing.assert_array_equal(result.as_numpy("OUTPUT0"), big * 2)
    assert finished == len(calls)


def test_stopping_the_daemon_ends_open_streams(small_repository: Path) -> None:
    with run_server([small_repository]) as running:
        client = grpcclient.InferenceServerClient(running.grpc_url)
        outcomes: queue.Queue[Outcome] = queue.Queue()
        client.start_stream(callback=lambda result, error: outcomes.put((result, error)))
        try:
            client.async_stream_infer("add_sub", _scaled_inputs(1), request_id="before")
            _, error = outcomes.get(timeout=TIMEOUT_S)
            assert error is None
            started = time.monotonic()
            running.process.send_signal(signal.SIGTERM)  # what systemctl stop sends
            running.process.wait(TIMEOUT_S)
            # An idle stream the client keeps open does not hold the shutdown for the 5 s grace period.
            assert time.monotonic() - started < 4.5
            assert running.process.returncode == 0
            with pytest.raises(InferenceServerException) as caught:
                client.is_server_live()
            assert caught.value.status() == "StatusCode.UNAVAILABLE"
        finally:
            client.stop_stream(cancel_requests=True)
            client.close()
