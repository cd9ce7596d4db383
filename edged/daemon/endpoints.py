"""The daemon's network parts: the sockets bound before the models load, the HTTP and metrics servers (uvicorn)
and the gRPC server, each a part with start and stop (edged.daemon.parts), and the bounds they are held to."""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import errno
import logging
import resource
import socket
import ssl
from collections.abc import Generator
from pathlib import Path
from typing import TYPE_CHECKING, Any

import uvicorn

from edged.core.access import AccessPolicy, Category
from edged.frontends.access import AccessMiddleware
from edged.frontends.forwarding import forward_pattern
from edged.frontends.grpc import GrpcOptions, GrpcServer, inference_methods
from edged.frontends.http import (
    ConnectionLimits,
    HttpOptions,
    InferHttpProtocol,
    LimitedHttpProtocol,
)
from edged.frontends.http.access import http_category
from edged.frontends.metrics.endpoint import MetricsCollector, create_metrics_app
from edged.frontends.tls import GrpcTls, HttpTls, TlsError, TlsFiles

if TYPE_CHECKING:
    from prometheus_client import Counter

    from edged.config.settings import Settings
    from edged.core.audit import AuditLog
    from edged.core.service import InferenceService
    from edged.frontends.metrics.system import SystemMetrics

log = logging.getLogger("edged")

# The metrics endpoint serves a scraper or two, and GETs without bodies.
METRICS_MAX_CONNECTIONS = 64
METRICS_MAX_BODY_SIZE = 64 * 1024
# The console serves a few people at a time; its bodies are forms (uploads have their own limit).
CONSOLE_MAX_CONNECTIONS = 64
CONSOLE_MAX_BODY_SIZE = 1024 * 1024
# File descriptors kept for what is not a client connection: models' files, Python stubs' pipes and shared memory,
# shared-memory regions, the state database, journald.
RESERVED_FILE_DESCRIPTORS = 2048


class StartupError(Exception):
    """The daemon cannot start; the message is the one line it exits with."""


def connection_limits(settings: Settings) -> ConnectionLimits:
    return ConnectionLimits(
        max_connections=settings.http_max_connections,
        header_timeout_s=settings.http_header_timeout_secs,
        body_timeout_s=settings.http_body_timeout_secs,
        min_body_rate=settings.http_min_body_rate,
        keepalive_timeout_s=settings.http_keepalive_timeout_secs,
        max_body_size=settings.http_max_input_size,
        max_chunks=settings.http_max_chunks,
        max_upload_size=settings.upload_max_bytes,
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
    wanted += CONSOLE_MAX_CONNECTIONS if console_enabled(settings) else 0
    if soft != resource.RLIM_INFINITY and soft < wanted:
        log.warning(
            "the open file limit (%d) is below the %d that the connection limits need (--http-max-connections, "
            "--grpc-max-connections and %d for the rest): raise LimitNOFILE or lower the connection limits",
            soft,
            wanted,
            RESERVED_FILE_DESCRIPTORS,
        )


def describe(settings: Settings) -> str:
    """``HTTP :8000, gRPC :8001, metrics :8002``: the endpoints, for the status line."""
    return ", ".join(
        f"{what} :{port}"
        for what, port, enabled in (
            ("HTTP", settings.http_port, True),
            ("gRPC", settings.grpc_port, settings.allow_grpc),
            ("metrics", settings.metrics_port, settings.allow_metrics),
            ("console", settings.console_port, console_enabled(settings)),
        )
        if enabled
    )


class BoundSockets:
    """The HTTP and metrics sockets, bound (not listening) before the models load: a port in use fails the start
    at once, and nobody connects until the endpoint serves. Closed once the servers on them have stopped."""

    name = "sockets"

    def __init__(self, settings: Settings, *, share_http: bool = False) -> None:
        self._settings = settings
        self._share_http = share_http
        self.http: socket.socket | None = None
        self.metrics: socket.socket | None = None
        self.console: socket.socket | None = None

    async def start(self) -> None:
        settings = self._settings
        self.http = bind_socket("HTTP", settings.http_address, settings.http_port, share_port=self._share_http)
        if settings.allow_metrics:
            self.metrics = bind_socket(
                "metrics", settings.metrics_address or settings.http_address, settings.metrics_port
            )
        if console_enabled(settings):
            self.console = bind_socket(
                "console", settings.console_address or settings.http_address, settings.console_port
            )

    def stopping(self) -> None:
        pass

    async def stop(self) -> None:
        for sock in (self.http, self.metrics, self.console):
            if sock is not None:
                sock.close()


class EndpointTls:
    """The TLS of every endpoint that has it: the files read and checked before the models load (a bad file fails
    the start at once, naming it), and read again on reload (``rotate``), keeping the old pair when the new one
    cannot be used. The metrics endpoint shares the HTTP endpoint's files, and its context when both use TLS."""

    name = "TLS"

    def __init__(self, settings: Settings) -> None:
        self._settings = settings
        self.http: HttpTls | None = None
        self.metrics: HttpTls | None = None
        self.console: HttpTls | None = None
        self.grpc: GrpcTls | None = None

    async def start(self) -> None:
        settings = self._settings
        try:
            http = _http_files(settings, settings.http_use_ssl or settings.http_use_ssl_mutual, "--http-use-ssl")
            if http is not None:
                self.http = HttpTls(http)
            metrics = _http_files(settings, settings.allow_metrics and settings.metrics_use_ssl, "--metrics-use-ssl")
            if metrics is not None:
                self.metrics = self.http or HttpTls(metrics)
            console = _http_files(settings, console_enabled(settings) and settings.console_use_ssl, "--console-use-ssl")
            if console is not None:
                # The console's clients are browsers, which present no certificate: never mutual.
                self.console = HttpTls(dataclasses.replace(console, client_ca=None))
            grpc_files = _grpc_files(
                settings, settings.allow_grpc and (settings.grpc_use_ssl or settings.grpc_use_ssl_mutual)
            )
            if grpc_files is not None:
                self.grpc = GrpcTls(grpc_files)
        except TlsError as exc:
            raise StartupError(str(exc)) from None
        for what, tls in (
            ("HTTP", self.http),
            ("metrics", self.metrics),
            ("console", self.console),
            ("gRPC", self.grpc),
        ):
            if tls is not None:
                mutual = ", mutual: clients need a certificate signed by " if tls.files.client_ca else ""
                log.info("%s over TLS with %s%s%s", what, tls.files.cert, mutual, tls.files.client_ca or "")

    def stopping(self) -> None:
        pass

    async def stop(self) -> None:
        pass

    def rotate(self, settings: Settings) -> None:
        """Re-read the files ``settings`` name (whether TLS is on, and mutual, stays as the daemon started); each
        endpoint says in one line whether it took the new pair or kept the old one, and why."""
        # A changed --*-use-ssl-mutual is reported as a change that needs a restart (reload.log_changes).
        settings = dataclasses.replace(
            settings,
            http_use_ssl_mutual=self._settings.http_use_ssl_mutual,
            grpc_use_ssl_mutual=self._settings.grpc_use_ssl_mutual,
        )
        endpoints: list[tuple[str, HttpTls | GrpcTls, str]] = []
        if self.http is not None:
            endpoints.append(("HTTP", self.http, "--http-use-ssl"))
        if self.metrics is not None and self.metrics is not self.http:
            endpoints.append(("metrics", self.metrics, "--metrics-use-ssl"))
        if self.console is not None:
            endpoints.append(("console", self.console, "--console-use-ssl"))
        if self.grpc is not None:
            endpoints.append(("gRPC", self.grpc, "--grpc-use-ssl"))
        for what, tls, flag in endpoints:
            try:
                new = _grpc_files(settings, True) if isinstance(tls, GrpcTls) else _http_files(settings, True, flag)
                assert new is not None  # asked for with TLS on
                tls.rotate(new)
            except TlsError as exc:
                log.error("reload: the %s endpoint keeps its TLS certificate: %s", what, exc)
            else:
                log.info("reload: the %s endpoint's TLS certificate was re-read from %s", what, tls.files.cert)


def _http_files(settings: Settings, wanted: bool, flag: str) -> TlsFiles | None:
    return _tls_files(
        "http",
        flag,
        wanted,
        settings.http_use_ssl_mutual,
        (settings.http_server_cert, settings.http_server_key, settings.http_root_cert),
    )


def _grpc_files(settings: Settings, wanted: bool) -> TlsFiles | None:
    return _tls_files(
        "grpc",
        "--grpc-use-ssl",
        wanted,
        settings.grpc_use_ssl_mutual,
        (settings.grpc_server_cert, settings.grpc_server_key, settings.grpc_root_cert),
    )


def _tls_files(
    prefix: str, flag: str, wanted: bool, mutual: bool, paths: tuple[Path | None, Path | None, Path | None]
) -> TlsFiles | None:
    """The files an endpoint's TLS reads, or None without TLS; TlsError when a file it needs is not named."""
    if not wanted:
        return None
    cert, key, root = paths
    if cert is None or key is None:
        raise TlsError(f"{flag} needs --{prefix}-server-cert and --{prefix}-server-key")
    if mutual and root is None:
        raise TlsError(f"--{prefix}-use-ssl-mutual needs --{prefix}-root-cert (the CA of the client certificates)")
    return TlsFiles(cert, key, root if mutual else None)


class UvicornEndpoint:
    """An HTTP server on a bound socket. ``task`` ends when the server does (asked to, or not)."""

    def __init__(self, name: str, config: uvicorn.Config, sock: socket.socket) -> None:
        self.name = name
        self._server = _Server(config)
        self._socket = sock
        self.task: asyncio.Task[None] | None = None

    @property
    def app(self) -> Any:
        """The ASGI app the endpoint serves."""
        return self._server.config.app

    async def start(self) -> None:
        self.task = asyncio.create_task(self._server.serve(sockets=[self._socket]))
        while not self._server.started:
            if self.task.done():
                # The socket is bound already, so this is rare (no file descriptors left, say); uvicorn said why.
                raise StartupError("an endpoint failed to start")
            await asyncio.sleep(0.01)

    def stopping(self) -> None:
        # Stops accepting and finishes the requests it has; cancels what still runs after the exit timeout.
        self._server.should_exit = True

    async def stop(self) -> None:
        if self.task is not None:
            await asyncio.gather(self.task, return_exceptions=True)


def http_endpoint(
    settings: Settings,
    service: InferenceService,
    sock: socket.socket,
    refused: Counter,
    access: AccessPolicy,
    tls: HttpTls | None = None,
    audit: AuditLog | None = None,
) -> UvicornEndpoint:
    options = HttpOptions(
        max_input_size=settings.http_max_input_size,
        max_json_depth=settings.http_max_json_depth,
        max_upload_size=settings.upload_max_bytes,
        forward_pattern=forward_pattern(settings.http_header_forward_pattern),
    )
    # The protocol's own inference path skips the ASGI app, and the policy with it: taken only when open to all.
    fast_infer = access.is_open(Category.INFERENCE, "http")
    protocol = InferHttpProtocol.serving(service, options, connection_limits(settings), refused, fast_infer=fast_infer)
    from edged.frontends.http.routes import create_http_app  # Litestar: the daemon's, not a worker's

    app = AccessMiddleware(create_http_app(service, options, access, audit), access, "http", http_category)
    config = uvicorn_config(app, settings, protocol, tls)
    return UvicornEndpoint("the HTTP endpoint", config, sock)


def metrics_endpoint(
    settings: Settings,
    collector: MetricsCollector,
    sock: socket.socket,
    refused: Counter,
    access: AccessPolicy,
    tls: HttpTls | None = None,
) -> UvicornEndpoint:
    limits = dataclasses.replace(
        connection_limits(settings),
        max_connections=METRICS_MAX_CONNECTIONS,
        max_body_size=METRICS_MAX_BODY_SIZE,
        max_upload_size=None,
    )
    protocol = LimitedHttpProtocol.limited(limits, "metrics", refused)
    app = AccessMiddleware(create_metrics_app(collector), access, "metrics", lambda _method, _path: Category.METRICS)
    return UvicornEndpoint("the metrics endpoint", uvicorn_config(app, settings, protocol, tls), sock)


def console_enabled(settings: Settings) -> bool:
    """The console serves when allowed and there is a state directory for its users and sessions."""
    return settings.allow_console and settings.state_dir is not None


def console_config(settings: Settings, app: Any, refused: Counter, tls: HttpTls | None = None) -> uvicorn.Config:
    """The console's server: a few browsers, form posts and uploads (within --upload-max-bytes)."""
    limits = dataclasses.replace(
        connection_limits(settings),
        max_connections=CONSOLE_MAX_CONNECTIONS,
        max_body_size=CONSOLE_MAX_BODY_SIZE,
    )
    protocol = LimitedHttpProtocol.limited(limits, "console", refused)
    return uvicorn_config(app, settings, protocol, tls)


class SystemMetricsPart:
    """The CPU and GPU gauges, sampled in a thread of their own while the metrics endpoint serves."""

    name = "system metrics"

    def __init__(self, metrics: SystemMetrics) -> None:
        self._metrics = metrics

    async def start(self) -> None:
        self._metrics.start()

    def stopping(self) -> None:
        pass

    async def stop(self) -> None:
        self._metrics.stop()


class GrpcEndpoint:
    name = "the gRPC endpoint"

    def __init__(
        self,
        settings: Settings,
        service: InferenceService,
        access: AccessPolicy,
        tls: GrpcTls | None = None,
        relay_socket: str | None = None,
    ) -> None:
        """``relay_socket``: frontend workers share the port and relay calls to this Unix socket."""
        self._settings = settings
        self._service = service
        self._access = access
        self._tls = tls
        self._relay_socket = relay_socket
        self.server: GrpcServer | None = None

    async def start(self) -> None:
        settings = self._settings
        options = grpc_options(settings)
        sock = bind_socket("gRPC", settings.grpc_address, settings.grpc_port, share_port=self._relay_socket is not None)
        table, servicer = inference_methods(self._service, options, self._access)
        tls = self._tls.context if self._tls is not None else None
        self.server = GrpcServer(table, sock, options, tls, self._relay_socket, servicer)
        await self.server.start()

    def stopping(self) -> None:
        pass  # new calls are refused as the stop begins, in stop()

    async def stop(self) -> None:
        # New calls are refused at once; open streams answer what they read, within the exit timeout.
        if self.server is not None:
            await self.server.stop()


def grpc_options(settings: Settings) -> GrpcOptions:
    return GrpcOptions(
        max_message_size=settings.grpc_max_message_size,
        shutdown_grace_s=settings.exit_timeout_secs,
        max_connections=settings.grpc_max_connections,
        handshake_timeout_s=settings.grpc_handshake_timeout_secs,
        idle_timeout_s=settings.grpc_idle_timeout_secs,
        body_timeout_s=settings.grpc_body_timeout_secs,
        min_body_rate=settings.grpc_min_body_rate,
        max_buffered_bytes=settings.grpc_max_buffered_bytes,
        max_queued_stream_bytes=settings.grpc_max_queued_stream_bytes,
        response_pool=settings.grpc_max_response_pool_size,
        forward_pattern=forward_pattern(settings.grpc_header_forward_pattern),
    )


class _Server(uvicorn.Server):
    """A uvicorn server that leaves signals to the daemon, which stops every server together, and bounds TLS
    handshakes."""

    @contextlib.contextmanager
    def capture_signals(self) -> Generator[None, None, None]:
        yield

    async def startup(self, sockets: list[socket.socket] | None = None) -> None:
        config = self.config
        protocol = config.http_protocol_class
        if config.ssl is None or sockets is None or not issubclass(protocol, LimitedHttpProtocol):
            await super().startup(sockets)
            return
        # As uvicorn's, but with the handshake held to the header timeout (a new connection must begin its first
        # request within it): asyncio gives a client that never sends its ClientHello a minute, and the connection
        # limit cannot count it before the protocol's connection_made, which comes after the handshake.
        await self.lifespan.startup()

        def create_protocol(_loop: asyncio.AbstractEventLoop | None = None) -> asyncio.Protocol:
            return protocol(config=config, server_state=self.server_state, app_state=self.lifespan.state, _loop=_loop)

        loop = asyncio.get_running_loop()
        self.servers = [
            await loop.create_server(
                create_protocol,
                sock=sock,
                ssl=config.ssl,
                backlog=config.backlog,
                ssl_handshake_timeout=protocol.limits.header_timeout_s,
            )
            for sock in sockets
        ]
        self.started = True


def uvicorn_config(
    app: Any, settings: Settings, protocol: type[LimitedHttpProtocol], tls: HttpTls | None
) -> uvicorn.Config:
    context = tls.context if tls is not None else None

    def tls_context(_config: uvicorn.Config, _default: Any) -> ssl.SSLContext:
        assert context is not None
        return context

    return uvicorn.Config(
        app,
        # uvicorn's httptools protocol with connection bounds (edged.frontends.http.limits); the HTTP endpoint's
        # also answers inference requests itself (edged.frontends.http.protocol).
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
        timeout_graceful_shutdown=max(1, round(settings.exit_timeout_secs)),
        # The context edged built (and rotates), not one uvicorn would build from file names.
        ssl_context_factory=tls_context if context is not None else None,
    )


def bind_socket(what: str, address: str, port: int, *, share_port: bool = False, worker: bool = False) -> socket.socket:
    """The endpoint's socket, bound. ``share_port``: frontend workers listen on the port too (SO_REUSEPORT); the
    daemon (not a ``worker``) checks first that nobody else holds it, as sharing would hide a second daemon."""
    if share_port and not worker and port != 0:
        bind_socket(what, address, port).close()
    try:
        family, kind, proto, _, where = socket.getaddrinfo(
            address, port, type=socket.SOCK_STREAM, flags=socket.AI_PASSIVE
        )[0]
    except socket.gaierror as exc:
        raise StartupError(f"the {what} address '{address}' cannot be resolved: {exc.strerror}") from None
    sock = socket.socket(family, kind, proto)
    # As uvicorn binds: a restart must not wait for the previous daemon's connections in TIME_WAIT.
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    if share_port:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEPORT, 1)
    try:
        sock.bind(where)
    except OSError as exc:
        sock.close()
        if exc.errno == errno.EADDRINUSE:
            # Triton's words, which scripts written for it look for.
            service = {"gRPC": "GRPC", "metrics": "Metrics"}.get(what, what)
            raise StartupError(
                f"failed to start {service} service: Unavailable - Socket '{address}:{port}' already in use"
            ) from None
        raise StartupError(f"the {what} endpoint cannot listen on {address}:{port}: {exc.strerror}") from None
    return sock
