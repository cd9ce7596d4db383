"""The virtualenv's size by distribution, and what edged needs of it at run time: its requirements without extras,
followed recursively; what only the ``sync`` extra adds; what only tests and tools need."""

from __future__ import annotations

import importlib.metadata
import sys
import sysconfig
from collections.abc import Iterator
from pathlib import Path
from typing import Any, Final

from packaging.requirements import Requirement
from packaging.utils import canonicalize_name

TOP_DISTRIBUTIONS: Final = 25


def _runtime_names(extras: tuple[str, ...]) -> set[str]:
    """edged's requirements with ``extras`` (none: only the run-time ones), followed recursively with each
    requirement's own extras, as canonical distribution names."""
    environment = {"extra": ""}
    wanted: list[tuple[str, tuple[str, ...]]] = [("edged", extras)]
    seen: set[tuple[str, str]] = set()
    names: set[str] = set()
    while wanted:
        name, with_extras = wanted.pop()
        for extra in ("", *with_extras):
            if (name, extra) in seen:
                continue
            seen.add((name, extra))
            names.add(name)
            try:
                requires = importlib.metadata.requires(name) or []
            except importlib.metadata.PackageNotFoundError:
                continue
            for text in requires:
                requirement = Requirement(text)
                if requirement.marker is None or requirement.marker.evaluate(environment | {"extra": extra}):
                    wanted.append((canonicalize_name(requirement.name), tuple(sorted(requirement.extras))))
    return names


def _files(dist: importlib.metadata.Distribution) -> Iterator[Path]:
    """The files the distribution's RECORD lists, and the bytecode Python wrote beside its modules since (which
    RECORD does not list when the installer did not compile them)."""
    tag = sys.implementation.cache_tag
    for file in dist.files or []:
        path = Path(str(dist.locate_file(file)))
        yield path
        if path.suffix == ".py":
            for optimization in ("", ".opt-1", ".opt-2"):
                yield path.parent / "__pycache__" / f"{path.stem}.{tag}{optimization}.pyc"


def _installed() -> list[dict[str, Any]]:
    """Every distribution in this interpreter's site-packages with the size of its files (bytecode included)."""
    site = Path(sysconfig.get_paths()["purelib"])
    runtime = _runtime_names(())
    sync = _runtime_names(("sync",)) - runtime
    rows: list[dict[str, Any]] = []
    counted: set[Path] = set()
    for dist in importlib.metadata.distributions(path=[str(site)]):
        size = 0
        for path in _files(dist):
            if path in counted:
                continue
            counted.add(path)
            try:
                size += path.lstat().st_size
            except OSError:  # listed but not there (the .pyc of a file never imported, say)
                continue
        name = canonicalize_name(dist.metadata["Name"])
        use = "run time" if name in runtime else "sync" if name in sync else "tests/tools"
        rows.append({"distribution": name, "version": dist.version, "bytes": size, "use": use})
    rows.sort(key=lambda row: int(row["bytes"]), reverse=True)
    return rows


def measure_installed() -> dict[str, Any]:
    rows = _installed()
    total = sum(int(row["bytes"]) for row in rows)
    by_use: dict[str, int] = {}
    for row in rows:
        by_use[row["use"]] = by_use.get(row["use"], 0) + int(row["bytes"])
    print()
    print(
        f"installed in {Path(sysconfig.get_paths()['purelib'])} ({len(rows)} distributions, the files their RECORDs "
        f"list, with their bytecode): {total / 1e6:.1f} MB; "
        + ", ".join(f"{use} {size / 1e6:.1f} MB" for use, size in sorted(by_use.items(), key=lambda kv: -kv[1]))
    )
    print("  run time: edged's requirements without extras, recursively; sync: what only the sync extra adds")
    print(f"  {'MB':>7}  {'use':<12}distribution")
    for row in rows[:TOP_DISTRIBUTIONS]:
        print(f"  {int(row['bytes']) / 1e6:>7.1f}  {row['use']:<12}{row['distribution']} {row['version']}")
    for use in ("run time", "sync"):
        # What each run-time dependency costs, however far down the whole list it is.
        mine = [row for row in rows if row["use"] == use]
        large = [row for row in mine if int(row["bytes"]) >= 500_000]
        rest = sum(int(row["bytes"]) for row in mine[len(large) :])
        listed = ", ".join(f"{row['distribution']} {int(row['bytes']) / 1e6:.1f}" for row in large)
        print(f"  {use}, MB each: {listed}; {len(mine) - len(large)} more under 0.5 MB: {rest / 1e6:.1f}")
    return {
        "site_packages": str(Path(sysconfig.get_paths()["purelib"])),
        "total_bytes": total,
        "bytes_by_use": by_use,
        "distributions": rows,
    }
