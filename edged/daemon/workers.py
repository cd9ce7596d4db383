"""Frontend worker processes: more cores for the protocol work of many small requests.

One event loop reads, checks, schedules and answers every request of the daemon, so a model that computes little
is served at one core's rate. With ``--frontend-workers N`` the daemon starts N processes (edged.daemon.worker)
that listen on the HTTP and gRPC ports beside it (SO_REUSEPORT: the kernel hands each new connection to one of
them). A worker parses its clients' requests, decodes the tensors, checks access, and passes the decoded request
to the daemon over a Unix socket (edged.frontends.relay); the daemon runs it on its one copy of the model, with
the same dynamic batching across every client, and the worker encodes the answer. Requests other than inference
(health, metadata, repository, shared memory, ...) are passed to the daemon whole and answered by its own code.

The daemon keeps serving the ports itself, so a connection the kernel gives it skips the hop. Workers are started
once the models loaded, restarted when one dies, and stopped before the models unload. They serve plain HTTP and
gRPC only: TLS stays with the daemon, which then serves every connection.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Final

from edged.daemon.endpoints import StartupError
from edged.frontends.relay.host import RelayHost

if TYPE_CHECKING:
    from collections.abc import Callable, Mapping

    from prometheus_client import Counter

    from edged.config.settings import Settings
    from edged.core.service import InferenceService
    from edged.state.store import StateStore, TokenRecord

log = logging.getLogger("edged")

# Chosen by default (-1): one worker for each 2 cores past the first 2, so that a core stays for the models and a
# core for the daemon's own loop; past this many the daemon's loop, which runs every request, is the bound.
MAX_AUTO_WORKERS: Final = 6
# How long the daemon waits at start for its workers to serve before it says READY without them.
READY_WAIT_S: Final = 30.0
# A worker that dies is started again after this long, doubled each time it dies young, up to the most.
RESTART_DELAY_S: Final = 1.0
RESTART_DELAY_MAX_S: Final = 30.0
RELAY_SOCKET: Final = "relay.sock"
GRPC_SOCKET: Final = "grpc.sock"


def worker_count(settings: Settings) -> int:
    """How many frontend workers the settings ask for; StartupError where they cannot serve."""
    tls = settings.http_use_ssl or settings.http_use_ssl_mutual or settings.grpc_use_ssl or settings.grpc_use_ssl_mutual
    if settings.frontend_workers >= 0:
        if settings.frontend_workers > 0 and tls:
            raise StartupError(
                "--frontend-workers serve plain HTTP and gRPC only: with TLS on either endpoint, leave it at 0 or -1"
            )
        return settings.frontend_workers
    if tls:
        return 0
    cores = len(os.sched_getaffinity(0))
    return min(MAX_AUTO_WORKERS, max(0, (cores - 2) // 2))


@dataclass(frozen=True, slots=True)
class WorkerPlan:
    """Where the daemon and its workers meet: a directory only the daemon's user can enter."""

    count: int
    directory: Path

    @classmethod
    def make(cls, settings: Settings) -> WorkerPlan | None:
        count = worker_count(settings)
        if count == 0:
            return None
        return cls(count, Path(tempfile.mkdtemp(prefix="edged-workers-")))

    @property
    def relay_socket(self) -> str:
        return str(self.directory / RELAY_SOCKET)

    @property
    def grpc_socket(self) -> str:
        return str(self.directory / GRPC_SOCKET)

    def remove(self) -> None:
        shutil.rmtree(self.directory, ignore_errors=True)


class WorkersPart:
    """Starts the workers once the endpoints serve, keeps them running, stops them first."""

    name = "frontend workers"

    def __init__(
        self,
        plan: WorkerPlan,
        settings: Settings,
        service: InferenceService,
        store: StateStore | None,
        http_app: object,
        ports: tuple[int, int],
        counters: Mapping[str, Counter],
    ) -> None:
        """``counters``: the daemon's counters that workers add to, by the name they report them under."""
        self._plan = plan
        self._settings = settings
        self._ports = ports
        self.host = RelayHost(plan.relay_socket, service, settings, _token_finder(store), counters)
        self.host.http_app = http_app
        self._tasks: list[asyncio.Task[None]] = []
        self._processes: dict[int, subprocess.Popen[bytes]] = {}
        self._stopping = False

    async def start(self) -> None:
        await self.host.start()
        for index in range(self._plan.count):
            self._tasks.append(asyncio.create_task(self._keep(index)))
        try:
            await asyncio.wait_for(self.host.wait_ready(self._plan.count), READY_WAIT_S)
        except TimeoutError:
            log.warning("frontend workers not serving after %.0f s: the daemon serves without them", READY_WAIT_S)
        else:
            log.info("%d frontend workers serve HTTP and gRPC beside the daemon", self._plan.count)

    def stopping(self) -> None:
        self._stopping = True
        for process in self._processes.values():
            with contextlib.suppress(ProcessLookupError):
                process.send_signal(signal.SIGTERM)

    async def stop(self) -> None:
        self._stopping = True
        grace = self._settings.exit_timeout_secs + 2
        waits = [asyncio.create_task(_exited(process)) for process in self._processes.values()]
        if waits:
            _, late = await asyncio.wait(waits, timeout=grace)
            if late:
                for process in self._processes.values():
                    with contextlib.suppress(ProcessLookupError):
                        process.kill()
                await asyncio.wait(waits)
        for task in self._tasks:
            task.cancel()
        await asyncio.gather(*self._tasks, return_exceptions=True)
        await self.host.stop()

    async def _keep(self, index: int) -> None:
        delay = RESTART_DELAY_S
        http_port, grpc_port = self._ports
        while not self._stopping:
            started = time.monotonic()
            # subprocess (vfork and exec), not the event loop's own spawning: uvloop forks, and grpc's fork
            # handlers then complain about the daemon's threads.
            process = subprocess.Popen(
                [
                    sys.executable,
                    "-m",
                    "edged.daemon.worker",
                    str(self._plan.directory),
                    str(index),
                    str(http_port),
                    str(grpc_port),
                ]
            )
            self._processes[index] = process
            code = await _exited(process)
            if self._stopping:
                return
            log.error("frontend worker %d exited with status %d; starting it again in %.0f s", index, code, delay)
            await asyncio.sleep(delay)
            delay = RESTART_DELAY_S if time.monotonic() - started > 60 else min(delay * 2, RESTART_DELAY_MAX_S)


async def _exited(process: subprocess.Popen[bytes]) -> int:
    """The process's exit status, once it exits (its pidfd becomes readable then)."""
    loop = asyncio.get_running_loop()
    exited: asyncio.Future[None] = loop.create_future()

    def readable() -> None:
        if not exited.done():
            exited.set_result(None)

    pidfd = os.pidfd_open(process.pid)
    try:
        loop.add_reader(pidfd, readable)
        try:
            await exited
        finally:
            loop.remove_reader(pidfd)
    finally:
        os.close(pidfd)
    return process.wait()


def _token_finder(store: StateStore | None) -> Callable[[str], TokenRecord | None]:
    def find(token_id: str) -> TokenRecord | None:
        return store.find_token(token_id) if store is not None else None

    return find
