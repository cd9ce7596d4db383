"""Webhook deliveries: one alert as a JSON POST to the URL an admin set, signed, retried within the bounds of
edged.core.alerts.bounds.

The signature: ``X-Edged-Signature: sha256=<hex>``, the HMAC-SHA256 keyed with the webhook's secret of
``<X-Edged-Timestamp>.<body>``. The timestamp (Unix seconds) is in the signed text, so a receiver that refuses an
old timestamp refuses a replayed delivery; each try is signed anew with its own time. ``X-Edged-Delivery`` is the
alert's id, the same on every try, for a receiver to drop a try it already took.

http.client (the standard library) in a thread of its own: the event loop never waits on a receiver. Each try has a
deadline for the whole of it; past it, the connection is shut from the loop's side, which ends any read or write
the thread is blocked in.
"""

from __future__ import annotations

import asyncio
import contextlib
import hashlib
import hmac
import http.client
import secrets
import socket
import ssl
import threading
import time
from collections.abc import Awaitable, Callable, Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from typing import Final
from urllib.parse import urlsplit

from edged import __version__
from edged.core.alerts.bounds import BACKOFF_S, RESPONSE_READ_MAX, TRIES, TRY_TIMEOUT_S, URL_MAX
from edged.core.alerts.rules import AlertError

SIGNATURE_HEADER: Final = "X-Edged-Signature"
TIMESTAMP_HEADER: Final = "X-Edged-Timestamp"
DELIVERY_HEADER: Final = "X-Edged-Delivery"
# Answers worth another try: the receiver's own trouble, a timeout, "too many requests". Any other 3xx or 4xx says
# the request itself is wrong (a moved or missing endpoint, a refused signature): trying again changes nothing.
_RETRIED: Final = frozenset({408, 425, 429})


def check_url(text: str) -> str:
    """The URL as it will be used, or AlertError saying why not: http or https, a host, no user name or password
    (put a credential in the path or the query, where the receiver's own check sees it), no fragment."""
    url = text.strip()
    if not url:
        raise AlertError("the webhook's URL is empty")
    if len(url) > URL_MAX:
        raise AlertError(f"the webhook's URL is longer than {URL_MAX} characters")
    if any(ord(char) < 0x21 or ord(char) == 0x7F for char in url):
        raise AlertError("the webhook's URL holds a space or a control character")
    try:
        parts = urlsplit(url)
        port = parts.port
    except ValueError as exc:
        raise AlertError(f"the webhook's URL cannot be read: {exc}") from None
    if parts.scheme.lower() not in ("http", "https"):
        raise AlertError(f"a webhook's URL starts with http:// or https://, not {parts.scheme or 'nothing'}")
    if not parts.hostname:
        raise AlertError("the webhook's URL names no host")
    if parts.username is not None or parts.password is not None:
        raise AlertError("the webhook's URL holds a user name or password: put a credential in its path or query")
    if parts.fragment:
        raise AlertError("the webhook's URL has a fragment (#...), which is never sent")
    if port == 0:
        raise AlertError("the webhook's URL names port 0")
    return url


def new_secret() -> str:
    """A webhook's signing secret: 256 bits, URL-safe text."""
    return secrets.token_urlsafe(32)


def signature(secret: str, timestamp: str, body: bytes) -> str:
    """``sha256=<hex>``: what a receiver recomputes with the secret to check a delivery."""
    digest = hmac.new(secret.encode(), timestamp.encode() + b"." + body, hashlib.sha256).hexdigest()
    return f"sha256={digest}"


@dataclass(frozen=True, slots=True)
class Delivery:
    """What became of a delivery: ``detail`` says it in words for the console."""

    delivered: bool
    tries: int
    detail: str


@dataclass(frozen=True, slots=True)
class DeliveryLimits:
    tries: int = TRIES
    backoff_s: Sequence[float] = BACKOFF_S
    try_timeout_s: float = TRY_TIMEOUT_S


class WebhookSender:
    """Delivers one alert at a time (the caller's queue orders them), each try in a thread of its own pool."""

    def __init__(
        self,
        limits: DeliveryLimits = DeliveryLimits(),
        *,
        sleep: Callable[[float], Awaitable[None]] = asyncio.sleep,
        wall_clock: Callable[[], float] = time.time,
        tls: ssl.SSLContext | None = None,
    ) -> None:
        self._limits = limits
        self._sleep = sleep
        self._wall_clock = wall_clock
        self._tls = tls
        # One thread: deliveries are sequential; a try cut off at its deadline frees it as soon as its socket is shut.
        self._pool = ThreadPoolExecutor(1, thread_name_prefix="edged-webhook")
        self._current: _Try | None = None

    async def deliver(self, url: str, secret: str, delivery_id: str, body: bytes) -> Delivery:
        limits = self._limits
        last = ""
        for attempt in range(1, limits.tries + 1):
            if attempt > 1:
                backoff = limits.backoff_s
                await self._sleep(backoff[min(attempt - 2, len(backoff) - 1)] if backoff else 0.0)
            timestamp = str(int(self._wall_clock()))
            headers = {
                "Content-Type": "application/json",
                "User-Agent": f"edged/{__version__}",
                TIMESTAMP_HEADER: timestamp,
                SIGNATURE_HEADER: signature(secret, timestamp, body),
                DELIVERY_HEADER: delivery_id,
            }
            status, last = await self._try(url, headers, body)
            tries = _tries(attempt)
            if status is not None and 200 <= status < 300:
                return Delivery(True, attempt, f"HTTP {status} after {tries}")
            if status is not None and status < 500 and status not in _RETRIED:
                return Delivery(False, attempt, f"{last}, not retried: the receiver refused it")
        return Delivery(False, limits.tries, f"{last} ({_tries(limits.tries)})")

    async def _try(self, url: str, headers: Mapping[str, str], body: bytes) -> tuple[int | None, str]:
        """(the status, or None when none came; the outcome in words)."""
        timeout = self._limits.try_timeout_s
        attempt = self._current = _Try(url, headers, body, timeout, self._tls)
        future = asyncio.get_running_loop().run_in_executor(self._pool, attempt.run)
        try:
            status = await asyncio.wait_for(future, timeout)
        except TimeoutError:
            attempt.abort()
            return None, f"no answer within {timeout:g} s"
        except (OSError, http.client.HTTPException) as exc:
            return None, _described(exc)
        return status, f"HTTP {status}"

    def close(self) -> None:
        # A try in progress is cut off now rather than at its deadline, so that it holds no stop up.
        if self._current is not None:
            self._current.abort()
        self._pool.shutdown(wait=False, cancel_futures=True)


class _Try:
    """One POST, run in the sender's thread; ``abort`` (from the loop) shuts its socket."""

    def __init__(
        self, url: str, headers: Mapping[str, str], body: bytes, timeout: float, tls: ssl.SSLContext | None
    ) -> None:
        self._url = urlsplit(url)
        self._headers = dict(headers)
        self._body = body
        self._timeout = timeout
        self._tls = tls
        self._lock = threading.Lock()
        self._aborted = False
        self._connection: http.client.HTTPConnection | None = None

    def run(self) -> int:
        url = self._url
        host, port = url.hostname or "", url.port
        connection = (
            http.client.HTTPSConnection(
                host, port, timeout=self._timeout, context=self._tls or ssl.create_default_context()
            )
            if url.scheme.lower() == "https"
            else http.client.HTTPConnection(host, port, timeout=self._timeout)
        )
        with self._lock:
            if self._aborted:
                raise TimeoutError("cut off at its deadline")
            self._connection = connection
        try:
            connection.connect()
            # Checked again once connected: an abort while connecting found no socket to shut.
            with self._lock:
                if self._aborted:
                    raise TimeoutError("cut off at its deadline")
            target = (url.path or "/") + (f"?{url.query}" if url.query else "")
            connection.request("POST", target, body=self._body, headers=self._headers)
            response = connection.getresponse()
            response.read(RESPONSE_READ_MAX)
            return response.status
        finally:
            connection.close()

    def abort(self) -> None:
        with self._lock:
            self._aborted = True
            connection = self._connection
        sock = connection.sock if connection is not None else None
        if sock is not None:
            # OSError: closed already, the try ended by itself.
            with contextlib.suppress(OSError):
                sock.shutdown(socket.SHUT_RDWR)


def _tries(count: int) -> str:
    return f"{count} {'try' if count == 1 else 'tries'}"


def _described(exc: BaseException) -> str:
    if isinstance(exc, ssl.SSLCertVerificationError):
        return f"the receiver's certificate was refused: {exc.verify_message}"
    if isinstance(exc, ConnectionRefusedError):
        return "connection refused"
    if isinstance(exc, socket.gaierror):
        return f"the host was not found: {exc.strerror}"
    if isinstance(exc, TimeoutError):
        return "timed out"
    if isinstance(exc, OSError):
        return exc.strerror or str(exc) or type(exc).__name__
    return f"the answer was not HTTP: {type(exc).__name__}"
