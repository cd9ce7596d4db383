"""Which Python runs a model's stub: the daemon's own, or the one of the model's ``EXECUTION_ENV_PATH``.

``EXECUTION_ENV_PATH`` (a config parameter, as in Triton) names a Python environment: a directory (a venv, or an
unpacked conda-pack) or a packed ``.tar.gz`` of one, which is unpacked once into the cache directory. Unpacking
refuses members that are absolute, climb out with ``..``, or are links pointing outside the environment, so a
packed environment can only ever write below its own folder. ``$$TRITON_MODEL_DIRECTORY`` in the path means the
model's folder.
"""

from __future__ import annotations

import hashlib
import os
import shutil
import sys
import tarfile
import tempfile
import threading
from pathlib import Path

from edged.errors import EdgedError, ErrorCode

MODEL_DIRECTORY_VARIABLE = "$$TRITON_MODEL_DIRECTORY"
_unpack_lock = threading.Lock()


def _error(model: str, message: str) -> EdgedError:
    return EdgedError(ErrorCode.INVALID_ARG, f"EXECUTION_ENV_PATH of model '{model}': {message}")


def stub_interpreter(model: str, env_path: str, model_dir: Path, cache_dir: Path) -> str:
    """The interpreter for the model's stubs; ``env_path`` empty means the daemon's own."""
    if not env_path:
        return sys.executable
    path = Path(env_path.replace(MODEL_DIRECTORY_VARIABLE, str(model_dir)))
    if not path.is_absolute():
        path = model_dir / path
    if path.is_dir():
        root = path
    elif path.is_file() and path.name.endswith((".tar.gz", ".tgz", ".tar")):
        root = _unpacked(model, path, cache_dir)
    else:
        raise _error(model, f"'{_shown(path, model_dir)}' is neither a directory nor a .tar.gz archive")
    for candidate in ("bin/python3", "bin/python"):
        interpreter = root / candidate
        if interpreter.is_file() and os.access(interpreter, os.X_OK):
            return str(interpreter)
    raise _error(model, f"'{_shown(path, model_dir)}' holds no bin/python3")


def _shown(path: Path, model_dir: Path) -> str:
    # Clients see paths relative to the model folder, never where the repository lives.
    try:
        return str(path.relative_to(model_dir))
    except ValueError:
        return path.name


def _unpacked(model: str, archive: Path, cache_dir: Path) -> Path:
    """The archive unpacked under the cache; unpacked again only when its content changed."""
    stat = archive.stat()
    key = hashlib.sha256(f"{archive.resolve()}:{stat.st_size}:{stat.st_mtime_ns}".encode()).hexdigest()[:24]
    target = cache_dir / f"env-{key}"
    with _unpack_lock:
        if (target / ".edged-complete").is_file():
            return target
        cache_dir.mkdir(parents=True, exist_ok=True)
        staging = Path(tempfile.mkdtemp(prefix=".unpack-", dir=cache_dir))
        try:
            with tarfile.open(archive, "r:*") as tar:
                members = [_checked(model, member, archive.name) for member in tar.getmembers()]
                tar.extractall(staging, members=members, filter="tar")
            (staging / ".edged-complete").write_text(str(archive.name), encoding="utf-8")
            if target.exists():
                shutil.rmtree(target)
            staging.rename(target)
        except (OSError, tarfile.TarError) as exc:
            raise _error(model, f"unable to unpack '{archive.name}': {exc}") from None
        finally:
            if staging.exists():
                shutil.rmtree(staging, ignore_errors=True)
    return target


def _checked(model: str, member: tarfile.TarInfo, archive: str) -> tarfile.TarInfo:
    name = member.name
    parts = Path(name).parts
    if name.startswith("/") or ".." in parts:
        raise _error(model, f"'{archive}' holds the member '{name}', which points outside the environment")
    if member.islnk() or member.issym():
        link = member.linkname
        base = Path(name).parent if member.issym() else Path()
        resolved = os.path.normpath(base / link)
        if link.startswith("/") or resolved.startswith(".."):
            raise _error(
                model, f"'{archive}' holds the link '{name}' -> '{link}', which points outside the environment"
            )
    elif not (member.isfile() or member.isdir()):
        raise _error(model, f"'{archive}' holds '{name}', which is neither a file, a folder nor a link")
    return member
