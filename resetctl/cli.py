"""The ``resetctl`` command line: parse options, make one call, render the result.

Domain errors become exit codes here and nowhere else: 0 ok, 1 runtime failure (unknown
notice, unusable database), 2 bad input or configuration (nothing written).
"""

from __future__ import annotations

import dataclasses
import json
import logging
import math
import os
import signal
import sys
import tempfile
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import TYPE_CHECKING, Annotated, Any, TypeVar

import typer
from rich.console import Console
from rich.markup import escape
from rich.table import Table

from resetctl.api import Handle
from resetctl.config import Settings, load_settings, parse_duration
from resetctl.errors import ConfigError, InputError, NoticeNotFound, ResetctlError, StoreError
from resetctl.machine import Status
from resetctl.report import notice_report
from resetctl.store import Store, database_errors, is_postgres, open_store
from resetctl.summary import iso
from resetctl.telemetry import TransitionEvent

if TYPE_CHECKING:
    from resetctl.templates import TemplatesReport

app = typer.Typer(
    help="Deliver password-reset notices by email and SMS before the link dies.",
    no_args_is_help=True,
    add_completion=False,
    pretty_exceptions_enable=False,
    # Plain text: help and docstrings hold literal brackets ("[default: …]", "[outbox]").
    rich_markup_mode=None,
)
outbox_app = typer.Typer(
    help="The embedded outbox transport: list, show and script messages.",
    no_args_is_help=True,
    rich_markup_mode=None,
)
app.add_typer(outbox_app, name="outbox")
observe_app = typer.Typer(
    help="Record a provider's status callback through the same machine as polling.",
    no_args_is_help=True,
    rich_markup_mode=None,
)
app.add_typer(observe_app, name="observe")
templates_app = typer.Typer(
    help="Own the reset copy: copy the built-in templates, check them, preview them.",
    no_args_is_help=True,
)
app.add_typer(templates_app, name="templates")
db_app = typer.Typer(
    help="Move the database: copy a SQLite file into PostgreSQL.",
    no_args_is_help=True,
    rich_markup_mode=None,
)
app.add_typer(db_app, name="db")

# markup=False: messages carry literal brackets ("[outbox]", "[policy.*]") and user text
# (regions); the few styled lines ask for markup and escape what they interpolate.
stdout = Console(highlight=False, soft_wrap=True, emoji=False, markup=False)
stderr = Console(stderr=True, highlight=False, soft_wrap=True, emoji=False, markup=False)

#: Seconds a served callback waits for the database's write lock before answering 503.
CALLBACK_BUSY_TIMEOUT = 10.0

#: Problems printed for one failed command; the rest are counted (100k bad lines must
#: not mean 100k lines of output).
MAX_PROBLEMS = 100

DbOption = Annotated[
    str | None,
    typer.Option(
        "--db",
        envvar="RESETCTL_DB",
        help="SQLite file, or a postgresql:// URI (password from PGPASSWORD, ~/.pgpass or"
        " PGSERVICE, never here) [default: ./resetctl.db].",
    ),
]
ConfigOption = Annotated[
    Path | None,
    typer.Option("--config", envvar="RESETCTL_CONFIG", help="TOML settings and policies."),
]
JsonOption = Annotated[bool, typer.Option("--json", help="Machine-readable output.")]

T = TypeVar("T")


def main() -> None:
    """Console-script entry point."""
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

    if (
        log_format not in ("text", "json")
        or log_level.upper() not in logging.getLevelNamesMapping()
    ):
        stderr.print("error: --log-format: text or json; --log-level: info, warning, error")
        raise typer.Exit(2)
    configure_logging(log_format, log_level)
    global _json_logs
    _json_logs = log_format == "json"


#: --log-format json: errors become JSON log lines too (with their time), so a cron
#: log of one command's stderr reads as one format.
_json_logs = False


def _problems(exc: ResetctlError) -> list[str]:
    """The error's lines, the first MAX_PROBLEMS of them and a total."""
    problems = exc.problems if isinstance(exc, InputError) else [str(exc)]
    if len(problems) <= MAX_PROBLEMS:
        return problems
    rest = len(problems) - MAX_PROBLEMS
    return [
        *problems[:MAX_PROBLEMS],
        f"{len(problems)} problems in total ({rest} more not shown); nothing was written",
    ]


def _fail(exc: ResetctlError) -> typer.Exit:
    _say_errors(_problems(exc))
    return typer.Exit(exc.exit_code)


def _say_errors(problems: list[str]) -> None:
    """One ``error:`` line per problem on stderr (a JSON log line under --log-format json)."""
    if _json_logs:
        from resetctl.telemetry import LOGGER

        for problem in problems:
            LOGGER.error(problem)
    else:
        for problem in problems:
            stderr.print(f"error: {problem}")


@contextmanager
def _opened(
    db: str | None,
    config: Path | None,
    *,
    must_exist: bool = False,
    on_error: Callable[[ResetctlError], typer.Exit] | None = None,
) -> Iterator[tuple[Store, Settings]]:
    """Settings and store for one command; domain errors become exit codes.

    ``must_exist``: the command only reads (or acts on what is there), so a missing
    database is a one-line error naming the path and nothing is created.
    """
    fail = on_error or _fail
    path = db or "resetctl.db"
    try:
        settings = load_settings(config)
        path = db or settings.db or "resetctl.db"
        with open_store(path, must_exist=must_exist) as store:
            yield store, settings
    except ResetctlError as exc:
        raise fail(exc) from None
    except database_errors() as exc:
        # A full disk, a read-only file, a corrupt page: one line, nothing half-written
        # (the transaction that failed was rolled back).
        raise fail(StoreError(f"database {path}: {exc}")) from None


@contextmanager
def _handle(
    db: str | None,
    config: Path | Settings | None,
    *,
    must_exist: bool = False,
    clock: Callable[[], float] = time.time,
    sleep: Callable[[float], None] = time.sleep,
    busy_timeout: float | None = None,
) -> Iterator[Handle]:
    """The library's handle for one command (the one path the API and the CLI share);
    domain errors become exit codes, as with :func:`_opened`."""
    import resetctl

    try:
        with resetctl.open(
            db,
            config,
            create=not must_exist,
            clock=clock,
            sleep=sleep,
            busy_timeout=busy_timeout,
        ) as handle:
            yield handle
    except ResetctlError as exc:
        raise _fail(exc) from None


def _run(call: Callable[[], T]) -> T:
    try:
        return call()
    except ResetctlError as exc:
        raise _fail(exc) from None


def _max_runtime(value: str) -> float:
    """--max-runtime: 0 (one pass) or a positive duration."""
    return 0.0 if value.strip() in ("0", "0s") else parse_duration(value, "--max-runtime")


def _print_table(table: Table) -> None:
    """A table at the terminal's width; piped, as wide as it needs (never an id cut)."""
    if stdout.is_terminal:
        stdout.print(table)
        return
    # print(width=…) is capped at the console's width: a wide console of its own.
    Console(file=sys.stdout, width=10_000, highlight=False, emoji=False, markup=False).print(table)


def _dump(data: Any) -> None:
    stdout.out(json.dumps(data, indent=2, sort_keys=False), highlight=False)


@app.command()
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
    nothing written.

    With --send the transports, templates and lease are checked first (a problem: exit
    2, nothing written), then the notices are committed and submitted at once. Once they
    are committed, every notice gets its line and the exit code is 0, whatever the
    submission did: "submitted": true, or false with a "reason" (transient, ambiguous,
    permanent, declined, expired, already_terminal, in_progress, in_doubt, store_error;
    see README) and the notice's "phase". Cron's sweep carries on with what is left.

    Example:

        resetctl enqueue --send --input requests.jsonl

    where each line looks like
    {"idempotency_key": "r-1", "email": "a@example.com", "reset_url": "https://x.example/r/a"}
    """
    from resetctl.clocks import clock_from_env

    clock, _ = clock_from_env(os.environ)
    with _handle(db, config, clock=clock) as handle:
        try:
            if input_file is None:
                lines = sys.stdin.read().splitlines()
            else:
                lines = input_file.read_text(encoding="utf-8").splitlines()
        except (OSError, UnicodeDecodeError) as exc:
            stderr.print(f"error: cannot read input: {type(exc).__name__}", markup=False)
            raise typer.Exit(2) from None
        results = _run(lambda: handle.enqueue_lines(lines, send=send))
    for result in results:
        stdout.out(json.dumps(result.to_json()), highlight=False)


@app.command()
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
    json_output: JsonOption = False,
    db: DbOption = None,
    config: ConfigOption = None,
) -> None:
    """Claim due notices and drive them: submit, poll, escalate, expire.

    Run it every minute from cron; with --max-runtime it keeps working inside the
    minute so sub-minute poll schedules hold. Exits non-zero only when the sweep itself
    cannot run; per-notice transport errors are counted and retried by later sweeps.

    Example:

        * * * * * resetctl sweep --max-runtime 55s --db /var/lib/resetctl/resetctl.db
    """
    from resetctl.clocks import clock_from_env

    clock, sleep = clock_from_env(os.environ)
    with _handle(db, config, clock=clock, sleep=sleep) as handle:
        try:
            runtime = _max_runtime(max_runtime)
            seconds = parse_duration(lease, "--lease") if lease else None
        except ConfigError as exc:
            raise _fail(exc) from None
        # SIGTERM and SIGINT end the run as --max-runtime does: no new claim or call,
        # leases handed back, the summary printed.
        summary = _run(
            lambda: handle.sweep(
                runtime,
                batch_size=batch_size,
                lease=seconds,
                worker_id=worker_id,
                handle_signals=True,
            )
        )
    stdout.out(summary.line(clock(), json_output), highlight=False)


@app.command()
def inspect(
    notice_id: Annotated[str, typer.Argument(help="The notice id printed by enqueue.")],
    json_output: JsonOption = False,
    db: DbOption = None,
    config: ConfigOption = None,
) -> None:
    """Show a notice's phase, timing, attempts, next action, lease and history.

    Never shows an email address, phone number or reset URL.

    Example:

        resetctl inspect ntc_1a230f089c03f2a9c0d1e4b5 --json
    """
    with _handle(db, config, must_exist=True) as handle:
        report = _run(lambda: handle.inspect(notice_id))
    if json_output:
        _dump(report)
        return
    _render_report(report)


def _render_report(report: dict[str, Any]) -> None:
    from resetctl.config import format_duration

    stdout.print(
        f"[bold]{escape(report['notice_id'])}[/bold]  phase [bold]{escape(report['phase'])}[/bold]"
        + (f" ({escape(report['reason'])})" if report["reason"] else ""),
        markup=True,
    )
    stdout.print(
        f"region {report['region']} · policy {report['policy']} v{report['policy_version']}"
        f" · channels {' → '.join(report['channels'])}"
    )
    stdout.print(f"created {report['created_at']} · expires {report['expires_at']}")
    stdout.print(
        f"remaining lifetime {format_duration(report['remaining_seconds'])}"
        f" · in this phase for {format_duration(report['state_age_seconds'])}"
    )
    action = report["next_action"]
    if action:
        where = f" {action['channel']}" if action["channel"] else ""
        stdout.print(
            f"next: {action['action']}{where} at {action['due_at']}"
            f" (in {format_duration(action['due_in_seconds'])}, {action['reason']})"
        )
    else:
        stdout.print("next: nothing (terminal)")
    budget = report["action_budget"]
    if budget["fallback_channel"]:
        left = format_duration(budget["seconds_to_fallback_deadline"])
        can = "still possible" if budget["fallback_possible"] else "not possible"
        stdout.print(
            f"fallback {budget['fallback_channel']}: {can}; deadline"
            f" {budget['fallback_deadline']} (in {left})"
            + (" · AT RISK" if budget["at_risk"] else ""),
            markup=False,
        )
    success = ", ".join(f"{c} {'/'.join(s)}" for c, s in budget["success_statuses"].items())
    stdout.print(f"success means: {success}", markup=False)
    lease = report["lease"]
    if lease:
        state = "held" if lease["active"] else "expired"
        stdout.print(f"lease: {lease['owner']} until {lease['expires_at']} ({state})")
    stdout.print("attempts:")
    for a in report["attempts"]:
        doubt = " (outcome unknown)" if a["in_doubt"] else ""
        stdout.print(
            f"  {a['channel']:<5} {a['attempt_key']}  {a['state']}{doubt}"
            f"  status {a['status']}  polls {a['polls']}  via {a['transport']}",
            markup=False,
        )
        obs = a["last_observation"]
        if obs:
            stdout.print(
                f"        last seen {obs['at']} by {obs['source']}:"
                f" {obs['raw_status']!r} → {obs['status']}",
                markup=False,
            )
        if a["last_error"]:
            stdout.print(f"        last error: {a['last_error']}", markup=False)
    stdout.print("history:")
    for h in report["history"]:
        change = h["new_phase"]
        if h["old_phase"] != h["new_phase"]:
            change = f"{h['old_phase']} → {h['new_phase']}"
        extra = " ".join(x for x in (h["status"], h["reason"] and f"({h['reason']})") if x)
        stdout.print(
            f"  {h['at']}  {h['kind']:<15} {change}  {extra}  [{h['worker']}]", markup=False
        )


@outbox_app.command("list")
def outbox_list(
    notice: Annotated[str | None, typer.Option(help="Only this notice's messages.")] = None,
    json_output: JsonOption = False,
    db: DbOption = None,
    config: ConfigOption = None,
) -> None:
    """List outbox messages (no content).

    Example:

        resetctl outbox list --json
    """
    with _opened(db, config, must_exist=True) as (store, _):
        rows = store.outbox_messages(notice)
    for row in rows:
        row["submitted_at"] = iso(row["submitted_at"])
    if json_output:
        _dump(rows)
        return
    table = Table("message id", "notice", "channel", "status", "submitted")
    for row in rows:
        table.add_row(
            row["message_id"], row["notice_id"], row["channel"], row["status"], row["submitted_at"]
        )
    _print_table(table)


@outbox_app.command("show")
def outbox_show(
    message_id: Annotated[str, typer.Argument(help="An outbox message id.")],
    json_output: JsonOption = False,
    db: DbOption = None,
    config: ConfigOption = None,
) -> None:
    """Show one rendered message, as a local mail catcher would.

    This is development tooling: the message holds the reset link.

    Example:

        resetctl outbox show obx_1a230f089c00123456789abcdef --json
    """
    with _opened(db, config, must_exist=True) as (store, _):
        row = store.outbox_message(message_id)
    if row is None:
        raise _fail(NoticeNotFound(f"no outbox message {message_id!r}"))
    row["submitted_at"] = iso(row["submitted_at"])
    if json_output:
        _dump(row)
        return
    for key, value in row.items():
        if key not in ("text", "html", "body"):
            stdout.print(f"{key}: {value}", markup=False)
    for key in ("text", "body", "html"):
        if key in row:
            stdout.print(f"\n--- {key} ---\n{row[key]}", markup=False)
    if row.get("scrubbed"):
        stdout.print(
            "content scrubbed: the notice has ended (set [outbox] keep_content = true to"
            " keep rendered messages in development)"
        )


@outbox_app.command("set-status")
def outbox_set_status(
    message_id: Annotated[str, typer.Argument(help="An outbox message id.")],
    status: Annotated[str, typer.Argument(help="pending, accepted, delivered, failed or unknown.")],
    db: DbOption = None,
    config: ConfigOption = None,
) -> None:
    """Script the status the next poll of an outbox message will read.

    Example:

        resetctl outbox set-status obx_1a230f089c00123456789abcdef failed
    """
    if status not in {s.value for s in Status}:
        stderr.print(f"error: status: must be one of {', '.join(s.value for s in Status)}")
        raise typer.Exit(2)
    with _opened(db, config, must_exist=True) as (store, _):
        found = store.outbox_set_status(message_id, status, time.time())
    if not found:
        raise _fail(NoticeNotFound(f"no outbox message {message_id!r}"))
    stdout.print(f"{message_id}: {status}")


def _parse_time(value: str, field: str, now: float) -> float:
    """An ISO 8601 time with offset, or a duration ago ("24h", "7d")."""
    from dateutil import parser as dateparser

    try:
        moment = dateparser.isoparse(value)
    except ValueError:
        try:
            return now - parse_duration(value, field)
        except ConfigError:
            raise ConfigError(
                f"{field}: expected an ISO 8601 time with offset or a duration ago (24h)"
            ) from None
    if moment.tzinfo is None:
        raise ConfigError(f"{field}: needs a timezone offset (e.g. 2026-11-29T00:00:00Z)")
    return moment.timestamp()


@templates_app.command("init")
def templates_init(
    directory: Annotated[Path, typer.Argument(help="Your templates directory.")],
) -> None:
    """Copy the built-in template versions into DIRECTORY as a starting point.

    Then set `[templates] dir` to DIRECTORY and edit the copy there: an upgrade of
    resetctl never touches it. Existing versions in DIRECTORY are never overwritten.

    Example:

        resetctl templates init /etc/resetctl/templates
    """
    from resetctl.templates import init_templates

    versions = _run(lambda: init_templates(directory))
    for version in versions:
        stdout.print(f"{directory / version}", markup=False)
    stdout.print(f'now set in your config:\n[templates]\ndir = "{directory}"', markup=False)


@templates_app.command("check")
def templates_check(
    version: Annotated[
        str | None, typer.Option("--version", help="Only this version [default: all].")
    ] = None,
    json_output: JsonOption = False,
    db: DbOption = None,
    config: ConfigOption = None,
) -> None:
    """Render every version and locale with hostile sample data; exit 2 on any problem.

    Finds missing files, Mustache syntax errors, unknown variables, the reset URL in a
    subject, an SMS over sms.max_segments, and user text put into HTML unescaped. Shows
    each SMS's encoding and segment count, the versions the policies name and the
    versions live notices in the database still use (a missing database is read as
    none, and is not created). A sweep refuses to start when a policy's version, or a
    version live notices use, is missing or fails this check.

    Example:

        resetctl templates check --version v2 --config /etc/resetctl/resetctl.toml
    """
    from resetctl.templates import templates_report

    settings = _run(lambda: load_settings(config))
    path = db or settings.db or "resetctl.db"
    # No database yet means no notice in flight; a read never creates one.
    read = is_postgres(path) or Path(path).exists()
    if read:
        with _handle(db, settings, must_exist=True) as handle:
            report = _run(lambda: handle.check_templates(version))
    else:
        report = _run(lambda: templates_report(settings, version))
    if json_output:
        _dump(report.to_json())
    else:
        _render_templates_report(report, None if read else path)
    _say_errors(list(report.in_use_failures))
    if not report.ok:
        raise typer.Exit(2)


def _render_templates_report(report: TemplatesReport, missing_db: str | None) -> None:
    """Versions configured and in use, then each directory's verdict and SMS samples."""
    configured = [
        f"{use.version} ({', '.join(f'policy.{name}' for name in use.policies)})"
        for use in report.uses
        if use.policies
    ]
    in_use = [
        f"{use.version} ({use.live_notices} live notice{'' if use.live_notices == 1 else 's'})"
        for use in report.uses
        if use.live_notices
    ]
    stdout.print(f"configured: {', '.join(configured) or 'none'}", markup=False)
    if missing_db is not None:
        stdout.print(f"in use: none (no database at {missing_db})", markup=False)
    else:
        stdout.print(f"in use: {', '.join(in_use) or 'none'}", markup=False)
    for copy in report.copies:
        verdict = "FAIL" if copy.problems else "ok"
        stdout.print(f"{copy.label}: {verdict}", markup=False)
        for problem in copy.problems:
            stdout.print(f"  error: {problem}", markup=False)
        for sms in copy.sms:
            plural = "" if sms.segments == 1 else "s"
            dropped = "" if sms.name_kept or sms.sample == "no display name" else ", name dropped"
            stdout.print(
                f"  sms, {sms.sample}: {sms.encoding}, {sms.segments} segment{plural}{dropped}",
                markup=False,
            )


@templates_app.command("preview")
def templates_preview(
    version: Annotated[
        str | None,
        typer.Option("--version", help="Template version [default: policy.default's]."),
    ] = None,
    locale: Annotated[
        str | None, typer.Option("--locale", help="Reader's locale, e.g. es-MX [default: none].")
    ] = None,
    output: Annotated[
        Path, typer.Option("--output", help="Directory to write the files into.")
    ] = Path("template-preview"),
    minutes: Annotated[int, typer.Option(min=0, help="Minutes until the link expires.")] = 10,
    config: ConfigOption = None,
) -> None:
    """Write the email (HTML and text) and SMS rendered for sample data into a directory.

    Open email.html in a browser before shipping the copy. Only sample data is used.

    Example:

        resetctl templates preview --version v2 --locale es-MX --output /tmp/preview
    """
    from resetctl.templates import preview

    settings = _run(lambda: load_settings(config))
    chosen = version or settings.default_policy.template_version
    result = _run(lambda: preview(settings, chosen, locale, output, minutes=minutes))
    used = f"{chosen}/{result.locale}" if result.locale else f"{chosen} (default copy)"
    stdout.print(f"rendered from {used}", markup=False)
    for path in result.files.values():
        stdout.print(str(path), markup=False)
    over = result.segments > result.max_segments
    stdout.print(
        f"sms: {result.encoding}, {result.segments} segment{'' if result.segments == 1 else 's'}"
        + (
            f" (over sms.max_segments = {result.max_segments}: it would be refused)" if over else ""
        ),
        markup=False,
    )


@app.command("export-timings")
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
    from resetctl.timings import export_timings as export

    now = time.time()
    try:
        start = _parse_time(since, "--since", now) if since else 0.0
        end = _parse_time(until, "--until", now) if until else math.inf
    except ConfigError as exc:
        raise _fail(exc) from None
    with _opened(db, config, must_exist=True) as (store, _):
        lines = [
            json.dumps(trace, separators=(",", ":")) + "\n" for trace in export(store, start, end)
        ]
    if output is None:
        sys.stdout.writelines(lines)
        return
    # Written beside the target and renamed: a reader never sees half a file.
    partial = output.with_name(output.name + ".partial")
    partial.write_text("".join(lines), encoding="utf-8")
    partial.replace(output)
    stderr.print(f"{len(lines) - 1} traces written to {output}", markup=False)


@app.command()
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
    leases and read lag. With no --policy, the current configuration is the baseline;
    --set adds a column with the overrides applied to every region. Each figure is a
    point estimate with the range the traces allow (optimistic to pessimistic).

    Example:

        resetctl replay week.jsonl --set email.poll_delays=10,30,90 \\
            --set on_poll_budget_spent=expire
    """
    from resetctl import replay as replaying
    from resetctl.config import load_toml, settings_from_mapping, with_overrides

    try:
        bases = [(p.stem, load_toml(p)) for p in policy or []]
        if not bases:
            bases = [("current", load_toml(config) if config else {})]
        candidates = []
        for label, data in bases:
            candidates.append(
                replaying.Candidate(label, settings_from_mapping(data, label).policies)
            )
            if overrides:
                changed = with_overrides(data, overrides)
                name = f"{label} + {' '.join(overrides)}"
                candidates.append(
                    replaying.Candidate(name, settings_from_mapping(changed, name).policies)
                )
        options = replaying.SimulationOptions(
            max_runtime=_max_runtime(max_runtime),
            call_time=call_time,
            batch_size=batch_size,
            lease=parse_duration(lease, "--lease") if lease else None,
        )
        interval = parse_duration(sweep_interval, "--sweep-interval") if sweep_interval else None
        lag = _non_negative_duration(read_lag, "--read-lag") if read_lag is not None else None
    except ConfigError as exc:
        raise _fail(exc) from None
    try:
        handle = traces.open(encoding="utf-8")
    except OSError as exc:
        stderr.print(f"error: {traces}: cannot read ({exc.strerror})", markup=False)
        raise typer.Exit(2) from None
    with handle:
        header = _run(lambda: replaying.read_header(handle))
        options = replaying.with_header(options, header, sweep_interval=interval, read_lag=lag)
        result = _run(
            lambda: _replay_with_progress(replaying, handle, traces, candidates, options, seed)
        )
    unknown = result.unknown_statuses
    if unknown:
        parts = ", ".join(
            f"{transport}/{channel} {raw!r} x{count}"
            for (transport, channel, raw), count in unknown.most_common(10)
        )
        stderr.print(
            f"note: {sum(unknown.values())} raw statuses were not recognized and counted as"
            f" unknown: {parts}",
            markup=False,
        )
    reports = [r.to_json() for r in result.reports]
    if json_output:
        _dump(reports)
        return
    _render_replay(reports, result.reports)


_REPLAY_ROWS = (
    ("notices", "notices"),
    ("accepted", "accepted"),
    ("accepted on the primary", "accepted_primary"),
    ("escalated", "escalated"),
    ("expired", "expired"),
    ("failed", "failed"),
    ("both channels sent", "both_channels"),
    ("fallback, then late primary success", "late_primary_after_fallback"),
    ("status reads", "status_reads"),
    ("status reads per notice", "status_reads_per_notice"),
    ("would have paged", "would_page"),
)


def _seconds(value: float | None) -> str:
    from resetctl.config import format_duration

    return "-" if value is None else format_duration(value)


def _with_range(report: dict[str, Any], key: str, value: Any) -> str:
    low, high = report["range"].get(key, (value, value))
    return str(value) if low == high else f"{value} ({low} to {high})"


def _render_replay(reports: list[dict[str, Any]], raw: list[Any]) -> None:
    table = Table(
        "",
        *(r["policy"] for r in reports),
        title="replay: point estimate (range from optimistic to pessimistic)",
        title_justify="left",
    )
    for label, key in _REPLAY_ROWS:
        table.add_row(label, *(_with_range(r, key, r[key]) for r in reports))
    for channel in ("email", "sms"):
        table.add_row(
            f"{channel} messages sent",
            *(
                _with_range(r, f"messages_sent.{channel}", r["messages_sent"][channel])
                for r in reports
            ),
        )
    for channel in ("email", "sms"):
        table.add_row(
            f"{channel} timelines borrowed (never observed)",
            *(str(r["borrowed"][channel]) for r in reports),
        )
    for label, key, stat in (
        ("remaining at fallback p50", "remaining_at_fallback", "p50"),
        ("remaining at fallback p95", "remaining_at_fallback", "p95"),
        ("remaining at fallback min", "remaining_at_fallback", "min"),
        ("time to acceptance p50", "time_to_acceptance", "p50"),
        ("time to acceptance p95", "time_to_acceptance", "p95"),
    ):
        table.add_row(label, *(_seconds(r[key][stat]) for r in reports))
    table.add_row("queue delay p95", *(_seconds(r["queue_delay_p95"]) for r in reports))
    _print_table(table)
    for title, attribute in (
        ("remaining lifetime when the fallback was sent", "remaining_at_fallback"),
        ("time to acceptance", "time_to_acceptance"),
    ):
        samples = [list(getattr(report.stats, attribute)) for report in raw]
        _histograms(title, [r["policy"] for r in reports], samples)


def _histograms(title: str, labels: list[str], samples: list[list[float]], bins: int = 8) -> None:
    """One text histogram per policy, on shared bins so they compare at a glance."""
    top = max((max(s) for s in samples if s), default=0.0)
    if top <= 0:
        return
    width = top / bins
    stdout.print(f"\n[bold]{escape(title)}[/bold]", markup=True)
    for label, values in zip(labels, samples, strict=True):
        counts = [0] * bins
        for value in values:
            counts[min(bins - 1, int(value / width))] += 1
        peak = max(counts) or 1
        stdout.print(f"  {label}", markup=False)
        for index, count in enumerate(counts):
            low, high = _seconds(index * width), _seconds((index + 1) * width)
            bar = "█" * round(30 * count / peak)
            stdout.print(f"    {low:>6} to {high:<6} {bar} {count}", markup=False)


def _non_negative_duration(value: str, where: str) -> float:
    return 0.0 if value.strip() in ("0", "0s", "0ms") else parse_duration(value, where)


class _ProgressLines:
    """A trace file read in two passes (fit, then simulate), advancing a progress bar."""

    def __init__(self, handle: Any, progress: Any, task: Any) -> None:
        self.handle, self.progress, self.task = handle, progress, task

    def __iter__(self) -> Iterator[str]:
        self.handle.seek(0)
        self.progress.reset(self.task)
        for line in self.handle:
            self.progress.advance(self.task, len(line))
            yield line


def _replay_with_progress(
    replaying: Any, handle: Any, path: Path, candidates: list[Any], options: Any, seed: int
) -> Any:
    if not sys.stderr.isatty():
        return replaying.replay(handle, candidates, options, seed=seed)
    from rich.progress import Progress

    total = path.stat().st_size
    with Progress(console=stderr, transient=True) as progress:
        task = progress.add_task("replaying", total=total)
        lines = _ProgressLines(handle, progress, task)
        return replaying.replay(lines, candidates, options, seed=seed)


@observe_app.command("twilio")
def observe_twilio(
    url: Annotated[str, typer.Option("--url", help="The full URL Twilio posted to.")],
    signature: Annotated[
        str, typer.Option("--signature", help="The X-Twilio-Signature header value.")
    ],
    idempotency_token: Annotated[
        str | None,
        typer.Option(
            "--idempotency-token",
            help="Accepted and ignored (older scripts pass I-Twilio-Idempotency-Token):"
            " Twilio does not sign it, so a replay is told by the signed URL and body.",
        ),
    ] = None,
    json_output: JsonOption = False,
    db: DbOption = None,
    config: ConfigOption = None,
) -> None:
    """Verify and record a Twilio status callback read from standard input.

    The form body (MessageSid, MessageStatus, ...) comes on stdin; the signature is
    checked with TWILIO_AUTH_TOKEN (environment or [twilio] credentials_file) before
    anything is recorded. A forged callback exits 2 and records nothing. The message is
    matched by MessageSid, or by the attempt key resetctl put in the callback URL (an
    attempt whose submission reply was lost). A replayed callback (the same signed URL
    and body, whatever its --idempotency-token) exits 0 and is stored once. A status
    Twilio does not document is recorded as unknown:<length>, never as posted.

    Example:

        resetctl observe twilio --url https://hooks.example/twilio \\
            --signature "$HTTP_X_TWILIO_SIGNATURE" < body
    """
    body = sys.stdin.read()
    with _handle(db, config, must_exist=True) as handle:
        result = _run(
            lambda: handle.observe(
                "twilio",
                body=body,
                url=url,
                signature=signature,
                idempotency_token=idempotency_token,
            )
        )
    if json_output:
        shape = dataclasses.asdict(result)
        del shape["raw_status"]  # the --json shape scripts already read; the text shows it
        stdout.out(json.dumps(shape), highlight=False)
        return
    stdout.print(
        f"{result.notice_id}: {result.channel} {result.raw_status!r} → {result.status};"
        f" {result.old_phase} → {result.new_phase}",
        markup=False,
    )


@app.command("serve-callbacks")
def serve_callbacks(
    bind: Annotated[
        str, typer.Option("--bind", help="host:port to listen on; a reverse proxy fronts it.")
    ] = "127.0.0.1:8080",
    public_url: Annotated[
        str | None,
        typer.Option(
            "--public-url",
            help="The URL Twilio was given [default: [twilio] status_callback].",
        ),
    ] = None,
    trust_forwarded: Annotated[
        bool,
        typer.Option(
            "--trust-forwarded",
            help="Take scheme and host from X-Forwarded-Proto/-Host (only behind a proxy).",
        ),
    ] = False,
    threads: Annotated[int, typer.Option(min=1, help="Worker threads.")] = 4,
    db: DbOption = None,
    config: ConfigOption = None,
) -> None:
    """Serve Twilio's status callbacks over HTTP (waitress), as observe twilio records them.

    Answers 204 when recorded (a replay is stored once), 403 for a bad signature, 400
    for a malformed body, 503 when the database is unavailable (Twilio retries). The
    signature is checked against the public URL plus the request's query string.
    Needs the web extra: pip install 'resetctl[web]'. SIGTERM stops it.

    Example:

        resetctl serve-callbacks --bind 127.0.0.1:8080 --public-url https://hooks.example/twilio
    """
    try:
        import waitress
    except ImportError:
        stderr.print("error: serve-callbacks needs waitress: pip install 'resetctl[web]'")
        raise typer.Exit(2) from None
    from resetctl.web import twilio_callbacks

    host, _, port_text = bind.rpartition(":")
    host = host.removeprefix("[").removesuffix("]")
    if not host or not port_text.isdigit() or int(port_text) > 65535:
        raise _fail(ConfigError("--bind: expected host:port, e.g. 127.0.0.1:8080"))
    # A callback waits at most this long for a sweep's write lock, then gets a 503 (Twilio
    # gives up on a webhook after 15 s and would not know to retry).
    with _handle(db, config, must_exist=True, busy_timeout=CALLBACK_BUSY_TIMEOUT) as handle:
        application = _run(
            lambda: twilio_callbacks(handle, public_url, trust_forwarded=trust_forwarded)
        )
        try:
            server = waitress.create_server(
                application,
                host=host,
                port=int(port_text),
                threads=threads,
                # Forwarded headers reach the application only when it is told to trust
                # them; it reads them itself, the same way under Flask or Django.
                clear_untrusted_proxy_headers=not trust_forwarded,
            )
        except OSError as exc:
            raise _fail(ResetctlError(f"--bind {bind}: cannot listen ({exc.strerror})")) from None
        # One socket, or several when the host name resolves to more than one address.
        sockets = getattr(server, "effective_listen", None) or [
            (server.effective_host, server.effective_port)
        ]
        where = " ".join(
            f"http://{h}:{p}" if ":" not in h else f"http://[{h}]:{p}" for h, p in sockets
        )
        stderr.print(f"serving Twilio callbacks on {where}", markup=False)

        def stop(*_: object) -> None:
            raise SystemExit(0)  # waitress's loop closes its sockets and threads on it

        previous = signal.signal(signal.SIGTERM, stop)
        try:
            server.run()
        finally:
            signal.signal(signal.SIGTERM, previous)


@app.command()
def health(
    window: Annotated[str, typer.Option(help="How far back to count, e.g. 5m, 1h, 30d.")] = "5m",
    show_storage: Annotated[
        bool, typer.Option("--storage", help="Measured bytes per event and projected size.")
    ] = False,
    retention: Annotated[
        str, typer.Option(help="Retention period for the --storage projection.")
    ] = "30d",
    json_output: JsonOption = False,
    db: DbOption = None,
    config: ConfigOption = None,
) -> None:
    """Population numbers: phases, sweep lag, outcomes, escalations, races. No rows.

    Example:

        resetctl health --window 1h --json
    """
    try:
        seconds = parse_duration(window, "--window")
        keep = parse_duration(retention, "--retention")
    except ConfigError as exc:
        raise _fail(exc) from None
    with _handle(db, config, must_exist=True) as handle:
        report = handle.health(seconds, storage=show_storage, retention=keep)
    if json_output:
        _dump(report)
        return
    table = Table("", f"last {window}", title="resetctl health", title_justify="left")

    def flat(value: Any) -> str:
        if isinstance(value, dict):
            return ", ".join(f"{k} {flat(v)}" for k, v in value.items()) or "-"
        return str(value)

    for key, value in report.items():
        table.add_row(key.replace("_", " "), flat(value))
    _print_table(table)


@app.command()
def alerts(
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
    code; their critical alerts are recorded once as would_page events.

    Example:

        resetctl alerts --json > /var/lib/resetctl/alerts.json
    """
    from resetctl import ops
    from resetctl.config import format_duration

    now = time.time()

    def unknown(exc: Exception) -> typer.Exit:
        message = str(exc) if isinstance(exc, ResetctlError) else type(exc).__name__
        if json_output:
            data: dict[str, Any] = {"at": iso(now), "status": "unknown", "error": message}
            data["alerts"] = []
            stdout.out(json.dumps(data), highlight=False)
        else:
            stdout.print(f"UNKNOWN: {message}")
        return typer.Exit(int(ops.AlertLevel.UNKNOWN))

    try:
        with _opened(db, config, must_exist=True, on_error=unknown) as (store, settings):
            stalled_after = settings.default_policy.alert_stalled_after
            report = ops.alerts(store, now, stalled_after)
    except typer.Exit:
        raise
    except Exception as exc:  # a monitoring check answers UNKNOWN, never a traceback
        raise unknown(exc) from None
    if json_output:
        # One line: a crontab appends each run to a log, and "at" dates it.
        stdout.out(json.dumps(report.to_json()), highlight=False)
        raise typer.Exit(int(report.level))
    items = len(report.notices) + report.ended_total + (report.stalled is not None)
    if not items:
        stdout.print("OK: no notice at risk, sweeps running")
    else:
        stdout.print(f"{report.level.name}: {items} alert(s)")
    if report.stalled is not None:
        stalled = report.stalled
        ago = stalled.seconds_since_last_sweep
        last = "never" if ago is None else f"{format_duration(ago)} ago"
        stdout.print(
            f"  critical {ops.SWEEP_STALLED}: {stalled.live_notices} live notice(s),"
            f" last sweep {last}"
        )
    for alert in report.notices:
        needed = "-" if alert.needed_seconds is None else format_duration(alert.needed_seconds)
        past_help = "" if alert.actionable else " (past help)"
        stdout.print(
            f"  {alert.level.name.lower():<8} {ops.DEADLINE_AT_RISK}{past_help}"
            f" {alert.notice_id} {alert.region} {alert.phase}"
            f" next {alert.next_action}{' ' + alert.channel if alert.channel else ''}"
            f" remaining {format_duration(alert.remaining_seconds)} needs {needed}"
            f" in state {format_duration(alert.state_age_seconds)} [{alert.mode}]"
        )
    for ended in report.ended:
        stdout.print(
            f"  warning  {ops.ENDED_WITHOUT_SUCCESS} {ended.notice_id} {ended.region}"
            f" {ended.phase} ({ended.reason}) at {iso(ended.ended_at)} [{ended.mode}]"
        )
    if report.ended_total > len(report.ended):
        stdout.print(f"  … and {report.ended_total - len(report.ended)} more ended")
    raise typer.Exit(int(report.level))


@app.command()
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
    from resetctl import ops

    with _opened(db, config, must_exist=True) as (store, settings):
        configured = [(p.name, p.version) for p in settings.policies.values()]
        try:
            ops.write_metrics(store, textfile, time.time(), configured)
        except OSError as exc:
            raise _fail(ResetctlError(f"--textfile: cannot write ({exc.strerror})")) from None


@app.command()
def purge(
    older_than: Annotated[
        str, typer.Option(help="Delete notices that finished longer ago than this.")
    ] = "30d",
    batch_size: Annotated[int, typer.Option(min=1, help="Notices per short transaction.")] = 500,
    json_output: JsonOption = False,
    db: DbOption = None,
    config: ConfigOption = None,
) -> None:
    """Delete old finished notices in short batches, keeping daily aggregate counts.

    Safe while sweeps run: live notices are never touched, and each batch is a short
    transaction.

    Example:

        resetctl purge --older-than 30d
    """
    from resetctl import ops

    try:
        seconds = parse_duration(older_than, "--older-than")
    except ConfigError as exc:
        raise _fail(exc) from None
    now = time.time()
    with _opened(db, config, must_exist=True) as (store, _):
        deleted = ops.purge(store, seconds, now, batch_size)
    if json_output:
        stdout.out(json.dumps({"at": iso(now), "deleted": deleted}), highlight=False)
    else:
        stdout.print(f"deleted {deleted} finished notice(s)")


@db_app.command("copy")
def db_copy(
    to: Annotated[
        str,
        typer.Option(
            "--to",
            help="The empty PostgreSQL database: a postgresql:// URI (password from"
            " PGPASSWORD, ~/.pgpass or PGSERVICE).",
        ),
    ],
    json_output: JsonOption = False,
    db: DbOption = None,
    config: ConfigOption = None,
) -> None:
    """Copy a SQLite database into an empty PostgreSQL one and verify the row counts.

    Live notices arrive with their leases cleared (due at once), with their history, the
    outbox, daily aggregates, policies and the salt. A target that holds anything is
    refused. Stop the sweeps first; see README "Scaling out" for the cut-over.

    Example:

        resetctl db copy --db resetctl.db --to postgresql://resetctl@db1/resetctl
    """
    from resetctl.store import copy_database

    if not is_postgres(to):
        raise _fail(InputError([f"--to {to}: expected a postgresql:// URI"]))
    with _opened(db, config, must_exist=True) as (store, _):
        copied = _run(lambda: copy_database(store, to, time.time()))
    if json_output:
        stdout.out(json.dumps({"copied": copied}), highlight=False)
    else:
        for table, count in copied.items():
            stdout.print(f"{table:<16} {count:>10}", markup=False)
        stdout.print("copied and verified", markup=False)


@app.command()
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
    from resetctl.demo import run_demo

    path = db or str(Path(tempfile.mkdtemp(prefix="resetctl-demo-")) / "demo.db")
    if db is not None and (is_postgres(db) or Path(db).exists()):
        try:
            # An empty server database gets the schema; a file must already be one.
            with open_store(db, must_exist=not is_postgres(db)) as existing:
                notices = sum(existing.phase_counts().values())
        except ResetctlError as exc:
            raise _fail(exc) from None
        if notices:
            raise _fail(
                InputError(
                    [
                        f"--db {db}: holds {notices} notice(s); the demo runs a simulated clock"
                        " and only on a new or empty database"
                    ]
                )
            )
    logging.getLogger("resetctl").setLevel(logging.WARNING)  # it prints transitions itself
    # The simulated run ends about now, so `inspect` afterwards reads sensible ages.
    start = time.time() - 180
    labels: dict[str, str] = {}

    def show(event: TransitionEvent) -> None:
        offset = event.at - start
        change = (
            event.new_phase
            if event.old_phase == event.new_phase
            else f"{event.old_phase} → {event.new_phase}"
        )
        detail = " ".join(x for x in (event.channel, event.status) if x)
        clock = f"+{int(offset) // 60:02d}:{int(offset) % 60:02d}"
        label = labels.get(event.notice_id, "")[:44]
        stdout.print(
            f"{clock}  {label:<44}  {event.kind:<8} {detail:<16} {change}",
            markup=False,
        )

    try:
        with open_store(path) as store:
            ids = run_demo(store, start, show, labels.__setitem__)
            stdout.print()
            for notice_id in ids:
                report = notice_report(store, notice_id, time.time())
                stdout.print(f"{notice_id}  {report['phase']:<9} {labels[notice_id]}", markup=False)
    except ResetctlError as exc:
        raise _fail(exc) from None
    stdout.print(f"\ndatabase: {path}\ntry: resetctl inspect --db {path} {ids[1]}", markup=False)
