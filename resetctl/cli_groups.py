"""The command groups: ``outbox`` (the embedded transport), ``observe`` (a provider's
callback), ``templates`` (the reset copy) and ``db`` (creating and moving the database).
Each command parses its options, makes one call into :mod:`resetctl.api`, renders and
exits.
"""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Annotated

import typer

from resetctl import api
from resetctl import cli_output as out
from resetctl.cli_command import ConfigOption, DbOption, JsonOption, command, say_errors
from resetctl.errors import InputError, label

outbox_app = typer.Typer(
    help="The embedded outbox transport: list, show and script messages.",
    no_args_is_help=True,
    rich_markup_mode=None,
)
templates_app = typer.Typer(
    help="Own the reset copy: copy the built-in templates, check them, preview them.",
    no_args_is_help=True,
)
db_app = typer.Typer(
    help="Create the database, or copy a SQLite file into PostgreSQL.",
    no_args_is_help=True,
    rich_markup_mode=None,
)


@command(outbox_app, "list")
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
    with api.open(db, config, create=False) as handle:
        rows = handle.outbox_messages(notice)
    if json_output:
        out.dump(rows)
    else:
        out.outbox_list(rows)


@command(outbox_app, "show")
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
    with api.open(db, config, create=False) as handle:
        row = handle.outbox_message(message_id)
    if json_output:
        out.dump(row)
    else:
        out.outbox_message(row)


@command(outbox_app, "set-status")
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
    api.check_outbox_status(status)
    with api.open(db, config, create=False) as handle:
        handle.outbox_set_status(message_id, status)
    out.outbox_status_set(message_id, status)


def observe(
    instance: Annotated[
        str,
        typer.Argument(help="The provider instance it was sent to: twilio, or a [providers] name."),
    ],
    url: Annotated[str, typer.Option("--url", help="The full URL the provider posted to.")],
    signature: Annotated[
        str | None,
        typer.Option(
            "--signature",
            help="The signature header's value, for a kind that signs in one header"
            " (Twilio's X-Twilio-Signature).",
        ),
    ] = None,
    header: Annotated[
        list[str] | None,
        typer.Option("--header", help="A request header as 'Name: value' (repeat it)."),
    ] = None,
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
    """Verify and record a provider's status callback or webhook read from standard input.

    The body as posted comes on stdin; the instance's kind checks its signature (or
    credentials) before anything is recorded: Twilio's with TWILIO_AUTH_TOKEN, Plivo's
    with PLIVO_AUTH_TOKEN, Mailgun's with MAILGUN_WEBHOOK_SIGNING_KEY, Postmark's basic
    auth with POSTMARK_WEBHOOK_USERNAME and _PASSWORD (environment or the instance's
    credentials_file). A forged callback exits 2 and records nothing. The message is
    matched by the provider's id, or by the attempt key resetctl sent with it (an
    attempt whose submission reply was lost). A replay is stored once and exits 0. A
    status the provider does not document is recorded as unknown:<length>.

    Example:

        resetctl observe twilio --url "$URL" --signature "$SIGNATURE" < body
        resetctl observe mailgun_eu --url "$URL" < webhook.json
    """
    headers: dict[str, str] = {}
    for line in header or []:
        name, sep, value = line.partition(":")
        if not sep or not name.strip():
            raise InputError([f"--header {label(line)}: expected 'Name: value'"])
        headers[name.strip().lower()] = value.strip()
    body = sys.stdin.buffer.read()
    with api.open(db, config, create=False) as handle:
        result = handle.observe(
            instance,
            body=body,
            url=url,
            signature=signature,
            headers=headers,
            idempotency_token=idempotency_token,
        )
    out.callback(result, json_output)


@command(templates_app, "init")
def templates_init(
    directory: Annotated[Path, typer.Argument(help="Your templates directory.")],
) -> None:
    """Copy the built-in template versions into DIRECTORY as a starting point.

    Then set `[templates] dir` to DIRECTORY and edit the copy there: an upgrade of
    resetctl never touches it. Existing versions in DIRECTORY are never overwritten.

    Example:

        resetctl templates init /etc/resetctl/templates
    """
    out.templates_copied(directory, api.init_templates(directory))


@command(templates_app, "check")
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
    subject, an SMS over sms.max_segments, and user text put into HTML unescaped; warns
    (and still passes) when the subject shows the display name, text the person chose. Shows
    each SMS's encoding and segment count, the versions the policies name and the
    versions live notices in the database still use (a missing database is read as
    none, and is not created). A sweep refuses to start when a policy's version, or a
    version live notices use, is missing or fails this check.

    Example:

        resetctl templates check --version v2 --config /etc/resetctl/resetctl.toml
    """
    checked = api.templates_check(version, db=db, config=config)
    report = checked.report
    if json_output:
        out.dump(report.to_json())
    else:
        out.templates_report(report, checked.missing_database)
    say_errors(list(report.in_use_failures))
    if not report.ok:
        raise typer.Exit(2)


@command(templates_app, "preview")
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

        resetctl templates preview --locale es-MX --output /tmp/preview
    """
    result = api.preview_templates(version, locale, output, minutes=minutes, config=config)
    out.template_preview(result)


@command(db_app, "init")
def db_init(
    json_output: JsonOption = False,
    db: DbOption = None,
    config: ConfigOption = None,
) -> None:
    """Create the database: a SQLite file (0600), or the schema in an empty PostgreSQL one.

    Every command but enqueue refuses a missing database (a typo'd path must not become
    an empty one that cron sweeps for ever), so a server install runs this once before
    the crontab. A database that exists is brought to the current schema and otherwise
    left as it is: running it again is harmless.

    Example:

        resetctl db init --db /var/lib/resetctl/resetctl.db
    """
    out.database_ready(api.init_database(db, config), json_output)


@command(db_app, "copy")
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
    if not api.is_postgres(to):
        # Not echoed: a mistyped URI may still hold a password.
        raise InputError(["--to: expected a postgresql:// URI or a libpq connection string"])
    with api.open(db, config, create=False) as handle:
        copied = handle.copy_database(to)
    out.copied(copied, json_output)
