"""The console's Litestar app: its routes, templates and static files, the headers every answer carries, and the
answers for a missing login, a missing role or a refused form."""

from __future__ import annotations

import logging
import time
from importlib.resources import files
from pathlib import Path
from typing import TYPE_CHECKING, Any

from litestar import Litestar, MediaType, Request, Response, Router
from litestar.datastructures import CacheControlHeader
from litestar.exceptions import HTTPException, NotFoundException, PermissionDeniedException
from litestar.response import Redirect
from litestar.static_files import create_static_files_router
from litestar.template.config import TemplateConfig

from edged import __version__
from edged.errors import EdgedError
from edged.frontends.console import admin, alerts, auth, history, live, logs, models, overview, sync, theme, uploads
from edged.frontends.console.pages import ConsoleContext, LoginNeeded, RoleNeeded, is_htmx, render
from edged.frontends.console.templates import LazyJinja
from edged.frontends.statuses import status_for

if TYPE_CHECKING:
    from litestar.types import ASGIApp, Message, Receive, Scope, Send

log = logging.getLogger("edged.console")

# No inline script or style anywhere (htmx's indicator styles are off, see base.html), nothing from elsewhere,
# never framed; forms post to this console only.
CONTENT_SECURITY_POLICY = (
    "default-src 'self'; script-src 'self'; style-src 'self'; img-src 'self' data:; connect-src 'self'; "
    "font-src 'self'; object-src 'none'; base-uri 'none'; form-action 'self'; frame-ancestors 'none'"
)
_HEADERS = [
    (b"content-security-policy", CONTENT_SECURITY_POLICY.encode()),
    (b"x-content-type-options", b"nosniff"),
    (b"x-frame-options", b"DENY"),
    (b"referrer-policy", b"no-referrer"),
    (b"cross-origin-opener-policy", b"same-origin"),
    (b"permissions-policy", b"camera=(), microphone=(), geolocation=()"),
]
# Pages show the live state and who may see it: never cached (a shared browser's back button included).
_NO_STORE = (b"cache-control", b"no-store")


def web_root() -> Path:
    """The templates and static files, shipped in the package (edged/web links to the checkout's web/)."""
    return Path(str(files("edged") / "web"))


def create_console_app(context: ConsoleContext) -> ASGIApp:
    root = web_root()
    pages = Router(
        path="/",
        route_handlers=[
            *overview.ROUTES,
            *models.ROUTES,
            *uploads.ROUTES,
            *live.ROUTES,
            *sync.ROUTES,
            *history.ROUTES,
            *admin.ROUTES,
            *logs.ROUTES,
            *alerts.ROUTES,
        ],
        guards=[auth.viewer],
    )
    static = create_static_files_router(
        path="/static",
        directories=[root / "static"],
        # The URLs carry edged's version (?v=), so a new release is fetched anew.
        cache_control=CacheControlHeader(max_age=3600, private=True),
        include_in_schema=False,
    )
    app = Litestar(
        route_handlers=[
            auth.login_page,
            auth.login,
            auth.setup_page,
            auth.setup,
            auth.logout,
            *theme.ROUTES,
            pages,
            static,
        ],
        template_config=TemplateConfig(directory=root / "templates", engine=LazyJinja),
        exception_handlers={HTTPException: _http_error, EdgedError: _edged_error},
        openapi_config=None,
        # edged's logging stays as the daemon set it up (Litestar's own would put a queue in front of the root
        # logger, and a line logged just before an immediate exit would be lost).
        logging_config=None,
        debug=False,
    )
    app.state.console = context
    return _Headers(app, hsts=context.secure)


class _Headers:
    """Adds the security headers to every answer, and no-store to all but the static files."""

    def __init__(self, app: ASGIApp, *, hsts: bool) -> None:
        self._app = app
        self._extra = list(_HEADERS)
        if hsts:
            self._extra.append((b"strict-transport-security", b"max-age=31536000"))

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":  # type: ignore[comparison-overlap]
            await self._app(scope, receive, send)
            return
        static = scope["path"].startswith("/static/")
        began = time.perf_counter()

        async def sending(message: Message) -> None:
            if message["type"] == "http.response.start":
                headers = [h for h in message.get("headers", []) if not (not static and h[0] == b"cache-control")]
                headers.extend(self._extra)
                if not static:
                    headers.append(_NO_STORE)
                # The server's time for this answer, for the browser's developer tools and scripts/bench --console.
                elapsed_ms = (time.perf_counter() - began) * 1000
                headers.append((b"server-timing", f"app;dur={elapsed_ms:.2f}".encode()))
                message["headers"] = headers
            await send(message)

        await self._app(scope, receive, sending)


def _http_error(request: Request[Any, Any, Any], exc: HTTPException) -> Response[Any]:
    """Login pages for a missing login, an HTML page for what a browser was refused; htmx requests get the status
    and a redirect header (htmx swaps nothing on an error, so the page stays as it was)."""
    if isinstance(exc, LoginNeeded):
        if is_htmx(request):
            return Response(b"", status_code=401, headers={"HX-Redirect": "/login"})
        target = request.url.path if request.method == "GET" else "/"
        query = {"next": target} if target != "/" else None
        return Redirect("/login", query_params=query, status_code=303)
    status = exc.status_code
    if isinstance(exc, RoleNeeded | PermissionDeniedException):
        title = "Not allowed"
    elif isinstance(exc, NotFoundException):
        title = "Not found"
    else:
        title = "Request refused" if status < 500 else "Server error"
    if status >= 500:
        log.error("console: %s %s failed: %s", request.method, request.url.path, exc.detail)
    if is_htmx(request):
        return Response(exc.detail, status_code=status, media_type=MediaType.TEXT)
    return render(request, "error.html", status_code=status, title=title, detail=exc.detail)


def _edged_error(request: Request[Any, Any, Any], exc: EdgedError) -> Response[Any]:
    """What the core refused (a load that failed, a version that does not exist): its message, with the status the
    HTTP endpoint gives it."""
    status = status_for(exc)
    if is_htmx(request):
        return Response(exc.message, status_code=status, media_type=MediaType.TEXT)
    return render(request, "error.html", status_code=status, title="Refused", detail=exc.message)


__all__ = ["ConsoleContext", "create_console_app", "__version__"]
