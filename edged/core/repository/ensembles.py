"""Ensembles as model control orders them: an ensemble loads after the models it is made of, which it checks at
load, so control tells one from its folder before loading anything."""

from __future__ import annotations

import re
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from collections.abc import Iterable
    from pathlib import Path

    from edged.core.repository.scan import ScanResult


def ensembles_last(names: Iterable[str], scan: ScanResult) -> tuple[list[str], list[str]]:
    """``names`` in two groups to load one after the other: the ensembles second."""
    ensembles = [name for name in names if name in scan.models and is_ensemble(scan.models[name].path)]
    return [name for name in names if name not in ensembles], ensembles


def is_ensemble(model_dir: Path) -> bool:
    """Whether a model folder's config names the ensemble platform (read without parsing the whole config)."""
    try:
        text = (model_dir / "config.pbtxt").read_text(encoding="utf-8", errors="replace")
    except OSError:
        return False
    return re.search(r'(?m)^\s*platform\s*:\s*"ensemble"', text) is not None
