"""The console's tests in a real browser: Debian's Chromium driven by Playwright, with accessibility checks,
screenshots and a watch on every page for JavaScript errors and Content-Security-Policy violations.

Playwright comes from PyPI but its own browser download is never used: ``launch`` starts ``/usr/bin/chromium``
(Debian's ``chromium``, which ``EDGED_SETUP_FOR_TESTS=1 scripts/setup`` installs). The pytest fixtures built on
this module live in ``console_fixtures.py``.

axe-core runs under the console's strict CSP (``script-src 'self'``): ``page.add_script_tag`` would insert an
inline script, which that policy blocks (and reports as a violation), so ``axe_violations`` evaluates axe's source
through the DevTools protocol instead, which a page's CSP does not govern. The page under test keeps its real
policy, so the same page is checked for accessibility and for CSP violations.
"""

from __future__ import annotations

import json
import os
import re
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Final, Literal
from urllib.parse import urlsplit

from playwright.sync_api import Browser, BrowserContext, ConsoleMessage, Page, ViewportSize, sync_playwright
from playwright.sync_api import Error as PlaywrightError

REPO_ROOT: Final = Path(__file__).resolve().parents[1]
CHROMIUM: Final = Path("/usr/bin/chromium")
# Headless, and nothing that reaches out on its own: the test machines have no network, and a background request
# would be noise in what the tests observe.
CHROMIUM_ARGS: Final = (
    "--headless",
    "--no-sandbox",
    "--disable-gpu",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
    "--no-first-run",
)
DESKTOP: Final = ViewportSize(width=1280, height=800)
PHONE: Final = ViewportSize(width=390, height=844)

AXE_SCRIPT: Final = REPO_ROOT / "tests" / "vendor" / "axe-core-4.14.1" / "axe.min.js"
SERIOUS: Final = ("serious", "critical")
# Shown per violation in assert_accessible's message; the rest are counted.
NODES_SHOWN: Final = 3

ARTIFACTS_ENV: Final = "EDGED_TEST_ARTIFACTS"
DEFAULT_ARTIFACTS: Final = REPO_ROOT / "test-artifacts"

# Marks the messages of the violation listener below, so they are told apart from the page's own console.error.
CSP_PREFIX: Final = "edged-test: CSP violation:"
# Runs in every document of a watched context before the page's scripts (an init script is not subject to the
# page's CSP). console.error is captured first so a page that replaces it cannot silence the report.
_CSP_LISTENER: Final = f"""(() => {{
  const report = console.error.bind(console);
  document.addEventListener("securitypolicyviolation", (event) => {{
    report({json.dumps(CSP_PREFIX)} + " " + event.effectiveDirective + " blocked " + (event.blockedURI || "?") +
      " at " + (event.sourceFile || document.location.href) + ":" + event.lineNumber +
      (event.sample ? " (" + event.sample + ")" : ""));
  }});
}})();"""


@contextmanager
def launch() -> Iterator[Browser]:
    """Debian's Chromium, headless, under Playwright; closed (with Playwright's driver) on exit."""
    if not CHROMIUM.exists():
        raise RuntimeError(f"{CHROMIUM} is not installed: run EDGED_SETUP_FOR_TESTS=1 scripts/setup")
    with sync_playwright() as playwright:
        browser = playwright.chromium.launch(executable_path=str(CHROMIUM), args=list(CHROMIUM_ARGS))
        try:
            yield browser
        finally:
            browser.close()


@dataclass
class PageProblems:
    """What went wrong in the pages of one browser context: console errors, uncaught exceptions, CSP violations.

    Each is a defect of the page under test, so a watched page fails its test when any was recorded.
    """

    console_errors: list[str] = field(default_factory=list)
    page_errors: list[str] = field(default_factory=list)
    csp_violations: list[str] = field(default_factory=list)

    def __bool__(self) -> bool:
        return bool(self.console_errors or self.page_errors or self.csp_violations)

    def report(self) -> str:
        lines: list[str] = []
        for title, entries in (
            ("CSP violations", self.csp_violations),
            ("JavaScript errors", self.page_errors),
            ("console errors", self.console_errors),
        ):
            if entries:
                lines.append(f"{title}:")
                lines.extend(f"  {entry}" for entry in entries)
        return "\n".join(lines)

    def on_console(self, message: ConsoleMessage) -> None:
        if message.type != "error":
            return
        text = message.text
        url = message.location.get("url", "")
        if text.startswith(CSP_PREFIX):
            self.csp_violations.append(text.removeprefix(CSP_PREFIX).strip())
        elif "Content Security Policy" in text:
            # Chromium's own report of the same violation: it names what a policy would need to allow it.
            self.csp_violations.append(f"{text} ({url or 'page'})")
        elif _is_automatic_favicon(text, url):
            pass
        else:
            self.console_errors.append(f"{text} ({url})" if url else text)

    def on_page_error(self, error: PlaywrightError) -> None:
        self.page_errors.append(error.stack or f"{error.name}: {error.message}")


def _is_automatic_favicon(text: str, url: str) -> bool:
    # Chromium asks for /favicon.ico by itself; a page that names no icon is not at fault when that fails.
    return text.startswith("Failed to load resource") and urlsplit(url).path == "/favicon.ico"


def watch(context: BrowserContext) -> PageProblems:
    """Records the problems of every page opened in ``context`` from now on (open the pages after this call)."""
    problems = PageProblems()
    context.add_init_script(script=_CSP_LISTENER)

    def on_page(page: Page) -> None:
        page.on("console", problems.on_console)
        page.on("pageerror", problems.on_page_error)

    for page in context.pages:
        on_page(page)
    context.on("page", on_page)
    return problems


@dataclass
class WatchedPage:
    """A page in a context of its own, with the problems recorded for that context."""

    page: Page
    problems: PageProblems


@contextmanager
def open_page(
    browser: Browser,
    *,
    viewport: ViewportSize = DESKTOP,
    check: bool = True,
    color_scheme: Literal["light", "dark"] = "light",
    javascript: bool = True,
) -> Iterator[WatchedPage]:
    """A new context and page at ``viewport``, watched; on exit the context is closed and, with ``check``,
    AssertionError is raised when the page logged an error, threw, or violated its CSP. ``color_scheme``: what the
    page's prefers-color-scheme says; ``javascript``: False to see the pages as a browser without it does.
    """
    context = browser.new_context(viewport=viewport, color_scheme=color_scheme, java_script_enabled=javascript)
    problems = watch(context)
    try:
        yield WatchedPage(context.new_page(), problems)
    finally:
        context.close()
    if check and problems:
        raise AssertionError(f"the page had problems:\n{problems.report()}")


def axe_violations(page: Page, *, impact: Sequence[str] = SERIOUS) -> list[dict[str, Any]]:
    """axe-core's violations on the page as it is now, those of the given impacts ("minor", "moderate",
    "serious", "critical"), as axe reports them (id, impact, help, helpUrl, nodes with their targets).
    """
    # Evaluated rather than added as a <script>: see the module's docstring. Once per document.
    if not page.evaluate("() => typeof window.axe === 'object'"):
        page.evaluate(f"() => {{ {AXE_SCRIPT.read_text(encoding='utf-8')}\n}}")
    violations: list[dict[str, Any]] = page.evaluate(
        "async () => (await window.axe.run(document, { resultTypes: ['violations'] })).violations"
    )
    return [violation for violation in violations if violation.get("impact") in impact]


def format_violations(violations: Sequence[dict[str, Any]]) -> str:
    lines: list[str] = []
    for violation in violations:
        nodes = violation.get("nodes", [])
        lines.append(f"{violation['id']} ({violation.get('impact')}): {violation.get('help')}")
        for node in nodes[:NODES_SHOWN]:
            lines.append(f"    at {', '.join(json.dumps(part) for part in node.get('target', []))}")
        if len(nodes) > NODES_SHOWN:
            lines.append(f"    and {len(nodes) - NODES_SHOWN} more")
    return "\n".join(lines)


def assert_accessible(page: Page, *, impact: Sequence[str] = SERIOUS) -> None:
    """Fails with one line per axe-core violation of those impacts (rule, impact, help, where)."""
    violations = axe_violations(page, impact=impact)
    if violations:
        raise AssertionError(
            f"{len(violations)} accessibility violation(s) on {page.url}:\n{format_violations(violations)}"
        )


def artifacts_dir() -> Path:
    """Where the tests leave files for people to look at: ``$EDGED_TEST_ARTIFACTS``, else ``test-artifacts/``."""
    configured = os.environ.get(ARTIFACTS_ENV)
    return Path(configured) if configured else DEFAULT_ARTIFACTS


def screenshot(page: Page, name: str) -> Path:
    """Saves the whole page as ``<artifacts>/screenshots/<name>.png`` (replacing an older one) and returns it."""
    stem = re.sub(r"[^A-Za-z0-9._-]+", "-", name.removesuffix(".png")).strip("-.") or "page"
    path = artifacts_dir() / "screenshots" / f"{stem}.png"
    path.parent.mkdir(parents=True, exist_ok=True)
    page.screenshot(path=path, full_page=True)
    return path


# What clips content at the page's width, measured in the page: the document wider than the viewport (the page
# scrolls sideways as a whole), and any table cell that lies past the right edge of a box that neither scrolls nor
# lets it show (an ancestor with overflow hidden or clip, or the viewport itself).
_CLIPPED: Final = """() => {
  const width = document.documentElement.clientWidth;
  const problems = [];
  if (document.documentElement.scrollWidth > width + 1) {
    problems.push(`the page is ${document.documentElement.scrollWidth}px wide in a ${width}px viewport`);
  }
  for (const cell of document.querySelectorAll("th, td")) {
    const right = cell.getBoundingClientRect().right;
    let box = cell.parentElement;
    let scrolls = false;
    while (box && box !== document.body) {
      const style = getComputedStyle(box);
      if (["auto", "scroll"].includes(style.overflowX)) { scrolls = true; break; }
      if (["hidden", "clip"].includes(style.overflowX) && right > box.getBoundingClientRect().right + 1) {
        const where = `${box.tagName.toLowerCase()}.${box.className}`;
        problems.push(`${cell.textContent.trim().slice(0, 30)} is cut by ${where}`);
        break;
      }
      box = box.parentElement;
    }
    if (!scrolls && right > width + 1) {
      const text = cell.textContent.trim().slice(0, 30);
      problems.push(`${text} ends at ${Math.round(right)}px, past the ${width}px viewport`);
    }
  }
  return problems;
}"""


def clipped(page: Page) -> list[str]:
    """What the page cuts off at its width (see _CLIPPED): empty when every table either fits or scrolls in its box."""
    problems: list[str] = page.evaluate(_CLIPPED)
    return problems
