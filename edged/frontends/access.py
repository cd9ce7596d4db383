"""The access policy (edged.core.access) at the door of the HTTP and metrics endpoints: an ASGI middleware that
places each request in its API category, asks the policy, and answers a refusal in HTTP's terms; and the counter
of refusals every endpoint (gRPC too) reports to.

Triton's restricted-API refusal is its own: 403 ``{"error":"This API is restricted, expecting header '<key>'"}``.
edged's: 401 with ``WWW-Authenticate: Bearer`` without valid credentials (which token management and a request
that brings code, an upload or a load with overrides, need from loopback too), 403 when the token's role does not
grant the category.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from prometheus_client import CollectorRegistry, Counter

from edged.core.access import ACTOR, AccessDenied, AccessPolicy, Caller, Category, Refusal, open_actor
from edged.frontends.http.access import http_brings_code
from edged.frontends.tls import peer_identity_http

if TYPE_CHECKING:
    from collections.abc import Awaitable, Mapping

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
    """Asks ``policy`` about every HTTP request ``categorize(method, path)`` places, and whether it
    ``brings_code(method, path)`` (by default, on the HTTP wire, edged.frontends.http.access.http_brings_code); the
    caller's identity (who asked) is in ``edged.core.access.ACTOR`` while the request is served."""

    def __init__(
        self,
        app: ASGIApp,
        policy: AccessPolicy,
        wire: str,
        categorize: Callable[[str, str], Category],
        brings_code: Callable[[str, str], bool] | None = None,
    ) -> None:
        self._app = app
        self._policy = policy
        self._wire = wire
        self._categorize = categorize
        if brings_code is None:
            brings_code = http_brings_code if wire == "http" else _never
        self._brings_code = brings_code

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
            code = self._brings_code(scope["method"], scope["path"])
            try:
                actor = self._policy.check(category, http_caller(scope, self._wire), code=code)
            except AccessDenied as denied:
                await _refuse(send, denied)
                return
        token = ACTOR.set(actor)
        try:
            await self._app(scope, receive, send)
        finally:
            ACTOR.reset(token)


def http_caller(scope: Mapping[str, Any], wire: str = "http") -> Caller:
    """What the request's scope tells of who sent it."""
    client = scope.get("client")
    headers = {key.decode("latin-1").lower(): value.decode("latin-1") for key, value in scope["headers"]}
    # A verified client certificate (mutual TLS) may stand for a role: --client-certificate-role.
    return Caller(wire, client[0] if client else None, headers, peer_identity_http(scope))  # type: ignore[arg-type]


def check_code(scope: Mapping[str, Any], policy: AccessPolicy | None, category: Category) -> AccessDenied | None:
    """For a request found to bring code only once its handler read the body (a load with overrides): the policy
    asked again, as if the door had known; the refusal, or None when the caller may."""
    if policy is None or policy.is_open(category, "http"):
        return None
    try:
        policy.check(category, http_caller(scope), code=True)
    except AccessDenied as denied:
        return denied
    return None


def refusal_parts(denied: AccessDenied) -> tuple[int, dict[str, str], bytes]:
    """A refusal over HTTP: its status, headers (besides the content type, JSON) and body."""
    body = json.dumps({"error": denied.message}, separators=(",", ":")).encode()
    headers = {"www-authenticate": 'Bearer realm="edged"'} if denied.refusal is Refusal.UNAUTHENTICATED else {}
    return HTTP_STATUS[denied.refusal], headers, body


def _never(_method: str, _path: str) -> bool:
    return False


async def _refuse(send: Send, denied: AccessDenied) -> None:
    status, extra, body = refusal_parts(denied)
    headers = [(b"content-type", b"application/json"), (b"content-length", str(len(body)).encode())]
    headers.extend((key.encode(), value.encode()) for key, value in extra.items())
    await send({"type": "http.response.start", "status": status, "headers": headers})
    await send({"type": "http.response.body", "body": body})
