"""How many frontend workers a daemon starts: what --frontend-workers says, or one for each 2 cores past the
first 2 (-1), and never a worker beside TLS."""

from __future__ import annotations

import dataclasses
import os
from pathlib import Path
from typing import Any

import pytest

from edged.config.settings import Settings
from edged.daemon.endpoints import StartupError
from edged.daemon.workers import MAX_AUTO_WORKERS, worker_count


def _settings(tmp_path: Path, **changes: Any) -> Settings:
    return dataclasses.replace(Settings.defaults([tmp_path], {}), **changes)


def test_an_explicit_count_is_taken(tmp_path: Path) -> None:
    assert worker_count(_settings(tmp_path, frontend_workers=0)) == 0
    assert worker_count(_settings(tmp_path, frontend_workers=3)) == 3


def test_the_default_leaves_a_core_for_the_models_and_one_for_the_daemon(tmp_path: Path) -> None:
    cores = len(os.sched_getaffinity(0))
    expected = min(MAX_AUTO_WORKERS, max(0, (cores - 2) // 2))
    assert worker_count(_settings(tmp_path)) == expected
    if cores <= 3:
        assert expected == 0  # a small device serves from the daemon alone: no hop, no extra memory


@pytest.mark.parametrize("flag", ["http_use_ssl", "grpc_use_ssl", "http_use_ssl_mutual", "grpc_use_ssl_mutual"])
def test_tls_keeps_every_connection_with_the_daemon(tmp_path: Path, flag: str) -> None:
    assert worker_count(_settings(tmp_path, **{flag: True})) == 0
    assert worker_count(_settings(tmp_path, frontend_workers=0, **{flag: True})) == 0
    with pytest.raises(StartupError, match="serve plain HTTP and gRPC only"):
        worker_count(_settings(tmp_path, frontend_workers=2, **{flag: True}))
