"""Triton's checksum repository agent, run by edged itself: a model config's

    model_repository_agents { agents [ { name: "checksum", parameters { key: "MD5:1/model.onnx" value: "<md5>" } } ] }

has each listed file's digest checked before the model loads, and a file that differs fails the load, with the
agent's messages. Keys are ``ALGORITHM:path``, the path relative to the model's folder, as the agent reads them; the
algorithm is MD5 (in any case), the only one the agent knows. Unlike the agent, a path must stay inside the model's
folder (no absolute path, no ``..``, no link out of it): the config is the only say a model's publisher has over what
the daemon reads. Files are read in chunks, so a model file of any size costs a bounded amount of memory.
"""

from __future__ import annotations

import hashlib
import os
import stat
from typing import TYPE_CHECKING, Final

from edged.core.config.unacted import CHECKSUM_AGENT
from edged.errors import EdgedError, ErrorCode

if TYPE_CHECKING:
    from pathlib import Path

    from edged.proto.model_config_pb2 import ModelConfig

_CHUNK: Final = 1 << 20


def verify_checksums(config: ModelConfig, model_dir: Path) -> None:
    """Raises the agent's error for the first listed file that cannot be read or whose digest differs."""
    for agent in config.model_repository_agents.agents:
        if agent.name != CHECKSUM_AGENT:
            continue
        for key, expected in agent.parameters.items():
            algorithm, colon, relative = key.partition(":")
            if not colon:
                raise EdgedError(ErrorCode.INVALID_ARG, f"failed to parse key: {key}")
            if algorithm.lower() != "md5":
                raise EdgedError(ErrorCode.UNSUPPORTED, f"Unsupported checksum algorithm: {algorithm}")
            path = _inside(model_dir, relative, config.name)
            digest = _md5(path, relative)
            if digest != expected:
                raise EdgedError(
                    ErrorCode.INVALID_ARG,
                    f"Mismatched MD5 hash for file {relative}, expect: {expected}, got: {digest}",
                )


def _inside(model_dir: Path, relative: str, model: str) -> str:
    parts = relative.split("/")
    real_root = os.path.realpath(model_dir)
    candidate = os.path.realpath(os.path.join(real_root, relative))
    if (
        not relative
        or relative.startswith("/")
        or ".." in parts
        or os.path.commonpath([real_root, candidate]) != real_root
        or candidate == real_root
    ):
        raise EdgedError(
            ErrorCode.INVALID_ARG,
            f"checksum agent of model '{model}': file '{relative}' must be a path inside the model's folder",
        )
    return candidate


def _md5(path: str, relative: str) -> str:
    digest = hashlib.md5(usedforsecurity=False)
    try:
        # Opened without blocking and checked to be a file: a FIFO or a device would never end.
        with open(os.open(path, os.O_RDONLY | os.O_NONBLOCK), "rb") as file:
            if not stat.S_ISREG(os.fstat(file.fileno()).st_mode):
                raise EdgedError(ErrorCode.INVALID_ARG, f"failed to open text file for read {relative}: not a file")
            while chunk := file.read(_CHUNK):
                digest.update(chunk)
    except OSError as exc:
        raise EdgedError(
            ErrorCode.INVALID_ARG, f"failed to open text file for read {relative}: {exc.strerror}"
        ) from None
    return digest.hexdigest()
