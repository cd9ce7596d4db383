"""The readers behind the console's Health and Device cards and a model's memory: /proc and /sys as fake trees in
tmp_path (the kernels' formats, the files that may be missing), and once against this machine."""

from __future__ import annotations

import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest

from edged.core.device_conditions import DeviceConditionsReader, disk_space
from edged.core.metrics_history import DeviceSample, MetricsHistory
from edged.core.model_memory import model_memory
from edged.core.processes import (
    CLOCK_TICKS,
    PAGE_SIZE,
    ProcessTreeUsage,
    process_tree,
    read_stat,
    tree_memory,
)
from edged.core.repository.manager import ModelState
from edged.core.sensors import read_temperatures
from edged.frontends.console.figures import celsius, percent
from edged.frontends.metrics.system import DeviceReader


def _process(
    proc: Path, pid: int, ppid: int, *, ticks: tuple[int, int] = (0, 0), rss_pages: int = 0, comm: str = "python3"
) -> None:
    """A /proc/<pid> with its stat line (52 fields, as Linux 6 writes them) and its main thread."""
    fields = ["S", str(ppid)] + ["0"] * 9 + [str(ticks[0]), str(ticks[1])] + ["0"] * 8 + [str(rss_pages)]
    fields += ["0"] * (50 - len(fields))
    folder = proc / str(pid)
    (folder / "task" / str(pid)).mkdir(parents=True, exist_ok=True)
    (folder / "stat").write_text(f"{pid} ({comm}) {' '.join(fields)}\n")


def _children(proc: Path, pid: int, tid: int, *children: int) -> None:
    task = proc / str(pid) / "task" / str(tid)
    task.mkdir(parents=True, exist_ok=True)
    (task / "children").write_text("".join(f"{child} " for child in children))


@pytest.fixture
def proc(tmp_path: Path) -> Path:
    """The daemon (100) with two threads; a stub (200) started by the second thread, with a child of its own (300);
    a frontend worker (400); and a process that is none of edged's (500)."""
    root = tmp_path / "proc"
    _process(root, 100, 1, ticks=(50, 10), rss_pages=1000, comm="edged (main) x")
    _process(root, 200, 100, ticks=(5, 5), rss_pages=300)
    _process(root, 300, 200, ticks=(1, 0), rss_pages=30)
    _process(root, 400, 100, ticks=(2, 2), rss_pages=200)
    _process(root, 500, 1, ticks=(900, 900), rss_pages=9000)
    _children(root, 100, 100, 400)
    _children(root, 100, 101, 200)
    _children(root, 200, 200, 300)
    _children(root, 300, 300)
    _children(root, 400, 400)
    _children(root, 500, 500)
    return root


def test_a_stat_line_is_read_whatever_the_command_name_holds(proc: Path) -> None:
    stat = read_stat(100, proc)
    assert stat is not None
    assert (stat.pid, stat.ppid, stat.cpu_ticks, stat.rss_bytes) == (100, 1, 60, 1000 * PAGE_SIZE)
    assert read_stat(999, proc) is None  # gone
    (proc / "600").mkdir()
    (proc / "600" / "stat").write_text("600 (cut")
    assert read_stat(600, proc) is None  # unreadable: left out, no error


def test_the_process_tree_follows_every_threads_children(proc: Path) -> None:
    assert sorted(process_tree(100, proc)) == [100, 200, 300, 400]
    assert process_tree(100, proc)[0] == 100
    assert process_tree(999, proc) == []
    assert tree_memory(200, proc) == 330 * PAGE_SIZE
    assert tree_memory(999, proc) is None


def test_without_children_files_the_tree_comes_from_every_processs_parent(proc: Path) -> None:
    for children in proc.glob("*/task/*/children"):
        children.unlink()
    assert sorted(process_tree(100, proc)) == [100, 200, 300, 400]


def test_the_trees_cpu_is_a_share_of_every_cpu_between_readings(proc: Path) -> None:
    now = [10.0]
    usage = ProcessTreeUsage(100, proc, cpu_count=4, monotonic=lambda: now[0])
    first = usage.read()
    assert first.cpu_utilization is None  # nothing to compare with yet
    assert first.rss_bytes == 1530 * PAGE_SIZE and first.processes == 4
    # Two seconds later the daemon spent one second of CPU and a new child half a second: 1.5 s of 8 CPU-seconds.
    _process(proc, 100, 1, ticks=(50 + CLOCK_TICKS, 10), rss_pages=1000)
    _process(proc, 700, 100, ticks=(CLOCK_TICKS // 2, 0), rss_pages=10)
    _children(proc, 100, 100, 400, 700)
    _children(proc, 700, 700)
    now[0] += 2.0
    second = usage.read()
    assert second.cpu_utilization == pytest.approx(1.5 / 8, abs=0.01)
    assert second.rss_bytes == 1540 * PAGE_SIZE and second.processes == 5


def test_temperatures_from_thermal_zones_and_hwmon(tmp_path: Path) -> None:
    sysfs = tmp_path / "sys"
    thermal = sysfs / "class" / "thermal"
    for number, kind, value in ((0, "acpitz", "27800"), (10, "x86_pkg_temp", "51000"), (2, "iwlwifi_1", "")):
        zone = thermal / f"thermal_zone{number}"
        zone.mkdir(parents=True)
        (zone / "type").write_text(kind + "\n")
        (zone / "temp").write_text(value + "\n")
    (thermal / "cooling_device0").mkdir()  # not a zone
    monitor = sysfs / "class" / "hwmon" / "hwmon1"
    monitor.mkdir(parents=True)
    (monitor / "name").write_text("coretemp\n")
    (monitor / "temp1_input").write_text("48000\n")
    (monitor / "temp1_label").write_text("Package id 0\n")
    (monitor / "temp2_input").write_text("45500\n")  # no label: the monitor's name alone
    (monitor / "temp3_input").write_text("-274000\n")  # below absolute zero: no reading
    found = read_temperatures(sysfs)
    assert [(t.source, t.name, t.celsius) for t in found] == [
        ("thermal_zone0", "acpitz", 27.8),
        ("thermal_zone10", "x86_pkg_temp", 51.0),
        ("hwmon1/temp1", "coretemp Package id 0", 48.0),
        ("hwmon1/temp2", "coretemp", 45.5),
    ]
    assert len(read_temperatures(sysfs, limit=2)) == 2
    assert read_temperatures(tmp_path / "empty") == []  # a container: no thermal class, no hwmon


def test_disk_space_names_each_folder_and_survives_a_missing_one(tmp_path: Path) -> None:
    state = disk_space("state directory", tmp_path)
    assert state.path == str(tmp_path) and state.free_bytes is not None and state.total_bytes is not None
    assert 0 <= state.free_bytes <= state.total_bytes
    gone = disk_space("model repository", tmp_path / "gone")
    assert (gone.free_bytes, gone.total_bytes) == (None, None)


def test_conditions_are_read_again_only_after_their_age(tmp_path: Path) -> None:
    now = [0.0]
    repositories = [tmp_path / "models"]
    reader = DeviceConditionsReader(tmp_path, lambda: repositories, sysfs=tmp_path, monotonic=lambda: now[0])
    first = reader.read()
    assert [(d.role, d.path) for d in first.disks] == [
        ("state directory", str(tmp_path)),
        ("model repository", str(tmp_path / "models")),
    ]
    assert first.temperatures == ()
    repositories.append(tmp_path / "more")
    now[0] += 1.0
    assert reader.read() is first
    now[0] += 10.0
    assert len(reader.read().disks) == 3
    assert DeviceConditionsReader(None, list, sysfs=tmp_path).read().disks == ()


@dataclass
class _Model:
    processes: list[tuple[str, int]]

    def instance_processes(self) -> list[tuple[str, int]]:
        return self.processes


@dataclass
class _Version:
    state: ModelState
    backend_model: Any


@dataclass
class _Entry:
    versions: dict[int, _Version] = field(default_factory=dict)


class _Manager:
    def __init__(self, **entries: _Entry) -> None:
        self.entries = entries

    def entry(self, name: str) -> _Entry | None:
        return self.entries.get(name)


def test_a_models_memory_is_its_instance_processes(proc: Path) -> None:
    manager: Any = _Manager(
        python=_Entry(
            {
                1: _Version(ModelState.READY, _Model([("python_0", 200), ("python_1", 999)])),
                2: _Version(ModelState.UNAVAILABLE, _Model([("python_0", 400)])),
            }
        ),
        onnx=_Entry({1: _Version(ModelState.READY, object())}),
    )
    memory = model_memory(manager, "python", proc)
    assert memory.serving and memory.in_processes
    assert [(i.version, i.instance, i.pid, i.rss_bytes) for i in memory.instances] == [
        (1, "python_0", 200, 330 * PAGE_SIZE),
        (1, "python_1", 999, None),  # ended since it was listed
    ]
    assert memory.rss_bytes == 330 * PAGE_SIZE
    inside = model_memory(manager, "onnx", proc)
    assert inside.serving and not inside.in_processes and inside.rss_bytes is None
    absent = model_memory(manager, "nothing", proc)
    assert not absent.serving and absent.instances == ()


def test_the_history_keeps_edgeds_own_figures_beside_the_hosts() -> None:
    times = iter([1000.0, 1001.0])
    history = MetricsHistory(list, capacity=4, clock=lambda: next(times))
    history.sample(DeviceSample(0.5, 8 << 30, 4 << 30, edged_cpu_utilization=0.125, edged_memory_used=300 << 20))
    history.sample(DeviceSample())
    device = history.history()["device"]
    assert device["edged_cpu_utilization"] == [0.125, None]
    assert device["edged_memory_used_bytes"] == [300 << 20, None]


def test_the_device_reader_reads_edgeds_own_processes_here() -> None:
    reader = DeviceReader(cpu=True, gpu=False)
    try:
        sample = reader.read()
    finally:
        reader.close()
    assert sample.edged_memory_used is not None and sample.memory_used is not None
    assert sample.edged_memory_used > 0
    assert sample.edged_cpu_utilization is not None and 0.0 <= sample.edged_cpu_utilization <= 1.0
    assert DeviceReader(cpu=False, gpu=False).read() == DeviceSample()
    assert os.getpid() in process_tree(os.getpid())


def test_missing_figures_show_an_en_dash() -> None:
    assert percent(None) == celsius(None) == "\u2013"
    assert percent(0.25) == "25 %" and percent(0.004) == "0.4 %" and celsius(51.04) == "51 \u00b0C"
