"""SIGHUP (``systemctl reload``): re-read the configuration and rescan the model repositories."""

from __future__ import annotations

import dataclasses
import logging
import os
import sys
from typing import TYPE_CHECKING

from edged import config
from edged.core.repository.modes import ControlMode

if TYPE_CHECKING:
    from collections.abc import Callable

    from edged.config.settings import Settings
    from edged.core.repository.control import ModelController
    from edged.daemon.systemd import ServiceNotifier

log = logging.getLogger("edged")

# Settings a running daemon has no use for after it started: a reload that changes them changes nothing.
_START_ONLY = frozenset({"exit_on_error", "load_models"})
# The TLS files a reload reads again itself (EndpointTls.rotate), and says so.
_RELOADED = frozenset(
    f"{endpoint}_{name}" for endpoint in ("http", "grpc") for name in ("server_cert", "server_key", "root_cert")
)


def read_settings() -> Settings:
    """The configuration as a fresh start would read it: the same command line, today's file and environment."""
    return config.resolve(sys.argv[1:], os.environ)


def log_changes(running: Settings, read: Settings) -> None:
    """Name each setting the reload found changed; none of them applies before a restart."""
    for item in dataclasses.fields(running):
        old, new = getattr(running, item.name), getattr(read, item.name)
        if old == new or item.name in _RELOADED:
            continue
        if item.name in _START_ONLY:
            log.info("reload: %s changed to %r; it only matters at start", item.name, new)
        else:
            log.warning("reload: %s changed from %r to %r; restart edged to apply it", item.name, old, new)


async def reload(
    notifier: ServiceNotifier,
    controller: ModelController,
    running: Settings,
    reread: Callable[[], Settings],
    status: Callable[[], str],
    rotate: Callable[[Settings], None] | None = None,
) -> None:
    """Re-read the configuration and the TLS files (``rotate``, with the files the configuration names now, or the
    running one's when it cannot be read), then rescan the repositories, between RELOADING=1 and READY=1.

    The rescan is poll mode's (ModelController.poll_once): models added, changed or removed are loaded, reloaded
    or unloaded without downtime. It runs twice, as two polls would, so that a folder that stopped changing at
    least SETTLE_S seconds ago (edged.core.repository.poll) is acted on now; one still being written is left for
    the next reload (or poll). In explicit mode the repository API alone decides what is loaded, so a rescan
    changes nothing.
    """
    notifier.reloading()
    log.info("reloading: re-reading the configuration and rescanning the model repositories")
    try:
        try:
            read = reread()
        except config.ConfigError as exc:
            log.error("reload: the configuration was not re-read (%s); the running one stays", exc)
            read = running
        else:
            log_changes(running, read)
        if rotate is not None:
            rotate(read)
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
