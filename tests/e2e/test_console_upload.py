"""The console's upload page in a real browser against the real daemon: archives built here from modelgen's add_sub
(a zip through the file picker, a folder through the folder picker), the progress bar, the result, inference on
what was installed; a broken config and a tar-slip archive refused with nothing changed; the roles and the CSRF
token; accessibility and screenshots."""

from __future__ import annotations

import http.client
import io
import json
import re
import tarfile
from collections.abc import Iterator
from pathlib import Path
from typing import Final

import modelgen  # type: ignore[import-not-found, unused-ignore]
import numpy as np
import pytest
import tritonclient.http as httpclient
from archives import zip_folder
from browser import PHONE, assert_accessible, open_page, screenshot
from console_session import browser_login, console_server, http_login
from playwright.sync_api import Browser, FilePayload, Page, expect
from server import ADD_SUB_INPUT0, ADD_SUB_INPUT1, Server, add_sub_inputs, request

pytest_plugins = ("console_fixtures",)

# Chromium logs each 4xx answer as a failed load: an upload's refusal, which the page shows, is no defect of it.
REFUSAL_LOGGED: Final = re.compile(
    r"^Failed to load resource: the server responded with a status of 4\d\d .*"
    r"\(https?://[^/]+(/upload|/models/[^/?]+/upload\?activate=\w+)\)$"
)
# Small, so that the limit's test moves kilobytes (add_sub's archives are smaller still).
MAX_UPLOAD: Final = 256 * 1024
# Line 6 of add_sub's config (max_batch_size) with a brace that closes nothing.
BROKEN_LINE: Final = 6


# --- the daemon and the archives ----------------------------------------------------------------------------


@pytest.fixture(scope="module")
def scratch(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The repository and the state directory: nothing else may appear in it."""
    return tmp_path_factory.mktemp("console-upload")


@pytest.fixture(scope="module")
def sources(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """Where model folders to be archived or picked are written (never served from here)."""
    return tmp_path_factory.mktemp("console-upload-sources")


@pytest.fixture(scope="module")
def server(scratch: Path) -> Iterator[Server]:
    repository = scratch / "repository"
    modelgen.write_add_sub(repository / "resident", max_batch_size=8, dims=16, dtype="FP32")
    with console_server([repository], scratch / "state", f"--upload-max-bytes={MAX_UPLOAD}") as running:
        yield running


def add_sub(sources: Path, name: str) -> Path:
    """add_sub's folder as model ``name`` (its config names it so)."""
    folder = sources / name
    if not folder.exists():
        modelgen.write_add_sub(folder, max_batch_size=8, dims=16, dtype="FP32")
        config = folder / "config.pbtxt"
        config.write_text(config.read_text().replace('name: "add_sub"', f'name: "{name}"'))
    return folder


def tar_of(*members: tuple[str, bytes]) -> bytes:
    buffer = io.BytesIO()
    with tarfile.open(fileobj=buffer, mode="w:gz", format=tarfile.GNU_FORMAT) as archive:
        for name, data in members:
            info = tarfile.TarInfo(name)
            info.size = len(data)
            info.mode = 0o644
            archive.addfile(info, io.BytesIO(data))
    return buffer.getvalue()


def tree(root: Path) -> dict[str, int]:
    return {str(p.relative_to(root)): p.lstat().st_size for p in sorted(root.rglob("*"))}


def model_index(server: Server) -> list[tuple[str, str, str]]:
    reply = request(server.http_url, "POST", "/v2/repository/index", "{}", {"Content-Type": "application/json"})
    assert reply.status == 200, reply.body
    return sorted((e["name"], e.get("version", ""), e.get("state", "")) for e in reply.json())


def infer(server: Server, model: str) -> None:
    with httpclient.InferenceServerClient(server.http_url) as client:
        result = client.infer(model, add_sub_inputs())
    np.testing.assert_array_equal(result.as_numpy("OUTPUT0"), ADD_SUB_INPUT0 + ADD_SUB_INPUT1)
    np.testing.assert_array_equal(result.as_numpy("OUTPUT1"), ADD_SUB_INPUT0 - ADD_SUB_INPUT1)


def nothing_left_behind(scratch: Path) -> None:
    uploads = scratch / "state" / "uploads"
    assert not uploads.exists() or not any(uploads.iterdir())


@pytest.fixture
def refusing_page(browser: Browser) -> Iterator[Page]:
    """A desktop page on which uploads (or the upload page) are refused: watched as ``page`` is, but for the
    refusals' own log lines."""
    with open_page(browser, check=False) as watched:
        yield watched.page
    problems = watched.problems
    problems.console_errors = [line for line in problems.console_errors if not REFUSAL_LOGGED.match(line)]
    assert not problems, f"the page had problems:\n{problems.report()}"


# --- the page -------------------------------------------------------------------------------------------------


def open_upload(page: Page, server: Server, user: str = "otto") -> None:
    browser_login(page, server.console_url, user)
    page.goto(f"{server.console_url}/upload")
    expect(page.get_by_role("heading", name="Upload a model")).to_be_visible()


def pick(page: Page, name: str, mime_type: str, data: bytes) -> None:
    """The archive chosen in the drop zone's file picker, as if picked from the disk."""
    page.set_input_files("#archive-file", files=[FilePayload(name=name, mimeType=mime_type, buffer=data)])


def send(page: Page, *, activate: bool) -> None:
    checkbox = page.get_by_label("Activate after upload")
    if activate:
        checkbox.check()
    else:
        checkbox.uncheck()
    page.get_by_role("button", name="Upload").click()


def progress_of(page: Page) -> tuple[float, float]:
    value, maximum = page.eval_on_selector("#upload-progress", "p => [p.value, p.max]")
    return float(value), float(maximum)


def test_an_archive_picked_in_the_drop_zone_is_installed_with_its_progress_and_serves(
    page: Page, server: Server, sources: Path
) -> None:
    archive = zip_folder(add_sub(sources, "fresh"), "fresh/")
    open_upload(page, server)
    expect(page.locator("#upload-progress-box")).to_be_hidden()
    upload_button = page.get_by_role("button", name="Upload")
    expect(upload_button).to_be_disabled()
    pick(page, "fresh.zip", "application/zip", archive)
    # The name is taken from the archive's when none is typed; the chosen archive is named.
    expect(page.get_by_label("Model name")).to_have_value("fresh")
    expect(page.locator("#chosen")).to_contain_text("fresh.zip")
    expect(upload_button).to_be_enabled()
    send(page, activate=True)
    expect(page.locator("#upload-progress")).to_be_visible()
    result = page.locator("#upload-result .notice")
    expect(result).to_contain_text("Model fresh version 1 installed as a new model")
    expect(result).to_contain_text("loaded and serving")
    expect(result.get_by_role("link", name="Open model fresh")).to_have_attribute("href", "/models/fresh")
    value, maximum = progress_of(page)
    assert maximum == len(archive) and value == maximum, (value, maximum)
    expect(page.locator("#upload-progress-text")).to_have_text(
        f"{len(archive) / 1024:.1f} of {len(archive) / 1024:.1f} KiB"
    )
    screenshot(page, "console-upload-progress")
    assert_accessible(page)
    infer(server, "fresh")
    events = request(server.http_url, "GET", "/v2/edged/models/fresh/history").json()["events"]
    uploaded = [event for event in events if event["state"] == "UPLOADED"]
    # The console's upload: its source is the console (an API upload's is "upload"), by its user.
    assert uploaded and uploaded[0]["source"] == "console" and uploaded[0]["actor"] == "user:otto", events


def test_an_archive_dropped_on_the_drop_zone_is_installed(page: Page, server: Server, sources: Path) -> None:
    folder = add_sub(sources, "dropped")
    archive = tar_of(
        *((p.relative_to(sources).as_posix(), p.read_bytes()) for p in sorted(folder.rglob("*")) if p.is_file())
    )
    open_upload(page, server)
    # What the browser hands the page when a file is dropped on it: a DataTransfer holding the file.
    transfer = page.evaluate_handle(
        """([name, bytes]) => {
            const transfer = new DataTransfer();
            transfer.items.add(new File([new Uint8Array(bytes)], name, { type: "application/gzip" }));
            return transfer;
        }""",
        ["dropped.tar.gz", list(archive)],
    )
    page.dispatch_event("#dropzone", "dragover", {"dataTransfer": transfer})
    expect(page.locator("#dropzone")).to_have_class(re.compile(r"\bover\b"))
    page.dispatch_event("#dropzone", "drop", {"dataTransfer": transfer})
    expect(page.locator("#dropzone")).not_to_have_class(re.compile(r"\bover\b"))
    expect(page.get_by_label("Model name")).to_have_value("dropped")
    expect(page.locator("#chosen")).to_contain_text("dropped.tar.gz")
    send(page, activate=True)
    expect(page.locator("#upload-result .notice")).to_contain_text("Model dropped version 1 installed as a new model")
    infer(server, "dropped")


def test_a_version_archive_becomes_the_next_version_without_activating(
    page: Page, server: Server, scratch: Path
) -> None:
    version_files = scratch / "repository" / "resident" / "1"
    archive = tar_of(*((f"1/{p.name}", p.read_bytes()) for p in sorted(version_files.iterdir())))
    open_upload(page, server)
    page.get_by_label("Model name").fill("resident")
    pick(page, "v.tar.gz", "application/gzip", archive)
    expect(page.get_by_label("Model name")).to_have_value("resident")  # what was typed is kept
    send(page, activate=False)
    result = page.locator("#upload-result .notice")
    expect(result).to_contain_text("Model resident version 2 installed as its next version")
    expect(result).to_contain_text("installed, not loaded")
    assert (scratch / "repository" / "resident" / "2" / "model.onnx").is_file()
    assert ("resident", "2", "READY") not in model_index(server)


def test_a_broken_config_shows_its_line_and_nothing_changes(
    refusing_page: Page, server: Server, sources: Path, scratch: Path
) -> None:
    page = refusing_page
    folder = add_sub(sources, "broken")
    config = folder / "config.pbtxt"
    lines = config.read_text().splitlines()
    assert lines[BROKEN_LINE - 1].startswith("max_batch_size")
    lines[BROKEN_LINE - 1] += " }"
    config.write_text("\n".join(lines) + "\n")
    repository_before, index_before = tree(scratch / "repository"), model_index(server)
    open_upload(page, server)
    pick(page, "broken.zip", "application/zip", zip_folder(folder, "broken/"))
    send(page, activate=True)
    alert = page.locator("#upload-result .alert")
    expect(alert).to_contain_text("nothing was changed")
    place = alert.locator(".problems li code").first
    expect(place).to_contain_text(f"broken/config.pbtxt:{BROKEN_LINE}")
    screenshot(page, "console-upload-error")
    assert_accessible(page)
    assert tree(scratch / "repository") == repository_before
    assert not (scratch / "repository" / "broken").exists()
    assert model_index(server) == index_before
    nothing_left_behind(scratch)


def test_a_tar_slip_archive_is_refused_and_nothing_is_written(
    refusing_page: Page, server: Server, scratch: Path
) -> None:
    page = refusing_page
    before = tree(scratch / "repository")
    archive = tar_of(("../evil.txt", b"owned"), ("1/model.onnx", b"x"))
    open_upload(page, server)
    page.get_by_label("Model name").fill("slipped")
    pick(page, "slip.tar.gz", "application/gzip", archive)
    send(page, activate=False)
    alert = page.locator("#upload-result .alert")
    expect(alert).to_contain_text("refused")
    expect(alert.locator(".problems li")).to_contain_text("'..'")
    assert tree(scratch / "repository") == before
    # Not inside this module's folder (the state directory, where archives are extracted), nor beside it.
    assert not any(path.name.startswith("evil") for path in scratch.rglob("*"))
    assert not (scratch.parent / "evil.txt").exists()
    nothing_left_behind(scratch)


def test_a_folder_is_packed_in_the_browser_and_installed(
    page: Page, server: Server, sources: Path, scratch: Path
) -> None:
    folder = add_sub(sources, "from-folder")
    # Model-level files beside the versions, one with a path too long for a tar header's name field alone.
    (folder / "labels.txt").write_text("sum\ndifference\n")
    deep = folder / ("notes-" + "n" * 60) / ("more-" + "m" * 60)
    deep.mkdir(parents=True)
    (deep / "readme.txt").write_text("kept\n")
    open_upload(page, server)
    page.set_input_files("#archive-folder", str(folder))
    expect(page.get_by_label("Model name")).to_have_value("from-folder")
    expect(page.locator("#chosen")).to_contain_text("folder from-folder/ (4 files")
    send(page, activate=True)
    expect(page.locator("#upload-result .notice")).to_contain_text("Model from-folder version 1 installed")
    infer(server, "from-folder")
    installed = scratch / "repository" / "from-folder"
    assert (installed / "labels.txt").read_text() == "sum\ndifference\n"
    assert (installed / deep.relative_to(folder) / "readme.txt").read_text() == "kept\n"


def test_an_archive_over_the_size_limit_is_refused(refusing_page: Page, server: Server, scratch: Path) -> None:
    page = refusing_page
    before = tree(scratch / "repository")
    open_upload(page, server)
    page.get_by_label("Model name").fill("too-big")
    pick(page, "too-big.zip", "application/zip", b"PK\x03\x04" + bytes(MAX_UPLOAD))
    send(page, activate=False)
    alert = page.locator("#upload-result .alert")
    expect(alert).to_contain_text("nothing was changed")
    expect(alert.locator(".problems li")).to_contain_text("limit")
    assert tree(scratch / "repository") == before
    nothing_left_behind(scratch)


# --- refusals sent by hand ------------------------------------------------------------------------------------


def test_viewers_and_requests_without_the_token_are_refused(server: Server, sources: Path, scratch: Path) -> None:
    archive = zip_folder(add_sub(sources, "by-hand"), "by-hand/")
    zip_type = {"Content-Type": "application/zip"}
    viewer = http_login(server.console_port, "vera")
    status, _, text = viewer.request("GET", "/upload")
    assert status == 403 and "Not allowed" in text, text[:300]
    status, _, _ = viewer.request(
        "POST", "/models/by-hand/upload", archive, {**zip_type, "X-CSRF-Token": viewer.csrf_token}
    )
    assert status == 403
    operator = http_login(server.console_port, "otto")
    status, _, text = operator.request("POST", "/models/by-hand/upload", archive, zip_type)
    assert status == 403 and "security token" in text
    status, _, _ = operator.request(
        "POST", "/models/by-hand/upload", archive, {**zip_type, "X-CSRF-Token": "not-the-token"}
    )
    assert status == 403
    status, _, _ = operator.request(
        "POST",
        "/models/by-hand/upload",
        archive,
        {**zip_type, "X-CSRF-Token": operator.csrf_token, "Origin": "http://elsewhere.example"},
    )
    assert status == 403
    token = {"X-CSRF-Token": operator.csrf_token}
    status, _, text = operator.request(
        "POST", "/models/by-hand/upload", archive, {"Content-Type": "application/json", **token}
    )
    assert status == 415 and "zip" in json.loads(text)["error"]
    status, _, text = operator.request("POST", "/models/a%01b/upload", archive, {**zip_type, **token})
    assert status == 400 and "cannot be a model name" in json.loads(text)["error"]
    status, text = _chunked(server.console_port, operator.cookie, archive, {**zip_type, **token})
    assert status == 411 and "Content-Length" in json.loads(text)["error"]
    assert not (scratch / "repository" / "by-hand").exists()
    nothing_left_behind(scratch)
    # The same request with the token and a length installs it: the refusals above were for what they lacked.
    status, _, text = operator.request("POST", "/models/by-hand/upload?activate=false", archive, {**zip_type, **token})
    assert status == 200, text
    answer = json.loads(text)
    assert answer == {"model": "by-hand", "version": 1, "created": True, "loaded": False, "problems": [],
                      "probation_s": None, "error": None}  # fmt: skip


def _chunked(port: int, cookie: str, body: bytes, headers: dict[str, str]) -> tuple[int, str]:
    connection = http.client.HTTPConnection("127.0.0.1", port, timeout=30)
    try:
        pieces = [body[i : i + 4096] for i in range(0, len(body), 4096)]
        connection.request(
            "POST", "/models/by-hand/upload", body=iter(pieces), headers={"Cookie": cookie, **headers},
            encode_chunked=True,
        )  # fmt: skip
        response = connection.getresponse()
        return response.status, response.read().decode()
    finally:
        connection.close()


# --- how it looks -------------------------------------------------------------------------------------------


def test_the_page_reads_well_light_dark_on_a_phone_and_without_javascript(
    page: Page, browser: Browser, server: Server
) -> None:
    open_upload(page, server)
    names = page.locator("#model-names option").evaluate_all("options => options.map(o => o.value)")
    assert "resident" in names, names
    screenshot(page, "console-upload")
    assert_accessible(page)
    for name, options in (
        ("console-upload-dark", {"color_scheme": "dark"}),
        ("console-upload-phone", {"viewport": PHONE}),
    ):
        with open_page(browser, **options) as watched:
            open_upload(watched.page, server)
            screenshot(watched.page, name)
            assert_accessible(watched.page)
    with open_page(browser, javascript=False) as watched:
        open_upload(watched.page, server)
        # (Chromium with scripts turned off by the test still parses <noscript> as if they ran: its text is checked.)
        assert "Uploading from this page needs JavaScript" in (watched.page.locator("noscript").text_content() or "")
        expect(watched.page.get_by_role("button", name="Upload")).to_be_disabled()
        expect(watched.page.get_by_label("Model name")).to_be_visible()


def test_a_viewer_sees_no_upload_link_and_no_form(refusing_page: Page, server: Server) -> None:
    page = refusing_page
    browser_login(page, server.console_url, "vera")
    expect(page.get_by_role("navigation", name="Console").get_by_role("link", name="Upload")).to_have_count(0)
    response = page.goto(f"{server.console_url}/upload")
    assert response is not None and response.status == 403
    expect(page.locator("#upload-form")).to_have_count(0)
