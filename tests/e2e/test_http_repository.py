"""The repository index and how models that are broken, unversioned or multi-versioned are served."""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import tritonclient.http as httpclient
from conftest import BROKEN_SYNTAX_POSITION, GOOD_MODELS
from server import Server, assert_still_serving, request, run_server
from tritonclient.utils import InferenceServerException


def _index(client: httpclient.InferenceServerClient) -> list[dict[str, Any]]:
    index = client.get_model_repository_index()
    assert isinstance(index, list)
    return index


def _entries(index: list[dict[str, Any]], name: str) -> list[dict[str, Any]]:
    return [entry for entry in index if entry["name"] == name]


def _only_entry(index: list[dict[str, Any]], name: str) -> dict[str, Any]:
    entries = _entries(index, name)
    assert len(entries) == 1, f"expected one index entry for {name}, got {entries}"
    return entries[0]


def test_ready_models_are_listed_without_reason(client: httpclient.InferenceServerClient) -> None:
    index = _index(client)
    for name in ("add_sub", "add_sub_nobatch", "add_sub_int32", "digits", "identity_fp32", "auto_complete"):
        # Triton prints exactly these three members for a READY version: no empty "reason".
        assert _only_entry(index, name) == {"name": name, "version": "1", "state": "READY"}


def test_every_good_model_is_ready(client: httpclient.InferenceServerClient) -> None:
    index = _index(client)
    for name in GOOD_MODELS:
        entries = _entries(index, name)
        assert entries, f"{name} missing from the index"
        assert all(entry["state"] == "READY" for entry in entries), entries


def test_index_is_sorted_by_name_then_version(client: httpclient.InferenceServerClient) -> None:
    index = _index(client)
    keys = [(entry["name"], int(entry.get("version") or 0)) for entry in index]
    assert keys == sorted(keys)


def test_index_entries_use_the_protocol_types(client: httpclient.InferenceServerClient) -> None:
    for entry in _index(client):
        assert set(entry) <= {"name", "version", "state", "reason"}, entry
        assert all(isinstance(value, str) for value in entry.values()), entry
        if "state" in entry:
            assert entry["state"] in {"UNKNOWN", "READY", "UNAVAILABLE", "LOADING", "UNLOADING"}


def test_syntax_error_is_unavailable_with_line_and_column(client: httpclient.InferenceServerClient) -> None:
    # Deliberately more than Triton, which lists such a model by name only.
    entry = _only_entry(_index(client), "broken_syntax")
    assert entry["state"] == "UNAVAILABLE"
    assert "version" not in entry
    assert re.search(rf"config\.pbtxt:{BROKEN_SYNTAX_POSITION}: ", entry["reason"]), entry["reason"]
    assert "eight" in entry["reason"], entry["reason"]


def test_invalid_dims_is_unavailable_with_tritons_reason(client: httpclient.InferenceServerClient) -> None:
    entry = _only_entry(_index(client), "broken_dims")
    # Triton validates the I/O while loading version 1, so the failure is reported against that version.
    assert entry["name"] == "broken_dims"
    assert entry["state"] == "UNAVAILABLE"
    assert entry.get("version") == "1", entry
    assert (
        "model input 'INPUT0' dimension must be integer >= 1, or -1 to indicate a variable-size dimension"
        " for broken_dims" in entry["reason"]
    ), entry["reason"]


def test_config_dtype_disagreeing_with_onnx_is_unavailable(client: httpclient.InferenceServerClient) -> None:
    entry = _only_entry(_index(client), "broken_dtype")
    assert entry["state"] == "UNAVAILABLE"
    assert entry.get("version") == "1", entry
    assert (
        "unable to load model 'broken_dtype', configuration expects datatype TYPE_INT32 for input 'INPUT0',"
        " model provides TYPE_FP32" in entry["reason"]
    ), entry["reason"]


def test_model_without_versions_is_listed_with_its_reason(client: httpclient.InferenceServerClient) -> None:
    # Triton leaves such a model out of its index altogether; edged lists it so an operator sees why it is not
    # served.
    (entry,) = _entries(_index(client), "no_version")
    assert entry["state"] == "UNAVAILABLE"
    assert "at least one version must be available under the version policy of model 'no_version'" in entry["reason"]
    assert "version" not in entry


def test_reasons_do_not_reveal_server_paths(client: httpclient.InferenceServerClient, test_repository: Path) -> None:
    reasons = [entry.get("reason", "") for entry in _index(client)]
    assert any(reasons)
    assert not [reason for reason in reasons if str(test_repository) in reason]


def test_ready_filter(server: Server) -> None:
    reply = request(server.http_url, "POST", "/v2/repository/index", '{"ready":true}')
    assert reply.status == 200
    ready = reply.json()
    assert ready, "no READY model listed"
    assert all(entry["state"] == "READY" for entry in ready)
    names = {entry["name"] for entry in ready}
    assert set(GOOD_MODELS) <= names
    assert not names & {"broken_syntax", "broken_dims", "broken_dtype", "no_version"}

    everything = request(server.http_url, "POST", "/v2/repository/index", '{"ready":false}').json()
    assert len(everything) > len(ready)


@pytest.mark.parametrize("body", [b"", b"{}", b'""'])
def test_index_accepts_the_bodies_clients_send(server: Server, body: bytes) -> None:
    reply = request(server.http_url, "POST", "/v2/repository/index", body)
    assert reply.status == 200, reply
    assert reply.header("content-type") == "application/json"
    assert {entry["name"] for entry in reply.json()} >= set(GOOD_MODELS)


def test_index_ready_must_be_a_bool(server: Server, client: httpclient.InferenceServerClient) -> None:
    reply = request(server.http_url, "POST", "/v2/repository/index", '{"ready":"x"}')
    assert reply.status == 400
    assert reply.error() == "Invalid value for 'ready': expected a boolean"
    # Nested past any reasonable depth: refused without walking it, and the daemon serves on. As Triton, a 'ready'
    # that nests is first of all not a boolean; another field that nests too deep is named as such.
    deep = '{"ready":' + "[" * 250_000 + "true" + "]" * 250_000 + "}"
    reply = request(server.http_url, "POST", "/v2/repository/index", deep)
    assert reply.status == 400
    assert reply.error() == "Invalid value for 'ready': expected a boolean"
    deep = '{"other":' + "[" * 250_000 + "true" + "]" * 250_000 + "}"
    reply = request(server.http_url, "POST", "/v2/repository/index", deep)
    assert reply.status == 400
    assert reply.error() == "JSON nesting depth exceeds maximum allowed limit (100)"
    assert_still_serving(client)


def test_index_needs_post(server: Server) -> None:
    reply = request(server.http_url, "GET", "/v2/repository/index")
    assert reply.status == 405
    assert reply.error() == "Method Not Allowed"


def test_load_and_unload_are_refused_outside_explicit_mode(server: Server) -> None:
    for action in ("load", "unload"):
        reply = request(server.http_url, "POST", f"/v2/repository/models/add_sub/{action}", b"")
        assert reply.status == 503, reply
        assert reply.error() == "explicit model load / unload is not allowed if polling is enabled"


# ------------------------------------------------------------------------------------------------------------
# requests to models that did not load


@pytest.mark.parametrize(
    ("model", "message"),
    [
        ("broken_dims", "Request for unknown model: 'broken_dims' has no available versions"),
        ("broken_dtype", "Request for unknown model: 'broken_dtype' has no available versions"),
        ("no_version", "Request for unknown model: 'no_version' has no available versions"),
    ],
)
def test_unavailable_models_have_no_metadata(
    client: httpclient.InferenceServerClient, model: str, message: str
) -> None:
    assert not client.is_model_ready(model)
    for call in (client.get_model_metadata, client.get_model_config):
        with pytest.raises(InferenceServerException) as caught:
            call(model)
        assert caught.value.status() == "404"
        assert caught.value.message() == message


def test_syntax_broken_model_is_not_found(client: httpclient.InferenceServerClient) -> None:
    assert not client.is_model_ready("broken_syntax")
    with pytest.raises(InferenceServerException) as caught:
        client.get_model_metadata("broken_syntax")
    assert caught.value.status() == "404"
    assert caught.value.message().startswith("Request for unknown model: 'broken_syntax'")


def test_failed_version_is_not_at_ready_state(client: httpclient.InferenceServerClient) -> None:
    with pytest.raises(InferenceServerException) as caught:
        client.get_model_metadata("broken_dtype", "1")
    assert caught.value.status() == "503"
    assert caught.value.message() == "Request for unknown model: 'broken_dtype' version 1 is not at ready state"


@pytest.mark.parametrize("model", ["broken_syntax", "broken_dims", "broken_dtype", "no_version"])
def test_inference_on_broken_models_is_404(
    server: Server, client: httpclient.InferenceServerClient, model: str
) -> None:
    tensor = httpclient.InferInput("INPUT0", [1, 16], "FP32")
    tensor.set_data_from_numpy(np.zeros((1, 16), dtype=np.float32))
    with pytest.raises(InferenceServerException) as caught:
        client.infer(model, [tensor])
    assert caught.value.status() == "404"
    assert caught.value.message().startswith(f"Request for unknown model: '{model}'")
    assert_still_serving(client)


# ------------------------------------------------------------------------------------------------------------
# version folders and policies


def _scale(client: httpclient.InferenceServerClient, model: str, version: str = "") -> np.ndarray[Any, Any]:
    data = np.array([[1.0, -2.0, 3.5]], dtype=np.float32)
    tensor = httpclient.InferInput("INPUT0", list(data.shape), "FP32")
    tensor.set_data_from_numpy(data)
    result = client.infer(model, [tensor], model_version=version)
    out = result.as_numpy("OUTPUT0")
    assert out is not None
    return np.asarray(out / data)


def test_non_numeric_and_zero_version_folders_are_ignored(client: httpclient.InferenceServerClient) -> None:
    assert client.get_model_metadata("odd_versions")["versions"] == ["1"]
    assert [entry.get("version") for entry in _entries(_index(client), "odd_versions")] == ["1"]
    assert client.is_model_ready("odd_versions")
    assert not client.is_model_ready("odd_versions", "0")
    with pytest.raises(InferenceServerException) as caught:
        client.get_model_metadata("odd_versions", "0")
    assert caught.value.status() == "404"
    assert caught.value.message() == "Request for unknown model: 'odd_versions' version 0 is not found"


def test_version_policy_all_serves_every_version(client: httpclient.InferenceServerClient) -> None:
    index = _entries(_index(client), "two_versions_all")
    assert index == [
        {"name": "two_versions_all", "version": "1", "state": "READY"},
        {"name": "two_versions_all", "version": "2", "state": "READY"},
    ]
    assert client.get_model_metadata("two_versions_all")["versions"] == ["1", "2"]
    assert client.get_model_metadata("two_versions_all", "1")["versions"] == ["1"]
    assert client.is_model_ready("two_versions_all", "1")
    assert client.is_model_ready("two_versions_all", "2")
    np.testing.assert_array_equal(_scale(client, "two_versions_all", "1"), 1.0)
    np.testing.assert_array_equal(_scale(client, "two_versions_all", "2"), 2.0)
    # With no version given, the highest one answers.
    np.testing.assert_array_equal(_scale(client, "two_versions_all"), 2.0)
    config = client.get_model_config("two_versions_all")
    assert config["version_policy"] == {"all": {}}


def test_default_version_policy_serves_only_the_latest(client: httpclient.InferenceServerClient) -> None:
    assert client.get_model_metadata("two_versions_latest")["versions"] == ["2"]
    # Version 1 is never loaded, so the index has nothing to say about it.
    assert _entries(_index(client), "two_versions_latest") == [
        {"name": "two_versions_latest", "version": "2", "state": "READY"}
    ]
    assert client.get_model_config("two_versions_latest")["version_policy"] == {"latest": {"num_versions": 1}}
    assert not client.is_model_ready("two_versions_latest", "1")
    np.testing.assert_array_equal(_scale(client, "two_versions_latest"), 2.0)
    with pytest.raises(InferenceServerException) as caught:
        _scale(client, "two_versions_latest", "1")
    assert caught.value.status() == "404"
    assert caught.value.message() == "Request for unknown model: 'two_versions_latest' version 1 is not found"


def test_unreadable_onnx_file_is_unavailable_with_onnxruntime_reason(client: httpclient.InferenceServerClient) -> None:
    (entry,) = _entries(_index(client), "broken_onnx")
    assert entry["state"] == "UNAVAILABLE"
    assert entry["version"] == "1"
    assert entry["reason"].startswith("Invalid argument: onnx runtime error loading model 'broken_onnx'")
    # onnxruntime names the file by its absolute path; the reason names it within the model folder.
    assert "1/model.onnx" in entry["reason"]
    assert "/tmp" not in entry["reason"] and "pytest" not in entry["reason"]


@pytest.mark.parametrize("auto_complete", [True, False])
def test_a_model_without_versions_is_told_what_is_wrong_with_its_config_first(
    tmp_path: Path, auto_complete: bool
) -> None:
    """As Triton checks a config when it scans the repository: no backend to be found is said before the missing
    version, and so, when configs are not completed from the model, is anything else wrong with it."""
    repo = tmp_path / "repo"
    (repo / "unknown_backend").mkdir(parents=True)
    (repo / "unknown_backend" / "config.pbtxt").write_text('name: "unknown_backend"\n', encoding="utf-8")
    (repo / "bad_batch").mkdir()
    (repo / "bad_batch" / "config.pbtxt").write_text(
        'name: "bad_batch"\nplatform: "onnxruntime_onnx"\nmax_batch_size: -1\n'
        'input [ { name: "IN" data_type: TYPE_FP32 dims: [ 4 ] } ]\n'
        'output [ { name: "OUT" data_type: TYPE_FP32 dims: [ 4 ] } ]\n',
        encoding="utf-8",
    )
    # A model folder without a config.pbtxt: completed from the model, or (auto-complete off) named in Triton's words.
    (repo / "no_config" / "1").mkdir(parents=True)
    flags = ["--strict-readiness=false", f"--state-dir={tmp_path / 'state'}"]
    if not auto_complete:
        flags.append("--disable-auto-complete-config")
    with run_server([repo], *flags) as server:
        reasons = {e["name"]: e["reason"] for e in _index(httpclient.InferenceServerClient(server.http_url))}
        log = server.log()
    if not auto_complete:
        missing = "failed to open text file for read no_config/config.pbtxt: No such file or directory"
        assert missing in reasons["no_config"] and missing in log, reasons["no_config"]
    assert reasons["unknown_backend"] == (
        "Invalid argument: Invalid model name: Could not determine backend for model 'unknown_backend' with no "
        "backend in model configuration. Expected model name of the form 'model.<backend_name>'."
    )
    no_version = "at least one version must be available under the version policy of model 'bad_batch'"
    assert reasons["bad_batch"] == "Invalid argument: " + (
        no_version if auto_complete else "'max_batch_size' must be non-negative value for bad_batch"
    )


def test_a_platform_or_runtime_that_cannot_be_is_named_before_the_backend_is_looked_for(tmp_path: Path) -> None:
    """As Triton: a platform the model file's backend disagrees with, and a backend library that is not there or
    climbs out of its folder, are refused with Triton's words, whether or not that backend exists."""
    repo = tmp_path / "repo"
    io = (
        'input [ { name: "IN" data_type: TYPE_FP32 dims: [ 4 ] } ]\n'
        'output [ { name: "OUT" data_type: TYPE_FP32 dims: [ 4 ] } ]\n'
    )
    models = {
        "bad_pair": 'platform: "onnxruntim"\ndefault_model_filename: "model.onnx"\n',
        "missing_library": 'backend: "python"\nruntime: "__invalid_runtime__"\n',
        "escaping_library": 'backend: "identity"\nruntime: "../dummy_runtime/libtriton_identity.so"\n',
    }
    for name, head in models.items():
        (repo / name / "1").mkdir(parents=True)
        (repo / name / "1" / "model.py").write_text("", encoding="utf-8")
        (repo / name / "config.pbtxt").write_text(f'name: "{name}"\n{head}max_batch_size: 0\n{io}', encoding="utf-8")
    with run_server([repo], "--strict-readiness=false", f"--state-dir={tmp_path / 'state'}") as server:
        index = _index(httpclient.InferenceServerClient(server.http_url))
    reasons = {e["name"]: e["reason"] for e in index}
    assert reasons["bad_pair"].endswith("unexpected 'platform' and 'backend' pair, got:onnxruntim, onnxruntime")
    assert reasons["missing_library"].endswith(
        "unable to find backend library '__invalid_runtime__' for model 'missing_library'"
    )
    assert (
        "backend library name '../dummy_runtime/libtriton_identity.so' escapes backend directory"
        in (reasons["escaping_library"])
    )
