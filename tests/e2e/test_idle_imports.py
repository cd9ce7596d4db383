"""What an idle daemon has imported: parts that only some requests need are imported by the first of them.

Every module a Python process imports is compiled to bytecode; under PYTHONPYCACHEPREFIX the bytecode goes to a
directory of its own (whatever is cached beside the sources already), so the files there name exactly the
modules the daemon imported.
"""

from __future__ import annotations

import sys
from pathlib import Path

from server import REPO_ROOT, request, run_server


def _imported(prefix: Path, package: str) -> bool:
    tag = sys.implementation.cache_tag
    return any(prefix.rglob(f"site-packages/{package}/__pycache__/__init__.{tag}.pyc")) or any(
        prefix.rglob(f"site-packages/{package}/__init__.{tag}.pyc")
    )


def test_the_console_imports_its_template_engine_when_a_page_is_first_rendered(tmp_path: Path) -> None:
    prefix = tmp_path / "bytecode"
    environment = {"PYTHONPYCACHEPREFIX": str(prefix), "PYTHONDONTWRITEBYTECODE": None}
    with run_server([REPO_ROOT / "model_repository"], environment=environment) as server:
        assert any(prefix.rglob("*.pyc")), "the daemon wrote no bytecode under PYTHONPYCACHEPREFIX"
        assert not _imported(prefix, "jinja2")
        # No user yet: the first page is the first-run setup form.
        reply = request(f"127.0.0.1:{server.console_port}", "GET", "/setup")
        assert reply.status == 200 and b"<form" in reply.body
        assert _imported(prefix, "jinja2")
