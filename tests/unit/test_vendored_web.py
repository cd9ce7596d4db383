"""The vendored front-end assets (scripts/vendor-web): the committed files match their manifests and the pins.

Offline: this checks what is committed; fetching from the npm registry is the script's job, not the tests'.
"""

from __future__ import annotations

import importlib.resources
import json
import shutil
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any, Final

import pytest

# scripts/ is not a package, and the vendoring script is build tooling rather than part of edged, so the tests
# reach it through the path instead of an install.
sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "scripts"))

import vendor_web  # type: ignore[import-not-found, unused-ignore]

REPO_ROOT: Final = Path(__file__).resolve().parents[2]
# What a device downloads per page (htmx, uPlot and its stylesheet are about 100 KiB together): a file past this
# is a wrong file (an unminified build, a source map, a bundle of everything), not an update.
MAX_SHIPPED_FILE_BYTES: Final = 256 * 1024
MAX_SHIPPED_TOTAL_BYTES: Final = 512 * 1024
MAX_TEST_FILE_BYTES: Final = 2 * 1024 * 1024  # axe.min.js is about 650 KiB
# A phrase of each license's text, so a LICENSE file that is present but holds another license is caught.
LICENSE_TEXT: Final = {
    "0BSD": "Permission to use, copy, modify, and/or distribute this software for\nany purpose",
    "MIT": "Permission is hereby granted, free of charge",
    "MPL-2.0": "Mozilla Public License, version 2.0",
}


def _manifest(destination: str) -> dict[str, dict[str, Any]]:
    manifest = json.loads((REPO_ROOT / destination / vendor_web.MANIFEST).read_text(encoding="utf-8"))
    return {entry["name"]: entry for entry in manifest["packages"]}


def _check(root: Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [str(REPO_ROOT / "scripts/vendor-web"), "--check", "--root", str(root)],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )


def test_the_committed_files_match_the_manifests_and_the_pins() -> None:
    assert vendor_web.check(REPO_ROOT) == []
    result = _check(REPO_ROOT)
    assert result.returncode == 0, result.stderr


def test_the_pins_are_what_the_manifests_record() -> None:
    pins = {pin.name: pin for pin in vendor_web.PINS}
    assert {pin.destination for pin in pins.values()} == {"web/static/vendor", "tests/vendor"}
    recorded = {
        name: entry for destination in vendor_web.DESTINATIONS for name, entry in _manifest(destination).items()
    }
    assert recorded.keys() == pins.keys()
    for name, pin in pins.items():
        entry = recorded[name]
        assert (entry["version"], entry["license"], entry["integrity"]) == (pin.version, pin.license, pin.sha512)
        assert entry["source"] == f"https://registry.npmjs.org/{name}/-/{name}-{pin.version}.tgz"
        assert (REPO_ROOT / pin.destination / f"{name}-{pin.version}").is_dir()
    # The console's packages ship; axe-core is for the tests only.
    assert set(_manifest("web/static/vendor")) == {"htmx.org", "uplot"}
    assert set(_manifest("tests/vendor")) == {"axe-core"}


def test_every_package_carries_its_license() -> None:
    for pin in vendor_web.PINS:
        directory = REPO_ROOT / pin.destination / pin.directory
        assert pin.licenses, pin.name
        for name in pin.licenses:
            assert (directory / name).stat().st_size > 0, f"{pin.name}: {name}"
        assert LICENSE_TEXT[pin.license] in (directory / "LICENSE").read_text(encoding="utf-8"), pin.name


def test_the_debian_copyright_names_every_shipped_package() -> None:
    copyright_text = (REPO_ROOT / "packaging/debian/copyright").read_text(encoding="utf-8")
    for name, entry in _manifest("web/static/vendor").items():
        stanza = f"Files: web/static/vendor/{name}-*\n"
        assert stanza in copyright_text, name
        following = copyright_text.split(stanza, 1)[1].splitlines()
        assert f"License: {entry['license']}" in following[:3], name


def test_no_vendored_file_is_larger_than_it_should_be() -> None:
    shipped = [p for p in (REPO_ROOT / "web/static/vendor").rglob("*") if p.is_file()]
    assert shipped
    for path in shipped:
        assert path.stat().st_size <= MAX_SHIPPED_FILE_BYTES, path
    assert sum(p.stat().st_size for p in shipped) <= MAX_SHIPPED_TOTAL_BYTES
    for path in (REPO_ROOT / "tests/vendor").rglob("*"):
        assert not path.is_file() or path.stat().st_size <= MAX_TEST_FILE_BYTES, path


def test_the_package_reaches_the_shipped_assets() -> None:
    # The way the console finds them, installed or run from the checkout (edged/web links to web/).
    vendor = importlib.resources.files("edged") / "web" / "static" / "vendor"
    for name, entry in _manifest("web/static/vendor").items():
        for file in entry["files"]:
            assert (vendor / entry["directory"] / file).is_file(), f"{name}: {file}"


def _flip_a_byte(path: Path) -> None:
    data = bytearray(path.read_bytes())
    data[len(data) // 2] ^= 0x01
    path.write_bytes(bytes(data))


def _bump_version(path: Path) -> None:
    manifest = json.loads(path.read_text(encoding="utf-8"))
    manifest["packages"][0]["version"] = "2.0.12"
    path.write_text(json.dumps(manifest), encoding="utf-8")


# What is changed in a copy of the vendored files -> how, and what the check must then name.
TAMPERINGS: Final[dict[str, tuple[str, Callable[[Path], object], str]]] = {
    "changed": ("web/static/vendor/htmx.org-2.0.11/htmx.min.js", _flip_a_byte, ""),
    "truncated": ("web/static/vendor/uplot-1.6.32/uPlot.min.css", lambda p: p.write_bytes(p.read_bytes()[:-1]), ""),
    "license removed": ("web/static/vendor/uplot-1.6.32/LICENSE", Path.unlink, ": license missing"),
    "test file changed": ("tests/vendor/axe-core-4.14.1/axe.min.js", _flip_a_byte, ""),
    "file added": ("web/static/vendor/htmx.org-2.0.11/htmx.js", lambda p: p.write_text("var htmx;"), ""),
    "directory added": ("web/static/vendor/htmx.org-1.9.12", Path.mkdir, ""),
    "manifest edited": ("web/static/vendor/MANIFEST.json", _bump_version, ": htmx.org version '2.0.12'"),
}


@pytest.mark.parametrize("tampering", list(TAMPERINGS))
def test_check_names_what_differs(tmp_path: Path, tampering: str) -> None:
    for destination in vendor_web.DESTINATIONS:
        shutil.copytree(REPO_ROOT / destination, tmp_path / destination)
    assert _check(tmp_path).returncode == 0
    relative, tamper, why = TAMPERINGS[tampering]
    tamper(tmp_path / relative)
    result = _check(tmp_path)
    assert result.returncode == 1
    assert f"vendor-web: {relative}{why}" in result.stderr, result.stderr
