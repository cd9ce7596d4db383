"""Private copies of models loaded with overrides (a ``config`` and ``file:`` contents from the load API):
``<state dir>/models/<name>/<generation>/``, with ``CURRENT`` naming the generation the model serves from, so that a
restart loads the same copy again. The files themselves are made by edged.core.model_files.make_private_copy."""

from __future__ import annotations

import shutil
import time
from pathlib import Path

from google.protobuf import json_format, text_format

from edged.errors import EdgedError, ErrorCode
from edged.proto.model_config_pb2 import ModelConfig

_CURRENT = "CURRENT"


def override_config_text(name: str, config_json: str | None, files: dict[str, bytes]) -> str | None:
    """The config.pbtxt a ``config`` override (JSON) stands for, or None when there is none; Triton's rules: it
    names this model if it names one, and files never come without it."""
    if config_json is None:
        if files:
            # As Triton: files alone would leave the folder's config describing other files.
            raise EdgedError(
                ErrorCode.INVALID_ARG, f"failed to load '{name}': override files need a 'config' override with them"
            )
        return None
    config = ModelConfig()
    try:
        json_format.Parse(config_json, config)
    except json_format.ParseError as exc:
        raise EdgedError(
            ErrorCode.INVALID_ARG, f"failed to load '{name}': the 'config' override is not a model config: {exc}"
        ) from None
    if config.name and config.name != name:
        raise EdgedError(
            ErrorCode.INVALID_ARG, f"failed to load '{name}': the 'config' override names model '{config.name}'"
        )
    config.name = name
    text: str = text_format.MessageToString(config)
    return text


class PrivateCopies:
    def __init__(self, root: Path | None) -> None:
        self._root = root  # None without a state directory: no overrides then

    def base(self, name: str) -> Path | None:
        return self._root / name if self._root is not None else None

    def new_path(self, name: str) -> Path:
        """Where a new copy of the model goes (not created yet)."""
        base = self.base(name)
        if base is None:
            raise EdgedError(ErrorCode.UNAVAILABLE, "loading with overrides needs a state directory (--state-dir)")
        return base / f"{time.time_ns()}"

    def current(self, name: str) -> Path | None:
        """The copy the model was last served from, if it was."""
        base = self.base(name)
        if base is None:
            return None
        try:
            generation = (base / _CURRENT).read_text(encoding="utf-8").strip()
        except OSError:
            return None
        path = base / generation
        return path if generation and "/" not in generation and path.is_dir() else None

    def settle(self, name: str, serving: Path | None, attempted: Path | None) -> None:
        """After a load: a copy the model serves from becomes CURRENT and older ones go; a copy nothing serves from
        goes; a model served from its repository folder again needs no copy at all. (A version still finishing its
        requests keeps its open files.)"""
        base = self.base(name)
        if base is None:
            return
        if serving is not None and serving.parent == base:
            temporary = base / f"{_CURRENT}.tmp"
            temporary.write_text(serving.name, encoding="utf-8")
            temporary.replace(base / _CURRENT)
            keep: Path | None = serving
        elif serving is not None:
            shutil.rmtree(base, ignore_errors=True)
            return
        else:
            keep = self.current(name)
        if attempted is not None and attempted != keep:
            shutil.rmtree(attempted, ignore_errors=True)
        if base.is_dir():
            for other in base.iterdir():
                if other.is_dir() and other != keep:
                    shutil.rmtree(other, ignore_errors=True)
