"""What every console page shares: the context the app was built with, the session of the request, rendering a
template with the page frame's values, and the answers for a missing login or role."""

from __future__ import annotations

import contextlib
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Final

from litestar.exceptions import NotAuthorizedException, PermissionDeniedException
from litestar.response import Template

from edged import __version__
from edged.core.access import ACTOR, DOOR, Role

if TYPE_CHECKING:
    from litestar import Request

    from edged.core.access import TokenVerifier
    from edged.core.accounts import Accounts, Session
    from edged.core.audit import AuditLog
    from edged.core.service import InferenceService

# The roles in order of what they may do: a page or action asks for one and every higher one passes.
RANK: dict[Role, int] = {Role.VIEWER: 0, Role.OPERATOR: 1, Role.ADMIN: 2}


@dataclass(frozen=True, slots=True)
class CodeWhere:
    """Where the setup code is: in words, and the command that shows it (None when there is none to run)."""

    text: str
    command: str | None = None


@dataclass(frozen=True, slots=True)
class ConsoleContext:
    """What the console works with, given by the daemon. ``secure``: served over TLS (the cookie is then Secure and
    named with the __Host- prefix); ``started_at``: the daemon's start (wall clock), for the uptime; ``audit``: the
    audit history, where the console's account actions are recorded and the history page reads."""

    service: InferenceService
    accounts: Accounts
    tokens: TokenVerifier
    secure: bool = False
    started_at: float = 0.0
    audit: AuditLog | None = None
    # The device's name (--device-id, else the host name), which the header shows: a fleet's consoles look alike.
    device_name: str = ""
    # Where the first-run setup code was written, for the setup page: the log's place for how edged was started.
    setup_code_where: CodeWhere = field(default_factory=lambda: CodeWhere("in the log edged wrote when it started"))
    # The inference endpoints' ports, for the example requests a model's page shows.
    http_port: int = 8000
    grpc_port: int = 8001

    @property
    def cookie_name(self) -> str:
        # __Host-: the browser only takes it over HTTPS, for this host and path /, so no sibling site can set it.
        return "__Host-edged_session" if self.secure else "edged_session"


class LoginNeeded(NotAuthorizedException):
    """No valid session: pages redirect to the login, htmx requests are told to."""


class RoleNeeded(PermissionDeniedException):
    """A session whose role may not do this."""


def console(request: Request[Any, Any, Any]) -> ConsoleContext:
    context: ConsoleContext = request.app.state.console
    return context


def session_of(request: Request[Any, Any, Any]) -> Session:
    """The request's session, found by the guard (every page has one)."""
    found: Session | None = request.state.get("session")
    if found is None:
        raise LoginNeeded()
    return found


def may(session: Session | None, role: Role) -> bool:
    return session is not None and RANK[session.role] >= RANK[role]


def is_htmx(request: Request[Any, Any, Any]) -> bool:
    return request.headers.get("hx-request") == "true"


@contextlib.contextmanager
def acting(session: Session) -> Iterator[None]:
    """Core calls inside are recorded as this user's (the model history's actor), as the API records a token's, and
    as the console's (their source), not the API's or the upload's the console calls through."""
    token, door = ACTOR.set(f"user:{session.user}"), DOOR.set("console")
    try:
        yield
    finally:
        DOOR.reset(door)
        ACTOR.reset(token)


# The light/dark choice a person made beside the system's (edged.frontends.console.theme), in the order its button
# moves through them; "" follows the system.
THEME_COOKIE: Final = "edged_theme"
THEME_CHOICES: Final = ("", "dark", "light")


def theme_of(request: Request[Any, Any, Any]) -> str:
    """The theme the page is drawn in: "dark", "light" or "" (the system's)."""
    chosen = request.cookies.get(THEME_COOKIE, "")
    return chosen if chosen in THEME_CHOICES else ""


def render(request: Request[Any, Any, Any], template: str, *, status_code: int = 200, **values: Any) -> Template:
    """The template with what the page frame needs: who is logged in and what they may do, the CSRF token for
    its forms, which page is open, the version."""
    session: Session | None = request.state.get("session")
    context = console(request)
    frame = {
        "session": session,
        "csrf_token": session.csrf_token if session is not None else "",
        "can_operate": may(session, Role.OPERATOR),
        "is_admin": may(session, Role.ADMIN),
        "version": __version__,
        "device_name": context.device_name or context.service.server_metadata().name,
        "path": request.url.path,
        "theme": theme_of(request),
        "setup_code_where": context.setup_code_where,
        "now": time.time(),
    }
    return Template(template_name=template, context=frame | values, status_code=status_code)
