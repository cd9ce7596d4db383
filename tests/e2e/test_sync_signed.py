"""Signed repositories end to end: `edged publish` signs and uploads a repository to a real S3 endpoint (moto's
server; the GCS emulator for the happy path and one attack), a device syncs it through TufVerifier, and every attack
The Update Framework names is refused with the snapshot that was serving still serving."""

from __future__ import annotations

import asyncio
import itertools
import os
import subprocess
import sys
from collections.abc import Iterator
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Final, Protocol

import pytest
from objectstores import S3Bucket, gcs_emulator, gcs_upload, moto_server, tree, write_repository
from securesystemslib.signer import CryptoSigner
from synccases import serving
from tuf.api.metadata import Metadata

from edged.sync import SourceProblem, SyncError, SyncResult, open_repository, sync_once
from edged.sync.paths import source_id
from edged.sync.publish import Published, PublishError, generate_keys, publish
from edged.sync.signed import METADATA_PREFIX, TufVerifier

CREDENTIALS: Final = {"AWS_ACCESS_KEY_ID": "edged-test", "AWS_SECRET_ACCESS_KEY": "edged-secret"}
GCS_BUCKET: Final = "signed"
MODEL: Final = "add_sub/1/model.onnx"
CONFIG: Final = "add_sub/config.pbtxt"
_names = itertools.count()


class Bucket(Protocol):
    def put(self, key: str, data: bytes) -> None: ...

    def get(self, key: str) -> bytes: ...


class GCSBucket:
    def __init__(self, port: int) -> None:
        self.port = port

    def put(self, key: str, data: bytes) -> None:
        gcs_upload(self.port, GCS_BUCKET, key, data)

    def get(self, key: str) -> bytes:
        raise NotImplementedError("not needed by the GCS cases")


@dataclass
class Signed:
    """A repository published to ``url`` with the keys in ``keys``, and a device (``state``) that trusts its root."""

    bucket: Bucket
    prefix: str
    url: str
    env: dict[str, str]
    tmp: Path
    files: dict[str, bytes] = field(default_factory=dict)

    @property
    def local(self) -> Path:
        return self.tmp / "published"

    @property
    def keys(self) -> Path:
        return self.tmp / "keys"

    @property
    def root_json(self) -> Path:
        return self.tmp / "root.json"

    @property
    def state(self) -> Path:
        return self.tmp / "state"

    def key(self, name: str) -> bytes:
        return self.bucket.get(f"{self.prefix}/{name}")

    def put(self, name: str, data: bytes) -> None:
        self.bucket.put(f"{self.prefix}/{name}", data)

    def publish(
        self, *, root_key: bool = False, expires: datetime | None = None, online: Path | None = None
    ) -> Published:
        async def run() -> Published:
            remote = open_repository(self.url, self.env)
            try:
                return await publish(
                    self.local,
                    remote,
                    online or self.keys / "online.pem",
                    root_key=self.keys / "root.pem" if root_key else None,
                    expires=expires,
                    root_out=self.root_json,
                    check=None,
                )
            finally:
                await remote.close()

        return asyncio.run(run())

    def sync(self, *, signed: bool = True) -> SyncResult:
        async def run() -> SyncResult:
            source = open_repository(self.url, self.env)
            verifier = TufVerifier(self.root_json, self.state / "sync" / source_id(source.url) / "tuf")
            try:
                return await sync_once(source, self.state, verifier if signed else None)
            finally:
                await source.close()

        return asyncio.run(run())

    def refused(self, problem: SourceProblem, *words: str) -> SyncError:
        """A sync that must fail with ``problem`` and a message naming ``words``, the current snapshot serving."""
        before = tree(serving(self.state))
        with pytest.raises(SyncError) as refused:
            self.sync()
        assert refused.value.problem is problem, refused.value
        for word in words:
            assert word in str(refused.value), refused.value
        assert tree(serving(self.state)) == before
        return refused.value

    def change(self, key: str, data: bytes) -> None:
        (self.local / key).write_bytes(data)
        self.files[key] = data


def first_publish(bucket: Bucket, prefix: str, url: str, env: dict[str, str], tmp: Path) -> tuple[Signed, SyncResult]:
    signed = Signed(bucket, prefix, url, env, tmp)
    signed.files = write_repository(signed.local)
    generate_keys(signed.keys)
    published = signed.publish(root_key=True)
    assert published.revision == "v1" and sorted(published.uploaded) == sorted(signed.files)
    first = signed.sync()
    assert first.revision == "v1" and sorted(first.downloaded) == sorted(signed.files)
    assert tree(first.repository) == signed.files
    return signed, first


@pytest.fixture(scope="module")
def moto_port() -> Iterator[int]:
    with moto_server() as port:
        yield port


@pytest.fixture
def s3(moto_port: int, tmp_path: Path) -> tuple[Signed, SyncResult]:
    bucket = S3Bucket(f"127.0.0.1:{moto_port}", f"signed-{next(_names)}", CREDENTIALS)
    url = f"s3://127.0.0.1:{moto_port}/{bucket.name}/repository"
    return first_publish(bucket, "repository", url, dict(CREDENTIALS), tmp_path)


def test_a_changed_publish_moves_only_the_changed_file(s3: tuple[Signed, SyncResult]) -> None:
    signed, _ = s3
    changed = signed.files[CONFIG] + b"\n# retuned\n"
    signed.change(CONFIG, changed)
    gone = sorted(k for k in signed.files if k.startswith("add_sub_int32/"))
    for key in gone:
        (signed.local / key).unlink()
        del signed.files[key]
    published = signed.publish()
    assert published.revision == "v2" and published.uploaded == (CONFIG,) and published.deleted == tuple(gone)
    assert isinstance(signed.bucket, S3Bucket)
    assert not any(k.startswith("repository/add_sub_int32/") for k in signed.bucket.names())

    second = signed.sync()
    assert second.revision == "v2" and second.previous_revision == "v1"
    assert second.downloaded == (CONFIG,) and second.bytes_transferred == len(changed)
    assert second.linked == (MODEL,) and second.removed == tuple(gone)
    assert tree(serving(signed.state)) == signed.files
    # A publish without changes re-signs (a new expiry) and moves nothing.
    assert signed.publish().uploaded == ()
    assert signed.sync().bytes_transferred == 0


def test_a_tampered_file_is_refused(s3: tuple[Signed, SyncResult]) -> None:
    signed, _ = s3
    weights = os.urandom(1 << 20)
    signed.change("add_sub/1/weights.bin", weights)
    signed.publish()
    signed.put("add_sub/1/weights.bin", os.urandom(len(weights)))  # same length, other bytes; metadata unchanged
    signed.refused(SourceProblem.VERIFY_FAILED, "add_sub/1/weights.bin", "sha256", "tampered")
    assert not list(signed.state.rglob("*.part"))


def test_an_endless_file_stops_at_its_signed_length(s3: tuple[Signed, SyncResult]) -> None:
    signed, _ = s3
    signed.change(CONFIG, signed.files[CONFIG] + b"\n# retuned\n")
    signed.publish()
    signed.put(CONFIG, signed.files[CONFIG] + os.urandom(4 << 20))
    signed.refused(SourceProblem.VERIFY_FAILED, CONFIG, f"longer than its {len(signed.files[CONFIG])} bytes")
    assert all(p.stat().st_size <= len(signed.files[CONFIG]) for p in signed.state.rglob("*.part"))


def test_metadata_signed_by_another_key_is_refused(s3: tuple[Signed, SyncResult]) -> None:
    signed, _ = s3
    forged = Metadata.from_bytes(signed.key(f"{METADATA_PREFIX}/timestamp.json"))
    forged.signed.version += 1
    forged.signatures.clear()
    forged.sign(CryptoSigner.generate_ed25519())
    signed.put(f"{METADATA_PREFIX}/timestamp.json", forged.to_bytes())
    signed.refused(SourceProblem.UNTRUSTED, "signed by a key the root does not trust")


def test_the_publisher_refuses_an_untrusted_online_key(s3: tuple[Signed, SyncResult]) -> None:
    signed, _ = s3
    generate_keys(signed.tmp / "other")
    with pytest.raises(PublishError, match="online key is not trusted by root version 1"):
        signed.publish(online=signed.tmp / "other" / "online.pem")


def test_replayed_older_metadata_is_a_rollback(s3: tuple[Signed, SyncResult]) -> None:
    signed, _ = s3
    old_timestamp = signed.key(f"{METADATA_PREFIX}/timestamp.json")
    signed.change(CONFIG, signed.files[CONFIG] + b"\n# v2\n")
    signed.publish()
    assert signed.sync().revision == "v2"
    signed.put(f"{METADATA_PREFIX}/timestamp.json", old_timestamp)
    signed.refused(SourceProblem.UNTRUSTED, "rollback", "older than the version this device trusts")


def test_expired_metadata_is_a_freeze(s3: tuple[Signed, SyncResult]) -> None:
    signed, _ = s3
    signed.change(CONFIG, signed.files[CONFIG] + b"\n# never served\n")
    expired = datetime.now(UTC).replace(microsecond=0) - timedelta(hours=1)
    signed.publish(expires=expired)
    signed.refused(SourceProblem.UNTRUSTED, "expired", "freeze", f"timestamp expired on {expired.isoformat()}")


def test_a_mix_of_snapshots_is_refused(s3: tuple[Signed, SyncResult]) -> None:
    signed, _ = s3
    first_targets = signed.key(f"{METADATA_PREFIX}/1.targets.json")
    signed.change(CONFIG, signed.files[CONFIG] + b"\n# v2\n")
    signed.publish()
    signed.put(f"{METADATA_PREFIX}/2.targets.json", first_targets)
    signed.refused(SourceProblem.UNTRUSTED, "mix and match", "Expected targets v2, got v1")


def test_endless_metadata_is_refused(s3: tuple[Signed, SyncResult]) -> None:
    signed, _ = s3
    signed.put(f"{METADATA_PREFIX}/timestamp.json", b"{" + b" " * (4 << 20))
    signed.refused(SourceProblem.UNTRUSTED, "endless data", "timestamp.json is longer than allowed")


def test_online_key_rotation_reaches_the_device(s3: tuple[Signed, SyncResult]) -> None:
    signed, _ = s3
    (signed.keys / "online.pem").unlink()
    (signed.keys / "root.pem").rename(signed.tmp / "root.pem")
    generate_keys(signed.keys)
    (signed.tmp / "root.pem").replace(signed.keys / "root.pem")
    signed.change(CONFIG, signed.files[CONFIG] + b"\n# new key\n")
    device_root = signed.root_json.read_bytes()
    published = signed.publish(root_key=True)
    assert published.root_version == 2
    signed.root_json.write_bytes(device_root)  # the device still has root version 1 installed
    assert signed.sync().revision == "v2"
    assert tree(serving(signed.state)) == signed.files


def test_an_unsigned_bucket_is_refused_when_a_root_is_configured(moto_port: int, tmp_path: Path) -> None:
    bucket = S3Bucket(f"127.0.0.1:{moto_port}", f"plain-{next(_names)}", CREDENTIALS)
    files = write_repository(tmp_path / "plain")
    for key, data in files.items():
        bucket.put(f"repository/{key}", data)
    signed = Signed(bucket, "repository", f"s3://127.0.0.1:{moto_port}/{bucket.name}/repository", CREDENTIALS, tmp_path)
    generate_keys(signed.keys)
    unsigned = signed.sync(signed=False)  # allowed only when the operator says so: synced by object digests
    assert tree(unsigned.repository) == files

    (tmp_path / "other").mkdir()
    other = Signed(bucket, "other", f"s3://127.0.0.1:{moto_port}/{bucket.name}/other", CREDENTIALS, tmp_path / "other")
    other.files = write_repository(other.local)
    generate_keys(other.keys)
    other.publish(root_key=True)
    signed.root_json.write_bytes(other.root_json.read_bytes())
    signed.refused(SourceProblem.UNTRUSTED, "no signed metadata", "timestamp.json is missing")

    # Signing the same files later downloads nothing again: the recorded sha256 equals the signed one.
    signed.files = files
    (tmp_path / "plain").rename(tmp_path / "published")
    signed.publish(root_key=True)
    resigned = signed.sync()
    assert resigned.bytes_transferred == 0 and resigned.downloaded == ()
    assert tree(serving(signed.state)) == files


def test_publish_from_the_command_line(moto_port: int, tmp_path: Path) -> None:
    bucket = S3Bucket(f"127.0.0.1:{moto_port}", f"cli-{next(_names)}", CREDENTIALS)
    url = f"s3://127.0.0.1:{moto_port}/{bucket.name}/repository"
    files = write_repository(tmp_path / "published")
    env = os.environ | CREDENTIALS
    root = Path(__file__).parents[2]

    def edged(*args: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run(
            [sys.executable, "-m", "edged", *args],
            env=env,
            cwd=root,
            capture_output=True,
            text=True,
            timeout=60,
            check=False,
        )

    made = edged("keygen", str(tmp_path / "keys"))
    assert made.returncode == 0, made.stderr
    assert (tmp_path / "keys" / "root.pem").stat().st_mode & 0o777 == 0o600
    assert edged("keygen", str(tmp_path / "keys")).returncode == 1  # never overwrites a key

    without_root = edged("publish", str(tmp_path / "published"), url, "--key", str(tmp_path / "keys" / "online.pem"))
    assert without_root.returncode == 1 and "--root-key" in without_root.stderr

    done = edged(
        "publish", str(tmp_path / "published"), url, "--key", str(tmp_path / "keys" / "online.pem"),
        "--root-key", str(tmp_path / "keys" / "root.pem"), "--expires", "7d",
    )  # fmt: skip
    assert done.returncode == 0, done.stderr
    assert "as v1" in done.stdout and str(tmp_path / "keys" / "root.json") in done.stdout

    device = Signed(bucket, "repository", url, CREDENTIALS, tmp_path)
    (tmp_path / "keys" / "root.json").rename(device.root_json)
    assert tree(device.sync().repository) == files

    broken = tmp_path / "broken"
    write_repository(broken)
    (broken / "add_sub" / "config.pbtxt").write_text("not a model configuration {")
    refused = edged("publish", str(broken), url, "--key", str(tmp_path / "keys" / "online.pem"))
    assert refused.returncode == 1 and "does not validate" in refused.stderr

    script = "import sys; from edged.cli import main; main(['version']); print('tuf' in sys.modules)"
    version = subprocess.run([sys.executable, "-c", script], cwd=root, capture_output=True, text=True, check=True)
    assert version.stdout.splitlines()[-1] == "False"


@pytest.fixture(scope="module")
def gcs_port() -> Iterator[int]:
    with gcs_emulator(GCS_BUCKET) as port:
        yield port


def test_gcs_publish_sync_and_a_tampered_file(gcs_port: int, tmp_path: Path) -> None:
    prefix = f"repository-{next(_names)}"
    env = {"STORAGE_EMULATOR_HOST": f"http://127.0.0.1:{gcs_port}"}
    signed, _ = first_publish(GCSBucket(gcs_port), prefix, f"gs://{GCS_BUCKET}/{prefix}", env, tmp_path)
    signed.change(CONFIG, signed.files[CONFIG] + b"\n# retuned\n")
    signed.publish()
    signed.put(CONFIG, bytes(len(signed.files[CONFIG])))
    signed.refused(SourceProblem.VERIFY_FAILED, CONFIG, "sha256")
    signed.put(CONFIG, signed.files[CONFIG])
    assert signed.sync().revision == "v2" and tree(serving(signed.state)) == signed.files


def test_a_missing_bucket_is_not_a_missing_signature(moto_port: int, tmp_path: Path) -> None:
    bucket = S3Bucket(f"127.0.0.1:{moto_port}", f"gone-{next(_names)}", CREDENTIALS)
    signed, _ = first_publish(
        bucket, "repository", f"s3://127.0.0.1:{moto_port}/{bucket.name}/repository", CREDENTIALS, tmp_path
    )
    signed.url = f"s3://127.0.0.1:{moto_port}/no-such-bucket/repository"
    with pytest.raises(SyncError) as missing:
        signed.sync()
    assert missing.value.problem is SourceProblem.NOT_FOUND, missing.value
