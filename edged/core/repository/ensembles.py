"""Ensembles as model control orders them: an ensemble loads after the models it is made of, which it checks at
load, so control tells one from its folder before loading anything; in explicit mode, loading an ensemble loads the
models its steps name first, as Triton does."""

from __future__ import annotations

import re
from typing import TYPE_CHECKING

from edged.errors import EdgedError

if TYPE_CHECKING:
    from collections.abc import Iterable
    from pathlib import Path

    from edged.core.repository.scan import ScanResult


def ensembles_last(names: Iterable[str], scan: ScanResult) -> tuple[list[str], list[str]]:
    """``names`` in two groups to load one after the other: the ensembles second."""
    ensembles = [name for name in names if name in scan.models and is_ensemble(scan.models[name].config_path)]
    return [name for name in names if name not in ensembles], ensembles


def composing_models(config_file: Path) -> list[str]:
    """The models an ensemble's steps name, in step order, from its config file (none for a model that is not an
    ensemble, or whose config does not parse: its own load then says why)."""
    if not is_ensemble(config_file):
        return []
    from edged.core.config.model_config import parse_model_config

    try:
        config = parse_model_config(config_file.read_text(encoding="utf-8"), config_file.name)
    except (OSError, UnicodeDecodeError, EdgedError):
        return []
    return list(dict.fromkeys(step.model_name for step in config.ensemble_scheduling.step))


def is_ensemble(config_file: Path) -> bool:
    """Whether a model's config file names the ensemble platform (read without parsing the whole config)."""
    try:
        text = config_file.read_text(encoding="utf-8", errors="replace")
    except OSError:
        return False
    return re.search(r'(?m)^\s*platform\s*:\s*"ensemble"', text) is not None
