"""The wire codecs in-process, against tritonclient's own encoders and decoders: what the client writes, edged reads
as the client meant it, and what edged writes, the client reads back (HTTP's JSON and binary tensor extension,
gRPC's raw contents)."""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest
import tritonclient.grpc as grpcclient
import tritonclient.http as httpclient
from tritonclient.grpc import service_pb2 as client_pb
from tritonclient.grpc._utils import _get_inference_request

from edged.core.request.inference import InferOutput, InferResponse
from edged.core.request.tensors import serialize_bytes_tensor
from edged.errors import EdgedError
from edged.frontends.grpc import codec as grpc_codec
from edged.frontends.http import codec as http_codec
from edged.proto import grpc_service_pb2 as pb

FLOATS = np.arange(12, dtype=np.float32).reshape(3, 4)
TEXTS = np.array([[b"edge"], [b""], [b"\xff\x00 bytes"]], dtype=np.object_)
# JSON carries text: the same, with UTF-8 only.
JSON_TEXTS = np.array([[b"edge"], [b""], ["ünï".encode()]], dtype=np.object_)


def _http_inputs(binary: bool) -> list[httpclient.InferInput]:
    first = httpclient.InferInput("F", [3, 4], "FP32")
    first.set_data_from_numpy(FLOATS, binary_data=binary)
    second = httpclient.InferInput("T", [3, 1], "BYTES")
    second.set_data_from_numpy(TEXTS if binary else JSON_TEXTS, binary_data=binary)
    return [first, second]


def test_http_binary_inputs_are_read_as_the_client_wrote_them() -> None:
    outputs = [httpclient.InferRequestedOutput("OUT", binary_data=True)]
    body, json_size = httpclient.InferenceServerClient.generate_request_body(
        _http_inputs(binary=True), outputs, request_id="r-1", parameters={"custom": 7}
    )
    request, binary_default = http_codec.decode_infer_request("m", -1, body, json_size)
    assert (request.id, request.parameters, binary_default) == ("r-1", {"custom": 7}, False)
    floats, texts = request.inputs
    assert (floats.name, floats.datatype, floats.shape) == ("F", "FP32", (3, 4))
    assert bytes(floats.raw or b"") == FLOATS.tobytes()
    assert (texts.datatype, texts.shape) == ("BYTES", (3, 1))
    assert bytes(texts.raw or b"") == serialize_bytes_tensor(TEXTS)
    assert request.outputs is not None and [o.name for o in request.outputs] == ["OUT"]
    assert request.outputs[0].parameters["binary_data"] is True


def test_http_json_inputs_become_arrays() -> None:
    body, json_size = httpclient.InferenceServerClient.generate_request_body(_http_inputs(binary=False))
    assert json_size is None
    request, _ = http_codec.decode_infer_request("m", -1, body, None)
    floats, texts = request.inputs
    np.testing.assert_array_equal(floats.data, FLOATS)
    assert np.asarray(texts.data).tolist() == JSON_TEXTS.tolist()


def test_http_trailing_bytes_and_short_blobs_are_refused() -> None:
    body, json_size = httpclient.InferenceServerClient.generate_request_body(_http_inputs(binary=True))
    with pytest.raises(EdgedError, match="unexpected additional input data"):
        http_codec.decode_infer_request("m", -1, body + b"x", json_size)
    with pytest.raises(EdgedError, match="expecting 1 additional bytes"):
        http_codec.decode_infer_request("m", -1, body[:-1], json_size)


def _response(texts: np.ndarray[Any, Any] = TEXTS) -> InferResponse:
    return InferResponse(
        "m", "1", "r-2", [InferOutput("F", "FP32", (3, 4), FLOATS), InferOutput("T", "BYTES", (3, 1), texts)]
    )


@pytest.mark.parametrize("binary", [True, False])
def test_http_responses_read_back_by_the_client(binary: bool) -> None:
    texts_sent = TEXTS if binary else JSON_TEXTS
    body, header_length = http_codec.encode_infer_response(_response(texts_sent), None, binary)
    assert (header_length is not None) == binary
    result = httpclient.InferenceServerClient.parse_response_body(body, header_length=header_length)
    assert result.get_response()["id"] == "r-2" and result.get_response()["model_version"] == "1"
    np.testing.assert_array_equal(result.as_numpy("F"), FLOATS)
    texts = result.as_numpy("T")
    assert texts is not None
    assert [[t if isinstance(t, bytes) else str(t).encode() for t in row] for row in texts.tolist()] == (
        texts_sent.tolist()
    )


def _grpc_request(**overrides: Any) -> pb.ModelInferRequest:
    inputs = [grpcclient.InferInput("F", [3, 4], "FP32"), grpcclient.InferInput("T", [3, 1], "BYTES")]
    inputs[0].set_data_from_numpy(FLOATS)
    inputs[1].set_data_from_numpy(TEXTS)
    outputs = [grpcclient.InferRequestedOutput("OUT", class_count=2)]
    arguments: dict[str, Any] = {
        "model_name": "m",
        "inputs": inputs,
        "model_version": "",
        "request_id": "r-3",
        "outputs": outputs,
        "sequence_id": 0,
        "sequence_start": False,
        "sequence_end": False,
        "priority": 0,
        "timeout": None,
        "parameters": None,
    }
    arguments.update(overrides)
    message = pb.ModelInferRequest()
    message.ParseFromString(_get_inference_request(**arguments).SerializeToString())
    return message


def test_grpc_raw_contents_are_read_as_the_client_wrote_them() -> None:
    request = grpc_codec.decode_infer_request(_grpc_request(), -1)
    assert request.id == "r-3"
    floats, texts = request.inputs
    assert (floats.shape, bytes(floats.raw or b"")) == ((3, 4), FLOATS.tobytes())
    assert bytes(texts.raw or b"") == serialize_bytes_tensor(TEXTS)
    assert request.outputs is not None and request.outputs[0].classification == 2


def test_grpc_contents_beside_raw_contents_are_refused() -> None:
    message = _grpc_request()
    message.inputs[0].contents.fp32_contents.extend([1.0])
    with pytest.raises(EdgedError, match="contents field must not be specified when using raw_input_contents"):
        grpc_codec.decode_infer_request(message, -1)


def test_grpc_responses_read_back_by_the_client() -> None:
    reply = pb.ModelInferResponse()
    grpc_codec.encode_infer_response(_response(), reply)
    message = client_pb.ModelInferResponse()
    message.ParseFromString(reply.SerializeToString())
    result = grpcclient.InferResult(message)
    assert result.get_response().id == "r-2"
    np.testing.assert_array_equal(result.as_numpy("F"), FLOATS)
    texts = result.as_numpy("T")
    assert texts is not None and texts.tolist() == TEXTS.tolist()
