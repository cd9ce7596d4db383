"""Successful inference over gRPC: every data type through ``raw_input_contents`` and typed ``contents``, batching,
outputs, classification, request parameters, statistics, and the wire details tritonclient and perf_analyzer
depend on (one ``raw_output_contents`` entry per output, in order)."""

from __future__ import annotations

import asyncio
import queue
from collections.abc import Iterator
from typing import Any, Final

import grpc
import ml_dtypes
import numpy as np
import pytest
import tritonclient.grpc as grpcclient
import tritonclient.grpc.aio as grpcclient_aio
from conftest import ALL_DTYPES, identity_model_name
from server import ADD_SUB_INPUT0, ADD_SUB_INPUT1, Server, assert_grpc_still_serving, grpc_add_sub_inputs
from sklearn.datasets import load_digits
from tritonclient.grpc import service_pb2, service_pb2_grpc
from tritonclient.utils import InferenceServerException

DIGIT_LABELS: Final = ("zero", "one", "two", "three", "four", "five", "six", "seven", "eight", "nine")
SUM: Final = ADD_SUB_INPUT0 + ADD_SUB_INPUT1
DIFFERENCE: Final = ADD_SUB_INPUT0 - ADD_SUB_INPUT1


@pytest.fixture(autouse=True)
def _still_serving_afterwards(grpc_client: grpcclient.InferenceServerClient) -> Iterator[None]:
    yield
    assert_grpc_still_serving(grpc_client)


@pytest.fixture(scope="module")
def stub(server: Server) -> Iterator[Any]:
    """A bare stub with tritonclient's own schema, for requests the client library does not build."""
    with grpc.insecure_channel(server.grpc_url) as channel:
        yield service_pb2_grpc.GRPCInferenceServiceStub(channel)


# ------------------------------------------------------------------------------------------------------------
# add_sub through tritonclient


def test_add_sub(grpc_client: grpcclient.InferenceServerClient) -> None:
    result = grpc_client.infer("add_sub", grpc_add_sub_inputs())
    np.testing.assert_array_equal(result.as_numpy("OUTPUT0"), SUM)
    np.testing.assert_array_equal(result.as_numpy("OUTPUT1"), DIFFERENCE)
    response = result.get_response()
    assert response.model_name == "add_sub"
    assert response.model_version == "1"
    assert response.id == ""
    assert [o.name for o in response.outputs] == ["OUTPUT0", "OUTPUT1"]
    assert [list(o.shape) for o in response.outputs] == [[1, 16], [1, 16]]
    assert [o.datatype for o in response.outputs] == ["FP32", "FP32"]
    # One raw entry per output, in the order of the outputs: the C++ client indexes them so.
    assert list(response.raw_output_contents) == [SUM.tobytes(), DIFFERENCE.tobytes()]
    assert not response.parameters


def test_requested_outputs_keep_their_data_aligned(grpc_client: grpcclient.InferenceServerClient) -> None:
    # Whatever order the outputs come in (Triton's is the model's), raw_output_contents[i] belongs to outputs[i].
    outputs = [grpcclient.InferRequestedOutput("OUTPUT1"), grpcclient.InferRequestedOutput("OUTPUT0")]
    response = grpc_client.infer("add_sub", grpc_add_sub_inputs(), outputs=outputs).get_response()
    expected = {"OUTPUT0": SUM.tobytes(), "OUTPUT1": DIFFERENCE.tobytes()}
    assert sorted(o.name for o in response.outputs) == ["OUTPUT0", "OUTPUT1"]
    assert [expected[o.name] for o in response.outputs] == list(response.raw_output_contents)


def test_only_the_requested_output_is_returned(grpc_client: grpcclient.InferenceServerClient) -> None:
    result = grpc_client.infer("add_sub", grpc_add_sub_inputs(), outputs=[grpcclient.InferRequestedOutput("OUTPUT1")])
    assert [o.name for o in result.get_response().outputs] == ["OUTPUT1"]
    assert len(result.get_response().raw_output_contents) == 1
    np.testing.assert_array_equal(result.as_numpy("OUTPUT1"), DIFFERENCE)


@pytest.mark.parametrize("batch", [1, 3, 8])
def test_batches_up_to_max_batch_size(grpc_client: grpcclient.InferenceServerClient, batch: int) -> None:
    input0 = np.arange(16 * batch, dtype=np.float32).reshape(batch, 16)
    input1 = np.full((batch, 16), 2.5, dtype=np.float32)
    result = grpc_client.infer("add_sub", grpc_add_sub_inputs(input0, input1))
    np.testing.assert_array_equal(result.as_numpy("OUTPUT0"), input0 + input1)
    np.testing.assert_array_equal(result.as_numpy("OUTPUT1"), input0 - input1)


def test_non_batching_model(grpc_client: grpcclient.InferenceServerClient) -> None:
    input0 = np.array([1, 2, 3, 4], dtype=np.float32)
    input1 = np.array([1, 1, 1, 1], dtype=np.float32)
    result = grpc_client.infer("add_sub_nobatch", grpc_add_sub_inputs(input0, input1))
    np.testing.assert_array_equal(result.as_numpy("OUTPUT0"), [2, 3, 4, 5])
    assert list(result.get_response().outputs[0].shape) == [4]


def test_request_id_and_explicit_version(grpc_client: grpcclient.InferenceServerClient) -> None:
    result = grpc_client.infer("add_sub", grpc_add_sub_inputs(), model_version="1", request_id="req-7")
    assert result.get_response().id == "req-7"
    assert result.get_response().model_version == "1"


def test_versions_are_routed(grpc_client: grpcclient.InferenceServerClient) -> None:
    data = np.array([[1.5, -2.0]], dtype=np.float32)
    for version, factor in (("1", 1.0), ("2", 2.0), ("", 2.0)):
        tensor = grpcclient.InferInput("INPUT0", [1, 2], "FP32")
        tensor.set_data_from_numpy(data)
        result = grpc_client.infer("two_versions_all", [tensor], model_version=version)
        np.testing.assert_array_equal(result.as_numpy("OUTPUT0"), data * factor)
        assert result.get_response().model_version == (version or "2")


def test_request_parameters_are_accepted(grpc_client: grpcclient.InferenceServerClient) -> None:
    # sequence_id makes the client send sequence_start/end too; priority travels as uint64, timeout as int64.
    result = grpc_client.infer(
        "add_sub",
        grpc_add_sub_inputs(),
        sequence_id=5,
        priority=1,
        timeout=1_000_000,
        parameters={"custom_str": "x", "custom_int": 3, "custom_bool": True, "custom_float": 0.5},
    )
    np.testing.assert_array_equal(result.as_numpy("OUTPUT0"), SUM)
    result = grpc_client.infer("add_sub", grpc_add_sub_inputs(), sequence_id="session-a", sequence_start=True)
    np.testing.assert_array_equal(result.as_numpy("OUTPUT0"), SUM)


def test_empty_final_response_flag_is_accepted(stub: Any) -> None:
    request = _add_sub_request()
    request.parameters["triton_enable_empty_final_response"].bool_param = True
    assert len(stub.ModelInfer(request).raw_output_contents) == 2


def test_async_infer(grpc_client: grpcclient.InferenceServerClient) -> None:
    results: queue.Queue[tuple[Any, Any]] = queue.Queue()
    for i in range(8):
        grpc_client.async_infer(
            "add_sub",
            grpc_add_sub_inputs(ADD_SUB_INPUT0 * i),
            callback=lambda result, error: results.put((result, error)),
            request_id=str(i),
        )
    seen = set()
    for _ in range(8):
        result, error = results.get(timeout=10)
        assert error is None
        i = int(result.get_response().id)
        seen.add(i)
        np.testing.assert_array_equal(result.as_numpy("OUTPUT0"), ADD_SUB_INPUT0 * i + ADD_SUB_INPUT1)
    assert seen == set(range(8))


def test_asyncio_client(server: Server) -> None:
    async def run() -> None:
        client = grpcclient_aio.InferenceServerClient(server.grpc_url)
        try:
            assert await client.is_server_live()
            assert await client.is_model_ready("add_sub")
            inputs = []
            for name, array in (("INPUT0", ADD_SUB_INPUT0), ("INPUT1", ADD_SUB_INPUT1)):
                tensor = grpcclient_aio.InferInput(name, [1, 16], "FP32")
                tensor.set_data_from_numpy(array)
                inputs.append(tensor)
            results = await asyncio.gather(*(client.infer("add_sub", inputs, request_id=str(i)) for i in range(16)))
            assert sorted(int(r.get_response().id) for r in results) == list(range(16))
            for result in results:
                np.testing.assert_array_equal(result.as_numpy("OUTPUT0"), SUM)
        finally:
            await client.close()

    asyncio.run(run())


# ------------------------------------------------------------------------------------------------------------
# every data type through an identity model


def _values(dtype: str, shape: tuple[int, ...]) -> np.ndarray[Any, Any]:
    rng = np.random.default_rng(sum(map(ord, dtype)))
    size = int(np.prod(shape))
    if dtype == "BOOL":
        return rng.integers(0, 2, size=shape).astype(np.bool_)
    if dtype == "BYTES":
        words = ["héllo".encode(), b"", "数字 ✓".encode(), b"a\x00b", b"x" * 300]
        return np.array([words[i % len(words)] for i in range(size)], dtype=np.object_).reshape(shape)
    if dtype == "BF16":
        return np.resize(np.array([1.0, -2.5, 0.0, 3.140625, 1e30, -0.0]), shape).astype(ml_dtypes.bfloat16)
    numpy_type: np.dtype[Any] = np.dtype(
        {"FP16": np.float16, "FP32": np.float32, "FP64": np.float64}.get(dtype) or dtype.lower()
    )
    if numpy_type.kind in "iu":
        info = np.iinfo(numpy_type.type)
        values = rng.integers(info.min, info.max, size=size, dtype=numpy_type.type, endpoint=True)
        values[:2] = (info.min, info.max)
        return values.reshape(shape)
    return rng.standard_normal(size).astype(numpy_type).reshape(shape)


@pytest.mark.parametrize("dtype", ALL_DTYPES)
def test_identity_roundtrip(grpc_client: grpcclient.InferenceServerClient, dtype: str) -> None:
    data = _values(dtype, (2, 5))
    tensor = grpcclient.InferInput("INPUT0", [2, 5], dtype)
    tensor.set_data_from_numpy(data)
    result = grpc_client.infer(identity_model_name(dtype), [tensor])
    output = result.get_output("OUTPUT0")
    assert output.datatype == dtype
    assert list(output.shape) == [2, 5]
    out = result.as_numpy("OUTPUT0")
    assert out is not None
    if dtype == "BYTES":
        assert out.tolist() == data.tolist()
    else:
        assert out.tobytes() == data.tobytes()


def test_bytes_raw_wire_format(stub: Any) -> None:
    elements = [b"hello", b"", "wörld".encode()]
    blob = b"".join(len(e).to_bytes(4, "little") + e for e in elements)
    request = service_pb2.ModelInferRequest(model_name="identity_bytes")
    request.inputs.add(name="INPUT0", datatype="BYTES", shape=[1, 3])
    request.raw_input_contents.append(blob)
    response = stub.ModelInfer(request)
    assert list(response.raw_output_contents) == [blob]
    assert response.outputs[0].datatype == "BYTES"


def test_fp16_and_bf16_travel_raw(stub: Any) -> None:
    for dtype, data in (
        ("FP16", np.array([1.0, 2.5, -3.0], dtype=np.float16)),
        ("BF16", np.array([1.0, 2.5, -3.0], dtype=ml_dtypes.bfloat16)),
    ):
        request = service_pb2.ModelInferRequest(model_name=identity_model_name(dtype))
        request.inputs.add(name="INPUT0", datatype=dtype, shape=[1, 3])
        request.raw_input_contents.append(data.tobytes())
        response = stub.ModelInfer(request)
        assert list(response.raw_output_contents) == [data.tobytes()]


def test_zero_sized_output_has_an_empty_raw_entry(stub: Any) -> None:
    request = service_pb2.ModelInferRequest(model_name="identity_fp32")
    request.inputs.add(name="INPUT0", datatype="FP32", shape=[1, 0])
    request.raw_input_contents.append(b"")
    response = stub.ModelInfer(request)
    assert list(response.outputs[0].shape) == [1, 0]
    assert list(response.raw_output_contents) == [b""]


# ------------------------------------------------------------------------------------------------------------
# typed contents


def _add_sub_request(**typed: Any) -> Any:
    request = service_pb2.ModelInferRequest(model_name="add_sub")
    for name, array in (("INPUT0", ADD_SUB_INPUT0), ("INPUT1", ADD_SUB_INPUT1)):
        request.inputs.add(name=name, datatype="FP32", shape=[1, 16])
        if not typed:
            request.raw_input_contents.append(array.tobytes())
    return request


TYPED: Final[dict[str, str]] = {
    "BOOL": "bool_contents",
    "INT8": "int_contents",
    "INT16": "int_contents",
    "INT32": "int_contents",
    "INT64": "int64_contents",
    "UINT8": "uint_contents",
    "UINT16": "uint_contents",
    "UINT32": "uint_contents",
    "UINT64": "uint64_contents",
    "FP32": "fp32_contents",
    "FP64": "fp64_contents",
    "BYTES": "bytes_contents",
}


@pytest.mark.parametrize("dtype", sorted(TYPED))
def test_typed_contents(stub: Any, dtype: str) -> None:
    data = _values(dtype, (2, 3))
    request = service_pb2.ModelInferRequest(model_name=identity_model_name(dtype), id="typed")
    tensor = request.inputs.add(name="INPUT0", datatype=dtype, shape=[2, 3])
    getattr(tensor.contents, TYPED[dtype]).extend(data.ravel().tolist())
    response = stub.ModelInfer(request)
    assert response.id == "typed"
    # Replies always carry raw contents, whatever form the request used.
    assert not response.outputs[0].HasField("contents")
    raw = response.raw_output_contents[0]
    if dtype == "BYTES":
        assert raw == b"".join(len(e).to_bytes(4, "little") + e for e in data.ravel().tolist())
    else:
        assert raw == data.tobytes()


def test_typed_contents_on_add_sub_nobatch(stub: Any) -> None:
    request = service_pb2.ModelInferRequest(model_name="add_sub_nobatch")
    for name, values in (("INPUT0", [1.0, 2.0, 3.0, 4.0]), ("INPUT1", [1.0, 1.0, 1.0, 1.0])):
        request.inputs.add(name=name, datatype="FP32", shape=[4]).contents.fp32_contents.extend(values)
    response = stub.ModelInfer(request)
    assert response.raw_output_contents[0] == np.array([2, 3, 4, 5], dtype=np.float32).tobytes()
    assert response.raw_output_contents[1] == np.array([0, 1, 2, 3], dtype=np.float32).tobytes()


# ------------------------------------------------------------------------------------------------------------
# classification


def _digit_images(count: int) -> np.ndarray[Any, Any]:
    images, _ = load_digits(return_X_y=True)
    return np.ascontiguousarray(images[::36][:count].astype(np.float32))


def test_classification(grpc_client: grpcclient.InferenceServerClient) -> None:
    images = _digit_images(4)
    image = grpcclient.InferInput("image", list(images.shape), "FP32")
    image.set_data_from_numpy(images)
    plain = grpc_client.infer("digits", [image]).as_numpy("probabilities")
    assert plain is not None
    result = grpc_client.infer(
        "digits", [image], outputs=[grpcclient.InferRequestedOutput("probabilities", class_count=3)]
    )
    output = result.get_output("probabilities")
    assert output.datatype == "BYTES"
    assert list(output.shape) == [4, 3]
    out = result.as_numpy("probabilities")
    assert out is not None
    for probabilities, row in zip(plain, out, strict=True):
        top = np.argsort(-probabilities, kind="stable")[:3]
        assert row.tolist() == [f"{float(probabilities[i]):f}:{i}:{DIGIT_LABELS[i]}".encode() for i in top]


def test_classification_without_labels(grpc_client: grpcclient.InferenceServerClient) -> None:
    result = grpc_client.infer(
        "add_sub", grpc_add_sub_inputs(), outputs=[grpcclient.InferRequestedOutput("OUTPUT0", class_count=2)]
    )
    out = result.as_numpy("OUTPUT0")
    assert out is not None
    assert out.tolist() == [[b"16.000000:15", b"15.000000:14"]]


# ------------------------------------------------------------------------------------------------------------
# statistics


def _stats(client: grpcclient.InferenceServerClient, model: str) -> Any:
    (stats,) = client.get_inference_statistics(model).model_stats
    return stats


@pytest.mark.parametrize("batch", [1, 4])
def test_statistics_count_the_requests(grpc_client: grpcclient.InferenceServerClient, batch: int) -> None:
    before = _stats(grpc_client, "add_sub_int32")
    data = np.arange(16 * batch, dtype=np.int32).reshape(batch, 16)
    requests = 5
    for _ in range(requests):
        inputs = []
        for name in ("INPUT0", "INPUT1"):
            tensor = grpcclient.InferInput(name, [batch, 16], "INT32")
            tensor.set_data_from_numpy(data)
            inputs.append(tensor)
        grpc_client.infer("add_sub_int32", inputs)
    after = _stats(grpc_client, "add_sub_int32")
    assert after.name == "add_sub_int32"
    assert after.version == "1"
    success = after.inference_stats.success.count - before.inference_stats.success.count
    assert success == requests
    assert after.inference_count - before.inference_count == requests * batch
    assert after.execution_count - before.execution_count == requests
    assert after.inference_stats.fail.count == before.inference_stats.fail.count
    assert after.inference_stats.compute_infer.count - before.inference_stats.compute_infer.count == requests
    assert after.inference_stats.success.ns > before.inference_stats.success.ns
    assert after.last_inference >= before.last_inference
    batch_stats = {b.batch_size: b.compute_infer.count for b in after.batch_stats}
    assert batch_stats.get(batch, 0) >= requests


def test_statistics_count_failures(grpc_client: grpcclient.InferenceServerClient) -> None:
    # onnxruntime takes string tensors as str, so bytes that are not UTF-8 fail in the backend, not in validation.
    before = _stats(grpc_client, "identity_bytes")
    tensor = grpcclient.InferInput("INPUT0", [1, 2], "BYTES")
    tensor.set_data_from_numpy(np.array([[b"\xff\xfe\x00binary", b"ok"]], dtype=np.object_))
    with pytest.raises(InferenceServerException) as caught:
        grpc_client.infer("identity_bytes", [tensor])
    assert caught.value.status() == str(grpc.StatusCode.INVALID_ARGUMENT)
    after = _stats(grpc_client, "identity_bytes")
    assert after.inference_stats.fail.count - before.inference_stats.fail.count == 1
    assert after.inference_stats.success.count == before.inference_stats.success.count


def test_refused_requests_are_not_counted(grpc_client: grpcclient.InferenceServerClient) -> None:
    # As in Triton, a request that fails validation never reaches the model and is not a failure of it.
    before = _stats(grpc_client, "add_sub")
    bad = grpc_add_sub_inputs(np.ones((1, 15), dtype=np.float32))
    with pytest.raises(InferenceServerException):
        grpc_client.infer("add_sub", bad)
    after = _stats(grpc_client, "add_sub")
    assert after.inference_stats.fail.count == before.inference_stats.fail.count
    assert after.inference_stats.success.count == before.inference_stats.success.count
