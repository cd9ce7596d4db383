"""The metrics endpoint: Triton's families, HELP texts, types and labels, with values that follow the requests
sent through the real tritonclient, the models' own metric families, and the flags that switch families on and
off. Values are checked against what was sent and against the statistics extension, never against timings."""

from __future__ import annotations

import math
import shutil
import socket
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Final

import numpy as np
import pytest
import tritonclient.grpc as grpcclient
import tritonclient.http as httpclient
from conftest import PYTHON_MODELS
from prometheus_client.parser import text_string_to_metric_families
from server import REPO_ROOT, Server, request, run_server
from tritonclient.utils import InferenceServerException

from edged.cli import main
from edged.core.backend_api import CustomMetric, CustomMetricFamily
from edged.core.devices import intel_npu_activity
from edged.core.stats import ExecutionTiming, ModelStatistics
from edged.frontends.metrics.config import parse_metrics_config
from edged.frontends.metrics.endpoint import custom_family
from edged.frontends.metrics.exposition import Family, render
from edged.frontends.metrics.models import LatencyRecorder
from edged.frontends.metrics.system import Nvml, read_cpu_times, read_memory

sys.path.insert(0, str(REPO_ROOT / "scripts"))

import modelgen  # type: ignore[import-not-found, unused-ignore]

REASONS: Final = ("REJECTED", "CANCELED", "BACKEND", "OTHER")
# Triton 2.51's HELP texts and types, as its metrics endpoint lists them.
TRITON_FAMILIES: Final = {
    "nv_inference_request_success": ("counter", "Number of successful inference requests, all batch sizes"),
    "nv_inference_request_failure": ("counter", "Number of failed inference requests, all batch sizes"),
    "nv_inference_count": ("counter", "Number of inferences performed (does not include cached requests)"),
    "nv_inference_exec_count": (
        "counter",
        "Number of model executions performed (does not include cached requests)",
    ),
    "nv_inference_request_duration_us": (
        "counter",
        "Cumulative inference request duration in microseconds (includes cached requests)",
    ),
    "nv_inference_queue_duration_us": (
        "counter",
        "Cumulative inference queuing duration in microseconds (includes cached requests)",
    ),
    "nv_inference_compute_input_duration_us": (
        "counter",
        "Cumulative compute input duration in microseconds (does not include cached requests)",
    ),
    "nv_inference_compute_infer_duration_us": (
        "counter",
        "Cumulative compute inference duration in microseconds (does not include cached requests)",
    ),
    "nv_inference_compute_output_duration_us": (
        "counter",
        "Cumulative inference compute output duration in microseconds (does not include cached requests)",
    ),
    "nv_inference_pending_request_count": (
        "gauge",
        "Instantaneous number of pending requests awaiting execution per-model.",
    ),
    "nv_cpu_utilization": ("gauge", "CPU utilization rate [0.0 - 1.0]"),
    "nv_cpu_memory_total_bytes": ("gauge", "CPU total memory (RAM), in bytes"),
    "nv_cpu_memory_used_bytes": ("gauge", "CPU used memory (RAM), in bytes"),
}
DURATIONS: Final = (
    "nv_inference_request_duration_us",
    "nv_inference_queue_duration_us",
    "nv_inference_compute_input_duration_us",
    "nv_inference_compute_infer_duration_us",
    "nv_inference_compute_output_duration_us",
)
SUMMARIES: Final = (
    "nv_inference_request_summary_us",
    "nv_inference_queue_summary_us",
    "nv_inference_compute_input_summary_us",
    "nv_inference_compute_infer_summary_us",
    "nv_inference_compute_output_summary_us",
)
GPU_FAMILIES: Final = ("nv_gpu_utilization", "nv_gpu_memory_total_bytes", "nv_gpu_memory_used_bytes")

CUSTOM_MODEL: Final = """
import triton_python_backend_utils as pb_utils


class TritonPythonModel:
    def initialize(self, args):
        calls = pb_utils.MetricFamily("custom_calls", "calls of custom", pb_utils.MetricFamily.COUNTER)
        level = pb_utils.MetricFamily("custom_level", "level of custom", pb_utils.MetricFamily.GAUGE)
        latency = pb_utils.MetricFamily("custom_latency", "latency of custom", pb_utils.MetricFamily.HISTOGRAM)
        self.calls = calls.Metric(labels={"mode": "a", "zz": "1"})
        self.level = level.Metric(labels={"mode": "b"})
        self.latency = latency.Metric(labels={"mode": "c"}, buckets=[0.5, 1.0, 2.5])
        # Kept: a family that goes (with its last reference) takes its metrics with it, as in Triton.
        self.families = (calls, level, latency)

    def execute(self, requests):
        responses = []
        for request in requests:
            value = pb_utils.get_input_tensor_by_name(request, "IN").as_numpy()
            self.calls.increment(2)
            self.level.set(float(value[0]))
            self.latency.observe(float(value[0]))
            responses.append(pb_utils.InferenceResponse([pb_utils.Tensor("OUT", value)]))
        return responses
"""
CUSTOM_CONFIG: Final = """name: "custom"
backend: "python"
max_batch_size: 0
input [ { name: "IN" data_type: TYPE_FP32 dims: [ 1 ] } ]
output [ { name: "OUT" data_type: TYPE_FP32 dims: [ 1 ] } ]
"""


@pytest.fixture(scope="module")
def metrics_repository(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """add_sub (ONNX) with metric tags, misbehave (a Python model that fails on request) and a Python model
    with its own counter, gauge and histogram."""
    repo = tmp_path_factory.mktemp("metrics-repository")
    modelgen.write_add_sub(repo / "add_sub", max_batch_size=8, dims=16, dtype="FP32")
    with (repo / "add_sub" / "config.pbtxt").open("a", encoding="utf-8") as config:
        config.write('metric_tags { key: "team" value: "vision" }\nmetric_tags { key: "app" value: "edge" }\n')
    shutil.copytree(PYTHON_MODELS / "misbehave", repo / "misbehave")
    (repo / "custom" / "1").mkdir(parents=True)
    (repo / "custom" / "config.pbtxt").write_text(CUSTOM_CONFIG, encoding="utf-8")
    (repo / "custom" / "1" / "model.py").write_text(CUSTOM_MODEL, encoding="utf-8")
    return repo


@pytest.fixture(scope="module")
def metrics_server(metrics_repository: Path) -> Iterator[Server]:
    with run_server([metrics_repository], "--metrics-interval-ms", "100") as running:
        yield running


def scrape(server: Server) -> str:
    reply = request(server.metrics_url, "GET", "/metrics")
    assert reply.status == 200
    assert reply.header("content-type") == "text/plain; charset=utf-8"
    return reply.body.decode()


def families(text: str) -> dict[str, tuple[str, str, list[tuple[str, dict[str, str], float]]]]:
    """name -> (type, help, samples); sample names as written (the parser adds ``_total`` to counters)."""
    out: dict[str, tuple[str, str, list[tuple[str, dict[str, str], float]]]] = {}
    for family in text_string_to_metric_families(text):
        samples = [(s.name.removesuffix("_total"), dict(s.labels), float(s.value)) for s in family.samples]
        out[family.name] = (family.type, family.documentation, samples)
    return out


def value(text: str, name: str, **labels: str) -> float:
    """The one sample of ``name`` whose labels include ``labels``."""
    found = [
        v
        for family in families(text).values()
        for sample, sample_labels, v in family[2]
        if sample == name and labels.items() <= sample_labels.items()
    ]
    assert len(found) == 1, f"{len(found)} samples of {name}{labels}"
    return found[0]


def _add_sub(client: httpclient.InferenceServerClient, batch: int) -> None:
    data = np.ones((batch, 16), dtype=np.float32)
    inputs = [
        httpclient.InferInput("INPUT0", [batch, 16], "FP32"),
        httpclient.InferInput("INPUT1", [batch, 16], "FP32"),
    ]
    inputs[0].set_data_from_numpy(data)
    inputs[1].set_data_from_numpy(data)
    client.infer("add_sub", inputs)


def _misbehave(client: httpclient.InferenceServerClient, mode: str) -> None:
    tensor = httpclient.InferInput("MODE", [1], "BYTES")
    tensor.set_data_from_numpy(np.array([mode.encode()], dtype=np.object_))
    client.infer("misbehave", [tensor])


def _custom(client: httpclient.InferenceServerClient, x: float) -> None:
    tensor = httpclient.InferInput("IN", [1], "FP32")
    tensor.set_data_from_numpy(np.array([x], dtype=np.float32))
    client.infer("custom", [tensor])


# --- the per-model families ---------------------------------------------------------------------------------


def test_counters_follow_the_requests_sent(metrics_server: Server) -> None:
    client = httpclient.InferenceServerClient(metrics_server.http_url)
    for batch in (1, 3, 2):
        _add_sub(client, batch)
    grpc = grpcclient.InferenceServerClient(metrics_server.grpc_url)
    data = np.ones((2, 16), dtype=np.float32)
    inputs = [grpcclient.InferInput("INPUT0", [2, 16], "FP32"), grpcclient.InferInput("INPUT1", [2, 16], "FP32")]
    inputs[0].set_data_from_numpy(data)
    inputs[1].set_data_from_numpy(data)
    grpc.infer("add_sub", inputs)
    for _ in range(2):
        _misbehave(client, "ok")
    for _ in range(3):
        with pytest.raises(InferenceServerException, match="the model refused this request"):
            _misbehave(client, "raise")

    text = scrape(metrics_server)
    tags = {"_app": "edge", "_team": "vision"}
    assert value(text, "nv_inference_request_success", model="add_sub", version="1", **tags) == 4
    assert value(text, "nv_inference_count", model="add_sub", **tags) == 1 + 3 + 2 + 2
    assert value(text, "nv_inference_exec_count", model="add_sub", **tags) == 4
    for reason in REASONS:
        assert value(text, "nv_inference_request_failure", model="add_sub", reason=reason) == 0
    assert value(text, "nv_inference_request_success", model="misbehave", version="1") == 2
    assert value(text, "nv_inference_request_failure", model="misbehave", reason="BACKEND") == 3
    for reason in ("REJECTED", "CANCELED", "OTHER"):
        assert value(text, "nv_inference_request_failure", model="misbehave", reason=reason) == 0
    assert value(text, "nv_inference_count", model="misbehave") == 2
    # A failed execution is an execution.
    assert value(text, "nv_inference_exec_count", model="misbehave") == 5
    assert value(text, "nv_inference_pending_request_count", model="add_sub") == 0
    for name in ("nv_inference_request_duration_us", "nv_inference_compute_infer_duration_us"):
        assert value(text, name, model="add_sub") > 0
        assert value(text, name, model="misbehave") > 0

    # One record: the statistics extension reports the same requests and nanoseconds.
    stats = client.get_inference_statistics("add_sub")["model_stats"][0]
    assert value(text, "nv_inference_request_success", model="add_sub") == stats["inference_stats"]["success"]["count"]
    for name, key in (
        ("nv_inference_request_duration_us", "success"),
        ("nv_inference_queue_duration_us", "queue"),
        ("nv_inference_compute_input_duration_us", "compute_input"),
        ("nv_inference_compute_infer_duration_us", "compute_infer"),
        ("nv_inference_compute_output_duration_us", "compute_output"),
    ):
        assert value(text, name, model="add_sub") == stats["inference_stats"][key]["ns"] // 1000
    misbehave = client.get_inference_statistics("misbehave")["model_stats"][0]["inference_stats"]
    assert misbehave["fail"]["count"] == 3
    # Failed requests' durations are not in the cumulative duration, as in Triton.
    assert value(text, "nv_inference_request_duration_us", model="misbehave") == misbehave["success"]["ns"] // 1000


def test_families_have_tritons_names_help_types_and_labels(metrics_server: Server) -> None:
    text = scrape(metrics_server)
    found = families(text)
    for name, (kind, help_text) in TRITON_FAMILIES.items():
        assert name in found, f"{name} is missing"
        assert found[name][:2] == (kind, help_text)
        # Triton's names exactly: no ``_total`` added to counters.
        assert f"# TYPE {name} {kind}\n" in text
    for name in (*DURATIONS, "nv_inference_request_success", "nv_inference_pending_request_count"):
        label_sets = {tuple(labels) for _, labels, _ in found[name][2]}
        assert label_sets == {("_app", "_team", "model", "version"), ("model", "version")}, name
    failures = found["nv_inference_request_failure"][2]
    assert sorted(labels["reason"] for _, labels, _ in failures if labels["model"] == "custom") == sorted(REASONS)
    # Labels are written sorted by name, as Triton writes them.
    assert 'nv_inference_count{_app="edge",_team="vision",model="add_sub",version="1"}' in text
    assert 'nv_inference_request_failure{model="custom",reason="BACKEND",version="1"}' in text
    # The optional families are off by default.
    for name in (*SUMMARIES, "nv_inference_first_response_histogram_ms"):
        assert name not in found


def test_cpu_gauges_and_gpu_and_npu_gauges_only_with_them(metrics_server: Server) -> None:
    text = scrape(metrics_server)
    assert 0 <= value(text, "nv_cpu_utilization") <= 1
    total, used = value(text, "nv_cpu_memory_total_bytes"), value(text, "nv_cpu_memory_used_bytes")
    memory = read_memory()
    assert memory is not None and total == memory[0]
    assert 0 < used < total
    nvml = Nvml.open()
    if nvml is None:
        for name in GPU_FAMILIES:
            assert name not in families(text)
    else:
        nvml.close()
        for name in GPU_FAMILIES:
            assert all("gpu_uuid" in labels for _, labels, _ in families(text)[name][2])
    # Intel NPUs' use is edged's own family, listed only where the kernel exposes an NPU's busy time.
    if all(npu.busy_us is None for npu in intel_npu_activity()):
        assert "edged_npu_utilization" not in families(text)
    else:  # listed once two readings have been taken, a poll after the daemon started
        npus = families(text).get("edged_npu_utilization", ("gauge", "", []))
        assert all("npu" in labels for _, labels, _ in npus[2])


def test_custom_metric_families_of_a_python_model(metrics_server: Server) -> None:
    client = httpclient.InferenceServerClient(metrics_server.http_url)
    # The families come from the model's initialize; give a loaded machine a moment to have them all exported.
    deadline = time.monotonic() + 10
    while 'custom_calls{mode="a"' not in scrape(metrics_server) and time.monotonic() < deadline:
        time.sleep(0.1)
    before = value(scrape(metrics_server), "custom_calls", mode="a")
    for x in (0.3, 2.0):
        _custom(client, x)
    text = scrape(metrics_server)
    found = families(text)
    assert found["custom_calls"][:2] == ("counter", "calls of custom")
    assert value(text, "custom_calls", mode="a", zz="1") == before + 4
    assert found["custom_level"][:2] == ("gauge", "level of custom")
    assert value(text, "custom_level", mode="b") == 2.0
    assert found["custom_latency"][:2] == ("histogram", "latency of custom")
    latency = {
        (name, labels.get("le", "")): v for name, labels, v in found["custom_latency"][2] if labels["mode"] == "c"
    }
    assert latency[("custom_latency_count", "")] - latency[("custom_latency_bucket", "+Inf")] == 0
    assert latency[("custom_latency_bucket", "+Inf")] >= 2
    # 0.3 is under the first bound, 2.0 only under the last: the buckets are cumulative.
    assert latency[("custom_latency_bucket", "0.5")] == latency[("custom_latency_bucket", "1")]
    assert latency[("custom_latency_bucket", "2.5")] - latency[("custom_latency_bucket", "1")] >= 1
    # A model's own families carry only its own labels, as in Triton.
    assert 'custom_calls{mode="a",zz="1"}' in text


# --- the endpoint and its flags -------------------------------------------------------------------------------


def test_other_methods_and_paths(metrics_server: Server) -> None:
    assert request(metrics_server.metrics_url, "POST", "/metrics", b"").status == 405
    for path in ("/not-metrics", "/", "/metrics/x"):
        reply = request(metrics_server.metrics_url, "GET", path)
        # Triton answers 200 with nothing on every path; edged says where the metrics are.
        assert (reply.status, reply.body) == (404, b"Not Found: metrics are served at /metrics\n"), path
    assert request(metrics_server.metrics_url, "GET", "/metrics/").status == 200


def test_allow_metrics_false_serves_no_endpoint(metrics_repository: Path) -> None:
    with run_server([metrics_repository], "--allow-metrics=false") as running:
        assert httpclient.InferenceServerClient(running.http_url).is_server_ready()
        with socket.socket() as sock, pytest.raises(ConnectionRefusedError):
            sock.connect(("127.0.0.1", running.metrics_port))


def test_metrics_config_switches_families(metrics_repository: Path) -> None:
    with run_server(
        [metrics_repository],
        "--metrics-config",
        "counter_latencies=false",
        "--metrics-config",
        "summary_latencies=true",
        "--metrics-config",
        "summary_quantiles=0.5:0.05,0.9:0.01",
        "--metrics-config=histogram_latencies=true",
        "--allow-cpu-metrics=false",
    ) as running:
        _add_sub(httpclient.InferenceServerClient(running.http_url), 2)
        text = scrape(running)
    found = families(text)
    for name in DURATIONS:
        assert name not in found
    # The request counters stay on without the latency counters.
    assert value(text, "nv_inference_request_success", model="add_sub") == 1
    assert value(text, "nv_inference_count", model="add_sub") == 2
    for name in SUMMARIES:
        assert found[name][0] == "summary"
        quantiles = {labels["quantile"] for _, labels, _ in found[name][2] if "quantile" in labels}
        assert quantiles == {"0.5", "0.9"}
    assert found["nv_inference_request_summary_us"][1] == (
        "Summary of inference request duration in microseconds (includes cached requests)"
    )
    histogram = found["nv_inference_first_response_histogram_ms"]
    assert histogram[0] == "histogram"
    bounds = [labels["le"] for _, labels, _ in histogram[2] if labels["model"] == "add_sub" and "le" in labels]
    assert bounds == ["100", "500", "2000", "5000", "+Inf"]
    for name in ("nv_cpu_utilization", "nv_cpu_memory_total_bytes", "nv_cpu_memory_used_bytes"):
        assert name not in found


def test_a_bad_metrics_config_is_refused(capsys: pytest.CaptureFixture[str], tmp_path: Path) -> None:
    for bad in ("summary_latencies=maybe", "no_such_setting=true", "summary_quantiles=0.5", "histogram_latencies"):
        assert main(["serve", "--model-repository", str(tmp_path), "--metrics-config", bad]) == 1
        assert capsys.readouterr().err.startswith("edged: --metrics-config")


def test_parse_metrics_config() -> None:
    config = parse_metrics_config(["summary_latencies=true", 'summary_quantiles="0.5:0.05,0.99:0.001"'])
    assert config.summary_latencies and config.counter_latencies and not config.histogram_latencies
    assert config.summary_quantiles == ((0.5, 0.05), (0.99, 0.001))
    assert parse_metrics_config(["counter_latencies=false"]).counter_latencies is False
    assert parse_metrics_config([]).summary_quantiles[0] == (0.5, 0.05)


# --- units ----------------------------------------------------------------------------------------------------


def test_the_scheduler_hooks_feed_summaries_and_histograms() -> None:
    recorder = LatencyRecorder()
    stats = ModelStatistics("m", 1)
    recorder.observe_request(stats, 5_000, 1_000, ExecutionTiming(1_000, 2_000, 3_000))
    assert recorder.summaries_of(("m", 1))[0].count == 0  # off until configured
    recorder.configure(parse_metrics_config(["summary_latencies=true", "histogram_latencies=true"]))
    for request_us in (10, 20, 30, 40):
        recorder.observe_request(stats, request_us * 1000, 1_000, ExecutionTiming(1_000, 2_000, 3_000))
    request, queue, *_ = recorder.summaries_of(("m", 1))
    assert (request.count, request.sum) == (4, 100.0)
    assert (queue.count, queue.sum) == (4, 4.0)
    assert request.quantiles(((0.5, 0.05), (0.9, 0.01)), 0.0) == [20.0, 40.0]
    recorder.observe_first_response(stats, 150_000_000)  # 150 ms
    histogram = recorder.histogram_of(("m", 1), (100.0, 500.0, 2000.0, 5000.0))
    assert histogram.counts == [0, 1, 0, 0, 0] and histogram.sum == 150.0


def test_custom_histogram_buckets_are_cumulative() -> None:
    family = CustomMetricFamily(
        "h", "a histogram", "histogram", [CustomMetric({"b": "2", "a": "1"}, 7.0, 3, [1.0, 5.0], [1, 1, 1])]
    )
    text = render([custom_family(family)]).decode()
    assert text == (
        "# HELP h a histogram\n# TYPE h histogram\n"
        'h_count{a="1",b="2"} 3\nh_sum{a="1",b="2"} 7\n'
        'h_bucket{a="1",b="2",le="1"} 1\nh_bucket{a="1",b="2",le="5"} 2\nh_bucket{a="1",b="2",le="+Inf"} 3\n'
    )


def test_exposition_escapes_and_formats_numbers() -> None:
    family = Family("g", 'line\\one\nline two "quoted"', "gauge")
    family.add((("path", 'C:\\x "y"\n'),), 0.25)
    family.add((), math.inf)
    text = render([family]).decode()
    assert text.splitlines() == [
        '# HELP g line\\\\one\\nline two "quoted"',
        "# TYPE g gauge",
        'g{path="C:\\\\x \\"y\\"\\n"} 0.25',
        "g +Inf",
    ]
    parsed = next(iter(text_string_to_metric_families(text)))
    assert parsed.samples[0].labels == {"path": 'C:\\x "y"\n'}


def test_proc_readers() -> None:
    times = read_cpu_times()
    assert times is not None and 0 <= times.busy <= times.total
