"""API tokens over HTTP (``/v2/edged/tokens``, the tokens category: an admin's token, never loopback's trust):
list them, make one (its secret answered this once), revoke one. ``edged token`` does the same on the state
directory, and makes the first one."""

from __future__ import annotations

import asyncio
import logging
from datetime import UTC, datetime, timedelta
from typing import TYPE_CHECKING, Any, Final

from litestar import MediaType, Request, Response, delete, get, post

from edged.core.access import ACTOR, Role
from edged.core.names import printable
from edged.errors import EdgedError, ErrorCode
from edged.frontends.bodies import management_fields
from edged.frontends.http.audit import record
from edged.frontends.http.codec import encode

if TYPE_CHECKING:
    from edged.core.access import AccessPolicy, TokenVerifier, TokenView
    from edged.frontends.http.infer import HttpOptions

log = logging.getLogger(__name__)

# The longest lifetime a token may be given; past it, "never" (no expires_in_s) says what is meant.
MAX_TOKEN_LIFETIME_S: Final = 10 * 365 * 86400
# What a new token's body may hold; any other field is refused (400), never dropped.
TOKEN_FIELDS: Final = ("name", "role", "expires_in_s")


def _tokens(request: Request[Any, Any, Any]) -> TokenVerifier:
    access: AccessPolicy | None = request.app.state.access
    if access is None:
        raise EdgedError(ErrorCode.UNAVAILABLE, "API tokens are not managed by this server")
    return access.tokens


def _json(value: Any) -> Response[bytes]:
    return Response(encode(value), status_code=200, media_type=MediaType.JSON)


def _token_json(token: TokenView) -> dict[str, Any]:
    return {
        "name": token.name,
        "role": token.role,
        "state": token.state,
        "created_at": token.created_at.isoformat(),
        "expires_at": token.expires_at.isoformat() if token.expires_at else None,
    }


# The token calls read and write the state database: in a worker thread, never on the event loop.
@get("/v2/edged/tokens")
async def token_list(request: Request[Any, Any, Any]) -> Response[bytes]:
    try:
        tokens = await asyncio.to_thread(_tokens(request).list)
    except ValueError as error:
        raise EdgedError(ErrorCode.UNAVAILABLE, str(error)) from None
    return _json({"tokens": [_token_json(token) for token in tokens]})


@post("/v2/edged/tokens", status_code=200)
async def token_create(request: Request[Any, Any, Any]) -> Response[bytes]:
    """``{"name": ..., "role": "viewer|operator|admin", "expires_in_s": N}`` -> the token, shown this once."""
    options: HttpOptions = request.app.state.options
    spec = management_fields(await request.body(), "token", TOKEN_FIELDS, options.max_json_depth)
    name, role, lifetime = spec.get("name"), spec.get("role"), spec.get("expires_in_s")
    if not isinstance(name, str) or role not in {r.value for r in Role}:
        raise EdgedError(ErrorCode.INVALID_ARG, "a token needs a 'name' and a 'role' (viewer, operator or admin)")
    if lifetime is not None and (
        not isinstance(lifetime, int) or isinstance(lifetime, bool) or not 0 < lifetime <= MAX_TOKEN_LIFETIME_S
    ):
        raise EdgedError(
            ErrorCode.INVALID_ARG, f"'expires_in_s' must be 1 to {MAX_TOKEN_LIFETIME_S} seconds (ten years)"
        )
    expires = datetime.now(UTC) + timedelta(seconds=lifetime) if lifetime else None
    try:
        secret, token = await asyncio.to_thread(_tokens(request).create, name, Role(role), expires)
    except ValueError as error:
        raise EdgedError(ErrorCode.INVALID_ARG, str(error)) from None
    log.info("API token '%s' (%s) created by %s", printable(name), role, ACTOR.get() or "anonymous")
    record(request, "token-create", name, f"role {role}")
    return _json({**_token_json(token), "token": secret})


@delete("/v2/edged/tokens/{name:str}", status_code=200)
async def token_revoke(request: Request[Any, Any, Any], name: str) -> Response[bytes]:
    if not await asyncio.to_thread(_tokens(request).revoke, name):
        raise EdgedError(ErrorCode.NOT_FOUND, f"no active token named '{printable(name)}'")
    log.info("API token '%s' revoked by %s", printable(name), ACTOR.get() or "anonymous")
    record(request, "token-revoke", name, "")
    return _json({})
