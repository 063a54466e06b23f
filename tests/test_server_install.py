"""README's "Run it on a server" block, then every crontab.example line under cron.

The block runs in a scratch root: its absolute paths (/opt/resetctl, /etc/resetctl,
/var/lib/resetctl, /var/log/resetctl, /var/lib/node_exporter) are rewritten under a
temporary directory. What is substituted, and why:

- ``useradd``, ``chown`` and ``crontab -u`` lines become ``:``, and ``install``'s
  ``-o``/``-g`` options and ``runuser -u resetctl --`` are dropped: the test must not add
  system users or need root; everything runs as the current user.
- ``python3 -m venv`` uses this interpreter's base Python, and ``pip install`` gets
  ``--no-deps``: the scratch venv sees this test venv's installed dependencies through a
  ``.pth`` file instead of downloading them. The hash-checked install of
  ``requirements/server.txt`` becomes ``:`` for the same reason (it would download);
  ``test_the_server_requirements_pin_every_dependency_with_hashes`` checks that file.
  resetctl itself is really built and installed from the checkout into the scratch
  venv, and ``pip check`` runs there as written.
- The sweep's ``--max-runtime 55s`` becomes ``1s`` to keep the test short.

Every crontab command then runs exactly as written (after the path rewrite) under cron's
environment: ``env -i SHELL=/bin/sh PATH=/usr/bin:/bin HOME=… LOGNAME=…`` plus the
crontab's own NAME=value lines, through ``/bin/sh -c``.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import stat
import subprocess
import sys
import sysconfig
import time
import tomllib
from pathlib import Path

import pytest
from packaging.requirements import Requirement
from packaging.utils import canonicalize_name

REPO = Path(__file__).resolve().parent.parent
ROOTED = ("/opt/resetctl", "/etc/resetctl", "/var/lib/resetctl", "/var/log/resetctl")
NODE_EXPORTER = "/var/lib/node_exporter"
CRON_PATH = "/usr/bin:/bin"

pytestmark = [
    pytest.mark.slow,
    pytest.mark.skipif(shutil.which("flock") is None, reason="flock (util-linux) is missing"),
]


def _server_block() -> str:
    text = (REPO / "README.md").read_text(encoding="utf-8")
    section = text.split("## Run it on a server", 1)[1].split("\n## ", 1)[0]
    blocks = re.findall(r"```sh\n(.*?)```", section, flags=re.DOTALL)
    assert len(blocks) == 1, "the section has exactly one sh block"
    return str(blocks[0])


def _relocate(text: str, root: Path) -> str:
    for path in (*ROOTED, NODE_EXPORTER):
        text = text.replace(path, f"{root}{path}")
    return text


def _substituted(block: str, root: Path) -> str:
    lines = []
    for line in _relocate(block, root).splitlines():
        words = line.split()
        if (words and words[0] in ("useradd", "chown", "crontab")) or "--require-hashes" in words:
            line = ":  # substituted: " + line
        line = re.sub(r" -o \S+ -g \S+", "", line)
        line = line.replace("runuser -u resetctl -- ", "")
        if words[:3] == ["python3", "-m", "venv"]:
            venv = words[3]
            base = getattr(sys, "_base_executable", sys.executable)
            deps = sysconfig.get_paths()["purelib"]
            inner = f"{venv}/lib/python{sys.version_info[0]}.{sys.version_info[1]}/site-packages"
            line = f"{base} -m venv {venv} && echo {deps} > {inner}/test-deps.pth"
        if "/bin/pip install" in line:
            line = line.replace("pip install", "pip install --no-deps")
        lines.append(line)
    return "\n".join(lines) + "\n"


def _crontab(root: Path) -> tuple[dict[str, str], list[str]]:
    """The crontab's NAME=value lines and its jobs' commands, relocated."""
    env: dict[str, str] = {}
    commands: list[str] = []
    for raw in (REPO / "crontab.example").read_text(encoding="utf-8").splitlines():
        line = raw.strip()
        if not line or line.startswith("#"):
            continue
        if re.fullmatch(r"[A-Z_]+=\S*", line):
            name, _, value = line.partition("=")
            env[name] = _relocate(value, root)
            continue
        fields = line.split(maxsplit=5)
        assert len(fields) == 6, f"not a cron job line: {line}"
        # cron turns an unescaped % into a newline: a command must not contain one.
        assert "%" not in fields[5], line
        commands.append(_relocate(fields[5], root))
    return env, commands


def _cron(command: str, env: dict[str, str], home: Path) -> subprocess.CompletedProcess[str]:
    """One job as cron runs it: a bare environment, /bin/sh, the crontab's variables."""
    cron_env = {"SHELL": "/bin/sh", "PATH": CRON_PATH, "HOME": str(home), "LOGNAME": "resetctl"}
    assignments = [f"{k}={v}" for k, v in {**cron_env, **env}.items()]
    return subprocess.run(
        ["/usr/bin/env", "-i", *assignments, "/bin/sh", "-c", command],
        capture_output=True,
        text=True,
        timeout=60,
        cwd=home,
        check=False,
    )


def _mode(path: Path) -> int:
    return stat.S_IMODE(path.stat().st_mode)


def test_readme_server_block_then_every_crontab_line_runs_under_cron(tmp_path: Path) -> None:
    """The README's install block and every crontab.example job work as shipped."""
    root = tmp_path / "root"
    root.mkdir()
    script = _substituted(_server_block(), root)
    installed = subprocess.run(
        ["/bin/sh", "-c", script],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
        env={k: v for k, v in os.environ.items() if not k.startswith("RESETCTL_")},
    )
    assert installed.returncode == 0, installed.stderr + "\n" + script
    resetctl = root / "opt/resetctl/bin/resetctl"
    etc, lib, log = root / "etc/resetctl", root / "var/lib/resetctl", root / "var/log/resetctl"
    db = lib / "resetctl.db"
    assert resetctl.is_file()
    assert _mode(etc / "credentials.toml") == 0o600
    assert _mode(etc / "hash.key") == 0o600
    assert (_mode(etc), _mode(lib), _mode(log)) == (0o750, 0o700, 0o750)
    assert _mode(db) == 0o600  # created by the block's `db init` (a sweep never creates it)

    env, commands = _crontab(root)
    assert env["PATH"] == CRON_PATH
    for command in commands:
        # No placeholder: flock (on cron's PATH) then resetctl by its absolute path.
        words = command.split()
        assert words[:2] == ["flock", "-n"], command
        assert words[3] == str(resetctl), command
        assert ">>" in command, f"output goes to a log: {command}"

    # The application enqueues as the service user would.
    request = {
        "idempotency_key": "server-1",
        "email": "ada@example.com",
        "reset_url": "https://shop.example/r/server-1",
    }
    enqueued = subprocess.run(
        [str(resetctl), "enqueue"],
        input=json.dumps(request),
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
        env={**env, "PATH": CRON_PATH, "HOME": str(lib)},
    )
    assert enqueued.returncode == 0, enqueued.stderr

    for command in commands:
        fast = command.replace("--max-runtime 55s", "--max-runtime 1s")
        done = _cron(fast, env, lib)
        assert done.returncode == 0, f"{command}\n{done.stdout}\n{done.stderr}"
        assert done.stdout == done.stderr == "", "cron would mail this"

    for path in (db, lib / "resetctl.db-wal", lib / "resetctl.db-shm"):
        if path.exists():
            assert _mode(path) == 0o600, path
    assert (root / "var/lib/node_exporter/textfile/resetctl.prom").is_file()
    logs = sorted(log.glob("*.log"))
    assert {p.name for p in logs} >= {"sweep.log", "alerts.log", "purge.log"}
    for path in logs:
        for line in path.read_text(encoding="utf-8").splitlines():
            entry = json.loads(line)
            assert "ts" in entry or "at" in entry, f"{path.name}: {line}"
    summary = json.loads((log / "sweep.log").read_text(encoding="utf-8").splitlines()[-1])
    assert summary["submitted"] == 1
    status = json.loads((log / "alerts.log").read_text(encoding="utf-8").splitlines()[-1])
    assert status["status"] == "ok"

    # flock: while a sweep holds the lock, the next minute's sweep exits at once.
    sweep = next(c for c in commands if " sweep " in c)
    lock = sweep.split()[2]
    before = (log / "sweep.log").read_text(encoding="utf-8")
    flock = str(shutil.which("flock"))
    with subprocess.Popen([flock, lock, "sleep", "30"]) as holder:
        try:
            deadline = time.monotonic() + 10
            while time.monotonic() < deadline:  # until the holder has the lock
                probe = subprocess.run([flock, "-n", lock, "true"], check=False)
                if probe.returncode != 0:
                    break
            overlapped = _cron(sweep, env, lib)
        finally:
            holder.terminate()
    assert overlapped.returncode == 1
    assert (log / "sweep.log").read_text(encoding="utf-8") == before


def _requirements(text: str) -> dict[str, tuple[str, list[str]]]:
    """name -> (pinned version, hashes) of a pip-compile file with hashes."""
    pins: dict[str, tuple[str, list[str]]] = {}
    for entry in re.sub(r"\\\n", " ", text).splitlines():
        words = entry.split("#", 1)[0].split()
        if not words:
            continue
        name, _, version = words[0].partition("==")
        hashes = [w.removeprefix("--hash=sha256:") for w in words[1:]]
        pins[canonicalize_name(name)] = (version, hashes)
    return pins


def test_the_server_requirements_pin_every_dependency_with_hashes() -> None:
    """requirements/server.txt pins each of resetctl's dependencies (and theirs) to one
    version its specifier allows, each with sha256 hashes, and names the command that
    makes it, the one README's Dependencies section gives."""
    text = (REPO / "requirements" / "server.txt").read_text(encoding="utf-8")
    pins = _requirements(text)
    assert all(version and hashes for version, hashes in pins.values()), pins
    assert all(re.fullmatch(r"[0-9a-f]{64}", h) for _, hashes in pins.values() for h in hashes)
    project = tomllib.loads((REPO / "pyproject.toml").read_text(encoding="utf-8"))["project"]
    for dependency in map(Requirement, project["dependencies"]):
        name = canonicalize_name(dependency.name)
        assert name in pins, f"{name} is not pinned"
        assert dependency.specifier.contains(pins[name][0]), (name, pins[name][0])
    assert "sqlite-utils" not in pins
    command = re.search(r"^#    (pip-compile .*)$", text, flags=re.MULTILINE)
    assert command is not None
    readme = (REPO / "README.md").read_text(encoding="utf-8")
    assert command.group(1).replace("--output-file=", "--output-file ") in _normalized(readme)


def _normalized(readme: str) -> str:
    """README's pip-compile line with its options sorted as pip-compile writes them."""
    line = next(x for x in readme.splitlines() if "pip-compile --" in x)
    words = line.split("pip-compile", 1)[1].split()
    options, source = words[:-1], words[-1]
    joined: list[str] = []
    for word in options:
        if joined and not word.startswith("--"):
            joined[-1] += f" {word}"
        else:
            joined.append(word)
    return "pip-compile " + " ".join([*sorted(w for w in joined if w != "--quiet"), source])
