"""The HTTP API reference page, made from edged's OpenAPI document while the site is built.

``edged/frontends/http/openapi.json`` is the document the daemon serves at ``GET /v2/openapi.json`` and the one its
tests check every route and every answer against; the reference page is drawn from it, so that it cannot say
something else. A page asks for it with a line of its own, ``<!-- openapi -->``, replaced by one section per
operation: its method and path, summary and description, parameters and answers.

mkdocs.yml names this file under ``hooks:``; tests/unit/test_docs.py calls ``reference`` directly.
"""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import TYPE_CHECKING, Any, Final

if TYPE_CHECKING:
    from mkdocs.config.defaults import MkDocsConfig
    from mkdocs.structure.files import Files
    from mkdocs.structure.pages import Page

DOCUMENT: Final = Path(__file__).resolve().parents[2] / "edged" / "frontends" / "http" / "openapi.json"
MARKER: Final = re.compile(r"^<!-- openapi -->[ \t]*$", re.MULTILINE)
METHODS: Final = ("get", "post", "put", "delete", "patch")
# What Markdown would take for markup in the document's texts, written escaped.
MARKUP: Final = re.compile(r"([\\`*_\[\]|<>])")


def reference(document: dict[str, Any]) -> str:
    """The Markdown of every operation in ``document``, grouped by its first tag, in the document's order."""
    sections: dict[str, list[str]] = {}
    for path, item in document["paths"].items():
        for method in METHODS:
            operation = item.get(method)
            if operation is not None:
                tag = (operation.get("tags") or ["other"])[0]
                sections.setdefault(tag, []).append(_operation(method, path, operation))
    parts = [_text(document["info"].get("description", ""))]
    for tag, operations in sections.items():
        parts.append(f"## {tag}\n")
        parts.extend(operations)
    return "\n".join(parts)


def on_page_markdown(markdown: str, page: Page, config: MkDocsConfig, files: Files, **kwargs: Any) -> str:
    """MkDocs' hook: the marker, where a page has it, becomes the reference."""
    if not MARKER.search(markdown):
        return markdown
    document = json.loads(DOCUMENT.read_text(encoding="utf-8"))
    return MARKER.sub(lambda _: reference(document), markdown)


def _operation(method: str, path: str, operation: dict[str, Any]) -> str:
    lines = [f"### `{method.upper()} {path}`\n"]
    if operation.get("summary"):
        lines.append(f"**{_text(operation['summary'])}**\n")
    if operation.get("description"):
        lines.append(_text(operation["description"]) + "\n")
    parameters = operation.get("parameters", [])
    if parameters:
        lines.append("| parameter | in | required | meaning |\n|---|---|---|---|")
        for parameter in parameters:
            required = "yes" if parameter.get("required") else "no"
            meaning = _text(parameter.get("description", ""))
            lines.append(f"| `{parameter['name']}` | {parameter['in']} | {required} | {meaning} |")
        lines.append("")
    responses = operation.get("responses", {})
    if responses:
        lines.append("| status | when |\n|---|---|")
        for status, response in responses.items():
            lines.append(f"| {status} | {_text(response.get('description', ''))} |")
        lines.append("")
    return "\n".join(lines)


def _text(text: str) -> str:
    return MARKUP.sub(r"\\\1", " ".join(text.split()))
