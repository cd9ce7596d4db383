"""What the results say about the machine and the software measured: CPU, edged's commit, Triton's onnxruntime."""

from __future__ import annotations

import contextlib
import os
import platform
import subprocess
from pathlib import Path
from typing import Any

import onnxruntime as ort

from .common import ROOT, say


def machine_info() -> dict[str, Any]:
    """The machine and edged's revision, as the server phases record them; says what it found."""
    machine = {
        "cpus": os.cpu_count(),
        "cpu_model": _cpu_model(),
        "python": platform.python_version(),
        "onnxruntime": ort.__version__,
        "edged": _edged_revision(),
    }
    say(f"{machine['cpus']} CPUs ({machine['cpu_model']}), onnxruntime {ort.__version__}")
    return machine


def _cpu_model() -> str:
    with contextlib.suppress(OSError):
        for text in Path("/proc/cpuinfo").read_text().splitlines():
            if text.startswith("model name"):
                return text.split(":", 1)[1].strip()
    return platform.processor() or "unknown CPU"


def _edged_revision() -> str | None:
    """The commit edged runs from, and whether its package has changes not committed yet."""
    env = {**os.environ, "GIT_OPTIONAL_LOCKS": "0"}  # only reads: never refreshes git's index

    def git(*args: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run(["git", *args], cwd=ROOT, env=env, capture_output=True, text=True, check=False)

    with contextlib.suppress(OSError):
        head = git("rev-parse", "--short", "HEAD")
        if head.returncode == 0:
            dirty = git("diff", "--quiet", "HEAD", "--", "edged").returncode != 0
            untracked = bool(git("ls-files", "--others", "--exclude-standard", "--", "edged").stdout.strip())
            changed = " with uncommitted changes under edged/" if dirty or untracked else ""
            return f"commit {head.stdout.strip()}{changed}"
    return None


def triton_ort_version() -> str | None:
    venv = Path(os.environ.get("TRITON_REF_VENV", "/var/tmp/triton-reference-venv"))
    python = venv / "bin" / "python"
    if not python.is_file():
        return None
    done = subprocess.run(
        [str(python), "-c", "import onnxruntime; print(onnxruntime.__version__)"],
        capture_output=True, text=True, check=False,
    )  # fmt: skip
    return done.stdout.strip() or None


def triton_description() -> str:
    version = triton_ort_version()
    return "Triton 2.51 (CPU build), Python backend running onnxruntime" + (f" {version}" if version else "")
