"""Real object-store endpoints for the sync tests: moto's S3 server, the GCS emulator and Azurite (Azure Blob
Storage's emulator, installed by scripts/setup), each started as its own process on a free loopback port, and a
TCP proxy in front of them that can cut the link.

The proxy runs its own event loop in a thread, so that a test's sync (on the test's loop) and the cut it suffers
are independent, as a network is.
"""

from __future__ import annotations

import asyncio
import base64
import contextlib
import email.utils
import hashlib
import hmac
import json
import os
import socket
import subprocess
import sys
import threading
import time
import urllib.parse
import urllib.request
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Final

BIN: Final = Path(sys.executable).parent
STARTUP_S: Final = 20.0
# Where scripts/setup installs Azurite (npm), and the version: the two must agree.
AZURITE_VERSION: Final = "3.35.0"
AZURITE_BIN: Final = (
    Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache")
    / f"edged/azurite-{AZURITE_VERSION}/node_modules/.bin/azurite-blob"
)
# Azurite's one account and its key, the same in every emulator.
AZURITE_ACCOUNT: Final = "devstoreaccount1"
AZURITE_KEY: Final = "Eby8vdM02xNOcqFlqUwJPLlmEtlCDXJ1OUzFT50uSRZ6IFsuFq2UVErCz4I6tq/K1SZFPTOtr/KBHBeksoGMGw=="


def free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port: int = probe.getsockname()[1]
        return port


def _wait_listening(port: int, process: subprocess.Popen[bytes], name: str) -> None:
    deadline = time.monotonic() + STARTUP_S
    while time.monotonic() < deadline:
        if process.poll() is not None:
            raise RuntimeError(f"{name} exited with {process.returncode}")
        with contextlib.suppress(OSError), socket.create_connection(("127.0.0.1", port), 0.2):
            return
        time.sleep(0.05)
    raise RuntimeError(f"{name} did not listen on {port} within {STARTUP_S} s")


@contextlib.contextmanager
def _server(command: list[str], port: int) -> Iterator[None]:
    process = subprocess.Popen(command, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        _wait_listening(port, process, Path(command[0]).name)
        yield
    finally:
        process.terminate()
        try:
            process.wait(5)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait()


@contextlib.contextmanager
def moto_server() -> Iterator[int]:
    port = free_port()
    with _server([str(BIN / "moto_server"), "-H", "127.0.0.1", "-p", str(port)], port):
        yield port


@contextlib.contextmanager
def gcs_emulator(bucket: str) -> Iterator[int]:
    port = free_port()
    command = [
        str(BIN / "gcp-storage-emulator"), "start", "--host", "127.0.0.1", "--port", str(port), "--in-memory",
        "--default-bucket", bucket,
    ]  # fmt: skip
    with _server(command, port):
        yield port


@contextlib.contextmanager
def azurite(location: Path) -> Iterator[int]:
    """Azurite's blob service on a free port, its data in ``location``."""
    if not AZURITE_BIN.exists():
        raise RuntimeError(f"{AZURITE_BIN} is missing: run EDGED_SETUP_FOR_TESTS=1 scripts/setup")
    port = free_port()
    command = [
        str(AZURITE_BIN), "--blobHost", "127.0.0.1", "--blobPort", str(port), "--location", str(location),
        "--silent", "--skipApiVersionCheck", "--loose",
    ]  # fmt: skip
    with _server(command, port):
        yield port


class AzureContainer:
    """A container on Azurite (created here), written to as a publisher's client would: obstore, with the key."""

    def __init__(self, port: int, name: str) -> None:
        from obstore.store import AzureStore

        self.port = port
        self.name = name
        self._request("PUT", f"/{name}?restype=container", "restype:container")
        self.store = AzureStore(
            name,
            config={"account_name": AZURITE_ACCOUNT, "endpoint": self.endpoint, "use_emulator": False},
            client_options={"allow_http": True},
            credential_provider=lambda: {"access_key": AZURITE_KEY, "expires_at": None},  # type: ignore[arg-type]
        )

    @property
    def endpoint(self) -> str:
        return f"http://127.0.0.1:{self.port}/{AZURITE_ACCOUNT}"

    def _request(self, method: str, target: str, canonical_query: str) -> None:
        """A request without a body, signed with the account's shared key (Azure's SharedKey scheme)."""
        headers = {"x-ms-date": email.utils.formatdate(usegmt=True), "x-ms-version": "2021-08-06"}
        path = target.split("?", 1)[0]
        signed = "".join(f"{name}:{value}\n" for name, value in sorted(headers.items()))
        # The verb, eleven standard headers (all empty here), the x-ms- headers, then the resource: the account
        # twice, since the emulator's path names it as well.
        to_sign = f"{method}\n" + "\n" * 11 + signed + f"/{AZURITE_ACCOUNT}/{AZURITE_ACCOUNT}{path}\n{canonical_query}"
        mac = hmac.new(base64.b64decode(AZURITE_KEY), to_sign.encode(), hashlib.sha256).digest()
        headers["Authorization"] = f"SharedKey {AZURITE_ACCOUNT}:{base64.b64encode(mac).decode()}"
        headers["Content-Length"] = "0"
        request = urllib.request.Request(f"{self.endpoint}{target}", method=method, headers=headers)
        urllib.request.urlopen(request, timeout=10).close()

    def put(self, key: str, data: bytes) -> None:
        import obstore

        obstore.put(self.store, key, data)

    def delete(self, key: str) -> None:
        import obstore

        obstore.delete(self.store, key)

    def get(self, key: str) -> bytes:
        import obstore

        return bytes(obstore.get(self.store, key).bytes())

    def names(self) -> set[str]:
        import obstore

        return {str(meta["path"]) for batch in obstore.list(self.store) for meta in batch}


def gcs_upload(port: int, bucket: str, name: str, data: bytes) -> None:
    """Upload through the emulator's JSON API, as a publisher's client would."""
    query = urllib.parse.urlencode({"uploadType": "media", "name": name})
    request = urllib.request.Request(
        f"http://127.0.0.1:{port}/upload/storage/v1/b/{bucket}/o?{query}",
        data=data,
        method="POST",
        headers={"Content-Type": "application/octet-stream"},
    )
    with urllib.request.urlopen(request, timeout=10) as response:
        json.load(response)


class S3Bucket:
    """A bucket on an S3 endpoint (``host:port``), written to as a publisher's client would."""

    def __init__(self, endpoint: str, name: str, credentials: dict[str, str]) -> None:
        import boto3

        self.name = name
        self.client = boto3.client(
            "s3",
            endpoint_url=f"http://{endpoint}",
            aws_access_key_id=credentials["AWS_ACCESS_KEY_ID"],
            aws_secret_access_key=credentials["AWS_SECRET_ACCESS_KEY"],
            region_name="us-east-1",
        )
        self.client.create_bucket(Bucket=name)

    def put(self, key: str, data: bytes) -> None:
        self.client.put_object(Bucket=self.name, Key=key, Body=data)

    def delete(self, key: str) -> None:
        self.client.delete_object(Bucket=self.name, Key=key)

    def get(self, key: str) -> bytes:
        body: bytes = self.client.get_object(Bucket=self.name, Key=key)["Body"].read()
        return body

    def names(self) -> set[str]:
        listed = self.client.list_objects_v2(Bucket=self.name).get("Contents", [])
        return {str(item["Key"]) for item in listed}


@dataclass
class FaultProxy:
    """A TCP proxy to ``127.0.0.1:upstream``. ``budget`` caps the bytes it passes from the server (None: no cap);
    once spent it cuts every connection and refuses new ones, as a link that went down does, or, with ``stall``,
    holds them (new ones included) open and silent, as a link that stopped moving does. ``idle_close_s`` closes a
    connection that carried nothing for that long, as a store or a NAT drops an idle keep-alive connection. With
    ``keep_alive``, the proxy speaks HTTP/1.1 with keep-alive to its clients (relaying each request on a connection
    of its own, since the test servers close theirs after every response), so that a client has idle connections
    to lose; only the idle closing applies then."""

    upstream: int
    port: int = field(default_factory=free_port)
    budget: int | None = None
    stall: bool = False
    # The offset (counted like ``passed``) of one byte from the server to flip on its way, as a bad link might.
    corrupt_at: int | None = None
    passed: int = 0
    idle_close_s: float | None = None
    keep_alive: bool = False
    # Counted over the proxy's life, never reset: bytes from the server, connections accepted, idle ones closed.
    total: int = 0
    accepted: int = 0
    idle_closed: int = 0
    _loop: asyncio.AbstractEventLoop = field(default_factory=asyncio.new_event_loop)
    _writers: set[asyncio.StreamWriter] = field(default_factory=set)

    def set_budget(self, budget: int | None, *, stall: bool = False) -> None:
        def apply() -> None:
            self.budget = budget
            self.stall = stall
            self.passed = 0
            if budget == 0:
                self._cut_all()

        self._loop.call_soon_threadsafe(apply)
        time.sleep(0.05)

    def set_idle_close(self, seconds: float | None) -> None:
        def apply() -> None:
            self.idle_close_s = seconds

        self._loop.call_soon_threadsafe(apply)
        time.sleep(0.05)

    def set_corruption(self, offset: int | None) -> None:
        def apply() -> None:
            self.corrupt_at = offset
            self.passed = 0

        self._loop.call_soon_threadsafe(apply)
        time.sleep(0.05)

    def _corrupt(self, data: bytes) -> bytes:
        offset = None if self.corrupt_at is None else self.corrupt_at - self.passed
        if offset is None or not 0 <= offset < len(data):
            return data
        flipped = bytearray(data)
        flipped[offset] ^= 0xFF
        return bytes(flipped)

    def _cut_all(self) -> None:
        for writer in list(self._writers):
            writer.transport.abort()

    def url(self) -> str:
        return f"127.0.0.1:{self.port}"

    async def _pipe(
        self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter, downstream: bool, activity: list[float]
    ) -> None:
        try:
            while data := await reader.read(16384):
                activity[0] = self._loop.time()
                if downstream and self.budget is not None:
                    room = self.budget - self.passed
                    data = data[: max(room, 0)]
                    self.passed += len(data)
                    self.total += len(data)
                    if data:
                        writer.write(data)
                        await writer.drain()
                    if self.passed >= self.budget:
                        if not self.stall:
                            self._cut_all()
                        # A stalled connection ends alone once the stall is lifted (by ``finally`` below), so
                        # that it cannot cut connections opened since.
                        while self.stall:
                            await asyncio.sleep(0.05)
                        return
                    continue
                if downstream:
                    data = self._corrupt(data)
                    self.passed += len(data)
                    self.total += len(data)
                writer.write(data)
                await writer.drain()
        except (ConnectionError, OSError):
            pass
        finally:
            writer.transport.abort()

    async def _handle(self, client_reader: asyncio.StreamReader, client_writer: asyncio.StreamWriter) -> None:
        self.accepted += 1
        if self.keep_alive:
            await self._serve_keep_alive(client_reader, client_writer)
            return
        if self.budget is not None and self.passed >= self.budget:
            # A stalled link swallows what is sent and answers nothing, until the stall is lifted.
            while self.stall:
                await asyncio.sleep(0.05)
            client_writer.transport.abort()
            return
        try:
            server_reader, server_writer = await asyncio.open_connection("127.0.0.1", self.upstream)
        except OSError:
            client_writer.transport.abort()
            return
        self._writers.update((client_writer, server_writer))
        activity = [self._loop.time()]
        idle = self._loop.create_task(self._close_when_idle(activity, client_writer, server_writer))
        try:
            await asyncio.gather(
                self._pipe(client_reader, server_writer, downstream=False, activity=activity),
                self._pipe(server_reader, client_writer, downstream=True, activity=activity),
            )
        finally:
            idle.cancel()
            self._writers.difference_update((client_writer, server_writer))

    async def _serve_keep_alive(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        activity = [self._loop.time()]
        idle = self._loop.create_task(self._close_when_idle(activity, writer))
        self._writers.add(writer)
        try:
            while True:
                try:
                    head = await reader.readuntil(b"\r\n\r\n")
                except (asyncio.IncompleteReadError, asyncio.LimitOverrunError, ConnectionError):
                    return
                activity[0] = self._loop.time()
                request_line, *lines = head.decode("latin-1").split("\r\n")
                method, target, _version = request_line.split(" ", 2)
                fields = [
                    line for line in lines if line and not line.lower().startswith(("connection:", "keep-alive:"))
                ]
                length = next((int(f.split(":", 1)[1]) for f in fields if f.lower().startswith("content-length:")), 0)
                body = await reader.readexactly(length)
                # HTTP/1.0 upstream: the answer is never chunked and ends when the server closes.
                upstream_reader, upstream_writer = await asyncio.open_connection("127.0.0.1", self.upstream)
                forwarded = "\r\n".join([f"{method} {target} HTTP/1.0", *fields, "Connection: close", "", ""])
                upstream_writer.write(forwarded.encode("latin-1") + body)
                answer = await upstream_reader.read()
                upstream_writer.close()
                answer_head, _, answer_body = answer.partition(b"\r\n\r\n")
                status_line, *answer_lines = answer_head.decode("latin-1").split("\r\n")
                dropped: tuple[str, ...] = ("connection:", "keep-alive:", "transfer-encoding:")
                if method != "HEAD":
                    dropped += ("content-length:",)
                kept = [line for line in answer_lines if not line.lower().startswith(dropped)]
                if method != "HEAD":
                    kept.append(f"Content-Length: {len(answer_body)}")
                status = "HTTP/1.1 " + status_line.split(" ", 1)[1]
                reply = "\r\n".join([status, *kept, "Connection: keep-alive", "", ""]).encode("latin-1")
                self.total += len(answer_body)
                writer.write(reply + (b"" if method == "HEAD" else answer_body))
                await writer.drain()
                activity[0] = self._loop.time()
        except (ConnectionError, OSError):
            pass
        finally:
            idle.cancel()
            self._writers.discard(writer)
            writer.transport.abort()

    async def _close_when_idle(self, activity: list[float], *writers: asyncio.StreamWriter) -> None:
        while True:
            await asyncio.sleep(0.05)
            if self.idle_close_s is not None and self._loop.time() - activity[0] > self.idle_close_s:
                self.idle_closed += 1
                # An orderly close (FIN), as a server ends a keep-alive connection it no longer wants.
                for writer in writers:
                    writer.close()
                return

    @contextlib.contextmanager
    def running(self) -> Iterator[FaultProxy]:
        started = threading.Event()

        async def serve() -> asyncio.Server:
            server = await asyncio.start_server(self._handle, "127.0.0.1", self.port)
            started.set()
            return server

        thread = threading.Thread(target=self._loop.run_forever, daemon=True)
        thread.start()
        server = asyncio.run_coroutine_threadsafe(serve(), self._loop).result(10)
        try:
            yield self
        finally:

            async def stop() -> None:
                self.stall = False
                server.close()
                self._cut_all()
                # Connection handlers still running end here, not with the loop closed under them.
                handlers = [t for t in asyncio.all_tasks() if t is not asyncio.current_task()]
                for task in handlers:
                    task.cancel()
                await asyncio.gather(*handlers, return_exceptions=True)

            asyncio.run_coroutine_threadsafe(stop(), self._loop).result(10)
            self._loop.call_soon_threadsafe(self._loop.stop)
            thread.join(10)
            self._loop.close()


def tree(root: Path) -> dict[str, bytes]:
    """Every file under ``root`` by its relative path, with its bytes."""
    return {path.relative_to(root).as_posix(): path.read_bytes() for path in sorted(root.rglob("*")) if path.is_file()}


def inodes(root: Path) -> dict[str, int]:
    return {path.relative_to(root).as_posix(): path.stat().st_ino for path in root.rglob("*") if path.is_file()}


def all_files(root: Path) -> set[str]:
    """Every path under ``root`` (files, folders, links), for checking that nothing was written elsewhere."""
    return {os.path.relpath(os.path.join(d, n), root) for d, dirs, files in os.walk(root) for n in dirs + files}


def write_repository(root: Path) -> dict[str, bytes]:
    """A small Triton repository (two add_sub models) at ``root``; its files by relative path."""
    sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "scripts"))
    import modelgen  # type: ignore[import-not-found, unused-ignore]

    modelgen.write_add_sub(root / "add_sub", max_batch_size=8, dims=16, dtype="FP32")
    modelgen.write_add_sub(root / "add_sub_int32", max_batch_size=8, dims=16, dtype="INT32")
    return tree(root)
