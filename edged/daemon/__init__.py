"""The daemon: its parts started in order and stopped in reverse (server.py, parts.py), its network endpoints
(endpoints.py), the signals it answers (signals.py), reloads (reload.py) and its word to systemd (systemd.py)."""

# First: grpc's core reads its settings when grpc is first imported (edged/frontends/grpc/core.py).
import edged.frontends.grpc  # noqa: F401
from edged.daemon.server import run, serve

__all__ = ["run", "serve"]
