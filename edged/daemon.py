"""The daemon's life cycle: build the parts, start them in order, serve, stop them in reverse.

One process, one event loop: the HTTP, gRPC and metrics servers share it; model executions that are too long
for the loop go to the worker pool (see edged.core.scheduler).

Signals, as systemd and a terminal send them:

- SIGTERM (``systemctl stop``, ``kill``) or SIGINT (Ctrl-C): stop accepting, let the requests in flight finish
  for up to ``exit_timeout_secs``, finalize the models, close the state database, exit 0. A second SIGTERM or
  SIGINT while that runs exits at once with status 1 (``FORCED_EXIT_STATUS``), without draining or finalizing.
- SIGHUP (``systemctl reload``): re-read the configuration and rescan the model repositories (see ``_reload``).

Start-up problems of the daemon itself (a port in use, a repository it cannot read, a state directory it cannot
write) end it with status 1 and one line saying why; a model that fails to load never does (unless
--exit-on-error).
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import logging
import os
import resource
import signal
import socket
import sys
from collections.abc import Awaitable, Generator
from concurrent.futures import ThreadPoolExecutor
from types import FrameType
from typing import TYPE_CHECKING, Any

import uvicorn

from edged import __version__, config
from edged.backends import BackendRegistry
from edged.core.devices import DeviceInventory
from edged.core.model_control import ControlMode, ControlOptions, ModelController
from edged.core.repository_manager import ManagerOptions, ModelRepositoryManager, ModelState
from edged.core.service import InferenceService
from edged.core.shared_memory import SharedMemoryManager
from edged.frontends.grpc import GrpcOptions, GrpcServer
from edged.frontends.http import create_http_app
from edged.frontends.http_infer import HttpOptions
from edged.frontends.http_limits import ConnectionLimits, LimitedHttpProtocol
from edged.frontends.http_protocol import InferHttpProtocol
from edged.metrics import LatencyRecorder, MetricsCollector, ModelMetrics, SystemMetrics, create_metrics_app
from edged.state.store import StateError, StateStore
from edged.systemd import ServiceNotifier

if TYPE_CHECKING:
    from collections.abc import Callable

    from edged.settings import Settings

log = logging.getLogger("edged")

STOP_SIGNALS = (signal.SIGTERM, signal.SIGINT)  # SIGTERM is what systemctl stop sends; SIGINT is Ctrl-C
# The exit status when a second stop signal cuts the drain short: a failure, as the models were not finalized.
FORCED_EXIT_STATUS = 1
# How often the status line systemd shows is brought up to date (sent only when it changed).
STATUS_REFRESH_S = 1.0
# The metrics endpoint serves a scraper or two, and GETs without bodies.
METRICS_MAX_CONNECTIONS = 64
METRICS_MAX_BODY_SIZE = 64 * 1024
# File descriptors kept for what is not a client connection: models' files, Python stubs' pipes and shared memory,
# shared-memory regions, the state database, journald.
RESERVED_FILE_DESCRIPTORS = 2048
# Settings a running daemon has no use for after it started: a reload that changes them changes nothing.
_START_ONLY = frozenset({"exit_on_error", "load_models"})


class StartupError(Exception):
    """The daemon cannot start; the message is the one line it exits with."""


class _Server(uvicorn.Server):
    """A uvicorn server that leaves signals to the daemon, which stops every server together."""

    @contextlib.contextmanager
    def capture_signals(self) -> Generator[None, None, None]:
        yield


def _configure_logging(settings: Settings) -> None:
    # Imported here so that this function is the daemon's whole contact with edged.logs.
    from edged import logs

    try:
        logs.configure(
            settings.log_verbose,
            # Read with defaults: the command line offers these once it has the flags.
            log_file=getattr(settings, "log_file", "") or "",
            log_format=getattr(settings, "log_format", "default"),
            log_info=getattr(settings, "log_info", True),
            log_warning=getattr(settings, "log_warning", True),
            log_error=getattr(settings, "log_error", True),
        )
    except logs.LogFileError as exc:
        print(f"edged: {exc}", file=sys.stderr)
        raise SystemExit(1) from None


def _uvicorn_config(
    app: Any, host: str, port: int, exit_timeout_s: float, protocol: type[LimitedHttpProtocol]
) -> uvicorn.Config:
    return uvicorn.Config(
        app,
        host=host,
        port=port,
        # uvicorn's httptools protocol with connection bounds (edged.frontends.http_limits); the HTTP endpoint's
        # also answers inference requests itself (edged.frontends.http_protocol).
        http=protocol,
        loop="none",
        lifespan="off",
        access_log=False,
        log_level="warning",
        # uvicorn's lines go through edged's handlers (journald under systemd, the logging extension's switches)
        # instead of a stderr handler of its own.
        log_config=None,
        # uvicorn types it int, but only hands it to loop.call_later, which takes seconds as a float.
        timeout_keep_alive=protocol.limits.keepalive_timeout_s,  # type: ignore[arg-type]
        # At shutdown, requests still running after this long are cancelled.
        timeout_graceful_shutdown=max(1, round(exit_timeout_s)),
    )


def connection_limits(settings: Settings) -> ConnectionLimits:
    return ConnectionLimits(
        max_connections=settings.http_max_connections,
        header_timeout_s=settings.http_header_timeout_secs,
        body_timeout_s=settings.http_body_timeout_secs,
        min_body_rate=settings.http_min_body_rate,
        keepalive_timeout_s=settings.http_keepalive_timeout_secs,
        max_body_size=settings.http_max_input_size,
    )


def raise_file_limit(settings: Settings) -> None:
    """Raise the soft limit on open files to the hard one (the systemd unit sets both), and say so when even that
    cannot hold every connection the endpoints allow: then one endpoint's clients could starve the others."""
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if hard != resource.RLIM_INFINITY and soft < hard:
        with contextlib.suppress(ValueError, OSError):
            resource.setrlimit(resource.RLIMIT_NOFILE, (hard, hard))
            soft = hard
    wanted = RESERVED_FILE_DESCRIPTORS + settings.http_max_connections
    wanted += settings.grpc_max_connections if settings.allow_grpc else 0
    wanted += METRICS_MAX_CONNECTIONS if settings.allow_metrics else 0
    if soft != resource.RLIM_INFINITY and soft < wanted:
        log.warning(
            "the open file limit (%d) is below the %d that the connection limits need (--http-max-connections, "
            "--grpc-max-connections and %d for the rest): raise LimitNOFILE or lower the connection limits",
            soft,
            wanted,
            RESERVED_FILE_DESCRIPTORS,
        )


def _bind(what: str, address: str, port: int) -> socket.socket:
    """A socket bound to the endpoint's address, not yet listening: binding before the models load makes a port
    in use fail the start at once, and nobody connects until the endpoint serves."""
    try:
        family, kind, proto, _, where = socket.getaddrinfo(
            address, port, type=socket.SOCK_STREAM, flags=socket.AI_PASSIVE
        )[0]
    except socket.gaierror as exc:
        raise StartupError(f"the {what} address '{address}' cannot be resolved: {exc.strerror}") from None
    sock = socket.socket(family, kind, proto)
    # As uvicorn binds: a restart must not wait for the previous daemon's connections in TIME_WAIT.
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    try:
        sock.bind(where)
    except OSError as exc:
        sock.close()
        raise StartupError(f"the {what} endpoint cannot listen on {address}:{port}: {exc.strerror}") from None
    return sock


def _check_repositories(settings: Settings) -> None:
    for repository in settings.model_repositories:
        try:
            with os.scandir(repository):
                pass
        except OSError as exc:
            raise StartupError(f"model repository '{repository}' cannot be read: {exc.strerror}") from None


def _status_line(manager: ModelRepositoryManager, endpoints: str) -> str:
    """``3/3 models ready; HTTP :8000, gRPC :8001, metrics :8002``: what ``systemctl status`` shows."""
    entries = [entry for name in manager.names() if (entry := manager.entry(name)) is not None and entry.wanted]
    ready = sum(1 for entry in entries if entry.state is ModelState.READY)
    return f"{ready}/{len(entries)} models ready; {endpoints}"


def read_settings() -> Settings:
    """The configuration as a fresh start would read it: the same command line, today's file and environment."""
    return config.resolve(sys.argv[1:], os.environ)


def _log_changes(running: Settings, read: Settings) -> None:
    """Name each setting the reload found changed; none of them applies before a restart."""
    for item in dataclasses.fields(running):
        old, new = getattr(running, item.name), getattr(read, item.name)
        if old == new:
            continue
        if item.name in _START_ONLY:
            log.info("reload: %s changed to %r; it only matters at start", item.name, new)
        else:
            log.warning("reload: %s changed from %r to %r; restart edged to apply it", item.name, old, new)


async def _reload(
    notifier: ServiceNotifier,
    controller: ModelController,
    running: Settings,
    reread: Callable[[], Settings],
    status: Callable[[], str],
) -> None:
    """SIGHUP: re-read the configuration, then rescan the repositories, between RELOADING=1 and READY=1.

    The rescan is poll mode's (ModelController.poll_once): models added, changed or removed are loaded, reloaded
    or unloaded without downtime. It runs twice, as two polls would, so that a folder that stopped changing at
    least SETTLE_S seconds ago is acted on now; one still being written is left for the next reload (or poll). In
    explicit mode the repository API alone decides what is loaded, so a rescan changes nothing.
    """
    notifier.reloading()
    log.info("reloading: re-reading the configuration and rescanning the model repositories")
    try:
        try:
            read = reread()
        except config.ConfigError as exc:
            log.error("reload: the configuration was not re-read (%s); the running one stays", exc)
        else:
            _log_changes(running, read)
        if controller.mode is ControlMode.EXPLICIT:
            log.info("reload: model control mode is explicit; models load and unload through the repository API")
        else:
            await controller.poll_once()
            await controller.poll_once()
    except Exception:
        log.exception("reload failed; edged keeps serving as before")
    finally:
        notifier.ready(status())
    log.info("reload done")


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
    exit_timeout_s = settings.exit_timeout_secs
    loop = asyncio.get_running_loop()
    stop = asyncio.Event()
    ready = False
    reload_wanted = False
    reloading: asyncio.Task[None] | None = None

    def force_exit(signum: int, frame: FrameType | None) -> None:
        del frame
        log.error("%s received again: exiting at once, without draining", signal.Signals(signum).name)
        for handler in logging.getLogger().handlers:
            handler.flush()
        os._exit(FORCED_EXIT_STATUS)

    def on_stop_signal(signum: signal.Signals) -> None:
        log.info("%s received: stopping (send it again to exit at once)", signum.name)
        stop.set()
        # A plain handler from here on: it runs even while the loop waits on a model's finalize.
        for stop_signal in STOP_SIGNALS:
            loop.remove_signal_handler(stop_signal)
            signal.signal(stop_signal, force_exit)

    def on_reload_signal() -> None:
        nonlocal reload_wanted, reloading
        if stop.is_set():
            log.info("SIGHUP received while stopping: ignored")
            return
        if not ready or (reloading is not None and not reloading.done()):
            log.info("SIGHUP received: reloading once %s", "started" if not ready else "this reload is done")
            reload_wanted = True
            return
        start_reload()

    def start_reload() -> None:
        nonlocal reload_wanted, reloading
        reload_wanted = False
        reloading = loop.create_task(_reload(notifier, controller, settings, reread, status))
        reloading.add_done_callback(lambda _: start_reload() if reload_wanted and not stop.is_set() else None)

    for stop_signal in STOP_SIGNALS:
        loop.add_signal_handler(stop_signal, on_stop_signal, stop_signal)
    # Installed before anything slow: SIGHUP's default action would end the daemon.
    loop.add_signal_handler(signal.SIGHUP, on_reload_signal)

    raise_file_limit(settings)
    # Worker threads for model executions: enough for every core to be busy in onnxruntime.
    executor = ThreadPoolExecutor(max_workers=max(4, 2 * (os.cpu_count() or 1)), thread_name_prefix="edged-exec")
    # Taken once: instance groups are checked against it and instances placed on it as models load.
    devices = DeviceInventory.discover()
    log.info("devices: %s", devices.describe())
    backends = BackendRegistry(settings.backend_config)
    # Per-request latencies for the metrics' summaries and histograms, when --metrics-config asks for them.
    latencies = LatencyRecorder(settings.metrics_config)
    manager = ModelRepositoryManager(
        ManagerOptions(
            repositories=settings.model_repositories,
            auto_complete=settings.auto_complete_config,
            default_max_batch_size=settings.default_max_batch_size,
            load_thread_count=settings.model_load_thread_count,
            devices=devices,
            request_observer=latencies.observer,
        ),
        executor,
        backends,
    )
    shared_memory = SharedMemoryManager(allowed=settings.allow_client_shm)
    service = InferenceService(
        manager,
        server_id=settings.server_id,
        strict_readiness=settings.strict_readiness,
        shared_memory=shared_memory,
    )
    # Before any model loads: BLS calls and ensembles come back to the service.
    backends.attach(service)
    store: StateStore | None = None
    sockets: list[socket.socket] = []
    try:
        _check_repositories(settings)
        if settings.state_dir is not None:
            store = StateStore.open(settings.state_dir)
        sockets.append(_bind("HTTP", settings.http_address, settings.http_port))
        if settings.allow_metrics:
            sockets.append(_bind("metrics", settings.metrics_address or settings.http_address, settings.metrics_port))
    except (StartupError, StateError) as exc:
        for sock in sockets:
            sock.close()
        if store is not None:
            store.close()
        executor.shutdown(wait=False)
        log.error("exiting: %s", exc)
        return 1
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
    service.controller = controller
    endpoints = ", ".join(
        f"{what} :{port}"
        for what, port, enabled in (
            ("HTTP", settings.http_port, True),
            ("gRPC", settings.grpc_port, settings.allow_grpc),
            ("metrics", settings.metrics_port, settings.allow_metrics),
        )
        if enabled
    )

    def status() -> str:
        return _status_line(manager, endpoints)

    async def refresh_status() -> None:
        # Models change state on their own (poll mode, the repository API, a stub that died): follow them.
        while True:
            await asyncio.sleep(STATUS_REFRESH_S)
            if reloading is None or reloading.done():
                notifier.status(status())

    grpc_server: GrpcServer | None = None
    system_metrics: SystemMetrics | None = None
    servers: list[_Server] = []
    tasks: list[asyncio.Task[None]] = []
    status_task: asyncio.Task[None] | None = None
    try:
        log.info(
            "edged %s starting: loading models from %s",
            __version__,
            ", ".join(str(p) for p in settings.model_repositories),
        )
        notifier.status("loading models")
        await controller.start()
        failed = manager.failed()
        for what, reason in failed:
            log.error("%s is UNAVAILABLE: %s", what, reason)
        if failed and settings.exit_on_error:
            log.error("exiting: %d model(s) failed to load and --exit-on-error is set", len(failed))
            return 1
        if stop.is_set():
            return 0
        http_socket, *metrics_socket = sockets
        http_options = HttpOptions(max_input_size=settings.http_max_input_size)
        limits = connection_limits(settings)
        http = _Server(
            _uvicorn_config(
                create_http_app(service, http_options),
                settings.http_address,
                settings.http_port,
                exit_timeout_s,
                InferHttpProtocol.serving(service, http_options, limits),
            )
        )
        servers.append(http)
        tasks.append(asyncio.create_task(http.serve(sockets=[http_socket])))
        if settings.allow_metrics:
            system_metrics = SystemMetrics(
                cpu=settings.allow_cpu_metrics,
                gpu=settings.allow_gpu_metrics,
                interval_ms=settings.metrics_interval_ms,
            )
            system_metrics.start()
            collector = MetricsCollector(
                ModelMetrics(manager, settings.metrics_config, latencies), system_metrics, backends.custom_metrics
            )
            metrics = _Server(
                _uvicorn_config(
                    create_metrics_app(collector),
                    settings.metrics_address or settings.http_address,
                    settings.metrics_port,
                    exit_timeout_s,
                    LimitedHttpProtocol.limited(
                        dataclasses.replace(
                            limits, max_connections=METRICS_MAX_CONNECTIONS, max_body_size=METRICS_MAX_BODY_SIZE
                        ),
                        "metrics",
                    ),
                )
            )
            servers.append(metrics)
            tasks.append(asyncio.create_task(metrics.serve(sockets=metrics_socket)))
        if settings.allow_grpc:
            try:
                grpc_server = GrpcServer(
                    service,
                    settings.grpc_address,
                    settings.grpc_port,
                    GrpcOptions(
                        max_message_size=settings.grpc_max_message_size,
                        shutdown_grace_s=exit_timeout_s,
                        max_connections=settings.grpc_max_connections,
                        handshake_timeout_s=settings.grpc_handshake_timeout_secs,
                        idle_timeout_s=settings.grpc_idle_timeout_secs,
                    ),
                )
            except RuntimeError as exc:
                # grpc's own text ("Failed to bind to address ...") names the address; there is no more to say.
                log.error("exiting: the gRPC endpoint failed to start: %s", exc)
                return 1
            await grpc_server.start()
        while not all(s.started for s in servers):
            if any(t.done() for t in tasks):
                # The sockets are bound already, so this is rare (no file descriptors left, say); uvicorn said why.
                log.error("exiting: an endpoint failed to start")
                return 1
            await asyncio.sleep(0.01)
        service.started = True
        log.info(
            "edged ready: HTTP on %s:%d%s%s",
            settings.http_address,
            settings.http_port,
            f", gRPC on {grpc_server.address}" if grpc_server else "",
            f", metrics on port {settings.metrics_port}" if settings.allow_metrics else "",
        )
        notifier.ready(status())
        ready = True
        if notifier.enabled:
            status_task = asyncio.create_task(refresh_status())
        if reload_wanted:
            start_reload()
        waiter = asyncio.create_task(stop.wait())
        await asyncio.wait([waiter, *tasks], return_when=asyncio.FIRST_COMPLETED)
        if not waiter.done():
            # An endpoint ended without being asked to: exit non-zero so systemd's Restart=on-failure applies.
            waiter.cancel()
            log.error("exiting: an endpoint stopped unexpectedly")
            return 1
        log.info("edged stopping")
        return 0
    finally:
        notifier.stopping()
        service.stopping = True
        for task in (status_task, reloading):
            if task is not None:
                task.cancel()
        for server in servers:
            server.should_exit = True
        # Servers stop accepting and finish the requests they have before the models go away; each cancels what
        # still runs after the exit timeout. gRPC refuses new calls at once; open streams answer what they read.
        stopping: list[Awaitable[Any]] = [*tasks, *(t for t in (status_task, reloading) if t is not None)]
        if grpc_server is not None:
            stopping.append(grpc_server.stop())
        await asyncio.gather(*stopping, return_exceptions=True)
        for sock in sockets:
            sock.close()
        await controller.stop()
        # Waits for the executions the cancelled requests left behind; Python stubs' finalize() runs here.
        await manager.unload_all()
        controller.close()
        if system_metrics is not None:
            system_metrics.stop()
        shared_memory.close()
        executor.shutdown(wait=False, cancel_futures=True)
        log.info("edged stopped")


def run(settings: Settings) -> int:
    _configure_logging(settings)
    try:
        import uvloop
    except ImportError:  # uvloop is optional: plain asyncio works, only slower
        return asyncio.run(serve(settings))
    return uvloop.run(serve(settings))
