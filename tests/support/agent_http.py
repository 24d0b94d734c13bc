"""A stand-in for the agent's /metrics (an in-process HTTP server on the loopback that answers
as a test tells it), and the demo's expositions as the health check reads them."""

from __future__ import annotations

import threading
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

from tests.support import GOLDEN


def exposition(scenario: str) -> str:
    """The demo's first exposition of the scenario (tests/golden/demo-*.prom); its <varies>
    stands for durations and times, none of which a verdict reads."""
    return (GOLDEN / f"demo-{scenario}.prom").read_text().replace("<varies>", "0")


@contextmanager
def agent(respond: Callable[[BaseHTTPRequestHandler], None]) -> Iterator[str]:
    """An HTTP server on the loopback whose every GET is answered by respond(handler); its URL."""

    class Handler(BaseHTTPRequestHandler):
        def do_GET(self) -> None:  # noqa: N802 (http.server's name)
            respond(self)

        def log_message(self, *args: object) -> None:
            pass

    server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    server.daemon_threads = True
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{server.server_address[1]}/metrics"
    finally:
        server.shutdown()
        server.server_close()


def answer(status: int, body: bytes, headers: dict[str, str] | None = None) -> Callable[[BaseHTTPRequestHandler], None]:
    def respond(handler: BaseHTTPRequestHandler) -> None:
        handler.send_response(status)
        for name, value in {"Content-Length": str(len(body)), **(headers or {})}.items():
            handler.send_header(name, value)
        handler.end_headers()
        handler.wfile.write(body)

    return respond
