"""``--sync``: edged's repository sync against ``aws s3 sync`` on the same S3 endpoint, in one run.

A moto S3 server (the one the tests use) holds two repositories, uploaded once:

(a) a few models with large random weight files, about 300 MB (``--quick``: about 60 MB);
(b) 1,000 small files (1 to 16 KB) in 20 model folders.

Each tool runs as its own process, as an operator would run it, and the wall time of the whole process is measured
(interpreter start included, for both):

- edged: ``sync_once`` into a fresh state directory: list, download, verify (size, MD5, sha256), build the read-only
  snapshot, switch ``current``;
- aws: ``aws s3 sync s3://... DIR --endpoint-url ...`` (awscli from PyPI, in its own virtualenv
  ``.venv-awscli/``, created on first use: awscli pins an exact botocore that the tests' boto3 may not accept).

Measured, one tool after the other and alternating which goes first: the full download of (a), the full download of
(b), and, with one file of (b) changed (a new size and content), the sync of that change into what each tool
downloaded before. Each figure is the median of several runs. Both tools must end with every file, byte for byte.
Objects are uploaded in one part each, so S3's ETag is their MD5 and edged verifies every byte against it.
"""

from __future__ import annotations

import argparse
import contextlib
import hashlib
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any, Final

from .common import ROOT, Phase
from .results import run_header, save_results

AWSCLI: Final = "awscli==1.46.3"
AWS_VENV: Final = ROOT / ".venv-awscli"
CREDENTIALS: Final = {
    "AWS_ACCESS_KEY_ID": "edged-bench",
    "AWS_SECRET_ACCESS_KEY": "edged-bench-secret",
    "AWS_DEFAULT_REGION": "us-east-1",
}
BUCKET: Final = "bench"
MODELS: Final = 4
SMALL_FILES: Final = 1000
SMALL_FOLDERS: Final = 20

# What the edged process runs: one sync_once, as the daemon's loop will, then its result as JSON.
EDGED_SYNC: Final = """
import asyncio, json, sys, time
from pathlib import Path
from edged.sync import open_repository, sync_once

async def main():
    source = open_repository(sys.argv[1])
    try:
        return await sync_once(source, Path(sys.argv[2]))
    finally:
        await source.close()

result = asyncio.run(main())
print(json.dumps({"seconds": result.seconds, "files": len(result.downloaded), "bytes": result.bytes_transferred}))
# As edged's own commands do: let obstore's threads hand back their last result before the interpreter finalizes.
time.sleep(0.05)
"""


def say(message: str) -> None:
    print(f"[bench] {message}", file=sys.stderr, flush=True)


@dataclass
class Case:
    name: str
    edged_s: list[float] = field(default_factory=list)
    aws_s: list[float] = field(default_factory=list)
    # edged's own figure from inside the process (SyncResult.seconds): what a running daemon would spend.
    edged_inside_s: list[float] = field(default_factory=list)

    @property
    def ratio(self) -> float:
        return statistics.median(self.edged_s) / statistics.median(self.aws_s)


def ensure_awscli() -> Path:
    aws = AWS_VENV / "bin" / "aws"
    if not aws.exists():
        say(f"creating {AWS_VENV.relative_to(ROOT)} with {AWSCLI}")
        subprocess.run([sys.executable, "-m", "venv", "--clear", str(AWS_VENV)], check=True)
        subprocess.run([str(AWS_VENV / "bin" / "pip"), "install", "--quiet", AWSCLI], check=True)
    return aws


def _s3_client(port: int) -> Any:
    import boto3

    return boto3.client(
        "s3",
        endpoint_url=f"http://127.0.0.1:{port}",
        aws_access_key_id=CREDENTIALS["AWS_ACCESS_KEY_ID"],
        aws_secret_access_key=CREDENTIALS["AWS_SECRET_ACCESS_KEY"],
        region_name=CREDENTIALS["AWS_DEFAULT_REGION"],
    )


def large_repository(quick: bool) -> dict[str, bytes]:
    """MODELS models, each a config and one random weight file (random: nothing compresses or deduplicates)."""
    total = (60 if quick else 300) << 20
    files: dict[str, bytes] = {}
    for index in range(MODELS):
        name = f"model_{index}"
        files[f"{name}/config.pbtxt"] = f'name: "{name}"\nbackend: "onnxruntime"\nmax_batch_size: 8\n'.encode()
        files[f"{name}/1/model.onnx"] = os.urandom(total // MODELS)
    return files


def small_repository() -> dict[str, bytes]:
    sizes = [1024 + (index * 7919) % (15 << 10) for index in range(SMALL_FILES)]
    per_folder = SMALL_FILES // SMALL_FOLDERS
    return {
        f"model_{index // per_folder:02d}/1/part_{index % per_folder:03d}.bin": os.urandom(size)
        for index, size in enumerate(sizes)
    }


def upload(port: int, prefix: str, files: dict[str, bytes]) -> None:
    client = _s3_client(port)
    with ThreadPoolExecutor(8) as pool:
        # One part per object (put_object), so that its ETag is its MD5.
        list(pool.map(lambda item: client.put_object(Bucket=BUCKET, Key=f"{prefix}/{item[0]}", Body=item[1]),
                      files.items()))  # fmt: skip


def check_tree(root: Path, files: dict[str, bytes], who: str) -> None:
    """Every file of ``files`` under ``root`` with its bytes, and nothing else."""
    found = {p.relative_to(root).as_posix() for p in root.rglob("*") if p.is_file()}
    if found != set(files):
        raise RuntimeError(f"{who}: {len(found)} files, expected {len(files)}")
    for key, data in files.items():
        if hashlib.sha256((root / key).read_bytes()).digest() != hashlib.sha256(data).digest():
            raise RuntimeError(f"{who}: {key} differs")


def run_edged(url: str, state: Path) -> tuple[float, float, Path]:
    env = {**os.environ, **CREDENTIALS, "PYTHONPATH": str(ROOT)}
    began = time.monotonic()
    done = subprocess.run(
        [sys.executable, "-c", EDGED_SYNC, url, str(state)], env=env, capture_output=True, text=True, check=False
    )
    wall = time.monotonic() - began
    if done.returncode != 0:
        raise RuntimeError(f"edged sync failed ({done.returncode}): {done.stderr[-2000:]}")
    inside = float(json.loads(done.stdout.strip().splitlines()[-1])["seconds"])
    serving = next(state.glob("sync/*/current/repo"))
    return wall, inside, serving


def run_aws(aws: Path, port: int, prefix: str, target: Path) -> float:
    env = {**os.environ, **CREDENTIALS}
    command = [str(aws), "s3", "sync", f"s3://{BUCKET}/{prefix}", str(target), "--endpoint-url",
               f"http://127.0.0.1:{port}", "--only-show-errors", "--no-progress"]  # fmt: skip
    began = time.monotonic()
    done = subprocess.run(command, env=env, capture_output=True, text=True, check=False)
    wall = time.monotonic() - began
    if done.returncode != 0:
        raise RuntimeError(f"aws s3 sync failed ({done.returncode}): {done.stderr[-2000:]}")
    return wall


def _fresh(path: Path) -> Path:
    # edged's snapshot files are read-only, their folders are not: removing them needs no chmod.
    shutil.rmtree(path, ignore_errors=True)
    return path


def measure_full(
    case: Case, runs: int, work: Path, port: int, aws: Path, prefix: str, files: dict[str, bytes]
) -> tuple[Path, Path]:
    """``runs`` full downloads by each tool into empty folders; the folders of the last run are left for a delta."""
    url = f"s3://127.0.0.1:{port}/{BUCKET}/{prefix}"
    state, target = work / f"{prefix}-edged", work / f"{prefix}-aws"
    for run in range(runs):
        # Alternate which tool goes first, so that neither always meets a warmer server.
        for tool in ("edged", "aws") if run % 2 == 0 else ("aws", "edged"):
            if tool == "edged":
                wall, inside, serving = run_edged(url, _fresh(state))
                check_tree(serving, files, "edged")
                case.edged_s.append(wall)
                case.edged_inside_s.append(inside)
            else:
                _fresh(target).mkdir(parents=True)
                case.aws_s.append(run_aws(aws, port, prefix, target))
                check_tree(target, files, "aws")
        say(f"{case.name}: run {run + 1}/{runs}: edged {case.edged_s[-1]:.2f} s, aws {case.aws_s[-1]:.2f} s")
    return state, target


def measure_delta(
    case: Case, runs: int, port: int, aws: Path, prefix: str, files: dict[str, bytes], state: Path, target: Path
) -> None:
    """``runs`` times: change one file of the repository, then sync the change with each tool."""
    url = f"s3://127.0.0.1:{port}/{BUCKET}/{prefix}"
    client = _s3_client(port)
    keys = sorted(files)
    for run in range(runs):
        key = keys[(run * 97) % len(keys)]
        # A new size as well as new bytes: aws s3 sync decides by size and modification time, edged by digest.
        files[key] = os.urandom(len(files[key]) + 1 + run)
        client.put_object(Bucket=BUCKET, Key=f"{prefix}/{key}", Body=files[key])
        for tool in ("edged", "aws") if run % 2 == 0 else ("aws", "edged"):
            if tool == "edged":
                wall, inside, serving = run_edged(url, state)
                check_tree(serving, files, "edged")
                case.edged_s.append(wall)
                case.edged_inside_s.append(inside)
            else:
                case.aws_s.append(run_aws(aws, port, prefix, target))
                check_tree(target, files, "aws")
        say(f"{case.name}: run {run + 1}/{runs}: edged {case.edged_s[-1]:.2f} s, aws {case.aws_s[-1]:.2f} s")


def sync_table(cases: list[Case]) -> str:
    header = ["case", "edged (process)", "edged (in sync_once)", "aws s3 sync", "edged/aws"]
    rows = [
        [
            case.name,
            f"{statistics.median(case.edged_s):.2f} s",
            f"{statistics.median(case.edged_inside_s):.2f} s",
            f"{statistics.median(case.aws_s):.2f} s",
            f"{case.ratio:.2f}",
        ]
        for case in cases
    ]
    widths = [max(len(row[i]) for row in [header, *rows]) for i in range(len(header))]
    lines = ["| " + " | ".join(cell.ljust(w) for cell, w in zip(row, widths, strict=True)) + " |" for row in rows]
    head = "| " + " | ".join(cell.ljust(w) for cell, w in zip(header, widths, strict=True)) + " |"
    rule = "|" + "|".join("-" * (w + 2) for w in widths) + "|"
    return "\n".join([head, rule, *lines])


@contextlib.contextmanager
def _moto() -> Iterator[int]:
    sys.path.insert(0, str(ROOT / "tests"))
    from objectstores import moto_server  # type: ignore[import-not-found, unused-ignore]

    with moto_server() as port:
        yield port


def run(args: argparse.Namespace, argv: list[str] | None) -> int:
    """The ``--sync`` phase; its results go under the ``sync`` key of bench-results.json. It needs no model, server
    or load generator: it brings its own S3 endpoint and client."""
    began = time.monotonic()
    quick = args.quick
    aws = ensure_awscli()
    version = subprocess.run([str(aws), "--version"], capture_output=True, text=True, check=True).stdout.strip()
    full_runs, delta_runs = (1, 3) if quick else (3, 5)
    large, small = large_repository(quick), small_repository()
    large_mb = sum(map(len, large.values())) / (1 << 20)
    with _moto() as port, tempfile.TemporaryDirectory(prefix="edged-bench-sync-") as scratch:
        _s3_client(port).create_bucket(Bucket=BUCKET)
        say(f"moto on port {port}: uploading {large_mb:.0f} MB in {len(large)} files, and {len(small)} small files")
        upload(port, "large", large)
        upload(port, "small", small)
        work = Path(scratch)
        cases = [
            Case(f"full download, {large_mb:.0f} MB in {len(large)} files"),
            Case(f"full download, {len(small)} small files"),
            Case(f"one changed file of {len(small)}"),
        ]
        measure_full(cases[0], full_runs, work, port, aws, "large", large)
        state, target = measure_full(cases[1], full_runs, work, port, aws, "small", small)
        measure_delta(cases[2], delta_runs, port, aws, "small", small, state, target)
    print()
    print(sync_table(cases))
    print()
    print(f"same moto S3 server (in memory, on 127.0.0.1), {os.cpu_count()} CPUs; medians of {full_runs} full and "
          f"{delta_runs} delta runs, tools alternating")  # fmt: skip
    print("edged (process): a Python process running sync_once (list, download, verify size + MD5 + sha256, "
          "build the snapshot, switch); edged (in sync_once): the same run as the daemon would spend it")  # fmt: skip
    print(f"aws s3 sync: {version} (default settings: 10 concurrent requests, 8 MB parts)")
    save_results(
        "sync",
        {
            **run_header(argv),
            "cpus": os.cpu_count(),
            "aws": version,
            "cases": [{**asdict(case), "ratio": case.ratio} for case in cases],
        },
    )
    say(f"done in {time.monotonic() - began:.0f} s")
    return 0


PHASE: Final = Phase(
    "--sync",
    "only the repository-sync comparison: edged's sync against `aws s3 sync` on a moto S3 server "
    "(full download of a large and of a 1,000-file repository, then one changed file)",
    run,
)
