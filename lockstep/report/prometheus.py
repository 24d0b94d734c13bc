"""The report's only way to Prometheus: instant and range queries, and the series API, over its
HTTP API (urllib).

Every query the report makes goes through `Prometheus`, which counts them (bench/report.py
prints the count) and turns every failure into one `ReportError` line: the CLI prints it and
exits 1, never a traceback.
"""

from __future__ import annotations

import gc
import json
import threading
import time
import urllib.error
import urllib.parse
import urllib.request
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Any


class ReportError(Exception):
    """A report cannot be made: the message is one line for the user."""


@dataclass(frozen=True)
class Sample:
    labels: dict[str, str]
    value: float


@dataclass(frozen=True)
class Series:
    labels: dict[str, str]
    points: list[tuple[float, float]]


def check_url(url: str) -> str:
    """The base URL without a trailing slash; ReportError when it is not an http(s) URL."""
    parsed = urllib.parse.urlsplit(url)
    if parsed.scheme not in ("http", "https") or not parsed.netloc:
        raise ReportError(f"--prometheus {url!r} is not an http:// or https:// URL")
    return url.rstrip("/")


@dataclass
class Prometheus:
    """A Prometheus server (or anything with its query API: Thanos, Mimir, VictoriaMetrics)."""

    url: str
    timeout: float = 30.0
    queries: int = 0
    log: list[tuple[str, float]] = field(default_factory=list)  # each expression sent and its seconds (bench)
    # The report's sections ask side by side (build.make_report): the count and the log under a lock.
    _counting: threading.Lock = field(default_factory=threading.Lock, repr=False, compare=False)

    def __post_init__(self) -> None:
        self.url = check_url(self.url)

    def query(self, expr: str, at: float) -> list[Sample]:
        data = self._post("query", {"query": expr, "time": _ts(at)})
        if data["resultType"] == "scalar":
            return [Sample({}, float(data["result"][1]))]
        return [Sample(dict(r["metric"]), float(r["value"][1])) for r in data["result"]]

    def query_range(self, expr: str, start: float, end: float, step: float) -> list[Series]:
        data = self._post("query_range", {"query": expr, "start": _ts(start), "end": _ts(end), "step": _ts(step)})
        with unswept():
            return [Series(dict(r["metric"]), [(float(t), float(v)) for t, v in r["values"]]) for r in data["result"]]

    def series(self, selector: str, start: float, end: float) -> list[dict[str, str]]:
        """The label sets of the series the selector matches with samples between start and end,
        from the index alone (the series API reads no samples: the cheap way to ask which ranks,
        GPUs, agents or roots a job has)."""
        data = self._post("series", {"match[]": selector, "start": _ts(start), "end": _ts(end)})
        return [dict(labels) for labels in data]

    def _post(self, endpoint: str, params: dict[str, str]) -> Any:
        with self._counting:
            self.queries += 1
        started = time.monotonic()
        try:
            return self._ask(endpoint, params)
        finally:
            with self._counting:
                self.log.append((params.get("query") or f"series {params['match[]']}", time.monotonic() - started))

    def _ask(self, endpoint: str, params: dict[str, str]) -> Any:
        body = urllib.parse.urlencode(params).encode()
        request = urllib.request.Request(
            f"{self.url}/api/v1/{endpoint}",
            data=body,
            headers={"Content-Type": "application/x-www-form-urlencoded", "Accept": "application/json"},
        )
        try:
            with urllib.request.urlopen(request, timeout=self.timeout) as response:
                payload = response.read()
        except urllib.error.HTTPError as exc:
            raise ReportError(f"Prometheus at {self.url} answered {exc.code}: {_error_of(exc.read())}") from None
        except (urllib.error.URLError, OSError) as exc:
            reason = getattr(exc, "reason", exc)
            raise ReportError(f"cannot reach Prometheus at {self.url}: {reason}") from None
        try:
            with unswept():
                answer = json.loads(payload)
        except ValueError:
            raise ReportError(f"{self.url} is not a Prometheus query API (its answer is not JSON)") from None
        if not isinstance(answer, dict) or answer.get("status") != "success" or "data" not in answer:
            raise ReportError(f"Prometheus at {self.url} failed a query: {_error_of(payload)}")
        return answer["data"]


@contextmanager
def unswept() -> Iterator[None]:
    """The cyclic garbage collector paused while an answer is read (and build_report pauses it
    while it makes a report): a range query of every rank of a 1,024-rank job is a million lists
    and tuples, none in a cycle, and the collector sweeping them again and again as they were made
    took about a second of such a report.  Reference counting still frees them."""
    paused = gc.isenabled()
    gc.disable()
    try:
        yield
    finally:
        if paused:
            gc.enable()


def _ts(value: float) -> str:
    return f"{value:.3f}"


def _error_of(payload: bytes) -> str:
    try:
        answer = json.loads(payload)
        return str(answer.get("error") or answer.get("status") or "no error given").splitlines()[0][:300]
    except (ValueError, AttributeError):
        text = payload.decode(errors="replace").strip().splitlines()
        return (text[0] if text else "empty answer")[:300]
