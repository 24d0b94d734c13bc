"""A stand-in for Prometheus' query API on a loopback socket, for the report's unit tests: each
query is answered by the first rule whose regular expression it matches (an empty vector, or an
empty matrix, when none does).  The report's real queries are proven on a real Prometheus in
tests/agent/report/test_report_e2e.py; this only feeds chosen answers to the code around them."""

from __future__ import annotations

import json
import re
import threading
import urllib.parse
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any


@dataclass
class Rule:
    pattern: str
    result: list[dict[str, Any]]  # Prometheus' "result": [{"metric": {...}, "value": [t, "v"]}] or "values"


def vector(*samples: tuple[dict[str, str], float]) -> list[dict[str, Any]]:
    return [{"metric": labels, "value": [0, repr(value)]} for labels, value in samples]


def matrix(*series: tuple[dict[str, str], list[tuple[float, float]]]) -> list[dict[str, Any]]:
    return [{"metric": labels, "values": [[t, repr(v)] for t, v in points]} for labels, points in series]


@dataclass
class FakePrometheus:
    rules: list[Rule] = field(default_factory=list)
    seen: list[str] = field(default_factory=list)  # every query asked, in order
    url: str = ""
    raw: bytes | None = None  # answer this instead (a server that is not Prometheus)

    def answer(self, endpoint: str, query: str) -> dict[str, Any]:
        self.seen.append(query)
        for rule in self.rules:
            if re.search(rule.pattern, query):
                result = rule.result
                break
        else:
            result = []
        kind = "matrix" if endpoint == "query_range" else "vector"
        return {"status": "success", "data": {"resultType": kind, "result": result}}


@contextmanager
def serving(fake: FakePrometheus) -> Iterator[FakePrometheus]:
    class Handler(BaseHTTPRequestHandler):
        def do_POST(self) -> None:  # noqa: N802 (http.server's name)
            length = int(self.headers.get("Content-Length", "0"))
            form = urllib.parse.parse_qs(self.rfile.read(length).decode())
            endpoint = self.path.rsplit("/", 1)[-1]
            answer = fake.answer(endpoint, form["query"][0])
            body = fake.raw if fake.raw is not None else json.dumps(answer).encode()
            self.send_response(200)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def log_message(self, *args: object) -> None:
            pass

    server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    fake.url = f"http://127.0.0.1:{server.server_address[1]}"
    try:
        yield fake
    finally:
        server.shutdown()
        server.server_close()
        thread.join(5)
