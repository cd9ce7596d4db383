"""Deleting a model or a version from the repository, over the API and from the console, against the real daemon:
what serves is never deleted (409, with what to do first), what is deleted is gone from disk and from the index, the
history says who did it, a deletion cut short leaves nothing a scan reads, and a model deleted from the console can
be uploaded again under its name and serve, all in one run of the daemon."""

from __future__ import annotations

import json
import shutil
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import TYPE_CHECKING, Any, Final

import numpy as np
import pytest
import tritonclient.http as httpclient
from archives import zip_folder
from browser import assert_accessible
from console_session import browser_login, console_server, http_login
from playwright.sync_api import FilePayload, expect
from server import ADD_SUB_INPUT0, ADD_SUB_INPUT1, REPO_ROOT, Server, add_sub_inputs, request, run_server
from tritonclient.utils import InferenceServerException

if TYPE_CHECKING:
    from playwright.sync_api import Dialog, Locator, Page

sys.path.insert(0, str(REPO_ROOT / "scripts"))

import modelgen  # type: ignore[import-not-found, unused-ignore]

pytest_plugins = ("console_fixtures",)


def _repository(root: Path) -> Path:
    repo = root / "repo"
    for name in ("kept", "spare"):
        model = repo / name
        modelgen.write_add_sub(model, max_batch_size=8)
        config = model / "config.pbtxt"
        config.write_text(config.read_text(encoding="utf-8").replace('name: "add_sub"', f'name: "{name}"'))
        shutil.copytree(model / "1", model / "2")  # the default policy serves the latest: version 2
    return repo


def _history(server: Server, model: str) -> list[dict[str, Any]]:
    reply = request(server.http_url, "GET", f"/v2/edged/models/{model}/history")
    assert reply.status == 200, reply
    events: list[dict[str, Any]] = json.loads(reply.body)["events"]
    return events


def test_the_api_deletes_what_does_not_serve(tmp_path: Path) -> None:
    repo = _repository(tmp_path)
    with console_server([repo], tmp_path / "state") as server:
        client = httpclient.InferenceServerClient(server.http_url)
        # A version that serves is refused, saying what to do first; nothing is touched.
        reply = request(server.http_url, "DELETE", "/v2/edged/models/kept/versions/2")
        assert reply.status == 409
        assert reply.error() == (
            "version 2 of model 'kept' serves: activate another version or unload the model before deleting it"
        )
        assert (repo / "kept" / "2").is_dir() and client.is_model_ready("kept", "2")
        # One that does not is deleted: gone from disk, recorded with who asked; what serves goes on.
        reply = request(server.http_url, "DELETE", "/v2/edged/models/kept/versions/1")
        assert reply.status == 200, reply
        assert json.loads(reply.body) == {"model": "kept", "version": 1, "deleted": True}
        assert not (repo / "kept" / "1").exists()
        assert sorted(p.name for p in (repo / "kept").iterdir()) == ["2", "config.pbtxt"]
        event = _history(server, "kept")[0]
        assert (event["version"], event["state"], event["reason"]) == (1, "DELETED", "version folder deleted")
        assert client.is_model_ready("kept", "2")
        reply = request(server.http_url, "DELETE", "/v2/edged/models/kept/versions/1")
        assert reply.status == 404 and reply.error() == "model 'kept' has no version 1 on disk"

        # A model with a version serving is refused; unloaded, it is deleted and no longer listed or loadable.
        reply = request(server.http_url, "DELETE", "/v2/edged/models/spare")
        assert reply.status == 409 and reply.error() == "model 'spare' serves version 2: unload it before deleting it"
        client.unload_model("spare")
        reply = request(server.http_url, "DELETE", "/v2/edged/models/spare")
        assert reply.status == 200 and json.loads(reply.body)["version"] is None
        assert not (repo / "spare").exists()
        assert "spare" not in {entry["name"] for entry in client.get_model_repository_index()}
        with pytest.raises(InferenceServerException) as caught:
            client.load_model("spare")
        assert "failed to poll from model repository" in caught.value.message()

        # Names and models that are not there.
        assert request(server.http_url, "DELETE", "/v2/edged/models/nosuch").status == 404
        reply = request(server.http_url, "DELETE", "/v2/edged/models/a%5Cb")
        assert reply.status == 400 and "cannot be a model name" in reply.error()
        assert request(server.http_url, "DELETE", "/v2/edged/models/kept/versions/x").status == 404
        # A deletion cut short (the rename done, the removal not) leaves a hidden folder no scan reads as a
        # version; the next deletion of the model's versions clears it.
        (repo / "kept" / ".deleting-7-1").mkdir()
        (repo / "kept" / ".deleting-7-1" / "model.onnx").write_bytes(b"left over")
        assert [e["version"] for e in client.get_model_repository_index() if e["name"] == "kept"] == ["2"]
        shutil.copytree(repo / "kept" / "2", repo / "kept" / "3")
        assert request(server.http_url, "DELETE", "/v2/edged/models/kept/versions/3").status == 200
        assert sorted(p.name for p in (repo / "kept").iterdir()) == ["2", "config.pbtxt"]
        assert client.is_server_ready() and client.is_model_ready("kept", "2")
        client.close()


def test_the_console_deletes_with_a_confirmation_and_only_what_can_go(tmp_path: Path, page: Page) -> None:
    repo = _repository(tmp_path)
    with console_server([repo], tmp_path / "state") as server:
        browser_login(page, server.console_url, "otto")
        asked: list[str] = []

        def accept(dialog: Dialog) -> None:
            asked.append(dialog.message)
            dialog.accept()

        page.on("dialog", accept)
        page.goto(f"{server.console_url}/models/spare")
        # The serving version offers no delete; the model's delete is off while it serves, saying why.
        expect(page.get_by_role("button", name="Delete version 2")).to_have_count(0)
        expect(page.get_by_role("button", name="Delete model")).to_be_disabled()
        expect(page.locator("#delete-why")).to_have_text("Unload it to delete it: version 2 serves.")
        assert_accessible(page)
        page.get_by_role("button", name="Delete version 1").click()
        expect(page.locator("#model-result p")).to_have_text(
            "spare: version 1 deleted: its folder is gone from the repository", timeout=60_000
        )
        assert not (repo / "spare" / "1").exists()
        expect(page.get_by_role("button", name="Delete version 1")).to_have_count(0)
        page.get_by_role("button", name="Unload").click()
        expect(page.locator("#model-result p")).to_contain_text("unloaded", timeout=60_000)
        page.get_by_role("button", name="Delete model").click()
        page.wait_for_url(f"{server.console_url}/models", timeout=60_000)
        assert not (repo / "spare").exists()
        expect(page.get_by_role("link", name="spare", exact=True)).to_have_count(0)
        assert asked == [
            "Delete version 1 of spare? Its folder is removed from the repository. This cannot be undone.",
            "Unload spare? Requests to it fail until it is loaded again.",
            "Delete model spare? Its folder and every version in it (2) are removed from the repository. This "
            "cannot be undone.",
        ], asked
        deleted = [e for e in _history(server, "spare") if e["state"] == "DELETED"]
        assert [(e["version"], e["actor"], e["source"]) for e in deleted] == [
            (None, "user:otto", "console"),
            (1, "user:otto", "console"),
        ], deleted
        # A viewer is refused, as for every other action, and nothing is deleted.
        vera = http_login(server.console_port, "vera")
        status, _, _ = vera.request("POST", "/models/kept/versions/1/delete", {"csrf_token": vera.csrf_token})
        assert status == 403 and (repo / "kept" / "1").is_dir()


def test_a_deleted_models_past_is_not_rolled_back_to(tmp_path: Path) -> None:
    """A model made again under a deleted one's name starts with no past: nothing to roll back to, in the run that
    deleted it and after a restart (when "previous" is read back from the history, which keeps the deleted one's)."""
    repo = _repository(tmp_path)
    args = ("--state-dir", str(tmp_path / "state"), "--model-control-mode", "explicit", "--load-model", "*")
    nothing = "failed to roll back 'spare': there is nothing to roll back to"
    with run_server([repo], *args) as server:
        reply = request(server.http_url, "POST", "/v2/edged/models/spare/versions/1/activate")
        assert reply.status == 200 and json.loads(reply.body)["previous"] == [2], reply
        with httpclient.InferenceServerClient(server.http_url) as client:
            client.unload_model("spare")
            assert request(server.http_url, "DELETE", "/v2/edged/models/spare").status == 200
            _repository(tmp_path / "again")
            shutil.copytree(tmp_path / "again" / "repo" / "spare", repo / "spare")
            client.load_model("spare")
            assert client.is_model_ready("spare", "2")
        reply = request(server.http_url, "POST", "/v2/edged/models/spare/rollback")
        assert reply.status == 400 and reply.error().startswith(nothing), reply
    with run_server([repo], *args) as server:
        reply = request(server.http_url, "POST", "/v2/edged/models/spare/rollback")
        assert reply.status == 400 and reply.error().startswith(nothing), reply


# --- one sitting: upload, activate, delete, upload again -------------------------------------------------------

WAIT_MS: Final = 60_000


def _model_folder(root: Path, name: str, versions: int) -> Path:
    """add_sub as model ``name`` with ``versions`` versions (1, 2, ...), each the same graph."""
    folder = root / name
    modelgen.write_add_sub(folder, max_batch_size=8)
    config = folder / "config.pbtxt"
    config.write_text(config.read_text(encoding="utf-8").replace('name: "add_sub"', f'name: "{name}"'))
    for version in range(2, versions + 1):
        shutil.copytree(folder / "1", folder / str(version))
    return folder


def _upload(page: Page, server: Server, name: str, folder: Path) -> Locator:
    """Uploads ``folder`` as model ``name`` on the upload page, activated; the result's notice."""
    page.goto(f"{server.console_url}/upload")
    page.get_by_label("Model name").fill(name)
    archive = FilePayload(name=f"{name}.zip", mimeType="application/zip", buffer=zip_folder(folder))
    page.set_input_files("#archive-file", files=[archive])
    page.get_by_label("Activate after upload").check()
    page.get_by_role("button", name="Upload").click()
    return page.locator("#upload-result .notice")


def _expect_result(page: Page, text: str) -> None:
    expect(page.locator("#model-result p")).to_have_text(text, timeout=WAIT_MS)


def _infer(server: Server, name: str) -> None:
    with httpclient.InferenceServerClient(server.http_url) as client:
        result = client.infer(name, add_sub_inputs())
    np.testing.assert_array_equal(result.as_numpy("OUTPUT0"), ADD_SUB_INPUT0 + ADD_SUB_INPUT1)
    np.testing.assert_array_equal(result.as_numpy("OUTPUT1"), ADD_SUB_INPUT0 - ADD_SUB_INPUT1)


@pytest.fixture
def empty_server(tmp_path: Path) -> Iterator[Server]:
    """A daemon on an empty repository, ``tmp_path / "repo"``; set up before the test's page, so stopped after it
    (the page's reloads never meet a daemon that is gone)."""
    (tmp_path / "repo").mkdir()
    with console_server([tmp_path / "repo"], tmp_path / "state") as server:
        yield server


def test_an_operator_deletes_a_model_and_uploads_it_again_without_a_restart(
    empty_server: Server, tmp_path: Path, page: Page
) -> None:
    """What an operator does in one sitting, the daemon never restarted: upload a model of two versions, activate
    one, be refused its deletion while it serves, activate the other and delete the first, unload and delete the
    model, then upload a model of the same name again and infer with it."""
    name = "detector"
    repo = tmp_path / "repo"
    first = _model_folder(tmp_path / "first", name, versions=2)
    server = empty_server
    browser_login(page, server.console_url, "otto")
    asked: list[str] = []

    def accept(dialog: Dialog) -> None:
        asked.append(dialog.message)
        dialog.accept()

    page.on("dialog", accept)
    notice = _upload(page, server, name, first)
    expect(notice).to_contain_text(f"Model {name} version", timeout=WAIT_MS)
    expect(notice).to_contain_text("installed as a new model. It is loaded and serving.")
    notice.get_by_role("link", name=f"Open model {name}").click()
    page.wait_for_url(f"{server.console_url}/models/{name}")
    facts = page.locator("#model-live .facts")
    expect(facts).to_contain_text("version 2")  # the default version policy: the latest
    _infer(server, name)

    # A tab left open on the model page, its reloads held back: it still offers to delete version 1.
    stale = page.context.new_page()
    stale.on("dialog", accept)
    stale.route(f"**/models/{name}/live*", lambda route: route.fulfill(status=204))
    stale.goto(f"{server.console_url}/models/{name}")
    expect(stale.get_by_role("button", name="Delete version 1")).to_be_enabled()

    page.get_by_role("button", name="Activate version 1").click()
    _expect_result(page, f"{name}: activated: version 1 serves now (was 2)")
    # What serves offers no deletion, and the model's deletion is off, each saying why.
    expect(page.get_by_role("button", name="Delete version 1")).to_have_count(0)
    expect(page.locator("section[aria-labelledby=versions-h] tbody tr").first).to_contain_text("serves alone")
    expect(page.get_by_role("button", name="Delete model")).to_be_disabled()
    expect(page.locator("#delete-why")).to_have_text("Unload it to delete it: version 1 serves.")
    # From the stale tab the deletion is asked for all the same, and refused with the reason.
    stale.get_by_role("button", name="Delete version 1").click()
    expect(stale.locator("#model-result p")).to_have_text(
        f"{name}: refused (409 Conflict): version 1 of model '{name}' serves: activate another version or "
        "unload the model before deleting it",
        timeout=WAIT_MS,
    )
    stale.close()
    assert (repo / name / "1").is_dir()
    _infer(server, name)

    page.get_by_role("button", name="Activate version 2").click()
    _expect_result(page, f"{name}: activated: version 2 serves now (was 1)")
    page.get_by_role("button", name="Delete version 1").click()
    _expect_result(page, f"{name}: version 1 deleted: its folder is gone from the repository")
    assert sorted(path.name for path in (repo / name).iterdir()) == ["2", "config.pbtxt"]
    # Gone from the page and from the index, though version 1 served before: as after a restart.
    versions = page.locator("section[aria-labelledby=versions-h] tbody tr th")
    expect(versions).to_have_text(["2"])
    with httpclient.InferenceServerClient(server.http_url) as client:
        index = client.get_model_repository_index()
    assert [entry["version"] for entry in index if entry["name"] == name] == ["2"], index
    expect(page.get_by_role("button", name="Delete version 1")).to_have_count(0)
    history = page.locator("section[aria-labelledby=history-h] table.history tbody tr")
    expect(history.first).to_contain_text("version folder deleted", timeout=WAIT_MS)
    cells = history.first.locator("td").all_inner_texts()
    assert cells[1:3] == ["deleted", f"{name} v1"] and cells[4:] == ["user:otto", "console"], cells
    _infer(server, name)

    page.get_by_role("button", name="Unload").click()
    _expect_result(page, f"{name}: unloaded: no version serves now")
    page.get_by_role("button", name="Delete model").click()
    page.wait_for_url(f"{server.console_url}/models", timeout=WAIT_MS)
    assert not (repo / name).exists()
    expect(page.get_by_role("link", name=name, exact=True)).to_have_count(0)
    assert asked == [
        f"Activate version 1 of {name}? It serves instead of version 2.",
        f"Delete version 1 of {name}? Its folder is removed from the repository. This cannot be undone.",
        f"Activate version 2 of {name}? It serves instead of version 1.",
        f"Delete version 1 of {name}? Its folder is removed from the repository. This cannot be undone.",
        f"Unload {name}? Requests to it fail until it is loaded again.",
        f"Delete model {name}? Its folder and every version in it (2) are removed from the repository. This "
        "cannot be undone.",
    ], asked
    page.goto(f"{server.console_url}/history?model={name}")
    deleted = page.locator("table.history tbody tr").first.locator("td").all_inner_texts()
    assert deleted[1:4] == ["deleted", name, "model folder deleted"], deleted

    # The same name again, one version: a new model, served, with nothing of the deleted one's past to act on.
    again = _model_folder(tmp_path / "again", name, versions=1)
    notice = _upload(page, server, name, again)
    expect(notice).to_contain_text(
        f"Model {name} version 1 installed as a new model. It is loaded and serving.", timeout=WAIT_MS
    )
    _infer(server, name)
    assert sorted(path.name for path in (repo / name).iterdir()) == ["1", "config.pbtxt"]
    notice.get_by_role("link", name=f"Open model {name}").click()
    page.wait_for_url(f"{server.console_url}/models/{name}")
    expect(page.locator("#model-live .facts")).to_contain_text("version 1")
    expect(page.locator("section[aria-labelledby=versions-h] tbody tr th")).to_have_text(["1"])
    expect(page.get_by_role("button", name="Roll back to the previous version")).to_be_disabled()
    expect(page.locator("#rollback-why")).to_have_text(
        "Nothing to roll back to: what serves has not replaced other versions."
    )
    assert_accessible(page)
