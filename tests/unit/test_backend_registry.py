"""The daemon's set of backends: one backend per name, however many models load through it at once."""

from __future__ import annotations

import threading
import time
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import pytest

import edged.backends
from edged.backends import BackendRegistry
from edged.backends.python.backend import PythonBackend
from edged.errors import EdgedError, ErrorCode


class SlowPythonBackend(PythonBackend):
    """The Python backend, built slowly enough that loads on other threads ask for it meanwhile (building one
    really takes a few milliseconds: long enough for two loads to race in a daemon, too short to race here)."""

    def __init__(self, *args: Any) -> None:
        time.sleep(0.05)
        super().__init__(*args)


def test_models_loading_at_once_share_one_backend(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setitem(edged.backends._BACKENDS, "python", f"{__name__}:SlowPythonBackend")
    registry = BackendRegistry({})
    start = threading.Barrier(8)

    def first_load(_: int) -> object:
        start.wait()
        return registry.get("python")

    with ThreadPoolExecutor(8) as pool:
        built = list(pool.map(first_load, range(8)))
    assert all(backend is built[0] for backend in built)
    assert isinstance(built[0], SlowPythonBackend)
    assert registry.get("python") is built[0]


def test_an_unknown_backend_is_refused_by_name() -> None:
    with pytest.raises(EdgedError) as raised:
        BackendRegistry({}).get("tensorrt_llm")
    assert raised.value.code == ErrorCode.UNSUPPORTED
    assert "unable to find backend 'tensorrt_llm'" in raised.value.message
