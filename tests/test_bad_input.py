"""Bad input at every door: a clear one-line error and a documented exit code, never a
traceback, never a half-written notice.

The doors: JSON lines for `enqueue`, the TOML config, trace lines for `replay`, the
database file (missing, read-only, full) and the ids `inspect` and `outbox show` take.
Hypothesis drives the library in-process (fast); child processes check what a user sees.
The properties leave out the inputs that the strict xfail tests at the end pin down as
bugs; when a bug is fixed, its xfail turns into a failure and the exclusion can go.
"""

from __future__ import annotations

import ctypes
import hashlib
import json
import os
import re
import resource
import signal
import sqlite3
import string
import subprocess
import sys
import tempfile
from collections import Counter
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from datetime import UTC
from pathlib import Path
from typing import Any

import pytest
from conftest import T0, resetctl
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from resetctl.config import BUILT_IN_TRANSPORTS, Settings, load_settings, settings_from_mapping
from resetctl.enqueue import FIELDS, enqueue_lines
from resetctl.errors import ConfigError, InputError
from resetctl.policy import DEFAULT_POLICY
from resetctl.replay import TRACE_FIELDS, read_traces
from resetctl.store import Store

#: One problem of an InputError: line, field, problem; one line, no control characters.
PROBLEM = re.compile(r"line (\d+): [^:\x00-\x1f\x7f]+: [^\x00-\x1f\x7f]+")
#: A ConfigError: a dotted key path (with list indexes), a colon, the problem.
CONFIG_PROBLEM = re.compile(r"([\w-]+)(?:\.[\w-]+|\[\d+\])*: [^\n]+")
#: What a rejected enqueue or replay prints, per problem.
CLI_PROBLEM = re.compile(r"error: line \d+: [^:]+: .+")

SETTINGS = settings_from_mapping({"policy": {"apac": {"version": 1, "channels": ["sms", "email"]}}})


def line_of(fields: object) -> str:
    """One JSON line, as `enqueue` and `replay` read them."""
    return json.dumps(fields)


def valid_request(key: str, changed: bool) -> dict[str, Any]:
    """A valid request whose fields follow from its key, unless ``changed``."""
    number = int(key.removeprefix("k"))
    request: dict[str, Any] = {
        "idempotency_key": key,
        "email": "ada@example.com",
        "reset_url": f"https://shop.example/r/SECRET-{key}",
    }
    if number % 3 == 2:
        request["ttl"] = "10m"
    if number % 3 == 0:
        request |= {"region": "apac", "phone": "+14155550123"}
    if changed:
        request["email"] = "bob@example.org"
    return request


#: Stored before each example, so a line can reuse its key (same or other fields).
SEED = valid_request("k1", changed=False)


def row_counts(store: Store) -> dict[str, int]:
    """Rows in every table an enqueue writes."""
    return {
        table: store.conn.execute(f"SELECT count(*) FROM {table}").fetchone()[0]
        for table in ("notices", "notice_secrets", "policies")
    }


def notices_without_secrets(conn: sqlite3.Connection) -> int:
    """Half-written notices: a `notices` row with no `notice_secrets` row."""
    (count,) = conn.execute(
        "SELECT count(*) FROM notices n LEFT JOIN notice_secrets s ON s.notice_id = n.id"
        " WHERE s.notice_id IS NULL"
    ).fetchone()
    return int(count)


def line_number(problem: str) -> int:
    """The line an InputError problem names; fails unless it reads `line N: field: …`."""
    match = PROBLEM.fullmatch(problem)
    assert match, problem
    return int(match[1])


def assert_one_line_error(result: Any, prefix: str) -> str:
    """The child failed with exactly one stderr line starting with ``prefix``."""
    assert "Traceback" not in result.stderr
    lines = result.stderr.splitlines()
    assert len(lines) == 1, result.stderr
    assert lines[0].startswith(prefix), lines[0]
    return str(lines[0])


# -- enqueue: Hypothesis over the library ------------------------------------------------

# Random names use a plain alphabet: an empty name, or one with ':' or a control character,
# is echoed verbatim (test_unknown_field_name_stays_on_one_line).
RANDOM_KEYS = st.text(string.ascii_lowercase + string.digits + "_- .", min_size=1, max_size=10)
KEYS = st.sampled_from(sorted(FIELDS)) | RANDOM_KEYS
# Integers stay within 64 bits: larger ones crash (test_enqueue_huge_integer_ttl_... and
# test_enqueue_unparseable_number_or_nesting_...); lone surrogates are left out too
# (st.text never draws them; test_enqueue_lone_surrogate_is_an_input_error).
SCALARS = (
    st.none() | st.booleans() | st.integers(-(2**63), 2**63) | st.floats() | st.text(max_size=20)
)
JSON_VALUES = st.recursive(
    SCALARS,
    lambda children: st.lists(children, max_size=4) | st.dictionaries(KEYS, children, max_size=4),
    max_leaves=10,
)
PLAUSIBLE = {
    "idempotency_key": st.sampled_from(["k1", "k2", "k3", "", " ", "k\x07"]),
    "email": st.sampled_from(["ada@example.com", "bob@example.org", "not-an-address", "a@@b"]),
    "phone": st.sampled_from(["+14155550123", "+447911123456", "0123", "+1", "+1415555012x"]),
    "reset_url": st.sampled_from(
        [
            "https://shop.example/r/SECRET-a",
            "https://shop.example/r/SECRET-b",
            "http://shop.example/r/SECRET-c",
            "https:///SECRET-d",
            "https://shop.example/r/SECRET e",
            "SECRET-f",
        ]
    ),
    "region": st.sampled_from(["default", "apac", "eu", ""]),
    "locale": st.sampled_from(["es", "es-MX", "pl", "ja", "es_MX", "xx", "", "und"]),
    "consent": st.sampled_from([["email"], ["email", "sms"], [], ["sms", "sms"], ["fax"], "email"]),
    "ttl": st.sampled_from(["10m", "90s", 600, 0, -5, "1h30m", "soon", 1e308, True]),
    "expires_at": st.sampled_from(
        [
            "2026-01-01T00:10:00Z",
            "2026-01-01T00:10:00+01:00",
            "2025-12-31T00:00:00Z",
            "2026-01-01T00:10:00",
            "2026-13-01T00:00:00Z",
            "yesterday",
        ]
    ),
    "display_name": st.sampled_from(["Ada", "x" * 101, "Ada\nLovelace", "{{reset_url}}"]),
    "account_ref": st.sampled_from(["acct-1", "", "a" * 201]),
}


def mostly(good: st.SearchStrategy[Any], bad: st.SearchStrategy[Any]) -> st.SearchStrategy[Any]:
    """Usually ``good``, sometimes ``bad``: validation gets explored past its first check."""
    # Not one_of(good, good, good, bad): one_of draws from each distinct strategy equally.
    return st.sampled_from([good, good, good, bad]).flatmap(lambda chosen: chosen)


#: Sometimes one unknown field, usually none.
EXTRA_FIELD = mostly(st.just({}), st.dictionaries(RANDOM_KEYS, JSON_VALUES, min_size=1, max_size=1))
REQUESTS = st.builds(
    lambda fields, extra: {**fields, **extra},
    st.fixed_dictionaries(
        {}, optional={f: mostly(PLAUSIBLE[f], JSON_VALUES) for f in sorted(FIELDS)}
    ),
    EXTRA_FIELD,
)
VALID_REQUESTS = st.builds(
    valid_request,
    st.sampled_from([f"k{n}" for n in range(1, 7)]),
    mostly(st.just(False), st.just(True)),
)
OTHER_LINES = mostly(
    REQUESTS.map(line_of),
    st.one_of(
        JSON_VALUES.map(line_of),
        VALID_REQUESTS.map(line_of).map(lambda text: text[:-1]),
        st.text(max_size=30),
        st.sampled_from(["", "   ", "{", "null", "[]", "{}", "NaN", '{"a": 1}{}']),
    ),
)
#: Valid requests (some reusing a key, some changing its fields) with a few other lines.
LINES = st.tuples(
    st.lists(VALID_REQUESTS.map(line_of), max_size=4), st.lists(OTHER_LINES, max_size=2)
).flatmap(lambda parts: st.permutations(parts[0] + parts[1]))


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(lines=LINES)
def test_enqueue_lines_writes_complete_notices_or_nothing_with_line_field_errors(
    lines: list[str],
) -> None:
    """Any lines: complete notices (row and secrets), or an InputError and no new rows."""
    with tempfile.TemporaryDirectory() as tmp, Store(Path(tmp) / "resetctl.db") as store:
        enqueue_lines(store, SETTINGS, [line_of(SEED)], T0)
        before = row_counts(store)
        rejected: InputError | None = None
        try:
            results = enqueue_lines(store, SETTINGS, lines, T0)
        except InputError as exc:
            rejected = exc
        if rejected is not None:
            numbers = [line_number(problem) for problem in rejected.problems]
            assert numbers
            assert numbers == sorted(numbers)
            assert all(1 <= n <= len(lines) and lines[n - 1].strip() for n in numbers)
            assert not any("SECRET" in p or "@" in p for p in rejected.problems)
            assert row_counts(store) == before
            return
        assert len(results) == sum(1 for text in lines if text.strip())
        created = {r.notice_id for r in results if r.created}
        after = row_counts(store)
        assert after["notices"] == before["notices"] + len(created)
        assert after["notice_secrets"] == before["notice_secrets"] + len(created)
        assert notices_without_secrets(store.conn) == 0
        for result in results:
            assert store.conn.execute(
                "SELECT 1 FROM notices n JOIN notice_secrets s ON s.notice_id = n.id"
                " WHERE n.id = ? AND n.idempotency_key = ?",
                (result.notice_id, result.idempotency_key),
            ).fetchone()


# -- enqueue: the command line -----------------------------------------------------------

VALID_LINE = line_of(
    {"idempotency_key": "ok-1", "email": "ada@example.com", "reset_url": "https://s.example/r/x"}
)


@pytest.mark.parametrize(
    "lines",
    [
        ["not json", "{", "[1, 2]", "null"],
        [VALID_LINE, '{"idempotency_key": "k"', VALID_LINE.replace("ok-1", "ok-2"), "{}"],
        ['{"idempotency_key": "k2", "emial": "a@example.com", "reset_url": "http://x"}'],
    ],
    ids=["garbage", "valid-then-broken", "misspelt-field"],
)
def test_cli_bad_json_exits_2_with_one_line_per_problem(tmp_path: Path, lines: list[str]) -> None:
    """Bad JSON on stdin: exit 2, every stderr line `error: line N: field: …`, nothing written."""
    db = tmp_path / "resetctl.db"
    result = resetctl("enqueue", db=db, input="\n".join(lines) + "\n")
    assert result.returncode == 2, result.stderr
    assert result.stdout == ""
    assert "Traceback" not in result.stderr
    problems = result.stderr.splitlines()
    assert problems
    assert all(CLI_PROBLEM.fullmatch(p) for p in problems), problems
    with Store(db) as store:
        assert row_counts(store)["notices"] == 0


# -- config: Hypothesis over TOML-shaped documents ----------------------------------------

# Plain key names: a quoted TOML key with a newline is echoed verbatim
# (test_config_unknown_key_name_stays_on_one_line).
TOML_KEYS = st.text(string.ascii_lowercase + string.digits + "_-", min_size=1, max_size=10)
TOML_SCALARS = (
    st.text(max_size=12)
    | st.integers(-(2**63), 2**63 - 1)
    | st.floats()
    | st.booleans()
    | st.datetimes(timezones=st.none() | st.just(UTC))
    | st.dates()
    | st.times()
)
TOML_VALUES = st.recursive(
    TOML_SCALARS,
    lambda children: (
        st.lists(children, max_size=3) | st.dictionaries(TOML_KEYS, children, max_size=3)
    ),
    max_leaves=6,
)


def table(
    values: dict[str, st.SearchStrategy[Any]], random_values: st.SearchStrategy[Any]
) -> st.SearchStrategy[dict[str, Any]]:
    """A TOML table: some of its real keys, now and then a random key."""
    return st.builds(
        lambda fields, extra: {**extra, **fields},
        st.fixed_dictionaries({}, optional=values),
        mostly(st.just({}), st.dictionaries(TOML_KEYS, random_values, min_size=1, max_size=1)),
    )


def choice(
    valid: list[Any], invalid: list[Any], random_values: st.SearchStrategy[Any] = TOML_VALUES
) -> st.SearchStrategy[Any]:
    """Usually a valid value, sometimes a wrong one or anything at all."""
    return mostly(st.sampled_from(valid), st.sampled_from(invalid) | random_values)


BAD_DURATIONS = [0, -1, "ten", "", "10 minutes", True, float("inf"), float("nan")]
SCHEDULES = choice([[15, 45, 105], [10], ["5s", "20s"]], [[30, 20], [], [0], [400], "15"])
POLICY_VALUES: dict[str, st.SearchStrategy[Any]] = {
    "version": choice([1, 2], [0, -1, True, "1", 1.0]),
    "channels": choice(
        [["email", "sms"], ["sms"], ["sms", "email"], ["email"]], [["email", "email"], ["fax"], []]
    ),
    "ttl": choice(["10m", 600, "15m"], [*BAD_DURATIONS, "2m"]),
    "fallback_reserve": choice(["3m", 180, "4m"], [*BAD_DURATIONS, "1h"]),
    "send_reserve": choice(["30s", 10], BAD_DURATIONS),
    "on_poll_budget_spent": choice(["escalate", "expire"], ["retry", "ESCALATE"]),
    "retry_delays": choice([[10, 30], [], ["1m"]], [[30, 10], [-1]]),
    "lease": choice(["60s", 30], BAD_DURATIONS),
    "batch_size": choice([50, 1], [0, 1.0, -5]),
    "template_version": choice(["v1", "v2"], ["../v1", "", "v 1", "v/1"]),
    "alert_stalled_after": choice(["3m", 600], BAD_DURATIONS),
    "max_ttl": choice(["24h", 86400, "2d"], [*BAD_DURATIONS, "1m"]),
    "alert_mode": choice(["page", "observe"], ["loud", "Page"]),
    "alert_warning": choice(["1m", 30], BAD_DURATIONS),
    "supersede_older": choice([True, False], ["yes", 1, 0]),
    "email": mostly(table({"poll_delays": SCHEDULES}, TOML_VALUES), TOML_VALUES),
    "sms": mostly(
        table({"poll_delays": SCHEDULES, "max_segments": choice([1, 2], [0, 2.5])}, TOML_VALUES),
        TOML_VALUES,
    ),
}
POLICY_NAMES = mostly(st.sampled_from(["default", "apac", "eu"]), TOML_KEYS)
POLICY_TABLES = st.dictionaries(
    POLICY_NAMES,
    mostly(table(POLICY_VALUES, TOML_VALUES), TOML_VALUES),
    max_size=2,
)
CONFIGS = table(
    {
        "support_label": choice(["Acme support"], ["", " "]),
        "unknown_region": choice(["refuse", "default"], ["Default", "", "apac"]),
        "db": choice(["x.db"], [1]),
        "hash_key_file": choice(["/etc/key"], [[]]),
        "transport": mostly(
            table(
                {
                    "email": choice(sorted(BUILT_IN_TRANSPORTS), ["carrier-pigeon", ""]),
                    "sms": choice(sorted(BUILT_IN_TRANSPORTS), ["fax"]),
                },
                TOML_VALUES,
            ),
            TOML_VALUES,
        ),
        "policy": mostly(POLICY_TABLES, TOML_VALUES),
        # Outbox statuses stay scalar: an array or a table there crashes
        # (test_config_outbox_status_that_is_a_list_or_table_is_a_config_error).
        "outbox": table(
            {
                "email_status": choice(["accepted", "failed"], ["sent"], TOML_SCALARS),
                "sms_status": choice(["delivered", "pending"], ["read"], TOML_SCALARS),
            },
            TOML_SCALARS,
        ),
        "smtp": mostly(st.dictionaries(TOML_KEYS, TOML_VALUES, max_size=2), TOML_SCALARS),
        "twilio": mostly(st.dictionaries(TOML_KEYS, TOML_VALUES, max_size=2), TOML_SCALARS),
    },
    TOML_VALUES,
)


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(document=CONFIGS)
def test_any_config_document_gives_settings_or_a_config_error_naming_the_key(
    document: dict[str, Any],
) -> None:
    """A random config is Settings, or a ConfigError starting `dotted.key.path: `."""
    try:
        loaded = settings_from_mapping(document, "random.toml")
    except ConfigError as exc:
        message = str(exc)
    else:
        assert isinstance(loaded, Settings)
        assert "default" in loaded.policies
        return
    match = CONFIG_PROBLEM.fullmatch(message)
    assert match, message
    assert match[1] in document


@settings(max_examples=300, deadline=None)
@given(name=POLICY_NAMES, policy=table(POLICY_VALUES, TOML_VALUES))
def test_any_policy_table_gives_a_policy_or_a_config_error_naming_its_key(
    name: str, policy: dict[str, Any]
) -> None:
    """A random `[policy.<name>]` table is a policy, or a ConfigError under `policy.<name>`."""
    try:
        loaded = settings_from_mapping({"policy": {name: policy}}, "random.toml")
    except ConfigError as exc:
        message = str(exc)
    else:
        assert loaded.policies[name].name == name
        return
    assert CONFIG_PROBLEM.fullmatch(message), message
    assert message.startswith((f"policy.{name}.", f"policy.{name}:")), message


@pytest.mark.parametrize(
    "text",
    [
        "support_label = ",
        "[policy.default\nttl = '10m'\n",
        'support_label = "unterminated\n',
        "support_label = 'a'\nsupport_label = 'b'\n",
        "[policy.default]\n[policy.default]\n",
        "[policy.default]\nttl = 10m\n",
        "support_label = 'a' 'b'\n",
    ],
    ids=[
        "no-value",
        "unclosed-table",
        "unterminated",
        "duplicate-key",
        "duplicate-table",
        "bare-duration",
        "two-values",
    ],
)
def test_config_file_with_a_toml_syntax_error_names_the_file(tmp_path: Path, text: str) -> None:
    """A TOML syntax error is a one-line ConfigError naming the file."""
    path = tmp_path / "bad.toml"
    path.write_text(text, encoding="utf-8")
    with pytest.raises(ConfigError) as caught:
        load_settings(path)
    assert str(caught.value).startswith(f"config {path}: ")
    assert "\n" not in str(caught.value)


# -- replay: Hypothesis over trace lines -------------------------------------------------

TRACE_KEYS = st.sampled_from(sorted(TRACE_FIELDS)) | RANDOM_KEYS
RAW_STATUSES = st.sampled_from(
    ["queued", "delivered", "bounced", "sent", "failed", "undelivered", "mystery", ""]
)
#: A valid timeline: offsets never decrease.
TIMELINES = st.lists(
    st.tuples(st.integers(0, 200) | st.floats(0, 300), RAW_STATUSES), max_size=4
).map(lambda pairs: [[offset, raw] for offset, raw in sorted(pairs, key=lambda pair: pair[0])])
TRANSPORTS = st.fixed_dictionaries(
    {},
    optional={
        "email": st.sampled_from(["postmark", "outbox", "smtp"]),
        "sms": st.sampled_from(["twilio", "outbox"]),
    },
)


def arrival(trace: dict[str, Any]) -> float:
    """A valid trace's arrival time, to sort by."""
    return float(trace["arrived_at"])


VALID_TRACE_LINES = st.lists(
    st.fixed_dictionaries(
        {
            "trace_id": st.sampled_from(["t1", "t2", "0000001"]),
            "arrived_at": st.integers(0, 10_000) | st.floats(0, 1e6),
            "ttl": st.sampled_from([600, 180.5, 1e-3, 1e12]),
        },
        optional={
            "region": st.sampled_from(["default", "apac"]),
            "email": TIMELINES,
            "sms": TIMELINES,
            "transport": TRANSPORTS,
        },
    ),
    max_size=4,
).map(lambda traces: [line_of(t) for t in sorted(traces, key=arrival)])
BAD_TIMELINES = st.lists(
    mostly(st.tuples(st.integers(-1, 200) | st.floats(), RAW_STATUSES).map(list), JSON_VALUES),
    max_size=4,
)
TRACES = st.builds(
    lambda fields, extra: {**fields, **extra},
    st.fixed_dictionaries(
        {
            "trace_id": mostly(st.sampled_from(["t1", "t2"]), st.just("") | JSON_VALUES),
            "arrived_at": mostly(st.sampled_from([0, 1.5, 10, 60]), st.just(-1) | JSON_VALUES),
            "ttl": mostly(st.sampled_from([600, 180.5]), st.sampled_from([0, -60]) | JSON_VALUES),
        },
        optional={
            "region": mostly(st.sampled_from(["default", "apac"]), st.just("") | JSON_VALUES),
            "email": mostly(TIMELINES, BAD_TIMELINES | JSON_VALUES),
            "sms": mostly(TIMELINES, BAD_TIMELINES | JSON_VALUES),
            "transport": mostly(
                TRANSPORTS,
                st.fixed_dictionaries({}, optional={"email": JSON_VALUES, "sms": JSON_VALUES})
                | JSON_VALUES,
            ),
        },
    ),
    mostly(st.just({}), st.dictionaries(TRACE_KEYS, JSON_VALUES, min_size=1, max_size=1)),
)
OTHER_TRACE_LINES = mostly(
    TRACES.map(line_of),
    st.one_of(
        JSON_VALUES.map(line_of),
        st.text(max_size=30),
        st.sampled_from(["", "  ", "{", "[]", '{"trace_id": "t"', "NaN"]),
    ),
)


def insert_lines(valid: list[str], others: list[tuple[int, str]]) -> list[str]:
    """``valid`` in order, with each other line inserted at its chosen position."""
    lines = list(valid)
    for position, text in others:
        lines.insert(position % (len(lines) + 1), text)
    return lines


TRACE_LINES = st.builds(
    insert_lines,
    VALID_TRACE_LINES,
    st.lists(st.tuples(st.integers(0, 8), OTHER_TRACE_LINES), max_size=2),
)


@settings(max_examples=300, deadline=None)
@given(lines=TRACE_LINES)
def test_trace_lines_parse_or_raise_input_error_naming_the_first_bad_line(
    lines: list[str],
) -> None:
    """Random trace lines: traces, or one `line N: field: …` InputError at the first bad line."""
    rejected: InputError | None = None
    try:
        traces = list(read_traces(lines, Counter()))
    except InputError as exc:
        rejected = exc
    if rejected is not None:
        [problem] = rejected.problems
        number = line_number(problem)
        assert 1 <= number <= len(lines)
        assert lines[number - 1].strip()
        list(read_traces(lines[: number - 1], Counter()))
        return
    assert len(traces) == sum(1 for text in lines if text.strip())
    assert [t.arrived_at for t in traces] == sorted(t.arrived_at for t in traces)


def test_cli_replay_bad_trace_line_exits_2_with_one_line(tmp_path: Path) -> None:
    """`replay` on a file with a bad second line: exit 2, one stderr line naming it."""
    path = tmp_path / "traces.jsonl"
    path.write_text(
        line_of({"trace_id": "t1", "arrived_at": 5, "ttl": 600})
        + "\n"
        + line_of({"trace_id": "t2", "arrived_at": 1, "ttl": 600})
        + "\n",
        encoding="utf-8",
    )
    result = resetctl("replay", str(path))
    assert result.returncode == 2
    assert result.stdout == ""
    line = assert_one_line_error(result, "error: line 2: arrived_at: ")
    assert CLI_PROBLEM.fullmatch(line)


# -- the database file -------------------------------------------------------------------


@pytest.mark.parametrize(
    ("args", "stdin"),
    [(["enqueue"], VALID_LINE), (["inspect", "ntc_0"], None), (["outbox", "list"], None)],
    ids=["enqueue", "inspect", "outbox-list"],
)
def test_db_in_a_missing_directory_exits_1_with_one_line(
    tmp_path: Path, args: list[str], stdin: str | None
) -> None:
    """`--db` in a directory that does not exist: exit 1, one `error: database …` line."""
    db = tmp_path / "no-such-dir" / "resetctl.db"
    result = resetctl(*args, "--db", str(db), input=stdin)
    assert result.returncode == 1
    assert result.stdout == ""
    assert_one_line_error(result, f"error: database {db}: ")
    assert not db.parent.exists()


def python_child(
    args: list[str], stdin: str | None = None, preexec_fn: Callable[[], None] | None = None
) -> subprocess.CompletedProcess[str]:
    """`python ARGS` in a child, set up by ``preexec_fn`` (conftest's helper takes none)."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("RESETCTL_")}
    return subprocess.run(
        [sys.executable, *args],
        input=stdin,
        capture_output=True,
        text=True,
        env=env,
        timeout=120,
        preexec_fn=preexec_fn,
        check=False,
    )


_PR_CAPBSET_DROP = 24
#: CAP_DAC_OVERRIDE, CAP_DAC_READ_SEARCH, CAP_FOWNER: what lets root ignore file modes.
_ROOT_FILE_CAPABILITIES = (1, 2, 3)


def _obey_file_modes() -> None:
    """In the child before exec: root drops what lets it ignore permission bits."""
    libc = ctypes.CDLL(None, use_errno=True)
    for capability in _ROOT_FILE_CAPABILITIES:
        if libc.prctl(_PR_CAPBSET_DROP, capability, 0, 0, 0) != 0:
            raise OSError(ctypes.get_errno(), "prctl(PR_CAPBSET_DROP)")


def _digest_dir(directory: Path) -> dict[str, str]:
    """Every file in ``directory`` by name, with a hash of its bytes."""
    return {p.name: hashlib.sha256(p.read_bytes()).hexdigest() for p in directory.iterdir()}


@contextmanager
def read_only(directory: Path) -> Iterator[None]:
    """The directory and its files are read-only (SQLite's WAL needs to create files)."""
    files = list(directory.iterdir())
    for path in files:
        path.chmod(0o444)
    directory.chmod(0o555)
    try:
        yield
    finally:
        directory.chmod(0o755)
        for path in files:
            path.chmod(0o644)


def test_read_only_database_enqueue_exits_1_and_changes_nothing(tmp_path: Path) -> None:
    """A read-only database file and directory: exit 1, one line, not a byte changed."""
    directory = tmp_path / "ro"
    directory.mkdir()
    db = directory / "resetctl.db"
    with Store(db) as store:
        enqueue_lines(store, SETTINGS, [line_of(SEED)], T0)
    before = _digest_dir(directory)
    # Root ignores permission bits; its children drop the capabilities that allow that.
    as_user = _obey_file_modes if os.geteuid() == 0 else None
    with read_only(directory):
        probe = python_child(["-c", f"open({str(db)!r}, 'r+b')"], preexec_fn=as_user)
        if probe.returncode == 0:
            pytest.skip("this user can still write a file with mode 0o444")
        result = python_child(
            ["-m", "resetctl", "enqueue", "--db", str(db)], VALID_LINE, preexec_fn=as_user
        )
    assert result.returncode == 1, result.stderr
    assert result.stdout == ""
    assert_one_line_error(result, f"error: database {db}: ")
    assert _digest_dir(directory) == before


def big_requests(prefix: str, count: int) -> list[str]:
    """Requests with long URLs and names, so a batch needs hundreds of kilobytes."""
    return [
        line_of(
            {
                "idempotency_key": f"{prefix}-{i}",
                "email": f"user{i}@example.com",
                "reset_url": f"https://shop.example/r/{prefix}-{i}-" + "t" * 1500,
                "display_name": "n" * 90,
            }
        )
        for i in range(count)
    ]


@pytest.mark.parametrize("headroom", [8 * 1024, 256 * 1024], ids=["8KiB", "256KiB"])
def test_full_disk_enqueue_exits_1_and_writes_all_or_nothing(tmp_path: Path, headroom: int) -> None:
    """Writes past RLIMIT_FSIZE fail: exit 1, one `error: database …` line, batch all or none."""
    db = tmp_path / "resetctl.db"
    with Store(db) as store:
        enqueue_lines(store, SETTINGS, big_requests("seed", 50), T0)
    limit = max(p.stat().st_size for p in tmp_path.iterdir()) + headroom

    def limit_file_size() -> None:
        # Ignored, SIGXFSZ no longer kills the child: the write fails with EFBIG instead.
        signal.signal(signal.SIGXFSZ, signal.SIG_IGN)
        resource.setrlimit(resource.RLIMIT_FSIZE, (limit, limit))

    batch = big_requests("batch", 400)
    result = python_child(
        ["-m", "resetctl", "enqueue", "--db", str(db)],
        "\n".join(batch) + "\n",
        preexec_fn=limit_file_size,
    )
    assert result.returncode == 1, result.stderr
    assert result.stdout == ""
    line = assert_one_line_error(result, f"error: database {db}: ")
    assert re.search(r"disk I/O error|disk is full", line), line
    with Store(db) as store:
        (written,) = store.conn.execute(
            "SELECT count(*) FROM notices WHERE idempotency_key LIKE 'batch-%'"
        ).fetchone()
        assert written in (0, len(batch))
        assert row_counts(store)["notices"] == 50 + written
        assert notices_without_secrets(store.conn) == 0
        # The file is still usable once space comes back.
        assert len(enqueue_lines(store, SETTINGS, big_requests("after", 3), T0)) == 3


# -- odd ids -----------------------------------------------------------------------------

ODD_IDS = ["ntc_" + "9" * 10_000, "ntc_ü✓🙂", "ntc_\"q'uoted", "[bold]ntc[/bold]", "ntc\nsecond"]


@pytest.mark.parametrize(
    ("command", "prefix"),
    [(["inspect"], "error: no notice "), (["outbox", "show"], "error: no outbox message ")],
    ids=["inspect", "outbox-show"],
)
@pytest.mark.parametrize("odd_id", ODD_IDS, ids=["long", "unicode", "quotes", "markup", "newline"])
def test_unknown_odd_id_exits_1_with_one_line(
    tmp_path: Path, command: list[str], prefix: str, odd_id: str
) -> None:
    """`inspect` / `outbox show` with a strange unknown id: exit 1, one line."""
    Store(tmp_path / "resetctl.db").close()  # reading commands never create the database
    result = resetctl(*command, odd_id, db=tmp_path / "resetctl.db")
    assert result.returncode == 1
    assert result.stdout == ""
    assert_one_line_error(result, prefix)


# -- bugs found: strict xfails -----------------------------------------------------------

#: More digits than int() converts (sys.get_int_max_str_digits() is 4300).
HUGE = "1" * 5000
#: Deeper than json.loads recurses.
DEEP = "[" * 100_000 + "]" * 100_000


def rejection(call: Callable[[], object]) -> list[str]:
    """The problems of the InputError ``call`` raises."""
    with pytest.raises(InputError) as caught:
        call()
    return caught.value.problems


@pytest.mark.parametrize("text", [HUGE, DEEP], ids=["huge-int", "deep-nesting"])
def test_enqueue_unparseable_number_or_nesting_is_an_input_error(store: Store, text: str) -> None:
    """A line json.loads cannot build is `line 1: (line): …`, not a crash."""
    with pytest.raises(InputError, match=r"^line 1: \(line\): "):
        enqueue_lines(store, SETTINGS, [text], T0)


def test_enqueue_huge_integer_ttl_is_an_input_error(store: Store) -> None:
    """A ttl too large for a float is a `ttl` problem."""
    with pytest.raises(InputError, match=r"^line 1: ttl: "):
        enqueue_lines(store, SETTINGS, [line_of({**SEED, "ttl": 10**400})], T0)


def test_enqueue_reset_url_with_an_unclosed_ipv6_host_is_an_input_error(store: Store) -> None:
    """`https://[::1/r` is a `reset_url` problem."""
    with pytest.raises(InputError, match=r"^line 1: reset_url: "):
        enqueue_lines(store, SETTINGS, [line_of({**SEED, "reset_url": "https://[::1/r"})], T0)


@pytest.mark.parametrize("field", ["idempotency_key", "display_name", "account_ref"])
def test_enqueue_lone_surrogate_is_an_input_error(store: Store, field: str) -> None:
    """A string with a lone surrogate escape is a problem of its field."""
    text = line_of({**SEED, field: "x"}).replace('"x"', '"\\ud800"')
    with pytest.raises(InputError, match=rf"^line 1: {field}: "):
        enqueue_lines(store, SETTINGS, [text], T0)
    assert row_counts(store)["notices"] == 0


@pytest.mark.parametrize(
    "text",
    [
        HUGE,
        DEEP,
        line_of({**SEED, "ttl": 10**400}),
        line_of({**SEED, "reset_url": "https://[::1/r"}),
        line_of(SEED).replace('"k1"', '"\\ud800"'),
    ],
    ids=["huge-int", "deep-nesting", "huge-ttl", "ipv6-url", "surrogate"],
)
def test_cli_enqueue_crashing_lines_exit_2_without_a_traceback(tmp_path: Path, text: str) -> None:
    """What a user sees of the bugs above: a traceback and exit 1 instead of exit 2."""
    result = resetctl("enqueue", db=tmp_path / "resetctl.db", input=text + "\n")
    assert result.returncode == 2
    assert_one_line_error(result, "error: line 1: ")


@pytest.mark.parametrize("door", ["enqueue", "replay"])
@pytest.mark.parametrize(
    "name", ["a\nb", "a:b", "\x1b[2J", ""], ids=["newline", "colon", "escape", "empty"]
)
def test_unknown_field_name_stays_on_one_line(store: Store, door: str, name: str) -> None:
    """An unknown field's name never breaks the one-line `line N: field: problem` shape."""
    if door == "enqueue":
        problems = rejection(
            lambda: enqueue_lines(store, SETTINGS, [line_of({**SEED, name: 1})], T0)
        )
    else:
        problems = rejection(
            lambda: list(read_traces([line_of({"trace_id": "t", name: 1})], Counter()))
        )
    assert all(PROBLEM.fullmatch(p) for p in problems), problems


@pytest.mark.parametrize(
    "text",
    [
        line_of({"trace_id": "t", "arrived_at": 10**400, "ttl": 600}),
        line_of({"trace_id": "t", "arrived_at": 1, "ttl": 10**400}),
        line_of({"trace_id": "t", "arrived_at": 1, "ttl": 600, "email": [[10**400, "sent"]]}),
        HUGE,
        DEEP,
    ],
    ids=["huge-arrival", "huge-ttl", "huge-offset", "huge-int-line", "deep-nesting"],
)
def test_trace_line_with_a_huge_number_or_deep_nesting_is_an_input_error(text: str) -> None:
    """A trace number too big for a float, or an unparseable line, is `line 1: …`."""
    with pytest.raises(InputError, match=r"^line 1: "):
        list(read_traces([text], Counter()))


def test_cli_replay_non_utf8_trace_file_exits_2(tmp_path: Path) -> None:
    """A trace file that is not UTF-8: exit 2 with one line, no traceback."""
    path = tmp_path / "traces.jsonl"
    path.write_bytes(line_of({"trace_id": "t", "arrived_at": 1, "ttl": 600}).encode() + b"\n\xff\n")
    result = resetctl("replay", str(path))
    assert result.returncode == 2
    assert_one_line_error(result, "error: ")


@pytest.mark.parametrize("value", [["accepted"], {"a": 1}], ids=["array", "table"])
def test_config_outbox_status_that_is_a_list_or_table_is_a_config_error(value: object) -> None:
    """`[outbox] email_status = ["accepted"]` is a ConfigError naming the key."""
    with pytest.raises(ConfigError, match=r"^outbox\.email_status: "):
        settings_from_mapping({"outbox": {"email_status": value}})


def test_config_file_that_is_not_utf8_is_a_config_error(tmp_path: Path) -> None:
    """A config file that is not UTF-8 is a ConfigError naming the file."""
    path = tmp_path / "latin1.toml"
    path.write_bytes('support_label = "Café"\n'.encode("latin-1"))
    with pytest.raises(ConfigError, match=rf"^config {re.escape(str(path))}: "):
        load_settings(path)


def test_config_template_version_with_a_trailing_newline_is_refused() -> None:
    """`template_version = "v1\\n"` is refused at load, as render would refuse it."""
    with pytest.raises(ConfigError, match=r"^policy\.default\.template_version: "):
        settings_from_mapping({"policy": {"default": {"template_version": "v1\n"}}})


@pytest.mark.parametrize(
    "document",
    [{"a\nb": 1}, {"policy": {"default": {"a\nb": 1}}}, {"policy": {"a\nb": 1}}],
    ids=["top-level-key", "policy-key", "policy-name"],
)
def test_config_unknown_key_name_stays_on_one_line(document: dict[str, Any]) -> None:
    """`"a\nb" = 1` (valid TOML) gives a ConfigError on one line."""
    with pytest.raises(ConfigError) as caught:
        settings_from_mapping(document)
    assert "\n" not in str(caught.value)


def test_config_strategy_covers_every_policy_key() -> None:
    """The random policy tables draw from every real key (new keys get fuzzed too)."""
    assert set(POLICY_VALUES) == set(DEFAULT_POLICY)
