"""Over-the-air sync of a model repository from S3 or GCS into local snapshots (groundwork).

What exists
    sources.py    Triton's repository URLs (``s3://bucket/prefix``, ``s3://host:port/bucket/prefix``,
                  ``s3://https://host:port/...``, ``gs://bucket/prefix``), credentials as Triton reads them (AWS_*,
                  GOOGLE_APPLICATION_CREDENTIALS, STORAGE_EMULATOR_HOST, plus HTTPS_PROXY for S3), and a
                  ``RemoteRepository`` that lists (path, size, digest) and reads one object from an offset.
                  Failures are ``SyncError`` with a ``SourceProblem`` (unreachable, denied, not found, changed,
                  refused, verification failed) so that an operator can tell a wrong key from a dead endpoint.
    plan.py       Pure functions: ``key_problem`` (every component of a remote key must be a valid folder-entry
                  name, the rule of edged.core.names: no ``..``, absolute path, NUL, backslash or control
                  character), ``check_listing`` (refuses the whole listing on one bad key, drops folder markers),
                  ``plan_delta`` (download / keep / remove, by digest and size), ``revision_of``.
    download.py   ``fetch``: stages one object, appending to a partial file with a Range read from its end, then
                  checks size and MD5 (when the store reports one) and records the sha256.
    snapshots.py  ``SnapshotStore``: ``<state dir>/sync/<source id>/`` with ``snapshots/rNNNNNN`` (complete,
                  read-only, with a manifest), ``current`` and ``previous`` links swapped by rename, staging,
                  a lock, garbage collection, ``rollback``.
    runner.py     ``sync_once(source, state_dir, verifier=None) -> SyncResult``: list, plan, download, verify, build,
                  switch.
    signed.py     ``TufVerifier``: a signed source's listing from The Update Framework's metadata in
                  ``<prefix>/.edged/metadata/``, verified by python-tuf's ngclient against a root installed on the
                  device; each file comes with the sha256 and length its download must have, and the revision is
                  ``vN``, the Nth publish. Refusals are ``SourceProblem.UNTRUSTED`` naming the attack (another key,
                  rollback, freeze with its date, mix and match, endless metadata, no metadata at all).
    publish.py    ``edged keygen`` (root and online ed25519 keys) and ``edged publish``: validate a local repository,
                  upload what changed, then sign targets, snapshot and timestamp (root on first publish or with
                  ``--root-key``) with python-tuf's Metadata API, delete what the repository no longer has.
    errors.py     ``SyncError`` and its ``SourceProblem``.

Decisions
    - Clients: obstore for S3 (async, Rust, one 16 MB wheel with no Python dependencies, Range reads, conditional
      reads on the ETag, AWS_* variables); gcloud-aio-storage for GCS (async, JSON API, honours
      STORAGE_EMULATOR_HOST and service-account files; about 38 MB with aiohttp and cryptography, which edged did
      not have). obstore also speaks GCS, but through the XML API, which the GCS emulator does not serve (listing
      answers 501, reads lack Last-Modified), so GCS through obstore could not be tested against a real endpoint.
      Together 53 MB installed, against 75 MB for boto3 with google-cloud-storage (both blocking), 73 MB for
      aiobotocore with gcloud-aio-storage, and 114 MB for s3fs with gcsfs. Both sit in the ``sync`` extra: a
      device without remote repositories installs neither.
    - Change is decided by digest (MD5 where the store reports one, else ETag or GCS generation) and size, never
      by modification time.
    - One refused key refuses the whole revision: a repository is served complete or not at all.
    - A snapshot is never changed after it is built; unchanged files are hard links to the previous snapshot's,
      so a new revision costs the disk space of what changed. Files are read-only for that reason.
    - Staged downloads are named by (path, size, digest): a changed object never resumes an older one's bytes.
    - The remote is read with no lock held on anything the server uses: the current snapshot keeps serving
      whatever the network does.

    - Signed sources: python-tuf 7.0.1 with securesystemslib's crypto extra (ngclient on the device, the Metadata
      API for publishing; about 4.9 MB installed with urllib3, which ngclient imports; cryptography comes with
      gcloud-aio-storage). Target paths are the keys themselves, so a signed bucket is still a plain Triton
      repository; consistent snapshots apply to metadata only. A local file whose sha256 equals a signed one is
      kept, so signing an unsigned source or re-signing downloads nothing again. A source without a verifier is
      synced by object digests, which the operator must allow.

Next steps
    - Signed sources, known gaps: a device syncing while a publish uploads its files may see them fail the
      sha256 check until the publish's timestamp lands (the next run succeeds; hash-prefixed target objects would
      close that, at the cost of the plain layout); rotating the root key itself (not the online key) is not
      supported by ``edged publish``; an upload reads each file whole into memory; delegated targets are refused.
    - Probation and automatic rollback: after ``switch``, reload only the changed models, run warm-up, watch them,
      then commit last-known-good in the state store; ``SnapshotStore.rollback`` is the mechanism.
    - Wiring: ``--model-repository s3://...`` resolves to ``current/repo`` at start (local-first: the last snapshot
      serves when the remote is unreachable), a periodic loop with jitter and backoff, ``edged sync
      status|now|pause|resume``, sync runs in the history API, Prometheus metrics (runs, failures, bytes, rate,
      last success, revision), a rate cap and a free-disk check before downloading, parallel downloads.
    - Credentials: TRITON_CLOUD_CREDENTIAL_PATH per-path credentials, systemd ``$CREDENTIALS_DIRECTORY``, web
      identity and instance-metadata credentials (obstore supports them through its config keys).
    - Fleet status objects written back to the bucket, and ``edged fleet status``.
    - Known gaps of this slice: a GCS read is not conditional on the listed generation (the MD5 check catches a
      replaced object, not one without an MD5), a stalled GCS body is bounded only by aiohttp's defaults, a partial
      download of an object without an MD5 is trusted by size until TUF gives its sha256, and HTTPS_PROXY is passed
      to the S3 client only.
"""

from __future__ import annotations

from edged.sync.errors import SourceProblem, SyncError
from edged.sync.plan import LocalEntry, Plan, RemoteEntry, check_listing, key_problem, plan_delta
from edged.sync.runner import METADATA_DIR, Listing, SyncResult, Verifier, sync_once, unsigned_listing
from edged.sync.snapshots import Snapshot, SnapshotStore
from edged.sync.sources import ClientOptions, RemoteRepository, SourceURL, open_repository, parse_repository_url

__all__ = [
    "METADATA_DIR",
    "Listing",
    "Verifier",
    "unsigned_listing",
    "ClientOptions",
    "LocalEntry",
    "Plan",
    "RemoteEntry",
    "RemoteRepository",
    "Snapshot",
    "SnapshotStore",
    "SourceProblem",
    "SourceURL",
    "SyncError",
    "SyncResult",
    "check_listing",
    "key_problem",
    "open_repository",
    "parse_repository_url",
    "plan_delta",
    "sync_once",
]
