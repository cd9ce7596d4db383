"""The CUDA runtime perf_analyzer loads for shared memory.

perf_analyzer 2.60 loads the CUDA runtime (libcudart) whenever it runs with shared memory, even system shared
memory, and stops when it cannot. Loading the library needs no GPU, so before the first shared-memory run the
benchmark puts libcudart from NVIDIA's CUDA runtime wheel into perf_analyzer's root (``$PA_ROOT``, never into
../shared); when that is not possible it says why and leaves the shared-memory rows out.
"""

from __future__ import annotations

import os
import re
import subprocess
import sys
import tempfile
import zipfile
from collections.abc import Sequence
from pathlib import Path
from typing import Final

from .common import PA_ROOT, say

# Where ../shared/tools/perf-analyzer unpacks the perf_analyzer binary inside that root.
PA_BINARY: Final = "opt/pa/perf_analyzer/bin/perf_analyzer"
# Inside the root: on the loader's default path (Debian's /etc/ld.so.conf.d/libc.conf).
PA_LIBRARY_DIR: Final = "usr/local/lib"
# The names under which perf_analyzer dlopens the CUDA runtime, as they appear in its binary.
CUDART_NAME: Final = re.compile(rb"libcudart\.so(?:\.[0-9]+)*")
# What perf_analyzer prints when it cannot load the CUDA runtime.
CUDA_RUNTIME_FAILURE: Final = re.compile(r"Cannot open CUDA runtime library|Failed to load one or more CUDA functions")


def _cuda_runtime_package(names: Sequence[str]) -> str:
    """The wheel with the CUDA runtime under these names: the major version's, or CUDA 12's for libcudart.so."""
    majors = {int(name.split(".")[2]) for name in names if name.count(".") >= 2}
    major = max(majors) if majors else 12
    return f"nvidia-cuda-runtime-cu{major}" if major <= 12 else f"nvidia-cuda-runtime=={major}.*"


def _loadable_in_root(name: str) -> bool:
    """Whether the dynamic loader cache inside perf_analyzer's root has a library called ``name``."""
    done = subprocess.run(["chroot", str(PA_ROOT), "ldconfig", "-p"], capture_output=True, text=True, check=False)
    return done.returncode == 0 and any(line.strip().startswith(f"{name} (") for line in done.stdout.splitlines())


def ensure_cuda_runtime() -> str | None:
    """Makes the CUDA runtime loadable inside perf_analyzer's root; returns why that failed, or None.

    perf_analyzer 2.60 dlopens libcudart as soon as a run uses shared memory, system shared memory included, and
    aborts with "Cannot open CUDA runtime library" without it. It calls into it only for CUDA shared memory, and
    loading the library needs neither a GPU nor a driver, so the runtime from NVIDIA's wheel on PyPI is enough.
    It goes into the root's /usr/local/lib and the root's loader cache: the root is a cache this machine builds
    for ../shared/tools/perf-analyzer; ../shared itself is never changed.
    """
    binary = PA_ROOT / PA_BINARY
    try:
        names = sorted({match.decode() for match in CUDART_NAME.findall(binary.read_bytes())})
    except OSError as exc:
        return f"cannot read {binary}: {exc.strerror}"
    if not names:
        return None  # this perf_analyzer does not load the CUDA runtime
    if os.geteuid() != 0:
        return f"perf_analyzer loads {', '.join(names)}, and putting it into {PA_ROOT} needs root"
    missing = [name for name in names if not _loadable_in_root(name)]
    if not missing:
        say(f"shared memory: {', '.join(names)} (loaded by perf_analyzer) is already in {PA_ROOT}")
        return None
    package = _cuda_runtime_package(names)
    target = PA_ROOT / PA_LIBRARY_DIR
    say(
        f"shared memory: perf_analyzer dlopens {', '.join(missing)} even for --shared-memory system and stops "
        f"without it; installing the CUDA runtime from the {package} wheel (PyPI) into {target} and running "
        "ldconfig in that root (perf_analyzer's root only; loading the library needs no GPU)"
    )
    with tempfile.TemporaryDirectory(prefix="edged-bench-cudart-") as tmp:
        download = [sys.executable, "-m", "pip", "download", "-q", "--no-deps", "--only-binary=:all:", "-d", tmp]
        try:
            done = subprocess.run([*download, package], capture_output=True, text=True, check=False, timeout=600)
        except subprocess.TimeoutExpired:
            return f"downloading {package} took more than 10 minutes"
        wheels = sorted(Path(tmp).glob("*.whl"))
        if done.returncode != 0 or not wheels:
            lines = [line.strip() for line in (done.stdout + done.stderr).splitlines() if line.strip()]
            return f"could not download {package}: {lines[-1] if lines else f'pip exited {done.returncode}'}"
        installed: list[str] = []
        with zipfile.ZipFile(wheels[0]) as wheel:
            for member in wheel.namelist():
                library = re.fullmatch(r"(?:.*/)?lib/(libcudart\.so\.[0-9.]+)", member)
                if not library:
                    continue
                target.mkdir(parents=True, exist_ok=True)
                staged = target / f".{library[1]}.tmp"
                staged.write_bytes(wheel.read(member))
                staged.chmod(0o755)
                staged.replace(target / library[1])
                installed.append(library[1])
    if not installed:
        return f"{wheels[0].name} has no libcudart.so.*"
    # ldconfig links the versioned names; a name without a version (libcudart.so) needs a link of its own.
    for name in missing:
        if name not in installed and not (target / name).exists():
            (target / name).unlink(missing_ok=True)  # a dangling link
            (target / name).symlink_to(installed[0])
    done = subprocess.run(["chroot", str(PA_ROOT), "ldconfig"], capture_output=True, text=True, check=False)
    if done.returncode != 0:
        return f"ldconfig in {PA_ROOT} failed: {(done.stdout + done.stderr).strip()}"
    still = [name for name in missing if not _loadable_in_root(name)]
    if still:
        return f"{', '.join(still)} is still not in the loader cache of {PA_ROOT} after ldconfig"
    say(f"shared memory: {', '.join(installed)} installed into {target}")
    return None
