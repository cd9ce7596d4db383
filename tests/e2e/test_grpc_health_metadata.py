"""Health, metadata, configuration, repository, statistics and settings RPCs over gRPC, as Triton answers them,
and the same facts as the HTTP endpoints report."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any, Final

import grpc
import pytest
import tritonclient.grpc as grpcclient
import tritonclient.grpc.model_config_pb2 as triton_model_config
import tritonclient.http as httpclient
from conftest import BROKEN_MODELS, GOOD_MODELS
from google.protobuf import json_format
from server import Server, assert_grpc_still_serving
from tritonclient.grpc import service_pb2, service_pb2_grpc
from tritonclient.utils import InferenceServerException

from edged.proto import health_pb2, health_pb2_grpc

VERSION_ERROR: Final = (
    "failed to get model version from specified version string '{}' (details: stol), version should be an "
    "integral value > 0"
)


@pytest.fixture(autouse=True)
def _still_serving_afterwards(grpc_client: grpcclient.InferenceServerClient) -> Iterator[None]:
    yield
    assert_grpc_still_serving(grpc_client)


@pytest.fixture(scope="module")
def stub(server: Server) -> Iterator[Any]:
    """A bare stub with tritonclient's own schema, for requests the client library cannot make."""
    with grpc.insecure_channel(server.grpc_url) as channel:
        yield service_pb2_grpc.GRPCInferenceServiceStub(channel)


def _error(call: Any) -> InferenceServerException:
    with pytest.raises(InferenceServerException) as caught:
        call()
    return caught.value


def _rpc_error(call: Any) -> grpc.RpcError:
    with pytest.raises(grpc.RpcError) as caught:
        call()
    return caught.value


def _expect(error: InferenceServerException, status: grpc.StatusCode, message: str) -> None:
    assert error.status() == str(status)
    assert error.message() == message


# ------------------------------------------------------------------------------------------------------------
# health


def test_live_and_not_ready_while_a_model_is_unavailable(grpc_client: grpcclient.InferenceServerClient) -> None:
    assert grpc_client.is_server_live()
    # The test repository holds broken models and strict readiness is on, as in Triton.
    assert not grpc_client.is_server_ready()


def test_ready_when_every_model_loaded(bundled_server: Server) -> None:
    client = grpcclient.InferenceServerClient(bundled_server.grpc_url)
    assert client.is_server_ready()
    with grpc.insecure_channel(bundled_server.grpc_url) as channel:
        reply = health_pb2_grpc.HealthStub(channel).Check(health_pb2.HealthCheckRequest())
    assert reply.status == health_pb2.HealthCheckResponse.SERVING
    client.close()


def test_health_check_is_not_serving_while_not_ready(server: Server) -> None:
    with grpc.insecure_channel(server.grpc_url) as channel:
        reply = health_pb2_grpc.HealthStub(channel).Check(health_pb2.HealthCheckRequest(service="anything"))
    assert reply.status == health_pb2.HealthCheckResponse.NOT_SERVING


def test_model_ready(grpc_client: grpcclient.InferenceServerClient) -> None:
    assert grpc_client.is_model_ready("add_sub")
    assert grpc_client.is_model_ready("add_sub", "1")
    # Unknown models, versions and broken models are simply not ready: Triton answers OK with ready=false.
    assert not grpc_client.is_model_ready("nonexistent")
    assert not grpc_client.is_model_ready("add_sub", "2")
    for name in BROKEN_MODELS:
        assert not grpc_client.is_model_ready(name)


@pytest.mark.parametrize("version", ["abc", "", "x1"])
def test_model_ready_version_must_be_a_number(stub: Any, version: str) -> None:
    if not version:
        assert stub.ModelReady(service_pb2.ModelReadyRequest(name="add_sub", version=version)).ready
        return
    error = _rpc_error(lambda: stub.ModelReady(service_pb2.ModelReadyRequest(name="add_sub", version=version)))
    assert error.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert error.details() == VERSION_ERROR.format(version)


def test_versions_read_as_stol_reads_them(stub: Any) -> None:
    # std::stol skips leading blanks and stops at the first non-digit, so " 1" and "1abc" are version 1.
    for version in (" 1", "1abc", "+1"):
        assert stub.ModelReady(service_pb2.ModelReadyRequest(name="add_sub", version=version)).ready
    error = _rpc_error(lambda: stub.ModelMetadata(service_pb2.ModelMetadataRequest(name="add_sub", version="-1")))
    assert error.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert error.details() == "invalid model version specified '-1' , version should be an integral value > 0"
    too_big = "9" * 20
    error = _rpc_error(lambda: stub.ModelMetadata(service_pb2.ModelMetadataRequest(name="add_sub", version=too_big)))
    assert error.details() == VERSION_ERROR.format(too_big)


# ------------------------------------------------------------------------------------------------------------
# metadata


def test_server_metadata(
    grpc_client: grpcclient.InferenceServerClient, client: httpclient.InferenceServerClient
) -> None:
    meta = grpc_client.get_server_metadata()
    http = client.get_server_metadata()
    assert meta.name == http["name"] == "triton"
    assert meta.version == http["version"]
    assert list(meta.extensions) == http["extensions"]
    assert "statistics" in meta.extensions


@pytest.mark.parametrize("model", GOOD_MODELS)
def test_model_metadata_matches_http(
    grpc_client: grpcclient.InferenceServerClient, client: httpclient.InferenceServerClient, model: str
) -> None:
    meta = grpc_client.get_model_metadata(model)
    http = client.get_model_metadata(model)
    assert meta.name == http["name"]
    assert list(meta.versions) == http["versions"]
    assert meta.platform == http["platform"]
    for ours, theirs in ((meta.inputs, http["inputs"]), (meta.outputs, http["outputs"])):
        assert [{"name": t.name, "datatype": t.datatype, "shape": list(t.shape)} for t in ours] == theirs


def test_add_sub_metadata(grpc_client: grpcclient.InferenceServerClient) -> None:
    meta = grpc_client.get_model_metadata("add_sub", as_json=True)
    assert meta == {
        "name": "add_sub",
        "versions": ["1"],
        "platform": "onnxruntime_onnx",
        "inputs": [
            {"name": "INPUT0", "datatype": "FP32", "shape": ["-1", "16"]},
            {"name": "INPUT1", "datatype": "FP32", "shape": ["-1", "16"]},
        ],
        "outputs": [
            {"name": "OUTPUT0", "datatype": "FP32", "shape": ["-1", "16"]},
            {"name": "OUTPUT1", "datatype": "FP32", "shape": ["-1", "16"]},
        ],
    }


@pytest.mark.parametrize(
    ("model", "version", "message"),
    [
        ("nonexistent", "", "Request for unknown model: 'nonexistent' is not found"),
        ("add_sub", "2", "Request for unknown model: 'add_sub' version 2 is not found"),
        ("broken_dims", "", "Request for unknown model: 'broken_dims' has no available versions"),
        ("broken_syntax", "", "Request for unknown model: 'broken_syntax' has no available versions"),
    ],
)
def test_metadata_and_config_of_unknown_models(
    grpc_client: grpcclient.InferenceServerClient, model: str, version: str, message: str
) -> None:
    _expect(_error(lambda: grpc_client.get_model_metadata(model, version)), grpc.StatusCode.NOT_FOUND, message)
    _expect(_error(lambda: grpc_client.get_model_config(model, version)), grpc.StatusCode.NOT_FOUND, message)


def test_metadata_version_must_be_a_number(grpc_client: grpcclient.InferenceServerClient) -> None:
    error = _error(lambda: grpc_client.get_model_metadata("add_sub", "abc"))
    _expect(error, grpc.StatusCode.INVALID_ARGUMENT, VERSION_ERROR.format("abc"))


# ------------------------------------------------------------------------------------------------------------
# configuration


@pytest.mark.parametrize("model", GOOD_MODELS)
def test_config_is_the_http_config(
    grpc_client: grpcclient.InferenceServerClient, client: httpclient.InferenceServerClient, model: str
) -> None:
    # HTTP prints every field with int64 as numbers; protobuf's JSON leaves defaults out and quotes int64. The
    # same message must come out of both once parsed with the schema tritonclient ships.
    over_http = json_format.ParseDict(client.get_model_config(model), triton_model_config.ModelConfig())
    over_grpc = grpc_client.get_model_config(model, as_json=True)["config"]
    assert over_grpc == json_format.MessageToDict(over_http, preserving_proto_field_name=True)


def test_config_message(grpc_client: grpcclient.InferenceServerClient) -> None:
    config = grpc_client.get_model_config("add_sub").config
    assert config.name == "add_sub"
    assert config.max_batch_size == 8
    assert [t.name for t in config.input] == ["INPUT0", "INPUT1"]
    assert config.input[0].data_type == triton_model_config.TYPE_FP32
    assert list(config.input[0].dims) == [16]
    assert config.instance_group[0].kind == triton_model_config.ModelInstanceGroup.KIND_CPU
    assert not config.model_transaction_policy.decoupled


# ------------------------------------------------------------------------------------------------------------
# repository


def test_repository_index_matches_http(stub: Any, client: httpclient.InferenceServerClient) -> None:
    # Empty fields are left out of both forms (HTTP leaves them out, protobuf's JSON does not print them).
    for ready in (False, True):
        reply = stub.RepositoryIndex(service_pb2.RepositoryIndexRequest(ready=ready))
        over_grpc = json_format.MessageToDict(reply, preserving_proto_field_name=True).get("models", [])
        over_http = [e for e in client.get_model_repository_index() if not ready or e.get("state") == "READY"]
        assert over_grpc == over_http


def test_repository_index_lists_every_model(grpc_client: grpcclient.InferenceServerClient) -> None:
    models = grpc_client.get_model_repository_index().models
    names = {m.name for m in models}
    assert set(GOOD_MODELS) <= names
    assert set(BROKEN_MODELS) <= names
    broken = next(m for m in models if m.name == "broken_dims")
    assert broken.state == "UNAVAILABLE"
    assert broken.reason


def test_load_and_unload_are_refused_outside_explicit_mode(grpc_client: grpcclient.InferenceServerClient) -> None:
    message = "explicit model load / unload is not allowed if polling is enabled"
    _expect(_error(lambda: grpc_client.load_model("add_sub")), grpc.StatusCode.UNAVAILABLE, message)
    _expect(_error(lambda: grpc_client.unload_model("add_sub")), grpc.StatusCode.UNAVAILABLE, message)


def test_named_repositories_are_unsupported(stub: Any) -> None:
    message = "'repository_name' specification is not supported"
    for call in (
        lambda: stub.RepositoryModelLoad(service_pb2.RepositoryModelLoadRequest(repository_name="x", model_name="m")),
        lambda: stub.RepositoryModelUnload(
            service_pb2.RepositoryModelUnloadRequest(repository_name="x", model_name="m")
        ),
        lambda: stub.RepositoryIndex(service_pb2.RepositoryIndexRequest(repository_name="x")),
    ):
        error = _rpc_error(call)
        assert error.code() == grpc.StatusCode.UNIMPLEMENTED
        assert error.details() == message


# ------------------------------------------------------------------------------------------------------------
# statistics, settings, shared memory


def test_statistics_of_every_model(grpc_client: grpcclient.InferenceServerClient) -> None:
    stats = grpc_client.get_inference_statistics().model_stats
    assert {s.name for s in stats} == set(GOOD_MODELS)
    two = [s.version for s in stats if s.name == "two_versions_all"]
    assert two == ["1", "2"]


def test_statistics_errors(grpc_client: grpcclient.InferenceServerClient) -> None:
    _expect(
        _error(lambda: grpc_client.get_inference_statistics("nonexistent")),
        grpc.StatusCode.INVALID_ARGUMENT,
        "requested model 'nonexistent' is not available",
    )
    _expect(
        _error(lambda: grpc_client.get_inference_statistics("add_sub", "2")),
        grpc.StatusCode.INVALID_ARGUMENT,
        "requested model version is not available for model 'add_sub'",
    )


def test_trace_settings_without_a_trace_file(grpc_client: grpcclient.InferenceServerClient) -> None:
    """Tracing is off without --trace-config (tests/e2e/test_trace.py tests tracing); no level can be set."""
    settings = grpc_client.get_trace_settings(as_json=True)["settings"]
    assert settings["trace_level"]["value"] == ["OFF"]
    assert settings["trace_file"]["value"] == [""]
    error = _error(lambda: grpc_client.update_trace_settings(settings={"trace_level": ["TIMESTAMPS"]}))
    assert error.status() == str(grpc.StatusCode.INVALID_ARGUMENT)
    assert error.message() == "Attempting to set invalid trace setting :trace file name is not given"


def test_shared_memory_is_off_unless_allowed(grpc_client: grpcclient.InferenceServerClient) -> None:
    error = _error(lambda: grpc_client.register_system_shared_memory("r", "/edged_nothing", 64))
    assert error.status() == str(grpc.StatusCode.UNIMPLEMENTED)
    assert "--allow-client-shm" in str(error.message())
    assert list(grpc_client.get_system_shared_memory_status().regions) == []
    assert list(grpc_client.get_cuda_shared_memory_status().regions) == []
