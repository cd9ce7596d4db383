"""What every instance of one Python model version shares: its configuration, the settings its stubs start with,
and what is derived from the configuration once (output types, decoupled, iterative sequences)."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from edged.core.request.datatypes import WIRE_NAME_BY_CONFIG

if TYPE_CHECKING:
    from collections.abc import Callable

    from edged.core.backend_api import ServerApi
    from edged.proto.model_config_pb2 import ModelConfig


@dataclass(slots=True)
class ModelState:
    """What every instance of one model version shares."""

    config: ModelConfig
    settings_timeout_s: float
    # How long one execute may run before its stub is killed; 0: no limit (the default, as in Triton).
    execute_timeout_s: float
    shm_size: int
    interpreter: str
    env: dict[str, str]
    init: dict[str, Any]
    args: dict[str, str]
    # The backend's custom-metric bookkeeping: (instance name, a stub's metric message).
    record_metric: Callable[[str, dict[str, Any]], None]
    host: ServerApi | None
    # Where the model lies on this device (its folder, as given and resolved) -> what a client is told instead.
    private_paths: tuple[tuple[str, str], ...] = ()

    output_types: dict[str, str] = field(init=False)
    output_names: list[str] = field(init=False)
    decoupled: bool = field(init=False)
    # sequence_batching { iterative_sequence: true }: a request the model releases with RESCHEDULE runs again.
    iterative: bool = field(init=False)
    # Outputs the model answered with that its configuration does not declare as they came (logged once each).
    warned_outputs: set[str] = field(init=False, default_factory=set)

    def for_client(self, text: str) -> str:
        """A model's own error text as a client may see it. The text passes as the model wrote it (as in Triton)
        but for the model's folder, named by what it is rather than where: a path tells a client how the device is
        laid out (the daemon's log keeps the full text)."""
        for path, name in self.private_paths:
            text = text.replace(path, name)
        return text

    def __post_init__(self) -> None:
        self.output_types = {o.name: WIRE_NAME_BY_CONFIG.get(o.data_type, "") for o in self.config.output}
        # A sequence model may also answer with its implicit state, which the sequence batcher takes back.
        for state in self.config.sequence_batching.state:
            self.output_types[state.output_name] = WIRE_NAME_BY_CONFIG.get(state.data_type, "")
        self.output_names = list(self.output_types)
        self.decoupled = bool(self.config.model_transaction_policy.decoupled)
        self.iterative = self.config.HasField("sequence_batching") and self.config.sequence_batching.iterative_sequence
