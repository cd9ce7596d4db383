"""The web console's part: its app on its own socket, and the first-run setup code written to the log while no user
exists (the console asks for it before it lets anyone make the first administrator)."""

from __future__ import annotations

import asyncio
import logging
import os
import time
from typing import TYPE_CHECKING

from edged.daemon.endpoints import UvicornEndpoint, console_config
from edged.frontends.console import ConsoleContext, create_console_app
from edged.frontends.console.pages import CodeWhere

if TYPE_CHECKING:
    import socket

    import uvicorn
    from prometheus_client import Counter

    from edged.config.settings import Settings
    from edged.core.access import AccessPolicy
    from edged.core.accounts import Accounts
    from edged.core.audit import AuditLog
    from edged.core.service import InferenceService
    from edged.daemon.endpoints import EndpointTls

log = logging.getLogger("edged")


class ConsolePart(UvicornEndpoint):
    """The console's server; at start, the setup code when there is no user yet."""

    def __init__(self, config: uvicorn.Config, sock: socket.socket, accounts: Accounts, url: str) -> None:
        super().__init__("the console", config, sock)
        self._accounts = accounts
        self._url = url

    async def start(self) -> None:
        await super().start()
        code = await asyncio.to_thread(self._accounts.first_run_code)
        if code is not None:
            # The one place the code is shown: whoever can read the daemon's log is trusted to set the device up.
            log.warning(
                "console: no user exists yet: open %s/setup and enter the setup code %s (valid for an hour, once), "
                "or create an administrator with `edged admin create`",
                self._url,
                code,
            )
        log.info("console on %s", self._url)


def console_part(
    settings: Settings,
    service: InferenceService,
    accounts: Accounts,
    audit: AuditLog | None,
    access: AccessPolicy,
    sock: socket.socket,
    refused: Counter,
    tls: EndpointTls,
) -> ConsolePart:
    secure = tls.console is not None
    context = ConsoleContext(
        service,
        accounts,
        access.tokens,
        secure=secure,
        started_at=time.time(),
        audit=audit,
        device_name=settings.device_id or "",
        setup_code_where=_setup_code_where(settings),
        http_port=settings.http_port,
        grpc_port=settings.grpc_port,
    )
    config = console_config(settings, create_console_app(context), refused, tls.console)
    address = settings.console_address or settings.http_address
    host = "localhost" if address in ("0.0.0.0", "::", "") else address
    url = f"{'https' if secure else 'http'}://{host}:{settings.console_port}"
    return ConsolePart(config, sock, accounts, url)


def _setup_code_where(settings: Settings) -> CodeWhere:
    """Where the first-run setup code is written, for the way edged was started: its log file, the journal under
    systemd (which sets INVOCATION_ID for the processes of a unit), or the terminal it was started in."""
    if settings.log_file is not None:
        return CodeWhere(f"in edged's log file, {settings.log_file}", f'grep "setup code" {settings.log_file}')
    if os.environ.get("INVOCATION_ID"):
        return CodeWhere("in the journal", 'journalctl -u edged | grep "setup code"')
    return CodeWhere("in the terminal edged was started from, among its first lines")
