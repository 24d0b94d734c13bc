"""How the report talks HTTP to Prometheus, whatever the server does (issue 46): within one
deadline for the whole report, and never more than a bounded answer.

- **One deadline a report** (`Deadline`, on the monotonic clock): every request, in whichever of
  the report's threads (build.make_report asks its sections side by side), waits at most what
  is left of it.  A socket timeout alone bounds each read, not the answer: a server that sends
  a byte every few seconds kept a report going for ever.  So each read of the socket (the
  headers' too, and TLS's) is given min(the per-read timeout, the time left), and none starts
  once the deadline has passed.
- **A bounded answer** (`read_bounded`): read in chunks up to a byte cap, refused beyond it (and
  at once when its Content-Length says so).  Parsed, an answer takes 5 to 30 times its size.

urllib stays the client (proxies from the environment, https): only its connections are ours.
"""

from __future__ import annotations

import functools
import http.client
import socket
import ssl
import threading
import time
import urllib.request
from typing import Any

CHUNK_BYTES = 1 << 20


class DeadlinePassed(TimeoutError):
    """The report's deadline passed while a request waited (an OSError, as a socket timeout is)."""


class Deadline:
    """The time left to a whole report, on the monotonic clock."""

    def __init__(self, seconds: float) -> None:
        self.seconds = seconds
        self.end = time.monotonic() + seconds
        self._lock = threading.Lock()

    def left(self) -> float:
        return self.end - time.monotonic()

    def passed(self) -> bool:
        return self.left() <= 0

    def wait(self, per_read: float) -> float:
        """How long the next read may wait: the per-read timeout or the time left, the shorter;
        DeadlinePassed when none is left."""
        left = self.left()
        if left <= 0:
            raise DeadlinePassed(f"the report's {self.seconds:g}-s deadline passed")
        return min(per_read, left)

    def stop(self) -> None:
        """End it now: the report failed, and its other threads' requests need not go on."""
        with self._lock:
            self.end = min(self.end, time.monotonic())


class _Bounded:
    """A socket whose every read waits at most what its deadline leaves (mixed into the plain
    and the TLS socket classes: http.client reads its answer, headers included, through
    recv_into)."""

    deadline: Deadline
    per_read: float

    def recv_into(self, buffer: Any, *args: Any) -> int:
        self.settimeout(self.deadline.wait(self.per_read))  # type: ignore[attr-defined]
        return super().recv_into(buffer, *args)  # type: ignore[misc]

    def sendall(self, data: Any, *args: Any) -> None:
        self.settimeout(self.deadline.wait(self.per_read))  # type: ignore[attr-defined]
        super().sendall(data, *args)  # type: ignore[misc]


class _Socket(_Bounded, socket.socket):
    pass


class _TLSSocket(_Bounded, ssl.SSLSocket):
    pass


def _bind(sock: Any, deadline: Deadline, per_read: float) -> Any:
    sock.deadline, sock.per_read = deadline, per_read
    return sock


class _Connection(http.client.HTTPConnection):
    def __init__(self, *args: Any, deadline: Deadline, per_read: float, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.deadline, self.per_read = deadline, per_read
        self._create_connection = self._connect_bounded

    def _connect_bounded(self, address: tuple[str, int], timeout: float, source: Any = None) -> socket.socket:
        plain = socket.create_connection(address, self.deadline.wait(self.per_read), source)
        sock = _Socket(plain.family, plain.type, plain.proto, fileno=plain.detach())
        sock.settimeout(self.deadline.wait(self.per_read))
        return _bind(sock, self.deadline, self.per_read)


class _TLSConnection(http.client.HTTPSConnection):
    def __init__(self, *args: Any, deadline: Deadline, per_read: float, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.deadline, self.per_read = deadline, per_read
        self._create_connection = functools.partial(_Connection._connect_bounded, self)  # type: ignore[arg-type]

    def connect(self) -> None:
        super().connect()  # the handshake: within the socket's timeout, min(per-read, left)
        _bind(self.sock, self.deadline, self.per_read)


def _tls_context() -> ssl.SSLContext:
    context = ssl.create_default_context()
    context.sslsocket_class = _TLSSocket
    return context


class _HTTPHandler(urllib.request.HTTPHandler):
    def __init__(self, deadline: Deadline, per_read: float) -> None:
        super().__init__()
        self.connection = functools.partial(_Connection, deadline=deadline, per_read=per_read)

    def http_open(self, req: urllib.request.Request) -> http.client.HTTPResponse:
        return self.do_open(self.connection, req)


class _HTTPSHandler(urllib.request.HTTPSHandler):
    def __init__(self, deadline: Deadline, per_read: float) -> None:
        super().__init__(context=_tls_context())
        self.connection = functools.partial(_TLSConnection, deadline=deadline, per_read=per_read)

    def https_open(self, req: urllib.request.Request) -> http.client.HTTPResponse:
        return self.do_open(self.connection, req, context=self._context)  # type: ignore[attr-defined]


def opener(deadline: Deadline, per_read: float) -> urllib.request.OpenerDirector:
    """urllib's opener (proxies, redirects, errors as usual) with connections bounded by the deadline."""
    return urllib.request.build_opener(_HTTPHandler(deadline, per_read), _HTTPSHandler(deadline, per_read))


class TooLarge(Exception):
    """An answer above the byte cap."""


class CutShort(Exception):
    """An answer that ended before its Content-Length."""


def read_bounded(response: Any, cap: int, deadline: Deadline) -> bytearray:
    """The whole body, read a chunk at a time; TooLarge above ``cap`` bytes (at once when the
    Content-Length says so), CutShort when it ends before its Content-Length (http.client then
    returns what came), DeadlinePassed when the deadline passes between two chunks."""
    given = response.headers.get("Content-Length")
    length = int(given) if given is not None and given.strip().isdigit() else None
    if length is not None and length > cap:
        raise TooLarge
    body = bytearray()
    while chunk := response.read(CHUNK_BYTES):
        body += chunk
        if len(body) > cap:
            raise TooLarge
        deadline.wait(1.0)
    if length is not None and len(body) < length:
        raise CutShort(f"after {len(body)} of its {length} bytes")
    return body
