"""Model repositories on local disk: finding model folders, their versions and their model files.

Layout (Triton's): ``<repository>/<model>/config.pbtxt`` and ``<repository>/<model>/<version>/<model file>``.
Version folders are positive integers written without a leading zero; anything else in a model folder is
ignored, as Triton ignores it.
"""

from __future__ import annotations

import logging
import os
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Final

from edged.core.names import model_name_problem, printable
from edged.errors import EdgedError, ErrorCode

if TYPE_CHECKING:
    from edged.proto.model_config_pb2 import ModelConfig

log = logging.getLogger(__name__)

CONFIG_FILENAME = "config.pbtxt"
# Where a model folder keeps configurations chosen by name (--model-config-name), as Triton does.
CUSTOM_CONFIGS = "configs"

# Platform -> backend, and backend -> default model file name, as Triton's core defines them.
BACKEND_BY_PLATFORM: dict[str, str] = {
    "tensorrt_plan": "tensorrt",
    "tensorflow_graphdef": "tensorflow",
    "tensorflow_savedmodel": "tensorflow",
    "onnxruntime_onnx": "onnxruntime",
    "pytorch_libtorch": "pytorch",
    "libtorch": "pytorch",
    "torch_aoti": "pytorch",
}
DEFAULT_MODEL_FILENAME_BY_PLATFORM: dict[str, str] = {
    "tensorrt_plan": "model.plan",
    "tensorflow_graphdef": "model.graphdef",
    "tensorflow_savedmodel": "model.savedmodel",
    "onnxruntime_onnx": "model.onnx",
    "pytorch_libtorch": "model.pt",
    "libtorch": "model.pt",
    "torch_aoti": "model.pt2",
}
DEFAULT_MODEL_FILENAME_BY_BACKEND: dict[str, str] = {
    "onnxruntime": "model.onnx",
    "openvino": "model.xml",
    "python": "model.py",
    "tensorrt": "model.plan",
    "pytorch": "model.pt",
}
# The backend a default_model_filename's extension names, when the config names none.
_BACKEND_BY_SUFFIX: dict[str, str] = {
    ".graphdef": "tensorflow",
    ".savedmodel": "tensorflow",
    ".plan": "tensorrt",
    ".onnx": "onnxruntime",
    ".xml": "openvino",
    ".pt": "pytorch",
    ".pt2": "pytorch",
    ".py": "python",
}
# When neither backend nor platform is given, the model file decides, in Triton's detection order.
_DETECTION_ORDER: tuple[tuple[str, str, str], ...] = (
    ("model.graphdef", "tensorflow", "tensorflow_graphdef"),
    ("model.savedmodel", "tensorflow", "tensorflow_savedmodel"),
    ("model.plan", "tensorrt", "tensorrt_plan"),
    ("model.onnx", "onnxruntime", "onnxruntime_onnx"),
    ("model.xml", "openvino", ""),
    ("model.pt", "pytorch", "pytorch_libtorch"),
    ("model.pt2", "pytorch", "torch_aoti"),
    ("model.py", "python", ""),
)


@dataclass(frozen=True, slots=True)
class ModelSource:
    """A model folder found in a repository."""

    name: str
    path: Path
    repository: Path
    # --model-config-name: the model's config is configs/<name>.pbtxt in its folder while that file exists.
    config_name: str | None = None

    @property
    def config_path(self) -> Path:
        if self.config_name is not None:
            custom = self.path / CUSTOM_CONFIGS / f"{self.config_name}.pbtxt"
            if custom.is_file():
                return custom
        return self.path / CONFIG_FILENAME

    def relative(self, path: Path) -> str:
        """A path as clients may see it: relative to the repository, never the absolute location."""
        try:
            return str(path.relative_to(self.repository))
        except ValueError:
            return path.name


@dataclass(frozen=True, slots=True)
class ScanResult:
    models: dict[str, ModelSource]
    # Names found in more than one repository: Triton makes such a model unavailable.
    duplicates: dict[str, list[Path]]


def scan_repositories(repositories: list[Path], config_name: str | None = None) -> ScanResult:
    models: dict[str, ModelSource] = {}
    seen: dict[str, list[Path]] = {}
    for repository in repositories:
        try:
            entries = sorted(os.scandir(repository), key=lambda e: e.name)
        except OSError as exc:
            raise EdgedError(
                ErrorCode.INTERNAL, f"failed to read model repository '{repository}': {exc.strerror}"
            ) from None
        for entry in entries:
            if entry.name.startswith(".") or not entry.is_dir():
                continue
            problem = model_name_problem(entry.name)
            if problem is not None:
                _refuse_folder(entry.path, problem)
                continue
            seen.setdefault(entry.name, []).append(repository)
            models[entry.name] = ModelSource(entry.name, Path(entry.path), repository, config_name)
    duplicates = {name: repos for name, repos in seen.items() if len(repos) > 1}
    return ScanResult(models, duplicates)


# Folders already reported as refused: poll mode scans every few seconds, and one line per folder is enough.
_refused_folders: set[str] = set()


def _refuse_folder(path: str, problem: str) -> None:
    if path not in _refused_folders:
        _refused_folders.add(path)
        log.warning("model folder %s is not served: its name cannot be a model name (%s)", printable(path), problem)


def is_version_name(name: str) -> bool:
    return name.isascii() and name.isdigit() and not name.startswith("0")


def version_numbers(source: ModelSource) -> list[int]:
    """Every version folder of a model, ascending. Other folders are ignored, with a warning (once) for one that
    looks meant as a version."""
    try:
        entries = list(os.scandir(source.path))
    except OSError:
        return []
    numbers = []
    for entry in entries:
        if not entry.is_dir():
            continue
        if is_version_name(entry.name):
            numbers.append(int(entry.name))
        elif entry.name not in _MODEL_FOLDERS and not entry.name.startswith("."):
            _ignore_folder(entry.path, entry.name)
    return sorted(numbers)


# Folders a model folder holds beside its versions (named configurations, warmup data, a Python model's packed
# environment): never versions, so nothing is said about them.
_MODEL_FOLDERS: Final = frozenset({CUSTOM_CONFIGS, "warmup", "__pycache__"})
# Folders already reported as not versions: poll mode reads every model folder every few seconds.
_ignored_folders: set[str] = set()


def _ignore_folder(path: str, name: str) -> None:
    if path in _ignored_folders:
        return
    _ignored_folders.add(path)
    # Triton's words, which scripts written for it look for.
    if name.isascii() and name.isdigit():
        log.warning("ignore version directory '%s' which contains leading zeros in its directory name", name)
    else:
        log.warning("ignore version directory '%s' which fails to convert to integral number", printable(name))


def select_versions(config: ModelConfig, available: list[int]) -> list[int]:
    """The versions the config's version_policy asks to serve (default: the newest one)."""
    policy = config.version_policy
    choice = policy.WhichOneof("policy_choice")
    if choice == "all":
        return list(available)
    if choice == "specific":
        return sorted(v for v in set(policy.specific.versions) if v in available)
    count = policy.latest.num_versions if choice == "latest" else 1
    return available[-count:] if count > 0 else []


def fill_backend_fields(config: ModelConfig, source: ModelSource, versions: list[int]) -> None:
    """Fill platform, backend and default_model_filename the way Triton's core does before loading."""
    if not config.backend and config.platform in BACKEND_BY_PLATFORM:
        config.backend = BACKEND_BY_PLATFORM[config.platform]
    if not config.backend and config.default_model_filename:
        # As Triton: the model file's name tells the backend (a platform that disagrees is then refused by name).
        config.backend = _BACKEND_BY_SUFFIX.get(os.path.splitext(config.default_model_filename)[1], "")
    if not config.backend and not config.platform and versions:
        newest = source.path / str(versions[-1])
        for filename, backend, platform in _DETECTION_ORDER:
            if (newest / filename).exists():
                config.backend = backend
                config.platform = platform
                break
    if config.backend == "onnxruntime" and not config.platform:
        config.platform = "onnxruntime_onnx"
    if not config.default_model_filename:
        default = DEFAULT_MODEL_FILENAME_BY_PLATFORM.get(config.platform) or DEFAULT_MODEL_FILENAME_BY_BACKEND.get(
            config.backend
        )
        if default:
            config.default_model_filename = default


def model_file(config: ModelConfig, source: ModelSource, version: int) -> Path:
    return source.path / str(version) / config.default_model_filename


def read_labels(source: ModelSource, filename: str) -> list[str]:
    path = (source.path / filename).resolve()
    if source.path.resolve() not in path.parents:
        raise EdgedError(ErrorCode.INVALID_ARG, f"label_filename '{filename}' must name a file in the model folder")
    try:
        return path.read_text(encoding="utf-8").splitlines()
    except OSError as exc:
        raise EdgedError(
            ErrorCode.INVALID_ARG, f"unable to read label file '{source.relative(path)}': {exc.strerror}"
        ) from None
