"""The trainer's metrics port: Prometheus' `/metrics`, and the run's per-step history at `/history.jsonl`.

On a cluster the per-step JSON lines are kept on the checkpoint volume, which a user cannot read from their
machine without a pod of their own. The trainer serves that same file on its metrics port, so that
`asyncrl runs plot NAME` fetches it through the API server's Service proxy (port `metrics` of the run's
`<run>-gateway` Service) and draws the curves as `asyncrl plot` does for a local run.

The file is sent as it is on disk: one JSON object per completed step, the step in progress not yet written.
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Iterable
from pathlib import Path
from typing import Any
from wsgiref.simple_server import WSGIRequestHandler, make_server

from prometheus_client import CollectorRegistry, make_wsgi_app
from prometheus_client.exposition import ThreadingWSGIServer

HISTORY_PATH = "/history.jsonl"

StartResponse = Callable[..., Any]


class _QuietHandler(WSGIRequestHandler):
    def log_message(self, format: str, *args: Any) -> None:
        """Scrapes every few seconds would flood the trainer's log."""


def metrics_app(registry: CollectorRegistry, history: Path | None) -> Callable[..., Iterable[bytes]]:
    """The WSGI app: `/history.jsonl` from `history`, anything else Prometheus' exposition of `registry`."""
    prometheus = make_wsgi_app(registry)

    def app(environ: dict[str, Any], start_response: StartResponse) -> Iterable[bytes]:
        if environ.get("PATH_INFO") != HISTORY_PATH:
            return prometheus(environ, start_response)  # type: ignore[no-any-return]
        if history is None or not history.is_file():
            why = (
                "this trainer keeps no per-step metrics file (no --metrics-file or --checkpoint-dir)"
                if history is None
                else "no step has finished yet"
            )
            start_response("404 Not Found", [("Content-Type", "text/plain; charset=utf-8")])
            return [why.encode() + b"\n"]
        body = history.read_bytes()
        start_response(
            "200 OK",
            [("Content-Type", "application/x-ndjson"), ("Content-Length", str(len(body)))],
        )
        return [body]

    return app


def serve_metrics(
    port: int, registry: CollectorRegistry, history: Path | None, *, host: str = "0.0.0.0"
) -> ThreadingWSGIServer:
    """Serve `metrics_app` on `host:port` from a daemon thread; returns the server (`.shutdown()` stops it).
    `0.0.0.0` by default: Prometheus and the API server's proxy reach the pod's IP."""
    server = make_server(
        host,
        port,
        metrics_app(registry, history),
        server_class=ThreadingWSGIServer,
        handler_class=_QuietHandler,
    )
    threading.Thread(target=server.serve_forever, name="trainer-metrics", daemon=True).start()
    return server
