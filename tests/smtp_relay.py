"""A real SMTP server on loopback (aiosmtpd) that keeps each message's bytes exactly as
they arrived: what the SMTP transport's tests read back."""

from __future__ import annotations

import email
import socket
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from email.message import EmailMessage
from email.policy import default as default_policy

from aiosmtpd.controller import Controller
from aiosmtpd.smtp import SMTP, Envelope, Session


def free_port() -> int:
    """A loopback port nothing listens on (yet)."""
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port: int = probe.getsockname()[1]
        return port


@dataclass
class Relay:
    """An aiosmtpd handler keeping each message's bytes exactly as they arrived."""

    port: int = 0
    raw: list[bytes] = field(default_factory=list)

    async def handle_DATA(self, server: SMTP, session: Session, envelope: Envelope) -> str:
        assert isinstance(envelope.original_content, bytes)
        self.raw.append(envelope.original_content)
        return "250 2.0.0 OK queued"

    def parsed(self, index: int = -1) -> EmailMessage:
        """A received message, parsed as a receiver would."""
        message = email.message_from_bytes(self.raw[index], policy=default_policy)
        assert isinstance(message, EmailMessage)
        return message


@contextmanager
def running_relay() -> Iterator[Relay]:
    """A relay listening on a free loopback port until the block ends."""
    handler = Relay(free_port())
    controller = Controller(
        handler, hostname="127.0.0.1", port=handler.port, server_hostname="localhost"
    )
    controller.start()
    try:
        yield handler
    finally:
        controller.stop()
