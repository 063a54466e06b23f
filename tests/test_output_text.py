"""Output keeps its text: no markup eats brackets, piped tables keep whole ids."""

from __future__ import annotations

import ast
import json
import re
from collections.abc import Iterator
from pathlib import Path

import click
import pytest
import time_machine
import typer
from conftest import T0, FakeClock, make_settings, reset_request, run_sweep
from typer.testing import CliRunner

from resetctl import cli_output as cli
from resetctl.cli import app
from resetctl.enqueue import enqueue
from resetctl.store import Store

PACKAGE = Path(cli.__file__).resolve().parent
BRACKETED = re.compile(r"\[[^\[\]\n]+\]")


def _flat(text: str) -> str:
    return re.sub(r"\s+", " ", text)


def _commands(group: click.Command, path: tuple[str, ...] = ()) -> Iterator[tuple[str, ...]]:
    yield path
    if isinstance(group, click.Group):
        for name, command in group.commands.items():
            yield from _commands(command, (*path, name))


def _help_sources(command: click.Command) -> list[str]:
    texts = [command.help or ""]
    texts += [getattr(p, "help", None) or "" for p in command.params]
    return texts


def _resolve(path: tuple[str, ...]) -> click.Command:
    command: click.Command = typer.main.get_command(app)
    for name in path:
        assert isinstance(command, click.Group)
        command = command.commands[name]
    return command


ALL_COMMANDS = list(_commands(typer.main.get_command(app)))


@pytest.mark.parametrize("path", ALL_COMMANDS, ids=lambda p: " ".join(p) or "resetctl")
def test_every_help_keeps_its_bracketed_literals(path: tuple[str, ...]) -> None:
    """Each command's --help shows every [bracketed] literal its source text holds."""
    result = CliRunner().invoke(app, [*path, "--help"], terminal_width=60)
    assert result.exit_code == 0, result.output
    shown = _flat(result.stdout)
    literals = [m for t in _help_sources(_resolve(path)) for m in BRACKETED.findall(t)]
    for literal in literals:
        assert _flat(literal) in shown, literal
    if path in (("enqueue",), ("inspect",)):
        assert "[default: ./resetctl.db]" in shown
    if path == ("replay",):
        assert "[policy.*]" in shown


def _message_literals() -> list[str]:
    """Every string in the package that holds a bracketed literal (messages, help)."""
    found: set[str] = set()
    for source in PACKAGE.rglob("*.py"):
        for node in ast.walk(ast.parse(source.read_text(encoding="utf-8"))):
            if isinstance(node, ast.Constant) and isinstance(node.value, str):
                found.update(BRACKETED.findall(node.value))
    return sorted(found)


MESSAGE_LITERALS = _message_literals()


def test_the_package_has_bracketed_messages_to_check() -> None:
    """The scan finds the literals the issue names."""
    assert {"[outbox]", "[policy.*]", "[privacy]"} <= set(MESSAGE_LITERALS)


@pytest.mark.parametrize("console", ["stdout", "stderr"])
def test_every_bracketed_literal_survives_the_consoles(console: str) -> None:
    """Printed through resetctl's consoles as messages are, every literal comes out whole."""
    target = getattr(cli, console)
    for literal in MESSAGE_LITERALS:
        with target.capture() as captured:
            target.print(f"error: x {literal} y")
        assert captured.get() == f"error: x {literal} y\n", literal


@pytest.fixture
def swept(tmp_path: Path) -> tuple[Path, str]:
    """A database with one ended notice whose outbox content was scrubbed."""
    db_path = tmp_path / "r.db"
    settings = make_settings()
    with Store(db_path) as store:
        enqueue(store, settings, [reset_request()], T0)
        run_sweep(store, settings, FakeClock(T0))
        (message,) = store.outbox_messages()
    return db_path, str(message["message_id"])


def test_scrubbed_message_names_the_outbox_table(swept: tuple[Path, str]) -> None:
    """The scrubbed-content hint keeps "[outbox] keep_content = true"."""
    db_path, message_id = swept
    result = CliRunner().invoke(app, ["outbox", "show", message_id, "--db", str(db_path)])
    assert result.exit_code == 0, result.output
    assert "set [outbox] keep_content = true" in result.stdout


def test_a_piped_table_never_truncates_ids(swept: tuple[Path, str]) -> None:
    """outbox list through a pipe (not a terminal) keeps every id whole, however narrow."""
    db_path, message_id = swept
    result = CliRunner().invoke(
        app, ["outbox", "list", "--db", str(db_path)], env={"COLUMNS": "30"}, terminal_width=30
    )
    assert result.exit_code == 0, result.output
    assert message_id in result.stdout
    assert "…" not in result.stdout


@pytest.mark.parametrize("json_output", [True, False])
def test_the_sweep_summary_carries_its_time_and_logs_stay_on_stderr(
    tmp_path: Path, json_output: bool
) -> None:
    """sweep's summary line on stdout says when; transition logs go to stderr only."""
    db_path = tmp_path / "r.db"
    with Store(db_path) as store:
        enqueue(store, make_settings(), [reset_request()], T0)
    args = ["sweep", "--db", str(db_path), *(["--json"] if json_output else [])]
    with time_machine.travel(T0 + 1, tick=False):
        result = CliRunner().invoke(app, args, env={"RESETCTL_LOG_FORMAT": "json"})
    assert result.exit_code == 0, result.output
    (line,) = result.stdout.splitlines()
    if json_output:
        assert json.loads(line)["at"] == "2026-01-01T00:00:01Z"
    else:
        assert line.startswith("2026-01-01T00:00:01Z claimed 1, submitted 1")
    logs = [json.loads(x) for x in result.stderr.splitlines()]
    assert logs
    assert all("ts" in entry for entry in logs)
