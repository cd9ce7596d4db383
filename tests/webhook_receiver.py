"""A webhook receiver for the alert tests: an HTTP server on 127.0.0.1 in a thread of its own that records every
request (headers and body), answers the statuses it is told to (then 200), or never answers at all; the tests wait
on the requests it records, never on a clock."""

from __future__ import annotations

import contextlib
import hashlib
import hmac
import http.server
import json
import threading
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any


@dataclass(frozen=True)
class Received:
    path: str
    headers: dict[str, str]  # names in lower case
    body: bytes

    def json(self) -> Any:
        return json.loads(self.body)

    def signed_by(self, secret: str) -> bool:
        """Whether the signature header is the HMAC-SHA256 of ``<timestamp>.<body>`` keyed with ``secret``,
        recomputed here as a receiver would."""
        timestamp = self.headers.get("x-edged-timestamp", "")
        expected = hmac.new(secret.encode(), timestamp.encode() + b"." + self.body, hashlib.sha256).hexdigest()
        return timestamp.isdigit() and hmac.compare_digest(
            self.headers.get("x-edged-signature", ""), f"sha256={expected}"
        )


class Receiver:
    def __init__(self) -> None:
        self.requests: list[Received] = []
        self.statuses: list[int] = []  # answered in order, then 200
        self.hang = False  # hold every request unanswered until close
        self._changed = threading.Condition()
        self._released = threading.Event()
        receiver = self

        class Handler(http.server.BaseHTTPRequestHandler):
            def do_POST(self) -> None:
                length = int(self.headers.get("Content-Length", "0"))
                body = self.rfile.read(length)
                with receiver._changed:
                    receiver.requests.append(Received(self.path, {k.lower(): v for k, v in self.headers.items()}, body))
                    status = receiver.statuses.pop(0) if receiver.statuses else 200
                    hang = receiver.hang
                    receiver._changed.notify_all()
                if hang:
                    receiver._released.wait()
                    return
                self.send_response(status)
                self.send_header("Content-Length", "0")
                self.end_headers()

            def log_message(self, format: str, *args: Any) -> None:
                pass  # the test reports what matters

        self._server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self._server.daemon_threads = True
        self._thread = threading.Thread(target=self._server.serve_forever, name="webhook-receiver", daemon=True)

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self._server.server_address[1]}/hook?team=edge"

    def wait_for(self, count: int, timeout: float = 60.0) -> list[Received]:
        """The first ``count`` requests, once that many came (AssertionError after ``timeout`` s otherwise)."""
        with self._changed:
            if not self._changed.wait_for(lambda: len(self.requests) >= count, timeout):
                raise AssertionError(f"the receiver got {len(self.requests)} request(s), not {count}")
            return list(self.requests[:count])

    def close(self) -> None:
        self._released.set()
        self._server.shutdown()
        self._server.server_close()


@contextlib.contextmanager
def receiver() -> Iterator[Receiver]:
    started = Receiver()
    started._thread.start()
    try:
        yield started
    finally:
        started.close()
