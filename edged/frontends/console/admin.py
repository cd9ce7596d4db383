"""Users and API tokens (the admin role), and one's own password (anyone logged in).

Every action, done or refused, goes to the log and the audit history (``history.record``) as the acting user's.
A new token's secret is on the answer to the form that made it, and nowhere else: not stored (only its hash is),
not in a URL, not cached (no page is). An admin cannot disable their own account, so that the device is never left
without an admin by one click; another admin can.
"""

from __future__ import annotations

import asyncio
from datetime import UTC, datetime, timedelta
from typing import TYPE_CHECKING, Any, Final, Literal

from litestar import Request, Response, get, post
from litestar.response import Redirect, Template

from edged.core.access import Role
from edged.core.accounts import AccountError, AuditEntry
from edged.frontends.console import auth
from edged.frontends.console.history import record
from edged.frontends.console.pages import console, render, session_of

if TYPE_CHECKING:
    from litestar.datastructures import FormMultiDict

    from edged.core.accounts import Session

_Action = Literal["user-create", "user-disable", "password-set", "token-create", "token-revoke"]

ROLES: Final = [role.value for role in Role]
# A token lives ten years at most: "never" is the empty field.
TOKEN_DAYS_MAX: Final = 3650
# Form fields longer than this are no one's name or password (the policy's maximum is 1024).
_FIELD_MAX: Final = 2048
SELF_DISABLE: Final = (
    "you cannot disable your own account: another admin can (this way the device is never left without an admin "
    "by mistake)"
)


# --- users ------------------------------------------------------------------------------------------------


@get("/admin/users", guards=[auth.admin])
async def users_page(
    request: Request[Any, Any, Any], created: str = "", disabled: str = "", password: str = ""
) -> Template:
    notice = (
        f"User {created} created." if created
        else f"User {disabled} disabled: their sessions have ended." if disabled
        else f"Password of {password} set: their sessions have ended." if password
        else None
    )  # fmt: skip
    return await _users(request, notice=notice)


@post("/admin/users", guards=[auth.admin, auth.csrf], status_code=303)
async def create_user(request: Request[Any, Any, Any]) -> Response[Any]:
    session = session_of(request)
    form = await request.form()
    auth.known_fields(form, "user", "name", "role", "password", "password_again")
    name, role_name = _field(form, "name").strip(), _field(form, "role")
    password, again = _field(form, "password"), _field(form, "password_again")
    accounts = console(request).accounts
    try:
        if role_name not in ROLES:
            raise AccountError(f"a role is one of {', '.join(ROLES)}")
        if password != again:
            raise AccountError("the two passwords differ")
        _, entry = await asyncio.to_thread(accounts.create_user, name, Role(role_name), password, actor=_actor(session))
    except AccountError as exc:
        record(request, _refused(request, session, "user-create", name, str(exc)))
        return await _users(request, status_code=400, message=str(exc), name=name, role=role_name)
    record(request, _with_peer(request, entry))
    return Redirect("/admin/users", query_params={"created": name}, status_code=303)


@post("/admin/users/{name:str}/disable", guards=[auth.admin, auth.csrf], status_code=303)
async def disable_user(request: Request[Any, Any, Any], name: str) -> Response[Any]:
    auth.known_fields(await request.form(), "disable")
    session = session_of(request)
    try:
        if name == session.user:
            raise AccountError(SELF_DISABLE)
        entry = await asyncio.to_thread(console(request).accounts.disable_user, name, actor=_actor(session))
    except AccountError as exc:
        record(request, _refused(request, session, "user-disable", name, str(exc)))
        return await _users(request, status_code=400, message=str(exc))
    record(request, _with_peer(request, entry))
    return Redirect("/admin/users", query_params={"disabled": name}, status_code=303)


@get("/admin/users/{name:str}/password", guards=[auth.admin])
async def password_page(request: Request[Any, Any, Any], name: str) -> Template:
    return await _password_page(request, name)


@post("/admin/users/{name:str}/password", guards=[auth.admin, auth.csrf], status_code=303)
async def set_password(request: Request[Any, Any, Any], name: str) -> Response[Any]:
    session = session_of(request)
    form = await request.form()
    auth.known_fields(form, "password", "password", "password_again")
    password, again = _field(form, "password"), _field(form, "password_again")
    try:
        if password != again:
            raise AccountError("the two passwords differ")
        entry = await asyncio.to_thread(console(request).accounts.set_password, name, password, actor=_actor(session))
    except AccountError as exc:
        record(request, _refused(request, session, "password-set", name, str(exc)))
        return await _password_page(request, name, status_code=400, message=str(exc))
    record(request, _with_peer(request, entry))
    if name == session.user:
        return _logged_out(request)  # a new password ends every session of its user, this one too
    return Redirect("/admin/users", query_params={"password": name}, status_code=303)


async def _users(request: Request[Any, Any, Any], *, status_code: int = 200, **values: Any) -> Template:
    found = await asyncio.to_thread(console(request).accounts.users)
    values = {"message": None, "notice": None, "name": "", "role": Role.VIEWER.value} | values
    return render(request, "admin_users.html", status_code=status_code, users=found, roles=ROLES, **values)


async def _password_page(
    request: Request[Any, Any, Any], name: str, *, status_code: int = 200, message: str | None = None
) -> Template:
    known = {user.name for user in await asyncio.to_thread(console(request).accounts.users)}
    if name not in known:
        return render(request, "error.html", status_code=404, title="Not found", detail=f"no user named '{name}'")
    return render(
        request,
        "admin_password.html",
        status_code=status_code,
        user=name,
        myself=name == session_of(request).user,
        message=message,
    )


# --- API tokens -------------------------------------------------------------------------------------------


@get("/admin/tokens", guards=[auth.admin])
async def tokens_page(request: Request[Any, Any, Any], revoked: str = "") -> Template:
    return await _tokens(request, notice=f"Token {revoked} revoked." if revoked else None)


@post("/admin/tokens", guards=[auth.admin, auth.csrf], status_code=200)
async def create_token(request: Request[Any, Any, Any]) -> Template:
    session = session_of(request)
    form = await request.form()
    auth.known_fields(form, "token", "name", "role", "days")
    name, role_name, days = _field(form, "name").strip(), _field(form, "role"), _field(form, "days").strip()
    try:
        if role_name not in ROLES:
            raise ValueError(f"a role is one of {', '.join(ROLES)}")
        expires_at = _expiry(days)
        secret, view = await asyncio.to_thread(console(request).tokens.create, name, Role(role_name), expires_at)
    except ValueError as exc:
        record(request, _refused(request, session, "token-create", name, str(exc)))
        return await _tokens(request, status_code=400, message=str(exc), name=name, role=role_name, days=days)
    expiry = f", expires {view.expires_at.isoformat(timespec='seconds')}" if view.expires_at else ""
    record(request, _entry(request, session, "token-create", name, "done", f"role {view.role}{expiry}"))
    # The one time the secret is shown: this answer, never stored and never cached (no console page is).
    return render(request, "admin_token_created.html", status_code=200, token=view, secret=secret)


@post("/admin/tokens/revoke", guards=[auth.admin, auth.csrf], status_code=303)
async def revoke_token(request: Request[Any, Any, Any]) -> Response[Any]:
    session = session_of(request)
    form = await request.form()
    auth.known_fields(form, "revoke", "name")
    name = _field(form, "name")
    try:
        revoked = await asyncio.to_thread(console(request).tokens.revoke, name)
    except ValueError as exc:
        revoked, problem = False, str(exc)
    else:
        problem = f"no active token named '{name}'"
    if not revoked:
        record(request, _refused(request, session, "token-revoke", name, problem))
        return await _tokens(request, status_code=400, message=problem)
    record(request, _entry(request, session, "token-revoke", name, "done", ""))
    return Redirect("/admin/tokens", query_params={"revoked": name}, status_code=303)


async def _tokens(request: Request[Any, Any, Any], *, status_code: int = 200, **values: Any) -> Template:
    tokens = console(request).tokens
    try:
        found, unavailable = await asyncio.to_thread(tokens.list), None
    except ValueError as exc:  # no state database: tokens cannot be kept
        found, unavailable = [], str(exc)
    values = {"message": None, "notice": None, "name": "", "role": Role.VIEWER.value, "days": ""} | values
    return render(
        request,
        "admin_tokens.html",
        status_code=status_code,
        tokens=found,
        unavailable=unavailable,
        roles=ROLES,
        days_max=TOKEN_DAYS_MAX,
        **values,
    )


def _expiry(days: str) -> datetime | None:
    if not days:
        return None
    if not days.isdecimal() or not 1 <= int(days) <= TOKEN_DAYS_MAX:
        raise ValueError(f"the expiry is a whole number of days from 1 to {TOKEN_DAYS_MAX}, or empty for none")
    return datetime.now(UTC) + timedelta(days=int(days))


# --- one's own account ------------------------------------------------------------------------------------


@get("/account")
async def account_page(request: Request[Any, Any, Any]) -> Template:
    return render(request, "account.html", message=None)


@post("/account", guards=[auth.viewer, auth.csrf], status_code=303)
async def change_password(request: Request[Any, Any, Any]) -> Response[Any]:
    session = session_of(request)
    form = await request.form()
    # "username": the hidden field that tells a password manager whose password changes.
    auth.known_fields(form, "account", "username", "old_password", "password", "password_again")
    old, new, again = _field(form, "old_password"), _field(form, "password"), _field(form, "password_again")
    try:
        if new != again:
            raise AccountError("the two new passwords differ")
        entry = await asyncio.to_thread(
            console(request).accounts.change_password, session.user, old, new, _peer(request)
        )
    except AccountError as exc:
        record(request, _refused(request, session, "password-set", session.user, str(exc)))
        return render(request, "account.html", status_code=400, message=str(exc))
    record(request, _with_peer(request, entry))
    return _logged_out(request)


# --- inside -----------------------------------------------------------------------------------------------


def _logged_out(request: Request[Any, Any, Any]) -> Redirect:
    """To the login: the user's sessions have ended (a new password ends them all)."""
    response = Redirect("/login", query_params={"next": "/account"}, status_code=303)
    response.delete_cookie(console(request).cookie_name)
    return response


def _actor(session: Session) -> str:
    return f"user:{session.user}"


def _entry(
    request: Request[Any, Any, Any],
    session: Session,
    action: _Action,
    target: str,
    outcome: Literal["done", "refused"],
    detail: str,
) -> AuditEntry:
    return AuditEntry(_actor(session), action, target, outcome, detail, _peer(request))


def _refused(request: Request[Any, Any, Any], session: Session, action: _Action, target: str, why: str) -> AuditEntry:
    return _entry(request, session, action, target, "refused", why)


def _with_peer(request: Request[Any, Any, Any], entry: AuditEntry) -> AuditEntry:
    """The core's entry, with the address the action came from."""
    return AuditEntry(entry.actor, entry.action, entry.target, entry.outcome, entry.detail, _peer(request))


def _field(form: FormMultiDict, key: str) -> str:
    value = form.get(key)
    return value[:_FIELD_MAX] if isinstance(value, str) else ""


def _peer(request: Request[Any, Any, Any]) -> str | None:
    return request.client.host if request.client is not None else None


ROUTES = [
    users_page,
    create_user,
    disable_user,
    password_page,
    set_password,
    tokens_page,
    create_token,
    revoke_token,
    account_page,
    change_password,
]
