"""model_warmup: each sample runs ``count`` times on every instance before a version is READY, with Triton's
inputs (zeros, random data, a file of raw bytes) and Triton's load errors when a sample fails. Real daemon, real
ONNX and Python models; the Python model writes one line per request it executes, so the test counts the runs."""

from __future__ import annotations

import json
import shutil
import struct
from collections import Counter
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import modelgen
import numpy as np
import pytest
import tritonclient.http as httpclient
from server import Server, add_sub_inputs, post_json, run_server

RECORDER = """
import json

import numpy as np
import triton_python_backend_utils as pb_utils


class TritonPythonModel:
    def initialize(self, args):
        config = json.loads(args["model_config"])
        self.params = {k: v["string_value"] for k, v in config.get("parameters", {}).items()}
        self.instance = args["model_instance_name"]

    def execute(self, requests):
        responses = []
        for request in requests:
            tensor = pb_utils.get_input_tensor_by_name(request, "IN").as_numpy()
            with open(self.params["log"], "a") as log:
                line = {"instance": self.instance, "shape": list(tensor.shape), "values": tensor.flatten().tolist()}
                log.write(json.dumps({**line, "batch": len(requests)}) + "\\n")
            if self.params.get("poison") == "zeros" and not tensor.any():
                raise ValueError("warmup poison")
            responses.append(pb_utils.InferenceResponse([pb_utils.Tensor("OUT", tensor * 2)]))
        return responses
"""

DATA = struct.pack("<4f", 1.0, 2.0, 3.0, 4.0)


def _recorder(
    repo: Path, name: str, warmup: str, *, poison: bool = False, files: dict[str, bytes] | None = None
) -> Path:
    model = repo / name
    (model / "1").mkdir(parents=True)
    (model / "1" / "model.py").write_text(RECORDER, encoding="utf-8")
    log = repo.parent / f"{name}.calls"
    poison_param = ', { key: "poison" value: { string_value: "zeros" } }' if poison else ""
    (model / "config.pbtxt").write_text(
        f'name: "{name}"\nbackend: "python"\nmax_batch_size: 8\n'
        'input [ { name: "IN" data_type: TYPE_FP32 dims: [ 4 ] } ]\n'
        'output [ { name: "OUT" data_type: TYPE_FP32 dims: [ 4 ] } ]\n'
        "instance_group [ { count: 2 kind: KIND_CPU } ]\n"
        f'parameters [ {{ key: "log" value: {{ string_value: "{log}" }} }}{poison_param} ]\n'
        f"model_warmup [ {warmup} ]\n",
        encoding="utf-8",
    )
    for file_name, data in (files or {}).items():
        (model / "warmup").mkdir(exist_ok=True)
        (model / "warmup" / file_name).write_bytes(data)
    return log


def _sample(name: str, data: str, *, batch_size: int = 1, count: int = 0) -> str:
    counted = f" count: {count}" if count else ""
    return (
        f'{{ name: "{name}" batch_size: {batch_size}{counted} '
        f'inputs {{ key: "IN" value: {{ data_type: TYPE_FP32 dims: [ 4 ] {data} }} }} }}'
    )


def _calls(log: Path) -> list[dict[str, Any]]:
    if not log.exists():
        return []
    return [json.loads(line) for line in log.read_text(encoding="utf-8").splitlines()]


def _index(client: httpclient.InferenceServerClient) -> dict[str, dict[str, str]]:
    return {e["name"]: e for e in client.get_model_repository_index()}


@pytest.fixture(scope="module")
def warm(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[Server, Path]]:
    root = tmp_path_factory.mktemp("warmup")
    repo = root / "models"
    repo.mkdir()
    modelgen.write_add_sub(repo / "add_sub_warm", max_batch_size=8)
    config = repo / "add_sub_warm" / "config.pbtxt"
    text = config.read_text(encoding="utf-8").replace('name: "add_sub"', 'name: "add_sub_warm"')
    config.write_text(
        text
        + 'model_warmup [ { name: "mixed" batch_size: 4 count: 2 inputs [\n'
        + '  { key: "INPUT0" value: { data_type: TYPE_FP32 dims: [ 16 ] zero_data: true } },\n'
        + '  { key: "INPUT1" value: { data_type: TYPE_FP32 dims: [ 16 ] random_data: true } } ] } ]\n',
        encoding="utf-8",
    )
    _recorder(repo, "recorder", _sample("from_file", 'input_data_file: "in.bin"', count=3), files={"in.bin": DATA})
    _recorder(repo, "batched", _sample("rows", "zero_data: true", batch_size=3))
    _recorder(repo, "poisoned", _sample("zeros", "zero_data: true", count=3), poison=True)
    _recorder(repo, "no_file", _sample("nofile", 'input_data_file: "absent.bin"'))
    _recorder(repo, "short_file", _sample("short", 'input_data_file: "short.bin"'), files={"short.bin": DATA[:8]})
    _recorder(repo, "too_big", _sample("big", "zero_data: true", batch_size=9))
    _recorder(repo, "wrong_dims", _sample("baddims", "zero_data: true").replace("dims: [ 4 ]", "dims: [ 5 ]"))
    (repo / "ensemble_warm" / "1").mkdir(parents=True)
    (repo / "ensemble_warm" / "config.pbtxt").write_text(
        'name: "ensemble_warm"\nplatform: "ensemble"\nmax_batch_size: 8\n'
        'input [ { name: "IN" data_type: TYPE_FP32 dims: [ 4 ] } ]\n'
        'output [ { name: "OUT" data_type: TYPE_FP32 dims: [ 4 ] } ]\n'
        'ensemble_scheduling { step [ { model_name: "recorder" model_version: -1 '
        'input_map { key: "IN" value: "IN" } output_map { key: "OUT" value: "OUT" } } ] }\n'
        f"model_warmup [ {_sample('ens', 'zero_data: true')} ]\n",
        encoding="utf-8",
    )
    with run_server([repo]) as server:
        yield server, root


def test_samples_run_count_times_on_every_instance_before_ready(warm: tuple[Server, Path]) -> None:
    server, root = warm
    client = httpclient.InferenceServerClient(server.http_url)
    index = _index(client)
    assert index["recorder"]["state"] == "READY"
    calls = _calls(root / "recorder.calls")
    # count 3 on each of the two instances, with the file's bytes as one row of [1, 4].
    assert Counter(c["instance"] for c in calls) == {"recorder_0_0": 3, "recorder_0_1": 3}
    assert all(c["shape"] == [1, 4] and c["values"] == [1.0, 2.0, 3.0, 4.0] for c in calls)
    # batch_size 3: three one-row requests in one execution, once (count unset) per instance.
    batched = _calls(root / "batched.calls")
    assert Counter(c["instance"] for c in batched) == {"batched_0_0": 3, "batched_0_1": 3}
    assert all(c["batch"] == 3 and c["shape"] == [1, 4] and not any(c["values"]) for c in batched)
    # The warmed models serve.
    result = client.infer(
        "recorder", [httpclient.InferInput("IN", [1, 4], "FP32").set_data_from_numpy(np.ones((1, 4), np.float32))]
    )
    assert result.as_numpy("OUT").tolist() == [[2.0, 2.0, 2.0, 2.0]]
    assert index["add_sub_warm"]["state"] == "READY"
    reply = client.infer("add_sub_warm", add_sub_inputs())
    assert reply.as_numpy("OUTPUT0") is not None
    log = server.log_file.read_text(encoding="utf-8", errors="replace")
    assert "model 'recorder' ran 1 warmup sample(s) (3 run(s)) on each of 2 instance(s)" in log


def test_a_failing_sample_leaves_the_version_unavailable_with_tritons_reason(warm: tuple[Server, Path]) -> None:
    server, root = warm
    client = httpclient.InferenceServerClient(server.http_url)
    index = _index(client)
    poisoned = index["poisoned"]
    assert poisoned["state"] == "UNAVAILABLE"
    assert poisoned["reason"].startswith("Invalid argument: failed to run warmup sample 'zeros': ")
    assert "ValueError: warmup poison" in poisoned["reason"]
    assert poisoned["reason"].endswith("; ")
    # Each instance stopped at its first failing run (count 3).
    assert Counter(c["instance"] for c in _calls(root / "poisoned.calls")) == {"poisoned_0_0": 1, "poisoned_0_1": 1}
    assert "instance 'poisoned_0_0'" in poisoned["reason"]
    models = root / "models"
    assert index["no_file"] == {
        "name": "no_file",
        "version": "1",
        "state": "UNAVAILABLE",
        "reason": f"Internal: failed to open text file for read {models / 'no_file' / 'warmup' / 'absent.bin'}: "
        "No such file or directory",
    }
    assert index["short_file"]["reason"] == (
        "Invalid argument: [request id: <id_unknown>] warmup setting expects 16 bytes, but the data provided from "
        "short.binonly has 8 bytes"
    )
    assert not _calls(root / "no_file.calls") and not _calls(root / "short_file.calls")
    assert index["too_big"]["reason"] == (
        "Invalid argument: failed to run warmup sample 'big': "
        + "batch size 9 for 'too_big_0_0', max allowed is 8; " * 9
    )
    assert index["wrong_dims"]["reason"].startswith(
        "Invalid argument: [request id: <id_unknown>] unexpected shape for input 'IN' for model 'wrong_dims'. "
        "Expected [-1,4], got [1,5]."
    )
    assert "model_warmup can not be specified for ensemble 'ensemble_warm'" in index["ensemble_warm"]["reason"]
    with pytest.raises(Exception, match="has no available versions"):
        client.infer(
            "poisoned", [httpclient.InferInput("IN", [1, 4], "FP32").set_data_from_numpy(np.ones((1, 4), np.float32))]
        )
    # The other models serve on.
    assert index["recorder"]["state"] == "READY"


def test_a_reload_whose_warmup_fails_keeps_the_old_version_serving(tmp_path: Path) -> None:
    repo = tmp_path / "models"
    repo.mkdir()
    log = _recorder(repo, "swap", _sample("ok", 'input_data_file: "in.bin"'), files={"in.bin": DATA})
    with run_server([repo], "--model-control-mode=explicit", "--load-model=swap") as server:
        client = httpclient.InferenceServerClient(server.http_url)
        assert client.is_model_ready("swap")
        assert len(_calls(log)) == 2
        # The new config's warmup makes execute raise: the load is refused with the warmup's reason.
        shutil.rmtree(repo / "swap")
        _recorder(repo, "swap", _sample("zeros", "zero_data: true"), poison=True)
        reply = post_json(server.http_url, "/v2/repository/models/swap/load", {})
        assert reply.status == 400, reply.body
        assert "failed to run warmup sample 'zeros'" in json.loads(reply.body)["error"]
        assert client.is_model_ready("swap")
        result = client.infer(
            "swap", [httpclient.InferInput("IN", [1, 4], "FP32").set_data_from_numpy(np.full((1, 4), 3.0, np.float32))]
        )
        assert result.as_numpy("OUT").tolist() == [[6.0, 6.0, 6.0, 6.0]]
