"""The fleet view against real endpoints (moto's S3 server, the GCS emulator): devices sync their channel and
report to the bucket, and ``edged fleet status`` run as its own process shows them all."""

from __future__ import annotations

import asyncio
import itertools
import json
import os
import subprocess
import sys
from collections.abc import Iterator
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import TYPE_CHECKING, Any, Final

import boto3
import pytest
from objectstores import FaultProxy, gcs_emulator, gcs_upload, moto_server, tree, write_repository
from server import REPO_ROOT, TRACEBACK_MARKER

import edged
from edged.sync import SourceProblem, SyncError, SyncResult, open_repository, sync_once
from edged.sync.fleet import DeviceStatus, ModelStatus, Unreadable, channel_url, fleet, report

if TYPE_CHECKING:
    from edged.sync.sources import RemoteRepository

S3_CREDENTIALS: Final = {"AWS_ACCESS_KEY_ID": "edged-test", "AWS_SECRET_ACCESS_KEY": "edged-secret"}
GCS_BUCKET: Final = "fleet"
_names = itertools.count()


def s3_client(port: int) -> Any:
    return boto3.client(
        "s3",
        endpoint_url=f"http://127.0.0.1:{port}",
        aws_access_key_id=S3_CREDENTIALS["AWS_ACCESS_KEY_ID"],
        aws_secret_access_key=S3_CREDENTIALS["AWS_SECRET_ACCESS_KEY"],
        region_name="us-east-1",
    )


@dataclass(frozen=True)
class Store:
    """A base repository on a real endpoint: its URL, the environment that reaches it, and a publisher's upload."""

    kind: str
    port: int
    bucket: str
    prefix: str

    @property
    def base(self) -> str:
        where = f"127.0.0.1:{self.port}/" if self.kind == "s3" else ""
        return f"{self.kind}://{where}{self.bucket}/{self.prefix}"

    @property
    def env(self) -> dict[str, str]:
        if self.kind == "s3":
            return dict(S3_CREDENTIALS)
        return {"STORAGE_EMULATOR_HOST": f"http://127.0.0.1:{self.port}"}

    def put(self, key: str, data: bytes) -> None:
        if self.kind == "s3":
            s3_client(self.port).put_object(Bucket=self.bucket, Key=f"{self.prefix}/{key}", Body=data)
        else:
            gcs_upload(self.port, self.bucket, f"{self.prefix}/{key}", data)

    def put_tree(self, folder: str, files: dict[str, bytes]) -> None:
        for key, data in files.items():
            self.put(f"{folder}/{key}", data)


@pytest.fixture(scope="module")
def moto_port() -> Iterator[int]:
    with moto_server() as port:
        yield port


@pytest.fixture(scope="module")
def gcs_port() -> Iterator[int]:
    with gcs_emulator(GCS_BUCKET) as port:
        yield port


@pytest.fixture(params=["s3", "gs"])
def store(request: pytest.FixtureRequest) -> Store:
    name = f"fleet-{next(_names)}"
    if request.param == "s3":
        port: int = request.getfixturevalue("moto_port")
        s3_client(port).create_bucket(Bucket=name)
        return Store("s3", port, name, "edge")
    return Store("gs", request.getfixturevalue("gcs_port"), GCS_BUCKET, name)


def edged_fleet(store: Store, *args: str) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, **store.env}
    return subprocess.run(
        [sys.executable, "-m", "edged", "fleet", "status", *args],
        capture_output=True,
        text=True,
        timeout=120,
        cwd=REPO_ROOT,
        env=env,
        stdin=subprocess.DEVNULL,
        check=False,
    )


def device_syncs_and_reports(store: Store, device: str, channel: str | None, state: Path) -> DeviceStatus:
    """What the daemon does after a sync run: sync the channel, then write its status to the base."""

    async def run() -> DeviceStatus:
        source = open_repository(channel_url(store.base, channel), store.env)
        base = open_repository(store.base, store.env)
        try:
            result = await sync_once(source, state)
            now = datetime.now(UTC)
            models = {path.name: ModelStatus("READY", "1") for path in result.repository.iterdir() if path.is_dir()}
            status = DeviceStatus(
                device=device,
                channel=channel,
                revision=result.revision,
                models=models,
                last_sync=now,
                updated_at=now,
                edged_version=edged.__version__,
            )
            await report(base, status)
            return status
        finally:
            await source.close()
            await base.close()

    return asyncio.run(run())


def read_fleet(store: Store) -> list[DeviceStatus | Unreadable]:
    async def run() -> list[DeviceStatus | Unreadable]:
        base: RemoteRepository = open_repository(store.base, store.env)
        try:
            return await fleet(base)
        finally:
            await base.close()

    return asyncio.run(run())


def test_devices_on_channels_report_and_fleet_status_shows_them(store: Store, tmp_path: Path) -> None:
    stable = write_repository(tmp_path / "stable")
    canary = {**stable, "add_sub/config.pbtxt": stable["add_sub/config.pbtxt"] + b"\n# canary\n"}
    store.put_tree("stable", stable)
    store.put_tree("canary", canary)

    reported = [
        device_syncs_and_reports(store, "edge-01", "stable", tmp_path / "state-1"),
        device_syncs_and_reports(store, "edge-02", "stable", tmp_path / "state-2"),
        device_syncs_and_reports(store, "edge-03", "canary", tmp_path / "state-3"),
    ]
    # Each device serves its own channel's files, and the two channels are different revisions.
    serving = tmp_path / "state-3"
    assert any(tree(path) == canary for path in serving.glob("sync/*/current/repo"))
    assert reported[0].revision == reported[1].revision != reported[2].revision

    # A report replaces the device's last one.
    later = DeviceStatus(
        device="edge-02",
        channel="stable",
        revision=reported[1].revision,
        models=dict(reported[1].models),
        last_error="endpoint unreachable: s3://example/stable",
        last_sync=reported[1].last_sync,
        updated_at=datetime.now(UTC) - timedelta(hours=2),
        edged_version=edged.__version__,
    )
    asyncio.run(_report(store, later))
    reported[1] = later
    store.put(".edged/devices/broken.json", b"{not json")
    store.put(".edged/devices/huge.json", b" " * (300 << 10))

    broken, *devices, huge = read_fleet(store)
    assert devices == reported
    assert isinstance(broken, Unreadable) and broken.key == ".edged/devices/broken.json"
    assert broken.reason.startswith("not a device status")
    assert huge == Unreadable(".edged/devices/huge.json", f"{300 << 10} bytes, larger than {256 << 10}")

    shown = edged_fleet(store, store.base)
    assert shown.returncode == 0, shown.stderr
    rows = {line.split()[0]: line for line in shown.stdout.splitlines()[1:]}
    assert set(rows) == {"edge-01", "edge-02", "edge-03", ".edged/devices/broken.json", ".edged/devices/huge.json"}
    for status in reported:
        assert status.revision is not None
        fields = rows[status.device].split()
        assert fields[1:4] == [status.channel, status.revision, "2/2"], rows[status.device]
    assert "STALE" in rows["edge-02"] and "endpoint unreachable" in rows["edge-02"]
    assert "STALE" not in rows["edge-01"] + rows["edge-03"]
    assert "unreadable: not a device status" in rows[".edged/devices/broken.json"]
    assert "unreadable:" in rows[".edged/devices/huge.json"]

    as_json = edged_fleet(store, store.base, "--json", "--stale-after", "3h")
    assert as_json.returncode == 0, as_json.stderr
    listed = json.loads(as_json.stdout)
    by_device = {item["device"]: item for item in listed if "device" in item}
    assert {item["key"] for item in listed if "unreadable" in item} == {
        ".edged/devices/broken.json",
        ".edged/devices/huge.json",
    }
    assert by_device["edge-03"]["channel"] == "canary" and by_device["edge-03"]["models"]["add_sub"]["state"] == "READY"
    assert by_device["edge-02"]["last_error"].startswith("endpoint unreachable") and not by_device["edge-02"]["stale"]


async def _report(store: Store, status: DeviceStatus) -> None:
    base = open_repository(store.base, store.env)
    try:
        await report(base, status)
    finally:
        await base.close()


def test_a_device_on_the_base_never_serves_the_fleets_reports(store: Store, tmp_path: Path) -> None:
    files = write_repository(tmp_path / "published")
    for key, data in files.items():
        store.put(key, data)
    device_syncs_and_reports(store, "edge-01", None, tmp_path / "state-1")
    second = device_syncs_and_reports(store, "edge-02", None, tmp_path / "state-2")
    assert [item.device for item in read_fleet(store) if isinstance(item, DeviceStatus)] == ["edge-01", "edge-02"]
    served = next((tmp_path / "state-2").glob("sync/*/current/repo"))
    assert tree(served) == files and second.channel is None


def test_an_empty_fleet_and_an_unreachable_bucket(store: Store) -> None:
    empty = edged_fleet(store, store.base)
    assert (empty.returncode, empty.stdout) == (0, "no device has reported\n"), empty.stderr

    missing = Store(store.kind, store.port, "no-such-bucket", "edge").base
    failed = edged_fleet(store, missing)
    assert failed.returncode == 1 and failed.stdout == ""
    assert failed.stderr.startswith("edged: bucket or object not found") and failed.stderr.count("\n") == 1
    assert TRACEBACK_MARKER not in failed.stderr


def test_a_channel_of_many_files_resumes_every_download_a_cut_link_stopped(store: Store, tmp_path: Path) -> None:
    """Downloads run several at once: a link that goes down stops them all, each keeps what it had, and the next
    run moves only the missing bytes."""
    files = {f"model_{i:02d}/1/weights.bin": os.urandom(1 << 20) for i in range(12)}
    store.put_tree("stable", files)
    state = tmp_path / "state"
    with FaultProxy(store.port).running() as proxy:
        via = Store(store.kind, proxy.port, store.bucket, store.prefix)
        url = channel_url(via.base, "stable")
        proxy.set_budget((len(files) << 20) // 2)
        with pytest.raises(SyncError) as cut:
            asyncio.run(_sync(url, via.env, state))
        assert cut.value.problem is SourceProblem.UNREACHABLE, cut.value
        parts = list(state.rglob("*.part"))
        assert len(parts) > 1, "the downloads ran one after the other"
        # Staged downloads, partial or whole: nothing of them is fetched again.
        kept = sum(path.stat().st_size for path in state.glob("sync/*/staging/objects/**/*") if path.is_file())
        assert 0 < kept < len(files) << 20

        proxy.set_budget(None)
        resumed = asyncio.run(_sync(url, via.env, state))
    assert tree(resumed.repository) == files
    assert resumed.bytes_transferred == (len(files) << 20) - kept


async def _sync(url: str, env: dict[str, str], state: Path) -> SyncResult:
    source = open_repository(url, env)
    try:
        return await sync_once(source, state)
    finally:
        await source.close()


def test_other_commands_load_no_sync_client() -> None:
    probe = (
        "import sys\n"
        "from edged.cli import main\n"
        "main(['version'])\n"
        "loaded = sorted(m for m in ('obstore', 'gcloud.aio.storage', 'aiohttp', 'edged.sync') if m in sys.modules)\n"
        "print(loaded)\n"
    )
    done = subprocess.run(
        [sys.executable, "-c", probe], capture_output=True, text=True, cwd=REPO_ROOT, timeout=60, check=True
    )
    assert done.stdout.splitlines() == [f"edged {edged.__version__}", "[]"], done.stdout + done.stderr
