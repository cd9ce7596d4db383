"""What every remote kind must do under sync_once, written once; tests/e2e/test_sync_s3.py and test_sync_gcs.py
run it against their real endpoints."""

from __future__ import annotations

import asyncio
import os
import signal
import stat
import subprocess
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Final, Protocol

import pytest
from objectstores import FaultProxy, all_files, inodes, tree, write_repository

from edged.sync import ClientOptions, SourceProblem, SyncError, SyncResult, open_repository, sync_once
from edged.sync.sources import CHUNK_BYTES

BIG_BYTES: Final = 3 << 20


class Bucket(Protocol):
    def put(self, key: str, data: bytes) -> None: ...

    def delete(self, key: str) -> None: ...


@dataclass(frozen=True)
class Remote:
    """A prefix of a bucket on a real endpoint, and how the device reaches it (through ``proxy`` when given)."""

    bucket: Bucket
    prefix: str
    # (endpoint host:port) -> (repository URL, environment)
    locate: Callable[[str], tuple[str, dict[str, str]]]
    endpoint: str

    def put_tree(self, files: dict[str, bytes]) -> None:
        for key, data in files.items():
            self.bucket.put(f"{self.prefix}/{key}", data)

    def sync(self, state_dir: Path, via: FaultProxy | None = None, options: ClientOptions | None = None) -> SyncResult:
        url, env = self.locate(via.url() if via else self.endpoint)

        async def run() -> SyncResult:
            source = open_repository(url, env, options)
            try:
                return await sync_once(source, state_dir)
            finally:
                await source.close()

        return asyncio.run(run())


def first_sync_then_one_change(remote: Remote, tmp_path: Path) -> None:
    files = write_repository(tmp_path / "published")
    remote.put_tree(files)
    state = tmp_path / "state"

    first = remote.sync(state)
    assert first.changed and first.previous_revision is None
    assert sorted(first.downloaded) == sorted(files) and first.linked == ()
    assert first.bytes_transferred == sum(map(len, files.values()))
    assert tree(first.repository) == files
    assert serving(state).resolve() == first.repository.resolve()
    assert all(not (p.stat().st_mode & stat.S_IWUSR) for p in first.repository.rglob("*") if p.is_file())
    first_inodes = inodes(first.repository)

    changed = files["add_sub/config.pbtxt"] + b"\n# retuned\n"
    remote.bucket.put(f"{remote.prefix}/add_sub/config.pbtxt", changed)
    for key in [k for k in files if k.startswith("add_sub_int32/")]:
        remote.bucket.delete(f"{remote.prefix}/{key}")
    second = remote.sync(state)

    assert second.changed and second.previous_revision == first.revision
    assert second.downloaded == ("add_sub/config.pbtxt",) and second.linked == ("add_sub/1/model.onnx",)
    assert second.bytes_transferred == len(changed)
    assert second.removed == tuple(sorted(k for k in files if k.startswith("add_sub_int32/")))
    expected = {k: v for k, v in files.items() if not k.startswith("add_sub_int32/")} | {
        "add_sub/config.pbtxt": changed
    }
    assert tree(second.repository) == expected
    second_inodes = inodes(second.repository)
    for key in second.linked:
        assert second_inodes[key] == first_inodes[key], f"{key} was copied, not hard-linked"
    assert second_inodes["add_sub/config.pbtxt"] != first_inodes["add_sub/config.pbtxt"]
    # The snapshot being left stays whole, for rollback.
    assert tree(first.repository) == files
    assert serving(state).resolve() == second.repository.resolve()
    assert (serving(state).parent.parent / "previous" / "repo").resolve() == first.repository.resolve()

    third = remote.sync(state)
    assert not third.changed and third.bytes_transferred == 0 and third.downloaded == ()
    assert serving(state).resolve() == second.repository.resolve()
    assert len(list(serving(state).parents[1].glob("snapshots/*"))) == 2


def escaping_key_is_refused(remote: Remote, tmp_path: Path, bad_key: str) -> None:
    files = write_repository(tmp_path / "published")
    remote.put_tree(files)
    state = tmp_path / "state"
    first = remote.sync(state)
    before = all_files(tmp_path)

    remote.bucket.put(f"{remote.prefix}/add_sub/config.pbtxt", b"changed along with the bad key")
    remote.bucket.put(f"{remote.prefix}/{bad_key}", b"escaped")
    with pytest.raises(SyncError) as refused:
        remote.sync(state)
    assert refused.value.problem is SourceProblem.REFUSED, refused.value
    assert serving(state).resolve() == first.repository.resolve() and tree(serving(state)) == files
    after = all_files(tmp_path)
    assert {p for p in after - before if not p.startswith("state/")} == set()
    assert not any("evil" in p or "escaped" in p for p in after)
    assert not any(b"escaped" in p.read_bytes() for p in tmp_path.rglob("*") if p.is_file())


def interrupted_download_resumes(remote: Remote, tmp_path: Path, proxy: FaultProxy) -> None:
    files = write_repository(tmp_path / "published")
    remote.put_tree(files)
    state = tmp_path / "state"
    first = remote.sync(state, via=proxy)

    big = os.urandom(BIG_BYTES)
    remote.bucket.put(f"{remote.prefix}/add_sub/1/weights.bin", big)
    proxy.set_budget(BIG_BYTES // 3)
    with pytest.raises(SyncError) as cut:
        remote.sync(state, via=proxy)
    assert cut.value.problem is SourceProblem.UNREACHABLE, cut.value
    assert serving(state).resolve() == first.repository.resolve() and tree(serving(state)) == files
    partial = partial_size(state)
    assert 0 < partial < BIG_BYTES

    proxy.set_budget(None)
    resumed = remote.sync(state, via=proxy)
    assert resumed.downloaded == ("add_sub/1/weights.bin",)
    assert resumed.bytes_transferred == BIG_BYTES - partial
    assert tree(resumed.repository) == files | {"add_sub/1/weights.bin": big}


def corrupted_download_is_refused(remote: Remote, tmp_path: Path, proxy: FaultProxy) -> None:
    """A byte flipped on the way fails the MD5 check: nothing is switched, and the bad bytes are not resumed from."""
    files = write_repository(tmp_path / "published")
    remote.put_tree(files)
    state = tmp_path / "state"
    first = remote.sync(state, via=proxy)

    big = os.urandom(BIG_BYTES)
    remote.bucket.put(f"{remote.prefix}/add_sub/1/weights.bin", big)
    proxy.set_corruption(BIG_BYTES // 2)
    with pytest.raises(SyncError) as corrupted:
        remote.sync(state, via=proxy)
    assert corrupted.value.problem is SourceProblem.VERIFY_FAILED, corrupted.value
    assert serving(state).resolve() == first.repository.resolve() and tree(serving(state)) == files
    assert partial_size(state) == 0

    proxy.set_corruption(None)
    repaired = remote.sync(state, via=proxy)
    assert repaired.bytes_transferred == BIG_BYTES
    assert tree(repaired.repository) == files | {"add_sub/1/weights.bin": big}


def network_down_keeps_current(remote: Remote, tmp_path: Path, proxy: FaultProxy) -> None:
    files = write_repository(tmp_path / "published")
    remote.put_tree(files)
    state = tmp_path / "state"
    first = remote.sync(state, via=proxy)

    remote.bucket.put(f"{remote.prefix}/add_sub/config.pbtxt", b"a revision the device cannot reach")
    proxy.set_budget(0)
    started = time.monotonic()
    with pytest.raises(SyncError) as down:
        remote.sync(state, via=proxy)
    assert down.value.problem is SourceProblem.UNREACHABLE, down.value
    assert time.monotonic() - started < 15
    assert serving(state).resolve() == first.repository.resolve() and tree(serving(state)) == files


def killed_mid_download_resumes(remote: Remote, tmp_path: Path, proxy: FaultProxy) -> None:
    """A sync process killed with SIGKILL in the middle of a download leaves the current snapshot serving and the
    download resumable."""
    files = write_repository(tmp_path / "published")
    remote.put_tree(files)
    state = tmp_path / "state"
    first = remote.sync(state, via=proxy)
    big = os.urandom(BIG_BYTES)
    remote.bucket.put(f"{remote.prefix}/add_sub/1/weights.bin", big)

    proxy.set_budget(BIG_BYTES // 2, stall=True)
    url, env = remote.locate(proxy.url())
    script = (
        "import asyncio, sys\n"
        "from pathlib import Path\n"
        "from edged.sync import open_repository, sync_once\n"
        "async def run():\n"
        "    source = open_repository(sys.argv[1], dict(__import__('os').environ))\n"
        "    try:\n"
        "        await sync_once(source, Path(sys.argv[2]))\n"
        "    finally:\n"
        "        await source.close()\n"
        "asyncio.run(run())\n"
    )
    child = subprocess.Popen(
        [sys.executable, "-c", script, url, str(state)], env=os.environ | env, cwd=Path(__file__).parents[1]
    )
    try:
        deadline = time.monotonic() + 15
        while partial_size(state) < BIG_BYTES // 4 and time.monotonic() < deadline:
            assert child.poll() is None, "the sync ended instead of stalling"
            time.sleep(0.05)
        assert partial_size(state) >= BIG_BYTES // 4, "the download did not start"
    finally:
        os.kill(child.pid, signal.SIGKILL)
        child.wait()
    assert serving(state).resolve() == first.repository.resolve() and tree(serving(state)) == files
    partial = partial_size(state)

    proxy.set_budget(None)
    resumed = remote.sync(state, via=proxy)
    assert resumed.bytes_transferred == BIG_BYTES - partial
    assert tree(resumed.repository) == files | {"add_sub/1/weights.bin": big}
    assert not list(state.rglob("*.part")) and not list(state.rglob(".*.link"))


# Short timeouts, so that a stalled link is given up within seconds; a failed run must return well within
# GIVE_UP_S (a bound that proves it did not hang, not a measure of speed).
IMPATIENT: Final = ClientOptions(connect_timeout_s=1.0, read_timeout_s=1.5)
GIVE_UP_S: Final = 3 * (IMPATIENT.connect_timeout_s + IMPATIENT.read_timeout_s) + 5


def _fails_unreachable(remote: Remote, state: Path, proxy: FaultProxy) -> SyncError:
    started = time.monotonic()
    with pytest.raises(SyncError) as failed:
        remote.sync(state, via=proxy, options=IMPATIENT)
    elapsed = time.monotonic() - started
    assert failed.value.problem is SourceProblem.UNREACHABLE, failed.value
    assert elapsed < GIVE_UP_S, f"the failed run took {elapsed:.1f} s"
    return failed.value


def stalled_download_resumes(remote: Remote, tmp_path: Path, proxy: FaultProxy) -> None:
    """A link that stops moving mid-download: the run gives up within its timeout as UNREACHABLE, the current
    snapshot serves, and the next run fetches only what is missing."""
    files = write_repository(tmp_path / "published")
    remote.put_tree(files)
    state = tmp_path / "state"
    first = remote.sync(state, via=proxy, options=IMPATIENT)

    big = os.urandom(BIG_BYTES)
    remote.bucket.put(f"{remote.prefix}/add_sub/1/weights.bin", big)
    proxy.set_budget(BIG_BYTES // 2, stall=True)
    _fails_unreachable(remote, state, proxy)
    assert serving(state).resolve() == first.repository.resolve() and tree(serving(state)) == files
    partial = partial_size(state)
    assert 0 < partial < BIG_BYTES

    proxy.set_budget(None)
    before = proxy.total
    resumed = remote.sync(state, via=proxy, options=IMPATIENT)
    assert resumed.downloaded == ("add_sub/1/weights.bin",)
    assert resumed.bytes_transferred == BIG_BYTES - partial
    # On the wire too: the resumed run moved the missing part (plus a listing and headers), not the whole object.
    assert proxy.total - before < BIG_BYTES - partial + (64 << 10)
    assert tree(resumed.repository) == files | {"add_sub/1/weights.bin": big}


def repeatedly_cut_download_completes(remote: Remote, tmp_path: Path, proxy: FaultProxy) -> None:
    """A link cut after the same few bytes in every run: each run keeps what it got, so the object completes though
    no single run could fetch it whole (a download that restarted from zero never would)."""
    files = write_repository(tmp_path / "published")
    remote.put_tree(files)
    state = tmp_path / "state"
    remote.sync(state, via=proxy, options=IMPATIENT)

    big = os.urandom(BIG_BYTES)
    remote.bucket.put(f"{remote.prefix}/add_sub/1/weights.bin", big)
    per_run = 3 * CHUNK_BYTES
    partials = [0]
    for _attempt in range(4 * BIG_BYTES // CHUNK_BYTES):
        proxy.set_budget(per_run)
        try:
            done = remote.sync(state, via=proxy, options=IMPATIENT)
        except SyncError as cut:
            assert cut.problem is SourceProblem.UNREACHABLE, cut
            partials.append(partial_size(state))
            assert partials[-1] > partials[-2], f"a cut run kept nothing: {partials}"
            continue
        break
    else:
        raise AssertionError(f"the download never completed: {partials}")
    assert len(partials) >= BIG_BYTES // per_run, partials
    assert done.bytes_transferred == BIG_BYTES - partials[-1]
    assert tree(done.repository) == files | {"add_sub/1/weights.bin": big}
    assert not list(state.rglob("*.part"))


def stalled_listing_keeps_current(remote: Remote, tmp_path: Path, proxy: FaultProxy) -> None:
    """A link that stalls before the listing answers: UNREACHABLE within the timeout, nothing changed, and the next
    run (link back) brings the new revision."""
    files = write_repository(tmp_path / "published")
    remote.put_tree(files)
    state = tmp_path / "state"
    first = remote.sync(state, via=proxy, options=IMPATIENT)

    changed = b"a revision behind a stalled link"
    remote.bucket.put(f"{remote.prefix}/add_sub/config.pbtxt", changed)
    proxy.set_budget(0, stall=True)
    _fails_unreachable(remote, state, proxy)
    assert serving(state).resolve() == first.repository.resolve() and tree(serving(state)) == files
    assert not (serving(state).parents[1] / "staging" / "next").exists()

    proxy.set_budget(None)
    second = remote.sync(state, via=proxy, options=IMPATIENT)
    assert second.downloaded == ("add_sub/config.pbtxt",)
    assert tree(second.repository) == files | {"add_sub/config.pbtxt": changed}


def idle_connection_dropped_between_runs(remote: Remote, tmp_path: Path, proxy: FaultProxy) -> None:
    """One client for two runs, the store closing its idle keep-alive connections in between: the second run opens
    a new connection instead of failing on the dead one."""
    files = write_repository(tmp_path / "published")
    remote.put_tree(files)
    state = tmp_path / "state"
    url, env = remote.locate(proxy.url())
    changed = b"published while the connection idled"

    async def run() -> tuple[SyncResult, SyncResult, int]:
        source = open_repository(url, env, IMPATIENT)
        try:
            first = await sync_once(source, state)
            proxy.set_idle_close(0.2)
            remote.bucket.put(f"{remote.prefix}/add_sub/config.pbtxt", changed)
            deadline = time.monotonic() + 10
            while proxy.idle_closed == 0 and time.monotonic() < deadline:
                await asyncio.sleep(0.05)
            closed = proxy.idle_closed
            proxy.set_idle_close(None)
            return first, await sync_once(source, state), closed
        finally:
            await source.close()

    first, second, closed = asyncio.run(run())
    assert closed > 0, "the client kept no connection open to be dropped"
    assert tree(first.repository) == files
    assert second.downloaded == ("add_sub/config.pbtxt",)
    assert tree(second.repository) == files | {"add_sub/config.pbtxt": changed}


def serving(state: Path) -> Path:
    """The repository the one source synced into ``state`` serves now, found through its ``current`` link."""
    (source,) = (state / "sync").iterdir()
    return source / "current" / "repo"


def partial_size(state: Path) -> int:
    parts = list(state.rglob("*.part"))
    assert len(parts) <= 1, parts
    return parts[0].stat().st_size if parts else 0
