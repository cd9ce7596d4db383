"""Third-party backends: a Python package that registers a Backend class under the ``edged.backends`` entry point
group serves the models whose config.pbtxt names it. The example package in packaging/backend-example is installed
with pip for the daemon (not into the test environment), and driven with tritonclient over HTTP and gRPC; a name
nothing provides, and a package whose backend fails to import, leave their models UNAVAILABLE with the reason while
the daemon serves the rest."""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any, Final

import modelgen
import numpy as np
import pytest
import tritonclient.grpc as grpcclient
import tritonclient.http as httpclient
from server import REPO_ROOT, Server, request, run_server

EXAMPLE: Final = REPO_ROOT / "packaging" / "backend-example"
SCALE_CONFIG: Final = """
backend: "example_scale"
default_model_filename: "model.json"
max_batch_size: 8
input [{ name: "INPUT0", data_type: TYPE_FP32, dims: [ -1 ] }]
output [{ name: "OUTPUT0", data_type: TYPE_FP32, dims: [ -1 ] }]
"""
# A package whose entry points name a module that is not there: one under a new name, one under a built-in's.
BROKEN_ENTRY_POINTS: Final = (
    "[edged.backends]\nbroken = edged_backend_gone:Backend\nonnxruntime = edged_backend_gone:Backend\n"
)


def _model(repository: Path, name: str, config: str, version_files: dict[str, str]) -> None:
    version = repository / name / "1"
    version.mkdir(parents=True)
    (repository / name / "config.pbtxt").write_text(config, encoding="utf-8")
    for file_name, text in version_files.items():
        (version / file_name).write_text(text, encoding="utf-8")


@pytest.fixture(scope="module")
def plugin_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Server]:
    root = tmp_path_factory.mktemp("backend-plugins")
    site = root / "site"
    # Built from a copy: a build writes its own folders beside the sources, never into the checkout.
    source = shutil.copytree(EXAMPLE, root / "source")
    pip = [sys.executable, "-m", "pip", "install", "--quiet", "--no-deps", "--no-build-isolation"]
    subprocess.run([*pip, "--target", str(site), str(source)], check=True, capture_output=True, timeout=300)
    info = site / "edged_backend_gone-1.0.dist-info"
    info.mkdir()
    (info / "METADATA").write_text("Metadata-Version: 2.1\nName: edged-backend-gone\nVersion: 1.0\n", encoding="utf-8")
    (info / "entry_points.txt").write_text(BROKEN_ENTRY_POINTS, encoding="utf-8")
    repository = root / "repository"
    _model(repository, "scaled", SCALE_CONFIG + "dynamic_batching {}\n", {"model.json": json.dumps({"scale": 2.5})})
    _model(
        repository,
        "scaled_by_parameter",
        SCALE_CONFIG + 'parameters [{ key: "scale", value: { string_value: "-1" } }]\n',
        {"model.json": json.dumps({"scale": 2.5})},
    )
    _model(repository, "scaled_by_default", SCALE_CONFIG, {})
    _model(repository, "nobody_provides", SCALE_CONFIG.replace("example_scale", "nobody"), {"model.json": "{}"})
    _model(repository, "gone", SCALE_CONFIG.replace("example_scale", "broken"), {"model.json": "{}"})
    modelgen.write_add_sub(repository / "add_sub", max_batch_size=8, dims=16, dtype="FP32")
    with run_server(
        [repository], "--backend-config=example_scale,default-scale=3", environment={"PYTHONPATH": str(site)}
    ) as running:
        yield running


def _scale_http(server: Server, model: str, values: np.ndarray[Any, Any]) -> np.ndarray[Any, Any]:
    client = httpclient.InferenceServerClient(server.http_url)
    tensor = httpclient.InferInput("INPUT0", list(values.shape), "FP32")
    tensor.set_data_from_numpy(values)
    result: np.ndarray[Any, Any] | None = client.infer(model, [tensor]).as_numpy("OUTPUT0")
    client.close()
    assert result is not None
    return result


def test_a_plugin_backend_serves_its_models_over_http_and_grpc(plugin_server: Server) -> None:
    values = np.arange(12, dtype=np.float32).reshape(3, 4)
    np.testing.assert_array_equal(_scale_http(plugin_server, "scaled", values), values * 2.5)
    client = grpcclient.InferenceServerClient(plugin_server.grpc_url)
    tensor = grpcclient.InferInput("INPUT0", [3, 4], "FP32")
    tensor.set_data_from_numpy(values)
    np.testing.assert_array_equal(client.infer("scaled", [tensor]).as_numpy("OUTPUT0"), values * 2.5)
    stats = client.get_inference_statistics("scaled", as_json=True)
    assert int(stats["model_stats"][0]["inference_count"]) >= 2
    client.close()


def test_its_settings_and_the_models_parameters(plugin_server: Server) -> None:
    values = np.ones((1, 4), dtype=np.float32)
    np.testing.assert_array_equal(_scale_http(plugin_server, "scaled_by_parameter", values), -values)
    # No model.json: the factor of --backend-config=example_scale,default-scale=3.
    np.testing.assert_array_equal(_scale_http(plugin_server, "scaled_by_default", values), 3 * values)


def test_requests_are_validated_before_the_backend_sees_them(plugin_server: Server) -> None:
    body = {"inputs": [{"name": "INPUT0", "shape": [1, 2], "datatype": "INT32", "data": [1, 2]}]}
    reply = request(plugin_server.http_url, "POST", "/v2/models/scaled/infer", json.dumps(body))
    assert reply.status == 400, reply
    assert "INT32" in reply.error() and "FP32" in reply.error()


def test_a_backend_nobody_provides_or_that_fails_to_import_leaves_its_model_unavailable(
    plugin_server: Server,
) -> None:
    client = httpclient.InferenceServerClient(plugin_server.http_url)
    index = {model["name"]: model for model in client.get_model_repository_index()}
    assert index["nobody_provides"]["state"] == "UNAVAILABLE"
    reason = index["nobody_provides"]["reason"]
    assert "unable to find backend 'nobody'" in reason and "edged.backends" in reason, reason
    assert index["gone"]["state"] == "UNAVAILABLE"
    assert "the 'broken' backend" in index["gone"]["reason"], index["gone"]["reason"]
    assert "edged-backend-gone" in index["gone"]["reason"], index["gone"]["reason"]
    # A package cannot replace a backend edged provides: the ONNX model is served by edged's own.
    assert index["add_sub"]["state"] == "READY"
    values = np.ones((1, 16), dtype=np.float32)
    inputs = [httpclient.InferInput(name, [1, 16], "FP32") for name in ("INPUT0", "INPUT1")]
    for tensor in inputs:
        tensor.set_data_from_numpy(values)
    np.testing.assert_array_equal(client.infer("add_sub", inputs).as_numpy("OUTPUT0"), 2 * values)
    client.close()
