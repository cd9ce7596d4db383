"""The gRPC flags of ``edged serve``: refused values, and a port that cannot be bound."""

from __future__ import annotations

import socket
import subprocess
import sys
from pathlib import Path

import pytest
from server import REPO_ROOT, TRACEBACK_MARKER, free_ports

from edged.cli import build_parser
from edged.config.settings import Settings

TIMEOUT_S = 120


def test_defaults(small_repository: Path) -> None:
    settings = Settings.from_args(build_parser().parse_args(["serve", "--model-repository", str(small_repository)]))
    assert settings.allow_grpc is True
    assert settings.grpc_port == 8001
    assert settings.grpc_max_message_size == 64 * 1024 * 1024
    assert settings.allow_client_shm is False


def test_flags(small_repository: Path) -> None:
    args = build_parser().parse_args(
        [
            "serve",
            "--model-repository",
            str(small_repository),
            "--allow-grpc=false",
            "--grpc-max-message-size",
            "2147483647",
            "--allow-client-shm",
        ]
    )
    settings = Settings.from_args(args)
    assert (settings.allow_grpc, settings.grpc_max_message_size, settings.allow_client_shm) == (False, 2**31 - 1, True)


@pytest.mark.parametrize("value", ["0", "-5", "2147483648", "lots"])
def test_message_size_must_fit_grpc(small_repository: Path, value: str, capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as caught:
        build_parser().parse_args(
            ["serve", "--model-repository", str(small_repository), "--grpc-max-message-size", value]
        )
    assert caught.value.code == 2
    assert "--grpc-max-message-size" in capsys.readouterr().err


def test_grpc_port_in_use_exits_with_one_clear_line(small_repository: Path, tmp_path: Path) -> None:
    http_port, metrics_port, grpc_port = free_ports(3)
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as taken:
        taken.bind(("127.0.0.1", grpc_port))
        taken.listen()
        result = subprocess.run(
            [
                sys.executable,
                "-m",
                "edged",
                "serve",
                "--model-repository",
                str(small_repository),
                "--http-address",
                "127.0.0.1",
                "--http-port",
                str(http_port),
                "--metrics-port",
                str(metrics_port),
                "--allow-console",
                "false",
                "--grpc-address",
                "127.0.0.1",
                "--grpc-port",
                str(grpc_port),
                # Never the user's own state directory.
                "--state-dir",
                str(tmp_path / "state"),
            ],
            capture_output=True,
            text=True,
            timeout=TIMEOUT_S,
            cwd=REPO_ROOT,
            stdin=subprocess.DEVNULL,
            check=False,
        )
    output = result.stdout + result.stderr
    assert result.returncode == 1, output
    assert TRACEBACK_MARKER not in output
    # Triton's words for a port in use, which scripts written for it look for.
    assert (
        f"exiting: failed to start GRPC service: Unavailable - Socket '127.0.0.1:{grpc_port}' already in use" in output
    )
    assert "edged ready" not in output
