"""Where the operator meets an upload's probation and its history, in a real browser against the real daemon: an
upload activated in the console and unloaded on the model page within the probation window keeps every version on
disk; the console's clicks are in the history as the console's (source console), by ``user:<name>``, and edged's own
records by ``edged``, spelled alike on every page and in the CSV export; an upload refused when it loads leaves the
device ready and the model unlisted; the model page offers only the actions that can work.

Being "within the probation window" is made certain, not raced: the window is 600 s, far longer than any test.
"""

from __future__ import annotations

import csv
import io
import re
import shutil
from collections.abc import Iterator
from pathlib import Path
from typing import TYPE_CHECKING, Final

import modelgen  # type: ignore[import-not-found, unused-ignore]
import pytest
from archives import zip_folder
from browser import assert_accessible, open_page
from console_session import browser_login, console_server, http_login
from playwright.sync_api import FilePayload, expect
from server import Server, request

if TYPE_CHECKING:
    from playwright.sync_api import Browser, Page

pytest_plugins = ("console_fixtures",)

WINDOW_S: Final = 600
WAIT_MS: Final = 60_000
# Chromium logs each 4xx answer as a failed load: an upload's refusal, which the page shows, is no defect of it.
REFUSAL_LOGGED: Final = re.compile(
    r"^Failed to load resource: the server responded with a status of 4\d\d .*"
    r"\(https?://[^/]+/models/[^/?]+/upload\?activate=\w+\)$"
)


@pytest.fixture(scope="module")
def scratch(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tmp_path_factory.mktemp("console-probation")


@pytest.fixture(scope="module")
def sources(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tmp_path_factory.mktemp("console-probation-sources")


@pytest.fixture(scope="module")
def server(scratch: Path) -> Iterator[Server]:
    repository = scratch / "repository"
    modelgen.write_add_sub(repository / "resident", max_batch_size=8, dims=16, dtype="FP32")
    # Two versions (the newest serves); removed from disk by hand in a test once unloaded.
    modelgen.write_add_sub(repository / "retired", max_batch_size=8, dims=16, dtype="FP32")
    shutil.copytree(repository / "retired" / "1", repository / "retired" / "2")
    with console_server([repository], scratch / "state", f"--sync-probation-secs={WINDOW_S}") as running:
        yield running


@pytest.fixture
def refusing_page(browser: Browser) -> Iterator[Page]:
    """A page on which an upload is refused: watched as ``page`` is, but for the refusal's own log line."""
    with open_page(browser, check=False) as watched:
        yield watched.page
    problems = watched.problems
    problems.console_errors = [line for line in problems.console_errors if not REFUSAL_LOGGED.match(line)]
    assert not problems, f"the page had problems:\n{problems.report()}"


# --- helpers -----------------------------------------------------------------------------------------------------


def add_sub(sources: Path, name: str) -> Path:
    if not (sources / name).exists():
        modelgen.write_add_sub(sources / name, max_batch_size=8, dims=16, dtype="FP32")
    return sources / name


def upload_in_console(page: Page, server: Server, name: str, archive: bytes, *, activate: bool) -> None:
    """Uploads ``archive`` as model ``name`` through the upload page, as an operator does."""
    page.goto(f"{server.console_url}/upload")
    page.get_by_label("Model name").fill(name)
    page.set_input_files(
        "#archive-file", files=[FilePayload(name=f"{name}.zip", mimeType="application/zip", buffer=archive)]
    )
    checkbox = page.get_by_label("Activate after upload")
    if activate:
        checkbox.check()
    else:
        checkbox.uncheck()
    page.get_by_role("button", name="Upload").click()


def files(folder: Path) -> list[str]:
    return sorted(path.relative_to(folder).as_posix() for path in folder.rglob("*") if path.is_file())


def actions(page: Page) -> list[str]:
    """The labels of the buttons the model page offers (actions and versions), those that are not off."""
    return [label.strip() for label in page.locator("#model-live button:not([disabled])").all_inner_texts()]


def history_rows(page: Page) -> list[dict[str, str]]:
    table = page.locator("table.history")
    names = [name.strip() for name in table.locator("thead th").all_inner_texts()]
    return [
        dict(zip(names, (cell.strip() for cell in row.locator("td").all_inner_texts()), strict=True))
        for row in table.locator("tbody tr").all()
    ]


# --- the tests ---------------------------------------------------------------------------------------------------


def test_an_unload_in_the_console_during_the_probation_keeps_every_version(
    page: Page, server: Server, sources: Path, scratch: Path
) -> None:
    folder = scratch / "repository" / "steady"
    browser_login(page, server.console_url, "otto")
    upload_in_console(page, server, "steady", zip_folder(add_sub(sources, "steady")), activate=True)
    notice = page.locator("#upload-result .notice")
    expect(notice).to_contain_text("Model steady version 1 installed as a new model", timeout=WAIT_MS)
    expect(notice).to_contain_text(f"on probation for {WINDOW_S} s")
    upload_in_console(page, server, "steady", zip_folder(add_sub(sources, "steady") / "1"), activate=False)
    expect(notice).to_contain_text("Model steady version 2 installed as its next version", timeout=WAIT_MS)

    page.goto(f"{server.console_url}/models/steady")
    # Nothing was ever served before version 1: there is nothing to roll back to, so no rollback is offered.
    assert actions(page) == ["Reload", "Unload", "Activate version 2", "Delete version 2"], actions(page)
    page.on("dialog", lambda dialog: dialog.accept())
    page.get_by_role("button", name="Unload").click()
    expect(page.locator("#model-result p")).to_have_text("steady: unloaded: no version serves now", timeout=WAIT_MS)
    history = page.locator("section[aria-labelledby=history-h]")
    # The page's live part shows the probation ended by the unload (it reloads every few seconds).
    expect(history).to_contain_text("probation ended", timeout=WAIT_MS)
    assert files(folder) == ["1/model.onnx", "2/model.onnx", "config.pbtxt"]
    expect(history).not_to_contain_text("upload removed")
    # Who, and through which door: edged itself for the probation, the operator through the console for the unload
    # (one row, its unloading folded under it).
    rows = history_rows(page)
    ended = next(row for row in rows if row["Action"] == "probation ended")
    assert (ended["By"], ended["Source"]) == ("edged", "probation"), rows
    unloaded = next(row for row in rows if row["Action"] == "unloaded")
    assert (unloaded["By"], unloaded["Source"]) == ("user:otto", "console"), rows

    # What the page offers works: load it, activate the other version, and then roll back to the first.
    assert actions(page) == [
        "Load",
        "Unload",
        "Delete model",
        "Activate version 1",
        "Delete version 1",
        "Activate version 2",
        "Delete version 2",
    ], actions(page)
    page.get_by_role("button", name="Load", exact=True).click()
    expect(page.locator("#model-result p")).to_have_text("steady: loaded: version 2 serves now", timeout=WAIT_MS)
    page.get_by_role("button", name="Activate version 1").click()
    expect(page.locator("#model-result p")).to_have_text(
        "steady: activated: version 1 serves now (was 2)", timeout=WAIT_MS
    )
    page.get_by_role("button", name="Roll back to the previous version").click()
    expect(page.locator("#model-result p")).to_have_text(
        "steady: rolled back: version 2 serves now (was 1)", timeout=WAIT_MS
    )
    assert files(folder) == ["1/model.onnx", "2/model.onnx", "config.pbtxt"]
    assert_accessible(page)


def test_the_consoles_clicks_are_the_consoles_and_each_actor_is_spelled_one_way(server: Server, page: Page) -> None:
    """After the test above: its uploads and clicks are found by source console, by ``user:otto`` everywhere, and
    the probation's end by ``edged``."""
    browser_login(page, server.console_url, "vera")
    page.goto(f"{server.console_url}/history?model=steady&source=console")
    rows = history_rows(page)
    assert rows and {row["Source"] for row in rows} == {"console"}, rows
    assert {row["By"] for row in rows} == {"user:otto"}, rows
    assert {"uploaded", "unloaded", "activated", "rolled back"} <= {row["Action"] for row in rows}, rows

    page.goto(f"{server.console_url}/history?model=steady&user=edged")
    rows = history_rows(page)
    assert [row["Action"] for row in rows] == ["probation ended"], rows
    assert rows[0]["By"] == "edged" and rows[0]["Source"] == "probation"

    viewer = http_login(server.console_port, "vera")
    status, _, text = viewer.request("GET", "/history.csv?model=steady")
    assert status == 200
    exported = list(csv.DictReader(io.StringIO(text, newline="")))
    assert {row["actor"] for row in exported} == {"user:otto", "edged"}, exported
    assert {row["source"] for row in exported if row["actor"] == "user:otto"} == {"console"}
    # The API's account of the same history: the console's source, and null for edged's own.
    events = request(server.http_url, "GET", "/v2/edged/models/steady/history?limit=1000").json()["events"]
    assert {(event["source"], event["actor"]) for event in events} <= {("console", "user:otto"), ("probation", None)}


def test_an_upload_refused_when_it_loads_leaves_the_device_ready(
    refusing_page: Page, server: Server, sources: Path, scratch: Path
) -> None:
    page = refusing_page
    folder = sources / "mismatch"
    modelgen.write_add_sub(folder, max_batch_size=8, dims=16, dtype="FP32")
    config = folder / "config.pbtxt"
    config.write_text(config.read_text().replace('"INPUT0"', '"INPUTX"'))  # an input the ONNX file lacks
    assert request(server.http_url, "GET", "/v2/health/ready").status == 200
    browser_login(page, server.console_url, "otto")
    upload_in_console(page, server, "mismatch", zip_folder(folder), activate=True)
    alert = page.locator("#upload-result .alert")
    expect(alert).to_contain_text("nothing was changed on the device", timeout=WAIT_MS)
    assert not (scratch / "repository" / "mismatch").exists()
    assert request(server.http_url, "GET", "/v2/health/ready").status == 200
    page.goto(f"{server.console_url}/models")
    expect(page.get_by_role("link", name="resident", exact=True)).to_be_visible()
    expect(page.get_by_role("link", name="mismatch", exact=True)).to_have_count(0)


def test_the_model_page_offers_no_action_that_cannot_work(page: Page, server: Server, scratch: Path) -> None:
    browser_login(page, server.console_url, "otto")
    page.goto(f"{server.console_url}/models/retired")
    assert actions(page) == ["Reload", "Unload", "Activate version 1", "Delete version 1"], actions(page)
    page.on("dialog", lambda dialog: dialog.accept())
    page.get_by_role("button", name="Unload").click()
    expect(page.locator("#model-result p")).to_have_text("retired: unloaded: no version serves now", timeout=WAIT_MS)
    # Its folder removed by hand: the page still lists the versions it had, but offers no load or activation.
    shutil.rmtree(scratch / "repository" / "retired" / "2")
    page.goto(f"{server.console_url}/models/retired")
    assert actions(page) == ["Load", "Unload", "Delete model", "Activate version 1", "Delete version 1"], actions(page)
    versions = page.locator("section[aria-labelledby=versions-h] tbody tr")
    expect(versions.filter(has_text="no longer on disk")).to_have_count(1)
    shutil.rmtree(scratch / "repository" / "retired")
    page.goto(f"{server.console_url}/models/retired")
    assert actions(page) == ["Unload"], actions(page)
    # (Version 1 was never loaded: with its folder gone, nothing is left of it to list.)
    expect(versions).to_have_count(1)
    expect(versions.filter(has_text="no longer on disk")).to_have_count(1)
    page.goto(f"{server.console_url}/models")
    row = page.locator("table.models tbody tr", has=page.get_by_role("link", name="retired", exact=True))
    expect(row).to_contain_text("on disk: \u2013")
    assert_accessible(page)
