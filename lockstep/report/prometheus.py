"""The report's only way to Prometheus: instant and range queries, and the series API, over its
HTTP API (urllib).

Every query the report makes goes through `Prometheus`, which counts them (bench/report.py
prints the count) and turns every failure into one `ReportError` line: the CLI prints it and
exits 1, never a traceback.  Whatever the server does (issue 46): the whole report within one
deadline and each answer within a byte cap (lockstep/report/transport.py); an answer that is not
the API's shape (a key missing, a value of another type, nesting too deep for the parser) or
that holds a value the report cannot use (NaN, an infinity: the agent exports none, and every
division the report and the rules ask for keeps its divisor above 0) refused in one line naming
the query and the series.
"""

from __future__ import annotations

import gc
import http.client
import json
import math
import threading
import time
import urllib.error
import urllib.parse
import urllib.request
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from itertools import chain
from typing import Any

from lockstep.report.model import ReportError
from lockstep.report.transport import CutShort, Deadline, TooLarge, opener, read_bounded
from lockstep.thresholds import REPORT_MAX_ANSWER_MIB as MAX_ANSWER_MIB
from lockstep.thresholds import REPORT_SECONDS

READ_SECONDS = 30.0  # the most one read of the socket waits
ERROR_BYTES = 64 * 1024  # what is read of an error's body (its first line is shown)
SHOWN = 160  # characters of a query or a series quoted in an error


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
    try:
        parsed = urllib.parse.urlsplit(url)
        parsed.port  # noqa: B018 (a port that is not a number raises here)
    except ValueError:
        raise ReportError(f"--prometheus {url!r} is not an http:// or https:// URL") from None
    if parsed.scheme not in ("http", "https") or not parsed.netloc:
        raise ReportError(f"--prometheus {url!r} is not an http:// or https:// URL")
    return url.rstrip("/")


class Malformed(Exception):
    """An answer not of the query API's shape, or with a value the report cannot use."""


@dataclass
class Prometheus:
    """A Prometheus server (or anything with its query API: Thanos, Mimir, VictoriaMetrics)."""

    url: str
    timeout: float = READ_SECONDS  # the most one read waits
    deadline: Deadline = field(default_factory=lambda: Deadline(REPORT_SECONDS))  # the whole report's
    max_answer_bytes: int = MAX_ANSWER_MIB << 20
    queries: int = 0
    log: list[tuple[str, float]] = field(default_factory=list)  # each expression sent and its seconds (bench)
    # The report's sections ask side by side (build.make_report): the count and the log under a lock.
    _counting: threading.Lock = field(default_factory=threading.Lock, repr=False, compare=False)

    def __post_init__(self) -> None:
        self.url = check_url(self.url)
        self._opener = opener(self.deadline, self.timeout)

    def query(self, expr: str, at: float) -> list[Sample]:
        data = self._post("query", {"query": expr, "time": _ts(at)})
        with self._reading(expr):
            if not isinstance(data, dict):
                raise Malformed("data that is not an object")
            result = data.get("result")
            if data.get("resultType") == "scalar":
                if not isinstance(result, list) or len(result) != 2:
                    raise Malformed("a scalar that is not [time, value]")
                return [Sample({}, _finite(float(result[1]), {}))]
            if data.get("resultType") != "vector" or not isinstance(result, list):
                raise Malformed("a result that is not a vector")
            samples = []
            for r in result:
                labels = _labels(r)
                point = r.get("value")
                if not isinstance(point, list) or len(point) != 2:
                    raise Malformed(f"{_named(labels)} without [time, value]")
                samples.append(Sample(labels, _finite(float(point[1]), labels)))
            return samples

    def query_range(self, expr: str, start: float, end: float, step: float) -> list[Series]:
        data = self._post("query_range", {"query": expr, "start": _ts(start), "end": _ts(end), "step": _ts(step)})
        with self._reading(expr), unswept():
            if not isinstance(data, dict) or data.get("resultType") != "matrix" or not isinstance(data["result"], list):
                raise Malformed("a result that is not a matrix")
            out = []
            for r in data["result"]:
                labels = _labels(r)
                values = r.get("values")
                if not isinstance(values, list):
                    raise Malformed(f"{_named(labels)} without values")
                points = [(float(t), float(v)) for t, v in values]
                # One sum says whether every number is finite (NaN and the infinities spread);
                # only a sum that is not, or overflowed, is looked at point by point.
                if not math.isfinite(sum(chain.from_iterable(points))):
                    for point in points:
                        _finite(point[1], labels)
                        _finite(point[0], labels, "the time")
                out.append(Series(labels, points))
            return out

    def series(self, selector: str, start: float, end: float) -> list[dict[str, str]]:
        """The label sets of the series the selector matches with samples between start and end,
        from the index alone (the series API reads no samples: the cheap way to ask which ranks,
        GPUs, agents or roots a job has)."""
        data = self._post("series", {"match[]": selector, "start": _ts(start), "end": _ts(end)})
        with self._reading(f"series {selector}"):
            if not isinstance(data, list):
                raise Malformed("a result that is not a list of series")
            return [_label_set(labels) for labels in data]

    @contextmanager
    def _reading(self, what: str) -> Iterator[None]:
        """An answer read: whatever is not of the API's shape, one line naming the query."""
        try:
            yield
        except Malformed as exc:
            raise ReportError(f"Prometheus at {self.url} answered {_short(what)} with {exc}") from None
        except (KeyError, IndexError, TypeError, ValueError, AttributeError) as exc:
            why = _short(f"no {exc}" if isinstance(exc, KeyError) else str(exc) or type(exc).__name__)
            raise ReportError(
                f"Prometheus at {self.url} answered {_short(what)} with what is not its query API's answer ({why})"
            ) from None

    def _post(self, endpoint: str, params: dict[str, str]) -> Any:
        with self._counting:
            self.queries += 1
        started = time.monotonic()
        what = params.get("query") or f"series {params['match[]']}"
        try:
            return self._ask(endpoint, params, what)
        finally:
            with self._counting:
                self.log.append((what, time.monotonic() - started))

    def _ask(self, endpoint: str, params: dict[str, str], what: str) -> Any:
        body = urllib.parse.urlencode(params).encode()
        request = urllib.request.Request(
            f"{self.url}/api/v1/{endpoint}",
            data=body,
            headers={"Content-Type": "application/x-www-form-urlencoded", "Accept": "application/json"},
        )
        try:
            self.deadline.wait(self.timeout)
            with self._opener.open(request, timeout=self.timeout) as response:
                payload = read_bounded(response, self.max_answer_bytes, self.deadline)
        except TooLarge:
            raise ReportError(
                f"Prometheus at {self.url} answered {_short(what)} with more than "
                f"{self.max_answer_bytes / 2**20:g} MiB (--max-answer): refused"
            ) from None
        except CutShort as exc:
            raise ReportError(f"Prometheus at {self.url} broke off its answer to {_short(what)} {exc}") from None
        except urllib.error.HTTPError as exc:
            try:
                error = _error_of(exc.read(ERROR_BYTES))
            except (OSError, http.client.HTTPException):
                error = "its error unreadable"
            raise ReportError(f"Prometheus at {self.url} answered {exc.code}: {error}") from None
        except (urllib.error.URLError, OSError, http.client.HTTPException, ValueError) as exc:
            if self.deadline.passed():
                raise ReportError(
                    f"Prometheus at {self.url} did not answer within the report's "
                    f"{self.deadline.seconds:g}-s deadline (--timeout)"
                ) from None
            reason = getattr(exc, "reason", exc)
            said = _line(str(reason) or type(reason).__name__)
            raise ReportError(f"cannot reach Prometheus at {self.url}: {said}") from None
        try:
            with unswept():
                answer = json.loads(payload, parse_constant=_no_constant)
        except RecursionError:
            raise ReportError(f"Prometheus at {self.url} answered {_short(what)} with JSON nested too deep") from None
        except ValueError:
            raise ReportError(f"{self.url} is not a Prometheus query API (its answer is not JSON)") from None
        if not isinstance(answer, dict) or answer.get("status") != "success" or "data" not in answer:
            raise ReportError(f"Prometheus at {self.url} failed a query: {_error_of(payload)}")
        return answer["data"]


def _no_constant(name: str) -> float:
    raise ValueError(f"{name} is not JSON")


def _labels(item: Any) -> dict[str, str]:
    if not isinstance(item, dict):
        raise Malformed("a series that is not an object")
    return _label_set(item.get("metric"))


def _label_set(labels: Any) -> dict[str, str]:
    """A series' labels: an object of strings.  A value UTF-8 cannot encode (a lone surrogate,
    as JSON may escape one) is written as its backslash escape, as the agent writes it
    (agent/samples.py): printed as it is, it would fail the report's output."""
    if not isinstance(labels, dict):
        raise Malformed("a series without its labels")
    for key, value in labels.items():
        if not isinstance(value, str):
            raise Malformed(f"a label {_short(key)} that is not a string")
        if not value.isascii():
            try:
                value.encode()
            except UnicodeEncodeError:
                labels[key] = value.encode(errors="backslashreplace").decode()
    return labels


def _finite(value: float, labels: dict[str, str], what: str = "") -> float:
    if not math.isfinite(value):
        raise Malformed(
            f"{what or 'the value'} {value!r} for {_named(labels)}: not a finite number, which the report cannot use"
        )
    return value


def _named(labels: dict[str, str]) -> str:
    """A series as PromQL writes it, cut to SHOWN characters."""
    name = labels.get("__name__", "")
    inside = ",".join(f"{k}={json.dumps(v)}" for k, v in sorted(labels.items()) if k != "__name__")
    return _short(f"series {name}{{{inside}}}")


def _short(text: str) -> str:
    text = _line(text)
    return text if len(text) <= SHOWN else text[: SHOWN - 3] + "..."


def _line(text: str) -> str:
    """One line: every control character (a newline, an escape sequence) written visibly."""
    return "".join(c if c.isprintable() else c.encode("unicode_escape").decode() for c in text)


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


def _error_of(payload: bytes | bytearray) -> str:
    """The first line of an error answer (Prometheus' "error", or the body's), at most 300 characters."""
    try:
        answer = json.loads(payload[:ERROR_BYTES])
        said = str(answer.get("error") or answer.get("status") or "no error given")
    except (ValueError, AttributeError, RecursionError):
        said = bytes(payload[:ERROR_BYTES]).decode(errors="replace").strip()
    lines = said.splitlines()
    return _line(lines[0] if lines else "empty answer")[:300]
