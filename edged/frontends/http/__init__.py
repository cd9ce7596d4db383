"""KServe v2 over HTTP: the Litestar routes (routes.py), the wire format (codec.py), the infer endpoint that both
the routes and the connection protocol answer with (infer.py), that protocol (protocol.py) and the bounds every
HTTP connection of the daemon is held to (limits.py).

``create_http_app`` is imported on first use: a frontend worker answers inference without the routes, and so
without Litestar."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from edged.frontends.http.infer import HttpOptions
from edged.frontends.http.limits import ConnectionLimits, LimitedHttpProtocol, refusal_counter
from edged.frontends.http.protocol import InferHttpProtocol

if TYPE_CHECKING:
    from edged.frontends.http.routes import create_http_app

__all__ = [
    "ConnectionLimits",
    "HttpOptions",
    "InferHttpProtocol",
    "LimitedHttpProtocol",
    "create_http_app",
    "refusal_counter",
]


def __getattr__(name: str) -> Any:
    if name == "create_http_app":
        from edged.frontends.http.routes import create_http_app

        return create_http_app
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
