"""The daemon's life cycle: build the parts, start them in order, serve, stop them in reverse.

One process, one event loop: the HTTP, gRPC and metrics servers share it; model executions that are too long
for the loop go to the worker pool (see edged.core.scheduling.scheduler). ``Core.build`` makes what every part
shares (the repositories checked, the state database opened, the service with its model control), then the parts
start in this order:

1. ``core``: what Core.build made, released last, and ``alerts``: the alert rules' gauges and deliveries;
2. ``sockets``: the HTTP and metrics ports, bound before the models load so that a port in use fails at once,
   and ``TLS``: the endpoints' certificates, read and checked then too;
3. ``models``: model control, which loads what this mode serves;
4. ``metrics history``: a point of every model's and the device's metrics each second, for the console;
5. the endpoints: HTTP, the system metrics and the metrics endpoint, gRPC, the console;
6. ``readiness``: READY=1 to systemd, the status line kept up to date, reloads allowed.

Adding a part (sync, the console) is one line in ``_parts``. Signals: edged.daemon.signals. Start-up problems of
the daemon itself (a port in use, a repository it cannot read, a state directory it cannot write or that another
daemon holds) end it with status 1 and one line saying why; a model that fails to load never does (unless
--exit-on-error). Before all of it the daemon locks its state directory (edged.state.lock): one daemon per state
directory.
"""

from __future__ import annotations

import asyncio
import logging
import os
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from typing import TYPE_CHECKING

from edged import __version__
from edged.backends import BackendRegistry
from edged.core.access import AccessPolicy, TokenVerifier
from edged.core.accounts import Accounts
from edged.core.alerts.engine import Alerts, Gauges
from edged.core.audit import AuditLog
from edged.core.device_conditions import DeviceConditionsReader
from edged.core.devices import DeviceInventory
from edged.core.metrics_history import MetricsHistory
from edged.core.names import printable
from edged.core.repository.archives import ArchiveLimits
from edged.core.repository.control import ModelController
from edged.core.repository.manager import ManagerOptions, ModelRepositoryManager, ModelState
from edged.core.repository.modes import ControlMode, ControlOptions
from edged.core.repository.private_copies import FoldersOverlap
from edged.core.repository.probation import ProbationLimits
from edged.core.repository.uploads import ModelUploads, UploadOptions
from edged.core.response_cache import ResponseCache
from edged.core.scheduling.rate_limiter import RATE_LIMITER
from edged.core.service import InferenceService
from edged.core.shared_memory import SharedMemoryManager
from edged.core.stats import UnroutedErrors
from edged.core.tracing import TraceManager, parse_trace_config
from edged.daemon.alerts import AlertsPart, unready_models
from edged.daemon.console import console_part
from edged.daemon.endpoints import (
    BoundSockets,
    EndpointTls,
    GrpcEndpoint,
    StartupError,
    SystemMetricsPart,
    UvicornEndpoint,
    describe,
    http_endpoint,
    metrics_endpoint,
    raise_file_limit,
)
from edged.daemon.history import MetricsHistoryPart
from edged.daemon.parts import Part, Parts
from edged.daemon.reload import read_settings, reload
from edged.daemon.signals import Signals
from edged.daemon.sync import SyncPart, build_sync, mirrors, prepare_mirrors
from edged.daemon.systemd import ServiceNotifier
from edged.daemon.workers import WorkerPlan, WorkersPart
from edged.frontends.access import access_refusal_counter, counting
from edged.frontends.http import refusal_counter
from edged.frontends.metrics.endpoint import MetricsCollector, edged_registry
from edged.frontends.metrics.models import LatencyRecorder, ModelMetrics, ResponseCacheBytes
from edged.frontends.metrics.system import DeviceReader, SystemMetrics
from edged.state.lock import StateDirectoryLock
from edged.state.records import StateError
from edged.state.store import StateStore

if TYPE_CHECKING:
    from collections.abc import Callable, Iterator

    from prometheus_client import CollectorRegistry, Counter

    from edged.config.settings import Settings
    from edged.sync.agent import RepositorySync

log = logging.getLogger("edged")

# How often the status line systemd shows is brought up to date (sent only when it changed).
STATUS_REFRESH_S = 1.0


@dataclass(slots=True)
class Core:
    """What every part shares, built before any part starts: the repositories are checked and the state database
    opened here (StartupError with one line when either cannot be used), so the service is built whole, with its
    model control; nothing here loads a model or listens."""

    executor: ThreadPoolExecutor
    backends: BackendRegistry
    latencies: LatencyRecorder
    manager: ModelRepositoryManager
    controller: ModelController
    shared_memory: SharedMemoryManager
    service: InferenceService
    # edged's own metrics (edged_*), beside Triton's on /metrics, and the counters the parts update.
    registry: CollectorRegistry
    refused: Counter
    access: AccessPolicy
    # The last minutes of metrics, sampled by MetricsHistoryPart, for the console's live charts.
    history: MetricsHistory

    # Repository sync, when a repository is remote (s3://, gs://).
    sync: RepositorySync | None = None
    # The console's users and sessions, and the audit history of every door, when there is a state database.
    accounts: Accounts | None = None
    audit: AuditLog | None = None
    # The state database (API tokens, which frontend workers look up through the daemon).
    store: StateStore | None = None
    # Requests the access policy refused (frontend workers report theirs here too).
    access_refused: Counter | None = None
    # The alert rules an admin turned on in the console, when there is a state database to keep them.
    alerts: Alerts | None = None
    # The response cache (--cache-config), when there is one.
    response_cache: ResponseCache | None = None

    @classmethod
    def build(cls, settings: Settings) -> Core:
        if settings.remote_repositories:
            prepare_mirrors(settings)
        for repository in settings.model_repositories:
            try:
                with os.scandir(repository):
                    pass
            except OSError as exc:
                raise StartupError(f"model repository '{repository}' cannot be read: {exc.strerror}") from None
        try:
            state_dir = settings.state_dir
            store = StateStore.open(state_dir, settings.history_per_model) if state_dir is not None else None
        except StateError as exc:
            raise StartupError(str(exc)) from None
        # Worker threads for model executions: enough for every core to be busy in onnxruntime.
        executor = ThreadPoolExecutor(max_workers=max(4, 2 * (os.cpu_count() or 1)), thread_name_prefix="edged-exec")
        # Taken once: instance groups are checked against it and instances placed on it as models load.
        devices = DeviceInventory.discover()
        log.info("devices: %s", devices.describe())
        backends = BackendRegistry(settings.backend_config, backend_directory=settings.backend_directory)
        RATE_LIMITER.configure(settings.rate_limited, settings.rate_limit_resources)
        # Per-request latencies for the metrics' summaries and histograms, when --metrics-config asks for them.
        latencies = LatencyRecorder(settings.metrics_config)
        response_cache = ResponseCache(settings.cache_size) if settings.cache_size is not None else None
        manager = ModelRepositoryManager(
            ManagerOptions(
                repositories=settings.model_repositories,
                auto_complete=settings.auto_complete_config,
                default_max_batch_size=settings.default_max_batch_size,
                load_thread_count=settings.model_load_thread_count,
                load_retry_count=settings.model_load_retry_count,
                config_name=settings.model_config_name,
                devices=devices,
                request_observer=latencies.observer,
                response_cache=response_cache,
            ),
            executor,
            backends,
        )
        try:
            controller = ModelController(
                manager,
                ControlOptions(
                    mode=ControlMode(settings.model_control_mode),
                    poll_secs=settings.repository_poll_secs,
                    startup_models=settings.load_models,
                    load_thread_count=settings.model_load_thread_count,
                    state_dir=settings.state_dir,
                ),
                store,
            )
        except FoldersOverlap as exc:
            raise StartupError(str(exc)) from None
        registry = edged_registry()
        if response_cache is not None:
            registry.register(ResponseCacheBytes(response_cache))
        alerts = Alerts(store, device=settings.device_id) if store is not None else None
        if alerts is not None:
            try:
                # Read before any model loads, so that a model failing at start is judged by the rules.
                alerts.load()
            except StateError as exc:
                raise StartupError(str(exc)) from None
            controller.observe(alerts.model_event)
        sync = (
            build_sync(settings, controller, manager, store, registry, alerts) if settings.remote_repositories else None
        )
        uploads = ModelUploads(
            controller,
            manager,
            UploadOptions(
                settings.state_dir,
                ArchiveLimits(max_extracted_bytes=settings.upload_max_extracted_bytes),
                synced=mirrors(settings),
                # An activated upload is watched as a synced update is.
                probation=ProbationLimits(
                    window_s=settings.sync_probation_secs, max_error_rate=settings.sync_max_error_rate
                ),
            ),
        )
        shared_memory = SharedMemoryManager(allowed=settings.allow_client_shm)
        # Errors answered for no served model: the service counts them, the history shows their rate.
        unrouted = UnroutedErrors()
        history = MetricsHistory(lambda: manager.statistics("", -1), unrouted=unrouted)
        conditions = DeviceConditionsReader(settings.state_dir, lambda: manager.repositories)
        service = InferenceService(
            manager,
            server_id=settings.server_id,
            strict_readiness=settings.strict_readiness,
            shared_memory=shared_memory,
            controller=controller,
            sync=sync,
            history=history,
            uploads=uploads,
            unrouted=unrouted,
            conditions=conditions,
            alerts=alerts,
        )
        service.tracing = TraceManager(parse_trace_config(settings.trace_config))
        if alerts is not None:
            alerts.watch(
                Gauges(
                    started=lambda: service.started and not service.stopping,
                    ready=service.is_ready,
                    unready=lambda: unready_models(manager),
                    conditions=conditions.read,
                )
            )
        # Before any model loads: BLS calls and ensembles come back to the service.
        backends.attach(service)
        refused = refusal_counter(registry)
        # Account and token actions, from the console, the HTTP API and the command line alike.
        audit = AuditLog(store) if store is not None else None
        access_refused = access_refusal_counter(registry)
        access = AccessPolicy(settings.access, TokenVerifier(store), counting(access_refused))
        return cls(
            executor,
            backends,
            latencies,
            manager,
            controller,
            shared_memory,
            service,
            registry,
            refused,
            access,
            history,
            sync,
            Accounts(store) if store is not None else None,
            audit,
            store,
            access_refused,
            alerts,
            response_cache,
        )

    def status(self, endpoints: str) -> str:
        """``3/3 models ready; HTTP :8000, gRPC :8001, metrics :8002``: what ``systemctl status`` shows."""
        manager = self.manager
        entries = [entry for name in manager.names() if (entry := manager.entry(name)) is not None and entry.wanted]
        ready = sum(1 for entry in entries if entry.state is ModelState.READY)
        return f"{ready}/{len(entries)} models ready; {endpoints}"


class CorePart:
    """The core's resources: released last (the state database, the shared-memory regions, the worker pool)."""

    name = "core"

    def __init__(self, core: Core) -> None:
        self._core = core

    async def start(self) -> None:
        pass  # built already (Core.build)

    def stopping(self) -> None:
        self._core.service.stopping = True

    async def stop(self) -> None:
        if self._core.audit is not None:
            # The actions queued for the history are written before the state database closes.
            await asyncio.to_thread(self._core.audit.close)
        self._core.controller.close()
        self._core.shared_memory.close()
        self._core.service.tracing.close()  # traces still buffered (log_frequency 0) written, as Triton does at exit
        self._core.executor.shutdown(wait=False, cancel_futures=True)


class ModelsPart:
    """Model control: loads what this mode serves at start; at stop, every model unloads (stubs finalize)."""

    name = "models"

    def __init__(self, core: Core, settings: Settings) -> None:
        self._core = core
        self._settings = settings

    async def start(self) -> None:
        manager = self._core.manager
        log.info("edged %s starting: loading models from %s", __version__, ", ".join(map(str, manager.repositories)))
        await self._core.controller.start()
        failed = manager.failed()
        for what, reason in failed:
            log.error("%s is UNAVAILABLE: %s", what, reason)
        if failed and self._settings.exit_on_error:
            raise StartupError(f"{len(failed)} model(s) failed to load and --exit-on-error is set")
        missing = self._core.controller.missing_at_start
        if missing and self._settings.exit_on_error:
            named = ", ".join(f"'{printable(name)}'" for name in missing)
            raise StartupError(f"model {named} not found in any model repository and --exit-on-error is set")

    def stopping(self) -> None:
        pass

    async def stop(self) -> None:
        if self._core.service.uploads is not None:
            await self._core.service.uploads.close()
        await self._core.controller.stop()
        # Waits for what the cancelled requests left running (within the exit timeout); stubs' finalize() runs here.
        await self._core.manager.unload_all(self._settings.exit_timeout_secs)


class ReadinessPart:
    """The daemon serves: say so to the log and to systemd, keep the status line current, allow reloads."""

    name = "readiness"

    def __init__(self, core: Core, settings: Settings, notifier: ServiceNotifier, signals: Signals) -> None:
        self._core = core
        self._settings = settings
        self._notifier = notifier
        self._signals = signals
        self._refresh: asyncio.Task[None] | None = None
        self._endpoints = describe(settings)

    def status(self) -> str:
        return self._core.status(self._endpoints)

    async def start(self) -> None:
        settings = self._settings
        self._core.service.started = True
        log.info(
            "edged ready: HTTP on %s:%d%s%s",
            settings.http_address,
            settings.http_port,
            f", gRPC on {settings.grpc_address}:{settings.grpc_port}" if settings.allow_grpc else "",
            f", metrics on port {settings.metrics_port}" if settings.allow_metrics else "",
        )
        self._notifier.ready(self.status())
        if self._notifier.enabled:
            self._refresh = asyncio.create_task(self._refresh_status())
        self._signals.ready()

    def stopping(self) -> None:
        if self._refresh is not None:
            self._refresh.cancel()

    async def stop(self) -> None:
        if self._refresh is not None:
            await asyncio.gather(self._refresh, return_exceptions=True)

    async def _refresh_status(self) -> None:
        # Models change state on their own (poll mode, the repository API, a stub that died): follow them.
        while True:
            await asyncio.sleep(STATUS_REFRESH_S)
            if not self._signals.reloading:
                self._notifier.status(self.status())


async def serve(settings: Settings, reread: Callable[[], Settings] = read_settings) -> int:
    notifier = ServiceNotifier()
    # Fed from the first moment, so that a long model load is not mistaken for a hang (TimeoutStartSec bounds it).
    watchdog = notifier.start_watchdog()
    try:
        return await _serve(settings, reread, notifier)
    finally:
        if watchdog is not None:
            watchdog.cancel()
            await asyncio.gather(watchdog, return_exceptions=True)


async def _serve(settings: Settings, reread: Callable[[], Settings], notifier: ServiceNotifier) -> int:
    core: Core | None = None
    readiness: ReadinessPart | None = None
    tls = EndpointTls(settings)

    async def on_reload() -> None:
        assert core is not None and readiness is not None  # reloads run once the daemon is ready
        await reload(notifier, core.controller, settings, reread, readiness.status, tls.rotate)

    signals = Signals(on_reload)
    signals.install()  # before anything slow: SIGHUP's default action would end the daemon
    raise_file_limit(settings)
    notifier.status("loading models")
    parts = Parts()
    plan: WorkerPlan | None = None
    lock: StateDirectoryLock | None = None
    try:
        # First: a second daemon on the same state directory binds no port and opens no database (edged.state.lock).
        lock = _lock_state_dir(settings)
        plan = WorkerPlan.make(settings)
        core = Core.build(settings)
        readiness = ReadinessPart(core, settings, notifier, signals)
        endpoints: list[UvicornEndpoint] = []
        for part in _parts(core, settings, readiness, tls, endpoints, plan):
            await parts.start(part)
            if signals.stop.is_set():
                return 0
        waiter = asyncio.create_task(signals.stop.wait())
        tasks = [endpoint.task for endpoint in endpoints if endpoint.task is not None]
        await asyncio.wait([waiter, *tasks], return_when=asyncio.FIRST_COMPLETED)
        if not waiter.done():
            # An endpoint ended without being asked to: exit non-zero so systemd's Restart=on-failure applies.
            waiter.cancel()
            log.error("exiting: an endpoint stopped unexpectedly")
            return 1
        log.info("edged stopping")
        return 0
    except StartupError as exc:
        log.error("exiting: %s", exc)
        return 1
    finally:
        notifier.stopping()
        await signals.close()
        await parts.stop()
        if plan is not None:
            plan.remove()
        if lock is not None:
            lock.release()
        log.info("edged stopped")


def _lock_state_dir(settings: Settings) -> StateDirectoryLock | None:
    if settings.state_dir is None:
        return None
    try:
        return StateDirectoryLock.acquire(settings.state_dir)
    except StateError as exc:
        raise StartupError(str(exc)) from None


def _parts(
    core: Core,
    settings: Settings,
    readiness: ReadinessPart,
    tls: EndpointTls,
    endpoints: list[UvicornEndpoint],
    workers: WorkerPlan | None,
) -> Iterator[Part]:
    """The parts in start order: a generator, so that each endpoint is built once its socket is bound; the HTTP
    and metrics endpoints are added to ``endpoints`` as they are built (their ending unasked ends the daemon)."""
    sockets = BoundSockets(settings, share_http=workers is not None)
    yield CorePart(core)
    if core.alerts is not None:
        yield AlertsPart(core.alerts)
    yield sockets
    yield tls
    yield ModelsPart(core, settings)
    if core.sync is not None:
        yield SyncPart(core.sync)
    device = DeviceReader(cpu=settings.allow_cpu_metrics, gpu=settings.allow_gpu_metrics)
    yield MetricsHistoryPart(core.history, device)
    assert sockets.http is not None
    http = http_endpoint(settings, core.service, sockets.http, core.refused, core.access, tls.http, core.audit)
    endpoints.append(http)
    yield http
    if settings.allow_metrics:
        assert sockets.metrics is not None
        system = SystemMetrics(
            cpu=settings.allow_cpu_metrics,
            gpu=settings.allow_gpu_metrics,
            interval_ms=settings.metrics_interval_ms,
            registry=core.registry,
        )
        yield SystemMetricsPart(system)
        families = ModelMetrics(core.service, settings.metrics_config, core.latencies)
        collector = MetricsCollector(families, system, core.backends.custom_metrics, core.registry, core.response_cache)
        metrics = metrics_endpoint(settings, collector, sockets.metrics, core.refused, core.access, tls.metrics)
        endpoints.append(metrics)
        yield metrics
    if settings.allow_grpc:
        yield GrpcEndpoint(
            settings, core.service, core.access, tls.grpc, workers.grpc_socket if workers is not None else None
        )
    if sockets.console is not None and core.accounts is not None:
        console = console_part(
            settings, core.service, core.accounts, core.audit, core.access, sockets.console, core.refused, tls
        )
        endpoints.append(console)
        yield console
    if workers is not None:
        ports = (sockets.http.getsockname()[1], settings.grpc_port)
        counters = {"http_refused": core.refused}
        if core.access_refused is not None:
            counters["access_refused"] = core.access_refused
        yield WorkersPart(workers, settings, core.service, core.store, http.app, ports, counters)
    yield readiness


def run(settings: Settings) -> int:
    _configure_logging(settings)
    _fix_mmap_threshold()
    try:
        import uvloop

        loop: asyncio.AbstractEventLoop = uvloop.new_event_loop()
    except ImportError:  # uvloop is optional: plain asyncio works, only slower
        loop = asyncio.new_event_loop()
    asyncio.set_event_loop(loop)
    try:
        code = loop.run_until_complete(serve(settings))
        _finish(loop, code)
    finally:
        asyncio.set_event_loop(None)
    loop.close()
    return code


# How long the worker threads of the loop's default executor get to finish once every part has stopped.
EXECUTOR_GRACE_S = 5.0


def _finish(loop: asyncio.AbstractEventLoop, code: int) -> None:
    """As asyncio.run ends a loop (what is left cancelled, async generators closed, the default executor shut
    down), but within EXECUTOR_GRACE_S: a thread stuck in a blocking call must not keep a daemon that stopped in
    order from exiting (systemd would kill it, the state already closed). Such an exit is logged with the
    threads left."""
    tasks = asyncio.all_tasks(loop)
    for task in tasks:
        task.cancel()
    loop.run_until_complete(asyncio.gather(*tasks, return_exceptions=True))
    loop.run_until_complete(loop.shutdown_asyncgens())
    try:
        loop.run_until_complete(asyncio.wait_for(loop.shutdown_default_executor(), EXECUTOR_GRACE_S))
    except TimeoutError:
        import threading

        busy = sorted(thread.name for thread in threading.enumerate() if thread is not threading.main_thread())
        log.warning("exiting with worker threads still busy after %.0f s: %s", EXECUTOR_GRACE_S, ", ".join(busy))
        logging.shutdown()
        os._exit(code)


# Allocations from this size up are mapped on their own and given back to the system when freed (see below).
MMAP_THRESHOLD_BYTES = 16 * 1024 * 1024


def _fix_mmap_threshold() -> None:
    """glibc raises its mmap threshold each time a large mapped block is freed, up to 32 MiB, and serves later
    blocks below it from heaps it keeps: a console login's argon2 hash (19 MiB, in a worker thread's arena) then
    stays resident for good, about 20 MB of a small device's memory. A fixed threshold keeps blocks from 16 MiB up
    mapped (and returned when freed) while tensors below it come from the heap as before."""
    import ctypes
    import ctypes.util

    if os.environ.get("MALLOC_MMAP_THRESHOLD_"):
        return  # the environment chose already (glibc reads it at start)
    try:
        libc = ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6")
        mallopt = libc.mallopt
    except (OSError, AttributeError):
        return  # not glibc: its allocator has its own policy
    m_mmap_threshold = -3
    if not mallopt(m_mmap_threshold, MMAP_THRESHOLD_BYTES):
        log.debug("mallopt(M_MMAP_THRESHOLD) was refused; large blocks follow glibc's dynamic threshold")


def _configure_logging(settings: Settings) -> None:
    # Imported here so that this function is the daemon's whole contact with edged.logs.
    import sys

    from edged import logs

    try:
        # Triton's log flags; the logging extension changes all but the file at run time.
        logs.configure(
            settings.log_verbose,
            log_file=str(settings.log_file) if settings.log_file is not None else "",
            log_format="ISO8601" if settings.log_format == "ISO8601" else "default",
            log_info=settings.log_info,
            log_warning=settings.log_warning,
            log_error=settings.log_error,
        )
    except logs.LogFileError as exc:
        print(f"edged: {exc}", file=sys.stderr)
        raise SystemExit(1) from None
