"""The statistics extension over HTTP, against a daemon of its own so every count is exactly what was sent."""

from __future__ import annotations

import time
from collections.abc import Iterator
from typing import Any

import numpy as np
import pytest
import tritonclient.http as httpclient
from conftest import modelgen  # type: ignore[attr-defined]
from server import Server, add_sub_inputs, assert_still_serving, request, run_server
from tritonclient.utils import InferenceServerException

DURATIONS = ("success", "fail", "queue", "compute_input", "compute_infer", "compute_output", "cache_hit", "cache_miss")


@pytest.fixture(scope="module")
def stats_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Server]:
    repo = tmp_path_factory.mktemp("stats-repository")
    modelgen.write_add_sub(repo / "add_sub", max_batch_size=8, dims=16, dtype="FP32")
    modelgen.write_identity(repo / "identity_bytes", "BYTES", max_batch_size=8, dims=[-1])
    (repo / "broken").mkdir()
    (repo / "broken" / "config.pbtxt").write_text("max_batch_size: eight\n", encoding="utf-8")
    with run_server([repo]) as running:
        yield running


@pytest.fixture
def stats_client(stats_server: Server) -> Iterator[httpclient.InferenceServerClient]:
    client = httpclient.InferenceServerClient(stats_server.http_url)
    yield client
    client.close()


def _stats(client: httpclient.InferenceServerClient, model: str, version: str = "") -> dict[str, Any]:
    reply = client.get_inference_statistics(model, version)
    assert isinstance(reply, dict)
    (entry,) = reply["model_stats"]
    assert isinstance(entry, dict)
    return entry


def test_every_field_perf_analyzer_reads_is_present(stats_client: httpclient.InferenceServerClient) -> None:
    entry = _stats(stats_client, "add_sub")
    assert entry["name"] == "add_sub"
    assert entry["version"] == "1"
    for key in ("last_inference", "inference_count", "execution_count"):
        assert isinstance(entry[key], int)
    assert set(entry["inference_stats"]) == set(DURATIONS)
    for duration in entry["inference_stats"].values():
        assert set(duration) == {"count", "ns"}
        assert all(isinstance(v, int) for v in duration.values())
    assert entry["response_stats"] == {}
    assert entry["memory_usage"] == []
    assert isinstance(entry["batch_stats"], list)


@pytest.mark.parametrize("batch", [1, 3])
def test_counts_equal_the_requests_sent(stats_client: httpclient.InferenceServerClient, batch: int) -> None:
    before = _stats(stats_client, "add_sub")
    sent = 5
    data = np.arange(16 * batch, dtype=np.float32).reshape(batch, 16)
    for _ in range(sent):
        stats_client.infer("add_sub", add_sub_inputs(data, data))
    after = _stats(stats_client, "add_sub")
    grown = {k: after["inference_stats"][k]["count"] - before["inference_stats"][k]["count"] for k in DURATIONS}
    assert grown == {
        "success": sent,
        "fail": 0,
        "queue": sent,
        "compute_input": sent,
        "compute_infer": sent,
        "compute_output": sent,
        "cache_hit": 0,
        "cache_miss": 0,
    }
    assert after["inference_count"] - before["inference_count"] == sent * batch
    assert after["execution_count"] - before["execution_count"] == sent
    batches_before = {b["batch_size"]: b["compute_infer"]["count"] for b in before["batch_stats"]}
    batches_after = {b["batch_size"]: b["compute_infer"]["count"] for b in after["batch_stats"]}
    assert batches_after[batch] - batches_before.get(batch, 0) == sent
    # A request's time covers its queue wait and its compute.
    stats = after["inference_stats"]
    assert stats["success"]["ns"] >= stats["queue"]["ns"] + stats["compute_infer"]["ns"]
    assert abs(after["last_inference"] - time.time() * 1000) < 60_000


def test_refused_requests_are_not_counted(stats_client: httpclient.InferenceServerClient) -> None:
    before = _stats(stats_client, "add_sub")
    bad = np.zeros((1, 15), dtype=np.float32)
    with pytest.raises(InferenceServerException):
        stats_client.infer("add_sub", add_sub_inputs(bad, bad))
    after = _stats(stats_client, "add_sub")
    assert after["inference_stats"] == before["inference_stats"]
    assert after["execution_count"] == before["execution_count"]


def test_failed_executions_are_counted(stats_client: httpclient.InferenceServerClient) -> None:
    # onnxruntime takes string tensors as UTF-8 text: the backend refuses these bytes when it executes.
    before = _stats(stats_client, "identity_bytes")
    tensor = httpclient.InferInput("INPUT0", [1, 1], "BYTES")
    tensor.set_data_from_numpy(np.array([[b"\xff\xfe"]], dtype=np.object_))
    with pytest.raises(InferenceServerException):
        stats_client.infer("identity_bytes", [tensor])
    after = _stats(stats_client, "identity_bytes")
    assert after["inference_stats"]["fail"]["count"] == before["inference_stats"]["fail"]["count"] + 1
    assert after["inference_stats"]["success"] == before["inference_stats"]["success"]
    assert after["inference_count"] == before["inference_count"]
    assert after["execution_count"] == before["execution_count"] + 1
    assert_still_serving(stats_client)


def test_all_models_lists_only_served_versions(stats_server: Server) -> None:
    reply = request(stats_server.http_url, "GET", "/v2/models/stats")
    assert reply.status == 200
    assert [entry["name"] for entry in reply.json()["model_stats"]] == ["add_sub", "identity_bytes"]


@pytest.mark.parametrize(
    ("path", "message"),
    [
        ("/v2/models/nowhere/stats", "requested model 'nowhere' is not available"),
        ("/v2/models/broken/stats", "requested model 'broken' is not available"),
        ("/v2/models/add_sub/versions/7/stats", "requested model version is not available for model 'add_sub'"),
    ],
)
def test_unknown_models_and_versions(stats_server: Server, path: str, message: str) -> None:
    reply = request(stats_server.http_url, "GET", path)
    assert reply.status == 400, reply
    assert reply.error() == message
    assert request(stats_server.http_url, "POST", "/v2/models/stats").status == 405


def test_version_statistics_match_the_model_statistics(stats_client: httpclient.InferenceServerClient) -> None:
    stats_client.infer("add_sub", add_sub_inputs())
    by_model, by_version = _stats(stats_client, "add_sub"), _stats(stats_client, "add_sub", "1")
    assert by_model["inference_count"] == by_version["inference_count"]
    assert by_model["name"] == by_version["name"] == "add_sub"
