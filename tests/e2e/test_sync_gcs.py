"""sync_once against a real GCS endpoint: the GCS emulator, reached through STORAGE_EMULATOR_HOST."""

from __future__ import annotations

import asyncio
import itertools
import urllib.parse
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import Final

import pytest
import synccases
from objectstores import FaultProxy, gcs_emulator, gcs_upload

from edged.sync import SourceProblem, SyncError, open_repository, sync_once

BUCKET: Final = "models"
_prefixes = itertools.count()


class GCSBucket:
    def __init__(self, port: int) -> None:
        self.port = port

    def put(self, key: str, data: bytes) -> None:
        gcs_upload(self.port, BUCKET, key, data)

    def delete(self, key: str) -> None:
        name = urllib.parse.quote(key, safe="")
        request = urllib.request.Request(
            f"http://127.0.0.1:{self.port}/storage/v1/b/{BUCKET}/o/{name}", method="DELETE"
        )
        urllib.request.urlopen(request, timeout=10).close()


@pytest.fixture(scope="module")
def emulator_port() -> Iterator[int]:
    with gcs_emulator(BUCKET) as port:
        yield port


@pytest.fixture
def remote(emulator_port: int) -> synccases.Remote:
    prefix = f"repository-{next(_prefixes)}"

    def locate(endpoint: str) -> tuple[str, dict[str, str]]:
        return f"gs://{BUCKET}/{prefix}", {"STORAGE_EMULATOR_HOST": f"http://{endpoint}"}

    return synccases.Remote(GCSBucket(emulator_port), prefix, locate, f"127.0.0.1:{emulator_port}")


@pytest.fixture
def proxy(emulator_port: int) -> Iterator[FaultProxy]:
    with FaultProxy(emulator_port).running() as running:
        yield running


def test_first_sync_then_one_change(remote: synccases.Remote, tmp_path: Path) -> None:
    synccases.first_sync_then_one_change(remote, tmp_path)


# The emulator itself refuses to store keys with '..' components, so the keys that reach a device here are the ones
# only edged's own check stops.
@pytest.mark.parametrize(
    "bad_key", ["add_sub\\evil", "add_sub/1/evil\x01", "add_sub//evil"], ids=["backslash", "control", "empty"]
)
def test_escaping_key_is_refused(remote: synccases.Remote, tmp_path: Path, bad_key: str) -> None:
    synccases.escaping_key_is_refused(remote, tmp_path, bad_key)


def test_interrupted_download_resumes(remote: synccases.Remote, tmp_path: Path, proxy: FaultProxy) -> None:
    synccases.interrupted_download_resumes(remote, tmp_path, proxy)


def test_corrupted_download_is_refused(remote: synccases.Remote, tmp_path: Path, proxy: FaultProxy) -> None:
    synccases.corrupted_download_is_refused(remote, tmp_path, proxy)


def test_network_down_keeps_current(remote: synccases.Remote, tmp_path: Path, proxy: FaultProxy) -> None:
    synccases.network_down_keeps_current(remote, tmp_path, proxy)


def test_a_missing_bucket_is_told_apart(emulator_port: int, tmp_path: Path) -> None:
    source = open_repository("gs://no-such-bucket/repository", {"STORAGE_EMULATOR_HOST": f"127.0.0.1:{emulator_port}"})

    async def run() -> None:
        try:
            await sync_once(source, tmp_path / "state")
        finally:
            await source.close()

    with pytest.raises(SyncError) as missing:
        asyncio.run(run())
    assert missing.value.problem is SourceProblem.NOT_FOUND, missing.value


def test_killed_mid_download_resumes(remote: synccases.Remote, tmp_path: Path, proxy: FaultProxy) -> None:
    synccases.killed_mid_download_resumes(remote, tmp_path, proxy)
