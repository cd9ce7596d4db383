"""The devices model instances run on, and which instance goes where.

The inventory is taken once, when the daemon starts: the CPUs this process may use, the NVIDIA GPUs that NVML
reports (``libnvidia-ml.so.1`` comes with the driver; without it there are simply no GPUs), the Intel NPUs (Core
Ultra's NPU, which OpenVINO runs models on) that the kernel's ``intel_vpu`` driver has bound, and whatever device
plug-ins report. Intel NPUs are numbered first (0, 1, ... in the order of their ``/dev/accel/accel<N>`` nodes); a
plug-in's NPU with a number already taken is ignored with a warning. While serving, an Intel NPU's use (busy
time and clock) is read from the same sysfs entries (``intel_npu_activity``). A plug-in is how an appliance adds
accelerators edged cannot find by itself (another NPU, or the GPU of a board without NVML): an installed
distribution that declares an entry point in the ``edged.devices`` group, naming a callable that takes no arguments
and returns ``Device`` objects::

    [project.entry-points."edged.devices"]
    rbln = "edged_rbln:devices"      # def devices() -> list[Device]: [Device("NPU", 0, "RBLN-CA12"), ...]

Placement follows Triton: a group makes ``count`` instances named ``<group name>_<c>``, and a KIND_GPU group makes
each of them once on every GPU it lists. Instances of KIND_CPU run on device 0, as in Triton. KIND_MODEL leaves
the device to the model, and Triton passes it device id 0; when plug-ins report NPUs, edged instead spreads a
model's KIND_MODEL instances over them in turn, so that a Python model finds its NPU in
``args["model_instance_device_id"]`` and N instances keep N NPUs busy.
"""

from __future__ import annotations

import ctypes
import logging
import os
from dataclasses import dataclass
from importlib.metadata import entry_points
from pathlib import Path
from typing import TYPE_CHECKING, Literal

if TYPE_CHECKING:
    from collections.abc import Callable, Iterable

    from edged.proto.model_config_pb2 import ModelConfig

log = logging.getLogger(__name__)

KIND_AUTO, KIND_GPU, KIND_CPU, KIND_MODEL = 0, 1, 2, 3
PLUGIN_GROUP = "edged.devices"
# Triton's minimum CUDA compute capability: GPUs below it are not offered to models.
MIN_COMPUTE_CAPABILITY = 6.0

DeviceKind = Literal["GPU", "NPU"]
InstanceKind = Literal["CPU", "GPU", "MODEL"]
_INSTANCE_KINDS: dict[int, InstanceKind] = {KIND_GPU: "GPU", KIND_CPU: "CPU", KIND_MODEL: "MODEL"}


@dataclass(frozen=True, slots=True)
class Device:
    """One accelerator: ``id`` is what instance groups (``gpus: [...]``) and models (``model_instance_device_id``)
    call it."""

    kind: DeviceKind
    id: int
    name: str = ""
    source: str = ""  # "nvml", "intel_vpu" or the plug-in's entry point name, for the log


@dataclass(frozen=True, slots=True)
class DeviceInventory:
    cpu_count: int = 1
    gpus: tuple[Device, ...] = ()
    npus: tuple[Device, ...] = ()

    @property
    def gpu_ids(self) -> list[int]:
        return [gpu.id for gpu in self.gpus]

    @classmethod
    def discover(cls, sysfs: Path = Path("/sys")) -> DeviceInventory:
        """This machine's devices. Never fails: a device source that is missing or broken adds nothing."""
        gpus: dict[int, Device] = {gpu.id: gpu for gpu in nvml_gpus()}
        npus: dict[int, Device] = {npu.id: npu for npu in intel_npus(sysfs)}
        for device in plugin_devices():
            found = gpus if device.kind == "GPU" else npus
            if device.id in found:
                log.warning("device plug-in '%s' reports %s %d again; ignored", device.source, device.kind, device.id)
                continue
            found[device.id] = device
        return cls(
            cpu_count=_cpu_count(),
            gpus=tuple(gpus[i] for i in sorted(gpus)),
            npus=tuple(npus[i] for i in sorted(npus)),
        )

    def describe(self) -> str:
        """One line for the log, e.g. ``4 CPUs; GPUs: 0 (NVIDIA L4); NPUs: 0, 1 (RBLN-CA12)``."""
        parts = [f"{self.cpu_count} CPU{'s' if self.cpu_count != 1 else ''}"]
        for label, devices in (("GPUs", self.gpus), ("NPUs", self.npus)):
            listed = ", ".join(f"{d.id} ({d.name})" if d.name else str(d.id) for d in devices)
            parts.append(f"{label}: {listed or 'none'}")
        return "; ".join(parts)


@dataclass(frozen=True, slots=True)
class InstancePlacement:
    """One model instance to create: its Triton name, its group (an index into ``instance_group``: Triton lets
    two groups have one name), and the device it runs on."""

    name: str
    group: int
    kind: InstanceKind
    device_id: int


def instance_placements(config: ModelConfig, devices: DeviceInventory) -> list[InstancePlacement]:
    """Every instance of a normalised config, in the order Triton creates them (see the module's docstring)."""
    placements: list[InstancePlacement] = []
    npu_turn = 0
    for index, group in enumerate(config.instance_group):
        kind = _INSTANCE_KINDS.get(group.kind, "CPU")
        for c in range(group.count):
            name = f"{group.name}_{c}"
            if kind == "GPU":
                # Triton gives the instances of one index the same name on every GPU of the group.
                placements.extend(InstancePlacement(name, index, kind, gpu) for gpu in group.gpus)
            elif kind == "MODEL" and devices.npus:
                npu = devices.npus[npu_turn % len(devices.npus)]
                npu_turn += 1
                placements.append(InstancePlacement(name, index, kind, npu.id))
            else:
                placements.append(InstancePlacement(name, index, kind, 0))
    return placements


def _cpu_count() -> int:
    # The CPUs this process may run on (a systemd CPUAffinity= or a container's cpuset), not every CPU of the board.
    try:
        return len(os.sched_getaffinity(0))
    except (AttributeError, OSError):
        return os.cpu_count() or 1


# --- NVIDIA GPUs through NVML --------------------------------------------------------------------------------


def nvml_gpus(library: str = "libnvidia-ml.so.1") -> list[Device]:
    """The GPUs CUDA will number 0, 1, ...: NVML's devices, narrowed and reordered by CUDA_VISIBLE_DEVICES, less
    those below the minimum compute capability. NVML numbers devices in PCI bus order, which is CUDA's order
    when ``CUDA_DEVICE_ORDER=PCI_BUS_ID`` (and on any machine with one GPU, or GPUs of one model)."""
    try:
        lib = ctypes.CDLL(library)
    except OSError:
        return []
    try:
        if lib.nvmlInit_v2() != 0:
            return []
    except AttributeError:  # not NVML, or one too old to have this entry point
        return []
    try:
        return _visible_gpus(_nvml_devices(lib), os.environ.get("CUDA_VISIBLE_DEVICES"))
    except AttributeError:
        return []
    finally:
        lib.nvmlShutdown()


@dataclass(frozen=True, slots=True)
class _NvmlDevice:
    index: int
    uuid: str
    name: str
    capability: float | None


def _nvml_devices(lib: ctypes.CDLL) -> list[_NvmlDevice]:
    count = ctypes.c_uint()
    if lib.nvmlDeviceGetCount_v2(ctypes.byref(count)) != 0:
        return []
    found: list[_NvmlDevice] = []
    for index in range(count.value):
        handle = ctypes.c_void_p()
        if lib.nvmlDeviceGetHandleByIndex_v2(index, ctypes.byref(handle)) != 0:
            continue
        uuid, name = ctypes.create_string_buffer(96), ctypes.create_string_buffer(96)
        if lib.nvmlDeviceGetUUID(handle, uuid, len(uuid)) != 0:
            continue
        if lib.nvmlDeviceGetName(handle, name, len(name)) != 0:
            name.value = b""
        major, minor = ctypes.c_int(), ctypes.c_int()
        capability = None
        if lib.nvmlDeviceGetCudaComputeCapability(handle, ctypes.byref(major), ctypes.byref(minor)) == 0:
            capability = major.value + minor.value / 10
        found.append(_NvmlDevice(index, uuid.value.decode(), name.value.decode(errors="replace"), capability))
    return found


def _visible_gpus(devices: list[_NvmlDevice], visible: str | None) -> list[Device]:
    if visible is None:
        chosen = devices
    else:
        # CUDA's rule: entries are indexes or (prefixes of) GPU UUIDs, and the list ends at the first entry that
        # names no device. Entries CUDA accepts that NVML cannot map (MIG instances) end it here too.
        chosen = []
        for entry in (e.strip() for e in visible.split(",")):
            match = [d for d in devices if _names(entry, d)]
            if len(match) != 1 or match[0] in chosen:
                break
            chosen.append(match[0])
    gpus: list[Device] = []
    for cuda_id, device in enumerate(chosen):
        if device.capability is not None and device.capability < MIN_COMPUTE_CAPABILITY:
            log.warning(
                "GPU %d (%s) has CUDA compute capability %.1f, below the minimum %.1f; no model instance will run "
                "on it",
                cuda_id,
                device.name,
                device.capability,
                MIN_COMPUTE_CAPABILITY,
            )
            continue
        gpus.append(Device("GPU", cuda_id, device.name, "nvml"))
    return gpus


def _names(entry: str, device: _NvmlDevice) -> bool:
    if entry.isdigit():
        return device.index == int(entry)
    return entry.startswith("GPU-") and device.uuid.startswith(entry)


# --- Intel NPUs through the kernel's accel class -------------------------------------------------------------

INTEL_NPU_DRIVER = "intel_vpu"
# The PCI device ids the intel_vpu driver names; a newer one is listed by its id.
_INTEL_NPU_GENERATIONS = {0x7D1D: "Meteor Lake", 0xAD1D: "Arrow Lake", 0x643E: "Lunar Lake", 0xB03E: "Panther Lake"}


def intel_npus(sysfs: Path = Path("/sys")) -> list[Device]:
    """The accel devices (``/sys/class/accel/accel<N>``) bound to the ``intel_vpu`` driver, in the order of N.

    Read from sysfs rather than asked of OpenVINO: the inventory is taken at start-up, before (and without) any
    framework, and sysfs answers in microseconds. Whether OpenVINO's NPU plug-in can use the device is the
    backend's question when it compiles a model."""
    return [device for device, _ in _intel_npu_nodes(sysfs)]


@dataclass(frozen=True, slots=True)
class IntelNpuActivity:
    """What the ``intel_vpu`` driver says of one NPU at one moment: the microseconds it has been busy since the
    driver was loaded, and its clock now and at most. None where this kernel does not expose the figure (the
    files came with newer kernels, the frequencies after the busy time); the current clock reads 0 while the NPU
    is powered down."""

    npu: Device
    busy_us: int | None
    frequency_mhz: int | None = None
    max_frequency_mhz: int | None = None


def intel_npu_activity(sysfs: Path = Path("/sys")) -> list[IntelNpuActivity]:
    """Each Intel NPU (numbered as ``intel_npus`` numbers them) as its driver reports it now, from the PCI device's
    ``npu_busy_time_us``, ``npu_current_frequency_mhz`` and ``npu_max_frequency_mhz``. Never fails and never logs:
    it is read every second, and a file that is missing or unreadable only makes its figure None. Reading them
    does not wake a powered-down NPU."""
    return [
        IntelNpuActivity(
            device,
            _sysfs_count(pci / "npu_busy_time_us"),
            _sysfs_count(pci / "npu_current_frequency_mhz"),
            _sysfs_count(pci / "npu_max_frequency_mhz"),
        )
        for device, pci in _intel_npu_nodes(sysfs)
    ]


def _intel_npu_nodes(sysfs: Path) -> list[tuple[Device, Path]]:
    """Each Intel NPU with its PCI device's sysfs folder (where the driver's attributes are)."""
    entries: list[tuple[int, Path]] = []
    try:
        for entry in (sysfs / "class" / "accel").iterdir():
            if entry.name.startswith("accel") and entry.name[5:].isdigit():
                entries.append((int(entry.name[5:]), entry))
    except OSError:  # no accel class: a kernel without the subsystem, or no accelerator at all
        return []
    found: list[tuple[Device, Path]] = []
    for _, entry in sorted(entries):
        pci = entry / "device"
        try:
            if Path(os.readlink(pci / "driver")).name != INTEL_NPU_DRIVER:
                continue
            pci_id = int((pci / "device").read_text(encoding="ascii").strip(), 16)
        except (OSError, ValueError):
            continue
        generation = _INTEL_NPU_GENERATIONS.get(pci_id, f"PCI {pci_id:#06x}")
        found.append((Device("NPU", len(found), f"Intel NPU ({generation})", INTEL_NPU_DRIVER), pci))
    return found


def _sysfs_count(path: Path) -> int | None:
    """A sysfs attribute holding one non-negative integer, or None (absent, unreadable, or not a count)."""
    try:
        value = int(path.read_text(encoding="ascii").strip())
    except (OSError, ValueError):  # ValueError covers a file that is not ASCII too
        return None
    return value if value >= 0 else None


# --- plug-ins ------------------------------------------------------------------------------------------------


def plugin_devices() -> list[Device]:
    """The devices every installed ``edged.devices`` plug-in reports. A plug-in that fails to load or to answer
    is logged and skipped: the appliance keeps serving the models that do not need its devices."""
    devices: list[Device] = []
    for point in entry_points(group=PLUGIN_GROUP):
        try:
            report: Callable[[], Iterable[object]] = point.load()
            answered = list(report())
        except Exception as exc:  # a plug-in is third-party code: any failure of it is its own
            log.error("device plug-in '%s' (%s) failed: %s: %s", point.name, point.value, type(exc).__name__, exc)
            continue
        for item in answered:
            device = _plugin_device(point.name, item)
            if device is not None:
                devices.append(device)
    return devices


def _plugin_device(plugin: str, item: object) -> Device | None:
    if not isinstance(item, Device):
        log.error("device plug-in '%s' reported %r, which is not an edged.core.devices.Device; ignored", plugin, item)
        return None
    if item.kind not in ("GPU", "NPU") or not isinstance(item.id, int) or item.id < 0:
        log.error("device plug-in '%s' reported %r: kind must be GPU or NPU and id >= 0; ignored", plugin, item)
        return None
    return Device(item.kind, item.id, item.name, plugin)
