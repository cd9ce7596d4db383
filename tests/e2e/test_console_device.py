"""What the console shows of the device itself, against the real daemon in a real browser: the Health card's CPU and
memory of edged's own processes beside the host's, each labelled; the Device card's free disk space where the state
directory and the model repository are, and the temperatures the kernel exposes (none in a container: said so);
and a Python model's memory, per instance process, on its page. Each page is checked with axe-core."""

from __future__ import annotations

import re
import shutil
import sys
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Final

import pytest
from browser import assert_accessible, screenshot
from conftest import PYTHON_MODELS
from console_session import browser_login, console_server
from playwright.sync_api import expect
from server import REPO_ROOT, Server

sys.path.insert(0, str(REPO_ROOT / "scripts"))

import modelgen  # type: ignore[import-not-found, unused-ignore]

if TYPE_CHECKING:
    from playwright.sync_api import Locator, Page

pytest_plugins = ("console_fixtures",)

# Long enough for the overview to poll a few times on a loaded machine; the checks end as soon as the page shows it.
WAIT_MS: Final = 30_000
PERCENT: Final = re.compile(r"^\d+(\.\d)? %")
SIZE: Final = re.compile(r"^\d+(\.\d)? (B|KiB|MiB|GiB)")


@dataclass(frozen=True)
class Device:
    server: Server
    state_dir: Path
    repository: Path


@pytest.fixture(scope="module")
def device(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Device]:
    # An ONNX model served inside the daemon, and a Python model whose two instances are stub processes of their own.
    repository = tmp_path_factory.mktemp("device-repository")
    modelgen.write_add_sub(repository / "add_sub", max_batch_size=8, dims=16, dtype="FP32")
    shutil.copytree(PYTHON_MODELS / "add_sub_python", repository / "add_sub_python")
    state_dir = tmp_path_factory.mktemp("device-state")
    with console_server([repository], state_dir) as running:
        yield Device(running, state_dir, repository)


def _fact(page: Page, label: str) -> Locator:
    """The value (dd) after the term (dt) ``label`` of a card's facts."""
    return page.locator(f"dt:text-is('{label}') + dd")


def test_health_shows_edgeds_own_cpu_and_memory_beside_the_hosts(device: Device, page: Page) -> None:
    browser_login(page, device.server.console_url, "vera")
    health = page.get_by_role("region", name="Health", exact=True)
    expect(health).to_be_visible()
    # The overview polls every few seconds: the figures are there once the history has two readings of edged.
    expect(_fact(page, "CPU, edged")).to_have_text(PERCENT, timeout=WAIT_MS)
    expect(_fact(page, "CPU, edged")).to_contain_text("of all CPUs")
    expect(_fact(page, "CPU, host")).to_have_text(PERCENT, timeout=WAIT_MS)
    expect(_fact(page, "Memory, edged")).to_have_text(SIZE, timeout=WAIT_MS)
    expect(_fact(page, "Memory, edged")).to_contain_text("resident")
    expect(_fact(page, "Memory, host")).to_have_text(re.compile(r"^\d+(\.\d)? \w+ of \d+(\.\d)? GiB$"), timeout=WAIT_MS)
    screenshot(page, "console-overview-health")
    assert_accessible(page)


def test_the_device_card_names_where_disk_space_is_read(device: Device, page: Page) -> None:
    browser_login(page, device.server.console_url, "vera")
    card = page.get_by_role("region", name="Device", exact=True)
    expect(card).to_be_visible()
    state = _fact(page, "State directory")
    expect(state).to_contain_text(str(device.state_dir))
    expect(state).to_contain_text(re.compile(r"\d+(\.\d)? (B|KiB|MiB|GiB) free of \d+(\.\d)? (B|KiB|MiB|GiB)"))
    repository = _fact(page, "Model repository")
    expect(repository).to_contain_text(str(device.repository))
    expect(repository).to_contain_text("free of")
    # Temperatures where this machine's kernel exposes some; in a container, the card says there are none.
    sensors = [*Path("/sys/class/thermal").glob("thermal_zone*/temp"), *Path("/sys/class/hwmon").glob("*/temp*")]
    if sensors:
        expect(card.get_by_text(re.compile(r"\d+ °C"))).not_to_have_count(0)
    else:
        expect(card.get_by_text("No temperature sensor is exposed here.")).to_be_visible()
    # The card survives the overview's poll (it is part of the part that reloads).
    with page.expect_response(lambda r: r.url.endswith("/overview/live")):
        pass
    expect(_fact(page, "State directory")).to_contain_text(str(device.state_dir))
    screenshot(page, "console-overview-device")
    assert_accessible(page)


def test_a_python_models_page_shows_each_instance_processs_memory(device: Device, page: Page) -> None:
    browser_login(page, device.server.console_url, "vera")
    page.goto(f"{device.server.console_url}/models/add_sub_python")
    memory = page.get_by_role("region", name="Memory", exact=True)
    expect(memory).to_be_visible()
    table = memory.get_by_role("table", name="Memory of each instance process")
    for instance in ("add_sub_python_0_0", "add_sub_python_0_1"):
        row = table.get_by_role("row", name=re.compile(f"^{instance} "))
        expect(row.locator("td").last).to_have_text(SIZE)
    expect(memory).to_contain_text("resident in its 2 instance processes")
    assert_accessible(page)
    screenshot(page, "console-model-memory")

    # A model served inside the daemon has no memory of its own to show.
    page.goto(f"{device.server.console_url}/models/add_sub")
    expect(page.get_by_role("region", name="Memory", exact=True)).to_contain_text("inside edged's own process")
