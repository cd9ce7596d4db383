"""sync_once against a real S3 endpoint: moto's server, reached as ``s3://host:port/bucket/prefix``."""

from __future__ import annotations

import asyncio
import itertools
from collections.abc import Iterator
from pathlib import Path
from typing import Final

import pytest
import synccases
from objectstores import FaultProxy, S3Bucket, moto_server

from edged.sync import SourceProblem, SyncError, open_repository, sync_once

CREDENTIALS: Final = {"AWS_ACCESS_KEY_ID": "edged-test", "AWS_SECRET_ACCESS_KEY": "edged-secret"}
_buckets = itertools.count()


@pytest.fixture(scope="module")
def moto_port() -> Iterator[int]:
    with moto_server() as port:
        yield port


@pytest.fixture
def remote(moto_port: int) -> synccases.Remote:
    bucket = S3Bucket(f"127.0.0.1:{moto_port}", f"models-{next(_buckets)}", CREDENTIALS)

    def locate(endpoint: str) -> tuple[str, dict[str, str]]:
        return f"s3://{endpoint}/{bucket.name}/repository", dict(CREDENTIALS)

    return synccases.Remote(bucket, "repository", locate, f"127.0.0.1:{moto_port}")


@pytest.fixture
def proxy(moto_port: int) -> Iterator[FaultProxy]:
    with FaultProxy(moto_port).running() as running:
        yield running


def test_first_sync_then_one_change(remote: synccases.Remote, tmp_path: Path) -> None:
    synccases.first_sync_then_one_change(remote, tmp_path)


@pytest.mark.parametrize(
    "bad_key",
    ["../evil", "add_sub/../../evil", "add_sub\\..\\..\\evil", "add_sub/1/evil\x01", "/evil"],
    ids=["parent", "nested-parent", "backslash", "control", "absolute"],
)
def test_escaping_key_is_refused(remote: synccases.Remote, tmp_path: Path, bad_key: str) -> None:
    synccases.escaping_key_is_refused(remote, tmp_path, bad_key)


def test_interrupted_download_resumes(remote: synccases.Remote, tmp_path: Path, proxy: FaultProxy) -> None:
    synccases.interrupted_download_resumes(remote, tmp_path, proxy)


def test_corrupted_download_is_refused(remote: synccases.Remote, tmp_path: Path, proxy: FaultProxy) -> None:
    synccases.corrupted_download_is_refused(remote, tmp_path, proxy)


def test_network_down_keeps_current(remote: synccases.Remote, tmp_path: Path, proxy: FaultProxy) -> None:
    synccases.network_down_keeps_current(remote, tmp_path, proxy)


def test_killed_mid_download_resumes(remote: synccases.Remote, tmp_path: Path, proxy: FaultProxy) -> None:
    synccases.killed_mid_download_resumes(remote, tmp_path, proxy)


def test_a_missing_bucket_is_told_apart(moto_port: int, tmp_path: Path) -> None:
    source = open_repository(f"s3://127.0.0.1:{moto_port}/no-such-bucket/repository", dict(CREDENTIALS))
    with pytest.raises(SyncError) as missing:
        asyncio.run(sync_once(source, tmp_path / "state"))
    assert missing.value.problem is SourceProblem.NOT_FOUND, missing.value
