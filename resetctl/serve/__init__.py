"""``resetctl serve``: one HTTP service for applications in any language and for on-call.

- The intake and the reads (``/v1``): enqueue with an Idempotency-Key, inspect, list,
  cancel, health, as the commands do (:mod:`resetctl.serve.routes`);
- ``/healthz`` (the database answers) and ``/metrics`` (the textfile's exposition);
- the on-call page (``/``, ``/notices/{id}``: :mod:`resetctl.serve.page`);
- the provider callbacks ``serve-callbacks`` serves (:mod:`resetctl.web`).

:func:`serve_app` is the WSGI application, to mount in another server; ``resetctl serve``
runs it under waitress with :func:`resetctl.web.callback_server`'s limits. Everything goes
through the :class:`resetctl.Handle`: no rule or SQL lives here.
"""

from __future__ import annotations

from resetctl.serve.app import MAX_BODY, callback_apps, serve_app
from resetctl.serve.tokens import SCOPES, Token, Tokens, load_tokens, tokens_path

__all__ = [
    "MAX_BODY",
    "SCOPES",
    "Token",
    "Tokens",
    "callback_apps",
    "load_tokens",
    "serve_app",
    "tokens_path",
]
