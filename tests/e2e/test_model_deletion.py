"""Deleting a model or a version from the repository, over the API and from the console, against the real daemon:
what serves is never deleted (409, with what to do first), what is deleted is gone from disk and from the index, the
history says who did it, and a deletion cut short leaves nothing a scan reads."""

from __future__ import annotations

import json
import shutil
import sys
from pathlib import Path
from typing import TYPE_CHECKING, Any

import pytest
import tritonclient.http as httpclient
from browser import assert_accessible
from console_session import browser_login, console_server, http_login
from playwright.sync_api import expect
from server import REPO_ROOT, Server, request
from tritonclient.utils import InferenceServerException

if TYPE_CHECKING:
    from playwright.sync_api import Dialog, Page

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
