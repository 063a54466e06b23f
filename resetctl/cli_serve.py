"""``resetctl serve``: the HTTP intake, the reads, the on-call page and the provider
callbacks in one waitress process (:mod:`resetctl.serve`), registered on the command line
by :mod:`resetctl.cli`."""

from __future__ import annotations

import logging
import signal
from typing import Annotated, Any

import typer

from resetctl import api
from resetctl import cli_output as out
from resetctl.cli_command import ConfigOption, DbOption
from resetctl.cli_output import stderr
from resetctl.config import loopback_host
from resetctl.errors import ConfigError, ResetctlError
from resetctl.web import CONNECTION_LIMIT, REQUEST_TIMEOUT

LOGGER = logging.getLogger("resetctl.serve")

#: Seconds a request waits for the database's write lock (a sweep's) before its 503.
BUSY_TIMEOUT = 10.0

#: The options ``serve`` and ``serve-callbacks`` share: their waitress limits.
MaxConnectionsOption = Annotated[
    int, typer.Option(min=1, help="Client connections at once; more wait to be accepted.")
]
RequestTimeoutOption = Annotated[
    str,
    typer.Option(
        help="A request must arrive whole within this of its first byte; idle"
        " connections close after as long."
    ),
]


def serve(
    bind: Annotated[
        str,
        typer.Option("--bind", help="host:port to listen on; a TLS-terminating proxy fronts it."),
    ] = "127.0.0.1:8080",
    trusted_proxy: Annotated[
        str | None,
        typer.Option(
            "--trusted-proxy",
            help="The reverse proxy's IP address: a callback's signed scheme and host come"
            " from the X-Forwarded-Proto/-Host it adds, dropped from any other peer.",
        ),
    ] = None,
    max_connections: MaxConnectionsOption = CONNECTION_LIMIT,
    request_timeout: RequestTimeoutOption = f"{REQUEST_TIMEOUT:g}s",
    threads: Annotated[int, typer.Option(min=1, max=256, help="Worker threads.")] = 8,
    db: DbOption = None,
    config: ConfigOption = None,
) -> None:
    """Serve the HTTP intake, the reads, the on-call page and the provider callbacks.

    Every /v1 route needs a bearer token from the file [serve] tokens_file names (0600;
    one [tokens.NAME] table per token, with its scopes: enqueue, read, cancel). The page
    (/) takes the same token as the password of HTTP Basic.

    POST /v1/notices enqueues one request as enqueue does (Idempotency-Key header,
    ?send=1 to submit now): 201 new, 200 the same key and body again, 409 the key with
    another body, 422 a bad field or a policy refusal, 429 an abuse limit. GET
    /v1/notices/ID, GET /v1/notices?phase=..., POST /v1/notices/ID/cancel, GET
    /v1/health, /healthz and /metrics answer as inspect, list, cancel, health and
    metrics do. A body over 64 KiB is refused from its headers (413). Listens on
    loopback unless told. Needs the web extra: pip install 'resetctl[web]'. SIGTERM stops
    it.

    Example:

        resetctl serve --bind 127.0.0.1:8080 --config /etc/resetctl/resetctl.toml
    """
    try:
        import waitress  # noqa: F401  # only asks whether the web extra is installed
    except ImportError:
        raise ConfigError("serve needs waitress: pip install 'resetctl[web]'") from None
    from resetctl.serve import callback_apps, load_tokens, serve_app, tokens_path
    from resetctl.web import bind_address, request_timeout_seconds

    host, _ = bind_address(bind)
    timeout = request_timeout_seconds(request_timeout)
    with api.open(db, config, create=False, busy_timeout=BUSY_TIMEOUT) as handle:
        # Before listening: a missing or readable tokens file stops it here (exit 2).
        tokens = load_tokens(tokens_path(handle.settings))
        callbacks = callback_apps(handle, trust_forwarded=trusted_proxy is not None)
        application = serve_app(
            handle, tokens, public=handle.settings.serve_public, callbacks=callbacks
        )
        server = listening(
            application,
            bind,
            threads=threads,
            max_connections=max_connections,
            request_timeout=timeout,
            trusted_proxy=trusted_proxy,
            what="resetctl",
        )
        stderr.print(
            f"tokens: {', '.join(tokens.names)}; callbacks: {', '.join(callbacks) or 'none'};"
            f" without a token: {', '.join(handle.settings.serve_public) or 'nothing'}",
            markup=False,
        )
        if not loopback_host(host):
            LOGGER.warning(
                "serve: --bind %s is not loopback: tokens travel in clear unless a"
                " TLS-terminating proxy is the only way in",
                host,
            )
        run_until_terminated(server)


def listening(
    application: Any,
    bind: str,
    *,
    threads: int,
    max_connections: int,
    request_timeout: float,
    trusted_proxy: str | None,
    what: str | None = None,
) -> Any:
    """A waitress server for ``application`` listening on ``bind`` (HOST:PORT), its
    addresses announced on stderr; a port it cannot take is one line naming --bind."""
    from resetctl.web import bind_address, callback_server

    host, port = bind_address(bind)
    try:
        server = callback_server(
            application,
            host,
            port,
            threads=threads,
            connection_limit=max_connections,
            request_timeout=request_timeout,
            trusted_proxy=trusted_proxy,
        )
    except OSError as exc:
        raise ResetctlError(f"--bind {bind}: cannot listen ({exc.strerror})") from None
    # One socket, or several when the host name resolves to more than one address.
    addresses = getattr(server, "effective_listen", None) or [
        (server.effective_host, server.effective_port)
    ]
    if what is None:
        out.serving(addresses)
    else:
        out.serving(addresses, what)
    return server


def run_until_terminated(server: Any) -> None:
    """Serve until SIGTERM (or Ctrl-C): waitress's loop closes its sockets and threads."""

    def stop(*_: object) -> None:
        raise SystemExit(0)

    previous = signal.signal(signal.SIGTERM, stop)
    try:
        server.run()
    finally:
        signal.signal(signal.SIGTERM, previous)
