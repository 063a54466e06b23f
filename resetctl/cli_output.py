"""What the command line prints: each command's result as text (Rich) or JSON.

Not the reset copy (that is ``render.py``): here are the shapes an operator reads at a
terminal or a script parses. Nothing here decides anything; every function takes what
the API returned.
"""

from __future__ import annotations

import dataclasses
import json
import shlex
import sys
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from contextlib import contextmanager
from pathlib import Path
from typing import TYPE_CHECKING, Any

from rich.console import Console
from rich.markup import escape

from resetctl.durations import format_duration
from resetctl.errors import UNSHOWABLE, ResetctlError
from resetctl.files import PRIVATE_FILE, write_atomically
from resetctl.summary import iso

if TYPE_CHECKING:
    from rich.table import Table

    from resetctl.api import (
        AlertsReport,
        CallbackResult,
        CancelResult,
        EnqueueResult,
        InitializedDatabase,
        Preview,
        ReplayResult,
        SweepSummary,
        TemplatesReport,
        TransitionEvent,
    )

# markup=False: messages carry literal brackets ("[outbox]", "[policy.*]") and user text
# (regions); the few styled lines ask for markup and escape what they interpolate.
stdout = Console(highlight=False, soft_wrap=True, emoji=False, markup=False)
stderr = Console(stderr=True, highlight=False, soft_wrap=True, emoji=False, markup=False)


def shown(text: str) -> str:
    """Free text (a region, an account) as printable: enqueue refuses these characters
    now, but a row written before it may hold them, and a terminal must not run them."""
    return UNSHOWABLE.sub(lambda m: f"\\u{ord(m.group()):04x}", text)


def print_table(table: Table) -> None:
    """A table at the terminal's width; piped, as wide as it needs (never an id cut)."""
    if stdout.is_terminal:
        stdout.print(table)
        return
    # print(width=…) is capped at the console's width: a wide console of its own.
    Console(file=sys.stdout, width=10_000, highlight=False, emoji=False, markup=False).print(table)


def dump(data: Any) -> None:
    """Indented JSON (the --json of commands a person reads too)."""
    stdout.out(json.dumps(data, indent=2, sort_keys=False), highlight=False)


def json_line(data: Any) -> None:
    """One line of JSON (the --json of commands whose runs a log appends)."""
    stdout.out(json.dumps(data), highlight=False)


def enqueued(results: Iterable[EnqueueResult]) -> None:
    """One JSON line per notice."""
    for result in results:
        json_line(result.to_json())


def swept(summary: SweepSummary, now: float, as_json: bool) -> None:
    """The sweep's one summary line."""
    stdout.out(summary.line(now, as_json), highlight=False)


def relative(seconds: float) -> str:
    """An instant ``seconds`` from now, as on-call reads it: ``in 2m``, ``6m5s ago``,
    ``now`` (never ``in -6m5s``: an overdue action or a passed deadline is in the past)."""
    if abs(seconds) < 1:
        return "now"
    if seconds > 0:
        return f"in {format_duration(seconds)}"
    return f"{format_duration(-seconds)} ago"


def notice(report: dict[str, Any]) -> None:
    """``inspect``: phase, timing, next action, budget, lease, attempts, history."""
    stdout.print(
        f"[bold]{escape(report['notice_id'])}[/bold]  phase [bold]{escape(report['phase'])}[/bold]"
        + (f" ({escape(report['reason'])})" if report["reason"] else ""),
        markup=True,
    )
    stdout.print(
        f"region {shown(report['region'])} · policy {report['policy']}"
        f" v{report['policy_version']}"
        f" · channels {' → '.join(report['channels'])}"
    )
    if report["account_ref"] is not None:
        stdout.print(f"account {shown(report['account_ref'])}")
    if report["consent"] is not None:
        stdout.print(f"consent given: {', '.join(report['consent']) or 'none'}")
    for channel, why in report["skipped"].items():
        stdout.print(f"skipped {channel}: {why}")
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
            f" ({relative(action['due_in_seconds'])}, {action['reason']})"
        )
    else:
        stdout.print("next: nothing (terminal)")
    budget = report["action_budget"]
    if budget["fallback_channel"]:
        left = relative(budget["seconds_to_fallback_deadline"])
        can = "still possible" if budget["fallback_possible"] else "not possible"
        stdout.print(
            f"fallback {budget['fallback_channel']}: {can}; deadline"
            f" {budget['fallback_deadline']} ({left})"
            + (" · AT RISK" if budget["at_risk"] else ""),
            markup=False,
        )
    success = ", ".join(f"{c} {'/'.join(s)}" for c, s in budget["success_statuses"].items())
    stdout.print(f"success means: {success}", markup=False)
    senders = "; ".join(f"{c} {sender_text(s)}" for c, s in report["senders"].items())
    stdout.print(f"senders: {senders}", markup=False)
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
        stdout.print(f"        from {sender_text(a['sender'])}", markup=False)
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
        # A skip, or a shadow notice's would-send, names its channel: no attempt says it.
        named = h["channel"] if h["kind"] in ("skipped", "shadow") else None
        extra = " ".join(x for x in (named, h["status"], h["reason"] and f"({h['reason']})") if x)
        if h["lane_wait_seconds"]:
            extra += f" waited {format_duration(h['lane_wait_seconds'])} for its lane"
        stdout.print(
            f"  {h['at']}  {h['kind']:<15} {change}  {extra}  [{h['worker']}]", markup=False
        )


def sender_text(sender: Mapping[str, str]) -> str:
    """A sender as inspect names it: ``Shop EU <reset@eu.shop.example>, reply-to …``,
    ``messaging service MG…``, or the transport's own setting; how it is known, when
    said (``recorded``, ``policy``)."""
    parts = []
    if sender.get("from"):
        name, address = sender.get("from_name"), sender["from"]
        parts.append(f"{name} <{address}>" if name else address)
    if sender.get("service"):
        parts.append(f"messaging service {sender['service']}")
    if sender.get("reply_to"):
        parts.append(f"reply-to {sender['reply_to']}")
    text = ", ".join(parts) or "the transport's own setting"
    source = sender.get("source")
    return shown(text if source in (None, "transport") else f"{text} ({source})")


def cancelled(result: CancelResult, as_json: bool) -> None:
    """``cancel``: what became of the notice."""
    if as_json:
        json_line(result.to_json())
    elif result.cancelled:
        stdout.print(f"{result.notice_id} cancelled ({result.reason}); it was {result.was}")
    else:
        stdout.print(
            f"{result.notice_id} had already ended: {result.phase}"
            + (f" ({result.reason})" if result.reason else "")
            + "; nothing changed"
        )


def notice_list(rows: list[dict[str, Any]]) -> None:
    """``list``: one row per notice, newest first."""
    from rich.table import Table

    if not rows:
        stdout.print("no notices match")
        return
    table = Table(box=None, pad_edge=False)
    for column in ("notice", "phase", "reason", "region", "account", "created", "expires", "risk"):
        table.add_column(column, no_wrap=True)
    for row in rows:
        table.add_row(
            row["notice_id"],
            row["phase"],
            row["reason"] or "",
            shown(row["region"]),
            shown(row["account_ref"] or ""),
            row["created_at"],
            row["expires_at"],
            "" if row["level"] == "ok" else row["level"],
        )
    print_table(table)


def outbox_list(rows: list[dict[str, Any]]) -> None:
    """``outbox list``: one row per message, no content."""
    from rich.table import Table

    table = Table("message id", "notice", "channel", "status", "submitted")
    for row in rows:
        table.add_row(
            row["message_id"], row["notice_id"], row["channel"], row["status"], row["submitted_at"]
        )
    print_table(table)


def outbox_message(row: dict[str, Any]) -> None:
    """``outbox show``: the headers, then each rendered body, as a mail catcher shows it."""
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


def outbox_status_set(message_id: str, status: str) -> None:
    """``outbox set-status``: the message and the status its next poll reads."""
    stdout.print(f"{message_id}: {status}")


def templates_copied(directory: Path, versions: Iterable[str]) -> None:
    """``templates init``: each version's new directory, then the setting to add."""
    for version in versions:
        stdout.print(f"{directory / version}", markup=False)
    stdout.print(f'now set in your config:\n[templates]\ndir = "{directory}"', markup=False)


def templates_report(report: TemplatesReport, missing_db: str | None) -> None:
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
        for warning in copy.warnings:
            stdout.print(f"  warning: {warning}", markup=False)
        for sms in copy.sms:
            plural = "" if sms.segments == 1 else "s"
            dropped = "" if sms.name_kept or sms.sample == "no display name" else ", name dropped"
            stdout.print(
                f"  sms, {sms.sample}: {sms.encoding}, {sms.segments} segment{plural}{dropped}",
                markup=False,
            )


def template_preview(result: Preview) -> None:
    """``templates preview``: the copy rendered, the files written, the SMS's size."""
    used = (
        f"{result.version}/{result.locale}" if result.locale else f"{result.version} (default copy)"
    )
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


def traces(records: Sequence[Mapping[str, Any]], output: Path | None) -> None:
    """``export-timings``: compact JSON Lines on stdout, or into ``output`` whole (a new
    0600 file of its own beside it, renamed over it: a reader never sees half a file, and
    nothing planted beside it is written through) with a count on stderr."""
    lines = [json.dumps(record, separators=(",", ":")) + "\n" for record in records]
    if output is None:
        sys.stdout.writelines(lines)
        return
    try:
        write_atomically(output, "".join(lines).encode("utf-8"), PRIVATE_FILE)
    except OSError as exc:
        raise ResetctlError(f"--output: cannot write {output} ({exc.strerror})") from None
    stderr.print(f"{len(lines) - 1} traces written to {output}", markup=False)


@contextmanager
def replay_progress() -> Iterator[Callable[[int, int], None] | None]:
    """A transient progress bar on a terminal's stderr (None when piped)."""
    if not sys.stderr.isatty():
        yield None
        return
    from rich.progress import Progress

    with Progress(console=stderr, transient=True) as progress:
        task = progress.add_task("replaying", total=None)

        def advance(read: int, total: int) -> None:
            if read == 0:
                progress.reset(task, total=total)
            else:
                progress.update(task, completed=read)

        yield advance


def replay_unknown_statuses(result: ReplayResult) -> None:
    """A note on stderr naming the raw statuses no transport recognized."""
    unknown = result.unknown_statuses
    if not unknown:
        return
    parts = ", ".join(
        f"{transport}/{channel} {raw!r} x{count}"
        for (transport, channel, raw), count in unknown.most_common(10)
    )
    stderr.print(
        f"note: {sum(unknown.values())} raw statuses were not recognized and counted as"
        f" unknown: {parts}",
        markup=False,
    )


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
    ("cancelled", "cancelled"),
    ("fallback sent before completion", "fallback_before_completion"),
    ("  of which wasted (the primary had succeeded)", "fallback_wasted"),
    ("fallback avoided (due after completion)", "fallback_avoided_by_completion"),
)


def _seconds(value: float | None) -> str:
    return "-" if value is None else format_duration(value)


def _with_range(report: dict[str, Any], key: str, value: Any) -> str:
    low, high = report["range"].get(key, (value, value))
    return str(value) if low == high else f"{value} ({low} to {high})"


def replay(result: ReplayResult) -> None:
    """The comparison table (point estimate, with its range), then the histograms."""
    from rich.table import Table

    reports = [r.to_json() for r in result.reports]
    table = Table(
        "",
        *(r["policy"] for r in reports),
        title="replay: point estimate (range from optimistic to pessimistic)",
        title_justify="left",
    )
    for label, key in _REPLAY_ROWS:
        table.add_row(label, *(_with_range(r, key, r[key]) for r in reports))
        if key != "cancelled" or not reports:
            continue
        for word in reports[0]["cancelled_by_reason"]:
            table.add_row(
                f"  {word}",
                *(
                    _with_range(r, f"cancelled_by_reason.{word}", r["cancelled_by_reason"][word])
                    for r in reports
                ),
            )
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
    print_table(table)
    for title, attribute in (
        ("remaining lifetime when the fallback was sent", "remaining_at_fallback"),
        ("time to acceptance", "time_to_acceptance"),
    ):
        samples = [list(getattr(report.stats, attribute)) for report in result.reports]
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


def callback(result: CallbackResult | None, as_json: bool) -> None:
    """``observe``: what the callback said and the phase change it made."""
    if result is None:
        if as_json:
            json_line({"recorded": False})
        else:
            stdout.print("verified; it reports nothing resetctl records", markup=False)
        return
    if as_json:
        shape = dataclasses.asdict(result)
        del shape["raw_status"]  # the --json shape scripts already read; the text shows it
        json_line(shape)
        return
    stdout.print(
        f"{result.notice_id}: {result.channel} {result.raw_status!r} → {result.status};"
        f" {result.old_phase} → {result.new_phase}",
        markup=False,
    )


def serving(sockets: Iterable[tuple[str, int]], what: str = "Twilio callbacks") -> None:
    """``serve-callbacks`` and ``serve``: where it listens, on stderr."""
    where = " ".join(f"http://{h}:{p}" if ":" not in h else f"http://[{h}]:{p}" for h, p in sockets)
    stderr.print(f"serving {what} on {where}", markup=False)


def health(report: dict[str, Any], window: str) -> None:
    """``health``: one row per figure over the window."""
    from rich.table import Table

    table = Table("", f"last {window}", title="resetctl health", title_justify="left")

    def flat(value: Any) -> str:
        if isinstance(value, dict):
            return ", ".join(f"{k} {flat(v)}" for k, v in value.items()) or "-"
        return str(value)

    for key, value in report.items():
        if key != "telemetry":
            table.add_row(key.replace("_", " "), flat(value))
    print_table(table)
    if "telemetry" in report:
        _telemetry(report["telemetry"])


def _telemetry(budget: dict[str, Any]) -> None:
    """``health --telemetry``: bytes per day by region, and the size retention keeps."""
    from rich.table import Table

    title = f"telemetry budget (log lines kept: sample_success = {budget['sample_success']:g})"
    table = Table(
        "region",
        "events/day",
        "observations/day",
        "logs/day",
        "logs kept/day",
        "retention",
        "projected",
        title=title,
        title_justify="left",
    )
    rows = [*budget["by_region"].items(), ("all", {**budget, "retention_days": None})]
    for region, figures in rows:
        per_day = figures["bytes_per_day"]
        days = figures["retention_days"]
        table.add_row(
            region,
            *(
                f"{per_day[kind]:,.0f} B"
                for kind in ("events", "observations", "logs", "logs_kept")
            ),
            "-" if days is None else f"{days:g}d",
            f"{figures['projected_bytes']:,} B",
        )
    print_table(table)


def alerts(report: AlertsReport) -> None:
    """``alerts``: a status line, then one line per alert, each named as its JSON names
    it."""
    items = (
        len(report.notices)
        + report.ended_total
        + (report.stalled is not None)
        + len(report.country_caps)
        + len(report.providers_down)
    )
    if not items:
        stdout.print("OK: no notice at risk, sweeps running")
    else:
        stdout.print(f"{report.level.name}: {items} alert(s)")
    if report.stalled is not None:
        stalled = report.stalled
        ago = stalled.seconds_since_last_sweep
        last = "never" if ago is None else relative(-ago)
        stdout.print(
            f"  critical {stalled.to_json()['alert']}: {stalled.live_notices} live notice(s),"
            f" last sweep {last}"
        )
    for down in report.providers_down:
        back = "" if down.back_at is None else f", first probe {relative(down.back_at - report.at)}"
        stdout.print(
            f"  critical {down.to_json()['alert']}: {down.chain} has no instance in use"
            f" ({', '.join(down.instances)}){back}"
        )
    for cap in report.country_caps:
        stdout.print(
            f"  critical {cap.to_json()['alert']}: policy {cap.policy} skipped"
            f" {cap.skipped} SMS in the last hour at a country's cap [{cap.mode}]"
        )
    for alert in report.notices:
        needed = "-" if alert.needed_seconds is None else format_duration(alert.needed_seconds)
        past_help = "" if alert.actionable else " (past help)"
        stdout.print(
            f"  {alert.level.name.lower():<8} {alert.to_json()['alert']}{past_help}"
            f" {alert.notice_id} {alert.region} {alert.phase}"
            f" next {alert.next_action}{' ' + alert.channel if alert.channel else ''}"
            f" remaining {format_duration(alert.remaining_seconds)} needs {needed}"
            f" in state {format_duration(alert.state_age_seconds)} [{alert.mode}]"
        )
    for ended in report.ended:
        stdout.print(
            f"  warning  {ended.to_json()['alert']} {ended.notice_id} {ended.region}"
            f" {ended.phase} ({ended.reason}) at {iso(ended.ended_at)} [{ended.mode}]"
        )
    if report.ended_total > len(report.ended):
        stdout.print(f"  … and {report.ended_total - len(report.ended)} more ended")


def alerts_unknown(now: float, message: str, as_json: bool) -> None:
    """``alerts`` when the check itself could not run."""
    if as_json:
        data: dict[str, Any] = {"at": iso(now), "status": "unknown", "error": message}
        data["alerts"] = []
        json_line(data)
    else:
        stdout.print(f"UNKNOWN: {message}")


def purged(result: Mapping[str, Any], as_json: bool) -> None:
    """``purge``: how many finished notices went, per policy with the retention applied
    and where it came from; the aggregate rows and idle limit counters that went."""
    if as_json:
        json_line(result)
        return
    stdout.print(f"deleted {result['deleted']} finished notice(s)", markup=False)
    for name, rule in result["retention_by_policy"].items():
        seconds = rule["seconds"]
        kept = f"{seconds / 86400:g}d" if seconds >= 86400 else format_duration(seconds)
        stdout.print(
            f"  {name:<16} {result['deleted_by_policy'][name]:>8}  kept {kept}"
            f" ({_RETENTION_FROM[rule['from']]})",
            markup=False,
        )
    aggregates = result["aggregates_deleted"]
    stdout.print(
        f"deleted {aggregates['daily_counts']} daily count and {aggregates['refusals']}"
        f" refusal row(s) of days before {result['aggregates_kept_from']} (added to the"
        f" all-time totals); {result['limit_counts_deleted']} idle limit counter(s)",
        markup=False,
    )


#: Where a policy's retention came from, as ``purge`` says it.
_RETENTION_FROM = {
    "config": "its retention",
    "stored": "not configured: its newest stored record's retention",
    "older_than": "no retention set: --older-than",
}


def database_ready(database: InitializedDatabase, as_json: bool) -> None:
    """``db init``: the database, and whether this run created it."""
    if as_json:
        json_line({"db": database.path, "created": database.created})
        return
    done = "created" if database.created else "already there, schema current"
    stdout.print(f"database {database.path}: {done}", markup=False)


def copied(counts: Mapping[str, int], as_json: bool) -> None:
    """``db copy``: rows per table, verified."""
    if as_json:
        json_line({"copied": counts})
        return
    for table, count in counts.items():
        stdout.print(f"{table:<16} {count:>10}", markup=False)
    stdout.print("copied and verified", markup=False)


def demo_transition(event: TransitionEvent, start: float, label: str) -> None:
    """One transition of the demo, at its offset on the simulated clock."""
    offset = event.at - start
    change = (
        event.new_phase
        if event.old_phase == event.new_phase
        else f"{event.old_phase} → {event.new_phase}"
    )
    detail = " ".join(x for x in (event.channel, event.status) if x)
    clock = f"+{int(offset) // 60:02d}:{int(offset) % 60:02d}"
    stdout.print(
        f"{clock}  {label[:44]:<44}  {event.kind:<8} {detail:<16} {change}",
        markup=False,
    )


def demo_ended(
    phases: Iterable[tuple[str, str, str]], path: str, example_id: str, program: str
) -> None:
    """Each sample's notice id, final phase and label; then where to look further, as a
    command ``program`` (how a shell runs this resetctl) makes runnable as printed."""
    stdout.print()
    for notice_id, phase, label in phases:
        stdout.print(f"{notice_id}  {phase:<9} {label}", markup=False)
    command = f"{program} inspect --db {shlex.quote(path)} {example_id}"
    stdout.print(f"\ndatabase: {path}\ntry: {command}", markup=False)
