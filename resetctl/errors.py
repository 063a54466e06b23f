"""Domain errors. The CLI turns each into its exit code in one place.

Messages name fields, keys and line numbers, never a value that could be a secret.
"""

from __future__ import annotations

import json
import re
from collections.abc import Sequence

_PLAIN = re.compile(r"[A-Za-z0-9_-]{1,64}")
#: Control characters (C0, DEL, C1), line and paragraph separators, and the bidi
#: overrides and isolates: what a terminal acts on rather than shows, or what makes text
#: display as something else (a spoofed name). Enqueue refuses them in free text; output
#: escapes them in rows written before it did.
UNSHOWABLE = re.compile(r"[\x00-\x1f\x7f-\x9f\u2028\u2029\u202a-\u202e\u2066-\u2069]")


def label(name: object) -> str:
    """A user-supplied name as it may appear in an error: plain names as they are, any
    other quoted and escaped (no newline, colon-free framing, no terminal escapes)."""
    text = str(name)
    if _PLAIN.fullmatch(text):
        return text
    quoted = json.dumps(text[:64])  # ASCII only: control characters become \uXXXX
    return quoted.replace(":", "\\u003a")


class ResetctlError(Exception):
    """Base of every error resetctl reports to a user."""

    #: the process exit code the CLI uses for this error
    exit_code = 1


class ConfigError(ResetctlError):
    """The configuration file or an option is invalid; the message names the key."""

    exit_code = 2


class InputError(ResetctlError):
    """Input lines were rejected; nothing was written."""

    exit_code = 2

    def __init__(self, problems: Sequence[str]) -> None:
        self.problems = list(problems)
        super().__init__("\n".join(self.problems))


class RequestsRefused(ResetctlError):
    """Some requests were refused by their policy (an abuse limit, consent, a
    destination); every other request was written. Each problem names its line."""

    exit_code = 2

    def __init__(self, problems: Sequence[str]) -> None:
        self.problems = list(problems)
        super().__init__("\n".join(self.problems))


class NoticeNotFound(ResetctlError):
    """No notice has the given id."""

    exit_code = 1


class StoreError(ResetctlError):
    """The database cannot be opened, read or written."""

    exit_code = 1


class SignatureMismatch(InputError):
    """A provider callback's signature does not match its body and URL: a forgery, or
    the wrong URL or token. Nothing was recorded."""


class MalformedCallback(InputError):
    """A provider callback's body is not a status report. Nothing was recorded."""
