"""Health, server metadata, model readiness, model metadata and model configuration, as Triton answers them."""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import tritonclient.grpc.model_config_pb2 as triton_model_config
import tritonclient.http as httpclient
from conftest import ALL_DTYPES, identity_model_name
from google.protobuf import descriptor, json_format, text_format
from server import Server, request, run_server
from tritonclient.utils import InferenceServerException

import edged

# ------------------------------------------------------------------------------------------------------------
# what Triton prints for a model configuration


def _int64_fields_as_numbers(message_type: descriptor.Descriptor, value: dict[str, Any]) -> dict[str, Any]:
    """Triton's ModelConfigToJson turns the strings protobuf's JSON uses for 64-bit integers back into numbers."""
    wide = {descriptor.FieldDescriptor.CPPTYPE_INT64, descriptor.FieldDescriptor.CPPTYPE_UINT64}
    for key, item in value.items():
        field = message_type.fields_by_name[key]
        if field.message_type is not None and field.message_type.GetOptions().map_entry:
            value_field = field.message_type.fields_by_name["value"]
            if value_field.message_type is not None:
                for entry in item.values():
                    _int64_fields_as_numbers(value_field.message_type, entry)
        elif field.message_type is not None:
            for entry in item if isinstance(item, list) else [item]:
                _int64_fields_as_numbers(field.message_type, entry)
        elif field.cpp_type in wide:
            value[key] = [int(v) for v in item] if isinstance(item, list) else int(item)
    return value


def triton_config_json(pbtxt: str) -> dict[str, Any]:
    """The JSON Triton serves for a complete (normalized) config, built with the schema tritonclient ships."""
    config = text_format.Parse(pbtxt, triton_model_config.ModelConfig())
    document = json_format.MessageToDict(
        config, preserving_proto_field_name=True, always_print_fields_with_no_presence=True
    )
    return _int64_fields_as_numbers(config.DESCRIPTOR, document)


def _io(name: str, data_type: str, dims: list[int], label: str | None = None) -> str:
    label_text = f' label_filename: "{label}"' if label else ""
    return f'{{ name: "{name}" data_type: {data_type} dims: {dims}{label_text} }}'


def _onnx_model_config(name: str, max_batch_size: int, inputs: list[str], outputs: list[str], extra: str = "") -> str:
    # What Triton's normalization adds to an ONNX model config that names no instance group: the latest
    # version policy, pinned memory on, and one CPU group named after the model with 2 instances (the
    # onnxruntime backend's default CPU instance count).
    return f"""
        name: "{name}"
        platform: "onnxruntime_onnx"
        backend: "onnxruntime"
        version_policy {{ latest {{ num_versions: 1 }} }}
        max_batch_size: {max_batch_size}
        input [ {", ".join(inputs)} ]
        output [ {", ".join(outputs)} ]
        optimization {{ input_pinned_memory {{ enable: true }} output_pinned_memory {{ enable: true }} }}
        instance_group [ {{ name: "{name}" kind: KIND_CPU count: 2 }} ]
        default_model_filename: "model.onnx"
        {extra}
    """


ADD_SUB_IO = (
    [_io("INPUT0", "TYPE_FP32", [16]), _io("INPUT1", "TYPE_FP32", [16])],
    [_io("OUTPUT0", "TYPE_FP32", [16]), _io("OUTPUT1", "TYPE_FP32", [16])],
)


def _sorted_io(config: dict[str, Any]) -> dict[str, Any]:
    # Triton auto-completes I/O from hash maps, so only the set of tensors is meaningful there.
    return {
        **config,
        "input": sorted(config["input"], key=lambda t: t["name"]),
        "output": sorted(config["output"], key=lambda t: t["name"]),
    }


def test_config_helper_reproduces_tritons_json() -> None:
    # The expected configs below are built by triton_config_json; this pins it to a reply recorded from
    # Triton 2.51 for a Python-backend add_sub (only the backend fields differ from the ONNX one).
    recorded = {
        "name": "add_sub",
        "platform": "",
        "backend": "python",
        "runtime": "",
        "version_policy": {"latest": {"num_versions": 1}},
        "max_batch_size": 8,
        "input": [
            {
                "name": n,
                "data_type": "TYPE_FP32",
                "format": "FORMAT_NONE",
                "dims": [16],
                "is_shape_tensor": False,
                "allow_ragged_batch": False,
                "optional": False,
                "is_non_linear_format_io": False,
            }
            for n in ("INPUT0", "INPUT1")
        ],
        "output": [
            {
                "name": n,
                "data_type": "TYPE_FP32",
                "dims": [16],
                "label_filename": "",
                "is_shape_tensor": False,
                "is_non_linear_format_io": False,
            }
            for n in ("OUTPUT0", "OUTPUT1")
        ],
        "batch_input": [],
        "batch_output": [],
        "optimization": {
            "priority": "PRIORITY_DEFAULT",
            "input_pinned_memory": {"enable": True},
            "output_pinned_memory": {"enable": True},
            "gather_kernel_buffer_threshold": 0,
            "eager_batching": False,
        },
        "instance_group": [
            {
                "name": "add_sub_0",
                "kind": "KIND_CPU",
                "count": 1,
                "gpus": [],
                "secondary_devices": [],
                "profile": [],
                "passive": False,
                "host_policy": "",
            }
        ],
        "default_model_filename": "model.py",
        "cc_model_filenames": {},
        "metric_tags": {},
        "parameters": {},
        "model_warmup": [],
    }
    built = triton_config_json(
        """
        name: "add_sub" backend: "python" version_policy { latest { num_versions: 1 } } max_batch_size: 8
        input [ { name: "INPUT0" data_type: TYPE_FP32 dims: [16] }, { name: "INPUT1" data_type: TYPE_FP32 dims: [16] } ]
        output [ { name: "OUTPUT0" data_type: TYPE_FP32 dims: [16] },
                 { name: "OUTPUT1" data_type: TYPE_FP32 dims: [16] } ]
        optimization { input_pinned_memory { enable: true } output_pinned_memory { enable: true } }
        instance_group [ { name: "add_sub_0" kind: KIND_CPU count: 1 } ]
        default_model_filename: "model.py"
        """
    )
    assert built == recorded


# ------------------------------------------------------------------------------------------------------------
# health


def test_live(server: Server, client: httpclient.InferenceServerClient) -> None:
    assert client.is_server_live()
    reply = request(server.http_url, "GET", "/v2/health/live")
    assert (reply.status, reply.body) == (200, b"")


def test_not_ready_while_a_model_is_unavailable(server: Server, client: httpclient.InferenceServerClient) -> None:
    # --strict-readiness defaults to true, and the test repository holds models that cannot load.
    assert not client.is_server_ready()
    reply = request(server.http_url, "GET", "/v2/health/ready")
    assert (reply.status, reply.body) == (400, b"")


def test_ready_when_every_model_loaded(bundled_server: Server) -> None:
    ready = httpclient.InferenceServerClient(bundled_server.http_url)
    try:
        assert ready.is_server_live()
        assert ready.is_server_ready()
    finally:
        ready.close()
    reply = request(bundled_server.http_url, "GET", "/v2/health/ready")
    assert (reply.status, reply.body) == (200, b"")


def test_models_from_every_repository_are_served(bundled_server: Server) -> None:
    both = httpclient.InferenceServerClient(bundled_server.http_url)
    try:
        for model in ("add_sub", "digits", "identity_fp32"):
            assert both.is_model_ready(model), model
    finally:
        both.close()


@pytest.fixture(scope="module")
def lenient_server(small_repository: Path) -> Iterator[Server]:
    with run_server([small_repository], "--strict-readiness=false", "--id", "my-edge-box") as running:
        yield running


def test_ready_without_strict_readiness(lenient_server: Server) -> None:
    # broken_syntax cannot load, which only strict readiness holds against the server.
    assert request(lenient_server.http_url, "GET", "/v2/models/broken_syntax/ready").status == 400
    reply = request(lenient_server.http_url, "GET", "/v2/health/ready")
    assert (reply.status, reply.body) == (200, b"")


def test_metrics_endpoint_answers(server: Server) -> None:
    reply = request(server.metrics_url, "GET", "/metrics")
    assert reply.status == 200
    assert (reply.header("content-type") or "").startswith("text/plain")


# ------------------------------------------------------------------------------------------------------------
# server metadata


def test_server_metadata(client: httpclient.InferenceServerClient) -> None:
    metadata = client.get_server_metadata()
    assert set(metadata) == {"name", "version", "extensions"}
    # Triton's default name, for health checks written for Triton.
    assert metadata["name"] == "triton"
    assert metadata["version"] == edged.__version__
    extensions = metadata["extensions"]
    assert isinstance(extensions, list)
    assert all(isinstance(extension, str) for extension in extensions)
    # Triton 2.51's list, in its order and spelling.
    assert extensions == [
        "classification",
        "sequence",
        "model_repository",
        "model_repository(unload_dependents)",
        "schedule_policy",
        "model_configuration",
        "system_shared_memory",
        "cuda_shared_memory",
        "binary_tensor_data",
        "parameters",
        "statistics",
        "trace",
        "logging",
    ]


def test_server_name_comes_from_id(lenient_server: Server) -> None:
    assert request(lenient_server.http_url, "GET", "/v2").json()["name"] == "my-edge-box"


# ------------------------------------------------------------------------------------------------------------
# model readiness


def test_model_ready(server: Server, client: httpclient.InferenceServerClient) -> None:
    assert client.is_model_ready("add_sub")
    assert client.is_model_ready("add_sub", "1")
    assert not client.is_model_ready("add_sub", "2")
    assert not client.is_model_ready("nonexistent")
    for path in ("/v2/models/add_sub/ready", "/v2/models/add_sub/versions/1/ready"):
        reply = request(server.http_url, "GET", path)
        assert (reply.status, reply.body) == (200, b""), path


@pytest.mark.parametrize(
    "path",
    [
        "/v2/models/nonexistent/ready",
        "/v2/models/add_sub/versions/2/ready",
        "/v2/models/broken_syntax/ready",
        "/v2/models/no_version/ready",
    ],
)
def test_model_not_ready(server: Server, path: str) -> None:
    reply = request(server.http_url, "GET", path)
    assert reply.status == 400
    assert reply.error() == "Model version not ready"


# ------------------------------------------------------------------------------------------------------------
# model metadata


def _tensor(name: str, datatype: str, shape: list[int]) -> dict[str, Any]:
    return {"name": name, "datatype": datatype, "shape": shape}


ADD_SUB_METADATA = {
    "name": "add_sub",
    "versions": ["1"],
    "platform": "onnxruntime_onnx",
    "inputs": [_tensor("INPUT0", "FP32", [-1, 16]), _tensor("INPUT1", "FP32", [-1, 16])],
    "outputs": [_tensor("OUTPUT0", "FP32", [-1, 16]), _tensor("OUTPUT1", "FP32", [-1, 16])],
}


def test_model_metadata(client: httpclient.InferenceServerClient) -> None:
    assert client.get_model_metadata("add_sub") == ADD_SUB_METADATA
    assert client.get_model_metadata("add_sub", "1") == ADD_SUB_METADATA


def test_model_metadata_raw(server: Server) -> None:
    for path in (
        "/v2/models/add_sub",
        "/v2/models/add_sub/versions/1",
        "/v2/models/add_sub?x=1",
        "/v2/models/add_sub/versions/01",
    ):
        reply = request(server.http_url, "GET", path)
        assert reply.status == 200, path
        assert reply.header("content-type") == "application/json"
        assert reply.json() == ADD_SUB_METADATA, path


def test_non_batching_metadata_has_no_batch_dimension(client: httpclient.InferenceServerClient) -> None:
    assert client.get_model_metadata("add_sub_nobatch") == {
        "name": "add_sub_nobatch",
        "versions": ["1"],
        "platform": "onnxruntime_onnx",
        "inputs": [_tensor("INPUT0", "FP32", [4]), _tensor("INPUT1", "FP32", [4])],
        "outputs": [_tensor("OUTPUT0", "FP32", [4]), _tensor("OUTPUT1", "FP32", [4])],
    }
    assert client.get_model_metadata("identity_nobatch")["inputs"] == [_tensor("INPUT0", "FP32", [-1])]


def test_digits_metadata(client: httpclient.InferenceServerClient) -> None:
    assert client.get_model_metadata("digits") == {
        "name": "digits",
        "versions": ["1"],
        "platform": "onnxruntime_onnx",
        "inputs": [_tensor("image", "FP32", [-1, 64])],
        "outputs": [_tensor("probabilities", "FP32", [-1, 10])],
    }


@pytest.mark.parametrize("dtype", ALL_DTYPES)
def test_metadata_uses_protocol_datatype_names(client: httpclient.InferenceServerClient, dtype: str) -> None:
    name = identity_model_name(dtype)
    assert client.get_model_metadata(name) == {
        "name": name,
        "versions": ["1"],
        "platform": "onnxruntime_onnx",
        "inputs": [_tensor("INPUT0", dtype, [-1, -1])],
        "outputs": [_tensor("OUTPUT0", dtype, [-1, -1])],
    }


def test_auto_completed_metadata(client: httpclient.InferenceServerClient) -> None:
    metadata = client.get_model_metadata("auto_complete")
    assert metadata["name"] == "auto_complete"
    assert metadata["versions"] == ["1"]
    assert metadata["platform"] == "onnxruntime_onnx"
    assert sorted(metadata["inputs"], key=lambda t: t["name"]) == ADD_SUB_METADATA["inputs"]
    assert sorted(metadata["outputs"], key=lambda t: t["name"]) == ADD_SUB_METADATA["outputs"]


@pytest.mark.parametrize(
    ("model", "version", "status", "message"),
    [
        ("nonexistent", "", "404", "Request for unknown model: 'nonexistent' is not found"),
        ("add_sub", "2", "404", "Request for unknown model: 'add_sub' version 2 is not found"),
        ("add_sub", "0", "404", "Request for unknown model: 'add_sub' version 0 is not found"),
    ],
)
def test_metadata_and_config_of_unknown_models(
    client: httpclient.InferenceServerClient, model: str, version: str, status: str, message: str
) -> None:
    for call in (client.get_model_metadata, client.get_model_config):
        with pytest.raises(InferenceServerException) as caught:
            call(model, version)
        assert caught.value.status() == status
        assert caught.value.message() == message


@pytest.mark.parametrize("version", ["abc", "-1", "1.0", "v1"])
def test_version_must_be_digits_in_the_url(server: Server, version: str) -> None:
    for suffix in ("", "/ready", "/config"):
        reply = request(server.http_url, "GET", f"/v2/models/add_sub/versions/{version}{suffix}")
        assert reply.status == 404, (version, suffix)
        assert reply.error() == "Not Found"


def test_version_too_large_for_int64(server: Server) -> None:
    reply = request(server.http_url, "GET", "/v2/models/add_sub/versions/99999999999999999999")
    assert reply.status == 400
    assert reply.error().startswith(
        "failed to get model version from specified version string '99999999999999999999'"
    ), reply.error()


# ------------------------------------------------------------------------------------------------------------
# model configuration


def test_add_sub_config_matches_triton(client: httpclient.InferenceServerClient) -> None:
    expected = triton_config_json(_onnx_model_config("add_sub", 8, *ADD_SUB_IO))
    assert client.get_model_config("add_sub") == expected
    assert client.get_model_config("add_sub", "1") == expected


def test_non_batching_config_matches_triton(client: httpclient.InferenceServerClient) -> None:
    expected = triton_config_json(
        _onnx_model_config(
            "add_sub_nobatch",
            0,
            [_io("INPUT0", "TYPE_FP32", [4]), _io("INPUT1", "TYPE_FP32", [4])],
            [_io("OUTPUT0", "TYPE_FP32", [4]), _io("OUTPUT1", "TYPE_FP32", [4])],
        )
    )
    assert client.get_model_config("add_sub_nobatch") == expected


def test_digits_config_keeps_the_label_file(client: httpclient.InferenceServerClient) -> None:
    expected = triton_config_json(
        _onnx_model_config(
            "digits",
            32,
            [_io("image", "TYPE_FP32", [64])],
            [_io("probabilities", "TYPE_FP32", [10], label="labels.txt")],
        )
    )
    assert client.get_model_config("digits") == expected


def test_bytes_config_uses_type_string(client: httpclient.InferenceServerClient) -> None:
    config = client.get_model_config("identity_bytes")
    assert [(t["name"], t["data_type"], t["dims"]) for t in config["input"]] == [("INPUT0", "TYPE_STRING", [-1])]
    assert [(t["name"], t["data_type"], t["dims"]) for t in config["output"]] == [("OUTPUT0", "TYPE_STRING", [-1])]


def test_auto_completed_config_matches_triton(client: httpclient.InferenceServerClient) -> None:
    # No config.pbtxt: Triton's onnxruntime backend reads the I/O from the graph, sets max_batch_size to the
    # default 4 because the first dimension is dynamic, and adds dynamic batching, whose preferred batch size
    # normalization then sets to max_batch_size.
    expected = triton_config_json(
        _onnx_model_config("auto_complete", 4, *ADD_SUB_IO, extra="dynamic_batching { preferred_batch_size: [ 4 ] }")
    )
    assert _sorted_io(client.get_model_config("auto_complete")) == expected


def test_config_numbers_are_json_numbers(server: Server) -> None:
    reply = request(server.http_url, "GET", "/v2/models/auto_complete/config")
    assert reply.status == 200
    assert reply.header("content-type") == "application/json"
    config = reply.json()
    assert config["input"][0]["dims"] == [16]
    assert config["dynamic_batching"]["max_queue_delay_microseconds"] == 0
    assert config["max_batch_size"] == 4


def test_disabled_auto_complete_rejects_a_model_without_config(small_repository: Path) -> None:
    with run_server([small_repository], "--disable-auto-complete-config") as strict:
        triton = httpclient.InferenceServerClient(strict.http_url)
        try:
            assert triton.is_model_ready("add_sub")
            assert not triton.is_model_ready("auto_complete")
            entries = [e for e in triton.get_model_repository_index() if e["name"] == "auto_complete"]
            assert entries, "auto_complete missing from the index"
            assert all(e.get("state") == "UNAVAILABLE" and e.get("reason") for e in entries), entries
        finally:
            triton.close()


@pytest.mark.parametrize(
    ("method", "path"),
    [
        ("GET", "/v2/trace/setting"),
        ("POST", "/v2/models/add_sub/trace/setting"),
    ],
)
def test_trace_settings_without_a_trace_file(server: Server, method: str, path: str) -> None:
    """Tracing is off without --trace-config: Triton's defaults (tests/e2e/test_trace.py tests tracing)."""
    reply = request(server.http_url, method, path, "{}" if method == "POST" else None)
    assert reply.status == 200, reply
    assert json.loads(reply.body)["trace_level"] == ["OFF"]
