"""Starting and stopping the servers under test: edged and Triton on free ports, ready when their health endpoint
says so, stopped as systemd stops a service."""

from __future__ import annotations

import contextlib
import http.client
import os
import signal
import socket
import ssl
import subprocess
import sys
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Final

from .common import BENCH_DIR, EDGED_REPO, ROOT, TRITON_REFERENCE, TRITON_REPO, say

if TYPE_CHECKING:
    from .measurement import Mode

SERVER_START_TIMEOUT_S: Final = 180.0
# edged on the bundled repository (--console, --footprint) loads two small models.
DAEMON_START_TIMEOUT_S: Final = 60.0


@dataclass(frozen=True)
class Ports:
    http: int
    grpc: int
    metrics: int
    console: int

    def of(self, mode: Mode) -> int:
        return self.grpc if mode.protocol == "grpc" else self.http


def free_ports() -> Ports:
    """Four ports nothing listens on now (the kernel's choice), for one server."""
    sockets = []
    try:
        for _ in range(4):
            s = socket.socket()
            s.bind(("127.0.0.1", 0))
            sockets.append(s)
        http, grpc, metrics, console = (s.getsockname()[1] for s in sockets)
        return Ports(http, grpc, metrics, console)
    finally:
        for s in sockets:
            s.close()


def edged_command(ports: Ports) -> list[str]:
    """edged serving bench-models/edged (the models of the phase)."""
    return [
        str(ROOT / ".venv" / "bin" / "edged"), "serve",
        "--model-repository", str(EDGED_REPO.relative_to(ROOT)),
        "--http-address", "127.0.0.1", "--http-port", str(ports.http),
        "--grpc-address", "127.0.0.1", "--grpc-port", str(ports.grpc),
        "--metrics-port", str(ports.metrics),
        # A state database of its own: the user's may belong to another edged revision.
        "--state-dir", str((BENCH_DIR / "state").relative_to(ROOT)),
    ]  # fmt: skip


def triton_command(ports: Ports) -> list[str]:
    return [
        str(TRITON_REFERENCE), str(TRITON_REPO.relative_to(ROOT)),
        "--http-port", str(ports.http), "--grpc-port", str(ports.grpc), "--metrics-port", str(ports.metrics),
    ]  # fmt: skip


def daemon_command(
    repository: Path, state: Path, ports: Ports, *options: str, python: str = sys.executable
) -> list[str]:
    """``python -m edged serve`` with every model of ``repository`` loaded, on ``ports``, with its own state
    directory, and ``options`` after (the console's, say): how --console and --footprint run it. ``python``: the
    interpreter (an installed package's, say)."""
    return [
        python, "-m", "edged", "serve", "--model-repository", str(repository),
        "--http-address", "127.0.0.1", "--http-port", str(ports.http), "--grpc-port", str(ports.grpc),
        "--metrics-port", str(ports.metrics), "--console-port", str(ports.console), "--state-dir", str(state),
        "--model-control-mode", "explicit", "--load-model", "*",
        *options,
    ]  # fmt: skip


@dataclass
class Started:
    """A server that is ready. Its process id is also the id of the session it runs in."""

    pid: int
    log: Path
    # Seconds from spawning the process to its health endpoint answering 200, and to ``ready_line`` in its log.
    ready_http_s: float = 0.0
    ready_log_s: float = 0.0


def _ready(port: int, tls: ssl.SSLContext | None = None) -> bool:
    connection = (
        http.client.HTTPSConnection("127.0.0.1", port, timeout=2, context=tls)
        if tls is not None
        else http.client.HTTPConnection("127.0.0.1", port, timeout=2)
    )
    try:
        connection.request("GET", "/v2/health/ready")
        return connection.getresponse().status == 200
    except (OSError, http.client.HTTPException):
        return False
    finally:
        connection.close()


@contextlib.contextmanager
def running_server(
    name: str,
    command: list[str],
    http_port: int,
    tls: ssl.SSLContext | None = None,
    *,
    log: Path | None = None,
    env: dict[str, str] | None = None,
    ready_line: str | None = None,
    poll_s: float = 0.25,
    timeout_s: float = SERVER_START_TIMEOUT_S,
    quiet: bool = False,
    cwd: Path = ROOT,
) -> Iterator[Started]:
    """Starts a server, waits until it reports ready (over TLS with ``tls``, a client context; with ``ready_line``
    also until its log has that line), and stops it (SIGTERM, then SIGKILL) afterwards.

    Its output goes to ``log`` (bench-models/NAME.log by default). ``poll_s`` is how often it looks: the resolution
    of the start times. ``quiet``: no progress messages (phases that start it many times).
    """
    log_path = log or BENCH_DIR / f"{name}.log"
    if not quiet:
        say(f"starting {name} (log: {log_path.relative_to(ROOT)})")
    with log_path.open("wb") as output:
        began = time.perf_counter()
        # A session of its own, so that stopping it also reaches the processes it starts (Triton's stubs).
        process = subprocess.Popen(
            command, cwd=cwd, env=env, stdout=output, stderr=subprocess.STDOUT, start_new_session=True
        )
    started = Started(process.pid, log_path)
    try:
        while not (started.ready_http_s and (ready_line is None or started.ready_log_s)):
            if process.poll() is not None:
                raise RuntimeError(
                    f"{name} exited with status {process.returncode} before it was ready; see {log_path}"
                )
            now = time.perf_counter() - began
            if now > timeout_s:
                raise RuntimeError(f"{name} was not ready after {timeout_s:.0f} s; see {log_path}")
            if ready_line and not started.ready_log_s and ready_line in log_path.read_text(errors="replace"):
                started.ready_log_s = now
            if not started.ready_http_s and _ready(http_port, tls):
                started.ready_http_s = now
            time.sleep(poll_s)
        if not quiet:
            say(f"{name} ready after {time.perf_counter() - began:.1f} s")
        yield started
    finally:
        _stop(process)


@contextlib.contextmanager
def edged_daemon(
    name: str,
    repository: Path,
    state: Path,
    ports: Ports,
    *options: str,
    env: dict[str, str] | None = None,
    poll_s: float = 0.1,
    python: str = sys.executable,
    cwd: Path = ROOT,
) -> Iterator[Started]:
    """edged on ``repository`` (see daemon_command), ready once it logged "edged ready" and its health endpoint
    says so; quiet, as phases that start it many times want it. Its log is bench-models/NAME.log, the last start's."""
    with running_server(
        name,
        daemon_command(repository, state, ports, *options, python=python),
        ports.http,
        log=BENCH_DIR / f"{name}.log",
        env=env,
        ready_line="edged ready",
        poll_s=poll_s,
        timeout_s=DAEMON_START_TIMEOUT_S,
        quiet=True,
        cwd=cwd,
    ) as started:
        yield started


def _stop(process: subprocess.Popen[bytes]) -> None:
    if process.poll() is None:
        process.send_signal(signal.SIGTERM)  # what systemctl stop sends: a graceful shutdown
        with contextlib.suppress(subprocess.TimeoutExpired):
            process.wait(timeout=30)
    # Whatever is left of the session it started (the server itself, or children it left behind) is ended.
    with contextlib.suppress(ProcessLookupError):
        os.killpg(process.pid, signal.SIGKILL)
    process.wait()


def triton_skipped(skip_triton: bool) -> str | None:
    """Why this run leaves Triton out, or None when it measures it."""
    if skip_triton:
        return "skipped (--skip-triton)"
    if not TRITON_REFERENCE.is_file():
        return f"skipped ({TRITON_REFERENCE} not found)"
    return None
