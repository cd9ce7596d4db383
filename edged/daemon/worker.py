"""A frontend worker process (edged.daemon.workers): ``python -m edged.daemon.worker DIR INDEX HTTP_PORT GRPC_PORT``.

It takes the daemon's settings over the daemon's Unix socket in DIR, listens on the HTTP and gRPC ports beside the
daemon, and serves until SIGTERM or until the daemon goes away. It loads no model and opens no database.
"""

from __future__ import annotations

import asyncio
import logging
import signal
import sys
from pathlib import Path
from typing import TYPE_CHECKING, Any, cast

from edged.core.access import AccessPolicy, Category, TokenVerifier
from edged.daemon.endpoints import UvicornEndpoint, bind_socket, connection_limits, grpc_options, uvicorn_config
from edged.daemon.workers import GRPC_SOCKET, RELAY_SOCKET
from edged.errors import EdgedError
from edged.frontends.access import AccessMiddleware
from edged.frontends.forwarding import forward_pattern
from edged.frontends.http import HttpOptions, InferHttpProtocol
from edged.frontends.http.access import http_category
from edged.frontends.http.infer import INFER_PATH, InferRoute
from edged.frontends.relay.remote import Relay, RelayApp, RelayedCounter, RemoteService

if TYPE_CHECKING:
    from datetime import datetime

    from litestar.types import ASGIApp
    from prometheus_client import Counter

    from edged.config.settings import Settings
    from edged.state.store import TokenRecord

log = logging.getLogger("edged")


class _RemoteTokens:
    """The daemon's API tokens, looked up over the relay (edged.core.access.TokenVerifier caches each)."""

    def __init__(self, relay: Relay) -> None:
        self._relay = relay

    def find_token(self, token_id: str) -> TokenRecord | None:
        record: TokenRecord | None = self._relay.blocking("token", token_id)
        return record

    def add_token(self, token: TokenRecord) -> None:
        raise RuntimeError("a frontend worker manages no tokens")

    def tokens(self) -> list[TokenRecord]:
        raise RuntimeError("a frontend worker manages no tokens")

    def revoke_token(self, name: str) -> bool:
        raise RuntimeError("a frontend worker manages no tokens")

    def touch_token(self, token_id: str, at: datetime, peer: str | None) -> None:
        # A worker opens no database, and the relay carries no writes: a token is recorded as used where the daemon
        # itself checks it (every request but the inference a worker serves).
        return None


class _Split:
    """The worker's HTTP app: inference here (behind the access policy), everything else by the daemon's app."""

    def __init__(self, infer: Any, relay: Any) -> None:
        self._infer = infer
        self._relay = relay

    async def __call__(self, scope: dict[str, Any], receive: Any, send: Any) -> None:
        if scope["type"] == "http" and INFER_PATH.fullmatch(scope["path"]):
            await self._infer(scope, receive, send)
        else:
            await self._relay(scope, receive, send)


async def serve(directory: Path, index: int, http_port: int, grpc_port: int) -> int:
    relay = Relay(str(directory / RELAY_SOCKET))
    settings: Settings = relay.blocking("settings")
    await relay.connect()
    remote = RemoteService(relay)
    # Refusals are counted by the daemon, whose /metrics reports them (a worker serves no metrics).
    access_refused = RelayedCounter(relay, "access_refused")
    access = AccessPolicy(
        settings.access,
        TokenVerifier(_RemoteTokens(relay)),
        lambda wire, category, refusal: access_refused.labels(wire, category.value, refusal.value).inc(),
    )
    options = HttpOptions(
        max_input_size=settings.http_max_input_size,
        max_json_depth=settings.http_max_json_depth,
        max_upload_size=settings.upload_max_bytes,
        forward_pattern=forward_pattern(settings.http_header_forward_pattern),
    )
    fast_infer = access.is_open(Category.INFERENCE, "http")
    refused = cast("Counter", RelayedCounter(relay, "http_refused"))
    protocol = InferHttpProtocol.serving(remote, options, connection_limits(settings), refused, fast_infer=fast_infer)
    relayed = RelayApp(relay)
    # The daemon's app answers what InferRoute passes on (a path it does not serve): typed as Litestar's ASGIApp.
    infer = AccessMiddleware(InferRoute(cast("ASGIApp", relayed), remote, options), access, "http", http_category)
    sock = bind_socket("HTTP", settings.http_address, http_port, share_port=True, worker=True)
    http = UvicornEndpoint("the HTTP endpoint", uvicorn_config(_Split(infer, relayed), settings, protocol, None), sock)
    grpc_server = None
    if settings.allow_grpc:
        from edged.frontends.grpc.relay import RelayingServer

        grpc_sock = bind_socket("gRPC", settings.grpc_address, grpc_port, share_port=True, worker=True)
        grpc_server = RelayingServer(remote, grpc_sock, grpc_options(settings), access, str(directory / GRPC_SOCKET))
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for signum in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(signum, stop.set)
    await http.start()
    if grpc_server is not None:
        await grpc_server.start()
    relay.send(("ready", 0))
    log.debug("frontend worker %d serving", index)
    stopped = asyncio.create_task(stop.wait())
    gone = asyncio.create_task(relay.closed.wait())
    await asyncio.wait([stopped, gone], return_when=asyncio.FIRST_COMPLETED)
    if gone.done() and not stopped.done():
        log.warning("frontend worker %d: the daemon went away; stopping", index)
    http.stopping()
    if grpc_server is not None:
        await grpc_server.stop()
    await http.stop()
    sock.close()
    return 0


def main(argv: list[str]) -> int:
    directory, index, http_port, grpc_port = Path(argv[0]), int(argv[1]), int(argv[2]), int(argv[3])
    from edged import logs

    logs.configure(0)
    try:
        import uvloop

        loop: asyncio.AbstractEventLoop = uvloop.new_event_loop()
    except ImportError:
        loop = asyncio.new_event_loop()
    asyncio.set_event_loop(loop)
    try:
        return loop.run_until_complete(serve(directory, index, http_port, grpc_port))
    except (OSError, EdgedError) as exc:
        log.error("frontend worker %d cannot reach the daemon: %s", index, exc)
        return 1
    finally:
        loop.close()


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
