"""The documentation (docs/, mkdocs.yml; scripts/test builds it with `mkdocs build --strict`): the settings tables
are made from edged.config.OPTIONS and cover every setting, no page keeps a hand-written table of flags, the quick
start's install command for sync names what the sync extra pins, and the README's links lead to pages that exist.

Offline and in-process: the hook is called directly, without building the site.
"""

from __future__ import annotations

import importlib.util
import json
import re
from pathlib import Path
from types import ModuleType
from typing import Final

import pytest

from edged.config.options import OPTIONS
from edged.sync.errors import INSTALL_HINT, SourceProblem

REPO_ROOT: Final = Path(__file__).resolve().parents[2]
DOCS: Final = REPO_ROOT / "docs"
# A Markdown link or image whose target is a relative path: [text](target) or ![alt](target).
RELATIVE_LINK: Final = re.compile(r"!?\[[^\]]*\]\((?!https?://|mailto:|#)([^)\s]+)\)")


def _hook() -> ModuleType:
    # docs/hooks/ is no package: MkDocs loads the file by its path (mkdocs.yml's hooks:), and so does this test.
    spec = importlib.util.spec_from_file_location("docs_options_hook", DOCS / "hooks" / "options.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def _pages() -> list[Path]:
    return sorted(DOCS.glob("*.md"))


def test_configuration_page_lists_every_setting() -> None:
    page = _hook().expand((DOCS / "configuration.md").read_text())
    missing = [
        option.name
        for option in OPTIONS
        if not all(f"`{name}" in page for name in (option.flag, option.key, option.env))
    ]
    assert not missing, f"settings missing from docs/configuration.md's generated table: {missing}"


def test_table_rows_follow_the_options() -> None:
    hook = _hook()
    table = hook.expand("<!-- options: http-port sync-max-error-rate state-dir model-control-mode -->")
    rows = table.splitlines()[2:]
    assert len(rows) == 4
    port, mode, state_dir, rate = rows  # in the table's order, not the marker's
    assert port.startswith("| `--http-port PORT`<br>`http_port`<br>`EDGED_HTTP_PORT` | `8000` |")
    assert "From 0 to 65535." in port
    assert "/var/lib/edged under systemd" in state_dir
    assert 'packaged: `"/var/lib/edged"`' in state_dir
    assert "One of `none`, `poll`, `explicit`." in mode
    assert 'packaged: `"explicit"`' in mode
    assert "`0.1`" in rate and "From 0 to 1." in rate


def test_a_marker_that_names_no_setting_fails_the_build() -> None:
    hook = _hook()
    with pytest.raises(hook.UnknownOptionError, match="no-such-setting"):
        hook.expand("<!-- options: http-port no-such-setting -->")


def test_every_marker_in_the_pages_expands() -> None:
    hook = _hook()
    for page in _pages():
        expanded = hook.expand(page.read_text())
        assert not re.search(r"(?m)^\s*<!-- options", expanded), f"{page.name}: a marker was left unexpanded"


def test_no_page_writes_a_settings_table_by_hand() -> None:
    # A row that starts with a flag is a table of settings: it belongs to the hook, or it drifts from the code.
    hand_written = [
        f"{page.name}:{number}"
        for page in _pages()
        for number, line in enumerate(page.read_text().splitlines(), 1)
        if re.match(r"\|\s*`--[a-z]", line)
    ]
    assert not hand_written, f"hand-written settings rows (use <!-- options: NAME ... -->): {hand_written}"


def test_quick_start_installs_the_sync_package_and_quotes_its_error() -> None:
    """On a packaged device the sync clients come from the package build-deb makes, and the journal line the page
    quotes for a device without them is the one edged writes."""
    quickstart = " ".join((DOCS / "quickstart.md").read_text().split())
    assert "sudo apt install ./dist/edged-sync_0.1.0_amd64.deb" in quickstart
    assert "edged-sync_${deb_version}_${arch}.deb" in (REPO_ROOT / "packaging/build-deb").read_text()
    quoted = f"exiting: {SourceProblem.MISSING_CLIENT.value}: s3://... needs obstore: {INSTALL_HINT}"
    assert quoted in quickstart


def test_readme_links_lead_to_files_that_exist() -> None:
    readme = (REPO_ROOT / "README.md").read_text()
    targets = RELATIVE_LINK.findall(readme)
    assert any(target.startswith("docs/") for target in targets)
    broken = [target for target in targets if not (REPO_ROOT / target.split("#")[0]).exists()]
    assert not broken, f"README.md links to files that do not exist: {broken}"
    # Every page of the site is reachable from the README, through the index at least.
    assert "docs/index.md" in targets or all(f"docs/{page.name}" in targets for page in _pages())


def test_every_page_is_in_the_navigation() -> None:
    mkdocs = (REPO_ROOT / "mkdocs.yml").read_text()
    listed = set(re.findall(r"^\s+- (?:[^:\n]+: )?([\w-]+\.md)\s*$", mkdocs, re.MULTILINE))
    assert listed == {page.name for page in _pages()}


def test_the_api_reference_has_every_operation_of_the_served_document() -> None:
    spec = importlib.util.spec_from_file_location("docs_openapi_hook", DOCS / "hooks" / "openapi.py")
    assert spec is not None and spec.loader is not None
    hook = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(hook)
    from edged.frontends.http.openapi import openapi_document

    document = json.loads(openapi_document())
    page = hook.on_page_markdown("# x\n\n<!-- openapi -->\n", None, None, None)
    operations = [(m, p) for p, item in document["paths"].items() for m in hook.METHODS if m in item]
    assert len(operations) > 40
    for method, path in operations:
        assert f"### `{method.upper()} {path}`" in page, (method, path)
    assert "<!-- openapi -->" in (DOCS / "api-reference.md").read_text(encoding="utf-8")


def test_the_screenshots_shown_are_the_ones_the_console_tests_take() -> None:
    """Every image the pages show under screenshots/ is one a console test saves (scripts/screenshots copies them
    from a run of those tests), and web/screenshots/ holds no image that no page shows."""
    shown = set()
    for page in [*_pages(), REPO_ROOT / "README.md"]:
        shown |= set(re.findall(r"screenshots/([a-z0-9-]+)\.png", page.read_text()))
    taken = []  # the names the tests pass to screenshot(), an f-string's fields as wildcards
    for test in (REPO_ROOT / "tests/e2e").glob("test_console_*.py"):
        for literal in re.findall(r"screenshot\([^,]+,\s*(f?\"[^\"]+\")", test.read_text()):
            text = literal.removeprefix("f").strip('"')
            taken.append(re.compile(re.sub(r"\\\{[^}]*\\\}", "[a-z0-9-]+", re.escape(text)) + "$"))
    assert shown, "no page shows a screenshot"
    untaken = sorted(name for name in shown if not any(pattern.match(name) for pattern in taken))
    assert untaken == [], f"shown but taken by no console test: {untaken}"
    kept = {path.stem for path in (REPO_ROOT / "web/screenshots").glob("*.png")}
    assert kept == shown, f"missing: {sorted(shown - kept)}, shown by no page: {sorted(kept - shown)}"
