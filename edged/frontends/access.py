"""The access policy (edged.core.access) at the door of the HTTP and metrics endpoints: an ASGI middleware that
places each request in its API category, asks the policy, and answers a refusal in HTTP's terms; and the counter
of refusals every endpoint (gRPC too) reports to.

Triton's restricted-API refusal is its own: 403 ``{"error":"This API is restricted, expecting header '<key>'"}``.
edged's: 401 with ``WWW-Authenticate: Bearer`` without valid credentials, 403 when the token's role does not grant
the category.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from prometheus_client import CollectorRegistry, Counter

from edged.core.access import ACTOR, AccessDenied, AccessPolicy, Caller, Category, Refusal, open_actor
from edged.frontends.tls import peer_identity_http

if TYPE_CHECKING:
    from collections.abc import Awaitable

    Scope = dict[str, Any]
    Receive = Callable[[], Awaitable[dict[str, Any]]]
    Send = Callable[[dict[str, Any]], Awaitable[None]]
    # Any ASGI app: Litestar's and uvicorn's own types of scope and events are narrower than these dicts.
    ASGIApp = Callable[..., Awaitable[None]]

HTTP_STATUS = {Refusal.RESTRICTED: 403, Refusal.UNAUTHENTICATED: 401, Refusal.FORBIDDEN: 403}


def access_refusal_counter(registry: CollectorRegistry) -> Counter:
    """``edged_access_refused_total{endpoint, api, reason}``: requests the access policy refused."""
    return Counter(
        "edged_access_refused",
        "Requests refused by the access policy, by endpoint (http, grpc, metrics), API category and reason "
        "(restricted, unauthenticated, forbidden)",
        ["endpoint", "api", "reason"],
        registry=registry,
    )


def counting(counter: Counter) -> Callable[[str, Category, Refusal], None]:
    def on_refused(wire: str, category: Category, refusal: Refusal) -> None:
        counter.labels(wire, category.value, refusal.value).inc()

    return on_refused


class AccessMiddleware:
    """Asks ``policy`` about every HTTP request ``categorize(method, path)`` places; the caller's identity (who
    asked) is in ``edged.core.access.ACTOR`` while the request is served."""

    def __init__(
        self,
        app: ASGIApp,
        policy: AccessPolicy,
        wire: str,
        categorize: Callable[[str, str], Category],
    ) -> None:
        self._app = app
        self._policy = policy
        self._wire = wire
        self._categorize = categorize

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self._app(scope, receive, send)
            return
        category = self._categorize(scope["method"], scope["path"])
        client = scope.get("client")
        peer = client[0] if client else None
        if self._policy.is_open(category, self._wire):
            # Nothing to check: an open category costs its requests no header or certificate reading.
            actor = open_actor(peer)
        else:
            headers = {key.decode("latin-1").lower(): value.decode("latin-1") for key, value in scope["headers"]}
            # A verified client certificate (mutual TLS) may stand for a role: --client-certificate-role.
            caller = Caller(self._wire, peer, headers, peer_identity_http(scope))  # type: ignore[arg-type]
            try:
                actor = self._policy.check(category, caller)
            except AccessDenied as denied:
                await _refuse(send, denied)
                return
        token = ACTOR.set(actor)
        try:
            await self._app(scope, receive, send)
        finally:
            ACTOR.reset(token)


async def _refuse(send: Send, denied: AccessDenied) -> None:
    body = json.dumps({"error": denied.message}, separators=(",", ":")).encode()
    headers = [(b"content-type", b"application/json"), (b"content-length", str(len(body)).encode())]
    if denied.refusal is Refusal.UNAUTHENTICATED:
        headers.append((b"www-authenticate", b'Bearer realm="edged"'))
    await send({"type": "http.response.start", "status": HTTP_STATUS[denied.refusal], "headers": headers})
    await send({"type": "http.response.body", "body": body})
