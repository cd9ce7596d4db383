"""What a sync run does with the link and the disk, against moto's S3 server: the bandwidth cap, the free-disk
check before anything is downloaded, the progress it reports, and a revision held back after a failed probation."""

from __future__ import annotations

import asyncio
import itertools
import os
import shutil
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Final

import pytest
from objectstores import S3Bucket, moto_server, tree, write_repository

from edged.sync.errors import SourceProblem, SyncError
from edged.sync.runner import RunOptions, SyncResult, sync_once
from edged.sync.sources import open_repository
from edged.sync.transfer import Progress

CREDENTIALS: Final = {"AWS_ACCESS_KEY_ID": "edged-test", "AWS_SECRET_ACCESS_KEY": "edged-secret"}
BIG: Final = 3 << 20
_buckets = itertools.count()


@pytest.fixture(scope="module")
def endpoint() -> Iterator[str]:
    with moto_server() as port:
        yield f"127.0.0.1:{port}"


@pytest.fixture
def bucket(endpoint: str) -> S3Bucket:
    return S3Bucket(endpoint, f"transfer-{next(_buckets)}", CREDENTIALS)


def sync(endpoint: str, bucket: S3Bucket, state: Path, options: RunOptions) -> SyncResult:
    async def run() -> SyncResult:
        source = open_repository(f"s3://{endpoint}/{bucket.name}/repo", CREDENTIALS)
        try:
            return await sync_once(source, state, options=options)
        finally:
            await source.close()

    return asyncio.run(run())


def publish(bucket: S3Bucket, files: dict[str, bytes]) -> None:
    for key, data in files.items():
        bucket.put(f"repo/{key}", data)


def test_the_bandwidth_cap_holds_and_progress_is_reported(endpoint: str, bucket: S3Bucket, tmp_path: Path) -> None:
    files = write_repository(tmp_path / "published") | {"add_sub/1/weights.bin": os.urandom(BIG)}
    publish(bucket, files)
    progress = Progress()
    rate = 1 << 20
    started = time.monotonic()
    result = sync(endpoint, bucket, tmp_path / "state", RunOptions(max_rate=rate, progress=progress))
    elapsed = time.monotonic() - started
    total = sum(map(len, files.values()))
    # A lower bound only: a slow machine may take longer, no machine may go faster than the cap (plus its burst).
    assert elapsed >= (total - rate) / rate * 0.9, elapsed
    assert tree(result.repository) == files
    assert progress.done_bytes == progress.total_bytes == total
    assert progress.files_done == progress.files_total == len(files)
    assert progress.as_json()["eta_s"] == 0


def test_a_revision_the_disk_cannot_hold_is_refused_before_any_download(
    endpoint: str, bucket: S3Bucket, tmp_path: Path
) -> None:
    files = write_repository(tmp_path / "published")
    publish(bucket, files)
    state = tmp_path / "state"
    first = sync(endpoint, bucket, state, RunOptions())
    bucket.put("repo/add_sub/1/weights.bin", os.urandom(BIG))
    free = shutil.disk_usage(tmp_path).free
    with pytest.raises(SyncError) as refused:
        sync(endpoint, bucket, state, RunOptions(reserve_bytes=free - BIG // 2))
    assert refused.value.problem is SourceProblem.NO_SPACE, refused.value
    assert f"needs {BIG} bytes" in str(refused.value)
    assert not list(state.rglob("*.part")), "nothing was downloaded"
    assert tree(state / "sync" / first.repository.parents[2].name / "current" / "repo") == files
    assert sync(endpoint, bucket, state, RunOptions()).downloaded == ("add_sub/1/weights.bin",)


def test_a_held_back_revision_is_not_downloaded_again(endpoint: str, bucket: S3Bucket, tmp_path: Path) -> None:
    files = write_repository(tmp_path / "published")
    publish(bucket, files)
    state = tmp_path / "state"
    sync(endpoint, bucket, state, RunOptions())
    bad = b"# a revision that failed its probation on this device\n"
    bucket.put("repo/add_sub/config.pbtxt", bad)
    failed = sync(endpoint, bucket, state, RunOptions()).revision
    bucket.put("repo/add_sub/config.pbtxt", files["add_sub/config.pbtxt"])  # the operator reverts
    reverted = sync(endpoint, bucket, state, RunOptions())
    bucket.put("repo/add_sub/config.pbtxt", bad)  # and publishes the bad one again

    held = sync(endpoint, bucket, state, RunOptions(held_back=frozenset({failed})))
    assert held.held_back == failed and held.bytes_transferred == 0 and held.downloaded == ()
    assert held.revision == reverted.revision and tree(held.repository) == files
    bucket.put("repo/add_sub/config.pbtxt", bad + b"# fixed\n")  # a newer revision is taken
    newer = sync(endpoint, bucket, state, RunOptions(held_back=frozenset({failed})))
    assert newer.held_back is None and newer.downloaded == ("add_sub/config.pbtxt",)
