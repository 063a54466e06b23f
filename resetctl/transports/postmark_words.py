"""Postmark's words: its message statuses, event types and bounce types, and their one
mapping to the normalized vocabulary (shared by status reads and webhooks)."""

from __future__ import annotations

from collections.abc import Mapping

from resetctl.machine import Status
from resetctl.transports.base import StatusVocabulary

# Postmark's word -> normalized status. Keys are Postmark's spelling; lookups ignore case.
#   Queued         pending    Postmark holds it and has not sent it yet
#   Sent           accepted   Postmark passed it on; no word from the recipient's server yet
#   Processed      accepted   as Sent
#   Transient      pending    the recipient's server deferred it; Postmark keeps retrying
#   Delivered      delivered  the recipient's server took it
#   Opened         delivered  an open implies delivery (tracking is off, so rarely seen)
#   LinkClicked    delivered  as Opened
#   Bounced        failed     a bounce event: it will not arrive
#   SpamComplaint  failed     the recipient refused it
# A Bounce webhook's Type, from Postmark's bounce type list (Transient and SpamComplaint
# are also event types above, with the same meaning):
#   failed: Postmark says this message will not reach the person's mailbox
#     HardBounce, BadEmailAddress  the address does not exist or is not valid
#     SoftBounce     Postmark has ceased attempting this message ("a temporary problem"
#                    is the address's, not a retry: its support article on soft bounces)
#     Blocked, DMARCPolicy  the receiving ISP refused it (content, blocklist, DMARC)
#     SpamNotification  "blocked by the user, or classified as spam": not where they read
#     VirusNotification  quarantined as infected
#     ChallengeVerification  held until the sender answers a challenge; nobody will
#     ManuallyDeactivated, Unconfirmed  Postmark will not deliver to the address
#     SMTPApiError, TemplateRenderingFailed  Postmark never sent it
#   pending: delivery is delayed and may still happen (the poll budget decides)
#     Transient ("message delayed"), DnsError ("a temporary DNS error")
#   unknown: a documented word that says nothing about whether this message arrives
#     AutoResponder (Postmark files nondescript NDRs there too), Unsubscribe,
#     Subscribe, AddressChange (replies), OpenRelayTest, InboundError (inbound only),
#     Unknown ("unable to classify the NDR")
#   anything else  unknown
_NORMALIZED = {
    "Queued": Status.PENDING,
    "Sent": Status.ACCEPTED,
    "Processed": Status.ACCEPTED,
    "Transient": Status.PENDING,
    "Delivered": Status.DELIVERED,
    "Opened": Status.DELIVERED,
    "LinkClicked": Status.DELIVERED,
    "Bounced": Status.FAILED,
    "SpamComplaint": Status.FAILED,
    "HardBounce": Status.FAILED,
    "BadEmailAddress": Status.FAILED,
    "SoftBounce": Status.FAILED,
    "Blocked": Status.FAILED,
    "DMARCPolicy": Status.FAILED,
    "SpamNotification": Status.FAILED,
    "VirusNotification": Status.FAILED,
    "ChallengeVerification": Status.FAILED,
    "ManuallyDeactivated": Status.FAILED,
    "Unconfirmed": Status.FAILED,
    "SMTPApiError": Status.FAILED,
    "TemplateRenderingFailed": Status.FAILED,
    "DnsError": Status.PENDING,
    "AutoResponder": Status.UNKNOWN,
    "Unsubscribe": Status.UNKNOWN,
    "Subscribe": Status.UNKNOWN,
    "AddressChange": Status.UNKNOWN,
    "OpenRelayTest": Status.UNKNOWN,
    "InboundError": Status.UNKNOWN,
    "Unknown": Status.UNKNOWN,
}
_FOLDED = {raw.casefold(): status for raw, status in _NORMALIZED.items()}
POSTMARK_STATUSES = frozenset(_NORMALIZED)
#: Postmark's bounce types and their TypeCodes, as its Bounce API documents them: the
#: words a Bounce webhook's Type may hold (a Type outside them is unknown evidence).
BOUNCE_TYPE_CODES: Mapping[str, int] = {
    "HardBounce": 1,
    "Transient": 2,
    "Unsubscribe": 16,
    "Subscribe": 32,
    "AutoResponder": 64,
    "AddressChange": 128,
    "DnsError": 256,
    "SpamNotification": 512,
    "OpenRelayTest": 1024,
    "Unknown": 2048,
    "SoftBounce": 4096,
    "VirusNotification": 8192,
    "ChallengeVerification": 16384,
    "BadEmailAddress": 100000,
    "SpamComplaint": 100001,
    "ManuallyDeactivated": 100002,
    "Unconfirmed": 100003,
    "Blocked": 100006,
    "SMTPApiError": 100007,
    "InboundError": 100008,
    "DMARCPolicy": 100009,
    "TemplateRenderingFailed": 100010,
}
_BOUNCE_TYPE_OF_CODE = {code: name for name, code in BOUNCE_TYPE_CODES.items()}


def normalize(raw: str) -> Status:
    """Map a Postmark message status or event type to the normalized vocabulary."""
    return _FOLDED.get(raw.strip().casefold(), Status.UNKNOWN)


_SPELLED = {raw.casefold(): raw for raw in _NORMALIZED}


def documented_spelling(raw: str) -> str | None:
    """Postmark's own spelling of a status or event type ``normalize`` reads written
    another way (case, surrounding space); None for any other word."""
    return _SPELLED.get(raw.strip().casefold())


#: Postmark's words and their mapping; what is recorded of a status is its evidence.
VOCABULARY = StatusVocabulary("postmark", POSTMARK_STATUSES, normalize, documented_spelling)
