"""The HTTP endpoint: /metrics, /healthz and a landing page, with optional TLS and basic auth.

Anyone who can reach the port can open connections, so every resource a connection can hold
is bounded (docs/security.md states the limits):

- One event-loop thread owns every connection that is not being answered: it accepts, runs the
  TLS handshake and reads the request (headers and any body) without blocking.  A slow or idle
  client costs a socket and a few kilobytes, never a thread.
- A fixed pool of worker threads answers complete requests (render, write, then hand the
  connection back for keep-alive).  Rendering is all in memory, so a few workers suffice.
- The whole request (TLS handshake, headers, body) must arrive within ``header_timeout`` of
  the connection or of its first byte; a slowloris connection is closed then, whatever it trickles.
- One file descriptor is held in reserve (open on /dev/null): when the process is out of
  descriptors (EMFILE, ENFILE: whatever took them), it is given up to accept the next
  connection, so a scrape or a liveness probe is still answered; it is taken back once a
  descriptor is free again.  Serving a connection needs no other descriptor.
- At ``max_connections``, a new connection evicts the connection that has waited longest for a
  request (slowloris or idle keep-alive): a real scrape sends its request at once, so it gets
  through an attack.  Only when every connection holds a complete request is the newcomer
  refused (503, or a close on a TLS port).
- Requests are parsed by h11 (strict HTTP/1.1 framing: Content-Length, chunked bodies,
  Connection: close, mandatory Host) rather than http.server, which answers a truncated request
  with a full render and leaves an unread body to be parsed as the next request.  A request
  with both Content-Length and Transfer-Encoding (allowed by h11, forbidden to keep alive by
  RFC 9112 6.3) is refused with 400 and the connection closed.

TLS is applied per accepted connection with the current web config, so a reload that rotates
certificates takes effect for the next connection without rebinding the port.
"""

from __future__ import annotations

import collections
import errno
import gzip
import html
import logging
import math
import os
import queue
import re
import resource
import selectors
import socket
import sys
import threading
import time
from base64 import b64decode
from binascii import Error as Base64Error
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from http import HTTPStatus
from urllib.parse import urlsplit

import h11

from lockstep import __version__
from lockstep.agent.config import parse_listen
from lockstep.agent.exporter import SnapshotExporter
from lockstep.agent.webconfig import AuthResult, WebConfig

log = logging.getLogger("lockstep.http")

_LANDING = """<!doctype html>
<html><head><title>Lockstep</title></head>
<body><h1>Lockstep {version}</h1>
<p>Per-node observability agent for AI/GPU clusters.</p>
<ul><li><a href="metrics">/metrics</a>: metrics for Prometheus</li>
<li><a href="healthz">/healthz</a>: liveness</li></ul>
<p>Collectors: {collectors}</p>
</body></html>
"""
_TEXT = "text/plain; charset=utf-8"


@dataclass(frozen=True)
class ServerLimits:
    """What one listener may spend on its clients."""

    max_connections: int = 512  # also capped at half the process's open-file limit
    workers: int = 8  # threads that answer complete requests
    header_timeout: float = 10.0  # seconds for a whole request (TLS handshake, headers, body)
    idle_timeout: float = 120.0  # seconds a keep-alive connection may wait for its next request
    write_timeout: float = 20.0  # seconds to send a whole response
    max_header_bytes: int = 16 * 1024  # request line and headers; above: 431
    max_body_bytes: int = 64 * 1024  # request body, read and discarded; above: 413
    backlog: int = 4096  # listen queue (the kernel caps it at net.core.somaxconn)


# "cannot accept a connection" is logged at most this often: out of descriptors, every
# connection attempt fails the same way.
ACCEPT_TROUBLE_LOG_SECONDS = 60.0

# A request line as RFC 9112 has it, checked as soon as the line is in: without it an
# HTTP/0.9 request ("GET /") would wait for a blank line that never comes.
_REQUEST_LINE = re.compile(rb"[!#$%&'*+.^_`|~0-9A-Za-z-]+ [^ \x00-\x1f\x7f]+ HTTP/1\.[01]\r?")
# RFC 9110 qvalue.
_QVALUE = re.compile(r"0(\.[0-9]{0,3})?|1(\.0{0,3})?")


def accepts_gzip(accept_encoding: str) -> bool:
    """Whether an Accept-Encoding header allows gzip (RFC 9110 12.5.3).

    gzip (or its alias x-gzip) is acceptable when listed with a non-zero q, or when ``*`` is
    listed with a non-zero q and gzip is not named; an entry with a malformed q counts as q=0.
    """
    gzip_q: float | None = None
    star_q: float | None = None
    for item in accept_encoding.split(","):
        coding, _, params = item.partition(";")
        coding = coding.strip().lower()
        q = 1.0
        for param in params.split(";") if params else ():
            name, _, value = param.partition("=")
            if name.strip().lower() == "q":
                value = value.strip()
                q = float(value) if _QVALUE.fullmatch(value) else 0.0
        if coding in ("gzip", "x-gzip"):
            gzip_q = q if gzip_q is None else max(gzip_q, q)
        elif coding == "*":
            star_q = q
    if gzip_q is not None:
        return gzip_q > 0
    return star_q is not None and star_q > 0


class _Connection:
    """One client connection; owned by the event loop while registered, else by one worker."""

    __slots__ = ("sock", "fd", "address", "http", "handshaking", "deadline", "idle", "body_bytes", "request", "closed")

    def __init__(self, sock: socket.socket, address: object, handshaking: bool, deadline: float, limit: int) -> None:
        self.sock = sock
        # The selector and the waiting table go by this number, which stays valid for them
        # after the socket is closed (they are always updated before it is).
        self.fd = sock.fileno()
        self.closed = False
        self.address = address
        self.http = h11.Connection(h11.SERVER, max_incomplete_event_size=limit)
        self.handshaking = handshaking
        self.deadline = deadline
        self.idle = False  # a keep-alive connection between requests
        self.body_bytes = 0
        self.request: h11.Request | None = None


@dataclass
class _Response:
    status: int
    body: bytes
    content_type: str = _TEXT
    headers: tuple[tuple[str, str], ...] = ()
    compressible: bool = False


class AgentHTTPServer:
    """A listener with its event loop and worker pool; ``serve_forever`` runs the loop."""

    def __init__(
        self,
        address: tuple[str, int],
        exporter: SnapshotExporter,
        web_config: WebConfig,
        collector_names: Callable[[], list[str]],
        limits: ServerLimits | None = None,
        health_only: bool = False,
        healthy: Callable[[], bool] = lambda: True,
    ) -> None:
        self.exporter = exporter
        self.web_config = web_config
        self.collector_names = collector_names
        self.limits = limits or ServerLimits()
        # Serves /healthz alone, in plain HTTP and without auth whatever the web config says:
        # the liveness probe's own listener when client certificates are required.
        self.health_only = health_only
        self.healthy = healthy  # /healthz answers 503 when this is false
        soft_files, _ = resource.getrlimit(resource.RLIMIT_NOFILE)
        cap = self.limits.max_connections
        self.max_connections = cap if soft_files == resource.RLIM_INFINITY else max(1, min(cap, soft_files // 2))
        host, port = address
        # ":port" means every address: bind IPv6 dual-stack where the machine has it.
        if host == "" and socket.has_dualstack_ipv6():
            self.socket = socket.create_server(
                ("::", port), family=socket.AF_INET6, backlog=self.limits.backlog, dualstack_ipv6=True
            )
        else:
            family = socket.AF_INET6 if ":" in host else socket.AF_INET
            self.socket = socket.create_server((host or "0.0.0.0", port), family=family, backlog=self.limits.backlog)
        self.socket.setblocking(False)
        self.server_address = self.socket.getsockname()
        self._selector = selectors.DefaultSelector()
        self._wake_reader, self._wake_writer = socket.socketpair()
        self._wake_reader.setblocking(False)
        self._wake_writer.setblocking(False)
        # Connections waiting for a request, oldest first (eviction takes the first).
        self._waiting: collections.OrderedDict[int, _Connection] = collections.OrderedDict()
        self._open = 0  # all connections: waiting, queued for a worker, being answered
        self._ready: queue.SimpleQueue[_Connection | None] = queue.SimpleQueue()
        self._returned: queue.SimpleQueue[tuple[_Connection, bool]] = queue.SimpleQueue()
        self._workers: list[threading.Thread] = []
        # Workers waiting for a request no other connection has been promised to: a worker is
        # started only when none is (up to limits.workers), so the pool grows with the scrapers
        # that come at once (one Prometheus: one worker) and stays at that size.
        self._idle_workers = 0
        self._idle_lock = threading.Lock()
        # The loop sleeps until the next connection deadline, not on a fixed tick: an agent
        # scraped every 15 s over one kept-alive connection wakes for the scrapes alone.
        self._next_sweep = 0.0
        self._worker_start_failed_at = 0.0
        self._accept_paused_until = 0.0
        self._accept_trouble_logged_at = -ACCEPT_TROUBLE_LOG_SECONDS
        self._spare_fd: int | None = _reserve_descriptor()
        self._stop = threading.Event()
        self._stopped = threading.Event()
        self._stopped.set()
        self._closed = False

    @property
    def open_connections(self) -> int:
        """Connections held: waiting for a request, queued for a worker, or being answered."""
        return self._open

    @property
    def waiting_connections(self) -> int:
        """Connections waiting for (the rest of) a request: the ones a newcomer may evict."""
        return len(self._waiting)

    # --- the event loop -------------------------------------------------------------------

    def serve_forever(self) -> None:
        self._stopped.clear()
        try:
            self._selector.register(self.socket, selectors.EVENT_READ, "listen")
            self._selector.register(self._wake_reader, selectors.EVENT_READ, "wake")
            while not self._stop.is_set():
                now = time.monotonic()
                if now >= self._next_sweep:
                    self._next_sweep = self._sweep(now)
                if self._accept_paused_until and now >= self._accept_paused_until:
                    self._accept_paused_until = 0.0
                    self._selector.register(self.socket, selectors.EVENT_READ, "listen")
                wake_at = min(self._next_sweep, self._accept_paused_until or math.inf)
                timeout = None if wake_at == math.inf else max(0.0, wake_at - now)
                for key, events in self._selector.select(timeout=timeout):
                    if key.data == "listen":
                        self._accept()
                    elif key.data == "wake":
                        self._drain_wakeups()
                    else:
                        conn = key.data
                        try:
                            self._on_readable(conn, events)
                        except Exception:  # one connection's trouble never stops the listener
                            log.exception("handling a connection from %s failed; closing it", conn.address)
                            self._stop_waiting(conn)
                            self._close(conn)
                self._drain_returned()
        finally:
            self._close_everything()
            self._stopped.set()

    def shutdown(self) -> None:
        """Stop serve_forever and wait for it to return (it closes the listener and connections)."""
        self._stop.set()
        self._wake()
        self._stopped.wait()

    def server_close(self) -> None:
        self._close_everything()

    def _wake(self) -> None:
        try:
            self._wake_writer.send(b"x")
        except (BlockingIOError, OSError):
            pass  # already awake (buffer full) or closed

    def _drain_wakeups(self) -> None:
        try:
            while self._wake_reader.recv(4096):
                pass
        except (BlockingIOError, OSError):
            pass

    def _sweep(self, now: float) -> float:
        """Close the connections past their deadline, keep a worker and the spare descriptor;
        returns when to sweep again: the next deadline, at most 4 times a second."""
        no_worker = not any(w.is_alive() for w in self._workers) and not self._start_worker(reserved=False)
        self._close_expired(now)
        if self._spare_fd is None:
            self._spare_fd = _reserve_descriptor()  # given up for a connection: take it back
        retry = []
        if self._spare_fd is None:
            retry.append(now)
        if no_worker and self.limits.workers:
            retry.append(self._worker_start_failed_at + 1.0)
        deadlines = [conn.deadline for conn in self._waiting.values()]
        return max(now + 0.25, min([*retry, *deadlines], default=math.inf))

    def _note_deadline(self, conn: _Connection) -> None:
        self._next_sweep = min(self._next_sweep, conn.deadline)

    def _start_worker(self, reserved: bool) -> bool:
        """One more worker thread (reserved: for a connection being dispatched); False when none
        can be created now (retried at the next dispatch or a second later)."""
        self._workers = [w for w in self._workers if w.is_alive()]
        if len(self._workers) >= self.limits.workers or time.monotonic() - self._worker_start_failed_at < 1.0:
            return False
        worker = threading.Thread(target=self._work, args=(reserved,), name="http-worker", daemon=True)
        try:
            worker.start()
        except RuntimeError as exc:  # "can't start new thread": pids limit, RLIMIT_NPROC, memory
            if not self._worker_start_failed_at:
                log.warning("cannot start an HTTP worker thread (%s); the event loop answers meanwhile", exc)
            self._worker_start_failed_at = time.monotonic()
            return False
        if self._worker_start_failed_at:
            log.info("HTTP worker threads started again")
        self._worker_start_failed_at = 0.0
        self._workers.append(worker)
        return True

    def _accept(self) -> None:
        for _ in range(64):  # a batch, then serve the other sockets
            try:
                sock, address = self.socket.accept()
            except (BlockingIOError, InterruptedError):
                return
            except OSError as exc:  # EMFILE, ENFILE, ENOBUFS: back off rather than spin
                now = time.monotonic()
                if now - self._accept_trouble_logged_at >= ACCEPT_TROUBLE_LOG_SECONDS:
                    self._accept_trouble_logged_at = now
                    log.warning(
                        "cannot accept a connection: %s%s (logged once a minute at most)",
                        exc,
                        "; serving it with the descriptor held in reserve" if self._spare_fd is not None else "",
                    )
                if exc.errno in (errno.EMFILE, errno.ENFILE) and self._spare_fd is not None:
                    os.close(self._spare_fd)  # the reserve takes this connection
                    self._spare_fd = None
                    continue
                self._selector.unregister(self.socket)
                self._accept_paused_until = time.monotonic() + 0.1
                return
            if self._open >= self.max_connections and not self._evict_oldest_waiting():
                self._refuse_at_capacity(sock)
                continue
            sock.setblocking(False)
            if sock.family in (socket.AF_INET, socket.AF_INET6):
                sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
            context = None if self.health_only else self.web_config.ssl_context
            if context is not None:
                sock = context.wrap_socket(sock, server_side=True, do_handshake_on_connect=False)
            conn = _Connection(
                sock,
                address,
                handshaking=context is not None,
                deadline=time.monotonic() + self.limits.header_timeout,
                limit=self.limits.max_header_bytes,
            )
            self._open += 1
            self._wait_for_request(conn)
            if conn.handshaking:
                self._handshake(conn)

    def _evict_oldest_waiting(self) -> bool:
        if not self._waiting:
            return False
        _, oldest = self._waiting.popitem(last=False)
        log.debug("connection limit reached: closing %s, the longest waiting for a request", oldest.address)
        self._selector.unregister(oldest.fd)
        self._close(oldest)
        return True

    def _refuse_at_capacity(self, sock: socket.socket) -> None:
        log.debug("connection limit reached and every connection busy: refusing one")
        if self.web_config.ssl_context is None or self.health_only:
            sock.setblocking(False)
            try:
                sock.send(_error_bytes(503, "too many connections\n", self.web_config.headers))
                sock.shutdown(socket.SHUT_WR)
            except OSError:
                pass
        sock.close()

    def _wait_for_request(self, conn: _Connection) -> None:
        self._note_deadline(conn)
        self._waiting[conn.fd] = conn
        self._selector.register(conn.fd, selectors.EVENT_READ, conn)

    def _stop_waiting(self, conn: _Connection) -> None:
        if self._waiting.get(conn.fd) is conn:
            del self._waiting[conn.fd]
            self._selector.unregister(conn.fd)

    def _on_readable(self, conn: _Connection, events: int) -> None:
        if self._waiting.get(conn.fd) is not conn:
            return  # closed earlier in this batch of events (evicted by a new connection)
        if conn.handshaking:
            self._handshake(conn)
        else:
            self._receive(conn)

    def _handshake(self, conn: _Connection) -> None:
        import ssl  # (loaded already: only a TLS listener has connections that shake hands)

        assert isinstance(conn.sock, ssl.SSLSocket)
        try:
            conn.sock.do_handshake()
        except ssl.SSLWantReadError:
            self._selector.modify(conn.fd, selectors.EVENT_READ, conn)
            return
        except ssl.SSLWantWriteError:
            self._selector.modify(conn.fd, selectors.EVENT_WRITE, conn)
            return
        except (OSError, ValueError) as exc:  # a bad or missing client certificate, a reset
            log.debug("TLS handshake with %s failed: %s", conn.address, exc)
            self._stop_waiting(conn)
            self._close(conn)
            return
        conn.handshaking = False
        self._selector.modify(conn.fd, selectors.EVENT_READ, conn)
        self._receive(conn)

    def _receive(self, conn: _Connection) -> None:
        """Read what the client sent and act on it, until it would block or a request is complete."""
        while True:
            if not self._process(conn):
                return
            try:
                data = conn.sock.recv(65536)
            except OSError as exc:
                if not _would_block(exc):
                    self._stop_waiting(conn)
                    self._close(conn)
                return
            if conn.idle and data:
                # A keep-alive connection starts its next request: the request deadline runs now.
                conn.idle = False
                conn.deadline = time.monotonic() + self.limits.header_timeout
                self._note_deadline(conn)
            conn.http.receive_data(data)
            if not data:
                self._process(conn)
                return

    def _process(self, conn: _Connection) -> bool:
        """Consume parsed events; False once the connection left the loop (dispatched or closed)."""
        while True:
            try:
                event = conn.http.next_event()
            except h11.RemoteProtocolError as exc:
                self._reject(conn, exc.error_status_hint, f"bad request: {exc}\n")
                return False
            if event is h11.NEED_DATA:
                if conn.http.their_state is h11.IDLE:
                    pending, _ = conn.http.trailing_data
                    line, newline, _ = pending.lstrip(b"\r\n").partition(b"\n")
                    if newline and not _REQUEST_LINE.fullmatch(line):
                        self._reject(conn, 400, "bad request: malformed request line\n")
                        return False
                return True
            if isinstance(event, h11.Request):
                # h11 bounds only an incomplete head; one that arrived whole is measured here.
                size = len(event.method) + len(event.target) + sum(len(k) + len(v) + 4 for k, v in event.headers)
                if size > self.limits.max_header_bytes:
                    self._reject(conn, 431, "request header fields too large\n")
                    return False
                # RFC 9112 6.3: both framings at once may be a request-smuggling attempt (h11 obeys
                # Transfer-Encoding, a proxy in front may have obeyed Content-Length), and the
                # server must close the connection after answering it.  Refused with 400 and
                # closed, as any other framing error here, so nothing after it is read as a request.
                names = {name for name, _ in event.headers}
                if b"content-length" in names and b"transfer-encoding" in names:
                    self._reject(conn, 400, "bad request: both Content-Length and Transfer-Encoding\n")
                    return False
                conn.request = event
                conn.body_bytes = 0
            elif isinstance(event, h11.Data):
                conn.body_bytes += len(event.data)
                if conn.body_bytes > self.limits.max_body_bytes:
                    self._reject(conn, 413, "request body too large\n")
                    return False
            elif isinstance(event, h11.EndOfMessage):
                self._stop_waiting(conn)
                self._dispatch(conn)
                return False
            else:  # ConnectionClosed, or PAUSED (cannot happen before our response)
                self._stop_waiting(conn)
                self._close(conn)
                return False

    def _reject(self, conn: _Connection, status: int, message: str) -> None:
        """Answer a request that will not be served, from the loop (the answer is small), and close."""
        self._stop_waiting(conn)
        try:
            conn.sock.send(_error_bytes(status, message, self.web_config.headers))
            conn.sock.shutdown(socket.SHUT_WR)
        except (OSError, ValueError):
            pass
        self._close(conn)

    def _close_expired(self, now: float) -> None:
        expired = [conn for conn in self._waiting.values() if conn.deadline <= now]
        for conn in expired:
            partial = not conn.idle and not conn.handshaking and bool(conn.http.trailing_data[0])
            if partial or conn.http.their_state is h11.SEND_BODY:
                self._reject(conn, 408, "request not received in time\n")
            else:
                self._stop_waiting(conn)
                self._close(conn)

    def _close(self, conn: _Connection) -> None:
        if conn.closed:
            return
        conn.closed = True
        try:
            conn.sock.close()
        except OSError:
            pass
        self._open -= 1

    def _dispatch(self, conn: _Connection) -> None:
        with self._idle_lock:
            promised = self._idle_workers > 0
            if promised:
                self._idle_workers -= 1
        if promised or self._start_worker(reserved=True) or any(w.is_alive() for w in self._workers):
            self._ready.put(conn)  # to an idle worker, a new one, or (none could start) the next free
        else:
            # No worker thread could be created (thread exhaustion): answer from the loop, so
            # scrapes keep working, slower, until workers can be started again.
            self._returned.put((conn, self._answer(conn)))

    def _drain_returned(self) -> None:
        while True:
            try:
                conn, keep_alive = self._returned.get_nowait()
            except queue.Empty:
                return
            if not keep_alive:
                self._close(conn)
                continue
            conn.sock.setblocking(False)
            conn.idle = True
            conn.deadline = time.monotonic() + self.limits.idle_timeout
            self._wait_for_request(conn)
            if conn.http.trailing_data[0]:  # a pipelined request is already in
                conn.idle = False
                conn.deadline = time.monotonic() + self.limits.header_timeout
            self._receive(conn)  # also drains what TLS already decrypted

    def _close_everything(self) -> None:
        if self._closed:
            return
        self._closed = True
        for conn in list(self._waiting.values()):
            conn.sock.close()
        self._waiting.clear()
        while True:  # answered meanwhile: nobody will serve them again
            try:
                conn, _ = self._returned.get_nowait()
            except queue.Empty:
                break
            conn.sock.close()
        for _ in self._workers:
            self._ready.put(None)
        self._selector.close()
        self.socket.close()
        self._wake_reader.close()
        self._wake_writer.close()
        if self._spare_fd is not None:
            os.close(self._spare_fd)
            self._spare_fd = None

    # --- the workers ----------------------------------------------------------------------

    def _work(self, reserved: bool) -> None:
        if not reserved:
            with self._idle_lock:
                self._idle_workers += 1
        while True:
            conn = self._ready.get()
            if conn is None:
                return
            keep_alive = self._answer(conn)
            with self._idle_lock:
                self._idle_workers += 1
            self._returned.put((conn, keep_alive))
            self._wake()

    def _answer(self, conn: _Connection) -> bool:
        """Send the response to the connection's complete request; True to keep the connection."""
        request = conn.request
        assert request is not None
        try:
            response = self._respond(request, _client_host(conn.address))
        except Exception:
            # A bug (ours or a library's) still gets the client a status, not a silent close.
            log.exception("answering a request failed")
            response = _Response(500, b"internal error\n")
        try:
            head = request.method == b"HEAD"
            body = response.body
            headers = [] if response.status == 204 else [("Content-Type", response.content_type)]
            if response.compressible:
                headers.append(("Vary", "Accept-Encoding"))
                if accepts_gzip(_header(request, b"accept-encoding")):
                    body = gzip.compress(body, compresslevel=1)
                    headers.append(("Content-Encoding", "gzip"))
            if response.status != 204:  # RFC 9110 8.6: a 204 carries no Content-Length
                headers.append(("Content-Length", str(len(body))))
            headers += [
                ("Date", http_date()),
                ("Server", f"lockstep/{__version__}"),
                *response.headers,
                *(() if self.health_only else self.web_config.headers.items()),
            ]
            data = conn.http.send(h11.Response(status_code=response.status, headers=headers)) or b""
            if not head and body:
                data += conn.http.send(h11.Data(data=body)) or b""
            data += conn.http.send(h11.EndOfMessage()) or b""
            _send_all(conn.sock, data, self.limits.write_timeout)
        except (OSError, ValueError, h11.LocalProtocolError) as exc:
            log.debug("answering %s failed: %s", conn.address, exc)
            return False
        except Exception:
            log.exception("answering a request failed")
            return False
        if conn.http.our_state is h11.DONE and conn.http.their_state is h11.DONE:
            conn.http.start_next_cycle()
            return True
        return False  # Connection: close, HTTP/1.0

    def _respond(self, request: h11.Request, client: str) -> _Response:
        if request.method == b"OPTIONS":
            return _Response(204, b"", headers=(("Allow", "GET, HEAD, OPTIONS"),))
        if request.method not in (b"GET", b"HEAD"):
            return _Response(405, b"method not allowed\n", headers=(("Allow", "GET, HEAD, OPTIONS"),))
        target = request.target.decode("latin-1")
        path = urlsplit(target).path if target.startswith(("http://", "https://")) else target.split("?", 1)[0]
        if path == "/healthz":
            # Left open without auth so liveness probes need no credentials; it reveals nothing.
            return _Response(200, b"ok\n") if self.healthy() else _Response(503, b"unhealthy\n")
        if self.health_only:
            return _Response(404, b"not found; this listener serves /healthz only\n")
        auth = self._authorize(request, client)
        if auth is not AuthResult.OK:
            if auth is AuthResult.BUSY:
                return _Response(429, b"too many concurrent password checks\n", headers=(("Retry-After", "1"),))
            return _Response(401, b"unauthorized\n", headers=(("WWW-Authenticate", 'Basic realm="lockstep"'),))
        if path == "/metrics":
            body, content_type = self.exporter.render(_header(request, b"accept"))
            return _Response(200, body, content_type, compressible=True)
        if path == "/":
            names = ", ".join(html.escape(n) for n in self.collector_names()) or "none enabled"
            page = _LANDING.format(version=__version__, collectors=names).encode()
            return _Response(200, page, "text/html; charset=utf-8")
        return _Response(404, b"not found; try /metrics\n")

    def _authorize(self, request: h11.Request, client: str) -> AuthResult:
        web = self.web_config
        if not web.users:
            return AuthResult.OK
        header = _header(request, b"authorization")
        if header[:6].lower() == "basic ":
            try:
                user, _, password = b64decode(header[6:].strip(), validate=True).decode().partition(":")
            except (Base64Error, UnicodeDecodeError):
                return AuthResult.DENIED
            return web.check_basic_auth(user, password, client)
        return AuthResult.DENIED


def _client_host(address: object) -> str:
    """The client's address without its port: what bounds one client's pending password checks."""
    return str(address[0]) if isinstance(address, tuple) and address else str(address)


def _header(request: h11.Request, name: bytes) -> str:
    """A request header's value, repeated fields joined with ", " (h11 lowercases names)."""
    return ", ".join(value.decode("latin-1") for key, value in request.headers if key == name)


def _error_bytes(status: int, message: str, extra_headers: Mapping[str, str]) -> bytes:
    """A whole small response, written by hand: h11 cannot frame a reply to a request it rejected."""
    body = message.encode()
    reason = HTTPStatus(status).phrase
    lines = [
        f"HTTP/1.1 {status} {reason}",
        f"Content-Type: {_TEXT}",
        f"Content-Length: {len(body)}",
        "Connection: close",
        f"Date: {http_date()}",
        f"Server: lockstep/{__version__}",
    ]
    lines += [f"{name}: {value}" for name, value in extra_headers.items()]
    return ("\r\n".join(lines) + "\r\n\r\n").encode("latin-1") + body


def _send_all(sock: socket.socket, data: bytes, timeout: float) -> None:
    """Send everything within ``timeout`` seconds in total, not per send (a slow reader gets cut off)."""
    deadline = time.monotonic() + timeout
    view = memoryview(data)
    while view:
        remaining = deadline - time.monotonic()
        if remaining <= 0:
            raise TimeoutError("response not taken in time")
        sock.settimeout(remaining)
        sent = sock.send(view)
        view = view[sent:]


def _reserve_descriptor() -> int | None:
    """A descriptor to give up when the process has no other (see the module doc)."""
    try:
        return os.open(os.devnull, os.O_RDONLY | os.O_CLOEXEC)
    except OSError:
        return None  # out of them right now: tried again at the next sweep


def make_server(
    listen: str,
    exporter: SnapshotExporter,
    web_config: WebConfig,
    collector_names: Callable[[], list[str]],
    limits: ServerLimits | None = None,
    health_only: bool = False,
    healthy: Callable[[], bool] = lambda: True,
) -> AgentHTTPServer:
    return AgentHTTPServer(parse_listen(listen), exporter, web_config, collector_names, limits, health_only, healthy)


def _would_block(exc: OSError) -> bool:
    """A read that would block: BlockingIOError (or a signal) on a plain socket, the ssl module's
    want-read or want-write on a TLS one.  The ssl module is asked for only where it is loaded:
    the agent loads it when its web config sets up TLS, not on a node without (5 MiB, issue 47)."""
    if isinstance(exc, (BlockingIOError, InterruptedError)):
        return True
    ssl = sys.modules.get("ssl")
    return ssl is not None and isinstance(exc, (ssl.SSLWantReadError, ssl.SSLWantWriteError))


_DAYS = ("Mon", "Tue", "Wed", "Thu", "Fri", "Sat", "Sun")
_MONTHS = ("Jan", "Feb", "Mar", "Apr", "May", "Jun", "Jul", "Aug", "Sep", "Oct", "Nov", "Dec")


def http_date(at: float | None = None) -> str:
    """The Date header's value (RFC 9110 IMF-fixdate), as email.utils.formatdate(usegmt=True)
    writes it: in English whatever the locale.  Not that module: it loads the email package,
    calendar and datetime (2 MiB resident, issue 47) for this one line."""
    t = time.gmtime(at)
    return (
        f"{_DAYS[t.tm_wday]}, {t.tm_mday:02d} {_MONTHS[t.tm_mon - 1]} {t.tm_year:04d} "
        f"{t.tm_hour:02d}:{t.tm_min:02d}:{t.tm_sec:02d} GMT"
    )
