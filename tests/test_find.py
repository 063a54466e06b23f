"""Finding notices the way on-call starts: by account, idempotency key, phase, region,
age, or "at risk"; newest first, never a secret, on both backends."""

from __future__ import annotations

import json
from typing import Any

import pytest
from conftest import T0, database_clock_at, make_settings, reset_request, resetctl

from resetctl import api
from resetctl.errors import InputError, NoticeNotFound

PENDING = {
    "outbox": {"email_status": "pending", "sms_status": "pending"},
    "unknown_region": "default",  # "eu" and "us" share the default policy
}
SECRETS = ("@example.com", "+1415", "https://", "token-")


def _handle(db: str, now: float = T0, **config: Any) -> api.Handle:
    database_clock_at(db, now)
    return api.open(db, make_settings(**{**PENDING, **config}), clock=lambda: now)


def _no_secrets(text: str) -> None:
    for secret in SECRETS:
        assert secret not in text


def test_list_is_newest_first_with_the_header_fields_and_no_secret(db: str) -> None:
    """Every row carries what inspect's head shows (account included), newest first."""
    with _handle(db) as handle:
        ids = [
            r.notice_id
            for r in handle.enqueue([reset_request(account_ref=f"a-{n}") for n in range(3)])
        ]
    with _handle(db, T0 + 10) as handle:
        later = handle.enqueue([reset_request(account_ref="a-new", region="eu")])[0].notice_id
        rows = handle.find()
    assert rows[0]["notice_id"] == later
    assert {r["notice_id"] for r in rows} == {later, *ids}
    newest = rows[0]
    assert (newest["region"], newest["account_ref"], newest["phase"]) == ("eu", "a-new", "queued")
    assert set(newest) >= {"created_at", "expires_at", "remaining_seconds", "reason", "at_risk"}
    _no_secrets(json.dumps(rows))


def test_list_filters_by_phase_region_account_and_limit(db: str) -> None:
    """Each filter narrows the answer; limit keeps the newest."""
    with _handle(db) as handle:
        eu = handle.enqueue([reset_request(region="eu", account_ref="acct-1")])[0].notice_id
        us = [r.notice_id for r in handle.enqueue([reset_request(region="us") for _ in range(3)])]
        handle.cancel(us[0], reason="completed")
        assert [r["notice_id"] for r in handle.find(region="eu")] == [eu]
        assert [r["notice_id"] for r in handle.find(account="acct-1")] == [eu]
        assert [r["notice_id"] for r in handle.find(phases=["cancelled"])] == [us[0]]
        queued = {r["notice_id"] for r in handle.find(phases=["queued"])}
        assert queued == {eu, us[1], us[2]}
        assert len(handle.find(limit=2)) == 2
        with pytest.raises(InputError, match="phase: 'done'"):
            handle.find(phases=["done"])


def test_since_bounds_a_search_over_finished_notices(db: str) -> None:
    """A finished notice older than --since (a day, unless told) is not listed; an
    account's search has no such bound."""
    with _handle(db) as handle:
        old = handle.enqueue([reset_request(account_ref="acct-7")])[0].notice_id
        handle.cancel(old, reason="withdrawn")
    with _handle(db, T0 + 2 * 86400) as handle:
        assert handle.find(phases=["cancelled"]) == []
        assert [r["notice_id"] for r in handle.find(phases=["cancelled"], since=T0 - 1)] == [old]
        assert [r["notice_id"] for r in handle.find(account="acct-7")] == [old]


def test_at_risk_lists_what_alerts_lists(db: str) -> None:
    """--at-risk is the machine's budget, the same answer alerts --peek gives."""
    settings = {"policy": {"default": {"ttl": "10m", "alert_warning": "9m"}}}
    with _handle(db, **settings) as handle:
        risky = handle.enqueue([reset_request()])[0].notice_id
    with _handle(db, T0 + 420, **settings) as handle:
        fresh = handle.enqueue([reset_request()])[0].notice_id
        listed = [r["notice_id"] for r in handle.find(at_risk=True)]
        alerted = [a.notice_id for a in handle.alerts(peek=True).notices]
    assert listed == [risky]
    assert alerted == listed
    assert fresh not in listed


def test_inspect_by_key_and_by_account_finds_the_notice(db: str) -> None:
    """inspect --key names the notice its idempotency key made; --account the latest."""
    with _handle(db) as handle:
        first = handle.enqueue([reset_request(idempotency_key="ord-1", account_ref="acct-3")])
    with _handle(db, T0 + 5) as handle:
        second = handle.enqueue([reset_request(idempotency_key="ord-2", account_ref="acct-3")])
        assert handle.inspect(key="ord-1")["notice_id"] == first[0].notice_id
        latest = handle.inspect(account="acct-3")
        assert latest["notice_id"] == second[0].notice_id
        assert latest["account_ref"] == "acct-3"
        with pytest.raises(NoticeNotFound, match="ord-404"):
            handle.inspect(key="ord-404")
        with pytest.raises(NoticeNotFound, match="acct-404"):
            handle.inspect(account="acct-404")


def test_the_cli_lists_and_inspects_by_key_without_secrets(db: str) -> None:
    """`resetctl list` and `inspect --key` on the command line; the text view shows the
    account; an unknown key exits 1."""
    request = reset_request(idempotency_key="ord-9", account_ref="acct-9")
    resetctl("enqueue", db=db, input=json.dumps(request), check=True)
    listed = resetctl("list", db=db)
    assert listed.returncode == 0, listed.stderr
    assert "acct-9" in listed.stdout
    assert "queued" in listed.stdout
    as_json = json.loads(resetctl("list", "--account", "acct-9", "--json", db=db).stdout)
    assert [r["account_ref"] for r in as_json] == ["acct-9"]
    shown = resetctl("inspect", "--key", "ord-9", db=db)
    assert shown.returncode == 0, shown.stderr
    assert "account acct-9" in shown.stdout
    for output in (listed.stdout, shown.stdout):
        _no_secrets(output)
    missing = resetctl("inspect", "--key", "nope", db=db)
    assert missing.returncode == 1
    assert resetctl("list", "--phase", "done", db=db).returncode == 2
