"""A hostile stand-in for Prometheus' query API on a loopback socket, for the report's tests of
what a server may do to it (issue 46): answer a query with a body of its choosing, at the pace
of its choosing.  Plain sockets, one thread a connection, so a test controls every byte: the
headers, then a body sent all at once, or dripped a byte at a time.

`HostileServer(answer)`: `answer(endpoint, form)` gives each request's `Reply` (or None: the
usual empty success); `beside(fake, hostile)` answers as a FakePrometheus except where
`hostile` says otherwise, so the report gets as far as the hostile answer.  Closing the server
stops its drips and closes its connections."""

from __future__ import annotations

import json
import socket
import threading
import urllib.parse
from collections.abc import Callable
from dataclasses import dataclass
from types import TracebackType

from tests.support.fake_prometheus import FakePrometheus


@dataclass(frozen=True)
class Reply:
    body: bytes
    drip: float = 0.0  # seconds between two bytes of the body (0: all at once)
    length: int | None = None  # the Content-Length sent (None: the body's; -1: none, the body ends at close)


def empty(endpoint: str) -> bytes:
    """Prometheus' empty answer of this endpoint."""
    if endpoint == "series":
        return b'{"status":"success","data":[]}'
    kind = "matrix" if endpoint == "query_range" else "vector"
    return json.dumps({"status": "success", "data": {"resultType": kind, "result": []}}).encode()


def success(endpoint: str, result: object) -> bytes:
    if endpoint == "series":
        return json.dumps({"status": "success", "data": result}).encode()
    kind = "matrix" if endpoint == "query_range" else "vector"
    return json.dumps({"status": "success", "data": {"resultType": kind, "result": result}}).encode()


class HostileServer:
    def __init__(self, answer: Callable[[str, dict[str, str]], Reply | None]) -> None:
        self.answer = answer
        self.listener = socket.create_server(("127.0.0.1", 0))
        self.url = f"http://127.0.0.1:{self.listener.getsockname()[1]}"
        self.closed = threading.Event()
        self.requests: list[tuple[str, dict[str, str]]] = []
        self.connections: list[socket.socket] = []
        self.lock = threading.Lock()
        self.thread = threading.Thread(target=self.accept, daemon=True)
        self.thread.start()

    def __enter__(self) -> HostileServer:
        return self

    def __exit__(self, kind: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None) -> None:
        self.close()

    def close(self) -> None:
        self.closed.set()
        try:
            self.listener.shutdown(socket.SHUT_RDWR)  # (wakes accept(); close alone does not)
        except OSError:
            pass
        self.listener.close()
        with self.lock:
            for conn in self.connections:
                conn.close()
        self.thread.join(5)

    def accept(self) -> None:
        while not self.closed.is_set():
            try:
                conn, _ = self.listener.accept()
            except OSError:
                return
            with self.lock:
                self.connections.append(conn)
            threading.Thread(target=self.serve, args=(conn,), daemon=True).start()

    def serve(self, conn: socket.socket) -> None:
        try:
            head, body = self.read_request(conn)
            endpoint = head.split(b" ", 2)[1].decode().rsplit("/", 1)[-1]
            form = {k: v[0] for k, v in urllib.parse.parse_qs(body.decode()).items()}
            with self.lock:
                self.requests.append((endpoint, form))
            reply = self.answer(endpoint, form) or Reply(empty(endpoint))
            length = len(reply.body) if reply.length is None else reply.length
            sized = f"Content-Length: {length}\r\n" if length >= 0 else ""
            conn.sendall(
                b"HTTP/1.1 200 OK\r\nContent-Type: application/json\r\n" + f"{sized}Connection: close\r\n\r\n".encode()
            )
            if not reply.drip:
                conn.sendall(reply.body)
            for i in range(len(reply.body) if reply.drip else 0):
                if self.closed.wait(reply.drip):
                    return
                conn.sendall(reply.body[i : i + 1])
        except OSError:
            pass
        finally:
            conn.close()

    @staticmethod
    def read_request(conn: socket.socket) -> tuple[bytes, bytes]:
        data = b""
        while b"\r\n\r\n" not in data:
            chunk = conn.recv(65536)
            if not chunk:
                raise OSError("closed before its request")
            data += chunk
        head, _, body = data.partition(b"\r\n\r\n")
        length = next(
            (
                int(line.split(b":", 1)[1])
                for line in head.split(b"\r\n")
                if line.lower().startswith(b"content-length:")
            ),
            0,
        )
        while len(body) < length:
            chunk = conn.recv(65536)
            if not chunk:
                break
            body += chunk
        return head, body


def beside(fake: FakePrometheus, hostile: Callable[[str, str], Reply | None]) -> Callable[[str, dict[str, str]], Reply]:
    """An answer function for HostileServer: ``hostile(endpoint, query)``'s reply where it gives
    one (the series API's query is "series SELECTOR"), else the FakePrometheus' chosen answer."""

    def answer(endpoint: str, form: dict[str, str]) -> Reply:
        query = form["query"] if "query" in form else f"series {form.get('match[]', '')}"
        reply = hostile(endpoint, query)
        if reply is not None:
            return reply
        times = {k: float(v) for k, v in form.items() if k in ("time", "start", "end", "step")}
        return Reply(json.dumps(fake.answer(endpoint, query, times)).encode())

    return answer
