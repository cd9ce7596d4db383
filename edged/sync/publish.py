"""Publishing a signed repository: a local Triton repository uploaded to a bucket with The Update Framework's
metadata, signed with python-tuf's Metadata API.

Keys (``edged keygen DIR``): ``root.pem`` signs the root metadata, which names the keys devices trust; it is used
on the first publish and to rotate the online key, and belongs offline the rest of the time. ``online.pem`` signs
targets, snapshot and timestamp on every publish. Both are ed25519 private keys in PEM (PKCS#8), mode 0600.

A publish: validate the local repository, read the bucket's current metadata to continue its version numbers,
upload the files whose sha256 or size changed, then the root (first publish, or re-signed with ``--root-key``),
``N.targets.json``, ``N.snapshot.json`` and last ``timestamp.json``, which makes the new version visible; then
delete the objects the repository no longer has. Every publish bumps targets, snapshot and timestamp together, so
the revision devices report, ``vN``, is the Nth publish. The root devices must trust is written to a local file.
"""

from __future__ import annotations

import asyncio
import os
import re
import sys
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import TYPE_CHECKING, Final

from edged.core.names import printable
from edged.sync.errors import SyncError
from edged.sync.plan import RemoteEntry, key_problem
from edged.sync.runner import METADATA_DIR
from edged.sync.signed import METADATA_PREFIX

if TYPE_CHECKING:
    from securesystemslib.signer import CryptoSigner
    from tuf.api.metadata import Metadata, Root, TargetFile

    from edged.sync.sources import RemoteRepository

ROOT_KEY: Final = "root.pem"
ONLINE_KEY: Final = "online.pem"
# Roles the online key signs; the root key signs only the root.
ONLINE_ROLES: Final = ("targets", "snapshot", "timestamp")
DEFAULT_EXPIRES: Final = timedelta(days=30)
DEFAULT_ROOT_EXPIRES: Final = timedelta(days=365)
# The most a metadata file read back from the bucket may hold (ngclient's own limit for targets).
MAX_METADATA_BYTES: Final = 5_000_000
_VERSIONED: Final = re.compile(r"(\d+)\.(root|snapshot|targets)\.json")


class PublishError(Exception):
    """A publish refused or failed; what is in the bucket still verifies (metadata is written last)."""


@dataclass(frozen=True)
class Published:
    """What a publish did."""

    url: str
    revision: str
    uploaded: tuple[str, ...]
    unchanged: tuple[str, ...]
    deleted: tuple[str, ...]
    root_version: int
    root_written: Path


def generate_keys(directory: Path) -> tuple[Path, Path]:
    """Write a new root key and online key into ``directory``; never overwrites a key."""
    from securesystemslib.signer import CryptoSigner

    directory.mkdir(parents=True, exist_ok=True)
    paths = (directory / ROOT_KEY, directory / ONLINE_KEY)
    for path in paths:
        if path.exists():
            raise PublishError(f"{path} exists: keys are never overwritten")
    for path in paths:
        pem = CryptoSigner.generate_ed25519().private_bytes
        # Created with its final mode: a private key is never readable by others, not even for an instant.
        descriptor = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
        with os.fdopen(descriptor, "wb") as out:
            out.write(pem)
    return paths


def load_key(path: Path) -> CryptoSigner:
    """A signer for the private key in PEM at ``path``."""
    from cryptography.hazmat.primitives.serialization import load_pem_private_key
    from securesystemslib.signer import CryptoSigner

    try:
        return CryptoSigner(load_pem_private_key(path.read_bytes(), None))
    except (OSError, ValueError, TypeError) as exc:
        raise PublishError(f"{path}: not a usable private key ({exc})") from exc


def local_files(local: Path) -> dict[str, Path]:
    """The repository's files by key; refuses what devices would refuse (plan.key_problem) and links."""
    files: dict[str, Path] = {}
    for directory, folders, names in os.walk(local):
        folders.sort()
        for name in sorted(names) + [f for f in folders if Path(directory, f).is_symlink()]:
            path = Path(directory, name)
            key = path.relative_to(local).as_posix()
            if key == METADATA_DIR or key.startswith(f"{METADATA_DIR}/"):
                raise PublishError(f"{path}: {METADATA_DIR}/ is reserved for the signed metadata")
            problem = key_problem(key)
            if problem is not None:
                raise PublishError(f"'{printable(key)}' cannot be published: {problem}")
            if path.is_symlink() or not path.is_file():
                raise PublishError(f"'{printable(key)}' is a link or not a regular file: publish a plain copy")
            files[key] = path
    return files


async def publish(
    local: Path,
    remote: RemoteRepository,
    online_key: Path,
    *,
    root_key: Path | None = None,
    expires: datetime | None = None,
    root_expires: datetime | None = None,
    root_out: Path,
    check: Callable[[Path], list[str]] | None = None,
) -> Published:
    """Sign ``local`` and upload it to ``remote`` (see the module's docstring). ``expires``: of targets, snapshot
    and timestamp (default 30 days); ``root_expires``: of a root signed now (default 365 days)."""
    from tuf.api.metadata import Metadata, MetaFile, Snapshot, TargetFile, Targets, Timestamp

    now = datetime.now(UTC).replace(microsecond=0)
    expires = expires or now + DEFAULT_EXPIRES
    if check is not None:
        # The offline validator of ``edged check-repo``, given by the caller: publishing knows no backend.
        problems = await asyncio.to_thread(check, local)
        if problems:
            raise PublishError(f"{local} does not validate:\n  " + "\n  ".join(problems))
    files = local_files(local)
    online = load_key(online_key)
    root_signer = load_key(root_key) if root_key is not None else None

    listing = {entry.path: entry for entry in await remote.list()}
    current = await _current(remote, listing)
    root_until = root_expires or now + DEFAULT_ROOT_EXPIRES
    root, root_changed = _next_root(remote.url, current, online, root_signer, root_until)
    version = current.version + 1

    targets: dict[str, TargetFile] = {}
    upload: list[str] = []
    for key, path in files.items():
        target = await asyncio.to_thread(TargetFile.from_file, key, str(path), ["sha256"])
        targets[key] = target
        before = current.targets.get(key)
        listed = listing.get(key)
        if before is None or before != target or listed is None or listed.size != target.length:
            upload.append(key)
    for key in upload:
        # Whole files in memory: RemoteRepository.write takes bytes (a streamed upload is a known gap).
        await remote.write(key, await asyncio.to_thread(files[key].read_bytes))

    signed_targets = Metadata(Targets(version=version, expires=expires, targets=targets))
    snapshot = Metadata(Snapshot(version=version, expires=expires, meta={"targets.json": MetaFile(version)}))
    timestamp = Metadata(Timestamp(version=version, expires=expires, snapshot_meta=MetaFile(version)))
    for metadata in (signed_targets, snapshot, timestamp):
        metadata.sign(online)
    if root_changed:
        await remote.write(f"{METADATA_PREFIX}/{root.signed.version}.root.json", root.to_bytes())
    await remote.write(f"{METADATA_PREFIX}/{version}.targets.json", signed_targets.to_bytes())
    await remote.write(f"{METADATA_PREFIX}/{version}.snapshot.json", snapshot.to_bytes())
    await remote.write(f"{METADATA_PREFIX}/timestamp.json", timestamp.to_bytes())

    # Only now: devices still on the previous version read its files until the timestamp above moved them on.
    deleted = sorted(
        key for key in listing if key not in files and not (key == METADATA_DIR or key.startswith(f"{METADATA_DIR}/"))
    )
    for key in deleted:
        await remote.delete(key)

    root_out.parent.mkdir(parents=True, exist_ok=True)
    root_out.write_bytes(root.to_bytes())
    return Published(
        url=remote.url,
        revision=f"v{version}",
        uploaded=tuple(upload),
        unchanged=tuple(key for key in files if key not in upload),
        deleted=tuple(deleted),
        root_version=root.signed.version,
        root_written=root_out,
    )


@dataclass(frozen=True)
class _Current:
    """The bucket's signed state: its newest root (None before the first publish), the highest metadata version
    in use, and the targets of the newest version when they verify against that root."""

    root: Metadata[Root] | None
    version: int
    targets: Mapping[str, TargetFile]


async def _current(remote: RemoteRepository, listing: Mapping[str, RemoteEntry]) -> _Current:
    from tuf.api.metadata import Metadata, Root, Targets

    versions: dict[str, list[int]] = {"root": [], "snapshot": [], "targets": []}
    for key in listing:
        if key.startswith(f"{METADATA_PREFIX}/"):
            match = _VERSIONED.fullmatch(key.removeprefix(f"{METADATA_PREFIX}/"))
            if match:
                versions[match[2]].append(int(match[1]))
    if not versions["root"]:
        if versions["snapshot"] or versions["targets"]:
            raise PublishError(f"{remote.url}: metadata without a root: not a repository edged published")
        return _Current(None, 0, {})
    root_version = max(versions["root"])
    try:
        root = Metadata[Root].from_bytes(await _read(remote, f"{METADATA_PREFIX}/{root_version}.root.json"))
        root.verify_delegate(Root.type, root)
    except Exception as exc:
        raise PublishError(f"{remote.url}: root version {root_version} does not verify: {exc}") from exc
    # The next version follows every one in the bucket, whatever the timestamp says: never one devices have seen.
    version = max(versions["snapshot"] + versions["targets"], default=0)
    targets: Mapping[str, TargetFile] = {}
    if version in versions["targets"]:
        try:
            previous = Metadata[Targets].from_bytes(await _read(remote, f"{METADATA_PREFIX}/{version}.targets.json"))
            root.verify_delegate(Targets.type, previous)
            targets = previous.signed.targets
        except Exception:
            # Unverified targets are no reason to skip an upload: every file goes up again.
            targets = {}
    return _Current(root, version, targets)


def _next_root(
    url: str, current: _Current, online: CryptoSigner, root_signer: CryptoSigner | None, root_expires: datetime
) -> tuple[Metadata[Root], bool]:
    """The root this publish stands on, and whether it is new (to be uploaded): the first one, or the current one
    re-signed as the next version with ``online`` as the online key when a root key is given."""
    from tuf.api.metadata import Metadata, Root

    if current.root is None:
        if root_signer is None:
            raise PublishError(f"{url} has no signed metadata yet: the first publish needs --root-key")
        root = Metadata(Root(expires=root_expires, consistent_snapshot=True))
        root.signed.add_key(root_signer.public_key, Root.type)
        for role in ONLINE_ROLES:
            root.signed.add_key(online.public_key, role)
        root.sign(root_signer)
        return root, True
    trusted = current.root
    if root_signer is None:
        for role in ONLINE_ROLES:
            if online.public_key.keyid not in trusted.signed.roles[role].keyids:
                raise PublishError(
                    f"{url}: the online key is not trusted by root version {trusted.signed.version}; "
                    "re-sign the root with --root-key to make it the online key"
                )
        return trusted, False
    if root_signer.public_key.keyid not in trusted.signed.roles[Root.type].keyids:
        raise PublishError(f"{url}: --root-key is not the key of root version {trusted.signed.version}")
    root = Metadata[Root].from_bytes(trusted.to_bytes())
    root.signatures.clear()
    root.signed.version += 1
    root.signed.expires = root_expires
    for role in ONLINE_ROLES:
        for keyid in list(root.signed.roles[role].keyids):
            root.signed.revoke_key(keyid, role)
        root.signed.add_key(online.public_key, role)
    root.sign(root_signer)
    return root, True


async def _read(remote: RemoteRepository, key: str) -> bytes:
    data = bytearray()
    async for chunk in remote.read(RemoteEntry(key, 0, "", None), 0):
        data += chunk
        if len(data) > MAX_METADATA_BYTES:
            raise PublishError(f"{remote.url}/{key} is longer than {MAX_METADATA_BYTES} bytes")
    return bytes(data)


# --- edged keygen / edged publish -------------------------------------------------------------------------------


def keygen_command(directory: Path) -> int:
    """``edged keygen DIR``."""
    try:
        root, online = generate_keys(directory)
    except (PublishError, OSError) as error:
        print(f"edged: {error}", file=sys.stderr)
        return 1
    print(f"root key:   {root}  (signs the root metadata; keep it offline)")
    print(f"online key: {online}  (signs every publish)")
    return 0


def publish_command(
    local: Path,
    url: str,
    online_key: Path,
    root_key: Path | None,
    expires: datetime | None,
    root_expires: datetime | None,
    root_out: Path | None,
    check: Callable[[Path], list[str]] | None = None,
) -> int:
    """``edged publish LOCAL_REPO URL --key ONLINE_KEY ...``: credentials from the environment, as for sync."""
    from edged.sync.sources import open_repository

    written = root_out or online_key.parent / "root.json"

    async def run() -> Published:
        remote = open_repository(url, os.environ)
        try:
            return await publish(
                local,
                remote,
                online_key,
                root_key=root_key,
                expires=expires,
                root_expires=root_expires,
                root_out=written,
                check=check,
            )
        finally:
            await remote.close()  # waits out the S3 client's runtime threads before the process exits

    try:
        done = asyncio.run(run())
    except (PublishError, SyncError) as error:
        print(f"edged: {error}", file=sys.stderr)
        return 1
    print(
        f"published {local} to {done.url} as {done.revision}: {len(done.uploaded)} files uploaded, "
        f"{len(done.unchanged)} unchanged, {len(done.deleted)} deleted"
    )
    print(f"root version {done.root_version}, for devices to trust: {done.root_written}")
    return 0
