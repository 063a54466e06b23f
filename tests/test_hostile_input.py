"""Every byte that comes in is bounded: enqueue's lines, free text, reset URLs and policy
numbers. Each malformed input is refused with exit 2, one line naming the field or the
line, and nothing written (issue 24, item 7)."""

from __future__ import annotations

import io
import json
from pathlib import Path
from typing import Any

import pytest
from conftest import T0, make_settings, reset_request, resetctl

from resetctl import api
from resetctl.enqueue import MAX_LINE_BYTES, enqueue, read_json_lines
from resetctl.errors import ConfigError, InputError
from resetctl.store import Store


def _line(**fields: Any) -> str:
    return json.dumps(reset_request(**fields), ensure_ascii=False)


def test_lines_end_at_newline_only() -> None:
    """U+2028, U+2029 and U+0085 inside a JSON string do not split its line (Python's
    str.splitlines would); a CRLF ends one."""
    text = _line(display_name="Ada") + "\n" + '{"a": "x\u2028y\u0085z\u2029w"}\r\n'
    lines = read_json_lines(io.BytesIO(text.encode()))
    assert len(lines) == 2
    assert json.loads(lines[1]) == {"a": "x\u2028y\u0085z\u2029w"}


def test_an_endless_line_is_refused_without_reading_it_whole() -> None:
    """A line longer than the cap is refused after reading one byte past it."""

    class Endless(io.RawIOBase):
        served = 0

        def readable(self) -> bool:
            return True

        def readinto(self, buffer: Any) -> int:
            self.served += len(buffer)
            buffer[:] = b"x" * len(buffer)
            return len(buffer)

    raw = Endless()
    with pytest.raises(InputError, match=r"line 1: \(line\): longer than 65536 bytes"):
        read_json_lines(io.BufferedReader(raw))
    assert raw.served < 4 * MAX_LINE_BYTES


def test_a_line_that_is_not_utf8_is_named() -> None:
    """Bytes that are not UTF-8 name their line."""
    data = (_line() + "\n").encode() + b'{"idempotency_key": "\xff"}\n'
    with pytest.raises(InputError, match=r"line 2: \(line\): not UTF-8 text"):
        read_json_lines(io.BytesIO(data))


@pytest.mark.parametrize(
    ("fields", "problem"),
    [
        (
            {"reset_url": "https://shop.example@evil.example/r/1"},
            "reset_url: must not carry a user",
        ),
        ({"reset_url": "https://u:p@shop.example/r/1"}, "reset_url: must not carry a user"),
        ({"reset_url": "https://shop.example:99999/r/1"}, "reset_url: has an invalid port"),
        ({"reset_url": "https://shop.example:http/r/1"}, "reset_url: "),
        ({"reset_url": "https://shop.example/r/\u202e1"}, "reset_url: contains control"),
        ({"region": "eu\x85"}, "region: contains control characters"),
        ({"display_name": "Ada\u202egnp.exe"}, "display_name: contains control characters"),
        ({"display_name": "Ada\u2066x\u2069"}, "display_name: contains control characters"),
        ({"account_ref": "acct\u2028-1"}, "account_ref: contains control characters"),
        ({"idempotency_key": "k\x9b1"}, "idempotency_key: contains control characters"),
    ],
    ids=[
        "url-host-before-at",
        "url-userinfo",
        "url-port-range",
        "url-port-word",
        "url-bidi",
        "region-c1",
        "name-bidi-override",
        "name-bidi-isolate",
        "account-line-separator",
        "key-c1-csi",
    ],
)
def test_hostile_fields_are_refused_by_name(
    store: Store, fields: dict[str, Any], problem: str
) -> None:
    """Each hostile value is an InputError naming its line and field; nothing stored."""
    with pytest.raises(InputError) as raised:
        enqueue(store, make_settings(unknown_region="default"), [reset_request(**fields)], T0)
    assert [p for p in raised.value.problems if problem in p], raised.value.problems
    assert raised.value.problems[0].startswith("line 1: ")
    assert store.phase_counts() == {}


def test_reset_url_hosts_keeps_links_on_the_shop(store: Store) -> None:
    """With reset_url_hosts, a link to another host is refused; a listed host and a
    subdomain of a `*.` entry are taken."""
    settings = make_settings(reset_url_hosts=["shop.example", "*.accounts.example"])
    ok = [
        reset_request(reset_url="https://shop.example/r/1"),
        reset_request(reset_url="https://eu.accounts.example/r/2"),
    ]
    assert len(enqueue(store, settings, ok, T0)) == 2
    for url in ("https://evil.example/r/3", "https://accounts.example.evil/r/4"):
        with pytest.raises(InputError, match="reset_url: its host is not one of reset_url_hosts"):
            enqueue(store, settings, [reset_request(reset_url=url)], T0)
    with pytest.raises(ConfigError, match="reset_url_hosts: "):
        make_settings(reset_url_hosts=["shop example"])


@pytest.mark.parametrize(
    ("table", "key"),
    [
        ({"lease": "1e12"}, "policy.default.lease"),
        ({"lease": "11m"}, "policy.default.lease"),
        ({"batch_size": 2**63}, "policy.default.batch_size"),
        ({"version": 2**63}, "policy.default.version"),
        ({"email": {"poll_delays": list(range(1, 10_001))}}, "policy.default.email.poll_delays"),
        ({"retry_delays": list(range(1, 100))}, "policy.default.retry_delays"),
        ({"sms": {"max_segments": 1000}}, "policy.default.sms.max_segments"),
        ({"max_ttl": "365d"}, "policy.default.max_ttl"),
    ],
    ids=["lease-1e12", "lease-over-ttl", "batch", "version", "polls", "retries", "segments", "ttl"],
)
def test_absurd_policy_numbers_are_config_errors(table: dict[str, Any], key: str) -> None:
    """Numbers past any sensible bound are refused, naming the key."""
    with pytest.raises(ConfigError, match=f"^{key}: "):
        make_settings(policy={"default": table})


#: (what the command reads, the problem its one line names): every one exits 2 and
#: leaves no database file behind.
MALFORMED_ENQUEUE = [
    (b"x" * (MAX_LINE_BYTES + 10) + b"\n", "line 1: (line): longer than"),
    ((_line() + "\n").encode() + b"\xc3\x28\n", "line 2: (line): not UTF-8"),
    ((_line(reset_url="https://a@b.example/") + "\n").encode(), "line 1: reset_url:"),
    ((_line(display_name="A\u202eB") + "\n").encode(), "line 1: display_name:"),
    ((_line(region="\x9bdefault") + "\n").encode(), "line 1: region:"),
]


@pytest.mark.parametrize(("data", "problem"), MALFORMED_ENQUEUE)
def test_the_command_line_refuses_each_on_one_line_and_writes_nothing(
    tmp_path: Path, data: bytes, problem: str
) -> None:
    """`resetctl enqueue` from a file and from stdin: exit 2, one line, no file made."""
    db = tmp_path / "resetctl.db"
    source = tmp_path / "in.jsonl"
    source.write_bytes(data)
    ways: list[tuple[list[str], str | None]] = [(["--input", str(source)], None)]
    if "UTF-8" not in problem:  # stdin is text here; the file carries the raw bytes
        ways.append(([], data.decode("utf-8")))
    for args, stdin in ways:
        result = resetctl("enqueue", *args, db=db, input=stdin)
        lines = result.stderr.splitlines()
        assert result.returncode == 2, result.stderr
        assert len(lines) == 1, lines
        assert problem in lines[0]
        assert not db.exists()
    assert "https://" not in result.stderr  # a refused URL is named, never echoed


def test_a_config_with_an_absurd_number_exits_2_naming_file_line_and_key(tmp_path: Path) -> None:
    """The config file's mistake: exit 2, one line with the file, its line and the key."""
    config = tmp_path / "resetctl.toml"
    config.write_text("[policy.default]\nbatch_size = 9223372036854775807\n", encoding="utf-8")
    with api.open(tmp_path / "x.db", make_settings()) as handle:
        handle.enqueue([reset_request()])
    result = resetctl("sweep", "--config", str(config), db=tmp_path / "x.db")
    assert result.returncode == 2
    (line,) = result.stderr.splitlines()
    assert "line 2" in line
    assert "policy.default.batch_size: must be at most 10000" in line


HEADER = {"timings": 2, "sweep_interval": 60.0}
TRACE = {"version": 2, "trace_id": "t0000001", "region": "default", "arrived_at": 12.5,
         "ttl": 600, "email": {"seen": [[0, 0, "accepted"]], "end_ms": 0},
         "transport": {"email": "outbox"}}  # fmt: skip


def _traces(tmp_path: Path, *records: dict[str, Any] | str) -> Path:
    path = tmp_path / "week.jsonl"
    lines = [r if isinstance(r, str) else json.dumps(r) for r in records]
    path.write_text("\n".join(lines) + "\n", encoding="utf-8")
    return path


@pytest.mark.parametrize(
    ("records", "problem"),
    [
        ((HEADER, {**TRACE, "arrived_at": 1e300}), "line 2: arrived_at: expected seconds"),
        ((HEADER, {**TRACE, "ttl": 1e12}), "line 2: ttl: expected a positive number"),
        (({**HEADER, "sweep_interval": 1e-9}, TRACE), "line 1: sweep_interval: expected"),
        (({**HEADER, "read_lag": {"p50": 1e300}}, TRACE), "line 1: read_lag.p50: expected"),
        (('{"timings": 2, "sweep_interval": ', TRACE), "line 1: (header): not valid JSON"),
        ((HEADER, {**TRACE, "trace_id": "t" * (2 * 1024 * 1024)}), "line 2: (line): longer"),
    ],
    ids=["arrival-1e300", "ttl-1e12", "interval-1e-9", "lag-1e300", "header-json", "long-line"],
)
def test_replay_refuses_a_hostile_trace_file_on_one_line(
    tmp_path: Path, records: tuple[Any, ...], problem: str
) -> None:
    """Each trace past a bound: exit 2, one line naming the line and field (no hang, no
    traceback)."""
    result = resetctl("replay", str(_traces(tmp_path, *records)))
    assert result.returncode == 2, result.stderr
    (line,) = result.stderr.splitlines()
    assert problem in line


@pytest.mark.parametrize("option", [["--sweep-interval", "1ms"], ["--read-lag", "2h"]])
def test_replay_options_past_their_bounds_are_refused(tmp_path: Path, option: list[str]) -> None:
    """A cron interval under a second or a read lag over an hour is a mistake: exit 2."""
    result = resetctl("replay", str(_traces(tmp_path, HEADER, TRACE)), *option)
    assert result.returncode == 2
    assert option[0] in result.stderr


def test_replay_reads_regular_files_only(tmp_path: Path) -> None:
    """/dev/zero and a FIFO are refused at once, never read forever or waited on."""
    import os

    fifo = tmp_path / "traces.fifo"
    os.mkfifo(fifo)
    for path in ("/dev/zero", str(fifo)):
        result = resetctl("replay", path)
        assert result.returncode == 2
        assert result.stderr.strip() == f"error: {path}: not a regular file"


def test_the_well_formed_trace_these_tests_break_replays(tmp_path: Path) -> None:
    """The premise of the tests above: the same file without the hostile value replays."""
    result = resetctl("replay", str(_traces(tmp_path, HEADER, TRACE)), "--json")
    assert result.returncode == 0, result.stderr
    assert json.loads(result.stdout)[0]["accepted"] == 1


def test_text_written_before_the_refusal_is_escaped_on_output(db_path: Path) -> None:
    """A region holding C1 and bidi characters (a row from before enqueue refused them)
    prints escaped in inspect and list: a terminal never acts on it."""
    with Store(db_path) as store:
        (result,) = enqueue(store, make_settings(), [reset_request(account_ref="a-1")], T0)
        store.conn.execute(
            "UPDATE notices SET region = ?, account_ref = ? WHERE id = ?",
            ("eu\x9b31m\u202e", "a\x1b[2J", result.notice_id),
        )
    for args in (["inspect", result.notice_id], ["list", "--account", "a\x1b[2J"]):
        shown = resetctl(*args, db=db_path)
        assert shown.returncode == 0, shown.stderr
        assert "\x9b" not in shown.stdout
        assert "\x1b" not in shown.stdout
        assert "\u202e" not in shown.stdout
        assert "eu\\u009b31m\\u202e" in shown.stdout


def test_a_credentials_file_that_is_not_utf8_is_one_line(tmp_path: Path) -> None:
    """A credentials file holding bytes that are not UTF-8: exit 2 naming the key, no
    traceback, nothing of the file shown."""
    creds = tmp_path / "creds.toml"
    creds.write_bytes(b"\xff\xfe TWILIO_AUTH_TOKEN = 'x'")
    creds.chmod(0o600)
    config = tmp_path / "resetctl.toml"
    config.write_text(
        '[transport]\nsms = "twilio"\n[twilio]\nfrom = "+14155550100"\n'
        f"credentials_file = {json.dumps(str(creds))}\n",
        encoding="utf-8",
    )
    request = json.dumps(reset_request())
    resetctl("enqueue", "--config", str(config), db=tmp_path / "x.db", input=request, check=True)
    result = resetctl("sweep", "--config", str(config), db=tmp_path / "x.db")
    assert result.returncode == 2, result.stderr
    (line,) = result.stderr.splitlines()
    assert line.endswith("twilio.credentials_file: not UTF-8 text")
