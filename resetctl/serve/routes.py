"""The ``/v1`` routes, ``/healthz`` and ``/metrics``: each makes the call its command makes
on the handle and answers the document that command prints with ``--json``.

``POST /v1/notices`` is ``resetctl enqueue`` for one request: the same validation and
idempotency, answered with the same line. How its outcomes become statuses:

- 201 a new notice (``Location`` names it); 200 the same Idempotency-Key with the same
  fields: the stored notice's line (with ``?send=1``, what this call's submission did);
- 409 the key already names a notice enqueued with different fields;
- 422 a field is invalid, or the region's policy refuses the request (consent, a
  destination, no channel left); 429 a per-recipient abuse limit refused it. A refusal's
  body is its enqueue line (``refused``, ``field``); nothing is stored for it, and no
  Retry-After is given: the API cannot say when the limit's window frees a slot;
- 400 no Idempotency-Key header (as the IETF idempotency-key draft asks), or a body that
  is not JSON; 415 a body that is not ``application/json``;
- 503 the database is unavailable (retry with the same key), or ``?send=1`` cannot send
  (a transport, template or lease problem: nothing was written).

Validation problems name the field and what is wrong with it, never the value.
"""

from __future__ import annotations

import json
import logging
import re
import tempfile
from collections.abc import Mapping, Sequence
from contextlib import AbstractContextManager, nullcontext
from pathlib import Path
from typing import TYPE_CHECKING, Any

from resetctl.durations import parse_duration, parse_time_or_ago
from resetctl.errors import ConfigError, InputError
from resetctl.machine import CANCEL_REASONS
from resetctl.serve.replies import PROMETHEUS, Reply, error_name, json_reply, problem_reply

if TYPE_CHECKING:
    from resetctl.api import EnqueueResult, Handle

LOGGER = logging.getLogger("resetctl.serve")

#: ``list``'s filters, as query parameters (``phase`` repeatable).
LIST_PARAMETERS = ("phase", "region", "account", "since", "at_risk", "limit")
#: The most notices one ``GET /v1/notices`` returns (``resetctl list --limit``'s bound).
MAX_LIST = 10_000
_CONFLICT = "already used with different fields"
_LINE = re.compile(r"line \d+: ")
_TRUE, _FALSE = ("1", "true", "yes"), ("0", "false", "no")


class BadRequest(Exception):
    """A request the route cannot take: answered with ``reply`` as it is."""

    def __init__(self, reply: Reply) -> None:
        super().__init__(reply.status)
        self.reply = reply


def enqueue(
    handle: Handle,
    header_key: str | None,
    body: bytes,
    send: bool,
    writes: AbstractContextManager[Any],
    base: str = "",
) -> Reply:
    """``POST /v1/notices``: one request, keyed by its Idempotency-Key header.

    Without ``send`` the write is made holding ``writes``, the process's one writer at a
    time: SQLite takes one writer anyway, and a thread that finds the file locked sleeps
    in its busy handler (1, 2, 5, 10 … 100 ms), where one waiting on a lock here wakes as
    soon as the write before it commits. With ``send`` it is not held: the submission
    waits on a provider, and other requests must not wait on it."""
    if not header_key:
        raise BadRequest(
            problem_reply(400, "the Idempotency-Key header is required", field="Idempotency-Key")
        )
    request = json_object(body)
    named = request.get("idempotency_key", header_key)
    if named != header_key:
        raise BadRequest(
            problem_reply(422, "differs from the Idempotency-Key header", field="idempotency_key")
        )
    request["idempotency_key"] = header_key
    try:
        with nullcontext() if send else writes:
            (result,) = handle.enqueue([request], send=send)
    except InputError as exc:
        raise BadRequest(_input_problems(exc.problems)) from None
    except ConfigError as exc:  # only with send: nothing was written
        LOGGER.error("serve: enqueue ?send=1 answered 503: %s", exc)
        raise BadRequest(problem_reply(503, f"cannot send now: {exc}")) from None
    return _enqueued(result, base)


def _enqueued(result: EnqueueResult, base: str) -> Reply:
    line = result.to_json()
    if result.notice_id is None:
        status = 429 if line.get("refused") == "rate_limited" else 422
        return json_reply(status, line)
    if result.created:
        location = (("Location", f"{base}/v1/notices/{result.notice_id}"),)
        return json_reply(201, line, headers=location, notice_id=result.notice_id)
    return json_reply(200, line, notice_id=result.notice_id)


def _input_problems(problems: Sequence[str]) -> Reply:
    """InputError's problems as an answer: 409 for a key used with other fields, 422 for
    the fields of the request, 500 for a problem with the server's own config."""
    found = [_field_and_problem(problem) for problem in problems]
    if any(field is None for field, _ in found):
        # No line named: a policy record the config must fix, not the request.
        text = "; ".join(problem for _, problem in found)
        LOGGER.error("serve: enqueue answered 500: %s", text)
        return problem_reply(500, text)
    if any(f == "idempotency_key" and p == _CONFLICT for f, p in found):
        return problem_reply(409, _CONFLICT, field="idempotency_key")
    listed = [{"field": field, "problem": problem} for field, problem in found]
    first_field, first_problem = found[0]
    document = {
        "error": error_name(422),
        "problem": first_problem,
        "field": first_field,
        "problems": listed,
    }
    return json_reply(422, document)


def _field_and_problem(problem: str) -> tuple[str | None, str]:
    """``line 1: reset_url: must be …`` → ("reset_url", "must be …"); the whole request
    (``(line)``) is the ``(body)`` here."""
    if not _LINE.match(problem):
        return None, problem
    field, _, text = _LINE.sub("", problem, count=1).partition(": ")
    return ("(body)" if field == "(line)" else field), text


def json_object(body: bytes) -> dict[str, Any]:
    """The body as a JSON object; BadRequest (400) for one that is not JSON, 422 for JSON
    that is not an object."""
    try:
        document = json.loads(body.decode("utf-8"))
    except (UnicodeDecodeError, ValueError, RecursionError):
        raise BadRequest(problem_reply(400, "not valid JSON (UTF-8)", field="(body)")) from None
    if not isinstance(document, dict):
        raise BadRequest(problem_reply(422, "expected a JSON object", field="(body)"))
    return document


def inspect(handle: Handle, notice_id: str) -> Reply:
    """``GET /v1/notices/{id}``: ``resetctl inspect --json``."""
    return json_reply(200, handle.inspect(notice_id), notice_id=notice_id)


def cancel(handle: Handle, notice_id: str, body: bytes) -> Reply:
    """``POST /v1/notices/{id}/cancel``, body ``{"reason": "completed"}`` (optional;
    default withdrawn): ``resetctl cancel --json``."""
    request = json_object(body) if body.strip() else {}
    unknown = [key for key in request if key != "reason"]
    if unknown:
        raise BadRequest(problem_reply(422, "unknown field", field=_shown(unknown[0])))
    reason = request.get("reason", "withdrawn")
    if not isinstance(reason, str):
        raise BadRequest(problem_reply(422, "expected a string", field="reason"))
    try:
        result = handle.cancel(notice_id, reason=reason)
    except InputError:  # the one thing a cancel's input can get wrong
        choices = ", ".join(r.value for r in CANCEL_REASONS)
        raise BadRequest(problem_reply(422, f"expected one of {choices}", field="reason")) from None
    return json_reply(200, result.to_json(), notice_id=notice_id)


def find(handle: Handle, query: Mapping[str, list[str]]) -> Reply:
    """``GET /v1/notices?phase=…&region=…&account=…&since=…&at_risk=1&limit=…``:
    ``resetctl list --json`` with those filters."""
    only_parameters(query, LIST_PARAMETERS)
    since = _one(query, "since")
    limit_text = _one(query, "limit") or "50"
    if not limit_text.isdigit() or not 1 <= int(limit_text) <= MAX_LIST:
        raise BadRequest(problem_reply(422, f"expected 1 to {MAX_LIST}", field="limit"))
    try:
        start = None if since is None else parse_time_or_ago(since, "since", handle.clock())
        rows = handle.find(
            phases=query.get("phase", []),
            region=_one(query, "region"),
            account=_one(query, "account"),
            since=start,
            at_risk=flag(query, "at_risk"),
            limit=int(limit_text),
        )
    except (ConfigError, InputError) as exc:
        raise BadRequest(_parameter_problem(exc)) from None
    return json_reply(200, rows)


def health(handle: Handle, query: Mapping[str, list[str]]) -> Reply:
    """``GET /v1/health?window=1h&storage=1&retention=30d``: ``resetctl health --json``."""
    only_parameters(query, ("window", "storage", "retention"))
    try:
        window = parse_duration(_one(query, "window") or "5m", "window")
        retention = parse_duration(_one(query, "retention") or "30d", "retention")
    except ConfigError as exc:
        raise BadRequest(_parameter_problem(exc)) from None
    storage = flag(query, "storage")
    return json_reply(200, handle.health(window, storage=storage, retention=retention))


def healthz(handle: Handle) -> Reply:
    """``GET /healthz``: liveness, one indexed read (the live notices, at most one)."""
    handle.find(phases=("queued",), limit=1)
    return json_reply(200, {"status": "ok"})


def metrics(handle: Handle) -> Reply:
    """``GET /metrics``: the textfile ``resetctl metrics`` writes, byte for byte (written
    by the same call into a private scratch directory, then read back)."""
    with tempfile.TemporaryDirectory(prefix="resetctl-metrics-") as scratch:
        textfile = Path(scratch) / "resetctl.prom"
        handle.write_metrics(textfile)
        text = textfile.read_bytes()
    return Reply(200, text, PROMETHEUS)


def _parameter_problem(exc: ConfigError | InputError) -> Reply:
    text = exc.problems[0] if isinstance(exc, InputError) else str(exc)
    field, _, problem = text.partition(": ")
    return problem_reply(422, problem or text, field=field if problem else None)


def only_parameters(query: Mapping[str, list[str]], names: Sequence[str]) -> None:
    """BadRequest (422) naming the first query parameter not among ``names``."""
    unknown = [name for name in query if name not in names]
    if unknown:
        raise BadRequest(
            problem_reply(
                422, f"unknown parameter (expected {', '.join(names)})", field=_shown(unknown[0])
            )
        )


def _one(query: Mapping[str, list[str]], name: str) -> str | None:
    values = query.get(name, [])
    if len(values) > 1:
        raise BadRequest(problem_reply(422, "give it once", field=name))
    return values[0] if values else None


def flag(query: Mapping[str, list[str]], name: str) -> bool:
    """A yes/no query parameter: ``1``/``true``/``yes`` or ``0``/``false``/``no``
    (absent: no)."""
    value = (_one(query, name) or "0").lower()
    if value not in _TRUE + _FALSE:
        raise BadRequest(problem_reply(422, "expected 1 or 0", field=name))
    return value in _TRUE


def _shown(name: str) -> str:
    """A name the request chose, as an answer may repeat it (plain, bounded)."""
    return name if re.fullmatch(r"[A-Za-z0-9_.\-]{1,64}", name) else "(unnamed)"
