"""How a command is declared: the options commands share, and the one place a domain
error becomes an exit code (:func:`command`).

Exit codes: 0 ok, 1 runtime failure (unknown notice, unusable database), 2 bad input or
configuration (nothing written); ``alerts`` follows the monitoring-plugin convention.
"""

from __future__ import annotations

import functools
import inspect
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Annotated, Any, TypeVar

import typer

from resetctl.cli_output import stderr
from resetctl.durations import parse_duration
from resetctl.errors import InputError, RequestsRefused, ResetctlError

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

Command = TypeVar("Command", bound=Callable[..., None])
#: How a command whose failures are not the usual ones turns an exception into its exit,
#: given the exception and the command's options (``alerts``: UNKNOWN).
ErrorExit = Callable[[Exception, Mapping[str, Any]], typer.Exit]

#: --log-format json: errors become JSON log lines too (with their time), so a cron
#: log of one command's stderr reads as one format.
_json_logs = False


def log_errors_as_json(on: bool) -> None:
    """Under --log-format json, error lines are JSON log lines."""
    global _json_logs
    _json_logs = on


def command(
    group: typer.Typer, name: str | None = None, *, on_error: ErrorExit | None = None
) -> Callable[[Command], Command]:
    """Register a command on ``group``; the one place its errors become exit codes.

    A :class:`ResetctlError` prints its lines on stderr and exits with its
    ``exit_code``. With ``on_error``, every exception the command raises (a domain error
    or any other) becomes the exit ``on_error`` returns instead.
    """

    def register(function: Command) -> Command:
        @functools.wraps(function)
        def run(**options: Any) -> None:
            try:
                function(**options)
            except typer.Exit:
                raise
            except ResetctlError as exc:
                if on_error is not None:
                    raise on_error(exc, options) from None
                say_errors(_problems(exc))
                raise typer.Exit(exc.exit_code) from None
            except Exception as exc:
                if on_error is None:
                    raise
                raise on_error(exc, options) from None

        group.command(name, help=help_text(function))(run)
        return function

    return register


def help_text(function: Callable[..., None]) -> str:
    """The command's docstring as its --help, with every indented paragraph (an example
    command) marked for Click to print as written: rewrapped, an example breaks mid-command
    and no longer pastes."""
    paragraphs = inspect.cleandoc(function.__doc__ or "").split("\n\n")
    return "\n\n".join(
        f"\b\n{paragraph}" if paragraph[:1].isspace() else paragraph for paragraph in paragraphs
    )


def _problems(exc: ResetctlError) -> list[str]:
    """The error's lines, the first MAX_PROBLEMS of them and a total."""
    problems = exc.problems if isinstance(exc, InputError | RequestsRefused) else [str(exc)]
    if len(problems) <= MAX_PROBLEMS:
        return problems
    rest = len(problems) - MAX_PROBLEMS
    written = "nothing was written" if isinstance(exc, InputError) else "the others were written"
    return [
        *problems[:MAX_PROBLEMS],
        f"{len(problems)} problems in total ({rest} more not shown); {written}",
    ]


def say_errors(problems: list[str]) -> None:
    """One ``error:`` line per problem on stderr (a JSON log line under --log-format json)."""
    if _json_logs:
        from resetctl.telemetry import LOGGER

        for problem in problems:
            LOGGER.error(problem)
    else:
        for problem in problems:
            stderr.print(f"error: {problem}")


def max_runtime_seconds(value: str) -> float:
    """--max-runtime: 0 (one pass) or a positive duration."""
    return 0.0 if value.strip() in ("0", "0s") else parse_duration(value, "--max-runtime")
