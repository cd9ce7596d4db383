"""The system shared memory extension over gRPC: regions registered, listed and unregistered by RPC, inputs read
from and outputs written into them with no tensor bytes in the messages, and the same checks as over HTTP."""

from __future__ import annotations

import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import grpc
import numpy as np
import pytest
import tritonclient.grpc as grpcclient
import tritonclient.http as httpclient
import tritonclient.utils.shared_memory as shm
from server import ADD_SUB_INPUT0, ADD_SUB_INPUT1, Server, assert_grpc_still_serving, run_server
from tritonclient.grpc import service_pb2, service_pb2_grpc
from tritonclient.utils import InferenceServerException

REGION_BYTES = 128
# The key prefix Triton reserves for its Python backend: refused at registration, as Triton refuses it.
TRITON_PREFIX = "triton_python_backend_shm_region_"
Regions = tuple[Any, Any, str, str]


@pytest.fixture(scope="module")
def shm_grpc_server(small_repository: Path) -> Iterator[Server]:
    with run_server([small_repository], "--allow-client-shm=true") as running:
        yield running


@pytest.fixture
def client(shm_grpc_server: Server) -> Iterator[grpcclient.InferenceServerClient]:
    triton = grpcclient.InferenceServerClient(shm_grpc_server.grpc_url)
    yield triton
    assert_grpc_still_serving(triton)
    triton.unregister_system_shared_memory()
    assert not triton.get_system_shared_memory_status().regions
    triton.close()


@pytest.fixture
def regions() -> Iterator[Regions]:
    """An input region holding add_sub's two inputs and an empty output region, with unique keys."""
    tag = uuid.uuid4().hex[:8]
    in_key, out_key = f"/edged_grpc_in_{tag}", f"/edged_grpc_out_{tag}"
    inputs = shm.create_shared_memory_region("in", in_key, REGION_BYTES)
    outputs = shm.create_shared_memory_region("out", out_key, REGION_BYTES)
    shm.set_shared_memory_region(inputs, [ADD_SUB_INPUT0, ADD_SUB_INPUT1])
    yield inputs, outputs, in_key, out_key
    shm.destroy_shared_memory_region(inputs)
    shm.destroy_shared_memory_region(outputs)


def _shm_inputs(size: int = 64, offset1: int = 64) -> list[grpcclient.InferInput]:
    first = grpcclient.InferInput("INPUT0", [1, 16], "FP32")
    first.set_shared_memory("in", size)
    second = grpcclient.InferInput("INPUT1", [1, 16], "FP32")
    second.set_shared_memory("in", size, offset=offset1)
    return [first, second]


def _error(call: Any) -> InferenceServerException:
    with pytest.raises(InferenceServerException) as caught:
        call()
    return caught.value


def test_inputs_and_outputs_travel_through_regions(client: grpcclient.InferenceServerClient, regions: Regions) -> None:
    _, out_region, in_key, out_key = regions
    client.register_system_shared_memory("in", in_key, REGION_BYTES)
    client.register_system_shared_memory("out", out_key, REGION_BYTES)
    status = client.get_system_shared_memory_status(as_json=True)["regions"]
    assert status == {
        "in": {"name": "in", "key": in_key, "byte_size": str(REGION_BYTES)},
        "out": {"name": "out", "key": out_key, "byte_size": str(REGION_BYTES)},
    }
    assert list(client.get_system_shared_memory_status("in").regions) == ["in"]

    sum_out = grpcclient.InferRequestedOutput("OUTPUT0")
    sum_out.set_shared_memory("out", 64)
    diff_out = grpcclient.InferRequestedOutput("OUTPUT1")
    diff_out.set_shared_memory("out", 64, offset=64)
    response = client.infer("add_sub", _shm_inputs(), outputs=[sum_out, diff_out]).get_response()

    assert [o.name for o in response.outputs] == ["OUTPUT0", "OUTPUT1"]
    # An entry per output still, each empty: the bytes are in the client's region.
    assert list(response.raw_output_contents) == [b"", b""]
    assert [list(o.shape) for o in response.outputs] == [[1, 16], [1, 16]]
    assert not any(o.parameters for o in response.outputs)
    np.testing.assert_array_equal(
        shm.get_contents_as_numpy(out_region, np.float32, [1, 16]), ADD_SUB_INPUT0 + ADD_SUB_INPUT1
    )
    np.testing.assert_array_equal(
        shm.get_contents_as_numpy(out_region, np.float32, [1, 16], offset=64), ADD_SUB_INPUT0 - ADD_SUB_INPUT1
    )


def test_region_registered_over_http_serves_grpc(
    shm_grpc_server: Server, client: grpcclient.InferenceServerClient, regions: Regions
) -> None:
    _, _, in_key, _ = regions
    http = httpclient.InferenceServerClient(shm_grpc_server.http_url)
    try:
        http.register_system_shared_memory("in", in_key, REGION_BYTES)
        second = grpcclient.InferInput("INPUT1", [1, 16], "FP32")
        second.set_data_from_numpy(ADD_SUB_INPUT1 * 3)
        result = client.infer("add_sub", [_shm_inputs()[0], second])
        np.testing.assert_array_equal(result.as_numpy("OUTPUT0"), ADD_SUB_INPUT0 + 3)
        client.unregister_system_shared_memory("in")
        assert http.get_system_shared_memory_status() == []
    finally:
        http.close()


def test_shared_memory_input_must_not_carry_contents(shm_grpc_server: Server, regions: Regions) -> None:
    request = service_pb2.ModelInferRequest(model_name="add_sub")
    for name in ("INPUT0", "INPUT1"):
        tensor = request.inputs.add(name=name, datatype="FP32", shape=[1, 16])
        tensor.parameters["shared_memory_region"].string_param = "in"
        tensor.parameters["shared_memory_byte_size"].int64_param = 64
    request.inputs[0].contents.fp32_contents.extend([1.0] * 16)
    with grpc.insecure_channel(shm_grpc_server.grpc_url) as channel, pytest.raises(grpc.RpcError) as caught:
        service_pb2_grpc.GRPCInferenceServiceStub(channel).ModelInfer(request)
    assert caught.value.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert caught.value.details() == (
        "unexpected 'content' provided when using shared memory for input tensor 'INPUT0' for model 'add_sub'"
    )


@pytest.mark.parametrize(
    ("size", "offset1", "problem"),
    [
        (64, 100, "offset + byte size"),
        (64, REGION_BYTES, "offset"),
        (REGION_BYTES + 1, 0, "offset + byte size"),
        (64, -1, "offset"),
    ],
)
def test_window_outside_the_region_is_refused(
    client: grpcclient.InferenceServerClient, regions: Regions, size: int, offset1: int, problem: str
) -> None:
    _, _, in_key, _ = regions
    client.register_system_shared_memory("in", in_key, REGION_BYTES)
    error = _error(lambda: client.infer("add_sub", _shm_inputs(size, offset1)))
    assert error.status() == "StatusCode.INVALID_ARGUMENT"
    assert error.message() == f"Invalid {problem} for shared memory region: 'in'"


def test_unregistered_region_is_refused(client: grpcclient.InferenceServerClient) -> None:
    error = _error(lambda: client.infer("add_sub", _shm_inputs()))
    assert error.status() == "StatusCode.NOT_FOUND"
    assert error.message() == "Unable to find shared memory region: 'in'"


def test_output_region_too_small(client: grpcclient.InferenceServerClient, regions: Regions) -> None:
    _, _, in_key, out_key = regions
    client.register_system_shared_memory("in", in_key, REGION_BYTES)
    client.register_system_shared_memory("out", out_key, REGION_BYTES)
    output = grpcclient.InferRequestedOutput("OUTPUT0")
    output.set_shared_memory("out", 32)
    error = _error(lambda: client.infer("add_sub", _shm_inputs(), outputs=[output]))
    assert "(32 bytes) should be at least 64 bytes to hold the results" in str(error.message())


def test_registration_errors(client: grpcclient.InferenceServerClient, regions: Regions) -> None:
    _, _, in_key, _ = regions
    client.register_system_shared_memory("in", in_key, REGION_BYTES)
    error = _error(lambda: client.register_system_shared_memory("in", in_key, REGION_BYTES))
    assert error.status() == "StatusCode.ALREADY_EXISTS"
    assert error.message() == "shared memory region 'in' already in manager"
    error = _error(lambda: client.register_system_shared_memory("x", "/edged_no_such_key", 8))
    assert error.status() == "StatusCode.INTERNAL"
    assert error.message() == "Unable to open shared memory region: '/edged_no_such_key'"
    # The key is opened before the sizes are looked at (Triton's order): a size of 0 with a key that opens nothing.
    error = _error(lambda: client.register_system_shared_memory("x", "/edged_no_such_key", 0))
    assert (error.status(), error.message()) == (
        "StatusCode.INTERNAL",
        "Unable to open shared memory region: '/edged_no_such_key'",
    )
    error = _error(lambda: client.register_system_shared_memory("zero", in_key, 0))
    assert error.status() == "StatusCode.INVALID_ARGUMENT" and "invalid args" in error.message()
    error = _error(lambda: client.register_system_shared_memory("evil", "/../../etc/passwd", 8))
    assert error.message() == "Unable to open shared memory region: '/../../etc/passwd'"
    for key, prefix in (("/edged-internal", "edged-"), ("/triton_python_backend_shm_region_1", TRITON_PREFIX)):
        error = _error(lambda key=key: client.register_system_shared_memory("evil", key, 8))
        assert error.status() == "StatusCode.INVALID_ARGUMENT"
        assert error.message() == (
            f"cannot register shared memory region 'evil' with key '{key}' as the key contains the reserved prefix "
            f"'{prefix}'"
        )
    error = _error(lambda: client.register_system_shared_memory("evil", "/", 8))
    assert (error.status(), error.message()) == (
        "StatusCode.INVALID_ARGUMENT",
        "cannot register shared memory region 'evil' - invalid shm key '/'",
    )
    error = _error(lambda: client.register_system_shared_memory("wrap", in_key, 2**64 - 1, offset=2**64 - 1))
    assert error.status() == "StatusCode.INVALID_ARGUMENT"
    error = _error(lambda: client.get_system_shared_memory_status("nowhere"))
    assert error.status() == "StatusCode.NOT_FOUND"
    assert list(client.get_system_shared_memory_status().regions) == ["in"]
    client.unregister_system_shared_memory("never-registered")


def test_cuda_shared_memory_is_unsupported(client: grpcclient.InferenceServerClient) -> None:
    assert not client.get_cuda_shared_memory_status().regions
    error = _error(lambda: client.register_cuda_shared_memory("gpu", b"\0" * 64, 0, 8))
    assert error.status() == "StatusCode.UNIMPLEMENTED"
    assert "CUDA" in str(error.message())
    client.unregister_cuda_shared_memory()
