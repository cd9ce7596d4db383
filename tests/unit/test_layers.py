"""The import rules of the package, read from the source: frontends -> core <- backends, the daemon above all.

Type-only imports count too: an arrow the type checker follows is an arrow a reader follows.
"""

from __future__ import annotations

import ast
from pathlib import Path
from typing import Final

import pytest

PACKAGE: Final = Path(__file__).resolve().parents[2] / "edged"

# package prefix -> prefixes it must never import
FORBIDDEN: Final = {
    "edged.core": (
        "edged.backends",
        "edged.config",
        "edged.frontends",
        "edged.daemon",
        "edged.cli",
        "edged.sync",
        "litestar",
        "uvicorn",
        "grpc",
        "prometheus_client",
    ),
    "edged.backends": ("edged.frontends", "edged.config", "edged.daemon", "edged.cli", "edged.state", "edged.sync"),
    # Frontends see the core through the service (and the plain records it answers with), never its internals.
    "edged.frontends": (
        "edged.backends",
        "edged.daemon",
        "edged.cli",
        "edged.state",
        "edged.sync",
        "edged.core.scheduling",
        "edged.core.repository.control",
        "edged.core.repository.manager.ModelRepositoryManager",
        "edged.core.repository.manager.ModelVersion",
    ),
    # One package per wire: a wire never reaches into another; what both answer is the core's.
    "edged.frontends.http": ("edged.frontends.grpc", "edged.frontends.metrics", "edged.frontends.console"),
    "edged.frontends.grpc": ("edged.frontends.http", "edged.frontends.metrics", "edged.frontends.console"),
    "edged.frontends.metrics": ("edged.frontends.http", "edged.frontends.grpc", "edged.frontends.console"),
    # The console is a door of its own: what it shares with the HTTP API (statuses, archive bodies) is a level up.
    "edged.frontends.console": ("edged.frontends.http", "edged.frontends.grpc", "edged.frontends.metrics"),
    "edged.state": ("edged.core", "edged.backends", "edged.frontends", "edged.daemon", "edged.sync"),
    # Sync produces local snapshots with the core's rules (names, confined paths) and the state store; it never
    # reaches a backend, a wire or the daemon, and serves nothing itself.
    "edged.sync": (
        "edged.backends",
        "edged.frontends",
        "edged.daemon",
        "edged.cli",
        "edged.config",
        "litestar",
        "uvicorn",
        "grpc",
        "prometheus_client",
    ),
    # Inside the core, from the bottom up: a request knows no repository or scheduler, a config no repository or
    # scheduler, the schedulers no repository; the service sits on top.
    "edged.core.request": ("edged.core.repository", "edged.core.scheduling", "edged.core.service"),
    "edged.core.config": ("edged.core.repository", "edged.core.scheduling", "edged.core.service"),
    "edged.core.scheduling": ("edged.core.repository", "edged.core.service"),
    "edged.core.repository": ("edged.core.service",),
    "edged.errors": ("edged.",),
    # The Python backend's process boundary: the stub runs model.py in its own process, possibly under another
    # interpreter without edged installed, so it may import only itself and the wire format both sides speak.
    "edged.backends.python.stub": ("edged.",),
    "edged.backends.python.wire": ("edged.",),
}
# Exceptions to the rules above, by owner.
ALLOWED: Final = {
    "edged.backends.python.stub": ("edged.backends.python.stub", "edged.backends.python.wire"),
    "edged.backends.python.wire": ("edged.backends.python.wire",),
}


def _module_name(path: Path) -> str:
    parts = list(path.relative_to(PACKAGE.parent).with_suffix("").parts)
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join(parts)


def _imports(path: Path) -> set[str]:
    tree = ast.parse(path.read_text(encoding="utf-8"), filename=str(path))
    found: set[str] = set()
    inside = path.is_relative_to(PACKAGE)
    name = _module_name(path) if inside else "edged.core.bad"
    package = name.rsplit(".", 1)[0] if path.name != "__init__.py" else name
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            found.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = package.split(".")[: len(package.split(".")) - node.level + 1]
                module = ".".join([*base, node.module] if node.module else base)
            else:
                module = node.module or ""
            found.add(module)
            found.update(f"{module}.{alias.name}" for alias in node.names)
    return found


def _modules() -> list[Path]:
    return sorted(p for p in PACKAGE.rglob("*.py") if "proto" not in p.relative_to(PACKAGE).parts[:1])


def _matches(name: str, prefix: str) -> bool:
    return name == prefix.rstrip(".") or name.startswith(prefix if prefix.endswith(".") else prefix + ".")


def _violations(module: str, imported: set[str]) -> list[str]:
    rules = [banned for owner, banned in FORBIDDEN.items() if _matches(module, owner)]
    allowed = [prefix for owner, prefixes in ALLOWED.items() if _matches(module, owner) for prefix in prefixes]
    return sorted(
        {
            name
            for name in imported
            for banned in rules
            for prefix in banned
            if _matches(name, prefix) and not _matches(name, module) and not any(_matches(name, a) for a in allowed)
        }
    )


@pytest.mark.parametrize("path", _modules(), ids=lambda p: str(p.relative_to(PACKAGE)))
def test_imports_run_one_way(path: Path) -> None:
    module = _module_name(path)
    wrong = _violations(module, _imports(path))
    assert not wrong, f"{module} imports {', '.join(wrong)}"


def test_the_checker_sees_a_violation(tmp_path: Path) -> None:
    source = tmp_path / "bad.py"
    source.write_text("from edged.backends import BackendRegistry\nif True:\n    import litestar.app\n")
    imported = _imports(source)
    assert _violations("edged.core.bad", imported) == [
        "edged.backends",
        "edged.backends.BackendRegistry",
        "litestar.app",
    ]
    assert _violations("edged.daemon", imported) == []
    assert _violations("edged.sync.runner", {"edged.core.names", "edged.state.store"}) == []
    assert _violations("edged.sync.runner", {"edged.backends.onnxruntime"}) == ["edged.backends.onnxruntime"]
    assert _violations("edged.core.repository.manager", {"edged.sync.snapshots"}) == ["edged.sync.snapshots"]
    assert _violations("edged.backends.python.stub.main", {"edged.backends.python.wire.ipc"}) == []
    assert _violations("edged.backends.python.stub.main", {"edged.core.request.tensors"}) == [
        "edged.core.request.tensors"
    ]
