"""``scripts/bench --console``: what the web console costs the device. Two figures, from the bundled repository:

- **memory**: the daemon's resident set (Rss and Pss from /proc/PID/smaps_rollup) with ``--allow-console false``
  and with the console on, after a user logged in and every page was served a number of times (templates compiled,
  sessions in use). Median of a few starts of each;
- **server time per page**: the time the console spent on each page, as its Server-Timing header says (from the
  request's arrival at the app to the answer's first byte), and the client's wall time for the whole answer;
  median and 95th percentile of many sequential requests.

A user is made with ``edged admin create`` in a fresh state directory before each start; nothing else runs.
"""

from __future__ import annotations

import http.client
import os
import re
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any, Final
from urllib.parse import urlencode

ROOT: Final = Path(__file__).resolve().parent.parent
REPOSITORY: Final = ROOT / "model_repository"
PASSWORD: Final = "bench-password-long-enough"
PAGES: Final = (
    "/",
    "/overview/live",
    "/models",
    "/models/add_sub",
    "/upload",
    "/metrics",
    "/metrics/data",
    "/sync",
    "/history",
    "/admin/users",
    "/admin/tokens",
    "/login",
)
_TIMING = re.compile(r"dur=([0-9.]+)")


def _free_ports(count: int) -> list[int]:
    import socket

    sockets = [socket.socket() for _ in range(count)]
    try:
        for sock in sockets:
            sock.bind(("127.0.0.1", 0))
        return [sock.getsockname()[1] for sock in sockets]
    finally:
        for sock in sockets:
            sock.close()


@contextmanager
def _daemon(console: bool) -> Iterator[tuple[int, int]]:
    """edged on the bundled repository; yields (pid, console port)."""
    with tempfile.TemporaryDirectory(prefix="edged-bench-console-") as scratch:
        state = Path(scratch) / "state"
        state.mkdir()
        subprocess.run(
            [sys.executable, "-m", "edged", "admin", "--state-dir", str(state), "create", "--name", "tech", "--role",
             "admin", "--password-stdin"],
            input=PASSWORD, text=True, check=True, capture_output=True, cwd=ROOT,
        )  # fmt: skip
        http_port, grpc_port, metrics_port, console_port = _free_ports(4)
        log = Path(scratch) / "edged.log"
        args = [sys.executable, "-m", "edged", "serve", "--model-repository", str(REPOSITORY)]
        args += ["--http-address", "127.0.0.1", "--http-port", str(http_port), "--grpc-port", str(grpc_port)]
        args += ["--metrics-port", str(metrics_port), "--console-port", str(console_port), "--state-dir", str(state)]
        args += ["--model-control-mode", "explicit", "--load-model", "*", "--allow-console", str(console).lower()]
        with log.open("wb") as output:
            process = subprocess.Popen(args, stdout=output, stderr=subprocess.STDOUT, cwd=ROOT)
        try:
            deadline = time.monotonic() + 60
            while "edged ready" not in log.read_text(errors="replace"):
                if process.poll() is not None or time.monotonic() > deadline:
                    raise RuntimeError(f"edged did not start:\n{log.read_text(errors='replace')}")
                time.sleep(0.1)
            yield process.pid, console_port
        finally:
            process.terminate()
            process.wait(timeout=30)


def _memory(pid: int) -> dict[str, int]:
    """Rss and Pss in KiB."""
    values: dict[str, int] = {}
    for line in Path(f"/proc/{pid}/smaps_rollup").read_text().splitlines():
        key, _, rest = line.partition(":")
        if key in ("Rss", "Pss"):
            values[key] = int(rest.split()[0])
    return values


class _Client:
    def __init__(self, port: int) -> None:
        self._connection = http.client.HTTPConnection("127.0.0.1", port, timeout=30)
        self.cookie = ""

    def request(self, method: str, path: str, body: bytes | None = None) -> tuple[int, float | None, float, bytes]:
        """(status, server ms, wall ms, body)."""
        headers = {"Cookie": self.cookie} if self.cookie else {}
        if body is not None:
            headers["Content-Type"] = "application/x-www-form-urlencoded"
        began = time.perf_counter()
        self._connection.request(method, path, body=body, headers=headers)
        response = self._connection.getresponse()
        data = response.read()
        wall = (time.perf_counter() - began) * 1000
        timing = _TIMING.search(response.getheader("server-timing") or "")
        cookie = response.getheader("set-cookie")
        if cookie:
            self.cookie = cookie.split(";")[0]
        return response.status, float(timing.group(1)) if timing else None, wall, data

    def login(self) -> None:
        status, _, _, _ = self.request("POST", "/login", urlencode({"name": "tech", "password": PASSWORD}).encode())
        if status != 303:
            raise RuntimeError(f"login answered {status}")


def _pages(port: int, rounds: int) -> dict[str, dict[str, Any]]:
    client = _Client(port)
    client.login()
    results: dict[str, dict[str, Any]] = {}
    for path in PAGES:
        server: list[float] = []
        wall: list[float] = []
        status = 0
        size = 0
        for _ in range(rounds):
            status, server_ms, wall_ms, data = client.request("GET", path)
            if server_ms is not None:
                server.append(server_ms)
            wall.append(wall_ms)
            size = len(data)
        results[path] = {
            "status": status,
            "bytes": size,
            "server_ms_median": statistics.median(server) if server else None,
            "server_ms_p95": _p95(server),
            "wall_ms_median": statistics.median(wall),
        }
    return results


def _p95(values: list[float]) -> float | None:
    if not values:
        return None
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, round(0.95 * (len(ordered) - 1)))]


def _settled_memory(pid: int) -> dict[str, int]:
    # The allocator and the metrics history settle within a few seconds of the last request.
    time.sleep(3)
    return _memory(pid)


def run_console(quick: bool, argv: list[str] | None, save: Callable[[str, dict[str, Any]], None]) -> int:
    starts = 1 if quick else 3
    rounds = 20 if quick else 100
    off: list[dict[str, int]] = []
    on: list[dict[str, int]] = []
    pages: dict[str, dict[str, Any]] = {}
    for _ in range(starts):
        with _daemon(console=False) as (pid, _port):
            off.append(_settled_memory(pid))
        with _daemon(console=True) as (pid, port):
            pages = _pages(port, rounds)
            on.append(_settled_memory(pid))
    rss_off = statistics.median(m["Rss"] for m in off)
    rss_on = statistics.median(m["Rss"] for m in on)
    summary: dict[str, Any] = {
        "argv": argv,
        "starts": starts,
        "rounds": rounds,
        "rss_kib_console_off": rss_off,
        "rss_kib_console_on": rss_on,
        "pss_kib_console_off": statistics.median(m["Pss"] for m in off),
        "pss_kib_console_on": statistics.median(m["Pss"] for m in on),
        "pages": pages,
    }
    added = (rss_on - rss_off) / 1024
    print(f"console: idle RSS {rss_off / 1024:.1f} MiB without the console, {rss_on / 1024:.1f} MiB with it after "
          f"{rounds} requests of every page: +{added:.1f} MiB (median of {starts} starts)")  # fmt: skip
    print(f"{'page':<18}{'status':>7}{'bytes':>8}{'server median':>15}{'server p95':>12}{'wall median':>13}")
    for path, figures in pages.items():
        server = figures["server_ms_median"]
        p95 = figures["server_ms_p95"]
        print(
            f"{path:<18}{figures['status']:>7}{figures['bytes']:>8}"
            f"{(f'{server:.2f} ms' if server is not None else '-'):>15}"
            f"{(f'{p95:.2f} ms' if p95 is not None else '-'):>12}{figures['wall_ms_median']:>10.2f} ms"
        )
    save("console", summary | {"cpus": os.cpu_count()})
    return 0
