"""A real `resetctl serve` on a free loopback port, for the tests of the HTTP service: its
tokens file, its config, the process, and what it logged."""

from __future__ import annotations

import os
import subprocess
import sys
import threading
from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from pathlib import Path
from typing import Any

#: One token per scope set; the test names a caller by its key here.
TOKENS = {
    "app": ("app-" + "a1" * 20, ["enqueue"]),
    "reader": ("reader-" + "b2" * 20, ["read"]),
    "oncall": ("oncall-" + "c3" * 20, ["read", "cancel"]),
}
#: Seconds a starting server has to say where it listens (a loaded 2-core machine).
START = 60.0


def write_tokens(path: Path, mode: int = 0o600) -> Path:
    """The tokens file, one table per TOKENS entry, with ``mode``."""
    lines = []
    for name, (token, scopes) in TOKENS.items():
        lines += [f"[tokens.{name}]", f'token = "{token}"', f"scopes = {scopes!r}"]
    path.write_text("\n".join(lines).replace("'", '"') + "\n", encoding="utf-8")
    path.chmod(mode)
    return path


def bearer(name: str) -> dict[str, str]:
    """The Authorization header of caller ``name``."""
    return {"Authorization": f"Bearer {TOKENS[name][0]}"}


def environment(db: Path, config: Path, extra: Mapping[str, str] | None = None) -> dict[str, str]:
    """A child's environment: this one without RESETCTL_*, then the database and config."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("RESETCTL_")}
    env.update(extra or {}, RESETCTL_DB=str(db), RESETCTL_CONFIG=str(config))
    return env


class Server:
    """A running `resetctl serve`: its base URL, and every line it wrote on stderr."""

    def __init__(self, process: subprocess.Popen[str], base: str, lines: list[str]) -> None:
        self.process = process
        self.base = base
        self._lines = lines

    @property
    def log(self) -> str:
        """What the server logged so far (its stderr)."""
        return "".join(self._lines)


@contextmanager
def serve_process(
    db: Path, config: Path, *options: str, env: Mapping[str, str] | None = None
) -> Iterator[Server]:
    """`resetctl serve --bind 127.0.0.1:0` with ``options``, yielded once it listens (its
    stderr is read as it comes, so a chatty server never blocks on a full pipe)."""
    process = subprocess.Popen(
        [sys.executable, "-m", "resetctl", "serve", "--bind", "127.0.0.1:0", *options],
        stdin=subprocess.DEVNULL,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
        text=True,
        env=environment(db, config, env),
    )
    lines: list[str] = []
    listening = threading.Event()
    where: list[str] = []

    def drain() -> None:
        assert process.stderr is not None
        for line in process.stderr:
            lines.append(line)
            if line.startswith("serving resetctl on ") and not where:
                where.append(line.split()[-1])
                listening.set()
        listening.set()  # it ended: let the test see why

    reader = threading.Thread(target=drain, daemon=True)
    reader.start()
    try:
        assert listening.wait(START), "serve did not start"
        assert where, "serve exited: " + "".join(lines)
        yield Server(process, where[0], lines)
    finally:
        if process.poll() is None:
            process.terminate()
        process.wait(timeout=30)
        reader.join(timeout=30)
        if process.stderr is not None:
            process.stderr.close()


def run_serve(db: Path, config: Path, *options: str) -> subprocess.CompletedProcess[str]:
    """`resetctl serve` expected to refuse to start: its exit code and stderr."""
    return subprocess.run(
        [sys.executable, "-m", "resetctl", "serve", "--bind", "127.0.0.1:0", *options],
        stdin=subprocess.DEVNULL,
        capture_output=True,
        text=True,
        env=environment(db, config),
        timeout=120,
    )


def resetctl_json(db: Path, config: Path, *args: str) -> Any:
    """A command's --json document, run as the CLI, on the server's database and config."""
    import json

    done = subprocess.run(
        [sys.executable, "-m", "resetctl", *args],
        capture_output=True,
        text=True,
        env=environment(db, config),
        timeout=120,
        check=True,
    )
    return json.loads(done.stdout)
