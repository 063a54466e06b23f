"""Enqueue: validation, all-or-nothing writes, idempotency, policy resolution."""

from __future__ import annotations

from typing import Any

import pytest
from conftest import T0, make_settings, reset_request

from resetctl.config import Settings
from resetctl.enqueue import enqueue, enqueue_lines
from resetctl.errors import InputError
from resetctl.store import Store

BAD_EMAIL = "zq.not-an-address@@example.org"
BAD_URL = "http://shop.example/reset/SECRET-TOKEN-4d1a"


def notice_count(store: Store) -> int:
    (count,) = store.conn.execute("SELECT count(*) FROM notices").fetchone()
    return int(count)


def problems_of(store: Store, settings: Settings, requests: list[Any]) -> list[str]:
    """The problems an enqueue reports; fails if it does not raise."""
    with pytest.raises(InputError) as caught:
        enqueue(store, settings, requests, T0)
    return caught.value.problems


def test_enqueue_records_a_queued_notice(store: Store, settings: Settings) -> None:
    """A valid request becomes one queued notice under the default policy."""
    [result] = enqueue(store, settings, [reset_request(idempotency_key="r-1")], T0)

    assert result.to_json() == {
        "notice_id": result.notice_id,
        "idempotency_key": "r-1",
        "created": True,
    }
    assert result.notice_id.startswith("ntc_")
    loaded = store.load_notice(result.notice_id)
    assert loaded is not None
    assert loaded.state.phase == "queued"
    assert loaded.region == "default"
    assert (loaded.policy_name, loaded.policy_version) == ("default", 1)
    assert loaded.state.channels == ("email", "sms")


def test_contact_and_url_are_kept_apart_from_the_notice(store: Store, settings: Settings) -> None:
    """The contact data and reset URL are stored for the worker, in the secrets row."""
    request = reset_request(email="ada@example.com", reset_url="https://shop.example/r/t-1")
    [result] = enqueue(store, settings, [request], T0)

    contact = store.load_contact(result.notice_id)
    assert contact is not None
    assert contact.email == "ada@example.com"
    assert contact.reset_url == "https://shop.example/r/t-1"
    assert "ada@example.com" not in repr(contact)


@pytest.mark.parametrize(
    ("fields", "expires_at"),
    [
        ({}, T0 + 600),
        ({"ttl": "10m"}, T0 + 600),
        ({"ttl": "90s"}, T0 + 90),
        ({"ttl": 90}, T0 + 90),
        ({"ttl": "120"}, T0 + 120),
        ({"ttl": "1h30m"}, T0 + 5400),
        ({"expires_at": "2026-01-01T00:05:00Z"}, T0 + 300),
        ({"expires_at": "2026-01-01T01:05:00+01:00"}, T0 + 300),
        ({"expires_at": "2025-12-31T19:05:00-05:00"}, T0 + 300),
    ],
)
def test_expiry_from_ttl_or_absolute_time(
    store: Store, settings: Settings, fields: dict[str, Any], expires_at: float
) -> None:
    """A ttl counts from now; expires_at is absolute in any offset; the default is 10m."""
    [result] = enqueue(store, settings, [reset_request(**fields)], T0)

    loaded = store.load_notice(result.notice_id)
    assert loaded is not None
    assert loaded.state.expires_at == pytest.approx(expires_at)


@pytest.mark.parametrize(
    ("fields", "problem"),
    [
        ({"idempotency_key": None}, "line 1: idempotency_key: required"),
        ({"idempotency_key": ""}, "line 1: idempotency_key: expected a non-empty string"),
        ({"idempotency_key": 7}, "line 1: idempotency_key: expected a non-empty string"),
        ({"email": "not-an-email"}, "line 1: email: not a valid email address"),
        ({"email": "a@b@example.com"}, "line 1: email: not a valid email address"),
        ({"phone": "4155550123"}, "line 1: phone: not a valid E.164 number"),
        ({"phone": "+1 415 555 0123"}, "line 1: phone: not a valid E.164 number"),
        ({"phone": "+1415555012"}, "line 1: phone: not a valid E.164 number"),
        ({"phone": "+999123456789"}, "line 1: phone: not a valid E.164 number"),
        ({"reset_url": None}, "line 1: reset_url: required"),
        ({"reset_url": "http://shop.example/r/t"}, "line 1: reset_url: must be an absolute https"),
        ({"reset_url": "/reset/t"}, "line 1: reset_url: must be an absolute https"),
        ({"reset_url": "https:///t"}, "line 1: reset_url: must be an absolute https"),
        ({"expires_at": "2026-01-01T00:05:00"}, "line 1: expires_at: needs a timezone offset"),
        (
            {"expires_at": "2025-12-31T23:59:00Z"},
            "line 1: expires_at: the link has already expired",
        ),
        (
            {"expires_at": "2026-01-01T00:00:00Z"},
            "line 1: expires_at: the link has already expired",
        ),
        ({"expires_at": "tomorrow"}, "line 1: expires_at: expected an ISO 8601 time"),
        ({"expires_at": "2026-01-01T00:05:00Z", "ttl": "5m"}, "line 1: expires_at: give"),
        ({"ttl": "0"}, "line 1: ttl: expected a positive duration"),
        ({"ttl": "-5m"}, "line 1: ttl: expected a positive duration"),
        ({"ttl": "ten minutes"}, "line 1: ttl: expected a positive duration"),
        ({"ttl": True}, "line 1: ttl: expected a positive duration"),
        ({"email": None, "phone": None}, "line 1: email/phone: policy.default sends by"),
        ({"display_name": "Ada\nLovelace"}, "line 1: display_name: contains control characters"),
        ({"colour": "blue"}, "line 1: colour: unknown field"),
    ],
)
def test_invalid_request_is_rejected_naming_line_and_field(
    store: Store, settings: Settings, fields: dict[str, Any], problem: str
) -> None:
    """Each invalid field is reported as `line N: field: problem` and nothing is written."""
    problems = problems_of(store, settings, [reset_request(**fields)])

    assert any(p.startswith(problem) for p in problems), problems
    assert notice_count(store) == 0


@pytest.mark.parametrize("request_value", [["a", "list"], "a string", 42, None])
def test_a_line_that_is_not_an_object_is_rejected(
    store: Store, settings: Settings, request_value: object
) -> None:
    """A request that is not a JSON object is an error on its line."""
    problems = problems_of(store, settings, [reset_request(), request_value])

    assert problems == ["line 2: (line): expected a JSON object"]
    assert notice_count(store) == 0


def test_every_problem_on_every_line_is_listed(store: Store, settings: Settings) -> None:
    """One enqueue reports all problems of all lines at once, in line order."""
    requests = [
        reset_request(),
        reset_request(email="nope", reset_url="ftp://x.example/r"),
        reset_request(phone="+1 415"),
    ]
    problems = problems_of(store, settings, requests)

    assert [p.split(":")[0:2] for p in problems] == [
        ["line 2", " email"],
        ["line 2", " reset_url"],
        ["line 3", " phone"],
    ]


def test_one_invalid_line_writes_nothing(store: Store, settings: Settings) -> None:
    """All or nothing: valid lines are not written when any line is invalid."""
    problems_of(store, settings, [reset_request(), reset_request(), reset_request(phone="555")])

    assert notice_count(store) == 0


@pytest.mark.parametrize("bad", [{"email": BAD_EMAIL}, {"reset_url": BAD_URL}])
def test_validation_errors_never_echo_the_value(
    store: Store, settings: Settings, bad: dict[str, str]
) -> None:
    """A rejected email or reset URL is named by field, never quoted back."""
    with pytest.raises(InputError) as caught:
        enqueue(store, settings, [reset_request(**bad)], T0)

    [value] = bad.values()
    assert value not in str(caught.value)
    assert "SECRET-TOKEN" not in str(caught.value)
    assert "zq.not-an-address" not in str(caught.value)


def test_same_key_same_fields_returns_the_existing_notice(store: Store, settings: Settings) -> None:
    """Replaying a request returns the first notice with created false, and adds no row."""
    request = reset_request(ttl="10m")
    [first] = enqueue(store, settings, [request], T0)
    [again] = enqueue(store, settings, [dict(reversed(request.items()))], T0 + 60)

    assert first.created is True
    assert (again.notice_id, again.created) == (first.notice_id, False)
    assert notice_count(store) == 1
    loaded = store.load_notice(first.notice_id)
    assert loaded is not None
    assert loaded.state.expires_at == T0 + 600


def test_same_key_twice_in_one_batch_is_one_notice(store: Store, settings: Settings) -> None:
    """A request repeated within one input yields one notice, reported twice."""
    request = reset_request()
    first, second = enqueue(store, settings, [request, dict(request)], T0)

    assert first.created is True
    assert (second.notice_id, second.created) == (first.notice_id, False)
    assert notice_count(store) == 1


@pytest.mark.parametrize(
    "change",
    [
        {"email": "other@example.com"},
        {"phone": "+14155550199"},
        {"reset_url": "https://shop.example/reset/other"},
        {"ttl": "600"},
        {"ttl": "11m"},
        {"display_name": "Someone Else"},
    ],
)
def test_same_key_different_fields_is_an_error(
    store: Store, settings: Settings, change: dict[str, str]
) -> None:
    """Reusing a key with other fields (a ttl compares as written) is rejected."""
    original = reset_request(ttl="10m")
    enqueue(store, settings, [original], T0)

    problems = problems_of(store, settings, [reset_request(), {**original, **change}])

    assert problems == ["line 2: idempotency_key: already used with different fields"]
    assert notice_count(store) == 1


def test_a_conflicting_key_rolls_back_the_other_lines(store: Store, settings: Settings) -> None:
    """A key conflict found while writing still leaves the database unchanged."""
    original = reset_request()
    enqueue(store, settings, [original], T0)

    problems_of(store, settings, [reset_request(), {**original, "email": "x@example.com"}])

    assert notice_count(store) == 1


@pytest.mark.parametrize(
    ("region", "policy", "channels"),
    [
        (None, "default", ("email", "sms")),
        ("eu", "eu", ("email", "sms")),
        ("apac", "apac", ("sms", "email")),
        ("mars", "default", ("email", "sms")),
    ],
)
def test_region_resolves_its_own_policy_else_default(
    store: Store, region: str | None, policy: str, channels: tuple[str, ...]
) -> None:
    """A region with a [policy.<region>] table uses it; under unknown_region = "default"
    any other region uses default (refused without it: test_loud_mistakes.py)."""
    settings = make_settings(
        unknown_region="default",
        policy={"eu": {"version": 3}, "apac": {"version": 2, "channels": ["sms", "email"]}},
    )
    [result] = enqueue(store, settings, [reset_request(region=region)], T0)

    loaded = store.load_notice(result.notice_id)
    assert loaded is not None
    assert loaded.region == (region or "default")
    assert loaded.policy_name == policy
    assert loaded.policy_version == settings.policies[policy].version
    assert loaded.state.channels == channels


@pytest.mark.parametrize(
    ("contacts", "channels"),
    [
        ({"phone": None}, ("email",)),
        ({"email": None}, ("sms",)),
    ],
)
def test_channels_are_limited_to_the_contacts_given(
    store: Store, settings: Settings, contacts: dict[str, None], channels: tuple[str, ...]
) -> None:
    """A notice only uses the policy's channels it has contact data for."""
    [result] = enqueue(store, settings, [reset_request(**contacts)], T0)

    loaded = store.load_notice(result.notice_id)
    assert loaded is not None
    assert loaded.state.channels == channels


def test_sms_only_policy_needs_a_phone(store: Store) -> None:
    """A policy that only sends SMS rejects a request without a phone number."""
    settings = make_settings(policy={"default": {"channels": ["sms"]}})

    problems = problems_of(store, settings, [reset_request(phone=None, email=None)])

    assert problems == ["line 1: email/phone: policy.default sends by sms; give phone"]


def test_email_only_request_under_sms_only_policy_is_rejected(store: Store) -> None:
    """A contact the policy cannot use does not count: the request is an error, not a no-op."""
    settings = make_settings(policy={"default": {"channels": ["sms"]}})

    problems = problems_of(store, settings, [reset_request(phone=None)])

    assert problems == ["line 1: email/phone: policy.default sends by sms; give phone"]


@pytest.mark.parametrize(
    "fields",
    [
        {"idempotency_key": "k-null-1", "email": None, "phone": None},
        {"idempotency_key": None},
    ],
)
def test_null_required_fields_are_rejected(store: Store, fields: dict[str, Any]) -> None:
    """A required field given as null is an error, never a silently skipped request."""
    request = {"email": "ada@example.com", "reset_url": "https://shop.example/r/t", **fields}

    with pytest.raises(InputError):
        enqueue(store, make_settings(), [request], T0)


def test_changed_policy_without_a_new_version_is_refused(store: Store) -> None:
    """A policy edited under the same version number cannot be used; bump its version."""
    enqueue(store, make_settings(), [reset_request()], T0)
    edited = make_settings(policy={"default": {"version": 1, "ttl": "15m"}})

    problems = problems_of(store, edited, [reset_request()])

    assert problems == [
        "policy.default: version 1 is already stored with different settings; bump its version"
    ]
    assert notice_count(store) == 1


def test_json_lines_skip_blank_lines_and_keep_line_numbers(
    store: Store, settings: Settings
) -> None:
    """Blank lines are skipped, yet errors name the physical line number."""
    good = (
        '{"idempotency_key": "j-1", "email": "a@example.com", "reset_url": "https://x.example/r"}'
    )
    bad = '{"idempotency_key": "j-2", "phone": "+44 7700", "reset_url": "https://x.example/r"}'

    with pytest.raises(InputError) as caught:
        enqueue_lines(store, settings, [good, "", "   ", bad], T0)

    assert caught.value.problems == ["line 4: phone: not a valid E.164 number (e.g. +14155550123)"]


def test_json_lines_report_unparseable_lines(store: Store, settings: Settings) -> None:
    """A line that is not JSON is reported by number without quoting its text."""
    with pytest.raises(InputError) as caught:
        enqueue_lines(store, settings, ['{"email": "zq@example.org", '], T0)

    [problem] = caught.value.problems
    assert problem.startswith("line 1: (line): not valid JSON")
    assert "zq@example.org" not in problem


def test_json_lines_list_syntax_and_field_errors_together(store: Store, settings: Settings) -> None:
    """A syntax error on one line does not hide field errors on another."""
    bad_field = (
        '{"idempotency_key": "j-3", "phone": "+44 7700", "reset_url": "https://x.example/r"}'
    )

    with pytest.raises(InputError) as caught:
        enqueue_lines(store, settings, ["{not json", bad_field], T0)

    assert [p.split(":")[0] for p in caught.value.problems] == ["line 1", "line 2"]
