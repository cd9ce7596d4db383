"""The daemon writes nothing outside its state directory and repositories on its own account: ONNX Runtime's
telemetry store (a device id and an event database under ``$HOME/.cache/Microsoft``) is not made."""

from __future__ import annotations

from pathlib import Path

import tritonclient.http as httpclient
from server import REPO_ROOT, add_sub_inputs, run_server


def test_serving_an_onnx_model_leaves_home_untouched(tmp_path: Path) -> None:
    home = tmp_path / "home"
    home.mkdir()
    environment = {"HOME": str(home), "XDG_CACHE_HOME": None, "ORT_DISABLE_TELEMETRY": None}
    with run_server([REPO_ROOT / "model_repository"], environment=environment) as server:
        client = httpclient.InferenceServerClient(server.http_url)
        result = client.infer("add_sub", add_sub_inputs())
        assert result.as_numpy("OUTPUT0") is not None
    assert sorted(str(path.relative_to(home)) for path in home.rglob("*")) == []
