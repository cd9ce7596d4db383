"""KServe v2 over HTTP: the Litestar routes (routes.py), the wire format (codec.py), the infer endpoint that both
the routes and the connection protocol answer with (infer.py), that protocol (protocol.py) and the bounds every
HTTP connection of the daemon is held to (limits.py)."""

from edged.frontends.http.infer import HttpOptions
from edged.frontends.http.limits import ConnectionLimits, LimitedHttpProtocol, refusal_counter
from edged.frontends.http.protocol import InferHttpProtocol
from edged.frontends.http.routes import create_http_app

__all__ = [
    "ConnectionLimits",
    "HttpOptions",
    "InferHttpProtocol",
    "LimitedHttpProtocol",
    "create_http_app",
    "refusal_counter",
]
