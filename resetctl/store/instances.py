"""Provider instance health rows (``provider_health``): read by every sweep, written
when a call fails, a failing instance answers again, or a probe is claimed. What a row
means and how a call changes it is :mod:`resetctl.failover`'s; this module reads and
writes."""

from __future__ import annotations

from collections.abc import Sequence

from resetctl.failover import InstanceHealth, after_failure, after_success
from resetctl.instances import Failover
from resetctl.store.connection import StoreConnection

_COLUMNS = (
    "instance, failures, first_failure_at, open_until, probe_until, opened,"
    " total_failures, last_failure_at, last_success_at"
)


def _health(row: Sequence[object]) -> InstanceHealth:
    return InstanceHealth(*row)  # type: ignore[arg-type]  # the columns, in order


class InstanceHealthRows(StoreConnection):
    """The provider_health table (shared SQL)."""

    def instance_health(self) -> dict[str, InstanceHealth]:
        """Every instance's health row, by name (an instance never failed has none)."""
        rows = self.conn.execute(f"SELECT {_COLUMNS} FROM provider_health ORDER BY instance")
        return {str(row[0]): _health(tuple(row)) for row in rows}

    def record_instance_calls(
        self, endings: Sequence[tuple[str, bool]], now: float, failover: Failover
    ) -> dict[str, InstanceHealth]:
        """Count calls that ended at ``now`` (instance, failed) and return the rows after.

        Each row is read under a lock (FOR UPDATE on PostgreSQL; SQLite's write
        transaction excludes other writers), so two hosts counting the same instance's
        failures count them one after the other.
        """
        names = sorted({name for name, _ in endings})

        def write() -> dict[str, InstanceHealth]:
            self.conn.executemany(
                "INSERT INTO provider_health (instance) VALUES (?)"
                " ON CONFLICT (instance) DO NOTHING",
                [(name,) for name in names],
            )
            rows: dict[str, InstanceHealth] = {}
            for name in names:
                row = self.conn.execute(
                    f"SELECT {_COLUMNS} FROM provider_health WHERE instance = ?"
                    f"{self.sql.lock_rows}",
                    (name,),
                ).fetchone()
                rows[name] = _health(tuple(row))
            for name, failed in endings:
                health = rows[name]
                rows[name] = (
                    after_failure(health, now, failover) if failed else after_success(health, now)
                )
            self.conn.executemany(
                "UPDATE provider_health SET failures = ?, first_failure_at = ?,"
                " open_until = ?, probe_until = ?, opened = ?, total_failures = ?,"
                " last_failure_at = ?, last_success_at = ? WHERE instance = ?",
                [
                    (
                        h.failures,
                        h.first_failure_at,
                        h.open_until,
                        h.probe_until,
                        h.opened,
                        h.total_failures,
                        h.last_failure_at,
                        h.last_success_at,
                        name,
                    )
                    for name, h in rows.items()
                ],
            )
            return rows

        return self.retried_transaction(write)

    def live_attempt_instances(self) -> list[tuple[str, str]]:
        """(channel, instance) of every live notice's attempts: the instances whose
        messages a sweep may still have to read, whatever ``[transport]`` names now."""
        rows = self.conn.execute(
            "SELECT DISTINCT a.channel, a.transport FROM notices n"
            " JOIN attempts a ON a.notice_id = n.id WHERE n.due_at IS NOT NULL"
            " ORDER BY a.channel, a.transport"
        )
        return [(str(channel), str(instance)) for channel, instance in rows]

    def claim_probe(self, instance: str, now: float, until: float) -> bool:
        """Make this caller the one whose next call probes ``instance`` (its cooldown
        over, no other probe in flight); False when it is not half open or another
        process claimed the probe first. The claim lapses at ``until``."""

        def write() -> bool:
            changed = self.conn.execute(
                "UPDATE provider_health SET probe_until = ? WHERE instance = ?"
                " AND open_until IS NOT NULL AND open_until <= ?"
                " AND (probe_until IS NULL OR probe_until <= ?)",
                (until, instance, now, now),
            )
            return bool(changed.rowcount == 1)

        return self.retried_transaction(write)
