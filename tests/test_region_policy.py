"""Region policy at enqueue and in the sweep: consent, destinations, abuse limits.

Each rule is policy data (``[policy.<region>]``), never a branch on a region's name; a
refusal is that line's alone (the rest of the batch is written), and what a rule ruled
out is recorded where inspect, health, metrics and alerts read it.
"""

from __future__ import annotations

import json
from typing import Any

import pytest
from conftest import FakeClock, make_settings, reset_request, resetctl, run_sweep

from resetctl.config import Settings
from resetctl.enqueue import enqueue
from resetctl.machine import Phase, Reason
from resetctl.ops import alerts, health, metric_families
from resetctl.report import notice_report
from resetctl.store import Store

US_MOBILE = "+14155550123"  # libphonenumber: fixed_line_or_mobile (US numbers are both)
US_PREMIUM = "+19005550123"  # premium_rate
DE_MOBILE = "+4915112345678"
GB_LANDLINE = "+442079460000"  # fixed_line
KEY = b"region-policy-test-key-0123456789"


def region(**table: Any) -> Settings:
    """Settings with one region ``eu`` configured by ``table`` (over the defaults)."""
    return make_settings(policy={"eu": {"version": 1, **table}})


def enqueue_one(store: Store, settings: Settings, now: float, **fields: Any) -> Any:
    (result,) = enqueue(store, settings, [reset_request(region="eu", **fields)], now, KEY)
    return result


def stored_notices(store: Store) -> int:
    (count,) = store.conn.execute("SELECT COUNT(*) FROM notices").fetchone()
    return int(count)


# --- consent ----------------------------------------------------------------------------


def test_a_channel_that_requires_consent_is_skipped_without_it(
    store: Store, clock: FakeClock
) -> None:
    """sms.requires_consent and consent ["email"]: the SMS is never attempted, the reason
    no_consent is recorded, inspect shows the consent and the skip."""
    settings = region(sms={"requires_consent": True})
    result = enqueue_one(store, settings, clock(), consent=["email"])
    assert result.skipped == (("sms", Reason.NO_CONSENT),)
    assert result.to_json()["skipped"] == {"sms": "no_consent"}
    report = notice_report(store, result.notice_id, clock())
    assert report["channels"] == ["email"]
    assert report["consent"] == ["email"]
    assert report["skipped"] == {"sms": "no_consent"}
    # Email fails: with SMS ruled out there is nothing to fall back on, and no SMS goes.
    failing = make_settings(
        policy={"eu": {"version": 1, "sms": {"requires_consent": True}}},
        outbox={"email_status": "failed"},
    )
    for _ in range(3):
        run_sweep(store, failing, clock)
        clock.advance(20)
    assert store.load_notice(result.notice_id).state.phase is Phase.FAILED
    assert [m["channel"] for m in store.outbox_messages(result.notice_id)] == ["email"]


def test_consent_given_lets_the_channel_through(store: Store, clock: FakeClock) -> None:
    """consent naming the channel satisfies requires_consent."""
    settings = region(sms={"requires_consent": True})
    result = enqueue_one(store, settings, clock(), consent=["email", "sms"])
    assert result.skipped == ()
    assert store.load_notice(result.notice_id).state.channels == ("email", "sms")


def test_a_request_whose_every_channel_lacks_consent_is_refused_alone(
    store: Store, clock: FakeClock
) -> None:
    """Every channel skipped: that line is refused (no_consent, nothing stored for it)
    and the other lines of the batch are written."""
    settings = region(channels=["sms"], sms={"requires_consent": True})
    refused, accepted = enqueue(
        store,
        settings,
        [
            reset_request(region="eu", email=None),
            reset_request(region="eu", email=None, consent=["sms"]),
        ],
        clock(),
        KEY,
    )
    assert refused.notice_id is None
    assert refused.refused is Reason.NO_CONSENT
    assert refused.field == "consent"
    assert refused.problem.startswith("line 1: consent: refused (no_consent)")
    assert accepted.created
    assert stored_notices(store) == 1
    assert health(store, clock(), 3600)["refused"] == {"eu": {"no_consent": 1}}


def test_on_no_channel_fail_stores_the_request_as_failed(store: Store, clock: FakeClock) -> None:
    """on_no_channel = "fail": the request is on record as failed (no_channel), holds no
    secret, and is never due."""
    settings = region(channels=["sms"], on_no_channel="fail", sms={"requires_consent": True})
    result = enqueue_one(store, settings, clock(), email=None)
    loaded = store.load_notice(result.notice_id)
    assert loaded.state.phase is Phase.FAILED
    assert loaded.reason == "no_channel"
    assert loaded.due_at is None
    assert store.load_contact(result.notice_id) is None
    assert notice_report(store, result.notice_id, clock())["skipped"] == {"sms": "no_consent"}


def test_a_consent_rule_changed_after_enqueue_does_not_change_a_notice_in_flight(
    store: Store, clock: FakeClock
) -> None:
    """A notice enqueued while SMS needed consent keeps its channels when a new policy
    version drops the rule; a new notice gets the new rule."""
    before = region(sms={"requires_consent": True})
    old = enqueue_one(store, before, clock(), consent=["email"])
    after = make_settings(policy={"eu": {"version": 2}}, outbox={"email_status": "failed"})
    new = enqueue_one(store, after, clock(), consent=["email"])
    for _ in range(4):
        run_sweep(store, after, clock)
        clock.advance(20)
    assert [m["channel"] for m in store.outbox_messages(old.notice_id)] == ["email"]
    assert sorted(m["channel"] for m in store.outbox_messages(new.notice_id)) == ["email", "sms"]


def test_consent_must_name_channels() -> None:
    """A consent that is not a list of channels is an input error naming the field."""
    from resetctl.enqueue import check_requests
    from resetctl.errors import InputError

    with pytest.raises(InputError, match="line 1: consent: expected a list of channels"):
        check_requests(make_settings(), [reset_request(consent=["fax"])], 0.0)


# --- destinations -----------------------------------------------------------------------


def test_a_premium_rate_number_is_refused_by_default(store: Store, clock: FakeClock) -> None:
    """Default number types are mobile and fixed-line-or-mobile: a premium-rate number is
    refused on its line, naming the phone field and the rule."""
    result = enqueue_one(store, region(), clock(), phone=US_PREMIUM)
    assert result.refused is Reason.DESTINATION_TYPE
    assert result.field == "phone"
    assert "policy.eu.sms.number_types" in result.problem
    assert US_PREMIUM not in result.problem
    assert stored_notices(store) == 0


def test_a_country_outside_allowed_countries_is_refused(store: Store, clock: FakeClock) -> None:
    """sms.allowed_countries = ["DE"]: a US number is refused, a German one accepted."""
    settings = region(sms={"allowed_countries": ["DE"]})
    assert enqueue_one(store, settings, clock()).refused is Reason.DESTINATION_COUNTRY
    assert enqueue_one(store, settings, clock(), phone=DE_MOBILE).created


def test_a_refused_destination_goes_on_by_email_when_the_policy_says_skip(
    store: Store, clock: FakeClock
) -> None:
    """on_refused_destination = "skip": the SMS is skipped with its reason, the email
    goes out."""
    settings = region(on_refused_destination="skip", sms={"allowed_countries": ["DE"]})
    result = enqueue_one(store, settings, clock())
    assert result.skipped == (("sms", Reason.DESTINATION_COUNTRY),)
    run_sweep(store, settings, clock)
    assert [m["channel"] for m in store.outbox_messages(result.notice_id)] == ["email"]


def test_number_types_can_admit_a_landline(store: Store, clock: FakeClock) -> None:
    """A policy naming fixed_line texts a landline the default refuses."""
    assert enqueue_one(store, region(), clock(), phone=GB_LANDLINE).refused is not None
    landlines = region(version=2, sms={"number_types": ["mobile", "fixed_line"]})
    assert enqueue_one(store, landlines, clock(), phone=GB_LANDLINE).created


# --- per-recipient limit ----------------------------------------------------------------


def test_the_per_recipient_limit_refuses_the_line_over_it_and_nothing_else(
    store: Store, clock: FakeClock
) -> None:
    """limits.per_recipient = 2 per hour: the third request for one address is refused
    (rate_limited), the other lines of the same batch are written."""
    settings = region(limits={"per_recipient": 2, "per_recipient_window": "1h"})
    requests = [
        reset_request(region="eu", email="ada@example.com", phone=None),
        reset_request(region="eu", email="bob@example.com", phone=None),
        reset_request(region="eu", email="ADA@example.com", phone=None),
        reset_request(region="eu", email="ada@example.com", phone=None),
    ]
    results = enqueue(store, settings, requests, clock(), KEY)
    assert [r.refused for r in results] == [None, None, None, Reason.RATE_LIMITED]
    assert results[3].field == "email"
    assert results[3].problem.startswith("line 4: email: refused (rate_limited)")
    assert "ada@example.com" not in results[3].problem
    assert stored_notices(store) == 3
    assert health(store, clock(), 3600)["refused"] == {"eu": {"rate_limited": 1}}
    # The counts hold keyed hashes, never the address.
    rows = store.conn.execute("SELECT subject FROM limit_counts").fetchall()
    assert rows
    assert not any("@" in subject for (subject,) in rows)


def test_the_window_slides_and_a_retry_counts_nothing(store: Store, clock: FakeClock) -> None:
    """A retried request (same key, same fields) is answered with its notice and counts
    nothing; once the window has passed the recipient may get a new one."""
    settings = region(limits={"per_recipient": 1, "per_recipient_window": "10m"})
    first = reset_request(region="eu", email="ada@example.com", phone=None)
    (accepted,) = enqueue(store, settings, [first], clock(), KEY)
    (retried,) = enqueue(store, settings, [first], clock(), KEY)
    assert retried.notice_id == accepted.notice_id
    assert retried.refused is None
    second = reset_request(region="eu", email="ada@example.com", phone=None)
    clock.advance(599)
    assert enqueue(store, settings, [second], clock(), KEY)[0].refused is Reason.RATE_LIMITED
    clock.advance(2)
    assert enqueue(store, settings, [second], clock(), KEY)[0].created


def test_the_limit_counts_a_phone_number_across_addresses(store: Store, clock: FakeClock) -> None:
    """Two addresses, one phone number: the number's count refuses the second."""
    settings = region(limits={"per_recipient": 1})
    assert enqueue_one(store, settings, clock(), phone=US_MOBILE).created
    refused = enqueue_one(store, settings, clock(), phone=US_MOBILE)
    assert refused.refused is Reason.RATE_LIMITED
    assert refused.field == "phone"


def test_the_cli_prints_every_line_and_exits_2_for_a_refusal(tmp_path: Any) -> None:
    """``resetctl enqueue``: the refused line's JSON says refused and its field, its
    problem goes to stderr, exit 2; the accepted line is written."""
    config = tmp_path / "resetctl.toml"
    config.write_text("[policy.eu]\nversion = 1\n[policy.eu.limits]\nper_recipient = 1\n")
    lines = "\n".join(
        json.dumps(
            {
                "idempotency_key": f"k{n}",
                "region": "eu",
                "email": "ada@example.com",
                "reset_url": f"https://shop.example/r/{n}",
            }
        )
        for n in (1, 2)
    )
    done = resetctl("enqueue", "--config", str(config), db=tmp_path / "r.db", input=lines + "\n")
    assert done.returncode == 2, done.stderr
    first, second = done.stdout.splitlines()
    assert '"created": true' in first
    assert '"refused": "rate_limited"' in second
    assert '"field": "email"' in second
    assert "line 2: email: refused (rate_limited)" in done.stderr
    assert "ada@example.com" not in done.stdout + done.stderr


# --- the country cap --------------------------------------------------------------------


def test_the_country_cap_skips_sms_over_it_and_the_notice_goes_on_by_email(
    store: Store, clock: FakeClock
) -> None:
    """sms_per_country_per_hour = 2, SMS first: two SMS go to US numbers, the third
    notice's SMS is skipped (country_cap) and it is sent by email; health, metrics and
    alerts say so; an hour later the cap has room again."""
    settings = region(channels=["sms", "email"], limits={"sms_per_country_per_hour": 2})
    ids = [enqueue_one(store, settings, clock()).notice_id for _ in range(3)]
    run_sweep(store, settings, clock)
    channels = [[m["channel"] for m in store.outbox_messages(n)] for n in ids]
    assert sorted(channels) == [["email"], ["sms"], ["sms"]]
    capped = ids[channels.index(["email"])]
    report = notice_report(store, capped, clock())
    assert report["skipped"] == {"sms": "country_cap"}
    assert report["channels"] == ["email"]
    assert health(store, clock(), 3600)["skipped"] == {"eu": {"country_cap": 1}}
    found = alerts(store, clock(), peek=True)
    assert [c.to_json()["alert"] for c in found.country_caps] == ["resetctl_sms_country_cap_hit"]
    assert found.level.name == "CRITICAL"
    samples = {
        (s.name, tuple(sorted(s.labels.items()))): s.value
        for family in metric_families(store, clock())
        for s in family.samples
    }
    key = (
        "resetctl_skipped_channels_total",
        (("channel", "sms"), ("policy", "eu"), ("reason", "country_cap")),
    )
    assert samples[key] == 1
    clock.advance(3601)
    later = enqueue_one(store, settings, clock()).notice_id
    run_sweep(store, settings, clock)
    assert [m["channel"] for m in store.outbox_messages(later)] == ["sms"]


def test_a_capped_sms_only_notice_fails_with_the_cap_as_its_reason(
    store: Store, clock: FakeClock
) -> None:
    """SMS only and the cap full: the notice fails (country_cap), nothing is sent."""
    settings = region(channels=["sms"], limits={"sms_per_country_per_hour": 1})
    first = enqueue_one(store, settings, clock(), email=None).notice_id
    second = enqueue_one(store, settings, clock(), email=None).notice_id
    run_sweep(store, settings, clock)
    sent = [n for n in (first, second) if store.outbox_messages(n)]
    assert len(sent) == 1
    other = second if sent == [first] else first
    loaded = store.load_notice(other)
    assert loaded.state.phase is Phase.FAILED
    assert loaded.reason == "country_cap"
    assert store.load_contact(other) is None


def test_send_submits_the_accepted_lines_and_leaves_the_refused_one(
    store: Store, clock: FakeClock
) -> None:
    """``enqueue --send`` with a refused line: the accepted notice is submitted at once,
    the refused line keeps its refusal and nothing is sent for it."""
    settings = region(sms={"allowed_countries": ["DE"]})
    refused, sent = enqueue(
        store,
        settings,
        [reset_request(region="eu"), reset_request(region="eu", phone=DE_MOBILE)],
        clock(),
        KEY,
        send=True,
        clock=clock,
    )
    assert refused.refused is Reason.DESTINATION_COUNTRY
    assert refused.submitted is None
    assert sent.submitted is True
    assert [m["channel"] for m in store.outbox_messages(sent.notice_id)] == ["email"]


# --- the keys, validated ------------------------------------------------------------------


@pytest.mark.parametrize(
    ("table", "message"),
    [
        ({"email": {"from": "not an address"}}, "policy.eu.email.from: expected an address"),
        ({"email": {"from": "a@x.example, b@y.example"}}, "policy.eu.email.from: expected"),
        ({"email": {"from": "Shop\nBcc: x <a@x.example>"}}, "policy.eu.email.from"),
        ({"email": {"reply_to": "Help <h@x.example>"}}, "reply_to: give the address only"),
        ({"sms": {"from": "12345"}}, "policy.eu.sms.from: expected an E.164 number"),
        ({"sms": {"requires_consent": "yes"}}, "policy.eu.sms.requires_consent: must be true"),
        ({"sms": {"allowed_countries": ["XX"]}}, "policy.eu.sms.allowed_countries: XX is not"),
        ({"sms": {"allowed_countries": []}}, "policy.eu.sms.allowed_countries: expected"),
        ({"sms": {"number_types": ["cell"]}}, "policy.eu.sms.number_types: cell is not one"),
        ({"on_refused_destination": "drop"}, "policy.eu.on_refused_destination: must be"),
        ({"on_no_channel": "ignore"}, "policy.eu.on_no_channel: must be 'refuse' or 'fail'"),
        ({"limits": {"per_recipient": 0}}, "policy.eu.limits.per_recipient: must be a positive"),
        ({"limits": {"per_recipient": 5000}}, "policy.eu.limits.per_recipient: must be at most"),
        ({"limits": {"per_hour": 5}}, "policy.eu.limits.per_hour: unknown key"),
        ({"limits": {"per_recipient_window": "60d"}}, "per_recipient_window: must be at most"),
        ({"retention": "0s"}, "policy.eu.retention: must be a positive duration"),
        ({"retention": "5000d"}, "policy.eu.retention: must be at most"),
    ],
)
def test_a_bad_region_rule_is_refused_naming_its_key(table: dict[str, Any], message: str) -> None:
    """Each new key is checked as the file is read; the error names the key."""
    from resetctl.errors import ConfigError

    with pytest.raises(ConfigError) as caught:
        region(**table)
    assert message in str(caught.value)
    assert "\n" not in str(caught.value)


def test_the_region_rules_are_stored_with_the_policy_version(
    store: Store, clock: FakeClock
) -> None:
    """The rules travel in the stored policy record: reloaded, it is the same policy."""
    settings = region(
        retention="30d",
        on_refused_destination="skip",
        email={"from": "Shop EU <reset@eu.shop.example>", "reply_to": "help@shop.example"},
        sms={"from": "+4915112345678", "requires_consent": True, "allowed_countries": ["DE"]},
        limits={"per_recipient": 3, "per_recipient_window": "30m", "sms_per_country_per_hour": 9},
    )
    notice_id = enqueue_one(store, settings, clock(), consent=["email", "sms"], phone=DE_MOBILE)
    loaded = store.load_notice(notice_id.notice_id)
    stored = store.load_policy(loaded.policy_name, loaded.policy_version)
    assert stored == settings.policies["eu"]
    assert stored.sender.email_from_name == "Shop EU"
    assert stored.limits.sms_per_country_per_hour == 9


def test_a_request_refused_by_a_limit_never_cancels_the_accounts_live_notice(
    store: Store, clock: FakeClock
) -> None:
    """A bot asking resets for someone past their limit is refused, and the person's
    live notice is not superseded by the refusal."""
    settings = region(limits={"per_recipient": 1})
    person = {"account_ref": "acct-1", "email": "victim@example.com", "phone": None}
    first = enqueue_one(store, settings, clock(), **person)
    refused = enqueue_one(store, settings, clock(), **person)
    assert refused.refused is Reason.RATE_LIMITED
    assert store.load_notice(first.notice_id).state.phase is Phase.QUEUED


def test_a_request_stored_as_failed_still_supersedes_the_accounts_older_notice(
    store: Store, clock: FakeClock
) -> None:
    """on_no_channel = "fail": the new request went nowhere, but the application issued
    a new token, so the account's older live notice (its link now dead) is cancelled."""
    settings = region(channels=["sms"], on_no_channel="fail", sms={"requires_consent": True})
    older = enqueue_one(store, settings, clock(), account_ref="acct-2", consent=["sms"])
    newer = enqueue_one(store, settings, clock(), account_ref="acct-2")
    assert newer.superseded == (older.notice_id,)
    assert store.load_notice(older.notice_id).state.phase is Phase.CANCELLED


def test_health_counts_refusals_in_its_window_to_the_minute(store: Store, clock: FakeClock) -> None:
    """A refusal an hour ago is outside a 5-minute window and inside a 2-hour one."""
    settings = region(limits={"per_recipient": 1})
    person = {"email": "ada@example.com", "phone": None}
    enqueue_one(store, settings, clock(), **person)
    assert enqueue_one(store, settings, clock(), **person).refused is Reason.RATE_LIMITED
    clock.advance(3600)
    assert health(store, clock(), 300)["refused"] == {}
    assert health(store, clock(), 7200)["refused"] == {"eu": {"rate_limited": 1}}
