"""Logging in and out of the console, the first-run setup, and the guards every other page and action passes.

The guards: ``viewer`` finds the request's session from its cookie (in a thread: it reads SQLite); ``operator``
and ``admin`` also ask for that role; ``csrf`` is on every state-changing request: a cross-site Origin is refused
first, then the session's token must come in the X-CSRF-Token header or the ``csrf_token`` form field. Login and
setup take no session, so they carry no token: SameSite=Strict keeps a cross-site page from using a session, and
the Origin check keeps it from logging the browser in as somebody else. ``known_fields`` refuses a management form
(accounts, passwords, tokens, sync) that holds a field it does not take, as the API refuses such a body.
"""

from __future__ import annotations

import asyncio
import logging
from typing import TYPE_CHECKING, Any
from urllib.parse import urlsplit

from litestar import Request, Response, get, post
from litestar.enums import RequestEncodingType
from litestar.exceptions import ClientException, PermissionDeniedException
from litestar.response import Redirect, Template

from edged.core.access import Role
from edged.core.accounts import (
    ABSOLUTE_S,
    AccountError,
    LoginRefused,
    NewSession,
    name_problem,
    password_problem,
)
from edged.frontends.bodies import unknown_fields
from edged.frontends.console.history import record
from edged.frontends.console.pages import LoginNeeded, RoleNeeded, console, may, render, session_of

if TYPE_CHECKING:
    from litestar.connection import ASGIConnection
    from litestar.handlers.base import BaseRouteHandler

    from edged.core.accounts import AuditEntry

log = logging.getLogger("edged.console")

CSRF_HEADER = "x-csrf-token"
CSRF_FIELD = "csrf_token"
_FORM_TYPES = (RequestEncodingType.URL_ENCODED.value, RequestEncodingType.MULTI_PART.value)
# Form fields longer than this are no one's name, password or setup code.
_FIELD_MAX = 2048


# --- guards -----------------------------------------------------------------------------------------------


async def viewer(connection: ASGIConnection[Any, Any, Any, Any], _handler: BaseRouteHandler) -> None:
    """A valid session, kept in the request's state for the page; LoginNeeded otherwise."""
    if connection.state.get("session") is not None:
        return
    context = console(connection)  # type: ignore[arg-type]
    secret = connection.cookies.get(context.cookie_name, "")
    found = await asyncio.to_thread(context.accounts.session, secret) if secret else None
    if found is None:
        raise LoginNeeded()
    connection.state["session"] = found


async def operator(connection: ASGIConnection[Any, Any, Any, Any], handler: BaseRouteHandler) -> None:
    await _role(connection, handler, Role.OPERATOR)


async def admin(connection: ASGIConnection[Any, Any, Any, Any], handler: BaseRouteHandler) -> None:
    await _role(connection, handler, Role.ADMIN)


async def _role(connection: ASGIConnection[Any, Any, Any, Any], handler: BaseRouteHandler, role: Role) -> None:
    await viewer(connection, handler)
    session = connection.state["session"]
    if not may(session, role):
        raise RoleNeeded(f"this needs the {role.value} role; {session.user} is {session.role.value}")


async def csrf(connection: ASGIConnection[Any, Any, Any, Any], handler: BaseRouteHandler) -> None:
    """The session's CSRF token, sent with the request; put after the role guard."""
    _same_origin(connection)
    await viewer(connection, handler)
    session = connection.state["session"]
    token = connection.headers.get(CSRF_HEADER)
    if token is None and connection.headers.get("content-type", "").split(";")[0].strip() in _FORM_TYPES:
        form = await Request(connection.scope, connection.receive).form()
        value = form.get(CSRF_FIELD)
        token = value if isinstance(value, str) else None
    if not token or not console(connection).accounts.verify_csrf(session, token):  # type: ignore[arg-type]
        raise PermissionDeniedException(
            "the form's security token is missing or out of date (the page was open across a log-in, or the "
            "request came from another site): reload the page and try again"
        )


def _same_origin(connection: ASGIConnection[Any, Any, Any, Any]) -> None:
    """Browsers send Origin with every POST: one that is not this console is another site's form."""
    origin = connection.headers.get("origin")
    if origin is None or (origin == "null" and connection.headers.get("sec-fetch-site") == "same-origin"):
        return
    host = connection.headers.get("host", "")
    if urlsplit(origin).netloc != host:
        raise PermissionDeniedException("cross-site requests are refused")


def known_fields(form: Any, what: str, *known: str) -> None:
    """400 naming each field of ``form`` not among ``known`` (and the CSRF token): a field misspelt by a script,
    dropped silently, would do something else than asked (a token meant to expire that never does)."""
    problem = unknown_fields(form.keys(), f"{what} form", (*known, CSRF_FIELD))
    if problem is not None:
        raise ClientException(problem)


# --- login, setup, logout ---------------------------------------------------------------------------------


@get("/login")
async def login_page(request: Request[Any, Any, Any], next: str = "/") -> Template | Redirect:
    if await _no_user_yet(request):
        return Redirect("/setup")
    return render(request, "login.html", next=local_path(next), message=None)


@post("/login", status_code=303)
async def login(request: Request[Any, Any, Any]) -> Response[Any]:
    _same_origin(request)
    form = await request.form()
    name, password, target = _field(form, "name"), _field(form, "password"), local_path(_field(form, "next"))
    accounts = console(request).accounts
    outcome = await asyncio.to_thread(accounts.login, name, password, _peer(request))
    return _logged_in(request, outcome, "login.html", target, name=name)


@get("/setup")
async def setup_page(request: Request[Any, Any, Any]) -> Template | Redirect:
    if not await _no_user_yet(request):
        return Redirect("/login")
    return render(request, "setup.html", message=None, name="", code="")


@post("/setup", status_code=303)
async def setup(request: Request[Any, Any, Any]) -> Response[Any]:
    _same_origin(request)
    form = await request.form()
    known_fields(form, "setup", "code", "name", "password", "password_again")
    code, name = _field(form, "code").strip().upper(), _field(form, "name").strip()
    password, again = _field(form, "password"), _field(form, "password_again")
    # Every problem at once, and what was typed kept (the code above all, read off a log with some effort).
    problems = [
        problem
        for problem in (
            "enter the setup code from the log" if not code else None,
            name_problem(name),
            password_problem(name, password),
            "the two passwords differ" if password != again else None,
        )
        if problem is not None
    ]
    if problems:
        return render(request, "setup.html", status_code=400, message=None, problems=problems, name=name, code=code)
    accounts = console(request).accounts
    try:
        outcome = await asyncio.to_thread(accounts.setup_first_admin, code, name, password, _peer(request))
    except AccountError as exc:
        return render(request, "setup.html", status_code=400, message=str(exc), name=name, code=code)
    return _logged_in(request, outcome, "setup.html", "/", name=name, code=code)


@post("/logout", guards=[viewer, csrf], status_code=303)
async def logout(request: Request[Any, Any, Any]) -> Redirect:
    context = console(request)
    entry = await asyncio.to_thread(context.accounts.logout, request.cookies.get(context.cookie_name, ""))
    if entry is not None:
        _audit(request, entry)
    response = Redirect("/login", status_code=303)
    response.delete_cookie(context.cookie_name)
    return response


def _logged_in(
    request: Request[Any, Any, Any], outcome: NewSession | LoginRefused, template: str, target: str, **values: Any
) -> Response[Any]:
    _audit(request, outcome.audit)
    if isinstance(outcome, LoginRefused):
        throttled = outcome.reason == "throttled"
        status = 429 if throttled else 401
        page = render(request, template, status_code=status, message=outcome.message, next=target, **values)
        if throttled:
            page.headers["Retry-After"] = str(max(1, round(outcome.retry_after_s)))
        return page
    context = console(request)
    response = Redirect(target, status_code=303)
    response.set_cookie(
        context.cookie_name,
        outcome.secret,
        max_age=ABSOLUTE_S,
        path="/",
        secure=context.secure,
        httponly=True,
        samesite="strict",
    )
    request.state["session"] = outcome.session
    return response


def _audit(request: Request[Any, Any, Any], entry: AuditEntry) -> None:
    record(request, entry)


async def _no_user_yet(request: Request[Any, Any, Any]) -> bool:
    return not await asyncio.to_thread(console(request).accounts.has_users)


def _field(form: Any, key: str) -> str:
    value = form.get(key)
    return value[:_FIELD_MAX] if isinstance(value, str) else ""


def local_path(target: str) -> str:
    """Where to go after the login (or a theme change): a path of this console only (never ``//elsewhere`` or a
    full URL)."""
    parts = urlsplit(target)
    if not target.startswith("/") or target.startswith("//") or parts.scheme or parts.netloc or "\\" in target:
        return "/"
    return target


def _peer(request: Request[Any, Any, Any]) -> str | None:
    return request.client.host if request.client is not None else None


__all__ = ["LoginNeeded", "admin", "csrf", "operator", "session_of", "viewer"]
