"""Every command's --help pastes: at 80 columns each example command is one whole line,
and it is a command line that command accepts."""

from __future__ import annotations

import inspect
import os
import shlex
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import typer

from resetctl.cli import app

#: The terminal the help is read on: what an 80-column terminal shows without wrapping.
COLUMNS = 80
#: Shell words that end the command an example runs (a pipe, a redirection, a list).
SHELL_OPERATORS = {"|", "||", "&&", ";", "<", ">", ">>", "&"}

#: The command line as Click sees it (Typer's own copy of Click: a group is known by its
#: commands, not by the installed click's classes).
ROOT: Any = typer.main.get_command(app)


def _leaves(group: Any, path: tuple[str, ...] = ()) -> Iterator[tuple[str, ...]]:
    for name, command in group.commands.items():
        if hasattr(command, "commands"):
            yield from _leaves(command, (*path, name))
        else:
            yield (*path, name)


COMMANDS = list(_leaves(ROOT))


def _resolve(path: tuple[str, ...]) -> Any:
    command = ROOT
    for name in path:
        command = command.commands[name]
    return command


def examples(path: tuple[str, ...]) -> list[str]:
    """The example commands of a command's docstring: the indented lines after its
    "Example:" (or "Examples:") line."""
    callback = _resolve(path).callback
    lines = (inspect.getdoc(callback) or "").splitlines()
    found: list[str] = []
    inside = False
    for line in lines:
        if line.strip() in ("Example:", "Examples:"):
            inside = True
        elif inside and line[:1].isspace():
            found.append(line.strip())
        elif inside and line.strip():
            inside = False
    return found


def help_at(path: tuple[str, ...], columns: int = COLUMNS) -> str:
    """``resetctl <path> --help`` as a terminal of ``columns`` columns shows it: Click
    reads the width from COLUMNS. (Typer's CliRunner would force 80 columns of text,
    where a terminal gets 78, so the help is asked of the commands themselves.)"""
    saved = os.environ.get("COLUMNS")
    os.environ["COLUMNS"] = str(columns)
    try:
        context = ROOT.context_class(ROOT, info_name="resetctl")
        command = ROOT
        for name in path:
            command = command.commands[name]
            context = command.context_class(command, info_name=name, parent=context)
        return str(command.get_help(context)) + "\n"
    finally:
        if saved is None:
            del os.environ["COLUMNS"]
        else:
            os.environ["COLUMNS"] = saved


def _words(example: str) -> list[str]:
    """The words of the command an example runs, from ``resetctl`` to the first shell
    operator (a cron line's schedule fields before it are not the command's)."""
    lexer = shlex.shlex(example, posix=True, punctuation_chars=True)
    lexer.whitespace_split = True
    words = list(lexer)
    assert "resetctl" in words, f"{example!r} does not run resetctl"
    words = words[words.index("resetctl") + 1 :]
    ends = [i for i, word in enumerate(words) if word in SHELL_OPERATORS]
    return words[: ends[0]] if ends else words


ids = [" ".join(path) for path in COMMANDS]


def test_the_commands_are_found() -> None:
    """The walk over the command line finds the commands and the groups' commands."""
    assert {("sweep",), ("inspect",), ("outbox", "show"), ("templates", "check")} <= set(COMMANDS)


@pytest.mark.parametrize("path", COMMANDS, ids=ids)
def test_every_command_has_an_example(path: tuple[str, ...]) -> None:
    """Each command's help carries at least one example command."""
    assert examples(path), f"resetctl {' '.join(path)} --help has no example"


@pytest.mark.parametrize("path", COMMANDS, ids=ids)
def test_each_example_is_one_line_at_80_columns(path: tuple[str, ...]) -> None:
    """At 80 columns every example command of the help is one whole line that fits, and
    no line of the help is wider than the terminal."""
    shown = help_at(path).splitlines()
    for example in examples(path):
        assert not example.endswith("\\"), f"{example!r} continues on another line"
        whole = [line for line in shown if line.strip() == example]
        assert whole, f"{example!r} is not shown whole on one line:\n" + "\n".join(shown)
    too_wide = [line for line in shown if len(line) > COLUMNS]
    assert too_wide == []


@pytest.mark.parametrize("path", COMMANDS, ids=ids)
def test_each_example_is_a_command_line_of_its_command(path: tuple[str, ...]) -> None:
    """Each example names its own command, and the command accepts its options and
    arguments as written (parsed, not run)."""
    for example in examples(path):
        words = _words(example)
        assert tuple(words[: len(path)]) == path, f"{example!r} is not resetctl {path}"
        command = _resolve(path)
        try:
            command.make_context(" ".join(path), words[len(path) :])
        except Exception as exc:  # any refusal (Typer raises its own Click's errors)
            message = exc.format_message() if hasattr(exc, "format_message") else repr(exc)
            pytest.fail(f"{example!r}: {message}")


def test_a_wide_terminal_shows_the_examples_the_same() -> None:
    """A terminal wider than 80 columns gets the same help (Click caps the width)."""
    assert help_at(("sweep",), columns=200) == help_at(("sweep",))


def test_the_real_command_line_shows_what_the_test_reads() -> None:
    """The installed `resetctl` at COLUMNS=80 prints the help this file checks."""
    resetctl = Path(sys.executable).parent / "resetctl"
    env = {k: v for k, v in os.environ.items() if not k.startswith("RESETCTL_")}
    done = subprocess.run(
        [str(resetctl), "templates", "preview", "--help"],
        capture_output=True,
        text=True,
        env={**env, "COLUMNS": str(COLUMNS)},
        timeout=60,
        check=True,
    )
    assert done.stdout == help_at(("templates", "preview"))
