"""Private copies of models loaded with overrides (a ``config`` and ``file:`` contents from the load API):
``<state dir>/overrides/<name>/<generation>/``, with ``CURRENT`` naming the generation the model serves from, so that a
restart loads the same copy again. The files themselves are made by edged.core.repository.files.make_private_copy."""

from __future__ import annotations

import asyncio
import os
import time
from concurrent.futures import Executor
from pathlib import Path

from google.protobuf import json_format, text_format

from edged.core.confined import PathOutsideRoot, inside, make_dirs, remove_tree
from edged.core.names import is_model_name, model_name_problem, printable
from edged.core.repository.files import fingerprint, make_private_copy, sync_directory
from edged.errors import EdgedError, ErrorCode
from edged.proto.model_config_pb2 import ModelConfig

_CURRENT = "CURRENT"
# The copies' folder in the state directory. Releases before it used "models", which is also where the package
# keeps the repository (/var/lib/edged/models): settling a copy there removed the model's repository folder.
OVERRIDES = "overrides"
_EARLIER = "models"


class FoldersOverlap(ValueError):
    """A model repository lies in the private copies' folder."""


def private_root(state_dir: Path, repositories: list[Path]) -> Path:
    """``<state dir>/overrides``, with the copies an earlier release kept in ``<state dir>/models`` moved there;
    FoldersOverlap when a model repository lies in it (settling a copy removes folders in it)."""
    root = state_dir / OVERRIDES
    for repository in repositories:
        if _within(repository, root):
            raise FoldersOverlap(
                f"model repository '{repository}' lies in '{root}', where edged keeps the models loaded with "
                "overrides: give the state directory or the repository another place"
            )
    earlier = state_dir / _EARLIER
    if not root.exists() and _holds_only_copies(earlier) and not any(_within(r, earlier) for r in repositories):
        earlier.rename(root)
    return root


def _within(path: Path, folder: Path) -> bool:
    return path.resolve().is_relative_to(folder.resolve())


def _holds_only_copies(folder: Path) -> bool:
    """Whether ``folder`` holds private copies only: each entry a model's folder of numbered generations and CURRENT
    (a repository's model folders hold a config.pbtxt, never a CURRENT)."""
    try:
        models = list(folder.iterdir())
        return bool(models) and all(
            model.is_dir()
            and not model.is_symlink()
            and (model / _CURRENT).is_file()
            and all(entry.name.isdigit() or entry.name.startswith(_CURRENT) for entry in model.iterdir())
            for model in models
        )
    except OSError:
        return False


def override_config_text(name: str, config_json: str | None, files: dict[str, bytes]) -> str | None:
    """The config.pbtxt a ``config`` override (JSON) stands for, or None when there is none; Triton's rules: it
    names this model if it names one, and files never come without it."""
    if config_json is None:
        if files:
            # As Triton: files alone would leave the folder's config describing other files.
            raise EdgedError(
                ErrorCode.INTERNAL,
                f"failed to load '{name}', failed to poll from model repository: override files need a 'config' "
                "override with them",
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
    """The private copies of every model, under ``root`` (``<state dir>/overrides``). Each method checks the model
    name (edged.core.names) and every path it creates or removes lies inside ``root``, whatever its caller checked
    before."""

    def __init__(self, root: Path | None) -> None:
        self._root = root  # None without a state directory: no overrides then
        # The copies made from the repository's folder with only the config overridden (this run's): a load without
        # overrides keeps one while that folder is unchanged (control.py).
        self._config_only: set[Path] = set()

    def base(self, name: str) -> Path | None:
        if self._root is None:
            return None
        problem = model_name_problem(name)
        if problem is not None:
            raise PathOutsideRoot(f"model name {printable(name)!r} names no private copy: {problem}")
        return inside(self._root, self._root / name)

    def new_path(self, name: str) -> Path:
        """Where a new copy of the model goes (its parent made, the copy itself not yet)."""
        base = self.base(name)
        if base is None or self._root is None:
            raise EdgedError(ErrorCode.UNAVAILABLE, "loading with overrides needs a state directory (--state-dir)")
        make_dirs(self._root, base)
        return inside(base, base / f"{time.time_ns()}")

    def holds(self, name: str, path: Path) -> bool:
        """Whether ``path`` is one of the model's private copies."""
        return is_model_name(name) and self._root is not None and path.parent == self.base(name)

    async def make(
        self, name: str, config_json: str | None, files: dict[str, bytes], model_dir: Path | None, pool: Executor
    ) -> Path:
        """A new private copy of model ``name`` with ``config_json`` as its config and ``files`` written into it (in
        ``pool``). The repository's folder ``model_dir`` is the starting point only when no file is given: then only
        the config changes."""
        config_text = override_config_text(name, config_json, files)
        destination = self.new_path(name)
        origin_dir = model_dir if not files else None
        await asyncio.get_running_loop().run_in_executor(
            pool, make_private_copy, name, destination, origin_dir, config_text, files
        )
        if origin_dir is not None:
            self._config_only.add(destination)
        return destination

    def kept(self, name: str, serving: Path | None, folder: Path | None) -> Path | None:
        """As Triton: a load without overrides of a model that serves (from ``serving``) a ``config`` override keeps
        serving it as long as nothing in the model's repository ``folder`` changed since the override was made; a
        ``file:`` override, or a folder changed since, is undone (None: the repository's folder loads again)."""
        current = self.current(name)
        if current is None or serving != current or folder is None:
            return None
        made_ns = self.config_only_since(name, current)
        printed = fingerprint(folder)
        return current if made_ns is not None and printed is not None and printed.newest_ns <= made_ns else None

    def config_only_since(self, name: str, path: Path) -> int | None:
        """When ``path``, one of the model's copies, was made (ns since the epoch) if it is the repository's folder
        with only the config overridden; None for any other."""
        if path not in self._config_only or not self.holds(name, path) or not path.name.isdigit():
            return None
        return int(path.name)

    def current(self, name: str) -> Path | None:
        """The copy the model was last served from, if it was (never for a name that cannot be a model's)."""
        if not is_model_name(name):
            return None
        base = self.base(name)
        if base is None:
            return None
        try:
            generation = (base / _CURRENT).read_text(encoding="utf-8").strip()
        except OSError:
            return None
        if not generation.isdigit():
            return None
        path = base / generation
        return path if not path.is_symlink() and path.is_dir() else None

    def settle(self, name: str, serving: Path | None, attempted: Path | None) -> None:
        """After a load: a copy the model serves from becomes CURRENT and older ones go; a copy nothing serves from
        goes; a model served from its repository folder again needs no copy at all. (A version still finishing its
        requests keeps its open files.)"""
        base = self.base(name)
        if base is None or self._root is None:
            return
        if serving is not None and serving.parent == base:
            temporary = base / f"{_CURRENT}.tmp"
            with temporary.open("w", encoding="utf-8") as handle:
                handle.write(serving.name)
                handle.flush()
                os.fsync(handle.fileno())  # acknowledged loads survive a power cut (edged.state.store)
            temporary.replace(base / _CURRENT)
            sync_directory(base)
            keep: Path | None = serving
        elif serving is not None:
            remove_tree(self._root, base)
            self._config_only = {path for path in self._config_only if path.parent != base}
            return
        else:
            keep = self.current(name)
        if attempted is not None and attempted != keep:
            remove_tree(base, attempted)
            self._config_only.discard(attempted)
        if base.is_dir() and not base.is_symlink():
            for other in base.iterdir():
                if other != keep and other.name.isdigit():
                    remove_tree(base, other)
                    self._config_only.discard(other)
