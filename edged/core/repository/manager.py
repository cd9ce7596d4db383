"""The ModelRepositoryManager: which models exist, which versions are loaded, and in what state.

Threads: the manager's tables are read and written on the event loop only. Loading (parsing, auto-complete,
creating sessions) is blocking work and runs on the load pool; its results are applied back on the loop.
"""

from __future__ import annotations

import asyncio
import enum
import logging
import time
from concurrent.futures import Executor, ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from edged.core.backend_api import LoadContext
from edged.core.config.defaults import normalize_model_config
from edged.core.config.model_config import parse_model_config
from edged.core.config.unacted import unacted_fields
from edged.core.config.validation import (
    validate_instance_groups,
    validate_model_config,
    validate_platform,
    validate_runtime,
)
from edged.core.devices import DeviceInventory
from edged.core.repository.checksum import verify_checksums
from edged.core.repository.scan import (
    ModelSource,
    ScanResult,
    fill_backend_fields,
    model_file,
    read_labels,
    scan_repositories,
    select_versions,
    version_numbers,
)
from edged.core.repository.warmup import run_warmup
from edged.core.request.validation import ModelSignature
from edged.core.scheduling.cached import with_response_cache
from edged.core.scheduling.dynamic import DynamicBatcher
from edged.core.scheduling.rate_limiter import RATE_LIMITER
from edged.core.scheduling.scheduler import DirectScheduler
from edged.core.scheduling.sequence import SequenceBatcher
from edged.core.scheduling.sequence_inputs import check_sequence_config
from edged.core.stats import ModelStatistics, RequestObserver
from edged.errors import EdgedError, ErrorCode
from edged.proto.model_config_pb2 import ModelConfig

if TYPE_CHECKING:
    from collections.abc import Callable
    from pathlib import Path

    from edged.core.backend_api import BackendModel, Backends
    from edged.core.repository.files import FolderPrint
    from edged.core.response_cache import ResponseCache
    from edged.core.scheduling.scheduler import Scheduler

log = logging.getLogger(__name__)


class ModelState(enum.Enum):
    UNKNOWN = "UNKNOWN"
    READY = "READY"
    UNAVAILABLE = "UNAVAILABLE"
    LOADING = "LOADING"
    UNLOADING = "UNLOADING"


@dataclass(slots=True)
class ModelVersion:
    """One version of a model and everything a request to it needs."""

    name: str
    version: int
    state: ModelState
    reason: str = ""
    config: ModelConfig | None = None
    signature: ModelSignature | None = None
    labels: dict[str, list[str]] = field(default_factory=dict)
    scheduler: Scheduler | None = None
    backend_model: BackendModel | None = None
    stats: ModelStatistics | None = None
    # The model folder it was loaded from (a sequence model's initial_state/ files live there).
    model_dir: Path | None = None


@dataclass(slots=True)
class ModelEntry:
    """A model folder and the outcome of loading it; ``reason`` is set when no version could even be tried."""

    source: ModelSource
    state: ModelState = ModelState.UNKNOWN
    reason: str = ""
    config: ModelConfig | None = None
    versions: dict[int, ModelVersion] = field(default_factory=dict)
    # The folder as it was when loaded: poll mode reloads the model when it differs.
    folder: FolderPrint | None = None
    # False once unloaded on request: the model is no longer one that should be served (strict readiness).
    wanted: bool = True


@dataclass(frozen=True, slots=True)
class VersionHealth:
    """One loaded version's counts since it loaded; they only grow."""

    succeeded: int
    failed: int
    crashes: int


@dataclass(frozen=True, slots=True)
class ModelHealth:
    """How a model is doing: what a probation after an update watches. ``versions`` holds the counts of each READY
    version, keyed by the loaded version's identity, so that a watcher compares a version with itself and counts a
    version loaded since its first look from zero."""

    ready: bool
    live_sequences: int
    versions: dict[int, VersionHealth]


class VersionsUnavailable(Exception):
    """A config that parsed but cannot be served; every selected version is UNAVAILABLE for ``error``."""

    def __init__(self, error: EdgedError, versions: list[int]) -> None:
        super().__init__(error.message)
        self.error = error
        self.versions = versions


@dataclass(frozen=True, slots=True)
class IndexEntry:
    name: str
    version: str = ""
    state: str = ""
    reason: str = ""


@dataclass(frozen=True, slots=True)
class ManagerOptions:
    repositories: list[Path]
    auto_complete: bool = True
    default_max_batch_size: int = 4
    load_thread_count: int = 4
    # Times a failed version load is tried again (--model-load-retry-count).
    load_retry_count: int = 0
    # --model-config-name: configs/<name>.pbtxt instead of config.pbtxt where a model folder has one.
    config_name: str | None = None
    # What instance groups may ask for; the daemon passes what DeviceInventory.discover() found.
    devices: DeviceInventory = field(default_factory=DeviceInventory)
    # Given every successful request of every model (the metrics' latency summaries and histograms), if anything.
    request_observer: RequestObserver | None = None
    # The device's response cache (--cache-config), for the models whose config enables it; None: there is none.
    response_cache: ResponseCache | None = None


class ModelRepositoryManager:
    def __init__(self, options: ManagerOptions, executor: Executor, backends: Backends) -> None:
        """``backends``: what loads models (the daemon's edged.backends.BackendRegistry)."""
        self._options = options
        self._backends = backends
        # Runs model executions that are too long for the event loop (see edged.core.scheduling.scheduler).
        self._executor = executor
        self._models: dict[str, ModelEntry] = {}
        # Names of models in the repositories that were never loaded, which the index lists by name only (set by
        # model control in explicit mode).
        self.listing: Callable[[], list[str]] = list

    # --- the tables, as model control (edged.core.repository.control) changes them; on the event loop ---------------

    @property
    def repositories(self) -> list[Path]:
        return self._options.repositories

    def scan(self) -> ScanResult:
        """The model folders of the repositories as they are now (blocking: reads the disk)."""
        return scan_repositories(self._options.repositories, self._options.config_name)

    @property
    def caches_responses(self) -> bool:
        """Whether the server has a response cache (--cache-config) for the models whose config enables one."""
        return self._options.response_cache is not None

    @property
    def devices(self) -> DeviceInventory:
        """The devices found at start, that instances are placed on."""
        return self._options.devices

    def entry(self, name: str) -> ModelEntry | None:
        return self._models.get(name)

    def names(self) -> list[str]:
        return list(self._models)

    def put_entry(self, entry: ModelEntry) -> None:
        """Requests go to the entry's READY versions from now on."""
        self._models[entry.source.name] = entry

    def forget(self, name: str) -> None:
        """The model is no longer listed (not in the index, not counted for readiness), as if never loaded."""
        self._models.pop(name, None)

    def activate(self, version: ModelVersion) -> None:
        """Give a freshly loaded version its statistics and scheduler, so that it can take requests."""
        assert version.backend_model is not None
        version.stats = ModelStatistics(version.name, version.version, observer=self._options.request_observer)
        version.scheduler = self._scheduler(version, version.stats)

    async def load_all(self) -> None:
        """Load every model of every repository (model control mode ``none``)."""
        scan = self.scan()
        for name, source in scan.models.items():
            entry = ModelEntry(source, ModelState.LOADING)
            self._models[name] = entry
            if name in scan.duplicates:
                entry.state = ModelState.UNAVAILABLE
                entry.reason = "model appears in two or more repositories"  # Triton's words
        pending = [e for e in self._models.values() if e.state is ModelState.LOADING]
        loop = asyncio.get_running_loop()
        with ThreadPoolExecutor(max(1, self._options.load_thread_count), thread_name_prefix="edged-load") as pool:
            results = await asyncio.gather(*(loop.run_in_executor(pool, self._load, e.source) for e in pending))
        for entry, loaded in zip(pending, results, strict=True):
            self._models[entry.source.name] = loaded
            for version in loaded.versions.values():
                if version.backend_model is not None:
                    self.activate(version)

    def _scheduler(self, version: ModelVersion, stats: ModelStatistics) -> Scheduler:
        """Triton's: the dynamic batcher for a config with ``dynamic_batching``, else one request per execution."""
        assert version.backend_model is not None and version.config is not None
        instances = version.backend_model.instances
        choice = version.config.WhichOneof("scheduling_choice")
        scheduler: Scheduler
        if choice == "dynamic_batching":
            scheduler = DynamicBatcher(instances, self._executor, stats, version.config)
        elif choice == "sequence_batching":
            return SequenceBatcher(instances, self._executor, stats, version.config, version.model_dir)
        else:
            scheduler = DirectScheduler(instances, self._executor, stats)
        # Sequence models never: validation refuses a sequence batcher with a cache, as Triton does.
        return with_response_cache(scheduler, version.config, stats, self._options.response_cache)

    def _load(self, source: ModelSource) -> ModelEntry:
        """Blocking: read, complete and check the config, then load each selected version."""
        started = time.monotonic()
        entry = ModelEntry(source)
        try:
            config, versions = self.read_config(source)
        except VersionsUnavailable as exc:
            # The config parsed but does not describe a model that can run: each version it selects fails.
            entry.state = ModelState.UNAVAILABLE
            for number in exc.versions:
                entry.versions[number] = ModelVersion(
                    source.name, number, ModelState.UNAVAILABLE, reason=exc.error.describe()
                )
            log.error("failed to load model '%s': %s", source.name, exc.error.message)
            return entry
        except EdgedError as exc:
            entry.state, entry.reason = ModelState.UNAVAILABLE, exc.describe()
            log.error("failed to load model '%s': %s", source.name, exc.message)
            return entry
        entry.config = config
        for number in versions:
            entry.versions[number] = self.load_version(source, config, number)
        entry.state = (
            ModelState.READY
            if any(v.state is ModelState.READY for v in entry.versions.values())
            else ModelState.UNAVAILABLE
        )
        log.info(
            # Triton's words for a load that succeeded, which scripts written for it count.
            "successfully loaded '%s' in %.2fs: %s"
            if all(v.state is ModelState.READY for v in entry.versions.values())
            else "model '%s' loaded in %.2fs: %s",
            source.name,
            time.monotonic() - started,
            ", ".join(f"version {v.version} {v.state.value}" for v in entry.versions.values()) or "no versions",
        )
        return entry

    def read_config(self, source: ModelSource, pinned: list[int] | None = None) -> tuple[ModelConfig, list[int]]:
        """The model's completed config and the versions to serve: its version_policy's, or with ``pinned`` (an
        activation, edged.core.repository.versions) those of them that have a folder."""
        config_path = source.config_path
        if config_path.is_file():
            try:
                text = config_path.read_text(encoding="utf-8")
            except OSError as exc:
                raise EdgedError(
                    ErrorCode.INVALID_ARG, f"unable to read '{source.relative(config_path)}': {exc.strerror}"
                ) from None
            except UnicodeDecodeError:
                raise EdgedError(
                    ErrorCode.INVALID_ARG, f"unable to read '{source.relative(config_path)}': it is not UTF-8 text"
                ) from None
            config = parse_model_config(text, source.relative(config_path))
        elif self._options.auto_complete:
            config = ModelConfig()
        else:
            # Triton's words first (scripts look for them), then why it was read at all.
            raise EdgedError(
                ErrorCode.INVALID_ARG,
                f"failed to open text file for read {source.relative(config_path)}: No such file or directory "
                "(the model configuration is missing and auto-complete is disabled)",
            )
        if not config.name:
            config.name = source.name
        elif config.name != source.name:
            raise EdgedError(
                ErrorCode.INVALID_ARG,
                f"unexpected directory name '{source.name}' for model '{config.name}', directory name must "
                "equal model name",
            )
        verify_checksums(config, source.path)  # before anything else is read, as Triton runs its agents
        available = version_numbers(source)
        versions = select_versions(config, available) if pinned is None else [v for v in available if v in pinned]
        if not versions and pinned is not None:
            raise EdgedError(
                ErrorCode.INVALID_ARG,
                f"model '{source.name}' has no folder for version {', '.join(map(str, pinned))}, which was activated: "
                "activate one it has, or load it to serve what its version policy selects",
            )
        if not versions:
            # What is wrong with the config itself is said first, as Triton checks it when it scans the repository.
            self._check_unversioned(source, config)
            raise EdgedError(
                ErrorCode.INVALID_ARG,
                f"at least one version must be available under the version policy of model '{source.name}'",
            )
        try:
            self._complete_config(source, config, versions)
        except EdgedError as exc:
            raise VersionsUnavailable(exc, versions) from None
        for note in unacted_fields(config, cache=self.caches_responses):
            log.warning("model '%s': %s is not acted upon: %s", source.name, note.field, note.why)
        return config, versions

    def _check_unversioned(self, source: ModelSource, config: ModelConfig) -> None:
        """Check a config that has no version to be completed from: its backend, and, when it is not to be
        completed, everything else (on a copy: the caller's config stays as read)."""
        config = type(config).FromString(config.SerializeToString())
        fill_backend_fields(config, source, [])
        if not config.backend and not config.platform:
            raise EdgedError(
                ErrorCode.INVALID_ARG,
                f"Invalid model name: Could not determine backend for model '{source.name}' with no backend in model "
                "configuration. Expected model name of the form 'model.<backend_name>'.",
            )
        if not self._options.auto_complete:
            gpus = self._options.devices.gpu_ids
            normalize_model_config(config, gpus)
            validate_model_config(config)
            validate_instance_groups(config, gpus)

    def _complete_config(self, source: ModelSource, config: ModelConfig, versions: list[int]) -> None:
        """Backend fields, auto-complete, defaults and checks: what Triton does when it initialises the model."""
        fill_backend_fields(config, source, versions)
        if not config.backend and not config.platform:
            raise EdgedError(
                ErrorCode.INVALID_ARG,
                f"unable to find a backend for model '{source.name}': set 'backend' or 'platform' in "
                "config.pbtxt, or add a version folder holding a model file",
            )
        # Before the backend is looked for, as Triton checks these before it loads a backend library.
        validate_platform(config)
        validate_runtime(config)
        backend = self._backends.get(backend_name(config))
        if self._options.auto_complete:
            backend.auto_complete_config(
                config, self.context(source, config, versions[-1]), self._options.default_max_batch_size
            )
        gpus = self._options.devices.gpu_ids
        normalize_model_config(config, gpus)
        validate_model_config(config)
        validate_instance_groups(config, gpus)

    def context(self, source: ModelSource, config: ModelConfig, version: int) -> LoadContext:
        return LoadContext(
            source.name,
            version,
            source.path,
            source.path / str(version),
            model_file(config, source, version),
            self._options.devices,
        )

    def load_version(self, source: ModelSource, config: ModelConfig, number: int) -> ModelVersion:
        """Blocking: load one version, tried again up to --model-load-retry-count times when it fails."""
        for attempt in range(self._options.load_retry_count + 1):
            if attempt:
                log.warning(
                    "loading '%s' version %d again (retry %d of %d)",
                    source.name,
                    number,
                    attempt,
                    self._options.load_retry_count,
                )
            version = self._load_version_once(source, config, number)
            if version.state is ModelState.READY:
                break
        return version

    def _load_version_once(self, source: ModelSource, config: ModelConfig, number: int) -> ModelVersion:
        version = ModelVersion(source.name, number, ModelState.LOADING, config=config, model_dir=source.path)
        try:
            if config.WhichOneof("scheduling_choice") == "sequence_batching":
                check_sequence_config(config, source.path)  # its initial state files, before any instance starts
            version.labels = {o.name: read_labels(source, o.label_filename) for o in config.output if o.label_filename}
            version.signature = ModelSignature.from_config(config)
            version.backend_model = self._backends.get(backend_name(config)).load(
                config, self.context(source, config, number)
            )
            self._warm_up(version, config, source)
        except EdgedError as exc:
            version.state, version.reason = ModelState.UNAVAILABLE, exc.describe()
            log.error("failed to load '%s' version %d: %s", source.name, number, exc.message)
            return version
        version.state = ModelState.READY
        return version

    @staticmethod
    def _warm_up(version: ModelVersion, config: ModelConfig, source: ModelSource) -> None:
        """Run the config's model_warmup on every instance, then give the instances to the rate limiter; a failure
        releases the instances and fails the load."""
        model, signature = version.backend_model, version.signature
        assert model is not None and signature is not None
        try:
            if config.model_warmup and config.model_transaction_policy.decoupled:
                # A decoupled model answers through streams the load thread cannot read; it loads without warmup.
                log.warning("model '%s': model_warmup is not run for a decoupled model", source.name)
            elif config.model_warmup:
                run_warmup(config, source.path, signature, model)
            RATE_LIMITER.admit(model, config)
        except EdgedError:
            version.backend_model = None
            model.unload()
            raise

    # --- lookups: called on every request, so they stay dict lookups -------------------------------------

    def get_ready(self, name: str, version: int) -> ModelVersion:
        """The READY version a request for (name, version) goes to; ``version`` -1 picks the newest READY one."""
        entry = self._models.get(name)
        if entry is None:
            raise EdgedError(ErrorCode.NOT_FOUND, f"Request for unknown model: '{name}' is not found")
        if version < 0:
            ready = [v for v in entry.versions.values() if v.state is ModelState.READY]
            if not ready:
                raise EdgedError(ErrorCode.NOT_FOUND, f"Request for unknown model: '{name}' has no available versions")
            return max(ready, key=lambda v: v.version)
        found = entry.versions.get(version)
        if found is None:
            raise EdgedError(ErrorCode.NOT_FOUND, f"Request for unknown model: '{name}' version {version} is not found")
        if found.state is not ModelState.READY:
            raise EdgedError(
                ErrorCode.UNAVAILABLE,
                f"Request for unknown model: '{name}' version {version} is not at ready state",
            )
        return found

    def is_ready(self, name: str, version: int) -> bool:
        try:
            self.get_ready(name, version)
        except EdgedError:
            return False
        return True

    def statistics(self, name: str, version: int) -> list[ModelStatistics]:
        """Statistics of the READY versions: of every model when ``name`` is empty, of every version of the model
        when ``version`` is -1. Unknown names and versions are refused with Triton's messages."""
        if not name:
            return [
                v.stats
                for n in sorted(self._models)
                for _, v in sorted(self._models[n].versions.items())
                if v.stats is not None and v.state is ModelState.READY
            ]
        entry = self._models.get(name)
        ready = (
            {n: v for n, v in entry.versions.items() if v.stats is not None and v.state is ModelState.READY}
            if entry is not None
            else {}
        )
        if not ready:
            raise EdgedError(ErrorCode.INVALID_ARG, f"requested model '{name}' is not available")
        if version < 0:
            return [v.stats for _, v in sorted(ready.items()) if v.stats is not None]
        found = ready.get(version)
        if found is None or found.stats is None:
            raise EdgedError(ErrorCode.INVALID_ARG, f"requested model version is not available for model '{name}'")
        return [found.stats]

    def health(self, name: str) -> ModelHealth:
        entry = self._models.get(name)
        versions = [v for v in entry.versions.values() if v.state is ModelState.READY] if entry is not None else []
        ready = bool(versions) and entry is not None and entry.state is ModelState.READY
        live = 0
        counts: dict[int, VersionHealth] = {}
        for version in versions:
            crashes = 0
            model = version.backend_model
            if model is not None:
                is_ready = getattr(model, "is_ready", None)
                ready = ready and (is_ready is None or bool(is_ready()))
                crash_count = getattr(model, "crash_count", None)
                crashes = int(crash_count()) if crash_count is not None else 0
            stats = version.stats
            # An error the model answered with is a success to Triton's statistics, and a failure of the model all
            # the same: the probation counts it as one. (Requests refused before they ran, a client's bad input
            # among them, say nothing of the version and are not counted.)
            answered = stats.answered_errors if stats is not None else 0
            counts[id(version)] = VersionHealth(
                stats.success.count - answered if stats is not None else 0,
                stats.fail.count + answered if stats is not None else 0,
                crashes,
            )
            live += int(getattr(version.scheduler, "live_sequences", 0))
        return ModelHealth(ready, live, counts)

    def dependents(self, name: str) -> list[str]:
        """The loaded ensembles with a step that names model ``name``."""
        dependents = []
        for other, entry in self._models.items():
            if entry.config is None or entry.config.platform != "ensemble":
                continue
            if not any(v.state is ModelState.READY for v in entry.versions.values()):
                continue
            if any(step.model_name == name for step in entry.config.ensemble_scheduling.step):
                dependents.append(other)
        return sorted(dependents)

    def ready_versions(self, name: str) -> list[int]:
        entry = self._models.get(name)
        if entry is None:
            return []
        return sorted(v.version for v in entry.versions.values() if v.state is ModelState.READY)

    def all_ready(self) -> bool:
        """Every model that should be served is READY (the strict readiness rule)."""
        return all(e.state is ModelState.READY for e in self._models.values() if e.wanted)

    def failed(self) -> list[tuple[str, str]]:
        out: list[tuple[str, str]] = []
        for name, entry in sorted(self._models.items()):
            if entry.reason:
                out.append((name, entry.reason))
            out.extend(
                (f"{name} version {v.version}", v.reason)
                for v in entry.versions.values()
                if v.state is ModelState.UNAVAILABLE
            )
        return out

    def index(self, ready_only: bool) -> list[IndexEntry]:
        out: list[IndexEntry] = []
        if not ready_only:
            out.extend(IndexEntry(name) for name in self.listing() if name not in self._models)
        for name in sorted(self._models):
            entry = self._models[name]
            if not entry.versions:
                if not ready_only:
                    out.append(IndexEntry(name, "", entry.state.value, entry.reason))
                continue
            for number in sorted(entry.versions):
                version = entry.versions[number]
                if ready_only and version.state is not ModelState.READY:
                    continue
                out.append(IndexEntry(name, str(number), version.state.value, version.reason))
        out.sort(key=lambda item: item.name)
        return out

    async def unload_all(self, drain_timeout_s: float | None = None) -> None:
        """Stop taking requests, let in-flight ones finish (for at most ``drain_timeout_s``: an execution that never
        returns must not keep the daemon from stopping), then release every instance."""
        versions = [v for e in self._models.values() for v in e.versions.values()]
        for version in versions:
            if version.state is ModelState.READY:
                version.state = ModelState.UNLOADING
        drains = asyncio.gather(*(v.scheduler.drain() for v in versions if v.scheduler is not None))
        try:
            await asyncio.wait_for(drains, drain_timeout_s)
        except TimeoutError:
            log.warning(
                "executions still running after %gs: unloading the models without waiting for them", drain_timeout_s
            )
        for version in versions:
            if version.backend_model is not None:
                version.backend_model.unload()
                version.backend_model = None
                version.scheduler = None
            version.state = ModelState.UNAVAILABLE
            version.reason = "unloaded"


def backend_name(config: ModelConfig) -> str:
    """The backend that loads a config: an ensemble's steps are run by edged's ensemble runner."""
    return "ensemble" if config.platform == "ensemble" else config.backend
