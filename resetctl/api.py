"""The Python API: one handle over one database, making the same calls the CLI makes.

``resetctl.open(db=…, config=…)`` returns a :class:`Handle`; the command line is a thin
layer over it, so an application and ``resetctl`` go through one path. What needs no
database (``replay``, the ``templates`` commands) is a function here. Only this module's
names (and the result types it returns) are the stable API: the modules behind it may
change. Every error is a :class:`resetctl.errors.ResetctlError`, never a bare database
error.

Importing this module stays cheap (the cron tick's start-up time matters): everything
heavy is imported inside the method that needs it.
"""

from __future__ import annotations

import math
import os
import threading
import time
import weakref
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from contextlib import contextmanager
from typing import TYPE_CHECKING, Any, BinaryIO, NamedTuple

from resetctl.errors import (
    ConfigError,
    InputError,
    NoticeNotFound,
    StoreError,
)

if TYPE_CHECKING:
    from os import PathLike

    # The result types the API returns, named here (for type checkers) so a caller needs
    # no module behind the API.
    from resetctl.config import Settings
    from resetctl.controls import CancelResult as CancelResult
    from resetctl.enqueue import EnqueueResult as EnqueueResult
    from resetctl.observe import CallbackResult as CallbackResult
    from resetctl.ops import AlertsReport as AlertsReport
    from resetctl.replay import Candidate as Candidate
    from resetctl.replay import ReplayResult as ReplayResult
    from resetctl.store import Store
    from resetctl.summary import SweepSummary as SweepSummary
    from resetctl.sweep import Sweeper
    from resetctl.telemetry import Listener
    from resetctl.telemetry import TransitionEvent as TransitionEvent
    from resetctl.templates import Preview as Preview
    from resetctl.templates import TemplatesReport as TemplatesReport
    from resetctl.transports.base import CallbackReader


def open(
    db: str | PathLike[str] | None = None,
    config: str | PathLike[str] | Settings | None = None,
    *,
    create: bool = True,
    clock: Callable[[], float] = time.time,
    sleep: Callable[[float], None] = time.sleep,
    environ: Mapping[str, str] | None = None,
    busy_timeout: float | None = None,
) -> Handle:
    """Open the database ``db`` with the settings in ``config``; see :class:`Handle`."""
    return Handle(
        db,
        config,
        create=create,
        clock=clock,
        sleep=sleep,
        environ=environ,
        busy_timeout=busy_timeout,
    )


class _ThreadStore:
    """One thread's connection; it is closed when the thread's locals are released."""

    __slots__ = ("__weakref__", "store")

    def __init__(self, store: Store) -> None:
        self.store = store


class Handle:
    """resetctl over one database: every command's operation on it (enqueue, inspect,
    observe, sweep, health, alerts, metrics, purge, export, copy, the outbox, the demo).

    ``db`` defaults to the config's ``db``, else ``./resetctl.db``; ``config`` is a TOML
    path, already loaded settings, or None for the built-in policy. With ``create``
    (the default) a missing database file is created (0600) on first use, so an
    enqueue whose input is refused leaves none; without it a missing one is a
    StoreError and nothing is created. ``clock`` and ``sleep`` are the time source
    (tests pass a fake one); ``environ`` holds credentials and RESETCTL_HASH_KEY
    (default: the process environment). ``busy_timeout`` is how many seconds a write
    waits for another writer's lock before it fails with StoreError (default 30; a web
    endpoint answers sooner than its caller gives up).

    A handle may be shared by threads (a web server's): each thread gets its own
    connection to the file. Close it, or use it as a context manager.
    """

    def __init__(
        self,
        db: str | PathLike[str] | None = None,
        config: str | PathLike[str] | Settings | None = None,
        *,
        create: bool = True,
        clock: Callable[[], float] = time.time,
        sleep: Callable[[float], None] = time.sleep,
        environ: Mapping[str, str] | None = None,
        busy_timeout: float | None = None,
    ) -> None:
        from resetctl.store import database_label

        self.settings = _settings(config)
        self._database = os.fspath(db or self.settings.db or "resetctl.db")
        #: the database: a file's path, or a PostgreSQL URI without any password
        self.path = database_label(self._database)
        self.clock = clock
        self.sleep = sleep
        self._environ = environ
        self._create = create
        self._busy_timeout = busy_timeout
        self._local = threading.local()
        self._lock = threading.Lock()
        #: closes each thread's connection: when the thread ends (a server that starts a
        #: thread per request must not pile up connections) or at close()
        self._closers: list[weakref.finalize[[], _ThreadStore]] = []
        self._sweepers: set[Sweeper] = set()
        self._closed = False
        self._hash_key: bytes | None = None
        self._readers: dict[str, CallbackReader] = {}
        # Open now, so a missing or unusable database fails here, not on first use; a
        # file still to be created waits for its first write, so refused input makes none.
        if not self._unborn():
            with self._store():
                pass

    def __repr__(self) -> str:
        return f"<resetctl.Handle {self.path!r}{' closed' if self._closed else ''}>"

    def __enter__(self) -> Handle:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def close(self) -> None:
        """Close every connection this handle opened; later calls raise StoreError."""
        with self._lock:
            self._closed = True
            closers, self._closers = self._closers, []
        for closer in closers:
            closer()

    @property
    def environ(self) -> Mapping[str, str]:
        """Where credentials and RESETCTL_HASH_KEY come from."""
        return os.environ if self._environ is None else self._environ

    @contextmanager
    def _store(self) -> Iterator[Store]:
        """This thread's connection; a database error becomes a StoreError."""
        from resetctl.store import database_errors, error_line, open_store

        held: _ThreadStore | None = getattr(self._local, "held", None)
        if held is None or self._closed:
            if self._closed:
                raise StoreError(f"database {self.path}: the handle is closed")
            try:
                opened = open_store(
                    self._database, must_exist=not self._create, busy_timeout=self._busy_timeout
                )
            except database_errors() as exc:
                raise StoreError(f"database {self.path}: {error_line(exc)}") from None
            held = _ThreadStore(opened)
            with self._lock:
                self._closers = [c for c in self._closers if c.alive]
                self._closers.append(weakref.finalize(held, held.store.close))
            self._local.held = held
        store = held.store
        try:
            yield store
        except database_errors() as exc:
            # A full disk, a read-only file, a corrupt page, a lock held too long, a lost
            # server: one line naming the database (the failed transaction rolled back).
            raise StoreError(f"database {store.path}: {error_line(exc)}") from None

    def _unborn(self) -> bool:
        """True while the database is a file this handle may create and nobody has yet."""
        return self._create and not is_postgres(self.path) and not os.path.lexists(self.path)

    def _recipient_key(self) -> bytes:
        if self._hash_key is None:
            from resetctl import privacy

            self._hash_key = privacy.hash_key(self.settings, self.path, self.environ)
        return self._hash_key

    def enqueue(
        self, requests: Iterable[Mapping[str, Any]], send: bool = False
    ) -> list[EnqueueResult]:
        """Validate and record reset notices, all or none; one result per request.

        Each request has the fields of ``resetctl enqueue`` (README). The same
        idempotency key with the same fields returns the existing notice (``created``
        False). Any problem raises InputError listing every problem by position, and
        nothing is written; a request its policy refuses (a limit, consent, a
        destination) gets ``refused`` and no notice, and the others are written. With
        ``send`` the first submissions are made before it returns (a transport,
        template or lease that cannot work: ConfigError first, nothing written); once
        committed, every notice gets ``submitted``, else the ``reason``
        (:class:`resetctl.enqueue.SendReason`), and its ``phase``.
        """
        from resetctl.enqueue import check_requests, enqueue

        if self._unborn():
            requests = list(requests)
            check_requests(self.settings, requests, self.clock())

        def write(store: Store, now: float) -> list[EnqueueResult]:
            return enqueue(store, self.settings, requests, now, self._recipient_key())

        return self._enqueue(write, send)

    def enqueue_lines(self, lines: Iterable[str], send: bool = False) -> list[EnqueueResult]:
        """:meth:`enqueue` for JSON Lines (``resetctl enqueue``'s input): blank lines are
        skipped, problems are numbered by line."""
        from resetctl.enqueue import check_lines, enqueue_lines

        if self._unborn():
            lines = list(lines)
            check_lines(self.settings, lines, self.clock())

        def write(store: Store, now: float) -> list[EnqueueResult]:
            return enqueue_lines(store, self.settings, lines, now, self._recipient_key())

        return self._enqueue(write, send)

    def _enqueue(
        self, write: Callable[[Store, float], list[EnqueueResult]], send: bool
    ) -> list[EnqueueResult]:
        self._recipient_key()  # an unusable key fails before a new database is made
        with self._store() as store:
            clock = store.decision_clock(self.clock)
            if not send:
                return write(store, clock())
            from resetctl.enqueue import prepare_send

            # Whatever can stop the submission fails here, before the commit: once the
            # notices are committed, every one gets its result.
            sender = prepare_send(store, self.settings, None, clock, self.environ)
            try:
                return sender.send(write(store, clock()))
            finally:
                sender.close()

    def inspect(
        self, notice_id: str | None = None, *, key: str | None = None, account: str | None = None
    ) -> dict[str, Any]:
        """A notice's phase, timing, attempts, next action, lease and history, as
        ``resetctl inspect --json`` shows it: the notice by id, by its idempotency ``key``,
        or ``account``'s latest. Never a contact or the reset URL; NoticeNotFound when
        there is no such notice."""
        from resetctl.controls import find_notice_id
        from resetctl.report import notice_report

        with self._store() as store:
            if notice_id is None:
                notice_id = find_notice_id(store, key=key, account=account)
            return notice_report(store, notice_id, store.decision_clock(self.clock)())

    def cancel(
        self, notice_id: str | None = None, *, key: str | None = None, reason: str = "withdrawn"
    ) -> CancelResult:
        """Cancel a live notice (by id or idempotency ``key``): it ends ``cancelled`` with
        ``reason`` (``completed`` when the reset was used, ``superseded``, ``withdrawn``)
        and nothing more is submitted, read or escalated; a call already in flight
        finishes and is recorded. A terminal notice is left as it is (``cancelled``
        False, its phase says how it ended). NoticeNotFound for an unknown id or key."""
        from resetctl import controls

        why = controls.cancel_reason(reason)
        with self._store() as store:
            if notice_id is None:
                notice_id = controls.find_notice_id(store, key=key)
            now = store.decision_clock(self.clock)()
            (result,) = controls.cancel(store, [notice_id], why, now)
        return result

    def find(
        self,
        *,
        phases: Sequence[str] = (),
        region: str | None = None,
        account: str | None = None,
        since: float | None = None,
        at_risk: bool = False,
        limit: int = 50,
    ) -> list[dict[str, Any]]:
        """Notices newest first, as ``resetctl list --json`` shows them: each one's
        header (phase, reason, region, policy, account, channels, times, at risk), never
        a secret. ``since`` is epoch seconds; a search that may reach finished notices
        without an ``account`` looks one day back unless told."""
        from resetctl import controls
        from resetctl.machine import PHASES

        unknown = [p for p in phases if p not in PHASES]
        if unknown:
            raise InputError([f"phase: {unknown[0]!r} is not one of {', '.join(PHASES)}"])
        query = controls.NoticeQuery(
            limit, tuple(PHASES[p] for p in phases), region, account, since, at_risk
        )
        with self._store() as store:
            return controls.list_notices(store, query, store.decision_clock(self.clock)())

    def observe(
        self,
        transport: str,
        *,
        body: str | bytes,
        url: str,
        signature: str | None = None,
        headers: Mapping[str, str] | None = None,
        idempotency_token: str | None = None,
    ) -> CallbackResult | None:
        """Verify a provider instance's callback or webhook and record what it reports
        through the machine, as a poll would be.

        ``transport`` names the instance it was addressed to (``twilio``, or a
        ``[providers.<name>]``); its kind verifies and reads the request, and nothing
        here knows a provider's fields or signature scheme. ``body`` is the body as
        posted, ``url`` the full URL the provider requested (query string included),
        ``headers`` its headers; ``signature`` is the value of the header the kind signs
        in (Twilio's X-Twilio-Signature), for callers that pass only that. Raises
        SignatureMismatch for a forged (or stale) request and MalformedCallback for a
        body that is not a report; nothing is recorded then. A replay is stored once and
        returns ``duplicate`` True. A verified request that reports nothing the machine
        reads (an open, a click) returns None. ``idempotency_token`` is accepted and
        ignored: no provider signs it, so it cannot tell a replay from a new callback.
        """
        from resetctl.observe import record_request
        from resetctl.transports.base import CallbackRequest

        del idempotency_token  # not signed, so never read; accepted for existing callers
        reader = self.callback_reader(transport)
        given = {k.lower(): v for k, v in (headers or {}).items()}
        header = getattr(reader, "signature_header", None)
        if signature is not None and isinstance(header, str):
            given[header] = signature
        raw = body.encode("utf-8") if isinstance(body, str) else body
        with self._store() as store:
            now = store.decision_clock(self.clock)()
            return record_request(store, transport, reader, CallbackRequest(url, given, raw), now)

    def callback_reader(self, instance: str) -> CallbackReader:
        """The reader of ``instance``'s callbacks, built once (ConfigError when the
        instance takes none, or a key it verifies them with is missing)."""
        if instance not in self._readers:
            from resetctl.transports import callback_reader

            with self._store() as store:
                self._readers[instance] = callback_reader(
                    self.settings, store, self.clock, instance, self.environ
                )
        return self._readers[instance]

    def sweep(
        self,
        max_runtime: float = 0.0,
        *,
        batch_size: int | None = None,
        lease: float | None = None,
        worker_id: str | None = None,
        handle_signals: bool = False,
        concurrency: int | None = None,
    ) -> SweepSummary:
        """Claim due notices and drive them, as ``resetctl sweep`` does.

        ``max_runtime`` seconds (0: one pass) bounds the run; ``batch_size`` and
        ``lease`` default to the default policy's, ``concurrency`` (provider calls in
        flight at once) to ``[sweep] concurrency``. ``handle_signals`` (main thread
        only) makes SIGTERM and SIGINT end the run as :meth:`stop` does. Raises
        ConfigError before claiming anything when a template version (one a policy
        names, or one live notices still use), a transport or the lease is unusable.
        """
        import signal

        from resetctl.clocks import default_worker_id, failpoints_from_env, monotonic_for
        from resetctl.config import check_sweep_bounds
        from resetctl.sweep import Sweeper
        from resetctl.templates import require_templates
        from resetctl.transports import build_transports, close_transports
        from resetctl.work import SweepOptions

        if max_runtime < 0:
            raise ConfigError("max_runtime: must be 0 (one pass) or a positive duration")
        check_sweep_bounds(batch_size, lease, concurrency)
        policy = self.settings.default_policy
        options = SweepOptions(
            worker_id=worker_id or default_worker_id(),
            batch_size=policy.batch_size if batch_size is None else batch_size,
            lease=policy.lease if lease is None else lease,
            max_runtime=max_runtime,
            concurrency=self.settings.concurrency if concurrency is None else concurrency,
        )
        with self._store() as store:
            # Before any claim: a version that fails its check, or one retired while
            # notices still use it, would fail every notice it renders.
            require_templates(self.settings, store.live_policy_counts())
            # On PostgreSQL every decision reads the database's clock (one clock for all
            # hosts); this host's clock only measures durations.
            clock = store.decision_clock(self.clock)
            transports = build_transports(self.settings, store, clock, self.environ)
            sweeper = Sweeper(
                store,
                self.settings,
                transports,
                clock=clock,
                sleep=self.sleep,
                failpoints=failpoints_from_env(self.environ),
                monotonic=monotonic_for(self.clock),
            )
            with self._lock:
                self._sweepers.add(sweeper)
            previous = {}
            if handle_signals:
                previous = {
                    signum: signal.signal(signum, lambda *_: sweeper.stop())
                    for signum in (signal.SIGTERM, signal.SIGINT)
                }
            try:
                return sweeper.run(options)
            finally:
                for signum, handler in previous.items():
                    signal.signal(signum, handler)
                with self._lock:
                    self._sweepers.discard(sweeper)
                close_transports(transports)

    def stop(self) -> None:
        """Ask running sweeps to end: no new claim or call, leases handed back."""
        with self._lock:
            running = list(self._sweepers)
        for sweeper in running:
            sweeper.stop()

    def check_templates(self, version: str | None = None) -> TemplatesReport:
        """``templates check`` over this database: every version (or ``version``) checked,
        with the policies naming it and the live notices using it. A version live notices
        use that is missing or broken is listed in ``in_use_failures``."""
        from resetctl.templates import templates_report

        with self._store() as store:
            live = store.live_policy_counts()
        return templates_report(self.settings, version, live)

    def health(
        self,
        window: float = 300.0,
        *,
        storage: bool = False,
        retention: float = 30 * 86400.0,
        telemetry: bool = False,
    ) -> dict[str, Any]:
        """Population numbers over the last ``window`` seconds, as ``resetctl health
        --json`` shows them; with ``storage``, measured sizes projected over ``retention``
        seconds; with ``telemetry``, the telemetry budget (``retention`` for a region whose
        policy sets none). Aggregates only, never a recipient row."""
        from resetctl import ops

        with self._store() as store:
            now = store.decision_clock(self.clock)()
            report = ops.health(store, now, window, self.settings.provider_chains())
            if storage:
                report["storage"] = ops.storage(store, now, retention)
            if telemetry:
                rate, policies = self.settings.sample_success, self.settings.policies
                report["telemetry"] = ops.telemetry(store, policies, retention, rate)
        return report

    def alerts(self, *, peek: bool = False) -> AlertsReport:
        """One ``resetctl alerts`` run: live notices whose deadline is at risk, notices
        that ended without success since the previous run, a stalled sweep. Each ended
        notice is reported once (the run records how far it read), and a critical alert
        under ``alert_mode = "observe"`` is recorded once as a would_page event. With
        ``peek`` nothing is recorded: the one-time warnings stay for the next run."""
        from resetctl import ops

        stalled_after = self.settings.default_policy.alert_stalled_after
        # The handle's own clock, as these commands have always read it (not the
        # database's, which health and the sweep read on PostgreSQL).
        with self._store() as store:
            chains = self.settings.provider_chains()
            return ops.alerts(store, self.clock(), stalled_after, peek=peek, chains=chains)

    def write_metrics(self, textfile: str | PathLike[str]) -> None:
        """Write the Prometheus metrics (counters from events, queue gauges) to
        ``textfile`` atomically, for node_exporter's textfile collector. An OSError when
        the file cannot be written."""
        from pathlib import Path

        from resetctl import ops

        configured = [(p.name, p.version) for p in self.settings.policies.values()]
        with self._store() as store:
            chains = self.settings.provider_chains()
            ops.write_metrics(store, Path(textfile), self.clock(), configured, chains)

    def purge(
        self,
        older_than: float = 30 * 86400.0,
        *,
        aggregates_older_than: float = 400 * 86400.0,
        batch_size: int = 500,
    ) -> dict[str, Any]:
        """``resetctl purge --json``'s report: finished notices past their policy's retention
        (else ``older_than``), aggregates past theirs; the rules: :func:`resetctl.ops.purge`."""
        from resetctl import ops

        now, policies = self.clock(), self.settings.policies
        with self._store() as store:
            report = ops.purge(store, older_than, now, batch_size, policies, aggregates_older_than)
        return report.to_json()

    def export_timings(self, since: float = 0.0, until: float = math.inf) -> list[dict[str, Any]]:
        """Notices that finished between ``since`` and ``until`` (epoch seconds) as
        de-identified traces for :func:`replay`, the header first, as ``resetctl
        export-timings`` writes them. No notice id, account, contact data or URL."""
        from resetctl.replay import export_timings

        with self._store() as store:
            return list(export_timings(store, since, until, self.settings.kind_of))

    def copy_database(self, target: str) -> dict[str, int]:
        """Copy this SQLite database into the empty PostgreSQL database ``target`` (a
        ``postgresql://`` URI, password from PGPASSWORD, ~/.pgpass or PGSERVICE): rows
        copied per table, verified on both sides. Live notices arrive with their leases
        cleared. InputError for a target that is not a URI; StoreError for one that
        holds anything."""
        if not is_postgres(target):
            raise InputError(["target: expected a postgresql:// URI"])
        from resetctl.store import copy_database

        with self._store() as store:
            return copy_database(store, target, self.clock())

    def outbox_messages(self, notice_id: str | None = None) -> list[dict[str, Any]]:
        """The embedded outbox's messages, oldest first, without their content (only
        ``notice_id``'s when given), as ``resetctl outbox list --json`` shows them."""
        from resetctl.summary import iso

        with self._store() as store:
            rows = store.outbox_messages(notice_id)
        for row in rows:
            row["submitted_at"] = iso(row["submitted_at"])
        return rows

    def outbox_message(self, message_id: str) -> dict[str, Any]:
        """One outbox message with its rendered content, as ``resetctl outbox show --json``
        shows it. Development tooling: it holds the reset link until the notice ends.
        NoticeNotFound for an unknown id."""
        from resetctl.summary import iso

        with self._store() as store:
            row = store.outbox_message(message_id)
        if row is None:
            raise NoticeNotFound(f"no outbox message {message_id!r}")
        row["submitted_at"] = iso(row["submitted_at"])
        return row

    def outbox_set_status(self, message_id: str, status: str) -> None:
        """Script the status the next poll of an outbox message reads (see
        :func:`check_outbox_status`). NoticeNotFound for an unknown id."""
        check_outbox_status(status)
        with self._store() as store:
            found = store.outbox_set_status(message_id, status, self.clock())
        if not found:
            raise NoticeNotFound(f"no outbox message {message_id!r}")

    def run_demo(
        self, start: float, listener: Listener, labels: Callable[[str, str], None]
    ) -> list[str]:
        """``resetctl demo``: enqueue the sample notices at ``start`` and sweep them on
        the outbox through a simulated clock until every one has ended; ``listener``
        sees every transition, ``labels(notice_id, text)`` names each sample first.
        Returns the notice ids. InputError, and nothing written, when the database
        already holds notices: a simulated clock must never drive real ones."""
        from resetctl.demo import run_demo

        with self._store() as store:
            notices = sum(store.phase_counts().values())
            if notices:
                raise InputError(
                    [
                        f"--db {self.path}: holds {notices} notice(s); the demo runs a"
                        " simulated clock and only on a new or empty database"
                    ]
                )
            return run_demo(store, start, listener, labels)


def is_postgres(db: str | PathLike[str]) -> bool:
    """True when ``db`` names a PostgreSQL database (a ``postgresql://`` URI), not a file."""
    from resetctl.store import is_postgres as named_postgres

    return named_postgres(os.fspath(db))


def clock_from_env(
    environ: Mapping[str, str],
) -> tuple[Callable[[], float], Callable[[float], None]]:
    """The clock and sleep a sweep runs on: real time, unless RESETCTL_TIME_SCALE or
    RESETCTL_CLOCK_SKEW set it faster or off (rehearsals, the multi-host simulation)."""
    from resetctl.clocks import clock_from_env as from_env

    return from_env(environ)


def read_input_lines(stream: BinaryIO) -> list[str]:
    """``resetctl enqueue``'s input as lines for :meth:`Handle.enqueue_lines`: split at
    ``\n`` only, each line and their number bounded; InputError naming the line."""
    from resetctl.enqueue import read_json_lines

    return read_json_lines(stream)


def check_outbox_status(status: str) -> None:
    """ConfigError unless ``status`` is one an outbox message can be given: pending,
    accepted, delivered, failed or unknown."""
    from resetctl.machine import Status

    if status not in {s.value for s in Status}:
        raise ConfigError(f"status: must be one of {', '.join(s.value for s in Status)}")


def _settings(config: str | PathLike[str] | Settings | None) -> Settings:
    from pathlib import Path

    from resetctl.config import Settings, load_settings

    if isinstance(config, Settings):
        return config
    return load_settings(None if config is None else Path(config))


class TemplatesCheck(NamedTuple):
    """:func:`templates_check`'s report, and the database it counted live notices in."""

    report: TemplatesReport
    #: the database path when there was none to read (live notices read as none)
    missing_database: str | None


def templates_check(
    version: str | None = None,
    *,
    db: str | PathLike[str] | None = None,
    config: str | PathLike[str] | Settings | None = None,
) -> TemplatesCheck:
    """``resetctl templates check``: :meth:`Handle.check_templates` over ``db`` when it
    exists; a database that does not exist yet holds no notice in flight, so it is read
    as none and never created."""
    from pathlib import Path

    from resetctl.templates import templates_report

    settings = _settings(config)
    path = os.fspath(db or settings.db or "resetctl.db")
    if not is_postgres(path) and not Path(path).exists():
        return TemplatesCheck(templates_report(settings, version), path)
    with Handle(path, settings, create=False) as handle:
        return TemplatesCheck(handle.check_templates(version), None)


class InitializedDatabase(NamedTuple):
    """:func:`init_database`'s answer."""

    #: the database (a PostgreSQL URI as logs show it, without a password)
    path: str
    #: True when this call created it: the file, or the schema of an empty database
    created: bool


def init_database(
    db: str | PathLike[str] | None = None,
    config: str | PathLike[str] | Settings | None = None,
) -> InitializedDatabase:
    """``resetctl db init``: create the database ``db`` names (a SQLite file, 0600, or
    resetctl's schema in an empty PostgreSQL database), or bring one that exists to the
    current schema. Besides an enqueue, the one way a database comes to exist: every
    other command refuses a missing one."""
    settings = _settings(config)
    path = os.fspath(db or settings.db or "resetctl.db")
    try:
        with Handle(path, settings, create=False) as existing, existing._store() as store:
            return InitializedDatabase(store.path, False)
    except StoreError:
        pass  # missing, or no schema yet; anything else fails again below, and says so
    with Handle(path, settings) as created, created._store() as store:
        return InitializedDatabase(store.path, True)


def init_templates(directory: str | PathLike[str]) -> list[str]:
    """Copy the built-in template versions into ``directory`` (never overwriting a
    version already there: ConfigError); returns the versions copied."""
    from pathlib import Path

    from resetctl.templates import init_templates as copy_builtin

    return copy_builtin(Path(directory))


def preview_templates(
    version: str | None = None,
    locale: str | None = None,
    output: str | PathLike[str] = "template-preview",
    *,
    minutes: int = 10,
    config: str | PathLike[str] | Settings | None = None,
) -> Preview:
    """Render the email (HTML and text) and SMS of template ``version`` (default: the
    default policy's) for sample data, in ``locale``, into the directory ``output``;
    ``minutes`` until the sample link expires. Only sample data is used."""
    from pathlib import Path

    from resetctl.templates import preview

    settings = _settings(config)
    chosen = version or settings.default_policy.template_version
    return preview(settings, chosen, locale, Path(output), minutes=minutes)


def replay_candidates(
    policies: Iterable[str | PathLike[str]] = (),
    overrides: Sequence[str] = (),
    *,
    config: str | PathLike[str] | None = None,
) -> list[Candidate]:
    """The policy sets :func:`replay` compares: each config file's ``[policy.*]`` tables
    (or, with none, ``config``'s: the current configuration), each followed by a copy
    with ``overrides`` (``email.poll_delays=10,30,90``) applied to every region."""
    from pathlib import Path

    from resetctl.config import load_toml, settings_from_mapping, with_overrides
    from resetctl.replay import Candidate

    bases = [(Path(p).stem, load_toml(Path(p))) for p in policies]
    if not bases:
        bases = [("current", load_toml(Path(config)) if config else {})]
    candidates = []
    for name, data in bases:
        candidates.append(Candidate(name, settings_from_mapping(data, name).policies))
        if overrides:
            changed = with_overrides(data, list(overrides))
            both = f"{name} + {' '.join(overrides)}"
            candidates.append(Candidate(both, settings_from_mapping(changed, both).policies))
    return candidates


def replay(
    traces: str | PathLike[str],
    candidates: Sequence[Candidate],
    *,
    sweep_interval: float | None = None,
    max_runtime: float = 0.0,
    read_lag: float | None = None,
    call_time: float = 0.0,
    batch_size: int | None = None,
    lease: float | None = None,
    seed: int = 0,
    progress: Callable[[int, int], None] | None = None,
) -> ReplayResult:
    """Replay the trace file ``traces`` (from :meth:`Handle.export_timings`) under each
    candidate through the machine ``sweep`` uses, on a simulated clock.

    ``sweep_interval`` and ``read_lag`` default to what the file's header measured;
    ``max_runtime``, ``call_time``, ``batch_size`` and ``lease`` model the sweeps.
    ``progress(read, total)`` hears the characters read of the file's size; each pass
    over the file starts at 0. InputError for a file that cannot be read or a bad trace.
    """
    from resetctl import replay as replaying
    from resetctl.config import check_sweep_bounds
    from resetctl.replay.files import TraceFile, open_trace_file

    check_sweep_bounds(batch_size, lease, None)
    replaying.check_given(sweep_interval, read_lag)
    options = replaying.SimulationOptions(
        max_runtime=max_runtime, call_time=call_time, batch_size=batch_size, lease=lease
    )
    with open_trace_file(traces) as file:
        header = replaying.read_header(TraceFile(file, None))
        options = replaying.with_header(
            options, header, sweep_interval=sweep_interval, read_lag=read_lag
        )
        return replaying.replay(TraceFile(file, progress), candidates, options, seed=seed)
