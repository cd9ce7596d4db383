"""The metrics endpoint (Prometheus text format) on its own port, as Triton serves it."""

from __future__ import annotations

from typing import TYPE_CHECKING

from prometheus_client import CONTENT_TYPE_LATEST, REGISTRY, generate_latest

if TYPE_CHECKING:
    from collections.abc import Awaitable, Callable
    from typing import Any

    Receive = Callable[[], Awaitable[dict[str, Any]]]
    Send = Callable[[dict[str, Any]], Awaitable[None]]


def create_metrics_app() -> Callable[[dict[str, Any], Receive, Send], Awaitable[None]]:
    async def app(scope: dict[str, Any], receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            return
        path = scope["path"].rstrip("/")
        status, body, content_type = 200, b"", b"text/plain; charset=utf-8"
        if path == "/metrics":
            if scope["method"] not in ("GET", "HEAD"):
                status = 405
            else:
                body, content_type = generate_latest(REGISTRY), CONTENT_TYPE_LATEST.encode()
        headers = [(b"content-type", content_type), (b"content-length", str(len(body)).encode())]
        await send({"type": "http.response.start", "status": status, "headers": headers})
        await send({"type": "http.response.body", "body": body})

    return app
