"""What the console shows of the models: each model's state, its versions (on disk and loaded), backend, instances
and where they run, and its config as config.pbtxt text. Read on the event loop, from the manager's entries and a
scan of the repositories (the versions a model could serve, loaded or not)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

from google.protobuf import text_format

from edged.core.config.unacted import unacted_fields
from edged.core.devices import instance_placements
from edged.core.repository.manager import ModelState
from edged.core.repository.scan import version_numbers

if TYPE_CHECKING:
    from edged.core.devices import DeviceInventory
    from edged.core.repository.manager import ModelEntry, ModelRepositoryManager
    from edged.proto.model_config_pb2 import ModelConfig


# The reason a version gets when it is unloaded on purpose (Triton's word in the repository index).
RETIRED_REASON = "unloaded"


@dataclass(frozen=True, slots=True)
class VersionSummary:
    number: int
    state: str  # Triton's: READY, UNAVAILABLE, LOADING, UNLOADING; "" for a version on disk that is not loaded
    reason: str = ""
    # Its folder is in the repository: only then can it be loaded or activated (a version unloaded and then
    # removed is still listed, as Triton's index lists it).
    on_disk: bool = True

    @property
    def retired(self) -> bool:
        """Unloaded on purpose (replaced by another version, or the model unloaded), not failed."""
        return self.state == ModelState.UNAVAILABLE.value and self.reason == RETIRED_REASON

    @property
    def label(self) -> str:
        """The word a person reads for its state: "retired" is not a failure, "not loaded" not an error."""
        if self.retired:
            return "retired"
        return self.state.lower() if self.state else "not loaded"


@dataclass(frozen=True, slots=True)
class InstanceSummary:
    name: str
    kind: str  # CPU, GPU, MODEL (an NPU when the inventory has one)
    device: str  # "CPU", "GPU 0", "NPU 1"


@dataclass(frozen=True, slots=True)
class ModelSummary:
    name: str
    state: str  # the model's: READY when a version serves, UNAVAILABLE, LOADING ...; "" when never loaded
    reason: str
    backend: str  # the backend or platform ("onnxruntime", "python", "ensemble")
    versions: tuple[VersionSummary, ...]
    instances: tuple[InstanceSummary, ...]
    max_batch_size: int
    dynamic_batching: bool
    repository: str
    # It should be served (loaded on purpose and not unloaded since): while it is not READY, the device is not ready
    # under strict readiness.
    wanted: bool = False
    # The fields its config sets that edged does not act on, each "field: why" (edged.core.config.unacted).
    notes: tuple[str, ...] = ()

    @property
    def failed(self) -> bool:
        """Not serving for a reason other than an operator's unload: what a person must look at first."""
        if self.state != ModelState.UNAVAILABLE.value:
            return False
        return (
            self.wanted
            or bool(self.reason)
            or any(v.state == ModelState.UNAVAILABLE.value and not v.retired for v in self.versions)
        )

    @property
    def why(self) -> str:
        """Why it is not serving, in its own or its first failed version's words ("" when nothing says)."""
        if self.reason:
            return self.reason
        failed = (v for v in self.versions if v.state == ModelState.UNAVAILABLE.value and not v.retired)
        return next((f"version {v.number}: {v.reason}" for v in failed if v.reason), "")

    @property
    def label(self) -> str:
        """The word a person reads for its state: a model unloaded on purpose is "unloaded", not "unavailable"."""
        if not self.state:
            return "not loaded"
        if self.state == ModelState.UNAVAILABLE.value and not self.failed:
            return "unloaded"
        return self.state.lower()

    @property
    def serving(self) -> list[int]:
        return [v.number for v in self.versions if v.state == ModelState.READY.value]

    @property
    def on_disk(self) -> list[int]:
        """The versions with a folder in the repository: those a load or an activation can serve."""
        return [v.number for v in self.versions if v.on_disk]


def summaries(manager: ModelRepositoryManager, devices: DeviceInventory) -> list[ModelSummary]:
    """Every model of the repositories, loaded or not, by name."""
    scan = manager.scan()
    names = sorted(set(scan.models) | set(manager.names()))
    out: list[ModelSummary] = []
    for name in names:
        entry = manager.entry(name)
        source = scan.models.get(name)
        on_disk = version_numbers(source) if source is not None else []
        repository = str(source.repository) if source else ""
        out.append(_summary(name, entry, on_disk, repository, devices, manager.caches_responses))
    return out


def summary(manager: ModelRepositoryManager, devices: DeviceInventory, name: str) -> ModelSummary | None:
    """One model, or None when no repository has it and it is not loaded."""
    for model in summaries(manager, devices):
        if model.name == name:
            return model
    return None


def config_text(manager: ModelRepositoryManager, name: str) -> str | None:
    """The model's config as config.pbtxt text, as it was loaded (completed as Triton completes it); None when the
    model was never loaded."""
    entry = manager.entry(name)
    if entry is None or entry.config is None:
        return None
    return str(text_format.MessageToString(entry.config))


def _summary(
    name: str, entry: ModelEntry | None, on_disk: list[int], repository: str, devices: DeviceInventory, cache: bool
) -> ModelSummary:
    loaded = entry.versions if entry is not None else {}
    versions = [
        VersionSummary(number, loaded[number].state.value, loaded[number].reason, number in on_disk)
        if number in loaded
        else VersionSummary(number, "")
        for number in sorted(set(on_disk) | set(loaded))
    ]
    config = entry.config if entry is not None else None
    return ModelSummary(
        name=name,
        state=entry.state.value if entry is not None and entry.state is not ModelState.UNKNOWN else "",
        reason=entry.reason if entry is not None else "",
        backend=(config.backend or config.platform) if config is not None else "",
        versions=tuple(versions),
        instances=_instances(config, devices) if config is not None else (),
        max_batch_size=config.max_batch_size if config is not None else 0,
        dynamic_batching=config.HasField("dynamic_batching") if config is not None else False,
        repository=repository,
        wanted=entry is not None and entry.wanted,
        notes=(tuple(str(note) for note in unacted_fields(config, cache=cache)) if config is not None else ()),
    )


def _instances(config: ModelConfig, devices: DeviceInventory) -> tuple[InstanceSummary, ...]:
    out: list[InstanceSummary] = []
    for placement in instance_placements(config, devices):
        if placement.kind == "GPU":
            where = f"GPU {placement.device_id}"
        elif placement.kind == "MODEL" and devices.npus:
            where = f"NPU {placement.device_id}"
        else:
            where = "CPU"
        out.append(InstanceSummary(placement.name, placement.kind, where))
    return tuple(out)
