"""Triton's response cache: ``--cache-config local,size=BYTES`` and a model's ``response_cache { enable: true }``.
A hit answers without running the model; the statistics extension and the metrics count hits and misses as Triton
2.51 does; the cache stays within its bytes; a reload or an unload drops the model's entries; without the flag
nothing is cached."""

from __future__ import annotations

import time
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import tritonclient.grpc as grpcclient
import tritonclient.http as httpclient
from server import Server, run_server
from tritonclient.utils import InferenceServerException

CACHE_BYTES = 8192

# Doubles its input, and appends a line to ``executions`` in its folder for every request it runs.
COUNTING_MODEL = """
import os

import triton_python_backend_utils as pb_utils


class TritonPythonModel:
    def initialize(self, args):
        self.path = os.path.join(args["model_repository"], "executions")

    def execute(self, requests):
        responses = []
        for request in requests:
            with open(self.path, "a") as log:
                log.write("ran\\n")
            x = pb_utils.get_input_tensor_by_name(request, "INPUT0").as_numpy()
            responses.append(pb_utils.InferenceResponse([pb_utils.Tensor("OUTPUT0", x * 2)]))
        return responses
"""

CONFIG = """name: "{name}"
backend: "python"
max_batch_size: 0
input [ {{ name: "INPUT0" data_type: TYPE_FP32 dims: [ -1, -1 ] }} ]
output [ {{ name: "OUTPUT0" data_type: TYPE_FP32 dims: [ -1, -1 ] }} ]
instance_group [ {{ count: 1 kind: KIND_CPU }} ]
{extra}
"""

SEQUENCE = """sequence_batching {
  control_input [ { name: "START" control [ { kind: CONTROL_SEQUENCE_START int32_false_true: [ 0, 1 ] } ] } ]
}"""


def _model(repo: Path, name: str, extra: str) -> None:
    (repo / name / "1").mkdir(parents=True)
    (repo / name / "1" / "model.py").write_text(COUNTING_MODEL, encoding="utf-8")
    (repo / name / "config.pbtxt").write_text(CONFIG.format(name=name, extra=extra), encoding="utf-8")


@pytest.fixture(scope="module")
def cache_repository(tmp_path_factory: pytest.TempPathFactory) -> Path:
    repo = tmp_path_factory.mktemp("cache-repository")
    _model(repo, "cached", "response_cache { enable: true }")
    _model(repo, "uncached", "")
    return repo


@pytest.fixture(scope="module")
def cache_server(cache_repository: Path) -> Iterator[Server]:
    args = ("--model-control-mode", "explicit", "--load-model", "*", f"--cache-config=local,size={CACHE_BYTES}")
    with run_server([cache_repository], *args) as running:
        yield running


@pytest.fixture(scope="module")
def http(cache_server: Server) -> Iterator[httpclient.InferenceServerClient]:
    with httpclient.InferenceServerClient(cache_server.http_url) as client:
        yield client


def executions(repo: Path, model: str = "cached") -> int:
    path = repo / model / "executions"
    return len(path.read_text(encoding="utf-8").splitlines()) if path.exists() else 0


def infer(client: httpclient.InferenceServerClient, array: np.ndarray[Any, Any], model: str = "cached") -> Any:
    tensor = httpclient.InferInput("INPUT0", list(array.shape), "FP32")
    tensor.set_data_from_numpy(array)
    return client.infer(model, [tensor]).as_numpy("OUTPUT0")


def inference_stats(client: httpclient.InferenceServerClient, model: str = "cached") -> dict[str, Any]:
    stats: dict[str, Any] = client.get_inference_statistics(model)["model_stats"][0]
    return stats


def metrics(server: Server) -> dict[str, float]:
    """Every sample of /metrics, keyed by its name and labels as written."""
    with urllib.request.urlopen(f"http://{server.metrics_url}/metrics") as reply:
        text = reply.read().decode()
    out: dict[str, float] = {}
    for line in text.splitlines():
        if line and not line.startswith("#"):
            key, _, value = line.rpartition(" ")
            out[key] = float(value)
    return out


def test_a_hit_answers_without_running_the_model(
    cache_server: Server, cache_repository: Path, http: httpclient.InferenceServerClient
) -> None:
    before, ran = inference_stats(http), executions(cache_repository)
    array = np.full((1, 4), 3.0, np.float32)
    first = infer(http, array)
    second = infer(http, array)
    np.testing.assert_array_equal(first, array * 2)
    np.testing.assert_array_equal(second, array * 2)
    assert executions(cache_repository) == ran + 1
    after = inference_stats(http)
    hit, miss = after["inference_stats"]["cache_hit"], after["inference_stats"]["cache_miss"]
    assert hit["count"] == before["inference_stats"]["cache_hit"]["count"] + 1 and hit["ns"] > 0
    assert miss["count"] == before["inference_stats"]["cache_miss"]["count"] + 1 and miss["ns"] > 0
    # Triton's accounting: a hit is a success, but neither an inference nor an execution.
    assert after["inference_stats"]["success"]["count"] == before["inference_stats"]["success"]["count"] + 2
    assert after["inference_count"] == before["inference_count"] + 1
    assert after["execution_count"] == before["execution_count"] + 1
    # The statistics over gRPC say the same.
    with grpcclient.InferenceServerClient(cache_server.grpc_url) as grpc:
        reply = grpc.get_inference_statistics("cached", as_json=True)["model_stats"][0]["inference_stats"]
    assert int(reply["cache_hit"]["count"]) == hit["count"]
    assert int(reply["cache_miss"]["count"]) == miss["count"]
    # And the metrics, under Triton's names and labels.
    sample = metrics(cache_server)
    labels = '{model="cached",version="1"}'
    assert sample[f"nv_cache_num_hits_per_model{labels}"] == hit["count"]
    assert sample[f"nv_cache_num_misses_per_model{labels}"] == miss["count"]
    assert sample[f"nv_cache_hit_duration_per_model{labels}"] == hit["ns"] // 1000
    assert sample[f"nv_cache_miss_duration_per_model{labels}"] == miss["ns"] // 1000
    assert sample["nv_cache_num_hits"] >= 1 and sample["nv_cache_num_entries"] >= 1
    assert 0 < sample["nv_cache_util"] <= 1
    # A model whose config does not enable the cache is not listed.
    assert not any(key.startswith("nv_cache_num_hits_per_model") and "uncached" in key for key in sample)


def test_a_hit_answers_over_grpc_too(cache_server: Server, cache_repository: Path) -> None:
    array = np.full((2, 3), 5.0, np.float32)
    ran = executions(cache_repository)
    with grpcclient.InferenceServerClient(cache_server.grpc_url) as grpc:
        for _ in range(3):
            tensor = grpcclient.InferInput("INPUT0", [2, 3], "FP32")
            tensor.set_data_from_numpy(array)
            np.testing.assert_array_equal(grpc.infer("cached", [tensor]).as_numpy("OUTPUT0"), array * 2)
    assert executions(cache_repository) == ran + 1


def test_a_changed_input_misses(cache_repository: Path, http: httpclient.InferenceServerClient) -> None:
    base = np.arange(4, dtype=np.float32).reshape(1, 4) + 100
    infer(http, base)
    ran = executions(cache_repository)
    changed_value = base.copy()
    changed_value[0, 3] += 1
    np.testing.assert_array_equal(infer(http, changed_value), changed_value * 2)
    assert executions(cache_repository) == ran + 1
    # The same bytes in other shapes: each is a request of its own, answered in its own shape.
    for shape in ((4, 1), (2, 2)):
        reshaped = base.reshape(shape)
        np.testing.assert_array_equal(infer(http, reshaped), reshaped * 2)
    assert executions(cache_repository) == ran + 3
    # The same bytes as another datatype are refused before the cache, as the config fixes the datatype.
    tensor = httpclient.InferInput("INPUT0", [1, 1], "INT32")
    tensor.set_data_from_numpy(base.view(np.int32)[:, :1].copy())
    with pytest.raises(InferenceServerException, match="data-type"):
        http.infer("cached", [tensor])
    assert executions(cache_repository) == ran + 3
    # The original still hits.
    infer(http, base)
    assert executions(cache_repository) == ran + 3


def test_the_cache_stays_within_its_bytes(
    cache_server: Server, cache_repository: Path, http: httpclient.InferenceServerClient
) -> None:
    for i in range(100):
        infer(http, np.full((1, 64), 1000.0 + i, np.float32))
        sample = metrics(cache_server)
        assert sample["edged_response_cache_bytes"] <= CACHE_BYTES
        assert sample["nv_cache_util"] <= 1
    assert sample["edged_response_cache_size_bytes"] == CACHE_BYTES
    assert sample["nv_cache_num_evictions"] > 0
    # The oldest were evicted: asked again, they run again; the newest is still there.
    ran = executions(cache_repository)
    infer(http, np.full((1, 64), 1000.0, np.float32))
    assert executions(cache_repository) == ran + 1
    infer(http, np.full((1, 64), 1099.0, np.float32))
    assert executions(cache_repository) == ran + 1
    # A response larger than the whole cache is answered, and not kept: both runs execute, both are misses.
    big = np.full((1, CACHE_BYTES), 7.0, np.float32)
    misses = inference_stats(http)["inference_stats"]["cache_miss"]["count"]
    infer(http, big)
    infer(http, big)
    assert executions(cache_repository) == ran + 3
    assert inference_stats(http)["inference_stats"]["cache_miss"]["count"] == misses + 2
    assert metrics(cache_server)["edged_response_cache_bytes"] <= CACHE_BYTES


def wait_for(condition: Any, what: str, timeout_s: float = 60.0) -> None:
    deadline = time.monotonic() + timeout_s
    while not condition():
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out waiting for {what}")
        time.sleep(0.05)


def test_a_reload_or_an_unload_drops_the_entries(
    cache_server: Server, cache_repository: Path, http: httpclient.InferenceServerClient
) -> None:
    array = np.full((1, 2), 42.0, np.float32)
    infer(http, array)
    infer(http, array)
    ran = executions(cache_repository)
    http.load_model("cached")  # a reload
    # The reload's fresh statistics count its first request a miss: the entry went with the old load.
    infer(http, array)
    assert executions(cache_repository) == ran + 1
    stats = inference_stats(http)["inference_stats"]
    assert stats["cache_miss"]["count"] == 1 and stats["cache_hit"]["count"] == 0
    infer(http, array)
    assert executions(cache_repository) == ran + 1
    # Once the old load is gone, only the new one's entry is held; an unload drops that too.
    wait_for(lambda: metrics(cache_server)["nv_cache_num_entries"] == 1, "the old load's entries to go")
    http.unload_model("cached")
    wait_for(lambda: metrics(cache_server)["edged_response_cache_bytes"] == 0, "the unload to drop the entries")
    assert metrics(cache_server)["nv_cache_num_entries"] == 0
    http.load_model("cached")
    infer(http, array)
    assert executions(cache_repository) == ran + 2


def test_a_model_without_response_cache_is_not_cached(
    cache_server: Server, cache_repository: Path, http: httpclient.InferenceServerClient
) -> None:
    array = np.full((1, 3), 9.0, np.float32)
    for _ in range(3):
        infer(http, array, "uncached")
    assert executions(cache_repository, "uncached") >= 3
    stats = inference_stats(http, "uncached")["inference_stats"]
    assert stats["cache_hit"] == {"count": 0, "ns": 0} and stats["cache_miss"] == {"count": 0, "ns": 0}


def test_decoupled_and_sequence_models_are_never_cached(tmp_path: Path) -> None:
    """Triton refuses both configs, with these words, and so does edged: they load as UNAVAILABLE."""
    _model(tmp_path, "dec", "model_transaction_policy { decoupled: true }\nresponse_cache { enable: true }")
    _model(tmp_path, "seq", SEQUENCE + "\nresponse_cache { enable: true }")
    with (
        run_server([tmp_path], f"--cache-config=local,size={CACHE_BYTES}") as server,
        httpclient.InferenceServerClient(server.http_url) as client,
    ):
        index = {entry["name"]: entry for entry in client.get_model_repository_index()}
    assert index["dec"]["state"] == "UNAVAILABLE"
    assert "does not currently support model dec with 'decoupled' transaction policy" in index["dec"]["reason"]
    assert index["seq"]["state"] == "UNAVAILABLE"
    assert "does not currently support model seq with sequence batching scheduler" in index["seq"]["reason"]


def test_without_cache_config_nothing_is_cached(tmp_path: Path) -> None:
    _model(tmp_path, "cached", "response_cache { enable: true }")
    array = np.full((1, 4), 1.5, np.float32)
    with run_server([tmp_path]) as server, httpclient.InferenceServerClient(server.http_url) as client:
        for _ in range(3):
            np.testing.assert_array_equal(infer(client, array), array * 2)
        assert executions(tmp_path) == 3
        stats = inference_stats(client)
        sample = metrics(server)
        log = server.log()
    assert stats["inference_stats"]["cache_hit"] == {"count": 0, "ns": 0}
    assert stats["inference_stats"]["cache_miss"] == {"count": 0, "ns": 0}
    assert stats["execution_count"] == 3
    assert not any(key.startswith(("nv_cache", "edged_response_cache")) for key in sample)
    # Said once, at the load, and shown among the model's notes.
    assert log.count("response_cache is not acted upon: the server has no response cache") == 1


@pytest.mark.parametrize(
    ("value", "message"),
    [
        ("size=1024", "No cache specified. --cache-config option format is <cache name>,<setting>=<value>"),
        ("local,size=", "--cache-config option format is '<cache name>,<setting>=<value>'"),
        ("redis,size=1024", "edged has the 'local' cache only"),
        ("local,capacity=1024", "its one setting is size"),
        ("local,size=0", "a number of bytes of at least 1"),
        ("local,size=lots", "a number of bytes of at least 1"),
    ],
)
def test_a_bad_cache_config_is_refused(tmp_path: Path, value: str, message: str) -> None:
    import subprocess
    import sys

    result = subprocess.run(
        [sys.executable, "-m", "edged", "serve", "--model-repository", str(tmp_path), "--cache-config", value],
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert result.returncode != 0
    assert message in result.stderr + result.stdout
