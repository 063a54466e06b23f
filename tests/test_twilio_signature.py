"""Twilio's X-Twilio-Signature, checked against an oracle written here from Twilio's docs.

The expected signatures are never computed with the code under test: `reference_signature`
below follows Twilio's documented algorithm on its own (the full URL, then each POST
parameter's name and value in name order, case-sensitive; HMAC-SHA1 keyed with the auth
token; base64), and is itself checked against Twilio's published examples.
"""

from __future__ import annotations

import base64
import hashlib
import hmac
import random

import pytest
from hypothesis import assume, given
from hypothesis import strategies as st

from resetctl.transports.twilio import compute_signature, verify_signature

TOKEN = "12345"
#: Twilio's published example request (the webhooks-security docs and twilio-python's
#: validator tests): this URL, these params, auth token 12345.
VECTOR_URL = "https://mycompany.com/myapp.php?foo=1&bar=2"
VECTORS = [
    ("+14158675309", "RSOYDt4T1cUTdK1PDd93/VVr8B8="),
    ("+12349013030", "0/KCTR6DLpKmkAf8muzZqo1nDgQ="),
]
#: A status callback as Twilio posts it: its fields arrive in Twilio's order, not sorted.
CALLBACK_URL = "https://hooks.example.com/twilio/status?attempt=n1%3Asms%3A1"
CALLBACK_PARAMS = {
    "SmsSid": "SM5f7b1c2e8a1d4e0012c3b4a5d6e7f801",
    "SmsStatus": "delivered",
    "MessageStatus": "delivered",
    "To": "+61491570157",
    "MessageSid": "SM5f7b1c2e8a1d4e0012c3b4a5d6e7f801",
    "AccountSid": "AC0123456789abcdef0123456789abcdef",
    "From": "+15005550006",
    "ApiVersion": "2010-04-01",
    "RawDlrDoneDate": "2601011200",
}
BASE64_ALPHABET = "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/="


def reference_signature(url: str, params: dict[str, str], token: str) -> str:
    """Twilio's documented algorithm, independent of resetctl's implementation."""
    signed = url
    for name in sorted(params):  # code-point order: Twilio's case-sensitive sort
        signed += name + params[name]
    mac = hmac.new(token.encode("utf-8"), signed.encode("utf-8"), hashlib.sha1)
    return base64.b64encode(mac.digest()).decode("ascii")


def _vector_params(caller: str) -> dict[str, str]:
    return {
        "CallSid": "CA1234567890ABCDE",
        "Caller": caller,
        "Digits": "1234",
        "From": caller,
        "To": "+18005551212",
    }


CALLBACK_SIGNATURE = reference_signature(CALLBACK_URL, CALLBACK_PARAMS, TOKEN)


@pytest.mark.parametrize(("caller", "published"), VECTORS)
def test_the_reference_reproduces_twilios_published_signatures(caller: str, published: str) -> None:
    """The oracle itself gives Twilio's published signature for Twilio's example request."""
    assert reference_signature(VECTOR_URL, _vector_params(caller), TOKEN) == published


@pytest.mark.parametrize(("caller", "published"), VECTORS)
def test_twilios_published_signatures_verify(caller: str, published: str) -> None:
    """Twilio's example request with its published signature verifies."""
    assert verify_signature(VECTOR_URL, _vector_params(caller), published, TOKEN)


def test_a_callback_whose_params_arrive_unsorted_verifies() -> None:
    """A callback's fields in Twilio's (unsorted) order verify: the code sorts them by name."""
    assert list(CALLBACK_PARAMS) != sorted(CALLBACK_PARAMS)
    assert verify_signature(CALLBACK_URL, CALLBACK_PARAMS, CALLBACK_SIGNATURE, TOKEN)
    assert compute_signature(CALLBACK_URL, CALLBACK_PARAMS, TOKEN) == CALLBACK_SIGNATURE


def test_the_same_params_in_any_insertion_order_give_one_signature() -> None:
    """Reversing the order the params were added in changes nothing."""
    reversed_params = dict(reversed(list(CALLBACK_PARAMS.items())))
    assert verify_signature(CALLBACK_URL, reversed_params, CALLBACK_SIGNATURE, TOKEN)


def test_params_are_sorted_case_sensitively() -> None:
    """Names sort by code point ("B" < "a" < "b"), as Twilio's Unix-style sort does."""
    params = {"b": "1", "a": "2", "B": "3"}
    expected = reference_signature(VECTOR_URL, params, TOKEN)
    # Spelled out, so the test does not lean on the oracle for the order either.
    spelled_out = hmac.new(b"12345", f"{VECTOR_URL}B3a2b1".encode(), hashlib.sha1).digest()
    assert expected == base64.b64encode(spelled_out).decode()
    assert verify_signature(VECTOR_URL, params, expected, TOKEN)


def test_a_truncated_signature_is_refused() -> None:
    """The valid signature less its last character does not verify."""
    assert not verify_signature(CALLBACK_URL, CALLBACK_PARAMS, CALLBACK_SIGNATURE[:-1], TOKEN)


def test_no_prefix_of_the_signature_verifies() -> None:
    """No proper prefix of the valid signature, however long, verifies."""
    for keep in range(len(CALLBACK_SIGNATURE)):
        prefix = CALLBACK_SIGNATURE[:keep]
        assert not verify_signature(CALLBACK_URL, CALLBACK_PARAMS, prefix, TOKEN), keep


def test_an_extended_signature_is_refused() -> None:
    """The valid signature with one character appended does not verify."""
    assert not verify_signature(CALLBACK_URL, CALLBACK_PARAMS, CALLBACK_SIGNATURE + "A", TOKEN)


def test_a_signature_with_one_letter_in_the_other_case_is_refused() -> None:
    """Base64 is case-sensitive: swapping the case of one letter breaks the signature."""
    index = next(i for i, char in enumerate(CALLBACK_SIGNATURE) if char.isalpha())
    altered = (
        CALLBACK_SIGNATURE[:index]
        + CALLBACK_SIGNATURE[index].swapcase()
        + CALLBACK_SIGNATURE[index + 1 :]
    )
    assert not verify_signature(CALLBACK_URL, CALLBACK_PARAMS, altered, TOKEN)


def test_an_empty_signature_is_refused() -> None:
    """A request without a signature does not verify."""
    assert not verify_signature(CALLBACK_URL, CALLBACK_PARAMS, "", TOKEN)


def test_a_signature_made_with_another_token_is_refused() -> None:
    """A signature by a different auth token does not verify, nor does an empty token."""
    forged = reference_signature(CALLBACK_URL, CALLBACK_PARAMS, "54321")
    assert not verify_signature(CALLBACK_URL, CALLBACK_PARAMS, forged, TOKEN)
    assert not verify_signature(CALLBACK_URL, CALLBACK_PARAMS, CALLBACK_SIGNATURE, "54321")
    empty_token = reference_signature(CALLBACK_URL, CALLBACK_PARAMS, "")
    assert not verify_signature(CALLBACK_URL, CALLBACK_PARAMS, empty_token, "")


def test_the_query_string_is_part_of_what_is_signed() -> None:
    """A URL signed with its query verifies only with it; one signed without, only without."""
    bare = CALLBACK_URL.partition("?")[0]
    with_query = CALLBACK_SIGNATURE
    without_query = reference_signature(bare, CALLBACK_PARAMS, TOKEN)
    assert verify_signature(CALLBACK_URL, CALLBACK_PARAMS, with_query, TOKEN)
    assert verify_signature(bare, CALLBACK_PARAMS, without_query, TOKEN)
    assert not verify_signature(bare, CALLBACK_PARAMS, with_query, TOKEN)
    assert not verify_signature(CALLBACK_URL, CALLBACK_PARAMS, without_query, TOKEN)


def test_a_changed_or_added_param_is_refused() -> None:
    """The signature covers every param: a changed value or an extra field fails."""
    changed = {**CALLBACK_PARAMS, "MessageStatus": "failed"}
    added = {**CALLBACK_PARAMS, "ErrorCode": "30003"}
    assert not verify_signature(CALLBACK_URL, changed, CALLBACK_SIGNATURE, TOKEN)
    assert not verify_signature(CALLBACK_URL, added, CALLBACK_SIGNATURE, TOKEN)


@st.composite
def one_character_changed(draw: st.DrawFn) -> str:
    """The callback's valid signature with one character replaced, deleted or inserted."""
    signature = CALLBACK_SIGNATURE
    edit = draw(st.sampled_from(["replace", "delete", "insert"]))
    char = draw(st.sampled_from(BASE64_ALPHABET) | st.characters(codec="utf-8"))
    if edit == "insert":
        index = draw(st.integers(0, len(signature)))
        return signature[:index] + char + signature[index:]
    index = draw(st.integers(0, len(signature) - 1))
    if edit == "delete":
        return signature[:index] + signature[index + 1 :]
    return signature[:index] + char + signature[index + 1 :]


@given(altered=one_character_changed())
def test_any_single_character_change_to_the_signature_is_refused(altered: str) -> None:
    """Replacing, deleting or inserting any one character makes the signature fail."""
    assume(altered != CALLBACK_SIGNATURE)
    assert not verify_signature(CALLBACK_URL, CALLBACK_PARAMS, altered, TOKEN)


_names = st.text(st.characters(codec="utf-8", exclude_characters="\x00"), min_size=1, max_size=12)
_values = st.text(st.characters(codec="utf-8"), max_size=40)


@given(
    params=st.dictionaries(_names, _values, max_size=8),
    order=st.randoms(use_true_random=False),
    url=st.sampled_from([VECTOR_URL, CALLBACK_URL, "https://x.example/cb"]),
)
def test_any_params_in_any_order_sign_as_twilio_documents(
    params: dict[str, str], order: random.Random, url: str
) -> None:
    """Any params (non-ASCII too) in any insertion order: the code agrees with the oracle."""
    items = list(params.items())
    order.shuffle(items)
    shuffled = dict(items)
    expected = reference_signature(url, params, TOKEN)
    assert compute_signature(url, shuffled, TOKEN) == expected
    assert verify_signature(url, shuffled, expected, TOKEN)
