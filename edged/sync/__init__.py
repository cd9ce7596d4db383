"""Over-the-air sync of a model repository from S3 or GCS into local snapshots (groundwork).

What exists
    sources.py    Triton's repository URLs (``s3://bucket/prefix``, ``s3://host:port/bucket/prefix``,
                  ``s3://https://host:port/...``, ``gs://bucket/prefix``), the endpoint variables, and a
                  ``RemoteRepository`` that lists (path, size, digest) and reads one object from an offset.
                  Failures are ``SyncError`` with a ``SourceProblem`` (unreachable, denied, not found, changed,
                  refused, verification failed) so that an operator can tell a wrong key from a dead endpoint.
    credentials.py  Credentials as Triton reads them (AWS_*, GOOGLE_APPLICATION_CREDENTIALS, the per-path JSON
                  of TRITON_CLOUD_CREDENTIAL_PATH) and systemd's ``$CREDENTIALS_DIRECTORY``; temporary S3
                  credentials (web identity, container, instance metadata) are left to the client, which refreshes them.
    proxies.py    The proxy for an endpoint, from HTTPS_PROXY / HTTP_PROXY / ALL_PROXY and NO_PROXY as curl reads them.
    plan.py       Pure functions: ``key_problem`` (every component of a remote key must be a valid folder-entry
                  name, the rule of edged.core.names: no ``..``, absolute path, NUL, backslash or control
                  character), ``check_listing`` (refuses the whole listing on one bad key, drops folder markers),
                  ``plan_delta`` (download / keep / remove, by digest and size), ``revision_of``.
    download.py   ``fetch``: stages one object, appending to a partial file with a Range read from its end, then
                  checks size and MD5 (when the store reports one) and records the sha256.
    snapshots.py  ``SnapshotStore``: ``<state dir>/sync/<source id>/`` with ``snapshots/rNNNNNN`` (complete,
                  read-only, with a manifest), ``current`` and ``previous`` links swapped by rename, staging,
                  a lock, garbage collection, ``rollback``.
    runner.py     ``sync_once(source, state_dir) -> SyncResult``: list, plan, download, verify, build, switch.
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

Next steps
    - Signed repositories with python-tuf (ngclient on the device): targets metadata gives sha256 and length for
      every file, replacing the MD5 / ETag check, and closes rollback, freeze, mix-and-match and endless-data
      attacks; ``edged publish`` with the Metadata API.
    - Probation and automatic rollback: after ``switch``, reload only the changed models, run warm-up, watch them,
      then commit last-known-good in the state store; ``SnapshotStore.rollback`` is the mechanism.
    - Wiring: ``--model-repository s3://...`` resolves to ``current/repo`` at start (local-first: the last snapshot
      serves when the remote is unreachable), a periodic loop with jitter and backoff, ``edged sync
      status|now|pause|resume``, sync runs in the history API, Prometheus metrics (runs, failures, bytes, rate,
      last success, revision), a rate cap and a free-disk check before downloading, parallel downloads.
    - Fleet status objects written back to the bucket, and ``edged fleet status``.
    - Known gaps of this slice: a GCS read is not conditional on the listed generation (the MD5 check catches a
      replaced object, not one without an MD5), and a partial download of an object without an MD5 is trusted by
      size until TUF gives its sha256.
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
