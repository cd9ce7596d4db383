"""``--console``: what the web console costs the device. Two figures, from the bundled repository:

- **memory**: the daemon's resident set (Rss and Pss from /proc/PID/smaps_rollup) with ``--allow-console false``
  and with the console on, after a user logged in and every page was served a number of times (templates compiled,
  sessions in use). Median of a few starts of each;
- **server time per page**: the time the console spent on each page, as its Server-Timing header says (from the
  request's arrival at the app to the answer's first byte), and the client's wall time for the whole answer;
  median and 95th percentile of many sequential requests.

A user is made with ``edged admin create`` in a fresh state directory before each start; nothing else runs.
"""

from __future__ import annotations

import argparse
import http.client
import os
import re
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any, Final
from urllib.parse import urlencode

from .common import BUNDLED_REPO, ROOT, Phase
from .memory import Memory, rollup
from .results import save_results
from .servers import edged_daemon, free_ports

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
        ports = free_ports()
        with edged_daemon("edged-console", BUNDLED_REPO, state, ports, "--allow-console", str(console).lower()) as s:
            yield s.pid, ports.console


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


def _settled_memory(pid: int) -> Memory:
    # The allocator and the metrics history settle within a few seconds of the last request.
    time.sleep(3)
    return rollup(pid)


def run(args: argparse.Namespace, argv: list[str] | None) -> int:
    quick = args.quick
    starts = 1 if quick else 3
    rounds = 20 if quick else 100
    off: list[Memory] = []
    on: list[Memory] = []
    pages: dict[str, dict[str, Any]] = {}
    for _ in range(starts):
        with _daemon(console=False) as (pid, _port):
            off.append(_settled_memory(pid))
        with _daemon(console=True) as (pid, port):
            pages = _pages(port, rounds)
            on.append(_settled_memory(pid))
    rss_off = statistics.median(m.rss for m in off)
    rss_on = statistics.median(m.rss for m in on)
    summary: dict[str, Any] = {
        "argv": argv,
        "starts": starts,
        "rounds": rounds,
        "rss_kib_console_off": rss_off,
        "rss_kib_console_on": rss_on,
        "pss_kib_console_off": statistics.median(m.pss for m in off),
        "pss_kib_console_on": statistics.median(m.pss for m in on),
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
    save_results("console", summary | {"cpus": os.cpu_count()})
    return 0


PHASE: Final = Phase(
    "--console",
    "only the web console's cost: idle memory with and without it, and the server time of each page",
    run,
)
