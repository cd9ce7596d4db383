"""Bad requests over gRPC: each gets Triton's status code and message, and the daemon keeps serving.

The expected messages are the ones Triton 2.51 answered for the same requests (or, where the oracle did not
cover a case, the text of Triton's gRPC frontend for it).
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any, Final

import grpc
import numpy as np
import pytest
import tritonclient.grpc as grpcclient
from server import ADD_SUB_INPUT0, ADD_SUB_INPUT1, Server, assert_grpc_still_serving, grpc_add_sub_inputs, run_server
from tritonclient.grpc import service_pb2, service_pb2_grpc
from tritonclient.utils import InferenceServerException

NO_ID: Final = "[request id: <id_unknown>] "
INVALID: Final = grpc.StatusCode.INVALID_ARGUMENT
SMALL_MESSAGE_LIMIT: Final = 4096


@pytest.fixture(autouse=True)
def _still_serving_afterwards(grpc_client: grpcclient.InferenceServerClient) -> Iterator[None]:
    yield
    assert_grpc_still_serving(grpc_client)


@pytest.fixture(scope="module")
def stub(server: Server) -> Iterator[Any]:
    with grpc.insecure_channel(server.grpc_url) as channel:
        yield service_pb2_grpc.GRPCInferenceServiceStub(channel)


def _request(model: str = "add_sub", *, raw: bool = True, **fields: Any) -> Any:
    """add_sub's good request (raw contents), for a test to break in one place."""
    request = service_pb2.ModelInferRequest(model_name=model, **fields)
    for name, array in (("INPUT0", ADD_SUB_INPUT0), ("INPUT1", ADD_SUB_INPUT1)):
        request.inputs.add(name=name, datatype="FP32", shape=[1, 16])
        if raw:
            request.raw_input_contents.append(array.tobytes())
    return request


def _fails(stub: Any, request: Any, code: grpc.StatusCode, message: str) -> None:
    with pytest.raises(grpc.RpcError) as caught:
        stub.ModelInfer(request)
    assert caught.value.code() == code
    assert caught.value.details() == message


def _client_error(call: Callable[[], Any]) -> InferenceServerException:
    with pytest.raises(InferenceServerException) as caught:
        call()
    return caught.value


# ------------------------------------------------------------------------------------------------------------
# which model


def test_unknown_model(grpc_client: grpcclient.InferenceServerClient) -> None:
    error = _client_error(lambda: grpc_client.infer("nonexistent", grpc_add_sub_inputs()))
    assert error.status() == "StatusCode.NOT_FOUND"
    assert error.message() == "Request for unknown model: 'nonexistent' is not found"
    assert str(error) == "[StatusCode.NOT_FOUND] Request for unknown model: 'nonexistent' is not found"


def test_unknown_model_is_reported_before_a_malformed_request(stub: Any) -> None:
    request = _request("nonexistent", raw=False)
    request.parameters["triton_foo"].int64_param = 1
    _fails(stub, request, grpc.StatusCode.NOT_FOUND, "Request for unknown model: 'nonexistent' is not found")


@pytest.mark.parametrize(
    ("model", "version", "code", "message"),
    [
        ("add_sub", "2", grpc.StatusCode.NOT_FOUND, "Request for unknown model: 'add_sub' version 2 is not found"),
        (
            "add_sub",
            "abc",
            INVALID,
            "failed to get model version from specified version string 'abc' (details: stol), version should be an "
            "integral value > 0",
        ),
        (
            "broken_dims",
            "",
            grpc.StatusCode.NOT_FOUND,
            "Request for unknown model: 'broken_dims' has no available versions",
        ),
        (
            "broken_dtype",
            "1",
            grpc.StatusCode.UNAVAILABLE,
            "Request for unknown model: 'broken_dtype' version 1 is not at ready state",
        ),
    ],
)
def test_unknown_or_unready_versions(stub: Any, model: str, version: str, code: grpc.StatusCode, message: str) -> None:
    _fails(stub, _request(model, model_version=version), code, message)


# ------------------------------------------------------------------------------------------------------------
# what the core validates, with its messages


def test_wrong_datatype(grpc_client: grpcclient.InferenceServerClient) -> None:
    inputs = grpc_add_sub_inputs()
    inputs[1] = grpcclient.InferInput("INPUT1", [1, 16], "INT32")
    inputs[1].set_data_from_numpy(np.ones((1, 16), dtype=np.int32))
    error = _client_error(lambda: grpc_client.infer("add_sub", inputs))
    assert error.status() == "StatusCode.INVALID_ARGUMENT"
    assert (
        error.message() == f"{NO_ID}inference input 'INPUT1' data-type is 'INT32', but model 'add_sub' expects 'FP32'"
    )


def test_wrong_shape(stub: Any) -> None:
    request = _request()
    del request.inputs[0].shape[:]
    request.inputs[0].shape.extend([1, 15])
    request.raw_input_contents[0] = request.raw_input_contents[0][:60]
    message = _fails_message(stub, request)
    assert message.startswith(
        f"{NO_ID}unexpected shape for input 'INPUT0' for model 'add_sub'. Expected [-1,16], got [1,15]. NOTE:"
    )


def _fails_message(stub: Any, request: Any, code: grpc.StatusCode = INVALID) -> str:
    with pytest.raises(grpc.RpcError) as caught:
        stub.ModelInfer(request)
    assert caught.value.code() == code
    return str(caught.value.details())


def test_batch_too_large(grpc_client: grpcclient.InferenceServerClient) -> None:
    big = np.ones((9, 16), dtype=np.float32)
    error = _client_error(lambda: grpc_client.infer("add_sub", grpc_add_sub_inputs(big, big)))
    assert error.message() == f"{NO_ID}inference request batch-size must be <= 8 for 'add_sub'"


def test_missing_input(stub: Any) -> None:
    request = _request(id="r1")
    del request.inputs[1]
    del request.raw_input_contents[1]
    _fails(
        stub,
        request,
        INVALID,
        "[request id: r1] expected 2 inputs but got 1 inputs for model 'add_sub'. Got input(s) ['INPUT0'], but "
        "missing required input(s) ['INPUT1']. Please provide all required input(s).",
    )


def test_unknown_input(stub: Any) -> None:
    request = _request()
    request.inputs[1].name = "INPUTX"
    _fails(stub, request, INVALID, "unexpected inference input 'INPUTX' for model 'add_sub'")


def test_unknown_output(stub: Any) -> None:
    request = _request()
    request.outputs.add(name="OUTPUTX")
    _fails(stub, request, INVALID, "unexpected inference output 'OUTPUTX' for model 'add_sub'")


def test_an_output_asked_for_twice(stub: Any) -> None:
    request = _request()
    request.outputs.add(name="OUTPUT0")
    request.outputs.add(name="OUTPUT0")
    _fails(stub, request, INVALID, "[request id: <id_unknown>] output 'OUTPUT0' already exists in request")


def test_raw_contents_size_mismatch(stub: Any) -> None:
    request = _request()
    request.raw_input_contents[1] = request.raw_input_contents[1][:60]
    _fails(
        stub,
        request,
        INVALID,
        f"{NO_ID}input byte size mismatch for input 'INPUT1' for model 'add_sub'. Expected 64, got 60",
    )


def test_fewer_raw_contents_than_inputs(stub: Any) -> None:
    request = _request()
    del request.raw_input_contents[1]
    _fails(stub, request, INVALID, "unable to find data for input tensor 'INPUT1' for model 'add_sub' in request.")


def test_no_data_at_all(stub: Any) -> None:
    _fails(
        stub,
        _request(raw=False),
        INVALID,
        "unable to find data for input tensor 'INPUT0' for model 'add_sub' in request.",
    )


def test_unknown_datatype_name(stub: Any) -> None:
    request = _request()
    request.inputs[0].datatype = "FP33"
    _fails(
        stub,
        request,
        INVALID,
        f"{NO_ID}inference input 'INPUT0' data-type is 'FP33', but model 'add_sub' expects 'FP32'",
    )


def _bytes_request(shape: list[int], *elements: bytes, cut: int = 0) -> Any:
    blob = b"".join(len(e).to_bytes(4, "little") + e for e in elements)
    request = service_pb2.ModelInferRequest(model_name="identity_bytes")
    request.inputs.add(name="INPUT0", datatype="BYTES", shape=shape)
    request.raw_input_contents.append(blob[: len(blob) - cut])
    return request


def test_bytes_element_cut_short(stub: Any) -> None:
    message = _fails_message(stub, _bytes_request([1, 3], b"hello", b"", "wörld".encode(), cut=2))
    assert "'INPUT0'" in message


def test_more_bytes_elements_than_the_shape(stub: Any) -> None:
    _fails(
        stub,
        _bytes_request([1, 2], b"hello", b"", b"world"),
        INVALID,
        f"{NO_ID}unexpected number of string elements 3 for inference input 'INPUT0' for model 'identity_bytes', "
        "expecting 2",
    )


def test_fewer_bytes_elements_than_the_shape(stub: Any) -> None:
    _fails(
        stub,
        _bytes_request([1, 3], b"hello", b"world"),
        INVALID,
        f"{NO_ID}expected 3 string elements for inference input 'INPUT0' for model 'identity_bytes', got 2",
    )


# ------------------------------------------------------------------------------------------------------------
# typed contents


def test_contents_beside_raw_contents(stub: Any) -> None:
    request = _request()
    request.inputs[0].contents.fp32_contents.extend([1.0] * 16)
    _fails(
        stub,
        request,
        INVALID,
        "contents field must not be specified when using raw_input_contents for 'INPUT0' for model 'add_sub'",
    )


def test_contents_of_another_type(stub: Any) -> None:
    request = _request(raw=False)
    request.inputs[0].contents.int_contents.extend([1] * 16)
    request.inputs[1].contents.fp32_contents.extend([1.0] * 16)
    _fails(
        stub,
        request,
        INVALID,
        "unexpected explicit tensor data for input tensor 'INPUT0' for model 'add_sub' of type 'INT32', expected "
        "datatype 'FP32'",
    )


def test_contents_in_two_fields(stub: Any) -> None:
    request = _request(raw=False)
    request.inputs[0].contents.fp32_contents.extend([1.0] * 16)
    request.inputs[0].contents.fp64_contents.extend([1.0] * 16)
    request.inputs[1].contents.fp32_contents.extend([1.0] * 16)
    _fails(
        stub,
        request,
        INVALID,
        "unexpected explicit tensor data for input tensor 'INPUT0' for model 'add_sub', binary data was already "
        "supplied.",
    )


def test_fp16_has_no_typed_contents(stub: Any) -> None:
    request = service_pb2.ModelInferRequest(model_name="identity_fp16")
    request.inputs.add(name="INPUT0", datatype="FP16", shape=[1, 2]).contents.fp32_contents.extend([1.0, 2.0])
    _fails(
        stub,
        request,
        INVALID,
        "unexpected explicit tensor data for input tensor 'INPUT0' for model 'identity_fp16' of type 'FP32', "
        "expected datatype 'FP16'",
    )


def test_too_few_typed_values(stub: Any) -> None:
    request = _request(raw=False)
    request.inputs[0].contents.fp32_contents.extend([1.0] * 15)
    request.inputs[1].contents.fp32_contents.extend([1.0] * 16)
    _fails(
        stub,
        request,
        INVALID,
        f"{NO_ID}input byte size mismatch for input 'INPUT0' for model 'add_sub'. Expected 64, got 60",
    )


# ------------------------------------------------------------------------------------------------------------
# parameters


def _set(parameter: Any, kind: str, value: Any) -> None:
    setattr(parameter, kind, value)


@pytest.mark.parametrize(
    ("key", "kind", "value", "message"),
    [
        (
            "triton_foo",
            "int64_param",
            1,
            "parameter keys starting with 'triton_' are reserved for Triton usage. Only the following keys starting "
            "with 'triton_' are allowed: triton_enable_empty_final_response",
        ),
        (
            "triton_enable_empty_final_response",
            "int64_param",
            1,
            "invalid value type for 'triton_enable_empty_final_response' parameter, expected bool_param.",
        ),
        (
            "sequence_id",
            "bool_param",
            True,
            "invalid value type for 'sequence_id' parameter, expected int64_param or string_param.",
        ),
        ("sequence_start", "int64_param", 1, "invalid value type for 'sequence_start' parameter, expected bool_param."),
        ("sequence_end", "string_param", "x", "invalid value type for 'sequence_end' parameter, expected bool_param."),
        ("priority", "int64_param", -1, "invalid value for 'priority', expected value >= 0."),
        (
            "priority",
            "string_param",
            "high",
            "invalid value type for 'priority' parameter, expected int64_param or uint64_param.",
        ),
        ("timeout", "uint64_param", 5, "invalid value type for 'timeout' parameter, expected int64_param."),
        (
            "custom",
            "uint64_param",
            5,
            "invalid value type for 'custom' parameter, expected int64_param, bool_param, or string_param.",
        ),
    ],
)
def test_request_parameter_errors(stub: Any, key: str, kind: str, value: Any, message: str) -> None:
    request = _request()
    _set(request.parameters[key], kind, value)
    _fails(stub, request, INVALID, message)


def test_classification_parameter_errors(stub: Any) -> None:
    request = _request()
    request.outputs.add(name="OUTPUT0").parameters["classification"].string_param = "2"
    _fails(stub, request, INVALID, "invalid value type for 'classification' parameter, expected int64_param")
    request = _request()
    request.outputs.add(name="OUTPUT0").parameters["classification"].int64_param = 0
    _fails(stub, request, INVALID, "invalid value for 'classification' parameter, expected >= 0")


def test_classification_of_a_shared_memory_output(stub: Any) -> None:
    request = _request()
    output = request.outputs.add(name="OUTPUT0")
    output.parameters["classification"].int64_param = 2
    output.parameters["shared_memory_region"].string_param = "out"
    output.parameters["shared_memory_byte_size"].int64_param = 64
    _fails(stub, request, INVALID, "output can't set both 'shared_memory_region' and 'classification'")


def test_classification_of_bytes_is_refused(grpc_client: grpcclient.InferenceServerClient) -> None:
    tensor = grpcclient.InferInput("INPUT0", [1, 2], "BYTES")
    tensor.set_data_from_numpy(np.array([[b"a", b"b"]], dtype=np.object_))
    error = _client_error(
        lambda: grpc_client.infer(
            "identity_bytes", [tensor], outputs=[grpcclient.InferRequestedOutput("OUTPUT0", class_count=1)]
        )
    )
    assert error.status() == "StatusCode.INVALID_ARGUMENT"
    assert "class result not available for output due to unsupported type 'BYTES'" in error.message()


# ------------------------------------------------------------------------------------------------------------
# shared memory parameters (parsed as Triton parses them, whether or not shared memory is allowed)


@pytest.mark.parametrize(
    ("parameters", "message"),
    [
        (
            {"shared_memory_offset": ("int64_param", 0)},
            "'shared_memory_offset' can not be specified without 'shared_memory_region' parameter for tensor 'INPUT0'",
        ),
        (
            {"shared_memory_region": ("int64_param", 1), "shared_memory_byte_size": ("int64_param", 64)},
            "invalid value type for 'shared_memory_region' parameter for tensor 'INPUT0', expected string_param.",
        ),
        (
            {"shared_memory_region": ("string_param", "r")},
            "'shared_memory_byte_size' must be specified along with 'shared_memory_region' parameter for tensor "
            "'INPUT0'",
        ),
        (
            {"shared_memory_region": ("string_param", "r"), "shared_memory_byte_size": ("uint64_param", 64)},
            "invalid value type for 'shared_memory_byte_size' parameter for tensor 'INPUT0', expected int64_param.",
        ),
    ],
)
def test_shared_memory_parameter_errors(stub: Any, parameters: dict[str, tuple[str, Any]], message: str) -> None:
    request = _request()
    for key, (kind, value) in parameters.items():
        _set(request.inputs[0].parameters[key], kind, value)
    _fails(stub, request, INVALID, message)


def test_shared_memory_input_while_disabled(stub: Any) -> None:
    request = _request()
    del request.raw_input_contents[0]
    request.inputs[0].parameters["shared_memory_region"].string_param = "r"
    request.inputs[0].parameters["shared_memory_byte_size"].int64_param = 64
    message = _fails_message(stub, request, grpc.StatusCode.UNIMPLEMENTED)
    assert "--allow-client-shm" in message


# ------------------------------------------------------------------------------------------------------------
# message size


@pytest.fixture(scope="module")
def small_message_server(small_repository: Path) -> Iterator[Server]:
    with run_server([small_repository], "--grpc-max-message-size", str(SMALL_MESSAGE_LIMIT)) as running:
        yield running


def test_message_over_the_limit_is_resource_exhausted(small_message_server: Server) -> None:
    client = grpcclient.InferenceServerClient(small_message_server.grpc_url)
    try:
        big = np.ones((8, 16), dtype=np.float32)  # 2 x 512 bytes: fits
        np.testing.assert_array_equal(
            client.infer("add_sub", grpc_add_sub_inputs(big, big)).as_numpy("OUTPUT0"), big * 2
        )
        tensor = grpcclient.InferInput("INPUT0", [1, SMALL_MESSAGE_LIMIT], "FP32")
        tensor.set_data_from_numpy(np.ones((1, SMALL_MESSAGE_LIMIT), dtype=np.float32))
        error = _client_error(lambda: client.infer("add_sub", [tensor, tensor]))
        assert error.status() == "StatusCode.RESOURCE_EXHAUSTED"
        assert_grpc_still_serving(client)
    finally:
        client.close()


def test_grpc_can_be_turned_off(small_repository: Path) -> None:
    with run_server([small_repository], "--allow-grpc=false") as running:
        assert "gRPC on" not in running.log()
        client = grpcclient.InferenceServerClient(running.grpc_url)
        error = _client_error(client.is_server_live)
        assert error.status() == "StatusCode.UNAVAILABLE"
        client.close()


@pytest.mark.parametrize("dims", [[-1, 16], [1, -16]], ids=["batch", "item"])
def test_negative_dimensions_are_refused(stub: Any, dims: list[int]) -> None:
    request = _request()
    request.inputs[0].ClearField("shape")
    request.inputs[0].shape.extend(dims)
    shape = "[" + ",".join(str(d) for d in dims) + "]"
    _fails(
        stub,
        request,
        INVALID,
        f"{NO_ID}All input dimensions should be specified for input 'INPUT0' for model 'add_sub', got {shape}",
    )


def test_a_huge_shape_is_refused_before_numpy_sees_it(stub: Any) -> None:
    request = _request()
    request.inputs[0].ClearField("shape")
    request.inputs[0].shape.extend([0, 2**62])
    message = _fails_message(stub, request)
    assert message.endswith("has shape [0,4611686018427387904], more than 1099511627776 elements"), message
