"""Over-the-air sync of model repositories from S3, GCS and Azure Blob Storage: local-first snapshots, verified,
switched atomically, held on probation and rolled back model by model.

The modules
    sources.py    Triton's repository URLs (``s3://bucket/prefix``, ``s3://host:port/bucket/prefix``,
                  ``s3://https://host:port/...``, ``gs://bucket/prefix``, ``as://account/container/prefix``) and
                  the ``RemoteRepository`` a sync needs (list, read from an offset, write, delete);
                  ``open_repository`` picks the client. Failures are
                  ``SyncError`` with a ``SourceProblem`` an operator can act on (unreachable, denied, wrong region,
                  not found, changed, refused, verification failed, untrusted, no space, credentials).
    s3.py, gcs.py, azure.py  The clients: obstore for S3 and S3-compatible endpoints and for Azure Blob Storage
                  (Azurite too), gcloud-aio-storage for GCS; obstores.py is what the obstore ones share.
    credentials.py  Credentials as Triton reads them (AWS_*, GOOGLE_APPLICATION_CREDENTIALS, the per-path JSON
                  of TRITON_CLOUD_CREDENTIAL_PATH) and systemd's ``$CREDENTIALS_DIRECTORY``; temporary S3
                  credentials (web identity, container, instance metadata) are left to the client, which refreshes
                  them.
    proxies.py    The proxy for an endpoint, from HTTPS_PROXY / HTTP_PROXY / ALL_PROXY and NO_PROXY as curl reads
                  them.
    plan.py       Pure: which keys may become paths (``key_problem``: the folder-entry rule of edged.core.names),
                  ``check_listing`` (one bad key refuses the revision), ``plan_delta`` (by digest and size).
    download.py   ``fetch``: a resumable, verified download into staging (Range from the partial file's end; size,
                  MD5 or signed sha256 checked before use).
    transfer.py   The bandwidth cap (a token bucket shared by a run's downloads) and the progress it reports.
    snapshots.py  ``SnapshotStore``: read-only, hard-linked snapshots under ``<state dir>/sync/<source id>/`` with
                  ``current``, ``previous`` and ``good`` links replaced by rename; mixed snapshots for rollbacks.
    runner.py     ``sync_once``: list (or verify the signed metadata), plan, check free space, download, build,
                  switch; a revision held back (it failed a probation) is not taken again.
    signed.py     ``TufVerifier``: the listing from The Update Framework's metadata in ``<prefix>/.edged/metadata/``,
                  verified by python-tuf's ngclient against a root installed on the device.
    publish.py    ``edged keygen`` and ``edged publish`` (python-tuf's Metadata API).
    probation.py  After a switch: reload the changed models, watch them (ready, no dead process, error rate),
                  report the ones that failed.
    agent.py      The daemon's loop per source (interval with jitter, backoff after failures), rollback of the
                  models that failed their probation, the history, the metrics, the fleet report and the API.
    fleet.py      Channels, the device status objects under ``<repository>/.edged/devices/``, ``edged fleet status``.
    paths.py      Where a remote repository lives on the device (what the configuration needs, without I/O).

Decisions
    - Clients: obstore for S3 (async, Rust, one 16 MB wheel with no Python dependencies, Range reads, conditional
      reads on the ETag, AWS_* variables); gcloud-aio-storage for GCS (async, JSON API, honours
      STORAGE_EMULATOR_HOST and service-account files; about 38 MB with aiohttp and cryptography). obstore also
      speaks GCS, but through the XML API, which the GCS emulator does not serve, so GCS through obstore could not
      be tested against a real endpoint. Together 53 MB installed, against 75 MB for boto3 with
      google-cloud-storage (both blocking), 73 MB for aiobotocore with gcloud-aio-storage, and 114 MB for s3fs
      with gcsfs. Signing adds python-tuf and securesystemslib (about 4.9 MB with urllib3). All sit in the
      ``sync`` extra: a device without remote repositories installs none of it.
    - Change is decided by digest (MD5, ETag or GCS generation; the signed sha256) and size, never by time.
    - One refused key refuses the whole revision: a repository is served complete or not at all.
    - A snapshot is never changed after it is built; unchanged files are hard links to the previous snapshot's,
      so a new revision costs the disk space of what changed. Files are read-only for that reason.
    - The server reads ``<source>/current/repo``: a switch replaces one link, the path never changes, and the
      controller reloads only the models whose folders changed. A device that never synced starts on an empty
      snapshot; a bucket that cannot be reached leaves the last one serving.
    - A source with a trusted root (``--sync-trusted-root``) takes signed revisions only; without one, a bucket is
      synced by object digests, as Triton would read it, and the status says it is unsigned.
    - A failed probation rolls back the models that failed, not the revision: the others keep their new files
      (a mixed snapshot of hard links), and the remote revision is marked bad in the state database.

Known gaps
    - A device syncing while a publish uploads its files may see them fail the sha256 check until the publish's
      timestamp lands (the next run succeeds); rotating the root key itself is not supported by ``edged publish``;
      delegated targets are refused.
    - A model's sequences are waited for after the switch, before its reload: a Python model instance restarted
      in that window reads the new files.
    - A GCS read is not conditional on the listed generation (the MD5 check catches a replaced object, not one
      without an MD5), and a partial download of an unsigned object without an MD5 is trusted by size.
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
