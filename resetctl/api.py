"""The Python API: one handle over one database, making the same calls the CLI makes.

``resetctl.open(db=…, config=…)`` returns a :class:`Handle`; the command line is a thin
layer over it, so an application and ``resetctl`` go through one path. Only this module's
names (and the result types it returns) are the stable API: the modules behind it may
change. Every error is a :class:`resetctl.errors.ResetctlError`, never a bare database
error.

Importing this module stays cheap (the cron tick's start-up time matters): everything
heavy is imported inside the method that needs it.
"""

from __future__ import annotations

import os
import threading
import time
import weakref
from collections.abc import Callable, Iterable, Iterator, Mapping
from contextlib import contextmanager
from typing import TYPE_CHECKING, Any

from resetctl.errors import ConfigError, MalformedCallback, SignatureMismatch, StoreError, label

if TYPE_CHECKING:
    from os import PathLike

    from resetctl.config import Settings
    from resetctl.enqueue import EnqueueResult
    from resetctl.observe import CallbackResult
    from resetctl.store import Store
    from resetctl.summary import SweepSummary
    from resetctl.sweep import Sweeper
    from resetctl.templates import TemplatesReport

#: Transports whose status callbacks ``observe`` verifies and records.
CALLBACK_TRANSPORTS = ("twilio",)


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
    """resetctl over one database: enqueue, inspect, observe, sweep, health.

    ``db`` defaults to the config's ``db``, else ``./resetctl.db``; ``config`` is a TOML
    path, already loaded settings, or None for the built-in policy. With ``create``
    (the default) a missing database is created (0600); without it a missing one is a
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
        from pathlib import Path

        from resetctl.config import Settings, load_settings

        self.settings = (
            config
            if isinstance(config, Settings)
            else load_settings(None if config is None else Path(config))
        )
        #: the database file
        self.path = os.fspath(db or self.settings.db or "resetctl.db")
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
        self._twilio_token: str | None = None
        # Open now, so a missing or unusable database fails here, not on first use.
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
        from resetctl.store import database_errors, open_store

        held: _ThreadStore | None = getattr(self._local, "held", None)
        if held is None or self._closed:
            if self._closed:
                raise StoreError(f"database {self.path}: the handle is closed")
            held = _ThreadStore(
                open_store(self.path, must_exist=not self._create, busy_timeout=self._busy_timeout)
            )
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
            raise StoreError(f"database {store.path}: {exc}") from None

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
        nothing is written. With ``send`` the first submissions are made before it
        returns; a transport, template or lease that cannot work raises ConfigError
        first, and nothing is written. Once committed, every notice gets its result
        whatever its submission did: ``submitted``, else the ``reason``
        (:class:`resetctl.enqueue.SendReason`), and its ``phase``.
        """
        from resetctl.enqueue import enqueue

        def write(store: Store, now: float) -> list[EnqueueResult]:
            return enqueue(store, self.settings, requests, now, self._recipient_key())

        return self._enqueue(write, send)

    def enqueue_lines(self, lines: Iterable[str], send: bool = False) -> list[EnqueueResult]:
        """:meth:`enqueue` for JSON Lines (``resetctl enqueue``'s input): blank lines are
        skipped, problems are numbered by line."""
        from resetctl.enqueue import enqueue_lines

        def write(store: Store, now: float) -> list[EnqueueResult]:
            return enqueue_lines(store, self.settings, lines, now, self._recipient_key())

        return self._enqueue(write, send)

    def _enqueue(
        self, write: Callable[[Store, float], list[EnqueueResult]], send: bool
    ) -> list[EnqueueResult]:
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

    def inspect(self, notice_id: str) -> dict[str, Any]:
        """A notice's phase, timing, attempts, next action, lease and history, as
        ``resetctl inspect --json`` shows it. Never a contact or the reset URL;
        NoticeNotFound for an unknown id."""
        from resetctl.report import notice_report

        with self._store() as store:
            return notice_report(store, notice_id, store.decision_clock(self.clock)())

    def observe(
        self,
        transport: str,
        *,
        body: str | bytes,
        url: str,
        signature: str,
        idempotency_token: str | None = None,
    ) -> CallbackResult:
        """Verify a provider's status callback and record it through the machine.

        ``body`` is the form body as posted, ``url`` the full URL the provider signed
        (query string included), ``signature`` its signature header
        (X-Twilio-Signature). Raises SignatureMismatch for a forged one and
        MalformedCallback for a body that is not a status report; nothing is recorded
        then. A replay (the same signed URL and body) is stored once and returns
        ``duplicate`` True. A status Twilio does not document is recorded as
        ``unknown:<length>``, normalized to unknown. ``idempotency_token`` (Twilio's
        I-Twilio-Idempotency-Token header) is accepted and ignored: the signature does
        not cover it, so it cannot tell a replay from a new callback.
        """
        if transport not in CALLBACK_TRANSPORTS:
            raise ConfigError(
                f"observe: no callbacks for transport {label(transport)}"
                f" (supported: {', '.join(CALLBACK_TRANSPORTS)})"
            )
        from urllib.parse import parse_qsl

        from resetctl.observe import record_callback
        from resetctl.transports import twilio

        if isinstance(body, bytes):
            try:
                body = body.decode("utf-8")
            except UnicodeDecodeError:
                raise MalformedCallback(["body: not UTF-8 form data; nothing recorded"]) from None
        params = dict(parse_qsl(body.strip(), keep_blank_values=True))
        token = self._twilio_auth_token()
        if not twilio.verify_signature(url, params, signature, token):
            raise SignatureMismatch(
                ["signature: does not match the body and URL; nothing recorded"]
            )
        try:
            message_id, raw = twilio.callback_status(params)
        except ValueError as exc:
            raise MalformedCallback([f"body: {exc}"]) from None
        del idempotency_token  # not signed, so never read; accepted for existing callers
        evidence, status = twilio.VOCABULARY.reading(raw)
        with self._store() as store:
            return record_callback(
                store,
                "twilio",
                message_id,
                evidence,
                status,
                store.decision_clock(self.clock)(),
                attempt_key=twilio.attempt_from_callback_url(url),
                dedupe=twilio.callback_identity(url, params, token),
            )

    def _twilio_auth_token(self) -> str:
        if self._twilio_token is None:
            from resetctl.transports import transport_secrets

            options = self.settings.transport_options.get("twilio", {})
            secret = transport_secrets("twilio", options, self.environ)
            token = secret("TWILIO_AUTH_TOKEN")
            if not token:
                raise ConfigError("twilio: TWILIO_AUTH_TOKEN is not set")
            self._twilio_token = token
        return self._twilio_token

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
        from resetctl.sweep import Sweeper, SweepOptions
        from resetctl.templates import require_templates
        from resetctl.transports import build_transports, close_transports

        if max_runtime < 0:
            raise ConfigError("max_runtime: must be 0 (one pass) or a positive duration")
        policy = self.settings.default_policy
        options = SweepOptions(
            worker_id=worker_id or default_worker_id(),
            batch_size=batch_size or policy.batch_size,
            lease=lease or policy.lease,
            max_runtime=max_runtime,
            concurrency=concurrency or self.settings.concurrency,
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
        self, window: float = 300.0, *, storage: bool = False, retention: float = 30 * 86400.0
    ) -> dict[str, Any]:
        """Population numbers over the last ``window`` seconds, as ``resetctl health
        --json`` shows them; with ``storage``, measured sizes projected over
        ``retention`` seconds. Aggregates only, never a recipient row."""
        from resetctl import ops

        with self._store() as store:
            now = store.decision_clock(self.clock)()
            report = ops.health(store, now, window)
            if storage:
                report["storage"] = ops.storage(store, now, retention)
        return report
