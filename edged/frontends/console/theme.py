"""The light/dark choice a person makes beside the system's: kept in a cookie of this browser (not the account, so a
shared screen keeps its own), sent with every page as ``<html data-theme>``, so that it applies before any script
runs and without JavaScript. ``POST /theme`` moves it on: the system's choice, dark, light, and back."""

from __future__ import annotations

from typing import Any, Final

from litestar import Request, post
from litestar.response import Redirect

from edged.frontends.console.auth import local_path
from edged.frontends.console.pages import THEME_CHOICES, THEME_COOKIE, theme_of

_ONE_YEAR_S: Final = 365 * 24 * 3600


@post("/theme", status_code=303)
async def next_theme(request: Request[Any, Any, Any]) -> Redirect:
    """The next theme, and back to the page the button was on. Needs no login (the login page has the button too)
    and changes nothing but this browser's cookie, so it takes no CSRF token."""
    form = await request.form()
    current = theme_of(request)
    chosen = THEME_CHOICES[(THEME_CHOICES.index(current) + 1) % len(THEME_CHOICES)]
    back = form.get("next")
    response = Redirect(local_path(back if isinstance(back, str) else "/"), status_code=303)
    secure = request.url.scheme == "https"
    if chosen:
        response.set_cookie(THEME_COOKIE, chosen, max_age=_ONE_YEAR_S, path="/", samesite="lax", secure=secure)
    else:
        response.delete_cookie(THEME_COOKIE, path="/")
    return response


ROUTES = [next_theme]
