"""Triton's OpenVINO backend (``backend: "openvino"``) on the real daemon: the ONNX models of the test repository
converted by OpenVINO itself to its IR (``model.xml`` and ``model.bin``), and one read as ONNX, checked with
tritonclient against ONNX Runtime and against the model's arithmetic; the config filled from the model; batching;
OpenVINO properties from the parameters; and the models that cannot load, each UNAVAILABLE with its reason."""

from __future__ import annotations

import shutil
from collections.abc import Iterator
from pathlib import Path
from typing import Final

import modelgen
import numpy as np
import onnxruntime as ort
import openvino
import pytest
import tritonclient.grpc as grpcclient
import tritonclient.http as httpclient
from server import Server, run_server

ADD_SUB_IO: Final = """
max_batch_size: 8
input [{ name: "INPUT0", data_type: TYPE_FP32, dims: [ 16 ] }, { name: "INPUT1", data_type: TYPE_FP32, dims: [ 16 ] }]
output [
  { name: "OUTPUT0", data_type: TYPE_FP32, dims: [ 16 ] },
  { name: "OUTPUT1", data_type: TYPE_FP32, dims: [ 16 ] }
]
"""


def _ir(onnx_path: Path, version: Path) -> None:
    version.mkdir(parents=True)
    openvino.save_model(openvino.Core().read_model(str(onnx_path)), str(version / "model.xml"))


@pytest.fixture(scope="module")
def openvino_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Server]:
    root = tmp_path_factory.mktemp("openvino")
    sources = root / "sources"
    modelgen.write_add_sub(sources / "add_sub", max_batch_size=8, dims=16, dtype="FP32")
    modelgen.write_digits(sources / "digits")
    onnx_add_sub = sources / "add_sub" / "1" / "model.onnx"
    repository = root / "repository"
    # Inputs and outputs filled from the IR: a dynamic first dimension makes it batch.
    _ir(onnx_add_sub, repository / "add_sub_ir" / "1")
    (repository / "add_sub_ir" / "config.pbtxt").write_text('backend: "openvino"\n', encoding="utf-8")
    # A bigger graph (logistic regression on 8x8 images), its config given, with OpenVINO properties.
    _ir(sources / "digits" / "1" / "model.onnx", repository / "digits_ir" / "1")
    digits_config = (sources / "digits" / "config.pbtxt").read_text(encoding="utf-8")
    for line in ('platform: "onnxruntime_onnx"', 'name: "digits"', 'label_filename: "labels.txt"'):
        digits_config = digits_config.replace(line, "")
    (repository / "digits_ir" / "config.pbtxt").write_text(
        'backend: "openvino"\n'
        + digits_config
        + 'parameters [{ key: "NUM_STREAMS", value: { string_value: "1" } },'
        + ' { key: "PERFORMANCE_HINT", value: { string_value: "LATENCY" } },'
        + ' { key: "INFERENCE_NUM_THREADS", value: { string_value: "1" } },'
        # Any OpenVINO property passes: without this one, CPUs with bf16 units compute this graph in bf16.
        + ' { key: "INFERENCE_PRECISION_HINT", value: { string_value: "f32" } }]\n',
        encoding="utf-8",
    )
    # ONNX read by OpenVINO.
    (repository / "add_sub_onnx" / "1").mkdir(parents=True)
    shutil.copy(onnx_add_sub, repository / "add_sub_onnx" / "1" / "model.onnx")
    (repository / "add_sub_onnx" / "config.pbtxt").write_text(
        'backend: "openvino"\ndefault_model_filename: "model.onnx"\n' + ADD_SUB_IO + "dynamic_batching {}\n",
        encoding="utf-8",
    )
    # Models that cannot load.
    (repository / "not_ir" / "1").mkdir(parents=True)
    (repository / "not_ir" / "1" / "model.xml").write_text("<net>broken", encoding="utf-8")
    (repository / "not_ir" / "config.pbtxt").write_text('backend: "openvino"\n' + ADD_SUB_IO, encoding="utf-8")
    _ir(onnx_add_sub, repository / "bad_property" / "1")
    (repository / "bad_property" / "config.pbtxt").write_text(
        'backend: "openvino"\nparameters [{ key: "NO_SUCH_PROPERTY", value: { string_value: "1" } }]\n',
        encoding="utf-8",
    )
    with run_server([repository]) as running:
        running.digits_onnx = sources / "digits" / "1" / "model.onnx"  # type: ignore[attr-defined]
        yield running


def _add_sub(server: Server, model: str, rows: int) -> None:
    x = np.random.default_rng(rows).random((rows, 16), dtype=np.float32)
    y = np.ones((rows, 16), dtype=np.float32)
    client = httpclient.InferenceServerClient(server.http_url)
    inputs = [httpclient.InferInput("INPUT0", [rows, 16], "FP32"), httpclient.InferInput("INPUT1", [rows, 16], "FP32")]
    inputs[0].set_data_from_numpy(x)
    inputs[1].set_data_from_numpy(y)
    result = client.infer(model, inputs)
    client.close()
    np.testing.assert_allclose(result.as_numpy("OUTPUT0"), x + y, rtol=1e-6)
    np.testing.assert_allclose(result.as_numpy("OUTPUT1"), x - y, rtol=1e-6)


def test_an_ir_model_with_its_config_filled_from_the_model(openvino_server: Server) -> None:
    _add_sub(openvino_server, "add_sub_ir", 3)
    client = httpclient.InferenceServerClient(openvino_server.http_url)
    config = client.get_model_config("add_sub_ir")
    client.close()
    assert [tensor["name"] for tensor in config["input"]] == ["INPUT0", "INPUT1"]
    assert config["input"][0]["dims"] == [16] and config["max_batch_size"] > 0


def test_onnx_read_by_openvino(openvino_server: Server) -> None:
    _add_sub(openvino_server, "add_sub_onnx", 5)


def test_a_larger_graph_with_properties_matches_onnx_runtime(openvino_server: Server) -> None:
    images = np.random.default_rng(5).integers(0, 17, (4, 64)).astype(np.float32)
    client = grpcclient.InferenceServerClient(openvino_server.grpc_url)
    tensor = grpcclient.InferInput("image", [4, 64], "FP32")
    tensor.set_data_from_numpy(images)
    result = client.infer("digits_ir", [tensor]).as_numpy("probabilities")
    client.close()
    session = ort.InferenceSession(str(openvino_server.digits_onnx), providers=["CPUExecutionProvider"])  # type: ignore[attr-defined]
    (expected,) = session.run(["probabilities"], {"image": images})
    # OpenVINO's CPU kernels (softmax among them) differ from ONNX Runtime's in the last digits; in bf16 they would
    # differ by a few percent.
    np.testing.assert_allclose(result, expected, rtol=5e-3, atol=1e-5)
    np.testing.assert_array_equal(np.argmax(result, axis=1), np.argmax(expected, axis=1))


@pytest.mark.parametrize(
    ("model", "reason"),
    [
        ("not_ir", "OpenVINO cannot read model.xml"),
        ("bad_property", "OpenVINO cannot compile it for CPU"),
    ],
)
def test_a_model_that_cannot_load_says_why(openvino_server: Server, model: str, reason: str) -> None:
    client = httpclient.InferenceServerClient(openvino_server.http_url)
    index = {entry["name"]: entry for entry in client.get_model_repository_index()}
    client.close()
    assert index[model]["state"] == "UNAVAILABLE"
    assert reason in index[model]["reason"], index[model]["reason"]
    assert index["add_sub_ir"]["state"] == "READY"


def test_without_openvino_the_model_says_what_to_install(tmp_path: Path) -> None:
    shadow = tmp_path / "shadow" / "openvino"
    shadow.mkdir(parents=True)
    (shadow / "__init__.py").write_text("raise ImportError('openvino is not installed here')\n", encoding="utf-8")
    repository = tmp_path / "repository"
    modelgen.write_add_sub(tmp_path / "sources" / "add_sub", max_batch_size=8, dims=16, dtype="FP32")
    _ir(tmp_path / "sources" / "add_sub" / "1" / "model.onnx", repository / "add_sub_ir" / "1")
    (repository / "add_sub_ir" / "config.pbtxt").write_text('backend: "openvino"\n' + ADD_SUB_IO, encoding="utf-8")
    with run_server([repository], environment={"PYTHONPATH": str(shadow.parent)}) as server:
        client = httpclient.InferenceServerClient(server.http_url)
        (entry,) = client.get_model_repository_index()
        client.close()
    assert entry["state"] == "UNAVAILABLE"
    assert "the openvino backend needs OpenVINO, which is not installed: install edged[openvino]" in entry["reason"]
