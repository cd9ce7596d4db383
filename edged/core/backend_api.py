"""The life cycle every backend implements: auto-complete a config, load a version, execute, unload.

Ownership and threads: the core loads from a worker thread and unloads on the event loop, and calls ``execute``
on one instance from at most one thread at a time (the scheduler hands an instance to one batch at a time), so
instances need no locks of their own. An instance that does its work in another process may instead offer
``execute_async`` (AsyncBackendInstance), which the scheduler awaits on the event loop.

Decoupled models (``model_transaction_policy { decoupled: true }``) answer through each request's ``stream``:
the backend puts every response there, the final one included, and ``execute`` returns None for the request
(or the error that ended it, for the statistics).

The core owns this interface; the backends implement it, and the daemon builds the registry of them
(edged.backends.BackendRegistry) and hands it to the core, which never imports a backend. A backend is built with its
``--backend-config`` settings and the server (a ServerApi bound to the event loop) for models that call other models,
as the Python backend's BLS does.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Literal, Protocol

from edged.core.devices import DeviceInventory

if TYPE_CHECKING:
    import asyncio
    from collections.abc import AsyncIterator, Sequence
    from pathlib import Path

    from edged.core.request.inference import InferRequest, InferResponse, StreamResponse
    from edged.core.stats import ExecutionTiming
    from edged.errors import EdgedError
    from edged.proto.model_config_pb2 import ModelConfig


@dataclass(frozen=True, slots=True)
class LoadContext:
    """What a backend needs to load one model version."""

    model_name: str
    version: int
    model_dir: Path
    version_dir: Path
    model_file: Path
    # Where instances go: edged.core.devices.instance_placements(config, devices) names them and their devices.
    devices: DeviceInventory = field(default_factory=DeviceInventory)


@dataclass(slots=True)
class CustomMetric:
    """One labelled series of a model's own metric family. ``value`` is a counter's or gauge's value, or a
    histogram's sum; a histogram also has its ``count`` and per-bucket (not cumulative) ``bucket_counts``, one more
    than ``buckets`` (the last for observations above every bound)."""

    labels: dict[str, str]
    value: float = 0.0
    count: int = 0
    buckets: list[float] = field(default_factory=list)
    bucket_counts: list[int] = field(default_factory=list)


@dataclass(slots=True)
class CustomMetricFamily:
    """A metric family a model created (the Python backend's ``pb_utils.MetricFamily``), exported under its own
    name. A backend with such families offers ``custom_metrics() -> list[CustomMetricFamily]``, a snapshot that
    may be taken from any thread."""

    name: str
    description: str
    kind: Literal["counter", "gauge", "histogram"]
    metrics: list[CustomMetric] = field(default_factory=list)


class BackendInstance(Protocol):
    """One copy of a model on one device; executes one batch at a time.

    An instance may also define ``cpu_share``: the share of the device's CPU cores (0 to 1) one execution keeps
    busy, as an ONNX Runtime CPU session does with a thread per core. The dynamic batcher then starts no more
    executions at once than the cores hold (edged.core.scheduling.dynamic); without it, an instance costs no CPU
    the batcher needs to count (a GPU, a process of its own).
    """

    @property
    def name(self) -> str: ...

    def execute(self, requests: Sequence[InferRequest], timing: ExecutionTiming) -> list[InferResponse | EdgedError]:
        """One response (or error) per request, in the same order; fills ``timing`` for the statistics."""
        ...


class AsyncBackendInstance(BackendInstance, Protocol):
    """An instance whose work happens elsewhere (a child process): the scheduler awaits it on the event loop."""

    async def execute_async(
        self, requests: Sequence[InferRequest], timing: ExecutionTiming
    ) -> Sequence[InferResponse | EdgedError | None]:
        """As ``execute``; None for a request answered through its stream (decoupled models)."""
        ...


class BackendModel(Protocol):
    """A loaded model version: its instances, and how to release them.

    A model may also define ``is_ready() -> bool`` (called on the event loop, must not block): False while it
    cannot serve (an instance's process is restarting), which the model-ready endpoints report; and
    ``crash_count() -> int``: how many times its instances' processes died (a probation after an update counts them);
    and ``each_instance() -> Sequence[BackendInstance]``: one per model instance, each running on that instance only,
    where ``instances`` are shared slots (model_warmup must reach every instance); and
    ``instance_processes() -> Sequence[tuple[str, int]]`` (called on the event loop, must not block): the instance
    name and process id of each instance that runs in a process of its own, for the memory a model's page shows
    (edged.core.model_memory).
    """

    @property
    def instances(self) -> Sequence[BackendInstance]: ...

    def unload(self) -> None: ...


class ServerApi(Protocol):
    """What a backend may ask of the server; coroutines run on ``loop``."""

    @property
    def loop(self) -> asyncio.AbstractEventLoop: ...

    async def infer(self, request: InferRequest) -> InferResponse: ...

    def infer_stream(self, request: InferRequest) -> AsyncIterator[StreamResponse]: ...

    def model_ready(self, name: str, version: int) -> bool: ...

    def model_config(self, name: str, version: int) -> ModelConfig:
        """The complete config of a READY version (-1: the newest); EdgedError when there is none."""
        ...

    async def load_model(self, name: str, config_json: str | None, files: dict[str, bytes]) -> None: ...

    async def unload_model(self, name: str, unload_dependents: bool) -> None: ...


class Backend(Protocol):
    def auto_complete_config(self, config: ModelConfig, context: LoadContext, default_max_batch_size: int) -> None:
        """Fill what config.pbtxt leaves out (inputs, outputs, max_batch_size) from the model itself."""
        ...

    def load(self, config: ModelConfig, context: LoadContext) -> BackendModel: ...


class Backends(Protocol):
    """The backends the core loads models with, by the name a config gives (``backend``, or ``ensemble``)."""

    def get(self, name: str) -> Backend:
        """The backend, built on first use; UNSUPPORTED EdgedError for a name edged does not provide."""
        ...
