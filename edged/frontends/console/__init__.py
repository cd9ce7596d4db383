"""The web console: what the device serves, how it performs, uploads, versions, sync and history, behind a login.

A Litestar app on a port of its own (``--console-port``), rendered with Jinja2 templates from ``web/templates`` and
made live with htmx (vendored in ``web/static/vendor``); every page reads without JavaScript. It calls the core
only, as the other frontends do: the inference service for models and metrics, ``edged.core.accounts`` for users
and sessions, the API tokens of ``edged.core.access``.

Security, in one place each:

- **Login** (``auth``): server-side sessions in the state database; the cookie holds only the session's secret,
  HttpOnly, SameSite=Strict, Secure under TLS. Pages need a session (``viewer`` guard); changing things needs the
  operator role, users and tokens the admin role: the roles of the API tokens.
- **CSRF** (``auth.csrf``): every state-changing request carries the session's token (a hidden form field, or the
  X-CSRF-Token header htmx and the upload script send), and a cross-site Origin is refused before that. Litestar's
  own CSRF middleware is a double-submit cookie, not bound to the session; with sessions on the server already, a
  token bound to the session is the stronger choice and costs nothing more.
- **Headers** (``app``): a Content-Security-Policy with no inline script or style, no framing, no referrer, no
  caching of pages.
"""

from edged.frontends.console.app import ConsoleContext, create_console_app

__all__ = ["ConsoleContext", "create_console_app"]
