"""A stand-in for Prometheus' query API on a loopback socket, for the report's unit tests: each
query is answered by the first rule whose regular expression it matches, and whose `when` (if
any) accepts its times (an empty vector, matrix or series list when none does).  The report's
real queries are proven on a real Prometheus in tests/report/test_report_e2e.py; this only
feeds chosen answers to the code around them."""

from __future__ import annotations

import json
import re
import threading
import urllib.parse
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any


@dataclass
class Rule:
    pattern: str
    # Prometheus' "result": [{"metric": {...}, "value": [t, "v"]}] or "values"; for the series API
    # (asked as "series SELECTOR"), its "data": [{labels}].  Or a function of the request's times.
    result: list[dict[str, Any]] | Callable[[dict[str, float]], list[dict[str, Any]]]
    # The request's times ("time", or "start", "end" and "step"; floats) it must have, when given.
    when: Callable[[dict[str, float]], bool] | None = None


@dataclass(frozen=True)
class Request:
    endpoint: str  # "query", "query_range" or "series"
    query: str  # the expression, or the series API's "series SELECTOR"
    times: dict[str, float]


def vector(*samples: tuple[dict[str, str], float]) -> list[dict[str, Any]]:
    return [{"metric": labels, "value": [0, repr(value)]} for labels, value in samples]


def series(*labels: dict[str, str]) -> list[dict[str, Any]]:
    return [dict(each) for each in labels]


def matrix(*series: tuple[dict[str, str], list[tuple[float, float]]]) -> list[dict[str, Any]]:
    return [{"metric": labels, "values": [[t, repr(v)] for t, v in points]} for labels, points in series]


@dataclass
class FakePrometheus:
    rules: list[Rule] = field(default_factory=list)
    seen: list[str] = field(default_factory=list)  # every query asked (the series API's "series SELECTOR"), in order
    requests: list[Request] = field(default_factory=list)  # the same, with their endpoints and times
    url: str = ""
    raw: bytes | None = None  # answer this instead (a server that is not Prometheus)

    def answer(self, endpoint: str, query: str, times: dict[str, float] | None = None) -> dict[str, Any]:
        times = times or {}
        self.seen.append(query)
        self.requests.append(Request(endpoint, query, times))
        for rule in self.rules:
            if re.search(rule.pattern, query) and (rule.when is None or rule.when(times)):
                result = rule.result(times) if callable(rule.result) else rule.result
                break
        else:
            result = []
        if endpoint == "series":
            return {"status": "success", "data": result}
        kind = "matrix" if endpoint == "query_range" else "vector"
        return {"status": "success", "data": {"resultType": kind, "result": result}}


@contextmanager
def serving(fake: FakePrometheus) -> Iterator[FakePrometheus]:
    class Handler(BaseHTTPRequestHandler):
        def do_POST(self) -> None:  # noqa: N802 (http.server's name)
            length = int(self.headers.get("Content-Length", "0"))
            form = urllib.parse.parse_qs(self.rfile.read(length).decode())
            endpoint = self.path.rsplit("/", 1)[-1]
            query = form["query"][0] if "query" in form else f"series {form['match[]'][0]}"
            times = {k: float(v[0]) for k, v in form.items() if k in ("time", "start", "end", "step")}
            answer = fake.answer(endpoint, query, times)
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
