"""The ``edged`` command line: ``check-repo``, ``--version``, and ``serve`` refusing what it cannot serve."""

from __future__ import annotations

import subprocess
import sys
import tempfile
from pathlib import Path

import pytest
from conftest import BROKEN_MODELS, BROKEN_SYNTAX_POSITION, GOOD_MODELS
from server import REPO_ROOT, TRACEBACK_MARKER, free_ports

import edged

TIMEOUT_S = 120


def _edged(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "edged", *args],
        capture_output=True,
        text=True,
        timeout=TIMEOUT_S,
        cwd=REPO_ROOT,
        stdin=subprocess.DEVNULL,
        check=False,
    )


def _no_traceback(result: subprocess.CompletedProcess[str]) -> None:
    assert TRACEBACK_MARKER not in result.stdout + result.stderr, result.stdout + result.stderr


def test_version() -> None:
    result = _edged("--version")
    assert result.returncode == 0, result.stderr
    assert result.stdout == f"edged {edged.__version__}\n"


def test_version_through_the_console_script() -> None:
    script = Path(sys.executable).with_name("edged")
    if not script.exists():
        pytest.skip(f"no console script next to {sys.executable}")
    result = subprocess.run([str(script), "--version"], capture_output=True, text=True, timeout=TIMEOUT_S, check=False)
    assert result.returncode == 0, result.stderr
    assert result.stdout == f"edged {edged.__version__}\n"


def test_check_repo_accepts_the_bundled_repository(bundled_repository: Path) -> None:
    result = _edged("check-repo", str(bundled_repository))
    assert result.returncode == 0, result.stdout + result.stderr
    assert result.stdout == ""
    assert result.stderr == ""


def test_check_repo_reports_each_broken_model_on_one_line(test_repository: Path) -> None:
    result = _edged("check-repo", str(test_repository))
    _no_traceback(result)
    assert result.returncode == 1, result.stdout + result.stderr
    lines = result.stdout.splitlines()
    assert len(lines) == len(BROKEN_MODELS), lines
    for model in BROKEN_MODELS:
        naming = [line for line in lines if line.startswith(model)]
        assert len(naming) == 1, (model, lines)
    for model in GOOD_MODELS:
        assert not any(model in line.split(":")[0] for line in lines), (model, lines)
    [syntax] = [line for line in lines if line.startswith("broken_syntax")]
    assert f"config.pbtxt:{BROKEN_SYNTAX_POSITION}:" in syntax
    [dtype] = [line for line in lines if line.startswith("broken_dtype")]
    assert "TYPE_INT32" in dtype and "TYPE_FP32" in dtype
    # The problems are the whole output: no log records repeat them on stderr.
    assert result.stderr == ""


def test_check_repo_on_a_missing_directory(tmp_path: Path) -> None:
    missing = tmp_path / "nowhere"
    result = _edged("check-repo", str(missing))
    _no_traceback(result)
    assert result.returncode == 1
    output = (result.stdout + result.stderr).strip().splitlines()
    assert len(output) == 1, output
    assert str(missing) in output[0]


def _serve(*args: str) -> subprocess.CompletedProcess[str]:
    http, metrics, grpc = free_ports(3)
    with tempfile.TemporaryDirectory(prefix="edged-cli-") as state:  # never the user's own state directory
        return _edged(
            "serve",
            "--http-address",
            "127.0.0.1",
            "--http-port",
            str(http),
            "--metrics-port",
            str(metrics),
            "--allow-console",
            "false",
            "--grpc-port",
            str(grpc),
            "--state-dir",
            state,
            *args,
        )


def test_serve_refuses_a_missing_repository(tmp_path: Path) -> None:
    missing = tmp_path / "no-such-repository"
    result = _serve("--model-repository", str(missing))
    _no_traceback(result)
    assert result.returncode == 1, result.stdout + result.stderr
    lines = [line for line in (result.stdout + result.stderr).splitlines() if line.strip()]
    assert len(lines) == 1, lines
    assert str(missing) in lines[0]


def test_serve_exits_on_error_when_asked(small_repository: Path) -> None:
    result = _serve("--model-repository", str(small_repository), "--exit-on-error=true")
    _no_traceback(result)
    assert result.returncode == 1, result.stdout + result.stderr
    assert "broken_syntax" in result.stderr
    assert "edged ready" not in result.stderr


def test_serve_exits_when_a_startup_model_is_nowhere_and_asked_to(small_repository: Path) -> None:
    """As Triton: --load-model naming a model no repository holds is an error at start (logged; fatal with
    --exit-on-error)."""
    explicit = ("--model-repository", str(small_repository), "--model-control-mode=explicit")
    result = _serve(*explicit, "--load-model=does-not-exist", "--exit-on-error=true")
    _no_traceback(result)
    assert result.returncode == 1, result.stdout + result.stderr
    assert "model 'does-not-exist' not found in any model repository and --exit-on-error is set" in result.stderr
    assert "edged ready" not in result.stderr


def test_serve_needs_a_repository() -> None:
    result = _serve()
    assert result.returncode == 2
    assert "--model-repository" in result.stderr
    _no_traceback(result)
