"""sync_once over a real, shaped network link: moto's S3 server in its own network namespace, reached through a veth
pair with packet loss, delay, a slow rate, or the link going down mid-download. Skipped, with the reason, where the
machine cannot build the link (not root, no iproute2, no network namespaces, no netem in the kernel)."""

from __future__ import annotations

import concurrent.futures
import contextlib
import os
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Final

import pytest
import synccases
from netem import Link, LinkUnavailable, veth_link, wait_listening
from objectstores import BIN, S3Bucket, tree, write_repository

from edged.sync import ClientOptions, SourceProblem, SyncError, SyncResult

CREDENTIALS: Final = {"AWS_ACCESS_KEY_ID": "edged-test", "AWS_SECRET_ACCESS_KEY": "edged-secret"}
PORT: Final = 9000  # the namespace is new: nothing else listens in it
OBJECT_BYTES: Final = 1 << 20
CUT_OBJECT_BYTES: Final = 3 << 20
# Patient enough for a slow or lossy link to finish (obstore's timeout covers a whole request, body included).
PATIENT: Final = ClientOptions(connect_timeout_s=5.0, read_timeout_s=30.0)
# Short enough that a dead link is given up quickly, long enough for the cut download's first part to arrive.
IMPATIENT: Final = ClientOptions(connect_timeout_s=1.0, read_timeout_s=4.0)


@pytest.fixture
def shaped() -> Iterator[tuple[Link, synccases.Remote]]:
    """A namespace of its own for this test, moto's server in it, and a repository prefix on that server."""
    with contextlib.ExitStack() as cleanup:
        try:
            link = cleanup.enter_context(veth_link())
        except LinkUnavailable as exc:
            pytest.skip(f"no veth link on this machine: {exc}")
        server = link.start([str(BIN / "moto_server"), "-H", link.inside_ip, "-p", str(PORT)])

        def stop() -> None:
            server.terminate()
            try:
                server.wait(5)
            except Exception:
                server.kill()
                server.wait()

        cleanup.callback(stop)
        wait_listening(link.inside_ip, PORT, server)
        endpoint = f"{link.inside_ip}:{PORT}"
        bucket = S3Bucket(endpoint, "models", CREDENTIALS)

        def locate(where: str) -> tuple[str, dict[str, str]]:
            return f"s3://{where}/models/repository", dict(CREDENTIALS)

        yield link, synccases.Remote(bucket, "repository", locate, endpoint)


def publish(remote: synccases.Remote, tmp_path: Path, size: int) -> dict[str, bytes]:
    files = write_repository(tmp_path / "published") | {"add_sub/1/weights.bin": os.urandom(size)}
    remote.put_tree(files)
    return files


def shape_or_skip(link: Link, *netem: str) -> None:
    try:
        link.shape(*netem)
    except LinkUnavailable as exc:
        pytest.skip(f"netem (sch_netem) is not available in this kernel: {exc}")


def synced_through(remote: synccases.Remote, tmp_path: Path, files: dict[str, bytes]) -> SyncResult:
    result = remote.sync(tmp_path / "state", options=PATIENT)
    assert tree(result.repository) == files
    assert result.bytes_transferred == sum(map(len, files.values()))
    return result


def test_lossy_link_completes(shaped: tuple[Link, synccases.Remote], tmp_path: Path) -> None:
    link, remote = shaped
    files = publish(remote, tmp_path, OBJECT_BYTES)
    shape_or_skip(link, "loss", "10%")
    synced_through(remote, tmp_path, files)


def test_delayed_link_completes(shaped: tuple[Link, synccases.Remote], tmp_path: Path) -> None:
    link, remote = shaped
    files = publish(remote, tmp_path, OBJECT_BYTES)
    shape_or_skip(link, "delay", "100ms", "20ms")
    synced_through(remote, tmp_path, files)


def test_slow_link_completes(shaped: tuple[Link, synccases.Remote], tmp_path: Path) -> None:
    link, remote = shaped
    files = publish(remote, tmp_path, OBJECT_BYTES)
    try:
        link.limit_rate("2mbit")
    except LinkUnavailable as exc:
        pytest.skip(str(exc))
    synced_through(remote, tmp_path, files)


def test_link_down_mid_download(shaped: tuple[Link, synccases.Remote], tmp_path: Path) -> None:
    """The link goes down while a large file downloads: the run fails as UNREACHABLE within its timeout, the
    current snapshot serves; the link comes back and the next run fetches only the rest."""
    link, remote = shaped
    files = write_repository(tmp_path / "published")
    remote.put_tree(files)
    state = tmp_path / "state"
    first = remote.sync(state, options=IMPATIENT)

    big = os.urandom(CUT_OBJECT_BYTES)
    remote.bucket.put(f"{remote.prefix}/add_sub/1/weights.bin", big)
    try:
        # Slow enough that the download is still running when the link goes down.
        link.limit_rate("8mbit")
    except LinkUnavailable as exc:
        pytest.skip(str(exc))
    with concurrent.futures.ThreadPoolExecutor(1) as pool:
        started = time.monotonic()
        running = pool.submit(remote.sync, state, None, IMPATIENT)
        while synccases.partial_size(state) < CUT_OBJECT_BYTES // 8 and not running.done():
            time.sleep(0.01)
        link.down()
        try:
            with pytest.raises(SyncError) as down:
                running.result(60)
        finally:
            link.up()
        elapsed = time.monotonic() - started
    assert down.value.problem is SourceProblem.UNREACHABLE, down.value
    assert elapsed < 3 * (IMPATIENT.connect_timeout_s + IMPATIENT.read_timeout_s), f"gave up after {elapsed:.1f} s"
    assert synccases.serving(state).resolve() == first.repository.resolve()
    assert tree(synccases.serving(state)) == files
    partial = synccases.partial_size(state)
    assert 0 < partial < CUT_OBJECT_BYTES

    link.limit_rate("1000mbit")
    resumed = remote.sync(state, options=IMPATIENT)
    assert resumed.bytes_transferred == CUT_OBJECT_BYTES - partial
    assert tree(resumed.repository) == files | {"add_sub/1/weights.bin": big}


def test_slow_but_moving_download_is_not_given_up(shaped: tuple[Link, synccases.Remote], tmp_path: Path) -> None:
    link, remote = shaped
    files = publish(remote, tmp_path, OBJECT_BYTES)
    try:
        link.limit_rate("2mbit")  # about 4 s for the object: longer than the read timeout, never silent for long
    except LinkUnavailable as exc:
        pytest.skip(str(exc))
    result = remote.sync(tmp_path / "state", options=ClientOptions(connect_timeout_s=2.0, read_timeout_s=2.0))
    assert tree(result.repository) == files
