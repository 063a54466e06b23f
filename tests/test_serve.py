"""`resetctl serve` as a real process on loopback: the intake's idempotency rules and
statuses, its tokens and scopes, its limits, and every route's document against the one
the command line prints for the same database.

One server serves the module (each test uses its own keys); the tests that need a server
refused at start run their own."""

from __future__ import annotations

import base64
import json
import socket
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

import httpx
import pytest
from prometheus_client.parser import text_string_to_metric_families
from serving import TOKENS, Server, bearer, resetctl_json, run_serve, serve_process, write_tokens

from resetctl import api

pytestmark = pytest.mark.slow

CONFIG = """\
[serve]
tokens_file = "tokens.toml"
public = ["/healthz"]
[twilio]
status_callback = "https://hooks.acme.example/twilio"
[policy.default]
channels = ["email", "sms"]
[policy.limited]
channels = ["email"]
[policy.limited.limits]
per_recipient = 1
per_recipient_window = "1h"
[policy.consented]
channels = ["sms"]
[policy.consented.sms]
requires_consent = true
"""
#: Contact data and a link that must never come back in an answer or a log line.
CANARY_EMAIL = "canary.person@example.com"
CANARY_PHONE = "+14155550199"
CANARY_URL = "https://shop.example/reset/CANARY-SECRET-7f3a"
TWILIO_TOKEN = "twilio-auth-token-for-serve-tests"
#: Seconds a document computed from "now" (remaining lifetime, ages, lag) may differ by
#: between the server's answer and the command's run a moment later.
SLACK = 15.0
#: Fields computed from the moment the document is made.
NOW_FIELDS = frozenset(
    {
        "remaining_seconds",
        "state_age_seconds",
        "due_in_seconds",
        "seconds_to_fallback_deadline",
        "sweep_lag_seconds",
        "seconds_since_last_sweep",
    }
)


class Served:
    """The module's server, its database and config, and a client for it."""

    def __init__(self, server: Server, db: Path, config: Path) -> None:
        self.server = server
        self.db = db
        self.config = config
        self.http = httpx.Client(base_url=server.base, timeout=30)

    def enqueue(
        self, body: dict[str, Any], key: str | None, *, caller: str = "app", query: str = ""
    ) -> httpx.Response:
        headers = {**bearer(caller), "Content-Type": "application/json"}
        if key is not None:
            headers["Idempotency-Key"] = key
        return self.http.post(f"/v1/notices{query}", content=json.dumps(body), headers=headers)

    def get(self, path: str, caller: str | None = "reader") -> httpx.Response:
        return self.http.get(path, headers=bearer(caller) if caller else {})

    def cli(self, *args: str) -> Any:
        return resetctl_json(self.db, self.config, *args)


@pytest.fixture(scope="module")
def served(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Served]:
    directory = tmp_path_factory.mktemp("serve")
    config = directory / "resetctl.toml"
    config.write_text(CONFIG, encoding="utf-8")
    write_tokens(directory / "tokens.toml")
    db = directory / "resetctl.db"
    api.init_database(db, config)
    env = {"TWILIO_AUTH_TOKEN": TWILIO_TOKEN}
    with serve_process(db, config, env=env) as server:
        client = Served(server, db, config)
        yield client
        client.http.close()


def request(**fields: Any) -> dict[str, Any]:
    """An enqueue body (no idempotency key: the header carries it)."""
    n = uuid.uuid4().hex[:12]
    body = {"email": f"user-{n}@example.com", "reset_url": f"https://shop.example/r/{n}"}
    body.update(fields)
    return {k: v for k, v in body.items() if v is not None}


def new_key() -> str:
    return f"serve-{uuid.uuid4().hex[:12]}"


def assert_same(served: Any, printed: Any, where: str = "") -> None:
    """``served`` is ``printed``: the same keys in the same order and the same values,
    where a value computed from now may differ by SLACK seconds."""
    if isinstance(printed, dict):
        assert isinstance(served, dict), where
        assert list(served) == list(printed), where
        for key, value in printed.items():
            assert_same(served[key], value, f"{where}.{key}")
    elif isinstance(printed, list):
        assert isinstance(served, list), where
        assert len(served) == len(printed), where
        for i, (one, other) in enumerate(zip(served, printed, strict=True)):
            assert_same(one, other, f"{where}[{i}]")
    elif where.rpartition(".")[2] in NOW_FIELDS and isinstance(printed, int | float):
        assert abs(served - printed) <= SLACK, where
    else:
        assert served == printed, where


def test_a_new_key_is_201_with_the_enqueue_line(served: Served) -> None:
    """A new Idempotency-Key: 201, the line `resetctl enqueue` prints, and its Location."""
    key = new_key()
    response = served.enqueue(request(account_ref="acct-201"), key)
    assert response.status_code == 201
    line = response.json()
    assert list(line) == ["notice_id", "idempotency_key", "created"]
    assert (line["idempotency_key"], line["created"]) == (key, True)
    assert response.text == json.dumps(line) + "\n"
    assert response.headers["Location"] == f"/v1/notices/{line['notice_id']}"
    assert served.get(response.headers["Location"]).json()["phase"] == "queued"


def test_the_same_key_and_body_is_200_with_the_stored_notice(served: Served) -> None:
    """The same key and body again: 200 and the same notice (the body may name the key too)."""
    key, body = new_key(), request()
    first = served.enqueue(body, key)
    again = served.enqueue(body, key)
    named = served.enqueue({**body, "idempotency_key": key}, key)
    assert (first.status_code, again.status_code, named.status_code) == (201, 200, 200)
    notice_id = first.json()["notice_id"]
    assert again.json() == {"notice_id": notice_id, "idempotency_key": key, "created": False}
    assert named.json() == again.json()
    assert "Location" not in again.headers


def test_the_same_key_with_another_body_is_409_and_changes_nothing(served: Served) -> None:
    """The key with different fields: 409 naming idempotency_key; nothing changes."""
    key, body = new_key(), request(account_ref="acct-409")
    notice_id = served.enqueue(body, key).json()["notice_id"]
    before = served.get(f"/v1/notices/{notice_id}").json()
    changed = served.enqueue({**body, "reset_url": CANARY_URL}, key)
    assert changed.status_code == 409
    assert changed.json() == {
        "error": "conflict",
        "problem": "already used with different fields",
        "field": "idempotency_key",
    }
    assert CANARY_URL not in changed.text
    after = served.get(f"/v1/notices/{notice_id}").json()
    assert after["history"] == before["history"]
    listed = served.get("/v1/notices?account=acct-409").json()
    assert [row["notice_id"] for row in listed] == [notice_id]


def test_a_body_naming_another_key_than_the_header_is_422(served: Served) -> None:
    """A body naming another key than the header: 422 on idempotency_key, nothing stored."""
    key = new_key()
    response = served.enqueue(request(idempotency_key="other-" + key), key)
    assert response.status_code == 422
    assert response.json()["field"] == "idempotency_key"
    assert served.enqueue(request(), "other-" + key).status_code == 201  # not taken


def test_no_idempotency_key_header_is_400(served: Served) -> None:
    """The header is required, even when the body names a key."""
    response = served.enqueue(request(idempotency_key=new_key()), None)
    assert response.status_code == 400
    assert response.json()["field"] == "Idempotency-Key"


def test_an_invalid_field_is_422_naming_it_without_its_value(served: Served) -> None:
    """Every invalid field is 422 with its problem, never its value; nothing is stored."""
    key = new_key()
    bad = request(email="not an address " + CANARY_EMAIL, phone="12", reset_url="http://x.example/")
    response = served.enqueue(bad, key)
    assert response.status_code == 422
    document = response.json()
    fields = [p["field"] for p in document["problems"]]
    assert set(fields) == {"email", "phone", "reset_url"}
    assert document["field"] == fields[0]
    assert CANARY_EMAIL not in response.text
    assert "x.example" not in response.text
    assert served.enqueue(request(), key).status_code == 201
    assert served.enqueue([1, 2], new_key()).status_code == 422  # type: ignore[arg-type]


def test_a_rate_limited_request_is_429_with_its_line(served: Served) -> None:
    """Over a per-recipient limit: 429, the refused line, no Retry-After; nothing stored."""
    email = f"limited-{uuid.uuid4().hex[:8]}@example.com"
    assert served.enqueue(request(email=email, region="limited"), new_key()).status_code == 201
    key = new_key()
    refused = served.enqueue(request(email=email, region="limited"), key)
    assert refused.status_code == 429
    assert refused.json() == {
        "notice_id": None,
        "idempotency_key": key,
        "created": False,
        "refused": "rate_limited",
        "field": "email",
    }
    assert "Retry-After" not in refused.headers
    assert email not in refused.text
    assert served.enqueue(request(email=email, region="limited"), key).status_code == 429


def test_a_policy_refusal_is_422_with_its_line(served: Served) -> None:
    """A policy refusal (no consent for the only channel): 422 with the refused line."""
    key = new_key()
    body = request(email=None, phone=CANARY_PHONE, region="consented", consent=[])
    response = served.enqueue(body, key)
    assert response.status_code == 422
    assert response.json() == {
        "notice_id": None,
        "idempotency_key": key,
        "created": False,
        "refused": "no_consent",
        "field": "consent",
    }
    assert CANARY_PHONE not in response.text


def test_send_1_makes_the_first_submission(served: Served) -> None:
    """?send=1 submits and says so; a retry of the key says already_terminal, sends nothing."""
    key, body = new_key(), request()
    first = served.enqueue(body, key, query="?send=1")
    assert first.status_code == 201
    line = first.json()
    assert (line["submitted"], line["reason"], line["phase"]) == (True, None, "accepted")
    again = served.enqueue(body, key, query="?send=1")
    assert again.status_code == 200
    assert again.json() == {
        **line,
        "created": False,
        "submitted": False,
        "reason": "already_terminal",
    }
    report = served.get(f"/v1/notices/{line['notice_id']}").json()
    assert [a["calls"] for a in report["attempts"]] == [1]
    assert served.enqueue(request(), new_key(), query="?send=maybe").status_code == 422


def test_no_token_or_an_unknown_one_is_401(served: Served) -> None:
    """No token: 401 with a Bearer challenge; an unknown or altered one: 401 invalid_token."""
    token = TOKENS["reader"][0]
    for headers, challenge in [
        ({}, 'Bearer realm="resetctl"'),
        ({"Authorization": "Bearer " + "z" * 40}, 'Bearer realm="resetctl", error="invalid_token"'),
        (
            {"Authorization": "Bearer " + token[:-1] + "x"},
            'Bearer realm="resetctl", error="invalid_token"',
        ),
        ({"Authorization": token}, 'Bearer realm="resetctl", error="invalid_token"'),
    ]:
        response = served.http.get("/v1/notices", headers=headers)
        assert response.status_code == 401
        assert response.headers["WWW-Authenticate"] == challenge
        assert token not in response.text
    assert served.get("/v1/notices").status_code == 200


def test_a_token_without_the_scope_is_403(served: Served) -> None:
    """Each route takes its scope: enqueue needs enqueue, reads read, a cancel cancel."""
    notice_id = served.enqueue(request(), new_key()).json()["notice_id"]
    cancel = f"/v1/notices/{notice_id}/cancel"
    refused = [
        served.enqueue(request(), new_key(), caller="reader"),
        served.get(f"/v1/notices/{notice_id}", caller="app"),
        served.get("/v1/health", caller="app"),
        served.get("/metrics", caller="app"),
        served.http.post(cancel, headers=bearer("reader")),
    ]
    assert [r.status_code for r in refused] == [403] * 5
    assert refused[0].json()["problem"] == "token reader lacks the enqueue scope"
    assert 'error="insufficient_scope", scope="enqueue"' in refused[0].headers["WWW-Authenticate"]
    assert served.http.post(cancel, headers=bearer("oncall")).status_code == 200


def test_basic_credentials_do_not_open_the_api(served: Served) -> None:
    """The page's Basic credentials never open /v1 (no cross-site enqueue or cancel)."""
    basic = base64.b64encode(f"me:{TOKENS['oncall'][0]}".encode()).decode()
    response = served.http.get("/v1/notices", headers={"Authorization": f"Basic {basic}"})
    assert response.status_code == 401
    assert served.http.get("/", headers={"Authorization": f"Basic {basic}"}).status_code == 200


def test_the_audit_log_names_the_token_and_never_a_secret(served: Served) -> None:
    """The audit line names token, route and status; no token, contact or link is logged."""
    key = new_key()
    body = request(email=CANARY_EMAIL, phone=CANARY_PHONE, reset_url=CANARY_URL)
    notice_id = served.enqueue(body, key).json()["notice_id"]
    served.enqueue({**body, "reset_url": CANARY_URL + "x"}, key)
    served.http.get("/v1/notices", headers={"Authorization": "Bearer " + TOKENS["app"][0] + "x"})
    log = served.server.log
    assert f"audit token=app route=enqueue status=201 notice_id={notice_id}" in log
    assert "audit token=app route=enqueue status=409" in log
    assert "audit route=list status=401" in log
    for secret in [CANARY_EMAIL, CANARY_PHONE, CANARY_URL, TWILIO_TOKEN]:
        assert secret not in log
    for token, _ in TOKENS.values():
        assert token not in log


def test_a_tokens_file_others_can_read_is_refused_at_start(tmp_path: Path) -> None:
    """A tokens file others may read: exit 2 before listening, naming the file and the fix."""
    config = tmp_path / "resetctl.toml"
    config.write_text('[serve]\ntokens_file = "tokens.toml"\n', encoding="utf-8")
    tokens = write_tokens(tmp_path / "tokens.toml", mode=0o644)
    db = tmp_path / "resetctl.db"
    api.init_database(db, config)
    done = run_serve(db, config)
    assert done.returncode == 2
    assert done.stderr.splitlines() == [
        f"error: serve.tokens_file: {tokens} is accessible by group or others (mode 0644);"
        f" run chmod 600 {tokens}"
    ]
    assert TOKENS["app"][0] not in done.stderr


def test_a_missing_or_bad_tokens_file_is_refused_at_start(tmp_path: Path) -> None:
    """No tokens file, a missing one, a short token, an unknown scope: exit 2, one line."""
    db = tmp_path / "resetctl.db"
    config = tmp_path / "resetctl.toml"
    config.write_text("", encoding="utf-8")
    api.init_database(db, config)
    tokens = tmp_path / "tokens.toml"
    cases = [
        ("", None, "error: serve: set [serve] tokens_file in the config"),
        ('[serve]\ntokens_file = "tokens.toml"\n', None, "cannot read"),
        (None, '[tokens.a]\ntoken = "short"\nscopes = ["read"]\n', "at least 32 characters"),
        (None, f'[tokens.a]\ntoken = "{"t" * 40}"\nscopes = ["admin"]\n', "a.scopes"),
    ]
    for text, tokens_text, expected in cases:
        if text is not None:
            config.write_text(text, encoding="utf-8")
        if tokens_text is not None:
            tokens.write_text(tokens_text, encoding="utf-8")
            tokens.chmod(0o600)
        done = run_serve(db, config)
        assert done.returncode == 2, done.stderr
        assert len(done.stderr.splitlines()) == 1, done.stderr
        assert expected in done.stderr
    assert "t" * 40 not in done.stderr


def test_a_body_over_64_kib_is_413_before_it_is_sent(served: Served) -> None:
    """A Content-Length over 64 KiB is 413 from the headers alone; 64 KiB itself is read."""
    host, port = urlsplit(served.server.base).hostname, urlsplit(served.server.base).port
    assert host is not None
    assert port is not None
    head = (
        "POST /v1/notices HTTP/1.1\r\nHost: localhost\r\nContent-Type: application/json\r\n"
        f"Authorization: Bearer {TOKENS['app'][0]}\r\nIdempotency-Key: {new_key()}\r\n"
        f"Content-Length: {100 * 2**20}\r\n\r\n"
    )
    with socket.create_connection((host, port), timeout=30) as sock:
        sock.sendall(head.encode())
        reply = b""
        while b"\r\n\r\n" not in reply:
            chunk = sock.recv(4096)
            if not chunk:
                break
            reply += chunk
    assert reply.startswith(b"HTTP/1.1 413 "), reply
    body = request()
    body["display_name"] = ""
    padding = 64 * 1024 - len(json.dumps(body))
    body["display_name"] = "x" * padding
    assert len(json.dumps(body)) == 64 * 1024
    at_limit = served.enqueue(body, new_key())
    assert at_limit.status_code == 422
    assert at_limit.json()["field"] == "display_name"


def test_a_body_that_is_not_json_is_refused(served: Served) -> None:
    """Another media type: 415; JSON that does not parse: 400 naming the body."""
    headers = {**bearer("app"), "Idempotency-Key": new_key()}
    form = served.http.post(
        "/v1/notices", content="a=b", headers={**headers, "Content-Type": "text/plain"}
    )
    broken = served.http.post(
        "/v1/notices", content="{", headers={**headers, "Content-Type": "application/json"}
    )
    assert (form.status_code, broken.status_code) == (415, 400)
    assert broken.json()["field"] == "(body)"


def test_inspect_is_the_document_inspect_json_prints(served: Served) -> None:
    """GET /v1/notices/{id} is `inspect --json`; an unknown id 404 without echoing it."""
    line = served.enqueue(request(phone="+14155550123"), new_key(), query="?send=1").json()
    notice_id = line["notice_id"]
    answered = served.get(f"/v1/notices/{notice_id}").json()
    printed = served.cli("inspect", notice_id, "--json")
    assert answered["attempts"]
    assert_same(answered, printed)
    missing = served.get("/v1/notices/ntc_nothing" + CANARY_EMAIL)
    assert missing.status_code == 404
    assert CANARY_EMAIL not in missing.text


def test_list_is_the_document_list_json_prints(served: Served) -> None:
    """GET /v1/notices?filters is `list --json` with those options; a bad filter is 422."""
    account = f"acct-{uuid.uuid4().hex[:8]}"
    for _ in range(3):
        served.enqueue(request(account_ref=account), new_key())
    cases = [
        (f"?account={account}&limit=2", ["--account", account, "--limit", "2"]),
        (
            "?phase=queued&phase=accepted&since=1h",
            ["--phase", "queued", "--phase", "accepted", "--since", "1h"],
        ),
        ("?at_risk=1", ["--at-risk"]),
        ("?region=limited", ["--region", "limited"]),
    ]
    for query, options in cases:
        answered = served.get(f"/v1/notices{query}").json()
        assert_same(answered, served.cli("list", *options, "--json"))
    assert len(served.get(f"/v1/notices?account={account}").json()) == 3
    for query, field in [("?phase=sent", "phase"), ("?limit=0", "limit"), ("?since=soon", "since")]:
        response = served.get(f"/v1/notices{query}")
        assert response.status_code == 422
        assert response.json()["field"] == field
    assert served.get("/v1/notices?colour=red").json()["field"] == "colour"


def test_cancel_answers_as_cancel_json_does(served: Served) -> None:
    """A cancel answers as `cancel --json`, then as a second one does; 404 and 422 too."""
    notice_id = served.enqueue(request(), new_key()).json()["notice_id"]
    path = f"/v1/notices/{notice_id}/cancel"
    headers = {**bearer("oncall"), "Content-Type": "application/json"}
    first = served.http.post(path, content='{"reason": "completed"}', headers=headers)
    assert first.status_code == 200
    assert first.json() == {
        "notice_id": notice_id,
        "was": "queued",
        "phase": "cancelled",
        "cancelled": True,
        "reason": "completed",
    }
    second = served.http.post(path, headers=bearer("oncall"))
    assert second.json() == served.cli("cancel", notice_id, "--json")
    assert second.json()["cancelled"] is False
    bad = served.http.post(path, content='{"reason": "bored"}', headers=headers)
    assert (bad.status_code, bad.json()["field"]) == (422, "reason")
    unknown = served.http.post("/v1/notices/ntc_0000/cancel", headers=bearer("oncall"))
    assert unknown.status_code == 404


def test_health_is_the_document_health_json_prints(served: Served) -> None:
    """GET /v1/health?window=1h is `health --window 1h --json`; a bad window is 422."""
    served.enqueue(request(), new_key(), query="?send=1")
    answered = served.get("/v1/health?window=1h").json()
    assert_same(answered, served.cli("health", "--window", "1h", "--json"))
    assert answered["notices_by_phase"]
    assert served.get("/v1/health?window=forever").status_code == 422


def test_metrics_is_the_textfile_metrics_writes(served: Served, tmp_path: Path) -> None:
    """GET /metrics holds the samples `metrics --textfile` writes, in the text format."""
    served.enqueue(request(), new_key(), query="?send=1")
    answered = served.get("/metrics")
    textfile = tmp_path / "resetctl.prom"
    done = api.open(served.db, served.config, create=False)
    with done as handle:
        handle.write_metrics(textfile)
    assert answered.headers["Content-Type"] == "text/plain; version=0.0.4; charset=utf-8"

    def samples(text: str) -> dict[tuple[str, tuple[tuple[str, str], ...]], float]:
        return {
            (s.name, tuple(sorted(s.labels.items()))): s.value
            for family in text_string_to_metric_families(text)
            for s in family.samples
        }

    served_samples, written = samples(answered.text), samples(textfile.read_text())
    assert served_samples.keys() == written.keys()
    for key, value in written.items():
        slack = SLACK if key[0] == "resetctl_sweep_lag_seconds" else 0.0
        assert abs(served_samples[key] - value) <= slack, key
    assert any(name == "resetctl_submissions_total" for name, _ in written)


def test_healthz_is_public_by_config_and_metrics_is_not(served: Served) -> None:
    """[serve] public opens /healthz without a token; /metrics still needs one."""
    assert served.get("/healthz", caller=None).json() == {"status": "ok"}
    assert served.get("/metrics", caller=None).status_code == 401


def test_an_unknown_route_is_404_and_a_wrong_method_405(served: Served) -> None:
    """No such route: 404; a route that does not take the method: 405 with Allow."""
    assert served.get("/v2/notices").status_code == 404
    wrong = served.http.delete("/v1/notices", headers=bearer("app"))
    assert wrong.status_code == 405
    assert wrong.headers["Allow"] == "GET, HEAD, POST"


def test_twilio_callbacks_are_served_beside_with_their_signature(served: Served) -> None:
    """Twilio's callbacks are served at their path by signature: unsigned is 403, not 401."""
    unsigned = served.http.post(
        "/twilio?attempt=ntc_0%3Asms%3A1",
        content="MessageSid=SM1&MessageStatus=delivered",
        headers={"Content-Type": "application/x-www-form-urlencoded"},
    )
    assert unsigned.status_code == 403
    assert served.http.get("/twilio").status_code == 405
