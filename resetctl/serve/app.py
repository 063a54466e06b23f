"""The WSGI application (PEP 3333) ``resetctl serve`` runs: routing, authentication, the
audit line, and the provider callbacks mounted beside them.

Every ``/v1`` route takes a bearer token (``Authorization: Bearer …``) with its scope:
``enqueue`` for ``POST /v1/notices``, ``cancel`` for a cancel, ``read`` for the rest, the
page, ``/healthz`` and ``/metrics`` (the last two may be opened by ``[serve] public``).
The page takes the same token as HTTP Basic credentials (any user name, the token as
password) so a browser can open it; the API never does, so a browser that remembers
them cannot be made to enqueue or cancel by another site's form. The page only reads.

Answers: 401 no token or an unknown one; 403 a token without the route's scope; 404 no
such route or notice; 405 a route that does not take the method (``Allow`` lists what it
takes); 413 a body over the limit, from Content-Length before any of it is read; 415 a
body that is not JSON; 503 the database is unavailable. No answer, log line or error
carries a token, a contact datum or a reset URL.
"""

from __future__ import annotations

import base64
import logging
import threading
import time
from collections.abc import Callable, Iterable, Mapping
from typing import TYPE_CHECKING, Any
from urllib.parse import parse_qs, quote, urlsplit

from resetctl.errors import ConfigError, NoticeNotFound, ResetctlError, StoreError
from resetctl.serve import page, routes
from resetctl.serve.replies import COMMON_HEADERS, Reply, problem_reply, status_line
from resetctl.serve.tokens import Token, Tokens

if TYPE_CHECKING:
    from wsgiref.types import StartResponse, WSGIApplication, WSGIEnvironment

    from resetctl.api import Handle

LOGGER = logging.getLogger("resetctl.serve")

#: Largest body accepted: one enqueue request (``resetctl enqueue``'s line limit).
MAX_BODY = 64 * 1024
#: Serve's own paths (and what is under them), refused as a callback's mount point.
_OWN_PATHS = ("/v1", "/notices", "/healthz", "/metrics")

#: What answers a route.
Answer = Callable[["Handle", "Request"], Reply]


class Request:
    """What a route reads of one request."""

    __slots__ = ("args", "base", "body", "environ", "query", "writes")

    def __init__(
        self,
        environ: WSGIEnvironment,
        args: tuple[str, ...],
        body: bytes,
        writes: threading.Lock,
    ) -> None:
        self.environ = environ
        self.args = args
        self.body = body
        #: the application's one writer at a time (see :func:`routes.enqueue`)
        self.writes = writes
        #: where the application is mounted (SCRIPT_NAME), before every link it makes
        self.base = mount_point(environ)
        self.query: dict[str, list[str]] = parse_qs(
            str(environ.get("QUERY_STRING", "")), keep_blank_values=True
        )


def _enqueue(handle: Handle, request: Request) -> Reply:
    key = _header_text(request.environ.get("HTTP_IDEMPOTENCY_KEY"))
    routes.only_parameters(request.query, ("send",))
    send = routes.flag(request.query, "send")
    return routes.enqueue(handle, key, request.body, send, request.writes, request.base)


#: (method, path pattern) → (the route's name for the audit line, the scope it needs,
#: whether a browser's Basic credentials open it, what answers it). ``{}`` in a pattern
#: is one path segment (a notice id).
_ROUTES: dict[tuple[str, str], tuple[str, str, bool, Answer]] = {
    ("POST", "/v1/notices"): ("enqueue", "enqueue", False, _enqueue),
    ("GET", "/v1/notices"): ("list", "read", False, lambda h, r: routes.find(h, r.query)),
    ("GET", "/v1/notices/{}"): ("inspect", "read", False, lambda h, r: routes.inspect(h, *r.args)),
    ("POST", "/v1/notices/{}/cancel"): (
        "cancel",
        "cancel",
        False,
        lambda h, r: routes.cancel(h, r.args[0], r.body),
    ),
    ("GET", "/v1/health"): ("health", "read", False, lambda h, r: routes.health(h, r.query)),
    ("GET", "/healthz"): ("healthz", "read", False, lambda h, r: routes.healthz(h)),
    ("GET", "/metrics"): ("metrics", "read", False, lambda h, r: routes.metrics(h)),
    ("GET", "/"): ("page", "read", True, lambda h, r: page.index(h, r.query, r.base)),
    ("GET", "/notices/{}"): ("page", "read", True, lambda h, r: page.notice(h, r.args[0], r.base)),
}


def serve_app(
    handle: Handle,
    tokens: Tokens,
    *,
    public: Iterable[str] = (),
    callbacks: Mapping[str, WSGIApplication] | None = None,
    max_body: int = MAX_BODY,
) -> WSGIApplication:
    """The WSGI application over ``handle``: the intake, the reads, the page.

    ``tokens`` are the accepted bearer tokens (:func:`resetctl.serve.tokens.load_tokens`);
    ``public`` the paths served without one (``/healthz``, ``/metrics``); ``callbacks``
    maps a path to a provider's callback application (:func:`callback_apps`), which
    checks its provider's signature instead of a token.
    """
    opened = frozenset(public)
    mounted = dict(callbacks or {})
    writes = threading.Lock()

    def application(environ: WSGIEnvironment, start_response: StartResponse) -> Iterable[bytes]:
        path = str(environ.get("PATH_INFO") or "/")
        if path in mounted:
            return mounted[path](environ, start_response)
        began = time.perf_counter()
        reply, caller, name = _answer(handle, tokens, opened, max_body, environ, path, writes)
        _audit(caller, name, reply, time.perf_counter() - began)
        headers = [
            ("Content-Type", reply.content_type),
            ("Content-Length", str(len(reply.body))),
            *COMMON_HEADERS,
            *reply.headers,
        ]
        start_response(status_line(reply.status), headers)
        return [reply.body]

    return application


def _answer(
    handle: Handle,
    tokens: Tokens,
    public: frozenset[str],
    max_body: int,
    environ: WSGIEnvironment,
    path: str,
    writes: threading.Lock,
) -> tuple[Reply, Token | None, str]:
    """The reply to one request, who made it, and the route's name."""
    method = str(environ.get("REQUEST_METHOD", "GET"))
    found = _route("GET" if method == "HEAD" else method, path)
    if isinstance(found, Reply):
        return found, None, "-"
    (name, scope, basic, answer), args = found
    caller = None
    if path not in public:
        presented = _credentials(environ, basic)
        caller = None if presented is None else tokens.find(presented)
        if caller is None:
            return _unauthorized(presented is None, basic, mount_point(environ)), None, name
        if scope not in caller.scopes:
            return _forbidden(caller, scope), caller, name
    try:
        body = _body(environ, max_body) if method == "POST" else b""
        return answer(handle, Request(environ, args, body, writes)), caller, name
    except routes.BadRequest as refused:
        return refused.reply, caller, name
    except NoticeNotFound:
        if basic:
            return page.not_found(mount_point(environ)), caller, name
        return problem_reply(404, "no such notice"), caller, name
    except StoreError as exc:
        LOGGER.error("serve: %s answered 503: %s", name, exc)
        return problem_reply(503, "the database is unavailable; retry"), caller, name
    except ResetctlError as exc:
        LOGGER.error("serve: %s answered 500: %s", name, exc)
        return problem_reply(500, str(exc)), caller, name
    except Exception as exc:  # never takes the server down, nor leaks a payload
        LOGGER.error("serve: %s answered 500: %s", name, type(exc).__name__)
        return problem_reply(500, "internal error"), caller, name


def _route(method: str, path: str) -> tuple[tuple[str, str, bool, Answer], tuple[str, ...]] | Reply:
    """The route for ``method`` and ``path`` with the segments its pattern left open;
    else the 404 or 405 answer."""
    segments = path.split("/")
    allowed = []
    for (verb, pattern), route in _ROUTES.items():
        parts = pattern.split("/")
        if len(parts) != len(segments):
            continue
        if not all(p == s or (p == "{}" and s) for p, s in zip(parts, segments, strict=True)):
            continue
        if verb == method:
            args = tuple(s for p, s in zip(parts, segments, strict=True) if p == "{}")
            return route, args
        allowed.append(verb)
    if allowed:
        verbs = ", ".join(sorted({*allowed, *(["HEAD"] if "GET" in allowed else [])}))
        return problem_reply(405, f"use {verbs}", headers=(("Allow", verbs),))
    return problem_reply(404, "no such route")


def _credentials(environ: WSGIEnvironment, basic: bool) -> str | None:
    """The token the request presents: a bearer token, or (where ``basic``) Basic
    credentials' password. None when it presents none; "" for credentials that cannot
    hold one."""
    header = str(environ.get("HTTP_AUTHORIZATION", "")).strip()
    if not header:
        return None
    scheme, _, value = header.partition(" ")
    if scheme.lower() == "bearer":
        return value.strip()
    if basic and scheme.lower() == "basic":
        try:
            decoded = base64.b64decode(value.strip(), validate=True).decode("utf-8")
        except ValueError:  # binascii.Error and UnicodeDecodeError both are
            return ""
        return decoded.partition(":")[2]
    return ""


def _unauthorized(absent: bool, basic: bool, base: str) -> Reply:
    if basic:
        # A browser asks for the credentials again; the realm names what they open.
        return page.unauthorized(base)
    error = "" if absent else ', error="invalid_token"'
    challenge = (("WWW-Authenticate", f'Bearer realm="resetctl"{error}'),)
    problem = "send Authorization: Bearer <token>" if absent else "unknown token"
    return problem_reply(401, problem, headers=challenge)


def _forbidden(caller: Token, scope: str) -> Reply:
    challenge = f'Bearer realm="resetctl", error="insufficient_scope", scope="{scope}"'
    return problem_reply(
        403,
        f"token {caller.name} lacks the {scope} scope",
        headers=(("WWW-Authenticate", challenge),),
    )


def _body(environ: WSGIEnvironment, max_body: int) -> bytes:
    """The request body, at most ``max_body`` bytes: a larger Content-Length is refused
    before any of it is read (the server refuses it first; this holds when mounted)."""
    media = str(environ.get("CONTENT_TYPE", "")).partition(";")[0].strip().lower()
    try:
        length = int(environ.get("CONTENT_LENGTH") or 0)
    except ValueError:
        length = -1
    if length < 0:
        raise routes.BadRequest(problem_reply(400, "a bad Content-Length"))
    if length > max_body:
        raise routes.BadRequest(problem_reply(413, f"the body is over {max_body} bytes"))
    if length and media != "application/json":
        raise routes.BadRequest(problem_reply(415, "send Content-Type: application/json"))
    body: bytes = environ["wsgi.input"].read(length) if length else b""
    if len(body) != length:
        raise routes.BadRequest(problem_reply(400, "the body ended before its Content-Length"))
    return body


def mount_point(environ: WSGIEnvironment) -> str:
    """The path the application is mounted at (SCRIPT_NAME, "" at the root), as a URL
    path: the links and redirects it makes start with it."""
    return quote(str(environ.get("SCRIPT_NAME", "")).rstrip("/"), safe="/")


def _header_text(value: object) -> str | None:
    """A header's text: WSGI hands it over as Latin-1 code points of its bytes, which
    are UTF-8."""
    if not value:
        return None
    try:
        return str(value).encode("latin-1").decode("utf-8")
    except (UnicodeEncodeError, UnicodeDecodeError):
        return "\ufffd"  # invalid: enqueue refuses it as the field it is


def _audit(caller: Token | None, name: str, reply: Reply, seconds: float) -> None:
    """One line per request: who (the token's name), which route, the status, the notice
    and how long the answer took to make (ms); never the token or anything the request
    carried."""
    level = logging.INFO if reply.status < 400 or caller is not None else logging.WARNING
    if not LOGGER.isEnabledFor(level):
        return
    fields = {
        "token": None if caller is None else caller.name,
        "route": name,
        "status": reply.status,
        "notice_id": reply.notice_id,
        "ms": round(seconds * 1000, 2),
    }
    # The log formatters print a record's "transition" fields as key=value (text) or as
    # keys of the line (json): the audit line's fields go there too.
    LOGGER.log(level, "audit", extra={"transition": fields})


def callback_apps(handle: Handle, *, trust_forwarded: bool = False) -> dict[str, Any]:
    """The provider callbacks to mount, by path: each instance that takes callbacks and
    has a public URL (``[twilio] status_callback``, a ``webhook_url`` …), at that URL's
    path (a signature may cover it, so a proxy passes the path through as is).
    ConfigError when a path is one of serve's own, or two instances share one."""
    from resetctl.transports import plugin
    from resetctl.web import provider_callbacks

    mounted: dict[str, Any] = {}
    settings = handle.settings
    configured = [n for n, options in sorted(settings.transport_options.items()) if options]
    for name in dict.fromkeys([*settings.used_instances(), *configured]):
        instance = settings.instances[name]
        found = plugin(instance.kind)
        if found is None or found.callbacks is None:
            continue
        url = handle.callback_reader(name).public_url
        if not url:
            continue
        path = urlsplit(url).path or "/"
        if path == "/" or any(path == own or path.startswith(own + "/") for own in _OWN_PATHS):
            raise ConfigError(
                f"{instance.where}: its callback path is one of serve's own routes; use"
                f" another, e.g. /callbacks/{name}"
            )
        if path in mounted:
            raise ConfigError(f"{instance.where}: its callback path is another instance's")
        mounted[path] = provider_callbacks(handle, name, trust_forwarded=trust_forwarded)
    return mounted
