"""Console users and logins for the tests: users made with ``edged admin create`` in a state directory before the
daemon starts, a daemon with its console on that state directory, and a login through the form, over plain HTTP
(http.client) or in a browser page."""

from __future__ import annotations

import contextlib
import http.client
import re
import subprocess
import sys
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass
from http.cookies import SimpleCookie
from pathlib import Path
from typing import Any, Final
from urllib.parse import urlencode

from server import REPO_ROOT, Server, run_server

# One password for every test user: long enough for the policy, not containing any test user's name.
PASSWORD: Final = "correct-horse-battery-staple"
USERS: Final = {"ada": "admin", "otto": "operator", "vera": "viewer"}
_CSRF = re.compile(r'name="csrf_token" value="([^"]+)"')


def create_user(state_dir: Path, name: str, role: str, password: str = PASSWORD) -> None:
    subprocess.run(
        [sys.executable, "-m", "edged", "admin", "--state-dir", str(state_dir), "create", "--name", name, "--role",
         role, "--password-stdin"],
        input=password + "\n", capture_output=True, text=True, cwd=REPO_ROOT, timeout=60, check=True,
    )  # fmt: skip


@contextlib.contextmanager
def console_server(
    repositories: Sequence[Path | str], state_dir: Path, *extra_args: str, users: Mapping[str, str] = USERS
) -> Iterator[Server]:
    """A daemon in explicit model control with every model loaded, its console on, and ``users`` (name -> role)
    made beforehand in ``state_dir``."""
    state_dir.mkdir(parents=True, exist_ok=True)
    for name, role in users.items():
        create_user(state_dir, name, role)
    args = ["--state-dir", str(state_dir), "--model-control-mode", "explicit", "--load-model", "*", *extra_args]
    with run_server(repositories, *args) as server:
        yield server


@dataclass
class HttpSession:
    """A logged-in console session over plain HTTP: its cookie and its CSRF token."""

    port: int
    cookie: str
    csrf_token: str

    def request(
        self, method: str, path: str, body: bytes | Mapping[str, str] | None = None, headers: Mapping[str, str] = {}
    ) -> tuple[int, dict[str, str], str]:
        """(status, headers with lower-case names, text); a mapping body is sent as a form."""
        all_headers = {"Cookie": self.cookie, **headers}
        if isinstance(body, Mapping):
            body = urlencode(body).encode()
            all_headers.setdefault("Content-Type", "application/x-www-form-urlencoded")
        return raw(self.port, method, path, body, all_headers)


def raw(
    port: int, method: str, path: str, body: bytes | None = None, headers: Mapping[str, str] = {}
) -> tuple[int, dict[str, str], str]:
    connection = http.client.HTTPConnection("127.0.0.1", port, timeout=30)
    try:
        connection.request(method, path, body=body, headers=dict(headers))
        response = connection.getresponse()
        text = response.read().decode("utf-8", "replace")
        return response.status, {k.lower(): v for k, v in response.getheaders()}, text
    finally:
        connection.close()


def http_login(port: int, name: str, password: str = PASSWORD) -> HttpSession:
    """Logs in through the form; fails the test when the console does not let the user in."""
    form = urlencode({"name": name, "password": password, "next": "/"}).encode()
    status, headers, text = raw(port, "POST", "/login", form, {"Content-Type": "application/x-www-form-urlencoded"})
    assert status == 303, f"login of {name} answered {status}: {text[:500]}"
    cookie = SimpleCookie(headers["set-cookie"])
    name_, morsel = next(iter(cookie.items()))
    session_cookie = f"{name_}={morsel.value}"
    status, _, page = raw(port, "GET", "/", None, {"Cookie": session_cookie})
    assert status == 200, page[:500]
    found = _CSRF.search(page)
    assert found is not None, "no CSRF token on the overview page"
    return HttpSession(port, session_cookie, found.group(1))


def browser_login(page: Any, base_url: str, name: str, password: str = PASSWORD) -> None:
    """Logs ``page`` (a Playwright page) in through the form and waits for the overview."""
    page.goto(f"{base_url}/login")
    page.get_by_label("User name").fill(name)
    page.get_by_label("Password").fill(password)
    page.get_by_role("button", name="Log in").click()
    page.wait_for_url(f"{base_url}/")
