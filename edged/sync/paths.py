"""Where a remote repository lives on the device: names only, no I/O, so that the configuration can say where
the server reads a remote repository from without loading anything of the sync."""

from __future__ import annotations

import hashlib
from pathlib import Path


def channel_url(base: str, channel: str | None) -> str:
    """The repository a device on ``channel`` follows: the folder of that name under ``base`` (``base`` itself
    without a channel)."""
    base = base.rstrip("/")
    return f"{base}/{channel}" if channel else base


def source_id(url: str) -> str:
    """The folder name of a source's snapshots: stable for a URL, one path component whatever the URL holds."""
    return hashlib.sha256(url.encode()).hexdigest()[:16]


def source_root(state_dir: Path, url: str) -> Path:
    return state_dir / "sync" / source_id(url)


def local_repository(state_dir: Path, base: str, channel: str | None) -> Path:
    """The folder the server reads the remote repository ``base`` from: the ``current`` snapshot's repository,
    reached through the link that a switch replaces, so the path never changes."""
    return source_root(state_dir, channel_url(base, channel)) / "current" / "repo"
