"""The outbox transport against the shared transport contract."""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path

import pytest
from contract import TransportContract, email_message
from fakes import ScriptedTransport

from resetctl.store import Store
from resetctl.transports import (
    AmbiguousError,
    Message,
    PermanentError,
    TransientError,
    TransportError,
    TransportPlugin,
    plugin,
)
from resetctl.transports.outbox import OutboxTransport


@dataclass
class OutboxHarness:
    store: Store
    transport: ScriptedTransport
    plugin: TransportPlugin
    channel: str = "email"
    reports_later_statuses: bool = True
    errors: dict[str, TransportError] = field(
        default_factory=lambda: {
            "reject": PermanentError("refused"),
            "transient": TransientError("database busy"),
            "ambiguous": AmbiguousError("unknown"),
        }
    )

    def message(self) -> Message:
        return email_message()

    def script(self, outcome: str) -> None:
        # The outbox itself never refuses: a failure is injected in front of it.
        self.transport.submit_errors = [] if outcome == "accept" else [self.errors[outcome]]

    def report(self, message_id: str, outcome: str) -> None:
        assert self.store.outbox_set_status(message_id, outcome, 0.0)

    def logs(self) -> str:
        return ""


class TestOutboxContract(TransportContract):
    @pytest.fixture
    def harness(self, tmp_path: Path) -> Iterator[OutboxHarness]:
        found = plugin("outbox")
        assert found is not None
        with Store(tmp_path / "outbox.db") as store:
            inner = OutboxTransport(store, "pending", lambda: 0.0)
            yield OutboxHarness(store, ScriptedTransport(inner), found)
