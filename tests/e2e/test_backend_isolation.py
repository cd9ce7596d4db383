"""Framework backends in a process per instance (``--backend-config <backend>,isolation=process``) on the real daemon:
a TorchScript model, an OpenVINO IR and an XGBoost forest served from stub processes with the frameworks' own
answers, the frameworks kept out of the daemon, a config filled in a stub, and a crash of the framework's process (a
real SIGSEGV) that fails only the request it ran while the daemon and every other model keep serving and the
instance comes back."""

from __future__ import annotations

import os
import signal
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Final

import modelgen
import numpy as np
import openvino
import pytest
import torch
import tritonclient.http as httpclient
import xgboost
from server import Server, assert_still_serving, run_server
from tritonclient.utils import InferenceServerException

SLOW_CONFIG: Final = """
platform: "pytorch_libtorch"
max_batch_size: 0
input [{ name: "INPUT__0", data_type: TYPE_FP32, dims: [ 512, 512 ] }]
output [{ name: "OUTPUT__0", data_type: TYPE_FP32, dims: [ 512, 512 ] }]
parameters [{ key: "INTRA_OP_THREAD_COUNT", value: { string_value: "1" } }]
"""

FOREST_CONFIG: Final = """
backend: "fil"
max_batch_size: 8
input [{ name: "input__0", data_type: TYPE_FP32, dims: [ 4 ] }]
output [{ name: "output__0", data_type: TYPE_FP32, dims: [ 1 ] }]
parameters [
  { key: "model_type", value: { string_value: "xgboost_json" } },
  { key: "output_class", value: { string_value: "true" } },
  { key: "predict_proba", value: { string_value: "true" } }
]
"""


class Powers(torch.nn.Module):
    """Multiplies a matrix by itself ``rounds`` times (the first element of the second input): as slow as asked."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        y = x
        for _ in range(int(x[0, 0].item())):
            y = torch.tanh(y @ x)
        return y


def _stub_pids(server: Server) -> list[int]:
    """The daemon's child processes that run stubs."""
    pids = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            ppid = int((entry / "stat").read_text().rsplit(")", 1)[1].split()[1])
            command = (entry / "cmdline").read_bytes()
        except (OSError, IndexError, ValueError):
            continue
        if ppid == server.process.pid and b"stub" in command:
            pids.append(int(entry.name))
    return pids


def _repository(server: Server) -> Path:
    return Path(server.args[server.args.index("--model-repository") + 1])


def _cpu_ticks(pid: int) -> int:
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return int(fields[11]) + int(fields[12])  # utime + stime


def _maps(pid: int) -> str:
    return Path(f"/proc/{pid}/maps").read_text()


@pytest.fixture(scope="module")
def isolated_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Server]:
    root = tmp_path_factory.mktemp("isolated")
    repository = root / "repository"
    (repository / "slow_torch" / "1").mkdir(parents=True)
    script: torch.jit.ScriptModule = torch.jit.script(Powers())
    script.save(str(repository / "slow_torch" / "1" / "model.pt"))
    (repository / "slow_torch" / "config.pbtxt").write_text(SLOW_CONFIG, encoding="utf-8")
    # An OpenVINO IR without inputs or outputs in its config: filled by OpenVINO, in a stub.
    modelgen.write_add_sub(root / "sources" / "add_sub", max_batch_size=8, dims=16, dtype="FP32")
    (repository / "add_sub_ir" / "1").mkdir(parents=True)
    model = openvino.Core().read_model(str(root / "sources" / "add_sub" / "1" / "model.onnx"))
    openvino.save_model(model, str(repository / "add_sub_ir" / "1" / "model.xml"))
    (repository / "add_sub_ir" / "config.pbtxt").write_text('backend: "openvino"\n', encoding="utf-8")
    # A forest: the fil backend has no default file name, so its model file is the version folder itself.
    rows = np.random.default_rng(0).random((64, 4), dtype=np.float32)
    booster = xgboost.train({"objective": "binary:logistic"}, xgboost.DMatrix(rows, label=rows[:, 0] > 0.5), 5)
    (repository / "forest" / "1").mkdir(parents=True)
    booster.save_model(repository / "forest" / "1" / "xgboost.json")
    (repository / "forest" / "config.pbtxt").write_text(FOREST_CONFIG, encoding="utf-8")
    # A config the fil backend refuses: its check runs in the instance's process.
    (repository / "two_outputs" / "1").mkdir(parents=True)
    booster.save_model(repository / "two_outputs" / "1" / "xgboost.json")
    two_outputs = FOREST_CONFIG.replace(
        "dims: [ 1 ] }]", 'dims: [ 1 ] }, { name: "extra", data_type: TYPE_FP32, dims: [ 1 ] }]'
    )
    (repository / "two_outputs" / "config.pbtxt").write_text(two_outputs, encoding="utf-8")
    # An ONNX model in the daemon, which must keep serving through the crash.
    modelgen.write_add_sub(repository / "add_sub", max_batch_size=8, dims=16, dtype="FP32")
    args = [f"--backend-config={name},isolation=process" for name in ("pytorch", "openvino", "fil")]
    with run_server([repository], *args) as server:
        yield server


def _slow_input(rounds: int) -> list[httpclient.InferInput]:
    matrix = np.full((512, 512), 0.001, dtype=np.float32)
    matrix[0, 0] = rounds
    tensor = httpclient.InferInput("INPUT__0", [512, 512], "FP32")
    tensor.set_data_from_numpy(matrix)
    return [tensor]


def test_isolated_models_answer_as_their_frameworks_and_stay_out_of_the_daemon(isolated_server: Server) -> None:
    client = httpclient.InferenceServerClient(isolated_server.http_url)
    matrix = np.full((512, 512), 0.001, dtype=np.float32)
    matrix[0, 0] = 2
    expected = Powers()(torch.from_numpy(matrix)).numpy()
    result = client.infer("slow_torch", _slow_input(2)).as_numpy("OUTPUT__0")
    np.testing.assert_allclose(result, expected, rtol=1e-5, atol=1e-6)
    # The IR's config was filled by OpenVINO in a stub: its tensors, and batching from the dynamic first dimension.
    config = client.get_model_config("add_sub_ir")
    assert [tensor["name"] for tensor in config["input"]] == ["INPUT0", "INPUT1"]
    assert config["max_batch_size"] > 0
    assert not any(key.startswith("__edged") for key in config.get("parameters", {}))
    a, b = np.ones((2, 16), np.float32), np.full((2, 16), 3, np.float32)
    inputs = [httpclient.InferInput("INPUT0", [2, 16], "FP32"), httpclient.InferInput("INPUT1", [2, 16], "FP32")]
    inputs[0].set_data_from_numpy(a)
    inputs[1].set_data_from_numpy(b)
    np.testing.assert_allclose(client.infer("add_sub_ir", inputs).as_numpy("OUTPUT1"), a - b)
    rows = np.random.default_rng(1).random((3, 4), dtype=np.float32)
    features = httpclient.InferInput("input__0", [3, 4], "FP32")
    features.set_data_from_numpy(rows)
    forest = xgboost.Booster(model_file=str(_repository(isolated_server) / "forest/1/xgboost.json"))
    expected_scores = forest.predict(xgboost.DMatrix(rows)).reshape(-1, 1)
    scores = client.infer("forest", [features]).as_numpy("output__0")
    np.testing.assert_allclose(scores, expected_scores, rtol=1e-5, atol=1e-6)
    client.close()
    # Three stubs (one instance each), each with its framework; the daemon maps none of their libraries.
    stubs = _stub_pids(isolated_server)
    assert len(stubs) == 3, stubs
    assert any("libtorch_cpu" in _maps(pid) for pid in stubs)
    assert any("libopenvino" in _maps(pid) for pid in stubs)
    daemon = _maps(isolated_server.process.pid)
    assert any("libtreelite" in _maps(pid) for pid in stubs)
    assert "libtorch_cpu" not in daemon and "libopenvino" not in daemon and "libtreelite" not in daemon


def test_a_crash_in_the_framework_fails_its_request_and_the_instance_comes_back(isolated_server: Server) -> None:
    client = httpclient.InferenceServerClient(isolated_server.http_url)
    client.infer("slow_torch", _slow_input(1))
    torch_stub = next(pid for pid in _stub_pids(isolated_server) if "libtorch_cpu" in _maps(pid))
    failure: list[str] = []

    def slow() -> None:
        with pytest.raises(InferenceServerException) as raised:
            httpclient.InferenceServerClient(isolated_server.http_url).infer("slow_torch", _slow_input(100_000))
        failure.append(str(raised.value))

    began = _cpu_ticks(torch_stub)
    running = threading.Thread(target=slow)
    running.start()
    # Killed once it has spent a third of a second of CPU on the request: inside PyTorch's matrix products.
    deadline = time.monotonic() + 60
    while _cpu_ticks(torch_stub) - began < os.sysconf("SC_CLK_TCK") // 3 and time.monotonic() < deadline:
        time.sleep(0.05)
    os.kill(torch_stub, signal.SIGSEGV)
    running.join(timeout=60)
    assert failure and "is not healthy: it was killed by signal 11 (SIGSEGV)" in failure[0], failure
    assert_still_serving(client)  # the ONNX model in the daemon
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        try:
            result = client.infer("slow_torch", _slow_input(1)).as_numpy("OUTPUT__0")
            break
        except InferenceServerException:
            time.sleep(0.2)
    assert result.shape == (512, 512)
    assert torch_stub not in _stub_pids(isolated_server)
    client.close()


def test_an_isolated_model_that_its_backend_refuses_says_why(isolated_server: Server) -> None:
    client = httpclient.InferenceServerClient(isolated_server.http_url)
    index = {entry["name"]: entry for entry in client.get_model_repository_index()}
    client.close()
    assert index["two_outputs"]["state"] == "UNAVAILABLE"
    assert "a fil model has one input (input__0) and one output (output__0)" in index["two_outputs"]["reason"]
    assert index["forest"]["state"] == "READY"


def test_isolation_is_refused_for_what_it_cannot_mean(tmp_path: Path) -> None:
    repository = tmp_path / "repository"
    modelgen.write_add_sub(repository / "add_sub", max_batch_size=8, dims=16, dtype="FP32")
    with run_server([repository], "--backend-config", "onnxruntime,isolation=process") as server:
        client = httpclient.InferenceServerClient(server.http_url)
        (entry,) = client.get_model_repository_index()
        client.close()
    assert entry["state"] == "UNAVAILABLE"
    assert "only the framework backends (fil, openvino, pytorch, tensorflow, tensorrt) run isolated" in entry["reason"]
