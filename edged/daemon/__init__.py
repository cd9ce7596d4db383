"""The daemon: its parts started in order and stopped in reverse (server.py, parts.py), its network endpoints
(endpoints.py), the signals it answers (signals.py), reloads (reload.py) and its word to systemd (systemd.py).

``run`` and ``serve`` are imported on first use: a frontend worker process (worker.py) is a module of this package
too, and loads none of what only the daemon needs (the state database, the console, the models)."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

# First: grpc's core reads its settings when grpc is first imported (edged/frontends/grpc/core.py).
import edged.frontends.grpc  # noqa: F401

if TYPE_CHECKING:
    from edged.daemon.server import run, serve

__all__ = ["run", "serve"]


def __getattr__(name: str) -> Any:
    if name in __all__:
        from edged.daemon import server

        return getattr(server, name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
