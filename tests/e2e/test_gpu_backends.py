"""NVIDIA GPU paths on the real daemon: Triton's TensorRT backend (``tensorrt_plan``, ``model.plan``) and ONNX Runtime's
CUDA and TensorRT execution providers (``optimization.execution_accelerators``).

The engine is built by the test with TensorRT's own builder from the ONNX add_sub model, for the GPU it runs on, and
the answers are checked against numpy. Each GPU test says why it is skipped where it cannot run: no NVIDIA GPU (NVML
finds none), TensorRT not installed (``pip install edged[tensorrt]``), or an onnxruntime without the provider
(``onnxruntime-gpu``). What runs everywhere: a tensorrt_plan model without TensorRT names the extra to install.
"""

from __future__ import annotations

import importlib.util
import shutil
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any, Final

import modelgen
import numpy as np
import onnxruntime as ort
import pytest
import tritonclient.grpc as grpcclient
import tritonclient.http as httpclient
from server import Server, run_server

from edged.core.devices import nvml_gpus

GPUS: Final = nvml_gpus()
HAS_TENSORRT: Final = importlib.util.find_spec("tensorrt") is not None
NO_GPU: Final = "no NVIDIA GPU on this machine (NVML finds none)"
NO_TENSORRT: Final = "TensorRT is not installed (pip install edged[tensorrt], on a machine with a GPU)"
needs_gpu = pytest.mark.skipif(not GPUS, reason=NO_GPU)
needs_tensorrt = pytest.mark.skipif(not GPUS or not HAS_TENSORRT, reason=NO_GPU if not GPUS else NO_TENSORRT)

PLAN_CONFIG: Final = """
platform: "tensorrt_plan"
max_batch_size: 8
input [{ name: "INPUT0", data_type: TYPE_FP32, dims: [ 16 ] }, { name: "INPUT1", data_type: TYPE_FP32, dims: [ 16 ] }]
output [
  { name: "OUTPUT0", data_type: TYPE_FP32, dims: [ 16 ] },
  { name: "OUTPUT1", data_type: TYPE_FP32, dims: [ 16 ] }
]
dynamic_batching { max_queue_delay_microseconds: 20000 }
instance_group [{ count: 1, kind: KIND_GPU, gpus: [ 0 ] }]
"""


def _onnx_add_sub(folder: Path) -> Path:
    modelgen.write_add_sub(folder, max_batch_size=8, dims=16, dtype="FP32")
    return folder / "1" / "model.onnx"


def _build_plan(onnx_file: Path, plan: Path) -> None:
    """A TensorRT engine of the ONNX model for this machine's GPU 0, batching 1 to 8 rows."""
    import tensorrt as trt

    logger = trt.Logger(trt.Logger.WARNING)
    builder = trt.Builder(logger)
    network = builder.create_network(0)
    parser = trt.OnnxParser(network, logger)
    assert parser.parse(onnx_file.read_bytes()), [str(parser.get_error(i)) for i in range(parser.num_errors)]
    config = builder.create_builder_config()
    profile = builder.create_optimization_profile()
    for name in ("INPUT0", "INPUT1"):
        profile.set_shape(name, (1, 16), (4, 16), (8, 16))
    config.add_optimization_profile(profile)
    serialized = builder.build_serialized_network(network, config)
    assert serialized is not None
    plan.parent.mkdir(parents=True, exist_ok=True)
    plan.write_bytes(bytes(serialized))


def _inputs(module: Any, rows: int, seed: int) -> tuple[list[Any], np.ndarray[Any, Any], np.ndarray[Any, Any]]:
    rng = np.random.default_rng(seed)
    a, b = rng.random((rows, 16), dtype=np.float32), rng.random((rows, 16), dtype=np.float32)
    tensors = [module.InferInput("INPUT0", [rows, 16], "FP32"), module.InferInput("INPUT1", [rows, 16], "FP32")]
    tensors[0].set_data_from_numpy(a)
    tensors[1].set_data_from_numpy(b)
    return tensors, a, b


def _reason(server: Server, model: str) -> tuple[str, str]:
    client = httpclient.InferenceServerClient(server.http_url)
    index = {entry["name"]: entry for entry in client.get_model_repository_index()}
    client.close()
    return index[model]["state"], index[model].get("reason", "")


@pytest.fixture(scope="module")
def plan_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Server]:
    if not GPUS or not HAS_TENSORRT:
        pytest.skip(NO_GPU if not GPUS else NO_TENSORRT)
    root = tmp_path_factory.mktemp("plans")
    onnx_file = _onnx_add_sub(root / "onnx" / "add_sub")
    repository = root / "repository"
    plan = repository / "add_sub_plan" / "1" / "model.plan"
    _build_plan(onnx_file, plan)
    (repository / "add_sub_plan" / "config.pbtxt").write_text(PLAN_CONFIG, encoding="utf-8")
    # The config filled from the engine: names, types, dims and the batch the profile allows.
    (repository / "add_sub_auto" / "1").mkdir(parents=True)
    shutil.copy(plan, repository / "add_sub_auto" / "1" / "model.plan")
    (repository / "add_sub_auto" / "config.pbtxt").write_text('platform: "tensorrt_plan"\n', encoding="utf-8")
    # Models that cannot load, each with its reason.
    for name, config, content in (
        ("cpu_plan", PLAN_CONFIG.replace("KIND_GPU, gpus: [ 0 ]", "KIND_CPU"), plan.read_bytes()),
        ("corrupt_plan", PLAN_CONFIG, b"not an engine" * 100),
        ("wrong_name", PLAN_CONFIG.replace('"INPUT1"', '"INPUT9"'), plan.read_bytes()),
        ("too_big_batch", PLAN_CONFIG.replace("max_batch_size: 8", "max_batch_size: 64"), plan.read_bytes()),
    ):
        (repository / name / "1").mkdir(parents=True)
        (repository / name / "1" / "model.plan").write_bytes(content)
        (repository / name / "config.pbtxt").write_text(config, encoding="utf-8")
    with run_server([repository]) as server:
        yield server


@needs_tensorrt
def test_a_plan_answers_over_http_and_grpc_as_numpy_does(plan_server: Server) -> None:
    client = httpclient.InferenceServerClient(plan_server.http_url)
    inputs, a, b = _inputs(httpclient, 3, 0)
    result = client.infer("add_sub_plan", inputs)
    np.testing.assert_allclose(result.as_numpy("OUTPUT0"), a + b, rtol=1e-6)
    np.testing.assert_allclose(result.as_numpy("OUTPUT1"), a - b, rtol=1e-6)
    client.close()
    grpc = grpcclient.InferenceServerClient(plan_server.grpc_url)
    inputs, a, b = _inputs(grpcclient, 1, 1)
    result = grpc.infer("add_sub_plan", inputs)
    np.testing.assert_allclose(result.as_numpy("OUTPUT0"), a + b, rtol=1e-6)
    grpc.close()


@needs_tensorrt
def test_requests_batched_together_on_the_gpu_get_their_own_rows(plan_server: Server) -> None:
    def one(seed: int) -> bool:
        client = httpclient.InferenceServerClient(plan_server.http_url)
        inputs, a, b = _inputs(httpclient, 1, seed)
        result = client.infer("add_sub_plan", inputs)
        client.close()
        return bool(np.allclose(result.as_numpy("OUTPUT1"), a - b))

    client = httpclient.InferenceServerClient(plan_server.http_url)
    before = client.get_inference_statistics("add_sub_plan")["model_stats"][0]
    with ThreadPoolExecutor(8) as pool:
        assert all(pool.map(one, range(8)))
    after = client.get_inference_statistics("add_sub_plan")["model_stats"][0]
    client.close()
    assert after["inference_count"] - before["inference_count"] == 8
    assert after["execution_count"] - before["execution_count"] < 8  # some were batched


@needs_tensorrt
def test_the_config_is_filled_from_the_engine(plan_server: Server) -> None:
    client = httpclient.InferenceServerClient(plan_server.http_url)
    config = client.get_model_config("add_sub_auto")
    # The profile allows 8; the default max batch size (4, as in Triton) caps what auto-complete sets.
    assert config["max_batch_size"] == 4
    assert [(t["name"], t["data_type"], t["dims"]) for t in config["input"]] == [
        ("INPUT0", "TYPE_FP32", ["16"]),
        ("INPUT1", "TYPE_FP32", ["16"]),
    ]
    assert config["instance_group"][0]["kind"] == "KIND_GPU"
    inputs, a, b = _inputs(httpclient, 2, 2)
    np.testing.assert_allclose(client.infer("add_sub_auto", inputs).as_numpy("OUTPUT0"), a + b, rtol=1e-6)
    client.close()


@needs_tensorrt
@pytest.mark.parametrize(
    ("model", "reason"),
    [
        ("cpu_plan", "a TensorRT engine runs on an NVIDIA GPU, not KIND_CPU"),
        ("corrupt_plan", "model.plan is not a TensorRT engine for this GPU"),
        ("wrong_name", "unable to find input 'INPUT9' in the engine (its inputs: INPUT0, INPUT1)"),
        ("too_big_batch", "max_batch_size 64 is more than the engine's optimization profile 0 allows (8"),
    ],
)
def test_a_plan_that_cannot_load_says_why(plan_server: Server, model: str, reason: str) -> None:
    state, why = _reason(plan_server, model)
    assert state == "UNAVAILABLE"
    assert reason in why, why
    assert _reason(plan_server, "add_sub_plan")[0] == "READY"


@needs_gpu
@pytest.mark.parametrize(
    ("accelerator", "provider"), [("cuda", "CUDAExecutionProvider"), ("tensorrt", "TensorrtExecutionProvider")]
)
def test_onnx_runtime_gpu_execution_accelerators(tmp_path: Path, accelerator: str, provider: str) -> None:
    if provider not in ort.get_available_providers():
        pytest.skip(f"this onnxruntime has no {provider} (onnxruntime-gpu has it)")
    folder = tmp_path / "repository" / "add_sub_gpu"
    _onnx_add_sub(folder)
    config = folder / "config.pbtxt"
    config.write_text(
        config.read_text(encoding="utf-8")
        + "instance_group [{ kind: KIND_GPU, gpus: [ 0 ] }]\n"
        + "optimization { execution_accelerators { gpu_execution_accelerator: "
        + f'[ {{ name: "{accelerator}" }} ] }} }}\n',
        encoding="utf-8",
    )
    with run_server([tmp_path / "repository"]) as server:
        client = httpclient.InferenceServerClient(server.http_url)
        inputs, a, b = _inputs(httpclient, 4, 3)
        result = client.infer("add_sub_gpu", inputs)
        client.close()
    np.testing.assert_allclose(result.as_numpy("OUTPUT0"), a + b, rtol=1e-6)
    np.testing.assert_allclose(result.as_numpy("OUTPUT1"), a - b, rtol=1e-6)


def test_without_tensorrt_a_plan_says_what_to_install(tmp_path: Path) -> None:
    shadow = tmp_path / "shadow" / "tensorrt"
    shadow.mkdir(parents=True)
    (shadow / "__init__.py").write_text("raise ImportError('tensorrt is not installed here')\n", encoding="utf-8")
    repository = tmp_path / "repository"
    (repository / "add_sub_plan" / "1").mkdir(parents=True)
    (repository / "add_sub_plan" / "1" / "model.plan").write_bytes(b"\0" * 64)
    (repository / "add_sub_plan" / "config.pbtxt").write_text(PLAN_CONFIG, encoding="utf-8")
    with run_server([repository], environment={"PYTHONPATH": str(shadow.parent)}) as server:
        state, reason = _reason(server, "add_sub_plan")
    assert state == "UNAVAILABLE"
    # On a machine without a GPU the KIND_GPU group could not be placed either: TensorRT's absence is said first.
    assert "the tensorrt backend needs TensorRT, which is not installed: install edged[tensorrt]" in reason, reason
