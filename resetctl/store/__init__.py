"""All SQL, behind one class (:class:`Store`) over two backends: SQLite (the embedded
default) and PostgreSQL (for sweeps on several hosts; ``pip install 'resetctl[postgres]'``).

The store's SQL is written once and split by concern: notice writes (``notice_writes``:
enqueue's insert, claims, compare-and-set steps), notice reads (``notice_reads``), the
operational commands' reads and records (``operations``), the outbox (``outbox``), the
abuse limits' counts (``limits``) and rollout's shadow marks and slice answers
(``rollout``), over the connection and write transactions (``connection``). Each backend
(``sqlite``, ``postgres``) holds only its connection handling, its dialect
(``backend.Dialect``) and its schema with migrations. This module names what the rest
of resetctl imports.
"""

from __future__ import annotations

from resetctl.store.backend import database_errors, database_label, error_line, is_postgres
from resetctl.store.records import (
    Claim,
    Contact,
    DeclinedFacts,
    Facts,
    IntentFacts,
    LoadedNotice,
    LookupFacts,
    NewNotice,
    ObservationFacts,
    OutcomeFacts,
    SkippedFacts,
    Step,
    StepKind,
    StepResult,
    new_notice_id,
    outbox_message_id,
)
from resetctl.store.store import Store, copy_database, open_store

__all__ = [
    "Claim",
    "Contact",
    "DeclinedFacts",
    "Facts",
    "IntentFacts",
    "LoadedNotice",
    "LookupFacts",
    "NewNotice",
    "ObservationFacts",
    "OutcomeFacts",
    "SkippedFacts",
    "Step",
    "StepKind",
    "StepResult",
    "Store",
    "copy_database",
    "database_errors",
    "database_label",
    "error_line",
    "is_postgres",
    "new_notice_id",
    "open_store",
    "outbox_message_id",
]
