"""Triton's PyTorch backend (``pytorch_libtorch``, TorchScript ``model.pt``) on the real daemon: modules scripted by
the tests with PyTorch, served and checked with tritonclient against the module's own output; Triton's naming of
inputs and outputs (``<name>__<index>`` or forward's argument names), batching along dimension 0, the backend's
parameters, and the models that cannot load, each UNAVAILABLE with its reason."""

from __future__ import annotations

import asyncio
from collections.abc import Iterator
from pathlib import Path
from typing import Any, Final

import numpy as np
import pytest
import torch
import tritonclient.grpc as grpcclient
import tritonclient.grpc.aio as aiogrpcclient
import tritonclient.http as httpclient
from server import Server, run_server

# TorchScript compiles from source: the modules live in this file, which the scripting reads.


class AddSub(torch.nn.Module):
    def forward(self, x: torch.Tensor, y: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        return x + y, x - y


class Weighted(torch.nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.linear = torch.nn.Linear(8, 3)

    def forward(self, features: torch.Tensor, bias: torch.Tensor) -> torch.Tensor:
        return torch.softmax(self.linear(features) + bias, dim=1)


ADD_SUB_CONFIG: Final = """
platform: "pytorch_libtorch"
max_batch_size: 8
input [{ name: "INPUT__0", data_type: TYPE_FP32, dims: [ 4 ] }, { name: "INPUT__1", data_type: TYPE_FP32, dims: [ 4 ] }]
output [
  { name: "OUTPUT__0", data_type: TYPE_FP32, dims: [ 4 ] },
  { name: "OUTPUT__1", data_type: TYPE_FP32, dims: [ 4 ] }
]
dynamic_batching { max_queue_delay_microseconds: 20000 }
"""
# Inputs by forward's argument names, in another order than forward's; outputs in the config's order.
WEIGHTED_CONFIG: Final = """
backend: "pytorch"
max_batch_size: 4
input [{ name: "bias", data_type: TYPE_FP32, dims: [ 3 ] }, { name: "features", data_type: TYPE_FP32, dims: [ 8 ] }]
output [{ name: "probabilities", data_type: TYPE_FP32, dims: [ 3 ] }]
parameters [
  { key: "INFERENCE_MODE", value: { string_value: "false" } },
  { key: "DISABLE_OPTIMIZED_EXECUTION", value: { string_value: "true" } },
  { key: "INTRA_OP_THREAD_COUNT", value: { string_value: "1" } },
  { key: "ENABLE_NVFUSER", value: { string_value: "true" } }
]
"""


def _model(repository: Path, name: str, config: str, module: torch.nn.Module | None) -> None:
    version = repository / name / "1"
    version.mkdir(parents=True)
    (repository / name / "config.pbtxt").write_text(config, encoding="utf-8")
    if module is not None:
        scripted: Any = torch.jit.script(module)
        scripted.save(str(version / "model.pt"))


@pytest.fixture(scope="module")
def weighted() -> Weighted:
    torch.manual_seed(3)
    return Weighted().eval()


@pytest.fixture(scope="module")
def torch_server(tmp_path_factory: pytest.TempPathFactory, weighted: Weighted) -> Iterator[Server]:
    repository = tmp_path_factory.mktemp("pytorch") / "repository"
    _model(repository, "add_sub_torch", ADD_SUB_CONFIG, AddSub())
    _model(repository, "weighted", WEIGHTED_CONFIG, weighted)
    # Names that are neither forward's nor indexed: the config's order is forward's.
    in_config_order = WEIGHTED_CONFIG.replace(
        'name: "bias", data_type: TYPE_FP32, dims: [ 3 ]', 'name: "a", data_type: TYPE_FP32, dims: [ 8 ]'
    )
    in_config_order = in_config_order.replace(
        'name: "features", data_type: TYPE_FP32, dims: [ 8 ]', 'name: "b", data_type: TYPE_FP32, dims: [ 3 ]'
    )
    _model(repository, "config_order", in_config_order, weighted)
    one_input = WEIGHTED_CONFIG.replace('{ name: "bias", data_type: TYPE_FP32, dims: [ 3 ] }, ', "")
    _model(repository, "one_input", one_input, weighted)
    _model(repository, "no_model_file", ADD_SUB_CONFIG, None)
    (repository / "no_model_file" / "1" / "model.pt").write_bytes(b"not a TorchScript archive")
    _model(repository, "bad_parameter", ADD_SUB_CONFIG + 'parameters [{ key: "FAST", value: { string_value: "1" } }]',
           AddSub())  # fmt: skip
    with run_server([repository]) as running:
        yield running


def test_indexed_names_over_http_and_grpc(torch_server: Server) -> None:
    x = np.arange(8, dtype=np.float32).reshape(2, 4)
    y = np.ones((2, 4), dtype=np.float32)
    client = httpclient.InferenceServerClient(torch_server.http_url)
    inputs = [httpclient.InferInput(f"INPUT__{i}", [2, 4], "FP32") for i in range(2)]
    inputs[0].set_data_from_numpy(x)
    inputs[1].set_data_from_numpy(y)
    result = client.infer("add_sub_torch", inputs)
    np.testing.assert_array_equal(result.as_numpy("OUTPUT__0"), x + y)
    np.testing.assert_array_equal(result.as_numpy("OUTPUT__1"), x - y)
    client.close()
    grpc = grpcclient.InferenceServerClient(torch_server.grpc_url)
    grpc_inputs = [grpcclient.InferInput(f"INPUT__{i}", [2, 4], "FP32") for i in range(2)]
    grpc_inputs[0].set_data_from_numpy(x)
    grpc_inputs[1].set_data_from_numpy(y)
    np.testing.assert_array_equal(grpc.infer("add_sub_torch", grpc_inputs).as_numpy("OUTPUT__1"), x - y)
    grpc.close()


def test_requests_batched_together_get_their_own_rows(torch_server: Server) -> None:
    async def one(client: aiogrpcclient.InferenceServerClient, k: int) -> np.ndarray[Any, Any]:
        inputs = [aiogrpcclient.InferInput(f"INPUT__{i}", [1, 4], "FP32") for i in range(2)]
        inputs[0].set_data_from_numpy(np.full((1, 4), k, dtype=np.float32))
        inputs[1].set_data_from_numpy(np.full((1, 4), 100 * k, dtype=np.float32))
        result: np.ndarray[Any, Any] = (await client.infer("add_sub_torch", inputs)).as_numpy("OUTPUT__0")
        return result

    async def many() -> list[np.ndarray[Any, Any]]:
        client = aiogrpcclient.InferenceServerClient(torch_server.grpc_url)
        try:
            return await asyncio.gather(*(one(client, k) for k in range(8)))
        finally:
            await client.close()

    results = asyncio.run(many())
    for k, result in enumerate(results):
        np.testing.assert_array_equal(result, np.full((1, 4), 101 * k, dtype=np.float32))
    client = httpclient.InferenceServerClient(torch_server.http_url)
    stats = client.get_inference_statistics("add_sub_torch")["model_stats"][0]
    client.close()
    # 8 requests in flight within the queue delay: fewer executions than requests.
    assert int(stats["execution_count"]) < int(stats["inference_count"])


def test_argument_names_in_another_order_and_the_parameters(torch_server: Server, weighted: Weighted) -> None:
    features = np.random.default_rng(1).random((3, 8), dtype=np.float32)
    bias = np.array([[0.5, 0.0, -0.5]] * 3, dtype=np.float32)
    client = httpclient.InferenceServerClient(torch_server.http_url)
    inputs = [httpclient.InferInput("bias", [3, 3], "FP32"), httpclient.InferInput("features", [3, 8], "FP32")]
    inputs[0].set_data_from_numpy(bias)
    inputs[1].set_data_from_numpy(features)
    result = client.infer("weighted", inputs).as_numpy("probabilities")
    client.close()
    with torch.no_grad():
        expected = weighted(torch.from_numpy(features), torch.from_numpy(bias)).numpy()
    np.testing.assert_allclose(result, expected, rtol=1e-5, atol=1e-6)


def test_inputs_named_neither_way_are_taken_in_the_config_order(torch_server: Server, weighted: Weighted) -> None:
    features = np.random.default_rng(2).random((2, 8), dtype=np.float32)
    bias = np.array([[0.25, 0.0, -0.25]] * 2, dtype=np.float32)
    client = httpclient.InferenceServerClient(torch_server.http_url)
    inputs = [httpclient.InferInput("b", [2, 3], "FP32"), httpclient.InferInput("a", [2, 8], "FP32")]
    inputs[0].set_data_from_numpy(bias)
    inputs[1].set_data_from_numpy(features)
    result = client.infer("config_order", inputs).as_numpy("probabilities")
    client.close()
    with torch.no_grad():
        expected = weighted(torch.from_numpy(features), torch.from_numpy(bias)).numpy()
    np.testing.assert_allclose(result, expected, rtol=1e-5, atol=1e-6)
    assert "are given to forward in the configuration's order" in torch_server.log()


@pytest.mark.parametrize(
    ("model", "reason"),
    [
        ("one_input", "unable to load model 'one_input', configuration expects 1 inputs, model provides 2"),
        ("no_model_file", "model.pt is not a TorchScript model"),
        ("bad_parameter", "unknown pytorch parameter 'FAST'"),
    ],
)
def test_a_model_that_cannot_load_says_why(torch_server: Server, model: str, reason: str) -> None:
    client = httpclient.InferenceServerClient(torch_server.http_url)
    index = {entry["name"]: entry for entry in client.get_model_repository_index()}
    client.close()
    assert index[model]["state"] == "UNAVAILABLE"
    assert reason in index[model]["reason"], index[model]["reason"]
    assert index["add_sub_torch"]["state"] == "READY"


def test_without_pytorch_the_model_says_what_to_install(tmp_path: Path) -> None:
    shadow = tmp_path / "shadow" / "torch"
    shadow.mkdir(parents=True)
    (shadow / "__init__.py").write_text("raise ImportError('torch is not installed here')\n", encoding="utf-8")
    repository = tmp_path / "repository"
    _model(repository, "add_sub_torch", ADD_SUB_CONFIG, AddSub())
    with run_server([repository], environment={"PYTHONPATH": str(shadow.parent)}) as server:
        client = httpclient.InferenceServerClient(server.http_url)
        (entry,) = client.get_model_repository_index()
        client.close()
    assert entry["state"] == "UNAVAILABLE"
    assert "the pytorch backend needs PyTorch, which is not installed: install edged[pytorch]" in entry["reason"]
