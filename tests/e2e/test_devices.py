"""Instance groups on devices: Triton's instance names, kinds and device ids, refusals of devices this machine
lacks (with Triton's messages), NPUs from a device plug-in, and N instances running N batches at once. Intel NPUs
and their use (busy time over wall time) from a stand-in sysfs tree, with an injected clock, up to the console's
Device card and the metrics endpoint's gauge.

The Python test model ``where`` answers each request with the ``args`` its instance was initialized with. A
request with the parameter ``together: N`` first waits until N instances are executing at the same time (each
arriving instance leaves a file in a folder for that round), so a round of N requests completes only if N
different instances run them at once: nothing here depends on timing.
"""

from __future__ import annotations

import asyncio
import ctypes
import subprocess
import sys
import threading
import uuid
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import modelgen
import numpy as np
import pytest
import tritonclient.http as httpclient
from prometheus_client import CollectorRegistry, generate_latest
from server import REPO_ROOT, Server, run_server

from edged.backends import BackendRegistry
from edged.backends.onnxruntime import OnnxRuntimeInstance
from edged.core import devices
from edged.core.config.defaults import normalize_model_config
from edged.core.config.model_config import parse_model_config
from edged.core.config.validation import validate_instance_groups
from edged.core.devices import Device, DeviceInventory, instance_placements
from edged.core.metrics_history import MetricsHistory, NpuSample
from edged.core.repository.manager import ManagerOptions, ModelRepositoryManager
from edged.core.request.inference import InferInput, InferRequest, InferResponse
from edged.errors import EdgedError
from edged.frontends.console.app import web_root
from edged.frontends.console.figures import device_figures
from edged.frontends.console.templates import LazyJinja
from edged.frontends.metrics.system import DeviceReader, SystemMetrics

MEET_TIMEOUT_S = 30  # only ever reached when instances fail to run together, which fails the test

WHERE_MODEL = """
import json
import os
import time

import triton_python_backend_utils as pb_utils


class TritonPythonModel:
    def initialize(self, args):
        self.args = {key: value for key, value in args.items() if key != "model_config"}
        config = json.loads(args["model_config"])
        self.meeting_dir = config["parameters"]["meeting_dir"]["string_value"]

    def execute(self, requests):
        responses = []
        for request in requests:
            parameters = json.loads(request.parameters())
            if parameters.get("together"):
                self._meet(str(parameters["round"]), int(parameters["together"]))
            out = pb_utils.Tensor("OUT", request.inputs()[0].as_numpy())
            responses.append(pb_utils.InferenceResponse(output_tensors=[out], parameters=self.args))
        return responses

    def _meet(self, round_name, count):
        folder = os.path.join(self.meeting_dir, round_name)
        os.makedirs(folder, exist_ok=True)
        open(os.path.join(folder, str(os.getpid())), "w").close()
        deadline = time.monotonic() + MEET_TIMEOUT_S
        while len(os.listdir(folder)) < count:
            if time.monotonic() > deadline:
                raise pb_utils.TritonModelException(f"only {len(os.listdir(folder))} of {count} instances met")
            time.sleep(0.01)
""".replace("MEET_TIMEOUT_S", str(MEET_TIMEOUT_S))


def _write_where(repo: Path, name: str, groups: str, meeting_dir: Path) -> None:
    (repo / name / "1").mkdir(parents=True)
    (repo / name / "1" / "model.py").write_text(WHERE_MODEL, encoding="utf-8")
    (repo / name / "config.pbtxt").write_text(
        f'name: "{name}"\nbackend: "python"\nmax_batch_size: 0\n'
        'input [ { name: "IN" data_type: TYPE_FP32 dims: [ 1 ] } ]\n'
        'output [ { name: "OUT" data_type: TYPE_FP32 dims: [ 1 ] } ]\n'
        f"instance_group [ {groups} ]\n"
        f'parameters {{ key: "meeting_dir" value: {{ string_value: "{meeting_dir}" }} }}\n',
        encoding="utf-8",
    )


def _meet(server: Server, model: str, count: int) -> set[tuple[str, str, str]]:
    """Sends ``count`` requests that each wait for ``count`` instances to run at once; returns what each
    instance says it is: (model_instance_name, model_instance_kind, model_instance_device_id)."""
    client = httpclient.InferenceServerClient(server.http_url, concurrency=count, network_timeout=60.0)
    try:
        tensor = httpclient.InferInput("IN", [1], "FP32")
        tensor.set_data_from_numpy(np.array([1.0], dtype=np.float32))
        parameters = {"together": count, "round": uuid.uuid4().hex}
        pending = [client.async_infer(model, [tensor], parameters=parameters) for _ in range(count)]
        seen = []
        for call in pending:
            args = call.get_result().get_response()["parameters"]
            seen.append((args["model_instance_name"], args["model_instance_kind"], args["model_instance_device_id"]))
    finally:
        client.close()
    assert len(set(seen)) == count, f"{count} requests ran on fewer instances: {seen}"
    return set(seen)


# Configs Triton refuses on a machine without GPUs, each with the reason Triton 2.51 gives (asked of a real one).
REFUSED: dict[str, tuple[str, str]] = {
    "gpu_any": (
        "{ count: 1 kind: KIND_GPU }",
        "Invalid argument: instance group gpu_any_0 of model gpu_any has kind KIND_GPU but no GPUs are available",
    ),
    "gpu_seven": (
        "{ count: 1 kind: KIND_GPU gpus: [ 7 ] }",
        "Invalid argument: instance group gpu_seven_0 of model gpu_seven specifies invalid or unsupported gpu id 7. "
        "GPUs with at least the minimum required CUDA compute compatibility of 6.000000 are: ",
    ),
    "auto_seven": (
        "{ kind: KIND_AUTO gpus: [ 7 ] }",
        "Invalid argument: instance group auto_seven_0 of model auto_seven has kind KIND_CPU but specifies one or "
        "more GPUs",
    ),
    "cpu_gpus": (
        "{ kind: KIND_CPU gpus: [ 0 ] }",
        "Invalid argument: instance group cpu_gpus_0 of model cpu_gpus has kind KIND_CPU but specifies one or more "
        "GPUs",
    ),
    "model_gpus": (
        "{ kind: KIND_MODEL gpus: [ 0 ] }",
        "Invalid argument: instance group model_gpus_0 of model model_gpus has kind KIND_MODEL but specifies one "
        "or more GPUs",
    ),
}


@pytest.fixture(scope="module")
def devices_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Server]:
    repo = tmp_path_factory.mktemp("devices-repository")
    meeting_dir = tmp_path_factory.mktemp("meetings")
    _write_where(
        repo,
        "where",
        '{ count: 2 kind: KIND_CPU }, { name: "named" count: 1 kind: KIND_MODEL }, { kind: KIND_AUTO }',
        meeting_dir,
    )
    for name, (groups, _) in REFUSED.items():
        _write_where(repo, name, groups, meeting_dir)
    # An ONNX model asking for a GPU is refused by the same check, before onnxruntime is asked for CUDA.
    modelgen.write_add_sub(repo / "onnx_gpu", max_batch_size=8, dims=16, dtype="FP32")
    config = repo / "onnx_gpu" / "config.pbtxt"
    text = config.read_text(encoding="utf-8").replace('name: "add_sub"', 'name: "onnx_gpu"')
    config.write_text(text + "instance_group [ { count: 2 kind: KIND_GPU gpus: [ 0 ] } ]\n", encoding="utf-8")
    with run_server([repo]) as running:
        yield running


def test_several_instance_groups_get_tritons_names_kinds_and_device_ids(devices_server: Server) -> None:
    # Triton 2.51 names instances <group name>_<index> in every group (named_0 even for a count of 1), gives
    # unnamed groups <model>_<group index>, and passes KIND_MODEL and CPU instances device id 0.
    assert _meet(devices_server, "where", 4) == {
        ("where_0_0", "CPU", "0"),
        ("where_0_1", "CPU", "0"),
        ("named_0", "MODEL", "0"),
        ("where_2_0", "CPU", "0"),
    }
    config = httpclient.InferenceServerClient(devices_server.http_url).get_model_config("where")
    assert [(g["name"], g["kind"], g["count"]) for g in config["instance_group"]] == [
        ("where_0", "KIND_CPU", 2),
        ("named", "KIND_MODEL", 1),
        ("where_2", "KIND_CPU", 1),
    ]


def test_groups_asking_for_absent_gpus_make_the_model_unavailable_with_tritons_reason(devices_server: Server) -> None:
    client = httpclient.InferenceServerClient(devices_server.http_url)
    index = {entry["name"]: entry for entry in client.get_model_repository_index()}
    for name, (_, reason) in REFUSED.items():
        assert index[name]["state"] == "UNAVAILABLE", name
        assert index[name]["reason"] == reason
        assert not client.is_model_ready(name)
    assert index["onnx_gpu"]["state"] == "UNAVAILABLE"
    assert index["onnx_gpu"]["reason"] == (
        "Invalid argument: instance group onnx_gpu_0 of model onnx_gpu specifies invalid or unsupported gpu id 0. "
        "GPUs with at least the minimum required CUDA compute compatibility of 6.000000 are: "
    )
    # The others keep serving.
    assert index["where"]["state"] == "READY"
    assert client.is_model_ready("where")


PLUGIN_MODULE = """
from edged.core.devices import Device


def devices():
    # NPUs 2 and 5: ids that no default (0) could produce.
    return [Device("NPU", 5, "test NPU"), Device("NPU", 2, "test NPU"), "not a device"]


def broken():
    raise RuntimeError("driver not loaded")
"""
PLUGIN_ENTRY_POINTS = "[edged.devices]\ntest_npu = test_npu_plugin:devices\nbroken = test_npu_plugin:broken\n"


@pytest.fixture
def npu_plugin(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """An installed device plug-in as an appliance ships one: a module and a distribution declaring an
    ``edged.devices`` entry point, found on the daemon's import path."""
    site = tmp_path / "site"
    (site / "test_npu_plugin-1.0.dist-info").mkdir(parents=True)
    (site / "test_npu_plugin.py").write_text(PLUGIN_MODULE, encoding="utf-8")
    info = site / "test_npu_plugin-1.0.dist-info"
    (info / "METADATA").write_text("Metadata-Version: 2.1\nName: test-npu-plugin\nVersion: 1.0\n", encoding="utf-8")
    (info / "entry_points.txt").write_text(PLUGIN_ENTRY_POINTS, encoding="utf-8")
    monkeypatch.setenv("PYTHONPATH", str(site))
    return site


def test_npu_plugin_gives_python_instances_their_npus(npu_plugin: Path, tmp_path: Path) -> None:
    repo = tmp_path / "repo"
    _write_where(repo, "on_npus", "{ count: 2 kind: KIND_MODEL }, { count: 1 kind: KIND_CPU }", tmp_path / "meet")
    with run_server([repo]) as server:
        # Both NPUs run a batch at once, while the CPU instance keeps Triton's device id 0.
        assert _meet(server, "on_npus", 3) == {
            ("on_npus_0_0", "MODEL", "2"),
            ("on_npus_0_1", "MODEL", "5"),
            ("on_npus_1_0", "CPU", "0"),
        }
        log = server.log()
    assert "NPUs: 2 (test NPU), 5 (test NPU)" in log
    assert "device plug-in 'broken' (test_npu_plugin:broken) failed: RuntimeError: driver not loaded" in log
    printed = subprocess.run(
        [sys.executable, "-m", "edged", "devices"], capture_output=True, text=True, check=True, cwd=REPO_ROOT
    )
    assert printed.stdout.strip().endswith("GPUs: none; NPUs: 2 (test NPU), 5 (test NPU)")


def test_two_onnx_cpu_instances_run_two_requests_at_once(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    modelgen.write_add_sub(tmp_path / "add_sub", max_batch_size=8, dims=16, dtype="FP32")
    config = tmp_path / "add_sub" / "config.pbtxt"
    config.write_text(
        config.read_text(encoding="utf-8") + "instance_group [ { count: 2 kind: KIND_CPU } ]\n", encoding="utf-8"
    )
    # Each execution waits for a second one to be running: two requests complete only on two instances at once.
    meeting = threading.Barrier(2, timeout=MEET_TIMEOUT_S)
    ran: list[str] = []
    execute = OnnxRuntimeInstance.execute

    def meet_then_execute(self: OnnxRuntimeInstance, requests: Any, timing: Any) -> Any:
        ran.append(self.name)
        meeting.wait()
        return execute(self, requests, timing)

    monkeypatch.setattr(OnnxRuntimeInstance, "execute", meet_then_execute)

    def request(value: float) -> InferRequest:
        data = np.full((1, 16), value, dtype=np.float32)
        inputs = [InferInput("INPUT0", "FP32", (1, 16), data), InferInput("INPUT1", "FP32", (1, 16), data)]
        return InferRequest("add_sub", -1, str(value), inputs)

    async def run() -> tuple[Any, ...]:
        with ThreadPoolExecutor(4) as executor:
            manager = ModelRepositoryManager(ManagerOptions([tmp_path]), executor, BackendRegistry({}))
            await manager.load_all()
            version = manager.get_ready("add_sub", -1)
            assert version.backend_model is not None and version.scheduler is not None
            assert [i.name for i in version.backend_model.instances] == ["add_sub_0_0", "add_sub_0_1"]
            try:
                scheduler = version.scheduler
                return tuple(await asyncio.gather(scheduler.enqueue(request(1.0)), scheduler.enqueue(request(2.0))))
            finally:
                await manager.unload_all()

    responses = asyncio.run(run())
    assert sorted(ran) == ["add_sub_0_0", "add_sub_0_1"]
    for response, value in zip(responses, (1.0, 2.0), strict=True):
        assert isinstance(response, InferResponse)
        assert np.array_equal(response.outputs[0].data, np.full((1, 16), 2 * value, dtype=np.float32))


# --- the inventory and placement, without a daemon ----------------------------------------------------------


def _normalised(groups: str, gpus: list[int], backend: str = "python") -> Any:
    config = parse_model_config(f'name: "m"\nbackend: "{backend}"\ninstance_group [ {groups} ]\n', "config.pbtxt")
    normalize_model_config(config, gpus)
    validate_instance_groups(config, gpus)
    return config


def test_gpu_groups_place_each_index_on_every_listed_gpu_as_triton_does() -> None:
    inventory = DeviceInventory(4, gpus=(Device("GPU", 0), Device("GPU", 1)))
    config = _normalised("{ count: 2 kind: KIND_GPU gpus: [ 1, 0 ] }, { kind: KIND_AUTO }", inventory.gpu_ids)
    placed = [(p.name, p.kind, p.device_id) for p in instance_placements(config, inventory)]
    assert placed == [
        ("m_0_0", "GPU", 1),
        ("m_0_0", "GPU", 0),
        ("m_0_1", "GPU", 1),
        ("m_0_1", "GPU", 0),
        # KIND_AUTO with GPUs present means every GPU.
        ("m_1_0", "GPU", 0),
        ("m_1_0", "GPU", 1),
    ]


def test_a_missing_gpu_is_named_with_the_gpus_there_are() -> None:
    with pytest.raises(EdgedError) as raised:
        _normalised("{ kind: KIND_GPU gpus: [ 0, 3 ] }", [0, 1])
    assert raised.value.message == (
        "instance group m_0 of model m specifies invalid or unsupported gpu id 3. GPUs with at least the minimum "
        "required CUDA compute compatibility of 6.000000 are: 0, 1"
    )


def test_kind_model_instances_take_npus_in_turn_across_groups() -> None:
    inventory = DeviceInventory(4, npus=(Device("NPU", 0), Device("NPU", 1)))
    config = _normalised('{ count: 3 kind: KIND_MODEL }, { kind: KIND_CPU }, { name: "x" kind: KIND_MODEL }', [])
    placed = [(p.name, p.kind, p.device_id) for p in instance_placements(config, inventory)]
    assert placed == [
        ("m_0_0", "MODEL", 0),
        ("m_0_1", "MODEL", 1),
        ("m_0_2", "MODEL", 0),
        ("m_1_0", "CPU", 0),
        ("x_0", "MODEL", 1),
    ]


class _FakeNvml:
    """NVML as ctypes shows it, for GPUs this machine does not have: (uuid, name, compute capability)."""

    def __init__(self, gpus: list[tuple[str, str, tuple[int, int]]]) -> None:
        self.gpus = gpus
        self.shut_down = False

    def nvmlInit_v2(self) -> int:
        return 0

    def nvmlShutdown(self) -> int:
        self.shut_down = True
        return 0

    def nvmlDeviceGetCount_v2(self, count: Any) -> int:
        count._obj.value = len(self.gpus)
        return 0

    def nvmlDeviceGetHandleByIndex_v2(self, index: int, handle: Any) -> int:
        handle._obj.value = index + 1
        return 0

    def nvmlDeviceGetUUID(self, handle: Any, buffer: Any, size: int) -> int:
        buffer.value = self.gpus[handle.value - 1][0].encode()
        return 0

    def nvmlDeviceGetName(self, handle: Any, buffer: Any, size: int) -> int:
        buffer.value = self.gpus[handle.value - 1][1].encode()
        return 0

    def nvmlDeviceGetCudaComputeCapability(self, handle: Any, major: Any, minor: Any) -> int:
        major._obj.value, minor._obj.value = self.gpus[handle.value - 1][2]
        return 0


def test_nvml_gpus_follow_cuda_visible_devices_and_skip_old_gpus(monkeypatch: pytest.MonkeyPatch) -> None:
    fake = _FakeNvml(
        [("GPU-aaaa", "NVIDIA A", (8, 6)), ("GPU-bbbb", "NVIDIA Old", (5, 2)), ("GPU-cccc", "NVIDIA C", (9, 0))]
    )
    monkeypatch.setattr(ctypes, "CDLL", lambda name: fake)
    monkeypatch.delenv("CUDA_VISIBLE_DEVICES", raising=False)
    assert [(g.id, g.name) for g in devices.nvml_gpus()] == [(0, "NVIDIA A"), (2, "NVIDIA C")]
    assert fake.shut_down
    # CUDA renumbers what it is shown, in the order shown, up to the first entry that names no GPU.
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "GPU-cc,0,7,1")
    assert [(g.id, g.name) for g in devices.nvml_gpus()] == [(0, "NVIDIA C"), (1, "NVIDIA A")]
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "")
    assert devices.nvml_gpus() == []


def test_no_nvml_library_means_no_gpus() -> None:
    assert devices.nvml_gpus("libedged-no-such-library.so.1") == []


def _accel(sysfs: Path, index: int, driver: str, pci_id: str) -> None:
    """An accel device as the kernel lays it out: class entry -> PCI device, whose driver link names the driver."""
    pci = sysfs / "devices" / "pci0000:00" / f"0000:00:{index:02x}.0"
    (pci / "accel").mkdir(parents=True)
    (pci / "device").write_text(f"{pci_id}\n", encoding="ascii")
    drivers = sysfs / "bus" / "pci" / "drivers" / driver
    drivers.mkdir(parents=True, exist_ok=True)
    (pci / "driver").symlink_to(drivers)
    node = pci / "accel" / f"accel{index}"
    node.mkdir()
    (node / "device").symlink_to(pci)
    (sysfs / "class" / "accel").mkdir(parents=True, exist_ok=True)
    (sysfs / "class" / "accel" / f"accel{index}").symlink_to(node)


def test_intel_npus_are_the_accel_devices_of_the_intel_vpu_driver(tmp_path: Path) -> None:
    _accel(tmp_path, 10, "intel_vpu", "0x1234")  # a generation newer than this list: named by its PCI id
    _accel(tmp_path, 2, "intel_vpu", "0x643e")
    _accel(tmp_path, 0, "habanalabs", "0x1020")  # an accel device of another driver is not an Intel NPU
    _accel(tmp_path, 1, "intel_vpu", "0x7d1d")
    found = devices.intel_npus(tmp_path)
    # Numbered in the order of the accel nodes (numerically: accel10 after accel2).
    assert [(d.kind, d.id, d.name) for d in found] == [
        ("NPU", 0, "Intel NPU (Meteor Lake)"),
        ("NPU", 1, "Intel NPU (Lunar Lake)"),
        ("NPU", 2, "Intel NPU (PCI 0x1234)"),
    ]
    inventory = DeviceInventory.discover(tmp_path)
    assert inventory.npus == tuple(found)
    assert "NPUs: 0 (Intel NPU (Meteor Lake)), 1 (Intel NPU (Lunar Lake)), 2 (Intel NPU (PCI 0x1234))" in (
        inventory.describe()
    )


def test_no_accel_class_or_a_broken_entry_means_no_intel_npus(tmp_path: Path) -> None:
    assert devices.intel_npus(tmp_path) == []
    _accel(tmp_path, 0, "intel_vpu", "not-hex")
    _accel(tmp_path, 1, "intel_vpu", "0xad1d")
    (tmp_path / "class" / "accel" / "accel7").mkdir()  # no device link
    assert [(d.id, d.name) for d in devices.intel_npus(tmp_path)] == [(0, "Intel NPU (Arrow Lake)")]


def _npu_files(sysfs: Path, accel: int, **values: str) -> None:
    """Writes the intel_vpu driver's attributes (``npu_busy_time_us`` ...) where the kernel has them: on the PCI
    device of ``accel<N>``."""
    for name, value in values.items():
        (sysfs / "class" / "accel" / f"accel{accel}" / "device" / name).write_text(f"{value}\n", encoding="ascii")


class _Clock:
    def __init__(self) -> None:
        self.now = 500.0

    def __call__(self) -> float:
        return self.now


def test_intel_npu_activity_reads_what_the_kernel_exposes(tmp_path: Path) -> None:
    _accel(tmp_path, 0, "intel_vpu", "0x7d1d")
    _accel(tmp_path, 1, "intel_vpu", "0x643e")  # a kernel without any of the files
    _accel(tmp_path, 2, "intel_vpu", "0xad1d")
    _npu_files(tmp_path, 0, npu_busy_time_us="1250000", npu_current_frequency_mhz="1400", npu_max_frequency_mhz="1850")
    _npu_files(tmp_path, 2, npu_busy_time_us="garbage", npu_current_frequency_mhz="-1")
    found = devices.intel_npu_activity(tmp_path)
    assert [(a.npu.id, a.npu.name, a.busy_us, a.frequency_mhz, a.max_frequency_mhz) for a in found] == [
        (0, "Intel NPU (Meteor Lake)", 1_250_000, 1400, 1850),
        (1, "Intel NPU (Lunar Lake)", None, None, None),
        (2, "Intel NPU (Arrow Lake)", None, None, None),
    ]
    assert devices.intel_npu_activity(tmp_path / "no-sysfs") == []


def test_npu_use_is_busy_time_over_monotonic_time_between_readings(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    _accel(tmp_path, 0, "intel_vpu", "0x7d1d")
    _accel(tmp_path, 1, "intel_vpu", "0x643e")  # its kernel exposes no busy time
    _npu_files(tmp_path, 0, npu_busy_time_us="1000000", npu_max_frequency_mhz="1850")
    clock = _Clock()
    reader = DeviceReader(cpu=False, gpu=False, sysfs=tmp_path, monotonic=clock)
    # Two seconds later the driver counted 0.74 s more busy time: 37 %.
    clock.now += 2.0
    _npu_files(tmp_path, 0, npu_busy_time_us="1740000", npu_current_frequency_mhz="1400")
    sample = reader.read()
    assert sample.npus == (
        NpuSample(0, "Intel NPU (Meteor Lake)", 0.37, 1400, 1850),
        NpuSample(1, "Intel NPU (Lunar Lake)", None, None, None),
    )
    # The driver asks for readings at most about once a second: one sooner answers the previous again.
    clock.now += 0.1
    _npu_files(tmp_path, 0, npu_busy_time_us="1800000")
    assert reader.read().npus == sample.npus
    # More busy time than wall time (the counter and the clock are read at slightly different moments): 100 %.
    clock.now += 0.9
    _npu_files(tmp_path, 0, npu_busy_time_us="3000000")
    assert reader.read().npus[0].utilization == 1.0
    # A busy time that went back (the driver was reloaded) is no share; the next reading counts from it.
    clock.now += 1.0
    _npu_files(tmp_path, 0, npu_busy_time_us="100000")
    assert reader.read().npus[0].utilization is None
    clock.now += 1.0
    _npu_files(tmp_path, 0, npu_busy_time_us="100000")
    assert reader.read().npus[0].utilization == 0.0
    # A file that is gone is "not known", every time, and nothing is logged.
    (tmp_path / "class" / "accel" / "accel0" / "device" / "npu_busy_time_us").unlink()
    for _ in range(3):
        clock.now += 1.0
        assert reader.read().npus[0].utilization is None
    assert caplog.records == []
    reader.close()


def test_npu_use_reaches_the_device_card_and_the_metrics_endpoint(tmp_path: Path) -> None:
    _accel(tmp_path, 0, "intel_vpu", "0x7d1d")
    _accel(tmp_path, 1, "intel_vpu", "0x643e")
    _npu_files(tmp_path, 0, npu_busy_time_us="1000000", npu_max_frequency_mhz="1850")
    clock = _Clock()
    reader = DeviceReader(cpu=False, gpu=False, sysfs=tmp_path, monotonic=clock)
    registry = CollectorRegistry()
    system = SystemMetrics(cpu=False, gpu=False, interval_ms=1000, registry=registry, sysfs=tmp_path, monotonic=clock)
    assert b"edged_npu_utilization" not in generate_latest(registry)  # nothing read yet: no family, as for GPUs
    history = MetricsHistory(list, capacity=4, clock=lambda: clock.now + 1e9, monotonic=clock)
    clock.now += 2.0
    _npu_files(tmp_path, 0, npu_busy_time_us="1740000", npu_current_frequency_mhz="1400")
    history.sample(reader.read())
    system.poll()

    service: Any = SimpleNamespace(metrics_history=history.history)
    figures = device_figures(service, now=clock.now + 1e9)
    card = (
        LazyJinja(web_root() / "templates").get_template("overview_device.html").render(conditions=None, device=figures)
    )
    assert "<dt>NPU 0 (Intel NPU (Meteor Lake))</dt>\n    <dd>37 % busy, at 1400 of 1850 MHz</dd>" in card
    assert '<dt>NPU 1 (Intel NPU (Lunar Lake))</dt>\n    <dd class="muted">use not readable</dd>' in card

    scraped = generate_latest(registry).decode()
    assert "# TYPE edged_npu_utilization gauge" in scraped
    assert 'edged_npu_utilization{npu="0"} 0.37' in scraped
    assert 'npu="1"' not in scraped  # its use is not known: no sample rather than a made-up one
    system.stop()
    reader.close()
