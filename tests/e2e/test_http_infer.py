"""Successful inference over HTTP: every data type in JSON and binary form, batching, outputs, classification,
compression and the wire details tritonclient and perf_analyzer depend on."""

from __future__ import annotations

import gzip
import json
import re
import zlib
from typing import Any, Final

import ml_dtypes
import numpy as np
import pytest
import tritonclient.http as httpclient
from conftest import ALL_DTYPES, identity_model_name
from server import (
    ADD_SUB_INPUT0,
    ADD_SUB_INPUT1,
    Reply,
    Server,
    add_sub_inputs,
    assert_still_serving,
    post_json,
    request,
)
from sklearn.datasets import load_digits
from tritonclient.utils import InferenceServerException

INFER: Final = "/v2/models/add_sub/infer"
JSON_HEADERS: Final = {"Content-Type": "application/json"}
DIGIT_LABELS: Final = ("zero", "one", "two", "three", "four", "five", "six", "seven", "eight", "nine")


def _add_sub_json_inputs() -> list[dict[str, Any]]:
    return [
        {"name": "INPUT0", "shape": [1, 16], "datatype": "FP32", "data": [float(i) for i in range(16)]},
        {"name": "INPUT1", "shape": [1, 16], "datatype": "FP32", "data": [1.0] * 16},
    ]


def _add_sub_binary_body(document: dict[str, Any]) -> tuple[bytes, dict[str, str]]:
    header = json.dumps(document, separators=(",", ":")).encode()
    body = header + ADD_SUB_INPUT0.tobytes() + ADD_SUB_INPUT1.tobytes()
    return body, {"Content-Type": "application/octet-stream", "Inference-Header-Content-Length": str(len(header))}


def _binary_input(name: str, size: int) -> dict[str, Any]:
    return {"name": name, "shape": [1, 16], "datatype": "FP32", "parameters": {"binary_data_size": size}}


def _split_binary_reply(reply: Reply) -> tuple[dict[str, Any], bytes]:
    assert reply.status == 200, reply
    assert reply.header("content-type") == "application/octet-stream"
    length = reply.header("inference-header-content-length")
    assert length is not None, reply.headers
    header_length = int(length)
    header = json.loads(reply.body[:header_length])
    assert isinstance(header, dict)
    return header, reply.body[header_length:]


SUM = [float(i + 1) for i in range(16)]
DIFFERENCE = [float(i - 1) for i in range(16)]


def _json_output(name: str, data: list[float]) -> dict[str, Any]:
    return {"name": name, "datatype": "FP32", "shape": [1, 16], "data": data}


def _binary_output(name: str) -> dict[str, Any]:
    return {"name": name, "datatype": "FP32", "shape": [1, 16], "parameters": {"binary_data_size": 64}}


SUM_BYTES = np.array(SUM, dtype=np.float32).tobytes()
DIFFERENCE_BYTES = np.array(DIFFERENCE, dtype=np.float32).tobytes()


# ------------------------------------------------------------------------------------------------------------
# add_sub through tritonclient


@pytest.mark.parametrize("binary_in", [True, False], ids=["binary-in", "json-in"])
@pytest.mark.parametrize("binary_out", [True, False], ids=["binary-out", "json-out"])
def test_add_sub(client: httpclient.InferenceServerClient, binary_in: bool, binary_out: bool) -> None:
    outputs = [httpclient.InferRequestedOutput(name, binary_data=binary_out) for name in ("OUTPUT0", "OUTPUT1")]
    result = client.infer("add_sub", add_sub_inputs(binary=binary_in), outputs=outputs)
    np.testing.assert_array_equal(result.as_numpy("OUTPUT0"), ADD_SUB_INPUT0 + ADD_SUB_INPUT1)
    np.testing.assert_array_equal(result.as_numpy("OUTPUT1"), ADD_SUB_INPUT0 - ADD_SUB_INPUT1)
    response = result.get_response()
    assert response["model_name"] == "add_sub"
    assert response["model_version"] == "1"
    for output in response["outputs"]:
        assert output["datatype"] == "FP32"
        assert output["shape"] == [1, 16]
        assert ("parameters" in output) == binary_out
        assert ("data" in output) == (not binary_out)


def test_all_outputs_are_returned_when_none_is_named(client: httpclient.InferenceServerClient) -> None:
    result = client.infer("add_sub", add_sub_inputs())
    assert [output["name"] for output in result.get_response()["outputs"]] == ["OUTPUT0", "OUTPUT1"]


def test_only_the_requested_output_is_returned(client: httpclient.InferenceServerClient) -> None:
    result = client.infer("add_sub", add_sub_inputs(), outputs=[httpclient.InferRequestedOutput("OUTPUT1")])
    assert [output["name"] for output in result.get_response()["outputs"]] == ["OUTPUT1"]
    assert result.as_numpy("OUTPUT0") is None
    np.testing.assert_array_equal(result.as_numpy("OUTPUT1"), ADD_SUB_INPUT0 - ADD_SUB_INPUT1)


@pytest.mark.parametrize("batch", [1, 2, 5, 8])
def test_batches_up_to_max_batch_size(client: httpclient.InferenceServerClient, batch: int) -> None:
    rng = np.random.default_rng(batch)
    a = rng.standard_normal((batch, 16)).astype(np.float32)
    b = rng.standard_normal((batch, 16)).astype(np.float32)
    result = client.infer("add_sub", add_sub_inputs(a, b))
    np.testing.assert_array_equal(result.as_numpy("OUTPUT0"), a + b)
    np.testing.assert_array_equal(result.as_numpy("OUTPUT1"), a - b)


@pytest.mark.parametrize("binary", [True, False], ids=["binary", "json"])
def test_non_batching_model(client: httpclient.InferenceServerClient, binary: bool) -> None:
    a = np.array([1.0, 2.0, 3.0, 4.0], dtype=np.float32)
    b = np.array([0.5, 1e-8, 1e30, -0.0], dtype=np.float32)
    result = client.infer(
        "add_sub_nobatch",
        add_sub_inputs(a, b, binary=binary),
        outputs=[httpclient.InferRequestedOutput(n, binary_data=binary) for n in ("OUTPUT0", "OUTPUT1")],
    )
    np.testing.assert_array_equal(result.as_numpy("OUTPUT0"), a + b)
    np.testing.assert_array_equal(result.as_numpy("OUTPUT1"), a - b)
    assert [o["shape"] for o in result.get_response()["outputs"]] == [[4], [4]]


@pytest.mark.parametrize("binary", [True, False], ids=["binary", "json"])
def test_int32_add_sub(client: httpclient.InferenceServerClient, binary: bool) -> None:
    a = np.array([[2**31 - 2, -(2**31) + 1, 0, 7, -7, 100, 12345, -1, 1, 2, 3, 4, 5, 6, 8, 9]], dtype=np.int32)
    b = np.ones((1, 16), dtype=np.int32)
    inputs = []
    for name, array in (("INPUT0", a), ("INPUT1", b)):
        tensor = httpclient.InferInput(name, [1, 16], "INT32")
        tensor.set_data_from_numpy(array, binary_data=binary)
        inputs.append(tensor)
    outputs = [httpclient.InferRequestedOutput(n, binary_data=binary) for n in ("OUTPUT0", "OUTPUT1")]
    result = client.infer("add_sub_int32", inputs, outputs=outputs)
    np.testing.assert_array_equal(result.as_numpy("OUTPUT0"), a + b)
    np.testing.assert_array_equal(result.as_numpy("OUTPUT1"), a - b)
    assert all(o["datatype"] == "INT32" for o in result.get_response()["outputs"])


def test_auto_completed_model_infers(client: httpclient.InferenceServerClient) -> None:
    a = np.arange(64, dtype=np.float32).reshape(4, 16)
    b = np.full((4, 16), 0.5, dtype=np.float32)
    result = client.infer("auto_complete", add_sub_inputs(a, b))
    np.testing.assert_array_equal(result.as_numpy("OUTPUT0"), a + b)
    np.testing.assert_array_equal(result.as_numpy("OUTPUT1"), a - b)


def test_request_id_is_echoed(client: httpclient.InferenceServerClient) -> None:
    result = client.infer("add_sub", add_sub_inputs(), request_id="req-42")
    assert result.get_response()["id"] == "req-42"
    assert "id" not in client.infer("add_sub", add_sub_inputs()).get_response()


def test_explicit_version(client: httpclient.InferenceServerClient) -> None:
    result = client.infer("add_sub", add_sub_inputs(), model_version="1")
    assert result.get_response()["model_version"] == "1"


def test_request_parameters_are_accepted(client: httpclient.InferenceServerClient) -> None:
    result = client.infer(
        "add_sub",
        add_sub_inputs(),
        parameters={"my_string": "v", "my_int": 3, "my_bool": True, "my_double": 1.5},
        priority=0,
        timeout=1_000_000,
    )
    np.testing.assert_array_equal(result.as_numpy("OUTPUT0"), ADD_SUB_INPUT0 + ADD_SUB_INPUT1)


def test_sequence_id_on_a_model_without_sequence_batching(server: Server) -> None:
    reply = post_json(server.http_url, INFER, {"parameters": {"sequence_id": 5}, "inputs": _add_sub_json_inputs()})
    assert reply.status == 200, reply


# ------------------------------------------------------------------------------------------------------------
# every data type through an identity model


def _values(dtype: str, shape: tuple[int, ...]) -> np.ndarray[Any, Any]:
    rng = np.random.default_rng(sum(map(ord, dtype)))
    size = int(np.prod(shape))
    if dtype == "BOOL":
        return rng.integers(0, 2, size=shape).astype(np.bool_)
    if dtype == "BYTES":
        words: list[bytes] = [
            "héllo wörld".encode(),
            b"",
            "数字 ✓".encode(),
            b"edge",
            b"a\x00b",
            b"x" * 300,
            b"",
            "ñ".encode(),
        ]
        return np.array([words[i % len(words)] for i in range(size)], dtype=np.object_).reshape(shape)
    if dtype == "BF16":
        floats = np.array([1.0, -2.5, 0.0, 3.140625, 1e30, -1e-30, 256.0, 0.5, 7.0, -0.0])
        return np.resize(floats, shape).astype(ml_dtypes.bfloat16)
    numpy_type: np.dtype[Any] = np.dtype(
        {"FP16": np.float16, "FP32": np.float32, "FP64": np.float64}.get(dtype) or dtype.lower()
    )
    if numpy_type.kind in "iu":
        info = np.iinfo(numpy_type.type)
        values = rng.integers(info.min, info.max, size=size, dtype=numpy_type.type, endpoint=True)
        values[:2] = (info.min, info.max)  # the extremes must survive JSON as well as binary
        return values.reshape(shape)
    values = rng.standard_normal(size).astype(numpy_type)
    values[:3] = (0.1, -0.0, 1e-3)  # values whose decimal form is long
    return values.reshape(shape)


def _identity(
    client: httpclient.InferenceServerClient, model: str, dtype: str, data: np.ndarray[Any, Any], binary: bool
) -> tuple[np.ndarray[Any, Any], dict[str, Any]]:
    tensor = httpclient.InferInput("INPUT0", list(data.shape), dtype)
    tensor.set_data_from_numpy(data, binary_data=binary)
    result = client.infer(model, [tensor], outputs=[httpclient.InferRequestedOutput("OUTPUT0", binary_data=binary)])
    out = result.as_numpy("OUTPUT0")
    assert out is not None
    output = result.get_output("OUTPUT0")
    assert isinstance(output, dict)
    return out, output


# FP16 and BF16 cannot travel as JSON; test_http_errors checks that they are refused there.
BINARY_ONLY = {"FP16", "BF16"}
ROUNDTRIPS = [
    pytest.param(
        dtype,
        binary,
        id=f"{dtype}-{'binary' if binary else 'json'}",
    )
    for dtype in ALL_DTYPES
    for binary in (True, False)
    if binary or dtype not in BINARY_ONLY
]


@pytest.mark.parametrize(("dtype", "binary"), ROUNDTRIPS)
def test_identity_roundtrip(client: httpclient.InferenceServerClient, dtype: str, binary: bool) -> None:
    data = _values(dtype, (2, 5))
    out, output = _identity(client, identity_model_name(dtype), dtype, data, binary)
    assert output["datatype"] == dtype
    assert output["shape"] == [2, 5]
    assert out.shape == (2, 5)
    if dtype == "BYTES" and not binary:
        # JSON carries strings, and the client hands them back as str.
        assert out.tolist() == [[item.decode() for item in row] for row in data.tolist()]
    elif dtype == "BYTES":
        assert out.tolist() == data.tolist()
    else:
        assert out.dtype == data.dtype
        assert out.tobytes() == data.tobytes()


def test_bytes_binary_wire_format(server: Server) -> None:
    elements = [b"hello", b"", "wörld".encode()]
    blob = b"".join(len(e).to_bytes(4, "little") + e for e in elements)
    header = json.dumps(
        {
            "inputs": [
                {"name": "INPUT0", "shape": [1, 3], "datatype": "BYTES", "parameters": {"binary_data_size": len(blob)}}
            ],
            "parameters": {"binary_data_output": True},
        },
        separators=(",", ":"),
    ).encode()
    reply = request(
        server.http_url,
        "POST",
        "/v2/models/identity_bytes/infer",
        header + blob,
        {"Content-Type": "application/octet-stream", "Inference-Header-Content-Length": str(len(header))},
    )
    document, tail = _split_binary_reply(reply)
    assert document["outputs"] == [
        {"name": "OUTPUT0", "datatype": "BYTES", "shape": [1, 3], "parameters": {"binary_data_size": len(blob)}}
    ]
    assert tail == blob


def test_bytes_that_are_not_utf8_are_refused_for_onnx_models(client: httpclient.InferenceServerClient) -> None:
    # onnxruntime's Python API takes string tensors as str, so bytes that are not UTF-8 cannot reach an ONNX model
    # unchanged; edged refuses them with a clear reason instead of altering them (Triton's C++ backend passes them).
    data = np.array([[b"\xff\xfe\x00binary", b"ok"]], dtype=np.object_)
    with pytest.raises(InferenceServerException) as caught:
        _identity(client, "identity_bytes", "BYTES", data, True)
    assert caught.value.status() == "400"
    assert "input 'INPUT0' holds bytes that are not UTF-8" in str(caught.value.message())
    assert_still_serving(client)


def test_bytes_json_output_keeps_non_ascii(server: Server) -> None:
    reply = post_json(
        server.http_url,
        "/v2/models/identity_bytes/infer",
        {"inputs": [{"name": "INPUT0", "shape": [1, 3], "datatype": "BYTES", "data": ["hello", "", "wörld"]}]},
    )
    assert reply.status == 200, reply
    assert reply.header("content-type") == "application/json"
    assert reply.json()["outputs"] == [
        {"name": "OUTPUT0", "datatype": "BYTES", "shape": [1, 3], "data": ["hello", "", "wörld"]}
    ]


def test_fp16_binary_wire_format(server: Server) -> None:
    values = np.array([1.0, 2.5, -3.0], dtype=np.float16).reshape(1, 3)
    header = json.dumps(
        {
            "inputs": [{"name": "INPUT0", "shape": [1, 3], "datatype": "FP16", "parameters": {"binary_data_size": 6}}],
            "parameters": {"binary_data_output": True},
        }
    ).encode()
    reply = request(
        server.http_url,
        "POST",
        "/v2/models/identity_fp16/infer",
        header + values.tobytes(),
        {"Content-Type": "application/octet-stream", "Inference-Header-Content-Length": str(len(header))},
    )
    document, tail = _split_binary_reply(reply)
    assert document["outputs"] == [
        {"name": "OUTPUT0", "datatype": "FP16", "shape": [1, 3], "parameters": {"binary_data_size": 6}}
    ]
    assert tail == b"\x00<\x00A\x00\xc2"


@pytest.mark.parametrize("binary", [True, False], ids=["binary", "json"])
def test_identity_without_batching(client: httpclient.InferenceServerClient, binary: bool) -> None:
    data = np.linspace(-1, 1, 7, dtype=np.float32)
    out, output = _identity(client, "identity_nobatch", "FP32", data, binary)
    assert output["shape"] == [7]
    np.testing.assert_array_equal(out, data)


def test_zero_sized_dimension(client: httpclient.InferenceServerClient) -> None:
    data = np.zeros((1, 0), dtype=np.float32)
    out, output = _identity(client, "identity_fp32", "FP32", data, True)
    assert output["shape"] == [1, 0]
    assert output["parameters"] == {"binary_data_size": 0}
    assert out.size == 0


# ------------------------------------------------------------------------------------------------------------
# classification

CLASS_ENTRY = re.compile(r"^(?P<value>-?\d+\.\d{6}):(?P<index>\d+)(?::(?P<label>.+))?$")


def _digit_samples(count: int) -> tuple[np.ndarray[Any, Any], np.ndarray[Any, Any]]:
    images, targets = load_digits(return_X_y=True)
    # Every 36th image spreads the sample over the whole data set and so over every writer and digit.
    return images[::36][:count].astype(np.float32), targets[::36][:count].astype(np.int64)


def _classify(
    client: httpclient.InferenceServerClient, images: np.ndarray[Any, Any], k: int, binary: bool
) -> tuple[np.ndarray[Any, Any], dict[str, Any]]:
    tensor = httpclient.InferInput("image", list(images.shape), "FP32")
    tensor.set_data_from_numpy(images, binary_data=binary)
    result = client.infer(
        "digits",
        [tensor],
        outputs=[httpclient.InferRequestedOutput("probabilities", binary_data=binary, class_count=k)],
    )
    out = result.as_numpy("probabilities")
    assert out is not None
    output = result.get_output("probabilities")
    assert isinstance(output, dict)
    return out, output


def _entry(item: bytes | str) -> tuple[float, int, str | None]:
    text = item.decode() if isinstance(item, bytes) else item
    match = CLASS_ENTRY.match(text)
    assert match, f"{text!r} is not value:index:label"
    return float(match["value"]), int(match["index"]), match["label"]


@pytest.mark.parametrize("binary", [True, False], ids=["binary", "json"])
def test_digits_are_classified_with_labels(client: httpclient.InferenceServerClient, binary: bool) -> None:
    images, targets = _digit_samples(50)
    correct = 0
    for start in range(0, 50, 25):  # two requests, each within max_batch_size 32
        batch = images[start : start + 25]
        out, output = _classify(client, batch, 1, binary)
        assert output["datatype"] == "BYTES"
        assert output["shape"] == [len(batch), 1]
        for row, target in zip(out, targets[start : start + 25], strict=True):
            value, index, label = _entry(row[0])
            assert label == DIGIT_LABELS[index]
            assert 0.0 < value <= 1.0
            correct += index == target
    assert correct >= 45, f"only {correct} of 50 digits classified correctly"


def test_classification_matches_the_probabilities(client: httpclient.InferenceServerClient) -> None:
    images, _ = _digit_samples(4)
    plain = client.infer("digits", [_image_input(images)]).as_numpy("probabilities")
    assert plain is not None
    out, output = _classify(client, images, 3, True)
    assert output["shape"] == [4, 3]
    for probabilities, row in zip(plain, out, strict=True):
        top = np.argsort(-probabilities, kind="stable")[:3]
        # Triton formats each value with std::to_string, i.e. printf("%f") of the float.
        expected = [f"{float(probabilities[i]):f}:{i}:{DIGIT_LABELS[i]}".encode() for i in top]
        assert row.tolist() == expected


def _image_input(images: np.ndarray[Any, Any]) -> httpclient.InferInput:
    tensor = httpclient.InferInput("image", list(images.shape), "FP32")
    tensor.set_data_from_numpy(images)
    return tensor


def test_class_count_larger_than_the_classes(client: httpclient.InferenceServerClient) -> None:
    images, _ = _digit_samples(1)
    out, output = _classify(client, images, 20, False)
    assert output["shape"] == [1, 10]
    indices = [_entry(item)[1] for item in out[0]]
    assert sorted(indices) == list(range(10))
    values = [_entry(item)[0] for item in out[0]]
    assert values == sorted(values, reverse=True)


def test_classification_without_labels(client: httpclient.InferenceServerClient) -> None:
    result = client.infer(
        "add_sub",
        add_sub_inputs(binary=False),
        outputs=[httpclient.InferRequestedOutput("OUTPUT0", binary_data=False, class_count=2)],
    )
    assert result.get_output("OUTPUT0") == {
        "name": "OUTPUT0",
        "datatype": "BYTES",
        "shape": [1, 2],
        "data": ["16.000000:15", "15.000000:14"],
    }


def test_classification_without_batching(client: httpclient.InferenceServerClient) -> None:
    data = np.array([0.5, -3.0, 9.25, 1.0], dtype=np.float32)
    tensor = httpclient.InferInput("INPUT0", [4], "FP32")
    tensor.set_data_from_numpy(data)
    result = client.infer(
        "identity_nobatch", [tensor], outputs=[httpclient.InferRequestedOutput("OUTPUT0", class_count=2)]
    )
    assert result.get_output("OUTPUT0")["shape"] == [2]
    out = result.as_numpy("OUTPUT0")
    assert out is not None
    assert out.tolist() == [b"9.250000:2", b"1.000000:3"]


def test_classification_binary_wire_format(server: Server) -> None:
    images, _ = _digit_samples(1)
    header = json.dumps(
        {
            "inputs": [
                {"name": "image", "shape": [1, 64], "datatype": "FP32", "parameters": {"binary_data_size": 256}}
            ],
            "outputs": [{"name": "probabilities", "parameters": {"classification": 3, "binary_data": True}}],
        }
    ).encode()
    reply = request(
        server.http_url,
        "POST",
        "/v2/models/digits/infer",
        header + images.tobytes(),
        {"Content-Type": "application/octet-stream", "Inference-Header-Content-Length": str(len(header))},
    )
    document, tail = _split_binary_reply(reply)
    [output] = document["outputs"]
    assert output["datatype"] == "BYTES"
    assert output["shape"] == [1, 3]
    assert output["parameters"]["binary_data_size"] == len(tail)
    offset, entries = 0, []
    while offset < len(tail):
        size = int.from_bytes(tail[offset : offset + 4], "little")
        entries.append(tail[offset + 4 : offset + 4 + size])
        offset += 4 + size
    assert offset == len(tail)
    assert len(entries) == 3
    assert all(CLASS_ENTRY.match(entry.decode()) for entry in entries), entries


# ------------------------------------------------------------------------------------------------------------
# the HTTP wire, compared with replies recorded from Triton


def test_json_request_with_id(server: Server) -> None:
    reply = post_json(server.http_url, INFER, {"id": "req-1", "inputs": _add_sub_json_inputs()})
    assert reply.status == 200, reply
    assert reply.header("content-type") == "application/json"
    assert reply.header("inference-header-content-length") is None
    assert reply.json() == {
        "id": "req-1",
        "model_name": "add_sub",
        "model_version": "1",
        "outputs": [_json_output("OUTPUT0", SUM), _json_output("OUTPUT1", DIFFERENCE)],
    }


def test_empty_id_is_not_echoed(server: Server) -> None:
    reply = post_json(server.http_url, INFER, {"id": "", "inputs": _add_sub_json_inputs()})
    assert reply.status == 200, reply
    assert "id" not in reply.json()


def test_fp32_json_values_are_exact(server: Server) -> None:
    data = [0.1, 1.2, 3.4028234663852886e38, 1.401298464324817e-45]
    reply = post_json(
        server.http_url,
        "/v2/models/add_sub_nobatch/infer",
        {
            "inputs": [
                {"name": "INPUT0", "shape": [4], "datatype": "FP32", "data": data},
                {"name": "INPUT1", "shape": [4], "datatype": "FP32", "data": [0, 0, 0, 0]},
            ]
        },
    )
    assert reply.status == 200, reply
    # Triton writes each float32 through a double: 0.1f is 0.10000000149011612.
    expected = [float(np.float32(v)) for v in data]
    assert [o["data"] for o in reply.json()["outputs"]] == [expected, expected]


def test_nested_json_data(server: Server) -> None:
    inputs = _add_sub_json_inputs()
    for tensor in inputs:
        tensor["data"] = [tensor["data"]]
    reply = post_json(server.http_url, INFER, {"inputs": inputs})
    assert reply.status == 200, reply
    assert [o["data"] for o in reply.json()["outputs"]] == [SUM, DIFFERENCE]


def test_json_request_without_content_type(server: Server) -> None:
    reply = request(server.http_url, "POST", INFER, json.dumps({"inputs": _add_sub_json_inputs()}))
    assert reply.status == 200, reply


def test_json_request_with_header_length_equal_to_body(server: Server) -> None:
    # The C++ client and perf_analyzer always send Inference-Header-Content-Length, also for pure JSON.
    body = json.dumps({"inputs": _add_sub_json_inputs()}).encode()
    reply = request(
        server.http_url, "POST", INFER, body, {**JSON_HEADERS, "Inference-Header-Content-Length": str(len(body))}
    )
    assert reply.status == 200, reply
    assert [o["data"] for o in reply.json()["outputs"]] == [SUM, DIFFERENCE]


def test_binary_inputs_without_binary_output_request_give_json(server: Server) -> None:
    body, headers = _add_sub_binary_body({"inputs": [_binary_input("INPUT0", 64), _binary_input("INPUT1", 64)]})
    reply = request(server.http_url, "POST", INFER, body, headers)
    assert reply.status == 200, reply
    assert reply.header("content-type") == "application/json"
    assert reply.json()["outputs"] == [_json_output("OUTPUT0", SUM), _json_output("OUTPUT1", DIFFERENCE)]


def test_binary_data_output(server: Server) -> None:
    body, headers = _add_sub_binary_body(
        {
            "inputs": [_binary_input("INPUT0", 64), _binary_input("INPUT1", 64)],
            "parameters": {"binary_data_output": True},
        }
    )
    document, tail = _split_binary_reply(request(server.http_url, "POST", INFER, body, headers))
    assert document == {
        "model_name": "add_sub",
        "model_version": "1",
        "outputs": [_binary_output("OUTPUT0"), _binary_output("OUTPUT1")],
    }
    assert tail == SUM_BYTES + DIFFERENCE_BYTES


def test_binary_and_json_outputs_mixed(server: Server) -> None:
    body, headers = _add_sub_binary_body(
        {
            "inputs": [_binary_input("INPUT0", 64), _binary_input("INPUT1", 64)],
            "outputs": [
                {"name": "OUTPUT0", "parameters": {"binary_data": True}},
                {"name": "OUTPUT1", "parameters": {"binary_data": False}},
            ],
        }
    )
    document, tail = _split_binary_reply(request(server.http_url, "POST", INFER, body, headers))
    assert document["outputs"] == [_binary_output("OUTPUT0"), _json_output("OUTPUT1", DIFFERENCE)]
    assert tail == SUM_BYTES


def test_named_output_without_parameters_is_json_despite_binary_data_output(server: Server) -> None:
    reply = post_json(
        server.http_url,
        INFER,
        {
            "parameters": {"binary_data_output": True},
            "inputs": _add_sub_json_inputs(),
            "outputs": [{"name": "OUTPUT0"}],
        },
    )
    assert reply.status == 200, reply
    assert reply.header("content-type") == "application/json"
    assert reply.json()["outputs"] == [_json_output("OUTPUT0", SUM)]


def test_json_input_binary_output(server: Server) -> None:
    reply = post_json(
        server.http_url,
        INFER,
        {"inputs": _add_sub_json_inputs(), "outputs": [{"name": "OUTPUT0", "parameters": {"binary_data": True}}]},
    )
    document, tail = _split_binary_reply(reply)
    assert document["outputs"] == [_binary_output("OUTPUT0")]
    assert tail == SUM_BYTES


def test_json_and_binary_inputs_mixed(server: Server) -> None:
    header = json.dumps(
        {"inputs": [_add_sub_json_inputs()[0], _binary_input("INPUT1", 64)]}, separators=(",", ":")
    ).encode()
    reply = request(
        server.http_url,
        "POST",
        INFER,
        header + ADD_SUB_INPUT1.tobytes(),
        {"Content-Type": "application/octet-stream", "Inference-Header-Content-Length": str(len(header))},
    )
    assert reply.status == 200, reply
    assert [o["data"] for o in reply.json()["outputs"]] == [SUM, DIFFERENCE]


# ------------------------------------------------------------------------------------------------------------
# transport: compression, chunking, Expect


@pytest.mark.parametrize("algorithm", ["gzip", "deflate"])
def test_compression_through_the_client(client: httpclient.InferenceServerClient, algorithm: str) -> None:
    result = client.infer(
        "add_sub",
        add_sub_inputs(),
        request_compression_algorithm=algorithm,
        response_compression_algorithm=algorithm,
    )
    np.testing.assert_array_equal(result.as_numpy("OUTPUT0"), ADD_SUB_INPUT0 + ADD_SUB_INPUT1)
    np.testing.assert_array_equal(result.as_numpy("OUTPUT1"), ADD_SUB_INPUT0 - ADD_SUB_INPUT1)


@pytest.mark.parametrize(
    ("encoding", "compress"), [("gzip", gzip.compress), ("deflate", zlib.compress), ("identity", lambda b: b)]
)
def test_compressed_json_request(server: Server, encoding: str, compress: Any) -> None:
    body = compress(json.dumps({"inputs": _add_sub_json_inputs()}).encode())
    reply = request(server.http_url, "POST", INFER, body, {**JSON_HEADERS, "Content-Encoding": encoding})
    assert reply.status == 200, reply
    assert [o["data"] for o in reply.json()["outputs"]] == [SUM, DIFFERENCE]


def test_gzip_binary_request_header_length_counts_decompressed_bytes(server: Server) -> None:
    body, headers = _add_sub_binary_body(
        {
            "inputs": [_binary_input("INPUT0", 64), _binary_input("INPUT1", 64)],
            "parameters": {"binary_data_output": True},
        }
    )
    reply = request(server.http_url, "POST", INFER, gzip.compress(body), {**headers, "Content-Encoding": "gzip"})
    _, tail = _split_binary_reply(reply)
    assert tail == SUM_BYTES + DIFFERENCE_BYTES


@pytest.mark.parametrize(
    ("accept", "encoding", "decompress"),
    [
        ("gzip", "gzip", gzip.decompress),
        ("deflate", "deflate", zlib.decompress),
        ("gzip, deflate", "gzip", gzip.decompress),
    ],
)
def test_compressed_response(server: Server, accept: str, encoding: str, decompress: Any) -> None:
    reply = post_json(server.http_url, INFER, {"inputs": _add_sub_json_inputs()}, {"Accept-Encoding": accept})
    assert reply.status == 200, reply
    assert reply.header("content-encoding") == encoding
    assert json.loads(decompress(reply.body))["outputs"] == [
        _json_output("OUTPUT0", SUM),
        _json_output("OUTPUT1", DIFFERENCE),
    ]


def test_compressed_binary_response(server: Server) -> None:
    body, headers = _add_sub_binary_body(
        {
            "inputs": [_binary_input("INPUT0", 64), _binary_input("INPUT1", 64)],
            "parameters": {"binary_data_output": True},
        }
    )
    reply = request(server.http_url, "POST", INFER, body, {**headers, "Accept-Encoding": "gzip"})
    assert reply.status == 200, reply
    assert reply.header("content-encoding") == "gzip"
    plain = gzip.decompress(reply.body)
    length = reply.header("inference-header-content-length")
    assert length is not None
    # The header length describes the uncompressed body.
    assert json.loads(plain[: int(length)])["outputs"] == [_binary_output("OUTPUT0"), _binary_output("OUTPUT1")]
    assert plain[int(length) :] == SUM_BYTES + DIFFERENCE_BYTES


def test_unknown_accept_encoding_is_answered_uncompressed(server: Server) -> None:
    reply = post_json(server.http_url, INFER, {"inputs": _add_sub_json_inputs()}, {"Accept-Encoding": "br"})
    assert reply.status == 200, reply
    assert reply.header("content-encoding") is None
    assert [o["data"] for o in reply.json()["outputs"]] == [SUM, DIFFERENCE]


def test_chunked_request(server: Server) -> None:
    body = json.dumps({"inputs": _add_sub_json_inputs()}).encode()
    chunks = [body[:50], body[50:]]
    encoded = b"".join(f"{len(c):x}\r\n".encode() + c + b"\r\n" for c in chunks) + b"0\r\n\r\n"
    reply = request(server.http_url, "POST", INFER, encoded, {**JSON_HEADERS, "Transfer-Encoding": "chunked"})
    assert reply.status == 200, reply
    assert [o["data"] for o in reply.json()["outputs"]] == [SUM, DIFFERENCE]


def test_expect_100_continue(server: Server) -> None:
    reply = post_json(server.http_url, INFER, {"inputs": _add_sub_json_inputs()}, {"Expect": "100-continue"})
    assert reply.status == 200, reply
