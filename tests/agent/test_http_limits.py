"""The HTTP endpoint against hostile and careless clients, on a real socket: strict parsing,
bodies, keep-alive, the whole-request deadline, the connection cap, and bounded password checks.

No timing is asserted: deadlines are set short and the tests wait for the outcome.
"""

from __future__ import annotations

import dataclasses
import http.client
import socket
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import bcrypt
import pytest

from lockstep.agent.exporter import SUPPORTED_FORMATS, SnapshotExporter, negotiate_format
from lockstep.agent.families import GaugeMetricFamily
from lockstep.agent.scheduler import Snapshot, State, WorkerView
from lockstep.agent.server import AgentHTTPServer, ServerLimits, accepts_gzip, make_server
from lockstep.agent.webconfig import AuthResult, WebConfig, WebConfigError, load_web_config

VIEW = WorkerView("toy", State.OK, "", 0.01, 1.7e9, 0, 3, 0.002, None)


class CountingViews:
    """The exporter's view source: counts renders, and can hold them until released."""

    def __init__(self) -> None:
        self.renders = 0
        self.rendering = threading.Event()
        self.release = threading.Event()
        self.release.set()

    def __call__(self) -> list[WorkerView]:
        self.renders += 1
        self.rendering.set()
        self.release.wait(30)
        return [VIEW]


@pytest.fixture
def serve() -> Iterator:  # type: ignore[type-arg]
    servers: list[AgentHTTPServer] = []

    def start(limits: ServerLimits | None = None, views: CountingViews | None = None) -> AgentHTTPServer:
        views = views or CountingViews()
        server = make_server("127.0.0.1:0", SnapshotExporter(views), WebConfig(), lambda: ["toy"], limits)
        server.views = views  # type: ignore[attr-defined]
        threading.Thread(target=server.serve_forever, daemon=True).start()
        servers.append(server)
        return server

    yield start
    for server in servers:
        server.shutdown()


def connect(server: AgentHTTPServer) -> socket.socket:
    sock = socket.create_connection(("127.0.0.1", server.server_address[1]), timeout=20)
    return sock


def read_all(sock: socket.socket) -> bytes:
    """Everything the server sends until it closes the connection."""
    chunks = []
    while chunk := sock.recv(65536):
        chunks.append(chunk)
    sock.close()
    return b"".join(chunks)


def exchange(server: AgentHTTPServer, data: bytes, end_input: bool = True) -> bytes:
    sock = connect(server)
    sock.sendall(data)
    if end_input:
        sock.shutdown(socket.SHUT_WR)
    return read_all(sock)


def closed_without_answer(sock: socket.socket) -> bool:
    """The server closed the connection without a response (a reset if it left bytes unread)."""
    try:
        return read_all(sock) == b""
    except ConnectionResetError:
        return True


def status_of(response: bytes) -> int:
    return int(response.split(b" ", 2)[1])


def responses(data: bytes) -> list[tuple[int, bytes]]:
    """(status, body) of each response in a keep-alive stream (bodies framed by Content-Length)."""
    result = []
    while data:
        head, _, rest = data.partition(b"\r\n\r\n")
        length = next(
            int(line.split(b":")[1]) for line in head.split(b"\r\n") if line.lower().startswith(b"content-length:")
        )
        result.append((status_of(head), rest[:length]))
        data = rest[length:]
    return result


def test_malformed_and_truncated_requests_get_400_and_no_render(serve) -> None:  # type: ignore[no-untyped-def]
    server = serve()
    cut_in_headers = b"GET /metrics HTTP/1.1\r\nHost: node\r\nAccept: text/pl"
    assert status_of(exchange(server, cut_in_headers)) == 400
    cut_in_body = b"GET /metrics HTTP/1.1\r\nHost: node\r\nContent-Length: 10\r\n\r\nabc"
    assert status_of(exchange(server, cut_in_body)) == 400
    # Answered at once, without waiting for the client to give up or the deadline.
    assert status_of(exchange(server, b"GET /metrics\r\n", end_input=False)) == 400  # HTTP/0.9
    assert status_of(exchange(server, b"HELLO\r\n", end_input=False)) == 400
    assert status_of(exchange(server, b"GET /metrics HTTP/1.1\r\n\r\n", end_input=False)) == 400  # no Host
    bad_length = b"GET /metrics HTTP/1.1\r\nHost: node\r\nContent-Length: 1x\r\n\r\n"
    assert status_of(exchange(server, bad_length, end_input=False)) == 400
    two_lengths = b"GET /metrics HTTP/1.1\r\nHost: node\r\nContent-Length: 1\r\nContent-Length: 2\r\n\r\nab"
    assert status_of(exchange(server, two_lengths, end_input=False)) == 400
    unknown_coding = b"GET /metrics HTTP/1.1\r\nHost: node\r\nTransfer-Encoding: gzip\r\n\r\n"
    assert status_of(exchange(server, unknown_coding, end_input=False)) == 501
    huge_header = b"GET /metrics HTTP/1.1\r\nHost: node\r\nX-Big: " + b"a" * 20000 + b"\r\n\r\n"
    assert status_of(exchange(server, huge_header, end_input=False)) == 431
    error = exchange(server, b"GET /metrics\r\n", end_input=False)
    assert error.startswith(b"HTTP/1.1 400 Bad Request\r\n") and b"\r\nConnection: close\r\n" in error
    assert server.views.renders == 0
    # HTTP/1.0 needs no Host, and gets its answer then a close.
    response = exchange(server, b"GET /metrics HTTP/1.0\r\n\r\n", end_input=False)
    assert status_of(response) == 200 and b'lockstep_collector_runs_total{collector="toy"} 3.0\n' in response
    assert server.views.renders == 1


def test_head_options_and_other_methods(serve) -> None:  # type: ignore[no-untyped-def]
    server = serve()
    conn = http.client.HTTPConnection("127.0.0.1", server.server_address[1], timeout=20)
    conn.request("GET", "/metrics")
    get = conn.getresponse()
    get_body = get.read()
    conn.request("HEAD", "/metrics")  # the same keep-alive connection
    head = conn.getresponse()
    assert head.status == 200 and head.read() == b""
    assert head.getheader("Content-Length") == str(len(get_body))
    assert head.getheader("Content-Type") == get.getheader("Content-Type")
    conn.request("GET", "/healthz")  # the connection still frames responses right after a HEAD
    assert conn.getresponse().read() == b"ok\n"
    conn.request("OPTIONS", "/metrics")
    options = conn.getresponse()
    assert (options.status, options.getheader("Allow"), options.read()) == (204, "GET, HEAD, OPTIONS", b"")
    conn.request("POST", "/metrics", body=b"x")
    post = conn.getresponse()
    assert (post.status, post.getheader("Allow")) == (405, "GET, HEAD, OPTIONS")
    post.read()
    conn.close()


def test_request_bodies_are_read_never_taken_for_a_request(serve) -> None:  # type: ignore[no-untyped-def]
    server = serve()
    smuggled = b"GET /nope HTTP/1.1\r\nHost: node\r\n\r\n"
    stream = (
        b"GET /healthz HTTP/1.1\r\nHost: node\r\nContent-Length: %d\r\n\r\n" % len(smuggled)
        + smuggled
        + b"GET /healthz HTTP/1.1\r\nHost: node\r\nTransfer-Encoding: chunked\r\n\r\n"
        + b"%x\r\n" % len(smuggled)
        + smuggled
        + b"\r\n0\r\n\r\n"
        + b"GET /healthz HTTP/1.1\r\nHost: node\r\nConnection: close\r\n\r\n"
    )
    assert responses(exchange(server, stream, end_input=False)) == [(200, b"ok\n")] * 3
    too_big = b"GET /healthz HTTP/1.1\r\nHost: node\r\nContent-Length: 100000\r\n\r\n" + b"a" * 100000
    assert status_of(exchange(server, too_big)) == 413


def test_keep_alive_and_connection_close(serve) -> None:  # type: ignore[no-untyped-def]
    server = serve()
    sock = connect(server)
    sock.sendall(b"GET /healthz HTTP/1.1\r\nHost: node\r\n\r\n")
    first = sock.recv(65536)
    assert status_of(first) == 200 and b"Connection: close" not in first
    sock.sendall(b"GET /healthz HTTP/1.1\r\nHost: node\r\nConnection: close\r\n\r\n")
    last = read_all(sock)  # returns: the server closed the connection
    assert responses(last) == [(200, b"ok\n")] and b"\r\nConnection: close\r\n" in last


def test_accept_encoding_is_parsed_exactly(serve) -> None:  # type: ignore[no-untyped-def]
    assert accepts_gzip("gzip") and accepts_gzip("deflate, gzip;q=0.5") and accepts_gzip("x-gzip")
    assert accepts_gzip("*") and accepts_gzip("GZIP ; Q=1.0")
    assert not accepts_gzip("") and not accepts_gzip("x-nogzip") and not accepts_gzip("identity")
    assert not accepts_gzip("gzip;q=0") and not accepts_gzip("gzip;q=0.000") and not accepts_gzip("*;q=0")
    assert not accepts_gzip("gzip;q=0, *") and not accepts_gzip("gzip;q=2") and not accepts_gzip("gzip;q=nan")
    server = serve()
    for header, gzipped in (("gzip", True), ("x-nogzip", False), ("gzip;q=0", False), ("br, *;q=0.1", True)):
        conn = http.client.HTTPConnection("127.0.0.1", server.server_address[1], timeout=20)
        conn.request("GET", "/metrics", headers={"Accept-Encoding": header})
        response = conn.getresponse()
        response.read()
        assert (response.getheader("Content-Encoding") == "gzip") is gzipped, header
        assert response.getheader("Vary") == "Accept-Encoding"
        conn.close()


def test_slowloris_connection_closed_at_the_request_deadline(serve) -> None:  # type: ignore[no-untyped-def]
    server = serve(ServerLimits(header_timeout=1.0))
    sock = connect(server)
    sock.sendall(b"GET /metrics HTTP/1.1\r\nHost: node\r\n")
    sock.settimeout(0.1)
    answer = b""
    for _ in range(600):  # a header line every 0.1 s: each read is quick, the request never ends
        try:
            sock.sendall(b"X-Trickle: 1\r\n")
        except OSError:
            break  # closed (reset) before the 408 was read
        try:
            answer = sock.recv(65536)
            break
        except TimeoutError:
            continue
    assert answer.startswith(b"HTTP/1.1 408 Request Timeout\r\n")
    silent = connect(server)  # sends nothing at all: closed with no answer
    assert read_all(silent) == b""
    assert server.views.renders == 0
    wait_for(lambda: server.open_connections == 0)


def test_connections_above_the_cap_evict_the_slowest_so_a_scrape_succeeds(serve) -> None:  # type: ignore[no-untyped-def]
    server = serve(ServerLimits(max_connections=4))
    slow = []
    for _ in range(4):
        sock = connect(server)
        sock.sendall(b"GET /metrics HTTP/1.1\r\nHost: node\r\n")  # and never the end of the headers
        slow.append(sock)
    wait_for(lambda: server.waiting_connections == 4)
    conn = http.client.HTTPConnection("127.0.0.1", server.server_address[1], timeout=20)
    conn.request("GET", "/metrics")
    response = conn.getresponse()
    assert response.status == 200 and b"lockstep_collector_up" in response.read()
    assert read_all(slow[0]) == b""  # the one that waited longest was closed for it
    assert server.open_connections == 4  # three slow ones and the scrape's keep-alive connection
    conn.close()
    for sock in slow[1:]:
        sock.close()


def test_connections_above_the_cap_refused_when_all_are_busy(serve) -> None:  # type: ignore[no-untyped-def]
    views = CountingViews()
    views.release.clear()
    server = serve(ServerLimits(max_connections=3, workers=1), views)
    busy = []
    for _ in range(3):
        sock = connect(server)
        sock.sendall(b"GET /metrics HTTP/1.1\r\nHost: node\r\nConnection: close\r\n\r\n")
        busy.append(sock)
    # All three accepted (a connection still in the listen backlog is not waiting either: the
    # newcomer would then evict it and wait for a request it never sends) and all three dispatched.
    wait_for(lambda: views.rendering.is_set() and server.open_connections == 3 and server.waiting_connections == 0)
    refused = read_all(connect(server))
    assert refused.startswith(b"HTTP/1.1 503 Service Unavailable\r\n") and refused.endswith(b"too many connections\n")
    views.release.set()
    assert [status_of(read_all(sock)) for sock in busy] == [200, 200, 200]
    conn = http.client.HTTPConnection("127.0.0.1", server.server_address[1], timeout=20)
    conn.request("GET", "/metrics")
    assert conn.getresponse().status == 200  # served again once the queue drained
    conn.close()


def test_a_connection_evicted_with_its_event_pending_does_not_stop_the_listener(serve) -> None:  # type: ignore[no-untyped-def]
    """A new connection and bytes from the connection it evicts, in one batch of events (found by
    bench/http_load.py: the listener died on the closed socket's event)."""
    views = CountingViews()
    views.release.clear()
    # No worker thread: the event loop answers itself, so a held render holds the loop.
    server = serve(ServerLimits(max_connections=2, workers=0), views)
    evicted = connect(server)
    evicted.sendall(b"GET /metrics HTTP/1.1\r\n")
    wait_for(lambda: server.waiting_connections == 1)
    slow = connect(server)  # keep-alive: still open, and waiting, once answered
    slow.sendall(b"GET /metrics HTTP/1.1\r\nHost: node\r\n\r\n")
    wait_for(views.rendering.is_set)  # the loop is in the render: the next two wait for it
    newcomer = connect(server)  # listen socket readable first ...
    evicted.sendall(b"Host: node\r\n")  # ... then the connection its accept will evict
    views.release.set()
    assert status_of(slow.recv(65536)) == 200
    newcomer.sendall(b"GET /healthz HTTP/1.1\r\nHost: node\r\nConnection: close\r\n\r\n")
    assert responses(read_all(newcomer)) == [(200, b"ok\n")]
    assert closed_without_answer(evicted)  # closed for the newcomer
    slow.close()
    assert status_of(exchange(server, b"GET /healthz HTTP/1.1\r\nHost: node\r\n\r\n")) == 200


def wait_for(condition, timeout: float = 20.0) -> None:  # type: ignore[no-untyped-def]
    deadline = time.monotonic() + timeout
    while not condition():
        assert time.monotonic() < deadline, "condition not reached"
        time.sleep(0.01)


def test_malformed_bcrypt_hashes_refused_with_their_line(tmp_path: Path) -> None:
    good = bcrypt.hashpw(b"pw", bcrypt.gensalt(rounds=4)).decode()
    web_file = tmp_path / "web.yml"
    web_file.write_text(
        "basic_auth_users:\n"  # 1
        f"  ok: '{good}'\n"  # 2
        f"  short: '{good[:-1]}'\n"  # 3
        f"  cost99: '{good[:4]}99{good[6:]}'\n"  # 4
        f"  cost03: '{good[:4]}03{good[6:]}'\n"  # 5
        f"  twox: '$2x${good[4:]}'\n"  # 6
    )
    with pytest.raises(WebConfigError) as err:
        load_web_config(web_file)
    expected = "expected a bcrypt hash: $2y$, a cost from 04 to 31, $, then 53 characters of [./A-Za-z0-9]"
    assert err.value.problems == [
        f"{web_file}:3: basic_auth_users.short: {expected}",
        f"{web_file}:4: basic_auth_users.cost99: {expected}",
        f"{web_file}:5: basic_auth_users.cost03: {expected}",
        f"{web_file}:6: basic_auth_users.twox: {expected}",
    ]


def test_password_checks_one_at_a_time_bounded_and_failures_cached() -> None:
    web = WebConfig(users={"alice": bcrypt.hashpw(b"right", bcrypt.gensalt(rounds=4))})
    results: dict[str, AuthResult] = {}

    def check(user: str, password: str, client: str) -> threading.Thread:
        def run() -> None:
            results[password] = web.check_basic_auth(user, password, client)

        thread = threading.Thread(target=run)
        thread.start()
        return thread

    with web._bcrypt:  # a check in progress: the next ones wait for it
        waiting = [check("alice", "guess1", "10.0.0.1"), check("nobody", "guess2", "10.0.0.2")]
        wait_for(lambda: web._pending.total() == 2)
        # One pending check per client: the flooding client gets BUSY at once, without bcrypt.
        assert web.check_basic_auth("alice", "guess3", "10.0.0.1") is AuthResult.BUSY
        waiting += [check("alice", "guess4", "10.0.0.3"), check("alice", "guess5", "10.0.0.4")]
        wait_for(lambda: web._pending.total() == 4)
        # Four pending in all: a fifth client waits for none of them either.
        assert web.check_basic_auth("alice", "guess6", "10.0.0.5") is AuthResult.BUSY
    for thread in waiting:
        thread.join(20)
    assert results == {f"guess{i}": AuthResult.DENIED for i in (1, 2, 4, 5)}
    assert web._pending.total() == 0
    with web._bcrypt:  # remembered: answered without bcrypt, so without waiting for the lock
        assert web.check_basic_auth("alice", "guess1", "10.0.0.9") is AuthResult.DENIED
        assert web.check_basic_auth("nobody", "guess2", "10.0.0.9") is AuthResult.DENIED
    assert web.check_basic_auth("alice", "right") is AuthResult.OK
    with web._bcrypt:
        assert web.check_basic_auth("alice", "right") is AuthResult.OK


def test_unknown_users_checked_at_the_highest_configured_cost() -> None:
    users = {
        "cheap": bcrypt.hashpw(b"a", bcrypt.gensalt(rounds=4)),
        "dear": bcrypt.hashpw(b"b", bcrypt.gensalt(rounds=6)),
    }
    web = WebConfig(users=users)
    assert web._unknown_user_hash.startswith(b"$2b$06$") and len(web._unknown_user_hash) == 60
    assert web.check_basic_auth("nobody", "") is AuthResult.DENIED
    assert web.check_basic_auth("dear", "b") is AuthResult.OK


def test_an_accept_version_the_library_cannot_parse_gets_the_text_format(serve) -> None:  # type: ignore[no-untyped-def]
    # prometheus_client's choose_encoder raises TypeError comparing "x" with an int here.
    prometheus_3 = (
        "application/openmetrics-text;version=1.0.0;escaping=allow-utf-8;q=0.5,"
        "application/openmetrics-text;version=0.0.1;q=0.4,text/plain;version=1.0.0;escaping=allow-utf-8;q=0.3,"
        "text/plain;version=0.0.4;q=0.2,*/*;q=0.1"
    )
    negotiated = {
        accept: negotiate_format(accept)
        for accept in (
            "",
            "*/*",
            "application/openmetrics-text",
            "application/openmetrics-text; version=1.0.0",
            prometheus_3,
            "application/openmetrics-text; version=0.0.1",
            "application/openmetrics-text; version=1.x",
            "application/openmetrics-text; version=2.0.0, application/openmetrics-text; version=1.0.0",
            "text/plain; version=0.0.4, application/openmetrics-text; version=1.0.0",
        )
    }
    assert [f.name for f in negotiated.values()] == [
        "text 0.0.4",
        "text 0.0.4",
        "openmetrics 1.0.0",
        "openmetrics 1.0.0",
        "openmetrics 1.0.0",
        "text 0.0.4",
        "text 0.0.4",
        "openmetrics 1.0.0",
        "text 0.0.4",
    ]
    server = serve()
    for accept in (
        "application/openmetrics-text; version=1.x",
        "text/plain; version=x",
        "application/openmetrics-text; version=..",
    ):
        request = b"GET /metrics HTTP/1.1\r\nHost: node\r\nAccept: %s\r\nConnection: close\r\n\r\n" % accept.encode()
        response = exchange(server, request, end_input=False)
        assert response.startswith(b"HTTP/1.1 200 "), (accept, response[:80])
        assert b"\r\nContent-Type: text/plain; version=0.0.4; charset=utf-8\r\n" in response, accept
        assert b'lockstep_collector_runs_total{collector="toy"} 3.0\n' in response, accept


class FailingViews(CountingViews):
    def __call__(self) -> list[WorkerView]:
        raise RuntimeError("a bug on the scrape path")


def test_an_exception_while_answering_gets_a_500_not_a_silent_close(serve) -> None:  # type: ignore[no-untyped-def]
    server = serve(views=FailingViews())
    response = exchange(server, b"GET /metrics HTTP/1.1\r\nHost: node\r\nConnection: close\r\n\r\n", end_input=False)
    assert response.startswith(b"HTTP/1.1 500 ") and response.endswith(b"\r\n\r\ninternal error\n"), response[:80]


def test_content_length_with_transfer_encoding_is_refused_and_the_connection_closed(serve) -> None:  # type: ignore[no-untyped-def]
    # RFC 9112 6.3: such a request may be a smuggling attempt; whatever the answer, close after it.
    server = serve()
    smuggled = b"GET /nope HTTP/1.1\r\nHost: node\r\nConnection: close\r\n\r\n"
    stream = (
        b"GET /healthz HTTP/1.1\r\nHost: node\r\nContent-Length: 5\r\nTransfer-Encoding: chunked\r\n\r\n"
        + b"0\r\n\r\n"
        + smuggled
    )
    answered = responses(exchange(server, stream, end_input=False))
    assert answered == [(400, b"bad request: both Content-Length and Transfer-Encoding\n")]


def test_distinct_accept_headers_cache_one_rendering_per_supported_format() -> None:
    # Each distinct header was a cache key of its own: 200 requests grew the agent by 440 MB.
    family = GaugeMetricFamily("lockstep_toy_level", "Toy level.", labels=["source"])
    family.add_metric(["a"], 1)
    snapshot = Snapshot((family,), finished_at=time.monotonic())
    exporter = SnapshotExporter(lambda: [dataclasses.replace(VIEW, snapshot=snapshot)])
    content_types = set()
    for i in range(50):
        for accept in (
            f"application/openmetrics-text; version=1.0.0.{i}",
            f"application/openmetrics-text; version=1.0.0; escaping=x{i}",
            f"text/plain; version=0.0.{i}",
            f"application/openmetrics-text; version=1.0.0, text/plain; q=0.{i}",
        ):
            body, content_type = exporter.render(accept)
            content_types.add(content_type)
            assert b'lockstep_toy_level{source="a"} 1' in body, accept
    assert len(snapshot.rendered) <= len(SUPPORTED_FORMATS) == 2, sorted(snapshot.rendered)[:3]
    assert sorted(snapshot.rendered) == ["openmetrics 1.0.0", "text 0.0.4"]
    assert content_types == {
        "text/plain; version=0.0.4; charset=utf-8",
        "application/openmetrics-text; version=1.0.0; charset=utf-8",
    }
