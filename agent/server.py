"""The HTTP endpoint: /metrics, /healthz and a landing page, with optional TLS and basic auth.

Built on the standard library's ThreadingHTTPServer: a scrape only renders snapshots that
are already in memory, so a thread per connection is plenty.  TLS is applied per accepted
connection with the current web config, so a reload that rotates certificates takes
effect for the next connection without rebinding the port.
"""

from __future__ import annotations

import base64
import binascii
import gzip
import html
import logging
import socket
import socketserver
import ssl
from collections.abc import Callable
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

from lockstep import __version__
from lockstep.agent.config import parse_listen
from lockstep.agent.exporter import SnapshotExporter
from lockstep.agent.webconfig import WebConfig

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


class AgentHTTPServer(ThreadingHTTPServer):
    daemon_threads = True

    def __init__(
        self,
        address: tuple[str, int],
        exporter: SnapshotExporter,
        web_config: WebConfig,
        collector_names: Callable[[], list[str]],
    ) -> None:
        self.exporter = exporter
        self.web_config = web_config
        self.collector_names = collector_names
        host = address[0]
        # ":port" means every address: bind IPv6 dual-stack where the machine has it.
        if host == "":
            self.address_family = socket.AF_INET6 if socket.has_ipv6 else socket.AF_INET
            address = ("::" if socket.has_ipv6 else "0.0.0.0", address[1])
        elif ":" in host:
            self.address_family = socket.AF_INET6
        super().__init__(address, _Handler)

    def server_bind(self) -> None:
        if self.address_family == socket.AF_INET6:
            self.socket.setsockopt(socket.IPPROTO_IPV6, socket.IPV6_V6ONLY, 0)
        # TCPServer's bind, not HTTPServer's: that one resolves the host's FQDN, a DNS lookup
        # that can hang agent start-up for seconds on a node whose resolver is down.
        socketserver.TCPServer.server_bind(self)
        host, port = self.server_address[:2]
        self.server_name, self.server_port = str(host), int(port)

    def get_request(self) -> tuple[Any, Any]:
        sock, address = self.socket.accept()
        context = self.web_config.ssl_context
        if context is not None:
            # The handshake happens in the connection's own thread (see _Handler.setup),
            # so a slow client cannot hold up the accept loop.
            sock = context.wrap_socket(sock, server_side=True, do_handshake_on_connect=False)
        return sock, address

    def handle_error(self, request: Any, client_address: Any) -> None:
        log.debug("connection from %s failed", client_address, exc_info=True)


def make_server(
    listen: str, exporter: SnapshotExporter, web_config: WebConfig, collector_names: Callable[[], list[str]]
) -> AgentHTTPServer:
    return AgentHTTPServer(parse_listen(listen), exporter, web_config, collector_names)


class _Handler(BaseHTTPRequestHandler):
    server: AgentHTTPServer
    timeout = 10  # seconds a client may take per read: no connection holds a thread forever
    # One send per response, sent at once: with unbuffered writes, headers and body leave as
    # two segments and the client's delayed ACK adds ~40 ms to every keep-alive scrape.
    wbufsize = 256 * 1024
    disable_nagle_algorithm = True
    server_version = f"lockstep/{__version__}"
    protocol_version = "HTTP/1.1"

    def setup(self) -> None:
        super().setup()
        if isinstance(self.request, ssl.SSLSocket):
            self.request.do_handshake()

    def log_message(self, format: str, *args: Any) -> None:
        log.debug("%s " + format, self.address_string(), *args)

    def do_GET(self) -> None:
        path = self.path.split("?", 1)[0]
        if path == "/healthz":
            # Left open without auth so liveness probes need no credentials; it reveals nothing.
            self._reply(200, b"ok\n", "text/plain; charset=utf-8")
            return
        if not self._authorized():
            return
        if path == "/metrics":
            body, content_type = self.server.exporter.render(self.headers.get("Accept", ""))
            self._reply(200, body, content_type, compressible=True)
        elif path == "/":
            names = ", ".join(html.escape(n) for n in self.server.collector_names()) or "none enabled"
            page = _LANDING.format(version=__version__, collectors=names).encode()
            self._reply(200, page, "text/html; charset=utf-8")
        else:
            self._reply(404, b"not found; try /metrics\n", "text/plain; charset=utf-8")

    def _authorized(self) -> bool:
        users = self.server.web_config.users
        if not users:
            return True
        header = self.headers.get("Authorization", "")
        if header.startswith("Basic "):
            try:
                user, _, password = base64.b64decode(header[6:], validate=True).decode().partition(":")
            except (binascii.Error, UnicodeDecodeError):
                user, password = "", ""
            if user and self.server.web_config.check_basic_auth(user, password):
                return True
        self.send_response(401)
        self.send_header("WWW-Authenticate", 'Basic realm="lockstep"')
        self.send_header("Content-Length", "0")
        self.end_headers()
        return False

    def _reply(self, status: int, body: bytes, content_type: str, compressible: bool = False) -> None:
        gzipped = compressible and "gzip" in self.headers.get("Accept-Encoding", "")
        if gzipped:
            body = gzip.compress(body, compresslevel=1)
        self.send_response(status)
        self.send_header("Content-Type", content_type)
        self.send_header("Content-Length", str(len(body)))
        if gzipped:
            self.send_header("Content-Encoding", "gzip")
        for name, value in self.server.web_config.headers.items():
            self.send_header(name, value)
        self.end_headers()
        self.wfile.write(body)
