"""The daemon's life cycle: build the parts, start them in order, serve, stop them in reverse.

One process, one event loop: the HTTP, gRPC and metrics servers share it; model executions that are too long
for the loop go to the worker pool (see edged.core.scheduler).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import signal
import sys
from collections.abc import Awaitable, Generator
from concurrent.futures import ThreadPoolExecutor
from typing import TYPE_CHECKING, Any

import uvicorn

from edged import __version__
from edged.backends import configure as configure_backends
from edged.backends import custom_metrics
from edged.core.devices import DeviceInventory
from edged.core.model_control import ControlMode, ControlOptions, ModelController
from edged.core.repository_manager import ManagerOptions, ModelRepositoryManager
from edged.core.service import InferenceService
from edged.core.shared_memory import SharedMemoryManager
from edged.frontends.grpc import GrpcOptions, GrpcServer
from edged.frontends.http import HttpOptions, create_http_app
from edged.metrics import MetricsCollector, ModelMetrics, SystemMetrics, create_metrics_app
from edged.state.store import StateError, StateStore

if TYPE_CHECKING:
    from edged.settings import Settings

log = logging.getLogger("edged")


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


def _uvicorn_config(app: Any, host: str, port: int) -> uvicorn.Config:
    return uvicorn.Config(
        app,
        host=host,
        port=port,
        http="httptools",
        loop="none",
        lifespan="off",
        access_log=False,
        log_level="warning",
        # Requests from devices arrive over keep-alive connections; closing idle ones late saves reconnects.
        timeout_keep_alive=30,
    )


async def serve(settings: Settings) -> int:
    # Worker threads for model executions: enough for every core to be busy in onnxruntime.
    executor = ThreadPoolExecutor(max_workers=max(4, 2 * (os.cpu_count() or 1)), thread_name_prefix="edged-exec")
    # Taken once: instance groups are checked against it and instances placed on it as models load.
    devices = DeviceInventory.discover()
    log.info("devices: %s", devices.describe())
    manager = ModelRepositoryManager(
        ManagerOptions(
            repositories=settings.model_repositories,
            auto_complete=settings.auto_complete_config,
            default_max_batch_size=settings.default_max_batch_size,
            load_thread_count=settings.model_load_thread_count,
            devices=devices,
        ),
        executor,
    )
    shared_memory = SharedMemoryManager(allowed=settings.allow_client_shm)
    service = InferenceService(
        manager,
        server_id=settings.server_id,
        strict_readiness=settings.strict_readiness,
        shared_memory=shared_memory,
    )
    # Before any model loads: backends read their --backend-config settings, and BLS calls come back here.
    configure_backends(settings.backend_config, service)
    store: StateStore | None = None
    if settings.state_dir is not None:
        try:
            store = StateStore.open(settings.state_dir)
        except StateError as exc:
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
    grpc_server: GrpcServer | None = None
    system_metrics: SystemMetrics | None = None
    servers: list[_Server] = []
    tasks: list[asyncio.Task[None]] = []
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for signum in (signal.SIGTERM, signal.SIGINT):  # SIGTERM is what systemctl stop sends
        loop.add_signal_handler(signum, stop.set)
    try:
        log.info(
            "edged %s starting: loading models from %s",
            __version__,
            ", ".join(str(p) for p in settings.model_repositories),
        )
        await controller.start()
        failed = manager.failed()
        for what, reason in failed:
            log.error("%s is UNAVAILABLE: %s", what, reason)
        if failed and settings.exit_on_error:
            log.error("exiting: %d model(s) failed to load and --exit-on-error is set", len(failed))
            return 1
        http = _Server(
            _uvicorn_config(
                create_http_app(service, HttpOptions(max_input_size=settings.http_max_input_size)),
                settings.http_address,
                settings.http_port,
            )
        )
        servers.append(http)
        if settings.allow_metrics:
            system_metrics = SystemMetrics(
                cpu=settings.allow_cpu_metrics,
                gpu=settings.allow_gpu_metrics,
                interval_ms=settings.metrics_interval_ms,
            )
            system_metrics.start()
            collector = MetricsCollector(ModelMetrics(manager, settings.metrics_config), system_metrics, custom_metrics)
            metrics = _Server(
                _uvicorn_config(
                    create_metrics_app(collector),
                    settings.metrics_address or settings.http_address,
                    settings.metrics_port,
                )
            )
            servers.append(metrics)
        if settings.allow_grpc:
            try:
                grpc_server = GrpcServer(
                    service,
                    settings.grpc_address,
                    settings.grpc_port,
                    GrpcOptions(max_message_size=settings.grpc_max_message_size),
                )
            except RuntimeError as exc:
                # grpc's own text ("Failed to bind to address ...") names the address; there is no more to say.
                log.error("exiting: the gRPC endpoint failed to start: %s", exc)
                return 1
            await grpc_server.start()
        tasks.extend(asyncio.create_task(s.serve()) for s in servers)
        while not all(s.started for s in servers):
            done = [t for t in tasks if t.done()]
            if done:
                # A server that ends before it started could not bind its port; uvicorn has logged why.
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
        service.stopping = True
        for server in servers:
            server.should_exit = True
        # Servers stop accepting and finish the requests they have before the models go away. gRPC refuses new
        # calls at once and gives the ones in flight a grace period; open streams answer what they read and end.
        stopping: list[Awaitable[Any]] = list(tasks)
        if grpc_server is not None:
            stopping.append(grpc_server.stop())
        await asyncio.gather(*stopping, return_exceptions=True)
        await controller.stop()
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
