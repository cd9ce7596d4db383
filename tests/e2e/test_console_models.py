"""The console's models and versions pages in a real browser, against the real daemon, with tritonclient watching
what the daemon serves: the table, a model's page, load and unload, activating a version and rolling back while a
closed-loop client sends requests, and what a viewer and a forged request are refused."""

from __future__ import annotations

import html
import json
import re
import socket
import subprocess
import sys
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import TYPE_CHECKING, Final

import numpy as np
import pytest
import tritonclient.http as httpclient
from browser import DESKTOP, PHONE, assert_accessible, screenshot, watch
from console_session import browser_login, console_server, create_user, http_login
from onnx import TensorProto, helper
from playwright.sync_api import expect
from server import REPO_ROOT, Server, run_server

if TYPE_CHECKING:
    from playwright.sync_api import Browser, Dialog, Locator, Page, Route

sys.path.insert(0, str(REPO_ROOT / "scripts"))

import modelgen  # type: ignore[import-not-found, unused-ignore]

pytest_plugins = ("console_fixtures",)

# The model whose versions compute different things: version N answers INPUT0 * N.
SCALED: Final = "scaled"
VERSIONS: Final = (1, 2, 3)
INPUT: Final = np.array([[1.0, 2.0, 3.0, 4.0]], dtype=np.float32)
WAIT_MS: Final = 60_000


def _write_scaled(model_dir: Path, versions: tuple[int, ...]) -> None:
    """An FP32 identity model's config, and per version a graph that multiplies INPUT0 by the version number."""
    modelgen.write_identity(model_dir, "FP32", max_batch_size=8, dims=[-1])
    shape: list[int | str] = ["batch", "dim0"]
    for version in versions:
        graph = helper.make_graph(
            [helper.make_node("Mul", ["INPUT0", "factor"], ["OUTPUT0"], name="scale")],
            "scaled",
            [helper.make_tensor_value_info("INPUT0", TensorProto.FLOAT, shape)],
            [helper.make_tensor_value_info("OUTPUT0", TensorProto.FLOAT, shape)],
            initializer=[helper.make_tensor("factor", TensorProto.FLOAT, [], [float(version)])],
        )
        model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)], ir_version=8)
        (model_dir / str(version)).mkdir(parents=True, exist_ok=True)
        (model_dir / str(version) / "model.onnx").write_bytes(model.SerializeToString())


@pytest.fixture(scope="module")
def repository(tmp_path_factory: pytest.TempPathFactory) -> Path:
    repo = tmp_path_factory.mktemp("models-repo")
    _write_scaled(repo / SCALED, VERSIONS)
    modelgen.write_add_sub(repo / "add_sub", max_batch_size=8, dims=16, dtype="FP32")
    # Parses, but a dimension of 0 is invalid: the table shows it UNAVAILABLE with its reason.
    modelgen.write_identity(repo / "broken", "FP32", max_batch_size=8, dims=[-1])
    config = repo / "broken" / "config.pbtxt"
    config.write_text(config.read_text(encoding="utf-8").replace("dims: [ -1 ]", "dims: [ 0 ]", 1))
    return repo


@pytest.fixture(scope="module")
def server(repository: Path, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Server]:
    with console_server([repository], tmp_path_factory.mktemp("models-state")) as started:
        yield started


@pytest.fixture
def client(server: Server) -> Iterator[httpclient.InferenceServerClient]:
    triton = httpclient.InferenceServerClient(server.http_url)
    yield triton
    triton.close()


def _infer(triton: httpclient.InferenceServerClient, version: str = "") -> np.ndarray:
    request = httpclient.InferInput("INPUT0", list(INPUT.shape), "FP32")
    request.set_data_from_numpy(INPUT)
    result = triton.infer(SCALED, [request], model_version=version)
    answer: np.ndarray = result.as_numpy("OUTPUT0")
    return answer


def _factor(answer: np.ndarray) -> int:
    """Which version answered: the factor its graph multiplies by."""
    factors = answer / INPUT
    assert np.all(factors == factors.flat[0]), answer
    return int(factors.flat[0])


class ClosedLoop:
    """One client sending requests to the scaled model without a version, one after another; keeps every failure
    and which version answered each request, in order."""

    def __init__(self, server: Server) -> None:
        self._server = server
        self._stop = threading.Event()
        self.factors: list[int] = []
        self.failures: list[str] = []
        self._thread = threading.Thread(target=self._run, daemon=True)

    def __enter__(self) -> ClosedLoop:
        self._thread.start()
        return self

    def __exit__(self, *_: object) -> None:
        self._stop.set()
        self._thread.join(30)

    def _run(self) -> None:
        triton = httpclient.InferenceServerClient(self._server.http_url)
        try:
            while not self._stop.is_set():
                try:
                    self.factors.append(_factor(_infer(triton)))
                except Exception as exc:  # every failure is the test's business
                    self.failures.append(repr(exc))
        finally:
            triton.close()

    def answered_since(self, count: int) -> list[int]:
        return self.factors[count:]


def _wait_for_answers(loop: ClosedLoop, factor: int, after: int) -> None:
    """Waits until the client's answers since request ``after`` include ``factor`` (the switch has reached it)."""
    for _ in range(600):
        if factor in loop.answered_since(after):
            return
        threading.Event().wait(0.05)
    raise AssertionError(f"no answer of version {factor} since request {after}: {loop.factors[after:][-20:]}")


def _expect_result(page: Page, text: str) -> None:
    """The result line of the last action, once it has come."""
    expect(page.locator("#model-result p")).to_have_text(text, timeout=WAIT_MS)


def _history_rows(section: Locator) -> list[dict[str, str]]:
    """The history table in ``section`` as it shows it: one dict per row, keyed by the column headers."""
    table = section.locator("table.history")
    names = [name.strip() for name in table.locator("thead th").all_inner_texts()]
    return [
        dict(zip(names, (cell.strip() for cell in row.locator("td").all_inner_texts()), strict=True))
        for row in table.locator("tbody tr").all()
    ]


def _steps(row: Locator) -> list[str]:
    """The steps folded under a history row, without their times and details (``model loading``, ``v2 ready``),
    sorted: a version's retirement may begin before or after its activation is recorded."""
    return sorted(step.split(" ", 1)[1].split(":")[0] for step in row.locator("details.steps li").all_text_contents())


# --- reading -------------------------------------------------------------------------------------------------


def test_table_lists_every_model_with_its_state(server: Server, page: Page) -> None:
    browser_login(page, server.console_url, "vera")
    page.goto(f"{server.console_url}/models")
    rows = {
        row.locator("th").inner_text(): row.locator("td").first.inner_text()
        for row in page.locator("table.models tbody tr").all()
    }
    assert set(rows) == {SCALED, "add_sub", "broken"}, rows
    # What needs a person comes first: the model that failed, then the rest by name.
    assert list(rows) == ["broken", "add_sub", SCALED], rows
    # The header names the device (--device-id, else the host name), not the protocol's server name.
    expect(page.locator("header .brand")).to_contain_text(socket.gethostname())
    assert rows[SCALED].startswith("ready")
    assert rows["add_sub"].startswith("ready")
    assert rows["broken"].startswith("unavailable")
    scaled = page.locator("table.models tbody tr", has=page.get_by_role("link", name=SCALED, exact=True))
    cells = scaled.locator("td").all_inner_texts()
    # The default version policy serves the latest of three; its instances on the CPU; no traffic yet.
    assert cells[0] == "ready"
    assert "3 serving" in cells[1] and "on disk: 1, 2, 3" in cells[1], cells
    assert cells[2] == "onnxruntime", cells
    placed = re.fullmatch(r"(\d+): CPU(?: \u00d7(\d+))?", cells[3])
    assert placed is not None and placed.group(1) == (placed.group(2) or "1"), cells
    assert cells[4:] == ["0/s", "\u2013", "\u2013", "0/s"], cells
    assert "Model control mode: explicit" in page.locator("#controls-mode").inner_text()
    # The live part reloads in place: the table is still there after a poll.
    with page.expect_response(lambda r: "/models?part=table" in r.url and r.status == 200, timeout=WAIT_MS):
        pass
    expect(page.get_by_role("link", name=SCALED, exact=True)).to_be_visible()
    assert_accessible(page)
    screenshot(page, "console-models")

    page.get_by_role("link", name=SCALED, exact=True).click()
    page.wait_for_url(f"{server.console_url}/models/{SCALED}")


def test_model_page_shows_config_versions_and_history(server: Server, page: Page) -> None:
    browser_login(page, server.console_url, "vera")
    page.goto(f"{server.console_url}/models/{SCALED}")
    expect(page.get_by_role("heading", level=1)).to_have_text(SCALED)
    config = page.locator("section[aria-labelledby=config-h] pre").inner_text()
    assert f'name: "{SCALED}"' in config and 'name: "INPUT0"' in config, config
    versions = page.locator("#model-live table").first.locator("tbody tr")
    assert versions.locator("th").all_inner_texts() == ["1", "2", "3"]
    assert versions.locator("td").nth(0).inner_text() == "not loaded"
    assert versions.nth(2).locator("td").first.inner_text() == "ready"
    history = page.locator("section[aria-labelledby=history-h]")
    expect(history).to_contain_text("ready")
    assert_accessible(page)
    screenshot(page, "console-model")


def test_a_model_page_shows_its_tensors_and_requests_that_run(server: Server, page: Page) -> None:
    browser_login(page, server.console_url, "vera")
    page.goto(f"{server.console_url}/models/add_sub")
    section = page.locator("section[aria-labelledby=try-h]")
    rows = [row.all_inner_texts() for row in [r.locator("th, td") for r in section.locator("tbody tr").all()]]
    assert ["INPUT0", "input", "FP32", "[-1, 16]"] in rows, rows
    assert ["OUTPUT1", "output", "FP32", "[-1, 16]"] in rows, rows
    # The examples are what a person copies: each one runs as it is shown, against the daemon.
    curl = page.locator("#example-curl").inner_text()
    answer = subprocess.run(["bash", "-c", curl], capture_output=True, text=True, timeout=60, check=True).stdout
    outputs = {output["name"]: output for output in json.loads(answer)["outputs"]}
    assert outputs["OUTPUT0"]["data"] == [0.0] * 16, answer
    python = page.locator("#example-python").inner_text()
    ran = subprocess.run([sys.executable, "-c", python], check=False, capture_output=True, text=True, timeout=120)
    assert ran.returncode == 0, ran.stderr
    assert "[[0. 0. 0." in ran.stdout, ran.stdout
    # A viewer may send a test request built from the config; what came back is shown.
    expect(page.get_by_role("button", name="Copy the curl command")).to_be_visible()
    page.get_by_role("button", name="Send a test request").click()
    expect(page.locator("#try-result p")).to_contain_text("Test request: answered by version 1 in", timeout=WAIT_MS)
    result_rows = page.locator("#try-result tbody tr")
    expect(result_rows).to_have_count(2)
    assert result_rows.first.locator("th, td").all_inner_texts()[:3] == ["OUTPUT0", "FP32", "[1, 16]"]
    assert_accessible(page)
    # A model that serves nothing has no interface to show yet.
    page.goto(f"{server.console_url}/models/broken")
    expect(page.locator("section[aria-labelledby=try-h]")).to_contain_text("known once a version serves")


def test_the_overview_names_the_models_that_hold_readiness(
    server: Server, page: Page, client: httpclient.InferenceServerClient
) -> None:
    # "broken" was loaded with the rest and failed: under strict readiness the device is not ready, and says why.
    assert not client.is_server_ready()
    browser_login(page, server.console_url, "vera")
    page.goto(server.console_url + "/")
    holding = page.locator("#not-ready")
    expect(holding).to_contain_text("Not ready because 1 model that should serve does not:")
    item = holding.locator("li")
    expect(item).to_have_count(1)
    expect(item.get_by_role("link", name="broken")).to_have_attribute("href", "/models/broken")
    expect(item.locator(".state")).to_have_text("unavailable")
    expect(item).to_contain_text("dimension must be integer >= 1")  # the config's error, in the loader's words
    assert_accessible(page)


def test_unknown_model_is_not_found(server: Server) -> None:
    vera = http_login(server.console_port, "vera")
    status, _, text = vera.request("GET", "/models/no_such_model")
    assert status == 404
    assert "no model 'no_such_model' in the model repository" in html.unescape(text)
    # A name with characters a URL escapes is still one path segment, shown escaped.
    status, _, text = vera.request("GET", "/models/%3Cb%3Ex%20y")
    assert status == 404
    assert "no model &#39;&lt;b&gt;x y&#39;" in text and "<b>x" not in text


def test_pages_in_dark_and_at_phone_width(server: Server, browser: Browser, phone_page: Page) -> None:
    browser_login(phone_page, server.console_url, "otto")
    for path, name in (("/models", "console-models-phone"), (f"/models/{SCALED}", "console-model-phone")):
        phone_page.goto(server.console_url + path)
        assert_accessible(phone_page)
        screenshot(phone_page, name)
    context = browser.new_context(viewport=DESKTOP, color_scheme="dark")
    problems = watch(context)
    try:
        dark = context.new_page()
        browser_login(dark, server.console_url, "otto")
        for path, name in (("/models", "console-models-dark"), (f"/models/{SCALED}", "console-model-dark")):
            dark.goto(server.console_url + path)
            assert_accessible(dark)
            screenshot(dark, name)
    finally:
        context.close()
    assert not problems, problems.report()
    assert PHONE["width"] < DESKTOP["width"]


# --- acting ----------------------------------------------------------------------------------------------------


def test_operator_unloads_and_loads(server: Server, page: Page, client: httpclient.InferenceServerClient) -> None:
    browser_login(page, server.console_url, "otto")
    page.goto(f"{server.console_url}/models/add_sub")
    asked: list[str] = []

    def accept(dialog: Dialog) -> None:
        asked.append(dialog.message)
        dialog.accept()

    page.on("dialog", accept)
    page.get_by_role("button", name="Unload").click()
    _expect_result(page, "add_sub: unloaded: no version serves now")
    assert not client.is_model_ready("add_sub")
    expect(page.locator("#model-live .facts")).to_contain_text("no version")

    # The request is held on its way, so the page can be seen while it runs: the buttons off, the busy line on.
    held: list[Route] = []

    def hold(route: Route) -> None:
        held.append(route)  # a bound method of a builtin is no handler Playwright takes

    page.route("**/models/add_sub/load", hold)
    page.get_by_role("button", name="Load", exact=True).click()
    expect(page.get_by_text("Loading…", exact=True)).to_be_visible()
    for name in ("Load", "Unload"):
        expect(page.get_by_role("button", name=name, exact=True)).to_be_disabled()
    # Its served versions never changed: nothing to roll back to, and the rollback is off, saying why.
    rollback = page.get_by_role("button", name="Roll back to the previous version")
    expect(rollback).to_be_disabled()
    expect(page.locator("#rollback-why")).to_have_text(
        "Nothing to roll back to: what serves has not replaced other versions."
    )
    expect(page.locator("#model-result p")).to_have_text("add_sub: unloaded: no version serves now")
    page.wait_for_function("() => true")  # lets the route's handler run
    assert len(held) == 1
    held[0].continue_()
    page.unroute("**/models/add_sub/load")
    _expect_result(page, "add_sub: loaded: version 1 serves now")
    expect(page.get_by_text("Loading…", exact=True)).to_be_hidden()
    assert client.is_model_ready("add_sub")
    # Loading again reloads it.
    page.get_by_role("button", name="Reload").click()
    _expect_result(page, "add_sub: reloaded: version 1 serves now")
    # Each action that changes what serves asked first, naming what changes.
    assert asked == [
        "Unload add_sub? Requests to it fail until it is loaded again.",
        "Reload add_sub? It loads again from the repository; what serves now (version 1) goes on serving until "
        "the reload is done.",
    ], asked
    assert client.is_model_ready("add_sub")
    history = page.locator("section[aria-labelledby=history-h]")
    expect(history).to_contain_text("user:otto")


def test_activate_and_roll_back_without_a_failed_request(
    server: Server, page: Page, client: httpclient.InferenceServerClient
) -> None:
    browser_login(page, server.console_url, "otto")
    page.goto(f"{server.console_url}/models/{SCALED}")
    asked: list[str] = []

    def accept(dialog: Dialog) -> None:
        asked.append(dialog.message)
        dialog.accept()

    page.on("dialog", accept)
    assert _factor(_infer(client)) == 3
    with ClosedLoop(server) as loop:
        _wait_for_answers(loop, 3, 0)
        page.get_by_role("button", name="Activate version 1").click()
        _expect_result(page, f"{SCALED}: activated: version 1 serves now (was 3)")
        switched = len(loop.factors)
        _wait_for_answers(loop, 1, switched)
        assert _factor(_infer(client)) == 1
        # The version the request names still answers when it is loaded: only version 1 is now.
        assert client.is_model_ready(SCALED, "1") and not client.is_model_ready(SCALED, "3")

        before_rollback = len(loop.factors)
        page.get_by_role("button", name="Roll back to the previous version").click()
        _expect_result(page, f"{SCALED}: rolled back: version 3 serves now (was 1)")
        rolled = len(loop.factors)
        _wait_for_answers(loop, 3, rolled)
    assert loop.failures == [], loop.failures[:5]
    # Once a switch is done, every later answer is the new version's.
    assert set(loop.factors[rolled + 1 :]) <= {3}
    assert set(loop.factors[switched + 1 : before_rollback]) <= {1}, loop.factors[switched:before_rollback]
    assert _factor(_infer(client)) == 3
    expect(page.locator("section[aria-labelledby=history-h]")).to_contain_text("rolled back")
    # Version 1 was replaced on purpose: "retired", not a failure.
    versions = page.locator("#model-live table").first.locator("tbody tr")
    expect(versions.nth(0).locator("td").first).to_have_text("retired")
    assert asked == [
        f"Activate version 1 of {SCALED}? It serves instead of version 3.",
        f"Roll back {SCALED} to version 3? Version 1 stops serving.",
    ], asked


def test_plain_forms_redirect_back_with_the_result_once(
    server: Server, client: httpclient.InferenceServerClient
) -> None:
    """Without JavaScript: a form's POST answers 303 to the model page, which shows the result once."""
    otto = http_login(server.console_port, "otto")
    form = {"csrf_token": otto.csrf_token}
    status, headers, _ = otto.request("POST", f"/models/{SCALED}/versions/2/activate", form)
    assert status == 303 and headers["location"] == f"/models/{SCALED}"
    assert _factor(_infer(client)) == 2
    status, _, text = otto.request("GET", f"/models/{SCALED}")
    assert status == 200
    assert f"{SCALED}: activated: version 2 serves now (was 3)" in text
    _, _, again = otto.request("GET", f"/models/{SCALED}")
    assert "activated: version 2" not in again.split('id="model-result"')[1].split("</div>")[0]

    # A refusal is a result too, with the core's message and its status; what serves is unchanged.
    status, _, _ = otto.request("POST", f"/models/{SCALED}/versions/9/activate", form)
    assert status == 303
    _, _, text = otto.request("GET", f"/models/{SCALED}")
    shown = html.unescape(text.split('id="model-result"')[1].split("</div>")[0])
    assert f"{SCALED}: refused (400 Bad Request): failed to activate version 9 of '{SCALED}'" in shown, shown
    assert _factor(_infer(client)) == 2

    status, headers, _ = otto.request("POST", f"/models/{SCALED}/rollback", form)
    assert status == 303
    assert _factor(_infer(client)) == 3
    # An unknown model's action is not found, as its page is.
    status, _, text = otto.request("POST", "/models/no_such_model/load", form)
    assert status == 404 and "no model &#39;no_such_model&#39;" in text


def test_a_viewer_sees_no_controls_and_is_refused(
    server: Server, page: Page, client: httpclient.InferenceServerClient
) -> None:
    browser_login(page, server.console_url, "vera")
    page.goto(f"{server.console_url}/models/{SCALED}")
    expect(page.get_by_role("heading", name="Versions")).to_be_visible()
    assert page.locator("#model-live button").count() == 0
    assert page.locator("#model-live form").count() == 0

    vera = http_login(server.console_port, "vera")
    form = {"csrf_token": vera.csrf_token}
    for action in ("load", "unload", "versions/1/activate", "rollback"):
        status, _, text = vera.request("POST", f"/models/{SCALED}/{action}", form)
        assert status == 403, (action, status, text[:300])
        assert "operator" in text
    # An operator's request without the session's CSRF token is refused as well.
    otto = http_login(server.console_port, "otto")
    for body in ({}, {"csrf_token": "forged"}):
        status, _, _ = otto.request("POST", f"/models/{SCALED}/unload", body)
        assert status == 403
    status, _, _ = otto.request(
        "POST", f"/models/{SCALED}/unload", {"csrf_token": otto.csrf_token}, {"Origin": "http://elsewhere.example"}
    )
    assert status == 403
    assert client.is_model_ready(SCALED) and _factor(_infer(client)) == 3


def test_an_activation_is_one_row_on_the_model_page_and_the_overview(server: Server, page: Page) -> None:
    """The model page's history and the overview's latest events fold an action's steps under it, in the history
    page's words: an activation is one row, its loads and unloads folded under it; two activations, two rows."""
    browser_login(page, server.console_url, "otto")
    page.goto(f"{server.console_url}/models/{SCALED}")
    page.on("dialog", lambda dialog: dialog.accept())
    history = page.locator("section[aria-labelledby=history-h]")
    newest = history.locator("table.history tbody tr").first
    for version, was in ((2, 3), (3, 2)):
        page.get_by_role("button", name=f"Activate version {version}").click()
        _expect_result(page, f"{SCALED}: activated: version {version} serves now (was {was})")
        expect(newest).to_contain_text(f"version {version} activated (was {was})", timeout=WAIT_MS)
        # The version it replaced retires once its last requests are done: its unload is a step of the row too,
        # which the page's reloads bring.
        expect(newest.locator("details.steps")).to_contain_text(f"v{was} unloaded", timeout=WAIT_MS)
    activations = [
        sorted(["model loading", f"v{version} loading", f"v{version} ready", "model activated",
                f"v{was} unloading", f"v{was} unloaded"])
        for version, was in ((3, 2), (2, 3))
    ]  # fmt: skip
    rows = _history_rows(history)
    assert [(row["Action"], row["Model"], row["By"], row["Source"]) for row in rows[:2]] == [
        ("activated", SCALED, "user:otto", "console"),
    ] * 2, rows
    assert rows[0]["Detail"] == "version 3 activated (was 2)\n6 steps", rows[0]
    assert rows[1]["Detail"] == "version 2 activated (was 3)\n6 steps", rows[1]
    assert [_steps(row) for row in history.locator("table.history tbody tr").all()[:2]] == activations
    assert_accessible(page)

    # The steps a person opens stay open while the page reloads its live part.
    newest.locator("summary").click()
    opened = newest.locator("details.steps")
    expect(opened).to_have_attribute("open", "")
    steps_id = opened.get_attribute("id")
    # The next reload replaces the element: the one in the new content is open.
    before = opened.element_handle()
    page.wait_for_function("details => !details.isConnected", arg=before, timeout=WAIT_MS)
    expect(page.locator(f"#{steps_id}")).to_have_attribute("open", "")

    # The overview's latest events: the same rows, in the same words.
    page.goto(server.console_url + "/")
    latest = page.locator("section[aria-labelledby=events-h]")
    rows = _history_rows(latest)
    assert [(row["Action"], row["Model"], row["Detail"], row["By"]) for row in rows[:2]] == [
        ("activated", SCALED, "version 3 activated (was 2)\n6 steps", "user:otto"),
        ("activated", SCALED, "version 2 activated (was 3)\n6 steps", "user:otto"),
    ], rows
    assert [_steps(row) for row in latest.locator("table.history tbody tr").all()[:2]] == activations
    expect(latest.get_by_role("link", name="All events")).to_have_attribute("href", "/history")
    latest.locator("table.history tbody tr").first.locator("summary").click()
    assert_accessible(page)
    screenshot(page, "console-overview-events")


# --- a daemon whose models cannot be loaded on request -------------------------------------------------------------


def test_controls_are_disabled_outside_explicit_mode(repository: Path, tmp_path: Path, page: Page) -> None:
    state = tmp_path / "state"
    state.mkdir()
    create_user(state, "otto", "operator")
    with run_server([repository], "--state-dir", str(state), "--model-control-mode", "none") as server:
        browser_login(page, server.console_url, "otto")
        page.goto(f"{server.console_url}/models")
        expect(page.locator("#controls-mode")).to_contain_text("needs --model-control-mode explicit")
        page.goto(f"{server.console_url}/models/{SCALED}")
        buttons = page.locator("#model-live button")
        assert buttons.count() >= 4
        for button in buttons.all():
            expect(button).to_be_disabled()
            assert button.get_attribute("aria-describedby") == "controls-mode"
        assert_accessible(page)
        # The server refuses it as the API does (model control is not explicit), and says so in the result line.
        otto = http_login(server.console_port, "otto")
        form = {"csrf_token": otto.csrf_token}
        status, _, text = otto.request("POST", f"/models/{SCALED}/unload", form, {"HX-Request": "true"})
        assert status == 200
        assert "refused (503 Service Unavailable): explicit model load / unload is not allowed" in text, text[:500]
        status, _, _ = otto.request("POST", f"/models/{SCALED}/versions/1/activate", form)
        assert status == 303
        _, _, text = otto.request("GET", f"/models/{SCALED}")
        assert "refused (503 Service Unavailable)" in text, text[-2000:]
        triton = httpclient.InferenceServerClient(server.http_url)
        try:
            assert triton.is_model_ready(SCALED)
        finally:
            triton.close()
