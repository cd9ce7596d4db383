"""Bad requests: each gets Triton's status and a message naming what is wrong, and the daemon keeps serving.

The expected messages are the ones Triton 2.51 answered for the same requests. Where edged deliberately
differs (body size limit, JSON nesting limit, the detail of JSON syntax errors) the test says so.
"""

from __future__ import annotations

import gzip
import json
import re
from collections.abc import Iterator
from typing import Any, Final

import numpy as np
import pytest
import tritonclient.http as httpclient
from conftest import SMALL_MAX_INPUT_SIZE
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
from tritonclient.utils import InferenceServerException

INFER: Final = "/v2/models/add_sub/infer"
NOBATCH_INFER: Final = "/v2/models/add_sub_nobatch/infer"
NO_ID: Final = "[request id: <id_unknown>] "
BATCH_NOTE: Final = (
    "NOTE: Setting a non-zero max_batch_size in the model config requires a batch dimension to be prepended to each"
    " input shape. If you want to specify the full shape including the batch dim in your input dims config, try"
    " setting max_batch_size to zero. See the model configuration docs for more info on max_batch_size."
)


@pytest.fixture(autouse=True)
def _still_serving_afterwards(client: httpclient.InferenceServerClient) -> Iterator[None]:
    """Every test here ends by proving the daemon still answers a good request correctly."""
    yield
    assert_still_serving(client)


def _fp32(name: str, shape: list[int], data: list[Any] | None = None) -> dict[str, Any]:
    count = int(np.prod(shape))
    return {"name": name, "shape": shape, "datatype": "FP32", "data": data if data is not None else [1.0] * count}


def _good_inputs() -> list[dict[str, Any]]:
    return [_fp32("INPUT0", [1, 16], [float(i) for i in range(16)]), _fp32("INPUT1", [1, 16])]


def _expect(reply: Reply, status: int, message: str) -> None:
    assert reply.status == status, reply
    assert reply.error() == message


def _infer_error(client: httpclient.InferenceServerClient, *args: Any, **kwargs: Any) -> InferenceServerException:
    with pytest.raises(InferenceServerException) as caught:
        client.infer(*args, **kwargs)
    return caught.value


# ------------------------------------------------------------------------------------------------------------
# which model


def test_unknown_model(client: httpclient.InferenceServerClient) -> None:
    error = _infer_error(client, "nonexistent", add_sub_inputs())
    assert error.status() == "404"
    assert error.message() == "Request for unknown model: 'nonexistent' is not found"


def test_unknown_model_is_reported_before_a_malformed_body(server: Server) -> None:
    reply = request(server.http_url, "POST", "/v2/models/nonexistent/infer", "{{", {"Content-Type": "application/json"})
    _expect(reply, 404, "Request for unknown model: 'nonexistent' is not found")


def test_unknown_version(client: httpclient.InferenceServerClient) -> None:
    error = _infer_error(client, "add_sub", add_sub_inputs(), model_version="2")
    assert error.status() == "404"
    assert error.message() == "Request for unknown model: 'add_sub' version 2 is not found"


@pytest.mark.parametrize("version", ["abc", "-1", "1a"])
def test_non_numeric_version_is_not_a_route(server: Server, version: str) -> None:
    reply = post_json(server.http_url, f"/v2/models/add_sub/versions/{version}/infer", {"inputs": _good_inputs()})
    _expect(reply, 404, "Not Found")


# ------------------------------------------------------------------------------------------------------------
# inputs and outputs against the model's signature


def test_missing_input(client: httpclient.InferenceServerClient) -> None:
    error = _infer_error(client, "add_sub", add_sub_inputs()[:1])
    assert error.status() == "400"
    assert error.message() == (
        f"{NO_ID}expected 2 inputs but got 1 inputs for model 'add_sub'. Got input(s) ['INPUT0'], but missing"
        " required input(s) ['INPUT1']. Please provide all required input(s)."
    )


def test_missing_input_names_the_request_id(client: httpclient.InferenceServerClient) -> None:
    error = _infer_error(client, "add_sub", add_sub_inputs()[1:], request_id="req-7")
    assert error.status() == "400"
    assert error.message() == (
        "[request id: req-7] expected 2 inputs but got 1 inputs for model 'add_sub'. Got input(s) ['INPUT1'], but"
        " missing required input(s) ['INPUT0']. Please provide all required input(s)."
    )


def test_no_inputs(server: Server) -> None:
    _expect(
        post_json(server.http_url, INFER, {"inputs": []}),
        400,
        f"{NO_ID}expected 2 inputs but got 0 inputs for model 'add_sub'. Got input(s) [], but missing required"
        " input(s) ['INPUT0','INPUT1']. Please provide all required input(s).",
    )


def test_unknown_input_in_place_of_a_required_one(server: Server) -> None:
    inputs = _good_inputs()
    inputs[1]["name"] = "INPUTX"
    _expect(
        post_json(server.http_url, INFER, {"inputs": inputs}),
        400,
        "unexpected inference input 'INPUTX' for model 'add_sub'",
    )


def test_extra_unknown_input(server: Server) -> None:
    reply = post_json(server.http_url, INFER, {"inputs": [*_good_inputs(), _fp32("INPUTX", [1, 16])]})
    assert reply.status == 400, reply
    # Triton lists the request's inputs in hash order, and prints the empty missing list as a bare "]".
    message = reply.error()
    prefix = f"{NO_ID}expected 2 inputs but got 3 inputs for model 'add_sub'. Got input(s) ["
    suffix = "], but missing required input(s) ]. Please provide all required input(s)."
    assert message.startswith(prefix) and message.endswith(suffix), message
    assert sorted(message[len(prefix) : -len(suffix)].split(",")) == ["'INPUT0'", "'INPUT1'", "'INPUTX'"]


def test_duplicate_input(server: Server) -> None:
    inputs = _good_inputs()
    _expect(
        post_json(server.http_url, INFER, {"inputs": [inputs[0], inputs[0], inputs[1]]}),
        400,
        f"{NO_ID}input 'INPUT0' already exists in request",
    )


def test_an_output_asked_for_twice(client: httpclient.InferenceServerClient) -> None:
    twice = [httpclient.InferRequestedOutput("OUTPUT0"), httpclient.InferRequestedOutput("OUTPUT0")]
    error = _infer_error(client, "add_sub", add_sub_inputs(), outputs=twice)
    assert error.status() == "400"
    assert error.message() == f"{NO_ID}output 'OUTPUT0' already exists in request"


def test_unknown_output(client: httpclient.InferenceServerClient) -> None:
    error = _infer_error(client, "add_sub", add_sub_inputs(), outputs=[httpclient.InferRequestedOutput("OUTPUTX")])
    assert error.status() == "400"
    assert error.message() == "unexpected inference output 'OUTPUTX' for model 'add_sub'"


def test_wrong_datatype(client: httpclient.InferenceServerClient) -> None:
    inputs = add_sub_inputs()
    wrong = httpclient.InferInput("INPUT1", [1, 16], "INT32")
    wrong.set_data_from_numpy(np.ones((1, 16), dtype=np.int32))
    error = _infer_error(client, "add_sub", [inputs[0], wrong])
    assert error.status() == "400"
    assert (
        error.message() == f"{NO_ID}inference input 'INPUT1' data-type is 'INT32', but model 'add_sub' expects 'FP32'"
    )


def test_unknown_datatype_name(server: Server) -> None:
    inputs = _good_inputs()
    inputs[1]["datatype"] = "FLOAT"
    _expect(post_json(server.http_url, INFER, {"inputs": inputs}), 400, "invalid datatype for input INPUT1")


def test_wrong_shape(client: httpclient.InferenceServerClient) -> None:
    error = _infer_error(client, "add_sub", add_sub_inputs(np.zeros((1, 15), dtype=np.float32)))
    assert error.status() == "400"
    assert error.message() == (
        f"{NO_ID}unexpected shape for input 'INPUT0' for model 'add_sub'. Expected [-1,16], got [1,15]. {BATCH_NOTE}"
    )


def test_wrong_shape_without_batching(server: Server) -> None:
    reply = post_json(server.http_url, NOBATCH_INFER, {"inputs": [_fp32("INPUT0", [4]), _fp32("INPUT1", [1, 4])]})
    # No note when max_batch_size is 0, so the message ends with ". ".
    _expect(
        reply, 400, f"{NO_ID}unexpected shape for input 'INPUT1' for model 'add_sub_nobatch'. Expected [4], got [1,4]. "
    )


def test_missing_batch_dimension_reads_as_a_batch(client: httpclient.InferenceServerClient) -> None:
    error = _infer_error(
        client, "add_sub", add_sub_inputs(np.zeros(16, dtype=np.float32), np.ones(16, dtype=np.float32))
    )
    assert error.status() == "400"
    assert error.message() == f"{NO_ID}inference request batch-size must be <= 8 for 'add_sub'"


def test_batch_too_big(client: httpclient.InferenceServerClient) -> None:
    big = np.zeros((9, 16), dtype=np.float32)
    error = _infer_error(client, "add_sub", add_sub_inputs(big, big))
    assert error.status() == "400"
    assert error.message() == f"{NO_ID}inference request batch-size must be <= 8 for 'add_sub'"


def test_batch_sizes_differ_between_inputs(client: httpclient.InferenceServerClient) -> None:
    error = _infer_error(
        client, "add_sub", add_sub_inputs(np.zeros((1, 16), dtype=np.float32), np.zeros((2, 16), dtype=np.float32))
    )
    assert error.status() == "400"
    # Which input Triton names depends on its hash order.
    assert re.fullmatch(
        re.escape(NO_ID) + r"input 'INPUT[01]' batch size does not match other inputs for 'add_sub'", error.message()
    ), error.message()


def test_input_must_carry_data(server: Server) -> None:
    inputs = _good_inputs()
    del inputs[1]["data"]
    _expect(
        post_json(server.http_url, INFER, {"inputs": inputs}),
        400,
        "Input must set only one of the following fields: 'data', 'binary_data_size' in 'parameters',"
        " 'shared_memory_region' in 'parameters'. But no field is set",
    )


def test_input_must_not_carry_data_twice(server: Server) -> None:
    inputs = _good_inputs()
    inputs[0]["parameters"] = {"binary_data_size": 64}
    header = json.dumps({"inputs": inputs}).encode()
    reply = request(
        server.http_url,
        "POST",
        INFER,
        header + ADD_SUB_INPUT0.tobytes(),
        {"Content-Type": "application/octet-stream", "Inference-Header-Content-Length": str(len(header))},
    )
    _expect(
        reply,
        400,
        "Input must set only one of the following fields: 'data', 'binary_data_size' in 'parameters',"
        " 'shared_memory_region' in 'parameters'. But set 'data' 'binary_data_size'",
    )


# ------------------------------------------------------------------------------------------------------------
# data that does not match the shape


@pytest.mark.parametrize("count", [15, 17])
def test_json_data_length_not_matching_shape(server: Server, count: int) -> None:
    inputs = _good_inputs()
    inputs[0]["data"] = [0.0] * count
    _expect(
        post_json(server.http_url, INFER, {"inputs": inputs}),
        500,
        "Unable to parse 'data': Shape does not match true shape of 'data' field",
    )


def _binary_request(
    server: Server,
    sizes: tuple[int, int],
    blob: bytes,
    *,
    header_length: str | None = None,
    path: str = INFER,
) -> Reply:
    header = json.dumps(
        {
            "inputs": [
                {"name": name, "shape": [1, 16], "datatype": "FP32", "parameters": {"binary_data_size": size}}
                for name, size in zip(("INPUT0", "INPUT1"), sizes, strict=True)
            ]
        },
        separators=(",", ":"),
    ).encode()
    headers = {"Content-Type": "application/octet-stream"}
    if header_length != "":
        headers["Inference-Header-Content-Length"] = header_length or str(len(header))
    return request(server.http_url, "POST", path, header + blob, headers)


GOOD_BLOB: Final = ADD_SUB_INPUT0.tobytes() + ADD_SUB_INPUT1.tobytes()


def test_binary_data_length_not_matching_shape(server: Server) -> None:
    reply = _binary_request(server, (64, 60), GOOD_BLOB[:124])
    _expect(reply, 400, f"{NO_ID}input byte size mismatch for input 'INPUT1' for model 'add_sub'. Expected 64, got 60")


def test_binary_sizes_that_split_the_body_wrongly(server: Server) -> None:
    reply = _binary_request(server, (60, 68), GOOD_BLOB)
    assert reply.status == 400, reply
    assert re.fullmatch(
        re.escape(NO_ID)
        + r"input byte size mismatch for input 'INPUT(0|1)' for model 'add_sub'\. Expected 64, got (60|68)",
        reply.error(),
    ), reply.error()


def test_truncated_binary_body(server: Server) -> None:
    # 64 + 64 bytes declared, 100 sent: INPUT1 is 28 bytes short.
    _expect(
        _binary_request(server, (64, 64), GOOD_BLOB[:100]),
        400,
        "unexpected size for input 'INPUT1', expecting 28 additional bytes for model 'add_sub'",
    )


def test_declared_size_beyond_the_body(server: Server) -> None:
    _expect(
        _binary_request(server, (64, 128), GOOD_BLOB),
        400,
        "unexpected size for input 'INPUT1', expecting 64 additional bytes for model 'add_sub'",
    )


def test_leftover_bytes_after_the_last_input(server: Server) -> None:
    _expect(
        _binary_request(server, (64, 64), GOOD_BLOB + b"extra"),
        400,
        "unexpected additional input data for model 'add_sub'",
    )


def test_header_length_beyond_the_body(server: Server) -> None:
    # The JSON header is 188 bytes and the body 316.
    reply = _binary_request(server, (64, 64), GOOD_BLOB, header_length="326")
    _expect(reply, 400, "inference header size should be in range (0, 316), got: 326")


def test_negative_header_length(server: Server) -> None:
    reply = _binary_request(server, (64, 64), GOOD_BLOB, header_length="-5")
    _expect(reply, 400, "inference header size should be in range (0, 316), got: -5")


def test_header_length_cutting_the_json(server: Server) -> None:
    reply = _binary_request(server, (64, 64), GOOD_BLOB, header_length="20")
    assert reply.status == 500, reply
    assert reply.error().startswith("failed to parse the request JSON buffer: "), reply.error()


def test_binary_inputs_without_header_length(server: Server) -> None:
    # Without the header the whole body is the JSON document, so no bytes are left for INPUT0.
    reply = _binary_request(server, (64, 64), GOOD_BLOB, header_length="")
    _expect(reply, 400, "unexpected size for input 'INPUT0', expecting 64 additional bytes for model 'add_sub'")


def test_binary_data_size_must_be_a_number(server: Server) -> None:
    header = json.dumps(
        {
            "inputs": [
                {"name": "INPUT0", "shape": [1, 16], "datatype": "FP32", "parameters": {"binary_data_size": 64}},
                {"name": "INPUT1", "shape": [1, 16], "datatype": "FP32", "parameters": {"binary_data_size": "64"}},
            ]
        }
    ).encode()
    reply = request(
        server.http_url,
        "POST",
        INFER,
        header + GOOD_BLOB,
        {"Content-Type": "application/octet-stream", "Inference-Header-Content-Length": str(len(header))},
    )
    _expect(
        reply,
        500,
        "Unable to parse 'binary_data_size': attempt to access JSON non-unsigned-integer as unsigned-integer",
    )


# ------------------------------------------------------------------------------------------------------------
# data types that need care


def test_fp16_cannot_be_sent_as_json(client: httpclient.InferenceServerClient) -> None:
    tensor = httpclient.InferInput("INPUT0", [1, 3], "FP16")
    tensor.set_data_from_numpy(np.array([[1.0, 2.5, -3.0]], dtype=np.float16), binary_data=False)
    error = _infer_error(client, "identity_fp16", [tensor])
    assert error.status() == "400"
    assert error.message() == (
        "receiving FP16 data via JSON is not supported. Please use the binary data format for input INPUT0"
    )


def test_bf16_cannot_be_sent_as_json(server: Server) -> None:
    reply = post_json(
        server.http_url,
        "/v2/models/identity_bf16/infer",
        {"inputs": [{"name": "INPUT0", "shape": [1, 2], "datatype": "BF16", "data": [1.0, 2.0]}]},
    )
    _expect(
        reply, 400, "receiving BF16 data via JSON is not supported. Please use the binary data format for input INPUT0"
    )


def test_fp16_cannot_be_returned_as_json(client: httpclient.InferenceServerClient) -> None:
    tensor = httpclient.InferInput("INPUT0", [1, 3], "FP16")
    tensor.set_data_from_numpy(np.array([[1.0, 2.5, -3.0]], dtype=np.float16))
    error = _infer_error(
        client, "identity_fp16", [tensor], outputs=[httpclient.InferRequestedOutput("OUTPUT0", binary_data=False)]
    )
    assert error.status() == "400"
    assert (
        error.message() == "sending FP16 data via JSON is not supported. Please use the binary data format for output"
    )


def test_bytes_json_elements_must_be_strings(server: Server) -> None:
    reply = post_json(
        server.http_url,
        "/v2/models/identity_bytes/infer",
        {"inputs": [{"name": "INPUT0", "shape": [1, 2], "datatype": "BYTES", "data": ["a", 5]}]},
    )
    _expect(reply, 500, "Unable to parse JSON bytes array: attempt to access JSON non-string as string")


def _bytes_request(server: Server, shape: list[int], blob: bytes) -> Reply:
    header = json.dumps(
        {
            "inputs": [
                {"name": "INPUT0", "shape": shape, "datatype": "BYTES", "parameters": {"binary_data_size": len(blob)}}
            ]
        }
    ).encode()
    return request(
        server.http_url,
        "POST",
        "/v2/models/identity_bytes/infer",
        header + blob,
        {"Content-Type": "application/octet-stream", "Inference-Header-Content-Length": str(len(header))},
    )


def _serialized(*elements: bytes) -> bytes:
    return b"".join(len(e).to_bytes(4, "little") + e for e in elements)


def test_bytes_element_cut_short(server: Server) -> None:
    blob = _serialized(b"hello", b"", "wörld".encode())[:-2]
    _expect(
        _bytes_request(server, [1, 3], blob),
        400,
        "incomplete string data for inference input 'INPUT0', expecting string of length 6 but only 4 bytes available",
    )


def test_more_bytes_elements_than_the_shape(server: Server) -> None:
    _expect(
        _bytes_request(server, [1, 2], _serialized(b"hello", b"", b"world")),
        400,
        f"{NO_ID}unexpected number of string elements 3 for inference input 'INPUT0' for model 'identity_bytes',"
        " expecting 2",
    )


def test_classification_of_bytes_is_refused(client: httpclient.InferenceServerClient) -> None:
    tensor = httpclient.InferInput("INPUT0", [1, 2], "BYTES")
    tensor.set_data_from_numpy(np.array([[b"a", b"b"]], dtype=np.object_))
    error = _infer_error(
        client, "identity_bytes", [tensor], outputs=[httpclient.InferRequestedOutput("OUTPUT0", class_count=1)]
    )
    assert error.status() == "400"
    assert "class result not available for output due to unsupported type 'BYTES'" in error.message()


# ------------------------------------------------------------------------------------------------------------
# malformed JSON


def test_malformed_json(server: Server) -> None:
    reply = request(
        server.http_url, "POST", INFER, '{"inputs":[{"name":"INPUT0",', {"Content-Type": "application/json"}
    )
    assert reply.status == 500, reply
    # Triton appends rapidjson's text; edged its own parser's detail.
    assert reply.error().startswith("failed to parse the request JSON buffer: "), reply.error()


def test_empty_body_reads_as_a_raw_request(server: Server) -> None:
    reply = request(server.http_url, "POST", INFER, b"", {"Content-Type": "application/json"})
    _expect(
        reply,
        400,
        f"{NO_ID}Raw request must only have 1 input (found 1) to be deduced but got 2 inputs in 'add_sub' model"
        " configuration",
    )


@pytest.mark.parametrize(
    ("document", "message"),
    [
        ({"id": "x"}, "Unable to parse 'inputs': attempt to access non-existing object member 'inputs'"),
        ([1, 2], "Unable to parse 'inputs': attempt to access non-existing object member 'inputs'"),
        (
            {"inputs": [{"name": "INPUT0", "datatype": "FP32", "data": [1.0]}]},
            "Unable to parse 'shape': attempt to access non-existing object member 'shape'",
        ),
        (
            {"inputs": [{"name": "INPUT0", "shape": [1, 16], "data": [1.0] * 16}]},
            "Unable to parse 'datatype': attempt to access non-existing object member 'datatype'",
        ),
        (
            {"inputs": [{"shape": [1, 16], "datatype": "FP32", "data": [1.0] * 16}]},
            "Unable to parse 'name': attempt to access non-existing object member 'name'",
        ),
        (
            {"inputs": [{"name": "INPUT0", "shape": [-1, 16], "datatype": "FP32", "data": [1.0] * 16}]},
            "Unable to parse 'shape': attempt to access JSON non-unsigned-integer as unsigned-integer",
        ),
        (
            {"inputs": [{"name": "INPUT0", "shape": [1, 16], "datatype": "FP32", "data": ["x"] * 16}]},
            "Unable to parse 'data': attempt to access JSON non-number as double",
        ),
        (
            {"inputs": [{"name": "INPUT0", "shape": [1, 16], "datatype": "FP32", "data": 1.0}]},
            "Unable to parse 'data': attempt to access JSON non-array as array",
        ),
        (
            {"parameters": {"binary_data_output": "yes"}, "inputs": _good_inputs()},
            "Unable to parse 'binary_data_output': attempt to access JSON non-boolean as boolean",
        ),
        (
            {"inputs": _good_inputs(), "outputs": [{"name": "OUTPUT0", "parameters": {"binary_data": "yes"}}]},
            "Unable to parse 'binary_data': attempt to access JSON non-boolean as boolean",
        ),
    ],
    ids=[
        "no-inputs",
        "array-body",
        "no-shape",
        "no-datatype",
        "no-name",
        "negative-shape",
        "string-element",
        "scalar-data",
        "binary_data_output-not-bool",
        "binary_data-not-bool",
    ],
)
def test_json_structure_errors(server: Server, document: Any, message: str) -> None:
    _expect(post_json(server.http_url, INFER, document), 500, message)


def test_reserved_parameter_prefix(server: Server) -> None:
    for key in ("triton_foo", "triton_enable_empty_final_response"):
        _expect(
            post_json(server.http_url, INFER, {"parameters": {key: True}, "inputs": _good_inputs()}),
            400,
            "parameter keys starting with 'triton_' are reserved for Triton usage and should not be specified.",
        )


def test_parameter_values_must_be_scalars(server: Server) -> None:
    _expect(
        post_json(server.http_url, INFER, {"parameters": {"p": {"a": 1}}, "inputs": _good_inputs()}),
        400,
        "parameter 'p' has invalid type. It should be either 'int', 'bool', or 'string'.",
    )


def _nested(depth: int, leaf: str) -> str:
    return "[" * depth + leaf + "]" * depth


def test_moderately_nested_data_reaches_shape_validation(server: Server) -> None:
    body = (
        '{"inputs":[{"name":"INPUT0","shape":[1],"datatype":"FP32","data":' + _nested(50, "1.0") + "},"
        '{"name":"INPUT1","shape":[4],"datatype":"FP32","data":[1,1,1,1]}]}'
    )
    reply = request(server.http_url, "POST", NOBATCH_INFER, body, {"Content-Type": "application/json"})
    _expect(
        reply, 400, f"{NO_ID}unexpected shape for input 'INPUT0' for model 'add_sub_nobatch'. Expected [4], got [1]. "
    )


@pytest.mark.parametrize("depth", [101, 150, 10_000, 200_000])
def test_deeply_nested_data_is_refused(server: Server, depth: int) -> None:
    # Deliberately stricter than Triton: JSON nested more than 100 levels deep is refused outright.
    body = (
        '{"inputs":[{"name":"INPUT0","shape":[1],"datatype":"FP32","data":' + _nested(depth, "1.0") + "},"
        '{"name":"INPUT1","shape":[4],"datatype":"FP32","data":[1,1,1,1]}]}'
    )
    reply = request(server.http_url, "POST", NOBATCH_INFER, body, {"Content-Type": "application/json"})
    assert reply.status == 400, reply
    assert reply.error()


def test_deeply_nested_parameters_are_refused(server: Server) -> None:
    body = '{"parameters":{"x":' + '{"a":' * 1000 + "1" + "}" * 1000 + '},"inputs":[]}'
    reply = request(server.http_url, "POST", NOBATCH_INFER, body, {"Content-Type": "application/json"})
    assert reply.status == 400, reply
    assert reply.error()


# ------------------------------------------------------------------------------------------------------------
# compression


def test_unsupported_content_encoding(server: Server) -> None:
    reply = post_json(server.http_url, INFER, {"inputs": _good_inputs()}, {"Content-Encoding": "br"})
    _expect(reply, 501, "Unsupported compression type")


def test_body_that_is_not_the_declared_gzip(server: Server) -> None:
    reply = post_json(server.http_url, INFER, {"inputs": _good_inputs()}, {"Content-Encoding": "gzip"})
    assert 400 <= reply.status < 500, reply
    assert reply.error()


def test_error_replies_survive_accept_encoding(server: Server) -> None:
    reply = post_json(server.http_url, INFER, {"inputs": []}, {"Accept-Encoding": "gzip"})
    assert reply.status == 400, reply
    body = gzip.decompress(reply.body) if reply.header("content-encoding") == "gzip" else reply.body
    assert json.loads(body)["error"].startswith(f"{NO_ID}expected 2 inputs but got 0 inputs")


# ------------------------------------------------------------------------------------------------------------
# routing


@pytest.mark.parametrize(
    "path", ["/v2/foo", "/foo", "/", "/v2/", "/v2/models", "/v2/models/add_sub/foo", "/v2/health", "/v2/health/x"]
)
def test_unknown_path(server: Server, path: str) -> None:
    _expect(request(server.http_url, "GET", path), 404, "Not Found")


@pytest.mark.parametrize(
    ("method", "path"),
    [
        ("POST", "/v2/health/live"),
        ("PUT", "/v2/health/ready"),
        ("POST", "/v2"),
        ("GET", "/v2/models/add_sub/infer"),
        ("POST", "/v2/models/add_sub"),
        ("POST", "/v2/models/add_sub/config"),
        ("DELETE", "/v2/models/add_sub"),
        ("GET", "/v2/repository/index"),
    ],
)
def test_wrong_method(server: Server, method: str, path: str) -> None:
    _expect(request(server.http_url, method, path, b"" if method != "GET" else None), 405, "Method Not Allowed")


def test_head_is_not_allowed(server: Server) -> None:
    reply = request(server.http_url, "HEAD", "/v2/health/live")
    assert reply.status == 405
    assert reply.body == b""


# ------------------------------------------------------------------------------------------------------------
# request size limit, against a daemon started with a small --http-max-input-size


def _too_big_json() -> bytes:
    document = {"inputs": [_fp32("INPUT0", [1, 16], [0.123456789] * 16), _fp32("INPUT1", [1, 16])], "id": "x" * 5000}
    body = json.dumps(document).encode()
    assert len(body) > SMALL_MAX_INPUT_SIZE
    return body


def test_body_over_the_limit_is_413(bundled_server: Server) -> None:
    reply = request(bundled_server.http_url, "POST", INFER, _too_big_json(), {"Content-Type": "application/json"})
    assert reply.status == 413, reply
    assert reply.header("content-type") == "application/json"
    assert reply.error()


def test_chunked_body_over_the_limit_is_413(bundled_server: Server) -> None:
    body = _too_big_json()
    chunks = [body[i : i + 1000] for i in range(0, len(body), 1000)]
    encoded = b"".join(f"{len(c):x}\r\n".encode() + c + b"\r\n" for c in chunks) + b"0\r\n\r\n"
    reply = request(
        bundled_server.http_url,
        "POST",
        INFER,
        encoded,
        {"Content-Type": "application/json", "Transfer-Encoding": "chunked"},
    )
    assert reply.status == 413, reply
    assert reply.error()


def test_compressed_body_that_inflates_over_the_limit_is_refused(bundled_server: Server) -> None:
    body = gzip.compress(_too_big_json())
    assert len(body) < SMALL_MAX_INPUT_SIZE
    reply = request(
        bundled_server.http_url, "POST", INFER, body, {"Content-Type": "application/json", "Content-Encoding": "gzip"}
    )
    assert reply.status in (400, 413), reply
    assert reply.error()


def test_client_sees_413_and_small_requests_still_work(bundled_server: Server) -> None:
    limited = httpclient.InferenceServerClient(bundled_server.http_url)
    try:
        big = np.zeros((8, 16), dtype=np.float32)  # 2 x 512 bytes of binary data plus the JSON header: under 4 KiB
        result = limited.infer("add_sub", add_sub_inputs(big, big))
        np.testing.assert_array_equal(result.as_numpy("OUTPUT0"), big)
        huge = add_sub_inputs(big, big, binary=False)
        huge[0].set_data_from_numpy(np.full((8, 16), 0.123456789, dtype=np.float32), binary_data=False)
        huge[1].set_data_from_numpy(np.full((8, 16), 0.123456789, dtype=np.float32), binary_data=False)
        with pytest.raises(InferenceServerException) as caught:
            limited.infer("add_sub", huge)
        assert caught.value.status() == "413"
        assert_still_serving(limited)
    finally:
        limited.close()


def test_request_not_over_the_limit_is_served(bundled_server: Server) -> None:
    reply = post_json(bundled_server.http_url, INFER, {"inputs": _good_inputs()})
    assert reply.status == 200, reply
    assert [o["name"] for o in reply.json()["outputs"]] == ["OUTPUT0", "OUTPUT1"]


# ------------------------------------------------------------------------------------------------------------
# inputs that once reached numpy unchecked


def test_huge_shape_with_a_zero_dimension(server: Server) -> None:
    reply = post_json(
        server.http_url,
        "/v2/models/identity_fp32/infer",
        {"inputs": [{"name": "INPUT0", "shape": [0, 2**62], "datatype": "FP32", "data": []}]},
    )
    _expect(reply, 400, "input 'INPUT0' has shape [0,4611686018427387904], more than 1099511627776 elements")


def test_empty_outputs_list_returns_every_output(server: Server) -> None:
    reply = post_json(server.http_url, "/v2/models/add_sub/infer", {"inputs": _good_inputs(), "outputs": []})
    assert reply.status == 200, reply
    assert [o["name"] for o in reply.json()["outputs"]] == ["OUTPUT0", "OUTPUT1"]


def test_classification_of_an_empty_batch(server: Server) -> None:
    reply = post_json(
        server.http_url,
        "/v2/models/digits/infer",
        {
            "inputs": [{"name": "image", "shape": [0, 64], "datatype": "FP32", "data": []}],
            "outputs": [{"name": "probabilities", "parameters": {"classification": 3}}],
        },
    )
    assert reply.status == 200, reply
    assert reply.json()["outputs"][0]["shape"] == [0, 3]


def test_number_too_large_for_fp32(server: Server) -> None:
    inputs = _good_inputs()
    body = json.dumps({"inputs": inputs}).replace("[0.0, 1.0,", "[1" + "0" * 400 + ", 1.0,", 1)
    assert "0" * 400 in body
    reply = request(server.http_url, "POST", "/v2/models/add_sub/infer", body, {"Content-Type": "application/json"})
    _expect(reply, 400, "unable to parse 'data' for input 'INPUT0': a value is out of range for FP32")


@pytest.mark.parametrize("value", ["9" * 5000, "\u00b2"], ids=["5000-digits", "superscript-two"])
def test_header_length_that_is_not_a_small_ascii_number(server: Server, value: str) -> None:
    # Read as Triton reads it (atoi): not a number means 0, a raw binary request, which add_sub cannot take.
    reply = request(
        server.http_url,
        "POST",
        "/v2/models/add_sub/infer",
        json.dumps({"inputs": _good_inputs()}).encode(),
        {"Inference-Header-Content-Length": value.encode("latin-1").decode("latin-1") if value.isascii() else "\xb2"},
    )
    assert reply.status == 400, reply
    assert "Raw request must only have 1 input" in reply.error()
