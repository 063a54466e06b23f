"""The ``resetctl`` command line: each command parses its options, makes one call into the
Python API (:mod:`resetctl.api`), renders what it returns (:mod:`resetctl.cli_output`) and
exits; :func:`resetctl.cli_command.command` turns domain errors into exit codes. The
command groups (outbox, observe, templates, db) are in :mod:`resetctl.cli_groups`.
"""

from __future__ import annotations

import logging
import math
import os
import shlex
import shutil
import sys
import tempfile
import time
from collections.abc import Mapping
from pathlib import Path
from typing import Annotated, Any

import typer

from resetctl import api
from resetctl import cli_output as out
from resetctl.cli_command import (
    ConfigOption,
    DbOption,
    JsonOption,
    command,
    log_errors_as_json,
    max_runtime_seconds,
)
from resetctl.cli_groups import db_app, observe, outbox_app, templates_app
from resetctl.cli_output import stderr
from resetctl.cli_serve import (
    MaxConnectionsOption,
    RequestTimeoutOption,
    listening,
    run_until_terminated,
    serve,
)
from resetctl.durations import parse_duration, parse_time_or_ago
from resetctl.errors import ConfigError, InputError, RequestsRefused, ResetctlError
from resetctl.policy import aggregates_retention
from resetctl.web import CONNECTION_LIMIT, REQUEST_TIMEOUT

app = typer.Typer(
    help="Deliver password-reset notices by email and SMS before the link dies.",
    no_args_is_help=True,
    add_completion=False,
    pretty_exceptions_enable=False,
    # Plain text: help and docstrings hold literal brackets ("[default: …]", "[outbox]").
    rich_markup_mode=None,
)
app.add_typer(outbox_app, name="outbox")
command(app, "observe")(observe)
app.add_typer(templates_app, name="templates")
app.add_typer(db_app, name="db")

#: Seconds a served callback waits for the database's write lock before answering 503.
CALLBACK_BUSY_TIMEOUT = 10.0

#: ``alerts``' exit code when the check itself cannot run: the monitoring-plugin
#: convention's UNKNOWN (its other codes are the report's level).
ALERTS_UNKNOWN = 3


def main() -> None:
    """The full command line (``resetctl.__main__`` runs it when the idle tick does not
    answer)."""
    app()


@app.callback()
def _logging(
    log_format: Annotated[
        str,
        typer.Option(
            "--log-format", envvar="RESETCTL_LOG_FORMAT", help="Logs on stderr: text or json."
        ),
    ] = "text",
    log_level: Annotated[
        str,
        typer.Option(
            "--log-level",
            envvar="RESETCTL_LOG_LEVEL",
            help="info logs one line per transition; warning only problems.",
        ),
    ] = "info",
) -> None:
    """Deliver password-reset notices by email and SMS before the link dies."""
    from resetctl.telemetry import configure_logging
    from resetctl.tracing import configure_from_environment

    if (
        log_format not in ("text", "json")
        or log_level.upper() not in logging.getLevelNamesMapping()
    ):
        stderr.print("error: --log-format: text or json; --log-level: info, warning, error")
        raise typer.Exit(2)
    configure_logging(log_format, log_level)
    log_errors_as_json(log_format == "json")
    configure_from_environment(os.environ)  # no application here sets a tracer provider


def _non_negative_duration(value: str, where: str) -> float:
    return 0.0 if value.strip() in ("0", "0s", "0ms") else parse_duration(value, where)


@command(app)
def enqueue(
    input_file: Annotated[
        Path | None,
        typer.Option("--input", help="JSON Lines file [default: standard input]."),
    ] = None,
    send: Annotated[
        bool,
        typer.Option("--send", help="Make each notice's first submission now, before returning."),
    ] = False,
    db: DbOption = None,
    config: ConfigOption = None,
) -> None:
    """Record reset notices from JSON Lines, all or none.

    One JSON object per line: idempotency_key (required), reset_url (https, required),
    email and/or phone (E.164), region, account_ref, display_name, locale (BCP 47, e.g.
    es-MX), and expires_at (ISO 8601 with offset) or ttl ("10m", "90s", seconds). Prints
    one JSON line per notice. Any invalid line: every problem listed by line, exit 2,
    nothing written. consent lists the channels the person agreed to (["email"]), for a
    policy that requires it.

    A line its region's policy refuses (an abuse limit: rate_limited; no_consent; a
    destination the policy does not text: destination_country, destination_type) gets
    its line with "refused" and the "field", its problem on standard error, and exit
    2; every other line is written as usual.

    With --send the transports, templates and lease are checked first (a problem: exit
    2, nothing written), then the notices are committed and submitted at once. Once they
    are committed, every notice gets its line and the exit code is 0, whatever the
    submission did: "submitted": true, or false with a "reason" (transient, ambiguous,
    permanent, declined, expired, already_terminal, in_progress, in_doubt, store_error,
    shadow; see README) and the notice's "phase". Cron's sweep carries on with what is left.

    Under [rollout] a line may say "shadow": true (resetctl runs the notice but sends
    nothing) or "in_slice": false (the key is outside the slice: no notice); the
    application sends those by its own path.

    Example:

        resetctl enqueue --send --input requests.jsonl

    where each line looks like
    {"idempotency_key": "r-1", "email": "a@example.com", "reset_url": "https://x.example/r/a"}
    """
    clock, _ = api.clock_from_env(os.environ)
    with api.open(db, config, clock=clock) as handle:
        try:
            if input_file is None:
                lines = api.read_input_lines(sys.stdin.buffer)
            else:
                with input_file.open("rb") as stream:
                    lines = api.read_input_lines(stream)
        except OSError as exc:
            raise InputError([f"cannot read input: {type(exc).__name__}"]) from None
        results = handle.enqueue_lines(lines, send=send)
    out.enqueued(results)
    refused = [r.problem for r in results if r.problem is not None]
    if refused:
        raise RequestsRefused(refused)


@command(app)
def sweep(
    batch_size: Annotated[
        int | None, typer.Option(min=1, help="Notices per claim [default: policy batch_size].")
    ] = None,
    lease: Annotated[
        str | None, typer.Option(help="Lease per claim, e.g. 60s [default: policy lease].")
    ] = None,
    worker_id: Annotated[
        str | None, typer.Option(help="Name on leases and events [default: host:pid].")
    ] = None,
    max_runtime: Annotated[
        str, typer.Option(help="Keep sweeping for this long (e.g. 55s), sleeping until due.")
    ] = "0",
    concurrency: Annotated[
        int | None,
        typer.Option(
            min=1,
            max=256,
            help="Provider calls in flight at once [default: [sweep] concurrency, 16].",
        ),
    ] = None,
    json_output: JsonOption = False,
    db: DbOption = None,
    config: ConfigOption = None,
) -> None:
    """Claim due notices and drive them: submit, poll, escalate, expire.

    Run it every minute from cron; with --max-runtime it keeps working inside the
    minute so sub-minute poll schedules hold. Exits non-zero only when the sweep itself
    cannot run (a missing database included: create it with db init, or by an
    enqueue); per-notice transport errors are counted and retried by later sweeps.

    Example:

        resetctl sweep --max-runtime 55s --db /var/lib/resetctl/resetctl.db
    """
    runtime = max_runtime_seconds(max_runtime)
    seconds = None if lease is None else parse_duration(lease, "--lease")
    clock, sleep = api.clock_from_env(os.environ)
    # A missing database is a mistake here (a typo'd path), never a new empty one.
    with api.open(db, config, create=False, clock=clock, sleep=sleep) as handle:
        # SIGTERM and SIGINT end the run as --max-runtime does: no new claim or call,
        # leases handed back, the summary printed.
        summary = handle.sweep(
            runtime,
            batch_size=batch_size,
            lease=seconds,
            worker_id=worker_id,
            handle_signals=True,
            concurrency=concurrency,
        )
    out.swept(summary, clock(), json_output)


KeyOption = Annotated[
    str | None, typer.Option("--key", help="The idempotency key the notice was enqueued with.")
]


def _one_notice(notice_id: str | None, **names: str | None) -> None:
    """Exactly one way of naming the notice, or exit 2 saying which ones there are."""
    given = [n for n, v in {"NOTICE_ID": notice_id, **names}.items() if v is not None]
    if len(given) != 1:
        options = " or ".join(["NOTICE_ID", *(f"--{n}" for n in names)])
        raise InputError([f"name the notice one way: {options}"])


@command(app)
def inspect(
    notice_id: Annotated[
        str | None, typer.Argument(help="The notice id printed by enqueue.")
    ] = None,
    key: KeyOption = None,
    account: Annotated[str | None, typer.Option(help="The account_ref: its latest notice.")] = None,
    json_output: JsonOption = False,
    db: DbOption = None,
    config: ConfigOption = None,
) -> None:
    """Show a notice's phase, timing, attempts, next action, lease and history.

    Name the notice by id, by the idempotency key it was enqueued with, or by its
    account (the latest notice). Never shows an email address, phone number or reset URL.

    Examples:

        resetctl inspect ntc_1a230f089c03f2a9c0d1e4b5 --json
        resetctl inspect --key order-4711-reset
        resetctl inspect --account acct-42
    """
    _one_notice(notice_id, key=key, account=account)
    with api.open(db, config, create=False) as handle:
        report = handle.inspect(notice_id, key=key, account=account)
    if json_output:
        out.dump(report)
    else:
        out.notice(report)


@command(app)
def cancel(
    notice_id: Annotated[
        str | None, typer.Argument(help="The notice id printed by enqueue.")
    ] = None,
    key: KeyOption = None,
    reason: Annotated[
        str,
        typer.Option(help="completed (the reset was used), superseded or withdrawn."),
    ] = "withdrawn",
    json_output: JsonOption = False,
    db: DbOption = None,
    config: ConfigOption = None,
) -> None:
    """Cancel a live notice: nothing more is submitted, read or escalated.

    A call already in flight finishes and is recorded. A notice that already ended is
    left as it is (exit 0, saying how it ended); an unknown id or key exits 1. Send
    --reason completed when the person used the reset.

    Examples:

        resetctl cancel ntc_1a230f089c03f2a9c0d1e4b5
        resetctl cancel --key order-4711-reset --reason completed
    """
    _one_notice(notice_id, key=key)
    with api.open(db, config, create=False) as handle:
        result = handle.cancel(notice_id, key=key, reason=reason)
    out.cancelled(result, json_output)


@command(app, "list")
def list_notices(
    phase: Annotated[
        list[str] | None,
        typer.Option(help="Only this phase (repeatable): queued, accepted, cancelled, ..."),
    ] = None,
    region: Annotated[str | None, typer.Option(help="Only this region.")] = None,
    at_risk: Annotated[
        bool, typer.Option("--at-risk", help="Only live notices alerts calls at risk.")
    ] = False,
    since: Annotated[
        str | None,
        typer.Option(help="Created since: a duration ago (2h) or an ISO time [default: 1d]."),
    ] = None,
    account: Annotated[str | None, typer.Option(help="Only this account_ref.")] = None,
    limit: Annotated[int, typer.Option(min=1, max=10_000, help="At most this many.")] = 50,
    json_output: JsonOption = False,
    db: DbOption = None,
    config: ConfigOption = None,
) -> None:
    """List notices, newest first: phase, region, account, times. Never a secret.

    Live-only searches (live phases, --at-risk) read every live notice; an --account
    search reads that account's; otherwise notices created since --since (one day back
    unless told).

    Examples:

        resetctl list --at-risk
        resetctl list --account acct-42 --json
        resetctl list --phase expired --phase failed --since 6h
    """
    with api.open(db, config, create=False) as handle:
        start = None if since is None else parse_time_or_ago(since, "--since", handle.clock())
        rows = handle.find(
            phases=phase or (),
            region=region,
            account=account,
            since=start,
            at_risk=at_risk,
            limit=limit,
        )
    if json_output:
        out.dump(rows)
    else:
        out.notice_list(rows)


@command(app, "export-timings")
def export_timings(
    since: Annotated[
        str | None, typer.Option(help="ISO 8601 time, or a duration ago (7d) [default: all].")
    ] = None,
    until: Annotated[str | None, typer.Option(help="ISO 8601 time or duration ago.")] = None,
    output: Annotated[
        Path | None, typer.Option("--output", help="Trace file [default: standard output].")
    ] = None,
    db: DbOption = None,
    config: ConfigOption = None,
) -> None:
    """Write finished notices' timings as de-identified traces for `replay`.

    No notice id, account, contact data or URL; trace ids are sequence numbers.

    Example:

        resetctl export-timings --since 7d --output week.jsonl
    """
    now = time.time()
    start = parse_time_or_ago(since, "--since", now) if since else 0.0
    end = parse_time_or_ago(until, "--until", now) if until else math.inf
    with api.open(db, config, create=False) as handle:
        traces = handle.export_timings(start, end)
    out.traces(traces, output)


@command(app)
def replay(
    traces: Annotated[
        Path, typer.Argument(help="Trace file (JSON Lines), e.g. from export-timings.")
    ],
    policy: Annotated[
        list[Path] | None,
        typer.Option("--policy", help="A config file whose [policy.*] tables to compare; repeat."),
    ] = None,
    overrides: Annotated[
        list[str] | None,
        typer.Option("--set", help="Override for every region, e.g. email.poll_delays=10,30,90."),
    ] = None,
    sweep_interval: Annotated[
        str | None,
        typer.Option(help="Seconds between cron sweeps [default: the trace header's, or 60]."),
    ] = None,
    max_runtime: Annotated[str, typer.Option(help="Each sweep's --max-runtime.")] = "0",
    read_lag: Annotated[
        str | None,
        typer.Option(
            help="Seconds from a read's due time to the read [default: the trace header's"
            " observed median, or 0]."
        ),
    ] = None,
    seed: Annotated[
        int, typer.Option(help="Seed of the point estimate's draws and borrowed timelines.")
    ] = 0,
    call_time: Annotated[
        float, typer.Option(min=0.0, help="Simulated seconds per transport call.")
    ] = 0.0,
    batch_size: Annotated[int | None, typer.Option(min=1, help="Notices per claim.")] = None,
    lease: Annotated[str | None, typer.Option(help="Lease per claim.")] = None,
    json_output: JsonOption = False,
    config: ConfigOption = None,
) -> None:
    """Replay de-identified timings under candidate policies and compare the outcomes.

    Every trace runs through the same transition function `sweep` uses, under a simulated
    clock that models cron's cadence and phase, the --max-runtime loop, batch size,
    leases and read lag; a trace's cancel ends its notice at its own time, as the
    application's `resetctl cancel` did. With no --policy, the current configuration is
    the baseline; --set adds a column with the overrides applied to every region. Each
    figure is a point estimate with the range the traces allow (optimistic to
    pessimistic).

    Examples:

        resetctl replay week.jsonl --set email.poll_delays=10,30,90
        resetctl replay week.jsonl --policy candidate.toml --json
    """
    candidates = api.replay_candidates(policy or [], overrides or [], config=config)
    runtime = max_runtime_seconds(max_runtime)
    seconds = None if lease is None else parse_duration(lease, "--lease")
    interval = (
        None if sweep_interval is None else parse_duration(sweep_interval, "--sweep-interval")
    )
    lag = _non_negative_duration(read_lag, "--read-lag") if read_lag is not None else None
    with out.replay_progress() as progress:
        result = api.replay(
            traces,
            candidates,
            sweep_interval=interval,
            max_runtime=runtime,
            read_lag=lag,
            call_time=call_time,
            batch_size=batch_size,
            lease=seconds,
            seed=seed,
            progress=progress,
        )
    out.replay_unknown_statuses(result)
    if json_output:
        out.dump([r.to_json() for r in result.reports])
    else:
        out.replay(result)


@command(app, "serve-callbacks")
def serve_callbacks(
    bind: Annotated[
        str, typer.Option("--bind", help="host:port to listen on; a reverse proxy fronts it.")
    ] = "127.0.0.1:8080",
    public_url: Annotated[
        str | None,
        typer.Option(
            "--public-url",
            help="The URL the provider was given [default: the instance's own, such as"
            " [twilio] status_callback].",
        ),
    ] = None,
    instance: Annotated[
        str,
        typer.Option("--instance", help="The provider instance whose callbacks these are."),
    ] = "twilio",
    trusted_proxy: Annotated[
        str | None,
        typer.Option(
            "--trusted-proxy",
            help="The reverse proxy's IP address: scheme and host come from the"
            " X-Forwarded-Proto/-Host it adds, dropped from any other peer.",
        ),
    ] = None,
    trust_forwarded: Annotated[
        bool,
        typer.Option("--trust-forwarded", hidden=True, help="Replaced by --trusted-proxy."),
    ] = False,
    max_connections: MaxConnectionsOption = CONNECTION_LIMIT,
    request_timeout: RequestTimeoutOption = f"{REQUEST_TIMEOUT:g}s",
    threads: Annotated[int, typer.Option(min=1, help="Worker threads.")] = 4,
    db: DbOption = None,
    config: ConfigOption = None,
) -> None:
    """Serve a provider instance's callbacks over HTTP (waitress), as observe records them.

    Answers 204 when recorded (a replay is stored once), 403 for a bad signature, 400
    for a malformed body, 413 for a body over 64 KiB (from its headers, before reading
    it), 503 when the database is unavailable (Twilio retries). A slow client is cut off
    after --request-timeout. The signature is checked against the public URL plus the
    request's query string. Needs the web extra: pip install 'resetctl[web]'. SIGTERM
    stops it.

    Example:

        resetctl serve-callbacks --public-url https://hooks.example/twilio
    """
    try:
        import waitress  # noqa: F401  # only asks whether the web extra is installed
    except ImportError:
        raise ConfigError("serve-callbacks needs waitress: pip install 'resetctl[web]'") from None
    from resetctl.web import (
        bind_address,
        provider_callbacks,
        request_timeout_seconds,
    )

    bind_address(bind)  # a bad --bind fails before the database is opened
    if trust_forwarded and trusted_proxy is None:
        raise ConfigError(
            "--trust-forwarded: name the proxy with --trusted-proxy ADDR (forwarded headers"
            " from any other peer are dropped)"
        )
    timeout = request_timeout_seconds(request_timeout)
    # A callback waits at most this long for a sweep's write lock, then gets a 503 (Twilio
    # gives up on a webhook after 15 s and would not know to retry).
    with api.open(db, config, create=False, busy_timeout=CALLBACK_BUSY_TIMEOUT) as handle:
        application = provider_callbacks(
            handle, instance, public_url, trust_forwarded=trusted_proxy is not None
        )
        server = listening(
            application,
            bind,
            threads=threads,
            max_connections=max_connections,
            request_timeout=timeout,
            trusted_proxy=trusted_proxy,
        )
        run_until_terminated(server)


command(app, "serve")(serve)


@command(app)
def health(
    window: Annotated[str, typer.Option(help="How far back to count, e.g. 5m, 1h, 30d.")] = "5m",
    show_storage: Annotated[
        bool, typer.Option("--storage", help="Measured bytes per event and projected size.")
    ] = False,
    retention: Annotated[
        str, typer.Option(help="Retention for --storage, and --telemetry's default.")
    ] = "30d",
    telemetry: Annotated[
        bool, typer.Option(help="Bytes per day of events, logs, observations; projected.")
    ] = False,
    json_output: JsonOption = False,
    db: DbOption = None,
    config: ConfigOption = None,
) -> None:
    """Population numbers: phases, sweep lag, outcomes, escalations, races. No rows.

    Example:

        resetctl health --window 1h --json
        resetctl health --telemetry
    """
    seconds = parse_duration(window, "--window")
    keep = parse_duration(retention, "--retention")
    with api.open(db, config, create=False) as handle:
        report = handle.health(seconds, storage=show_storage, retention=keep, telemetry=telemetry)
    if json_output:
        out.dump(report)
    else:
        out.health(report, window)


def _alerts_unknown(exc: Exception, options: Mapping[str, Any]) -> typer.Exit:
    """A monitoring check answers UNKNOWN, never a traceback: whatever kept it from
    running, named in one line."""
    message = str(exc) if isinstance(exc, ResetctlError) else type(exc).__name__
    out.alerts_unknown(time.time(), message, bool(options["json_output"]))
    return typer.Exit(ALERTS_UNKNOWN)


@command(app, on_error=_alerts_unknown)
def alerts(
    peek: Annotated[
        bool,
        typer.Option(
            "--peek", help="Report without using up one-time warnings (by hand; cron omits it)."
        ),
    ] = False,
    json_output: JsonOption = False,
    db: DbOption = None,
    config: ConfigOption = None,
) -> None:
    """Page when on-call can still act: deadlines at risk, unseen endings, a stalled sweep.

    Critical: a live notice whose next useful action (a submission, a retry, a fallback,
    or a read that can still lead to one) is overdue and its remaining lifetime is within
    alert_warning of no longer covering it; or live notices wait while no sweep has
    finished for alert_stalled_after. Warning: a tight budget, a notice past help
    (reported once), or a notice that ended without success since the previous run
    (reported once). Exit codes follow the monitoring-plugin convention: 0 ok,
    1 warning, 2 critical, 3 unknown (the check could not run: missing database, bad
    config, unreadable file). Notices under alert_mode = "observe" never raise the exit
    code; their critical alerts are recorded once as would_page events. --peek (for a
    look by hand) records nothing, so the next cron run still reports what it would.

    Example:

        resetctl alerts --json > /var/lib/resetctl/alerts.json
    """
    with api.open(db, config, create=False) as handle:
        report = handle.alerts(peek=peek)
    if json_output:
        # One line: a crontab appends each run to a log, and "at" dates it.
        out.json_line(report.to_json())
    else:
        out.alerts(report)
    raise typer.Exit(int(report.level))


@command(app)
def metrics(
    textfile: Annotated[
        Path, typer.Option("--textfile", help="Where node_exporter's textfile collector reads.")
    ],
    db: DbOption = None,
    config: ConfigOption = None,
) -> None:
    """Write Prometheus metrics (counters from events, queue gauges) atomically.

    Example:

        resetctl metrics --textfile /var/lib/node_exporter/textfile/resetctl.prom
    """
    with api.open(db, config, create=False) as handle:
        try:
            handle.write_metrics(textfile)
        except OSError as exc:
            raise ResetctlError(f"--textfile: cannot write ({exc.strerror})") from None


@command(app)
def purge(
    older_than: Annotated[
        str,
        typer.Option(
            help="Delete notices finished longer ago than this, where their policy sets no"
            " retention."
        ),
    ] = "30d",
    aggregates_older_than: Annotated[
        str,
        typer.Option(help="Delete daily aggregate counts of days older than this (1d to 3660d)."),
    ] = "400d",
    batch_size: Annotated[int, typer.Option(min=1, help="Notices per short transaction.")] = 500,
    json_output: JsonOption = False,
    db: DbOption = None,
    config: ConfigOption = None,
) -> None:
    """Delete finished notices past their retention, in short batches.

    How long a finished notice is kept: the retention of the policy of that name in
    today's config (a shortened retention reaches rows already stored); for a policy
    no longer configured, the retention in the newest record of it stored in the
    database; for a policy that sets none, --older-than. A policy's retention wins
    over --older-than both ways: its notices are never deleted before it has passed,
    nor kept past the first purge after that. So with [policy.eu] retention = "7d"
    and [policy.us] setting none, the second example below deletes eu notices that
    finished more than 7 days ago and us notices that finished more than 90 days ago.

    Their events are folded into the daily aggregate counts first, so health and the
    metrics still add up.

    --aggregates-older-than is the aggregates' own retention (400d, so health can
    still look a year back): a day of them goes once it ended longer ago than that,
    its counts added to all-time totals, so the metrics' counters never go down.
    Abuse-limit counters idle for longer than any limit window (30 days) go too.

    Safe while sweeps run: live notices are never touched, and each batch is a short
    transaction. Every option is checked before anything is deleted.

    Examples:

        resetctl purge --older-than 30d
        resetctl purge --older-than 90d --aggregates-older-than 730d --json
    """
    seconds = parse_duration(older_than, "--older-than")
    aggregates = aggregates_retention(aggregates_older_than, "--aggregates-older-than")
    with api.open(db, config, create=False) as handle:
        purged = handle.purge(seconds, aggregates_older_than=aggregates, batch_size=batch_size)
    out.purged(purged, json_output)


@command(app)
def demo(
    db: Annotated[
        str | None,
        typer.Option(
            "--db",
            help="Where to keep the demo database: a file or a postgresql:// URI"
            " [default: a temp dir].",
        ),
    ] = None,
) -> None:
    """Enqueue sample notices and sweep them through a simulated clock on the outbox.

    Prints every transition; afterwards, inspect any notice with the printed command.
    Without --db it uses a new temporary file; a --db that already holds notices is
    refused (the demo's clock is simulated: it must never drive real notices).

    Example:

        resetctl demo
    """
    path = db or str(Path(tempfile.mkdtemp(prefix="resetctl-demo-")) / "demo.db")
    logging.getLogger("resetctl").setLevel(logging.WARNING)  # it prints transitions itself
    # The simulated run ends about now, so `inspect` afterwards reads sensible ages.
    start = time.time() - 180
    labels: dict[str, str] = {}
    with api.open(path) as handle:
        ids = handle.run_demo(
            start,
            lambda event: out.demo_transition(event, start, labels.get(event.notice_id, "")),
            labels.__setitem__,
        )
        ended = [(i, str(handle.inspect(i)["phase"]), labels[i]) for i in ids]
    out.demo_ended(ended, path, ids[1], _this_program())


def _this_program() -> str:
    """How a shell runs this very resetctl again: ``resetctl`` when that name on PATH is
    this program; else its full path (a virtual environment that is not activated), or,
    under ``python -m resetctl``, this interpreter with ``-m resetctl``."""
    program = Path(sys.argv[0])
    if program.name == "__main__.py" or not program.is_file():
        return f"{shlex.quote(sys.executable)} -m resetctl"
    on_path = shutil.which("resetctl")
    if on_path is not None and os.path.samefile(on_path, program):
        return "resetctl"
    return shlex.quote(str(program.absolute()))
