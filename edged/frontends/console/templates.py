"""The console's template engine: Litestar's Jinja engine, made when the first page is rendered.

A device whose console nobody opens then never imports Jinja (about 1.7 MB of a daemon's memory); the first page
costs the import once, a few milliseconds.
"""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING, Any

from edged.frontends.console.figures import FILTERS

if TYPE_CHECKING:
    from collections.abc import Callable, Mapping

    from jinja2 import Template
    from litestar.plugins.jinja import JinjaTemplateEngine


class LazyJinja:
    """Litestar's TemplateEngineProtocol, passed on to a JinjaTemplateEngine made on first use, with the console's
    filters and every callable registered before."""

    def __init__(self, directory: Path | list[Path] | None, engine_instance: Any | None = None) -> None:
        if directory is None or engine_instance is not None:
            raise ValueError("the console's templates come from a directory")
        self._directory = directory
        self._engine: JinjaTemplateEngine | None = None
        self._callables: list[tuple[str, Callable[..., Any]]] = []

    def _jinja(self) -> JinjaTemplateEngine:
        if self._engine is None:
            from litestar.plugins.jinja import JinjaTemplateEngine

            engine = JinjaTemplateEngine(directory=self._directory)
            engine.engine.filters.update(FILTERS)
            # Block tags leave no blank lines behind: the pages stay small.
            engine.engine.trim_blocks = True
            engine.engine.lstrip_blocks = True
            for key, template_callable in self._callables:
                engine.register_template_callable(key, template_callable)
            self._engine = engine
        return self._engine

    def get_template(self, template_name: str) -> Template:
        return self._jinja().get_template(template_name)

    def render_string(self, template_string: str, context: Mapping[str, Any]) -> str:
        return self._jinja().render_string(template_string, context)

    def register_template_callable(self, key: str, template_callable: Callable[..., Any]) -> None:
        if self._engine is not None:
            self._engine.register_template_callable(key, template_callable)
        else:
            self._callables.append((key, template_callable))
