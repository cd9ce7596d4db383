"""``grpc.health.v1.Health/Watch`` with grpc's own health stub: the status at once and on each change of readiness,
SERVICE_UNKNOWN for a service edged does not serve, and every watch ended cleanly when the daemon stops."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Final

import grpc
import modelgen
import pytest
import tritonclient.http as httpclient
from server import run_server
from tritonclient.utils import InferenceServerException

from edged.proto import health_pb2, health_pb2_grpc

# A deadline for each watch, only so that a test that goes wrong ends: every step waits on a message.
WATCH_DEADLINE_S: Final = 120.0
SERVING: Final = health_pb2.HealthCheckResponse.SERVING
NOT_SERVING: Final = health_pb2.HealthCheckResponse.NOT_SERVING
SERVICE_UNKNOWN: Final = health_pb2.HealthCheckResponse.SERVICE_UNKNOWN


def _statuses(replies: Iterator[health_pb2.HealthCheckResponse]) -> Iterator[int]:
    for reply in replies:
        yield reply.status


def test_watch_follows_readiness_and_ends_at_shutdown(tmp_path: Path) -> None:
    repo = tmp_path / "repo"
    modelgen.write_add_sub(repo / "add_sub", max_batch_size=8)
    broken = repo / "broken"
    broken.mkdir()
    (broken / "config.pbtxt").write_text("this is not a model config\n", encoding="utf-8")
    with run_server([repo], "--model-control-mode", "explicit", "--load-model", "add_sub") as server:
        client = httpclient.InferenceServerClient(server.http_url)
        channel = grpc.insecure_channel(server.grpc_url)
        stub = health_pb2_grpc.HealthStub(channel)
        whole = stub.Watch(health_pb2.HealthCheckRequest(), timeout=WATCH_DEADLINE_S)
        named = stub.Watch(
            health_pb2.HealthCheckRequest(service="inference.GRPCInferenceService"), timeout=WATCH_DEADLINE_S
        )
        unknown = stub.Watch(health_pb2.HealthCheckRequest(service="no.such.Service"), timeout=WATCH_DEADLINE_S)
        statuses, named_statuses = _statuses(whole), _statuses(named)
        assert next(statuses) == SERVING
        assert next(named_statuses) == SERVING
        assert next(unknown).status == SERVICE_UNKNOWN

        # A model that should be served and failed to load makes the server not ready (strict readiness).
        with pytest.raises(InferenceServerException):
            client.load_model("broken")
        assert not client.is_server_ready()
        assert next(statuses) == NOT_SERVING
        assert next(named_statuses) == NOT_SERVING

        # Unloaded, it no longer has to be served: ready again.
        client.unload_model("broken")
        assert next(statuses) == SERVING
        assert client.is_server_ready()
        client.close()
    # The daemon stopped: each watch said NOT_SERVING and ended with OK (an error status would raise here).
    assert list(statuses) == [NOT_SERVING]
    assert list(named_statuses) == [SERVING, NOT_SERVING]
    assert list(unknown) == []
    channel.close()


def test_watches_through_frontend_workers_end_as_the_daemons_do(tmp_path: Path) -> None:
    """The kernel spreads connections between the daemon and its workers (one port, SO_REUSEPORT); a worker relays
    a Watch to the daemon, and each watch behaves the same wherever it landed."""
    modelgen.write_add_sub(tmp_path / "add_sub", max_batch_size=8)
    watches = []
    with run_server([tmp_path], "--frontend-workers", "2") as server:
        for _ in range(8):
            # A channel of its own, and so a connection of its own, for each watch.
            channel = grpc.insecure_channel(server.grpc_url, options=[("grpc.use_local_subchannel_pool", 1)])
            watch = health_pb2_grpc.HealthStub(channel).Watch(health_pb2.HealthCheckRequest(), timeout=WATCH_DEADLINE_S)
            statuses = _statuses(watch)
            assert next(statuses) == SERVING
            watches.append((channel, statuses))
    for channel, statuses in watches:
        assert list(statuses) == [NOT_SERVING]
        channel.close()
