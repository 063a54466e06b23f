"""The ``resetctl`` command line: parse options, make one call, render the result.

Domain errors become exit codes here and nowhere else: 0 ok, 1 runtime failure (unknown
notice, unusable database), 2 bad input or configuration (nothing written).
"""

from __future__ import annotations

import json
import logging
import os
import sys
import tempfile
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Annotated, Any, TypeVar

import typer
from rich.console import Console
from rich.table import Table

from resetctl.config import Settings, load_settings, parse_duration
from resetctl.errors import ConfigError, InputError, NoticeNotFound, ResetctlError
from resetctl.machine import Status
from resetctl.report import iso, notice_report
from resetctl.store import Store
from resetctl.telemetry import TransitionEvent

app = typer.Typer(
    help="Deliver password-reset notices by email and SMS before the link dies.",
    no_args_is_help=True,
    add_completion=False,
    pretty_exceptions_enable=False,
)
outbox_app = typer.Typer(
    help="The embedded outbox transport: list, show and script messages.",
    no_args_is_help=True,
)
app.add_typer(outbox_app, name="outbox")

stdout = Console(highlight=False, soft_wrap=True, emoji=False)
stderr = Console(stderr=True, highlight=False, soft_wrap=True, emoji=False)

DbOption = Annotated[
    Path | None,
    typer.Option("--db", envvar="RESETCTL_DB", help="SQLite file [default: ./resetctl.db]."),
]
ConfigOption = Annotated[
    Path | None,
    typer.Option("--config", envvar="RESETCTL_CONFIG", help="TOML settings and policies."),
]
JsonOption = Annotated[bool, typer.Option("--json", help="Machine-readable output.")]

T = TypeVar("T")


def main() -> None:
    """Console-script entry point."""
    level = os.environ.get("RESETCTL_LOG_LEVEL", "WARNING").upper()
    logging.basicConfig(
        level=getattr(logging, level, logging.WARNING),
        format="%(asctime)s %(levelname)s %(name)s %(message)s",
        stream=sys.stderr,
    )
    app()


def _fail(exc: ResetctlError) -> typer.Exit:
    problems = exc.problems if isinstance(exc, InputError) else [str(exc)]
    for problem in problems:
        stderr.print(f"error: {problem}", markup=False)
    return typer.Exit(exc.exit_code)


@contextmanager
def _opened(db: Path | None, config: Path | None) -> Iterator[tuple[Store, Settings]]:
    """Settings and store for one command; domain errors become exit codes."""
    try:
        settings = load_settings(config)
        path = db or Path(settings.db or "resetctl.db")
        with Store(path) as store:
            yield store, settings
    except ResetctlError as exc:
        raise _fail(exc) from None


def _run(call: Callable[[], T]) -> T:
    try:
        return call()
    except ResetctlError as exc:
        raise _fail(exc) from None


def _dump(data: Any) -> None:
    stdout.out(json.dumps(data, indent=2, sort_keys=False), highlight=False)


@app.command()
def enqueue(
    input_file: Annotated[
        Path | None,
        typer.Option("--input", help="JSON Lines file [default: standard input]."),
    ] = None,
    db: DbOption = None,
    config: ConfigOption = None,
) -> None:
    """Record reset notices from JSON Lines, all or none.

    One JSON object per line: idempotency_key (required), reset_url (https, required),
    email and/or phone (E.164), region, account_ref, display_name, and expires_at
    (ISO 8601 with offset) or ttl ("10m", "90s", seconds). Prints one JSON line per
    notice. Any invalid line: every problem listed by line, exit 2, nothing written.

    Example:

        resetctl enqueue --input requests.jsonl

    where each line looks like
    {"idempotency_key": "r-1", "email": "a@example.com", "reset_url": "https://x.example/r/a"}
    """
    from resetctl.enqueue import enqueue_lines

    with _opened(db, config) as (store, settings):
        try:
            if input_file is None:
                lines = sys.stdin.read().splitlines()
            else:
                lines = input_file.read_text(encoding="utf-8").splitlines()
        except (OSError, UnicodeDecodeError) as exc:
            stderr.print(f"error: cannot read input: {type(exc).__name__}", markup=False)
            raise typer.Exit(2) from None
        results = _run(lambda: enqueue_lines(store, settings, lines, time.time()))
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
    from resetctl.sweep import Sweeper, SweepOptions, default_worker_id, failpoints_from_env
    from resetctl.transports import build_transports

    with _opened(db, config) as (store, settings):
        policy = settings.default_policy
        try:
            runtime = (
                0.0
                if max_runtime.strip() in ("0", "0s")
                else parse_duration(max_runtime, "--max-runtime")
            )
            options = SweepOptions(
                worker_id=worker_id or default_worker_id(),
                batch_size=batch_size or policy.batch_size,
                lease=parse_duration(lease, "--lease") if lease else policy.lease,
                max_runtime=runtime,
            )
        except ConfigError as exc:
            raise _fail(exc) from None
        transports = _run(lambda: build_transports(settings, store, time.time))
        sweeper = Sweeper(store, settings, transports, failpoints=failpoints_from_env(os.environ))
        summary = _run(lambda: sweeper.run(options))
    if json_output:
        stdout.out(json.dumps(summary.to_json()), highlight=False)
        return
    stdout.print(
        f"claimed {summary.claimed}, submitted {summary.submitted}, polled {summary.polled}, "
        f"escalated {summary.escalated}, accepted {summary.accepted}, expired {summary.expired}, "
        f"failed {summary.failed}, errors {summary.errors} in {summary.duration:.2f}s"
    )


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

        resetctl inspect ntc_3f2a9c0d1e4b5a67 --json
    """
    with _opened(db, config) as (store, _):
        report = _run(lambda: notice_report(store, notice_id, time.time()))
    if json_output:
        _dump(report)
        return
    _render_report(report)


def _render_report(report: dict[str, Any]) -> None:
    from resetctl.config import format_duration

    stdout.print(
        f"[bold]{report['notice_id']}[/bold]  phase [bold]{report['phase']}[/bold]"
        + (f" ({report['reason']})" if report["reason"] else "")
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
    with _opened(db, config) as (store, _):
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
    stdout.print(table)


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

        resetctl outbox show obx_0123456789abcdef --json
    """
    with _opened(db, config) as (store, _):
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


@outbox_app.command("set-status")
def outbox_set_status(
    message_id: Annotated[str, typer.Argument(help="An outbox message id.")],
    status: Annotated[str, typer.Argument(help="pending, accepted, delivered, failed or unknown.")],
    db: DbOption = None,
    config: ConfigOption = None,
) -> None:
    """Script the status the next poll of an outbox message will read.

    Example:

        resetctl outbox set-status obx_0123456789abcdef failed
    """
    if status not in {s.value for s in Status}:
        stderr.print(f"error: status: must be one of {', '.join(s.value for s in Status)}")
        raise typer.Exit(2)
    with _opened(db, config) as (store, _):
        found = store.outbox_set_status(message_id, status, time.time())
    if not found:
        raise _fail(NoticeNotFound(f"no outbox message {message_id!r}"))
    stdout.print(f"{message_id}: {status}")


@app.command()
def demo(
    db: Annotated[
        Path | None,
        typer.Option("--db", help="Where to keep the demo database [default: a temp dir]."),
    ] = None,
) -> None:
    """Enqueue sample notices and sweep them through a simulated clock on the outbox.

    Prints every transition; afterwards, inspect any notice with the printed command.

    Example:

        resetctl demo
    """
    from resetctl.demo import run_demo

    path = db or Path(tempfile.mkdtemp(prefix="resetctl-demo-")) / "demo.db"
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
        with Store(path) as store:
            ids = run_demo(store, start, show, labels.__setitem__)
            stdout.print()
            for notice_id in ids:
                report = notice_report(store, notice_id, time.time())
                stdout.print(f"{notice_id}  {report['phase']:<9} {labels[notice_id]}", markup=False)
    except ResetctlError as exc:
        raise _fail(exc) from None
    stdout.print(f"\ndatabase: {path}\ntry: resetctl inspect --db {path} {ids[1]}", markup=False)
